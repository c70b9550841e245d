"""What ``kit.train(trainer)`` hands back: a :class:`TrainReport`, read aloud by ``str(report)``.

On an out-of-memory error the report says so first, then the step and phase where the run died,
what was alive then by component (measured, with the estimate beside it), the largest live tensors
and what held them, and the advisor's top changes. :func:`read_alive` takes those readings; it must
run while the failed call's frames are still alive (before :func:`kit.measure.cleanup.scrub`), and it keeps
no tensor: only ints and strings.

>>> print(TrainReport(oom=False, error=None, step=3, phase="end", reading="live_tensor_bytes"))  # doctest: +ELLIPSIS
Completed: 3 optimizer steps, no out-of-memory error...
"""
from __future__ import annotations

import gc
import re
import sys
import weakref
from dataclasses import dataclass, field

import torch

from kit import machine
from kit.measure import device, leaks
from kit.plot.live import in_notebook
from kit.units import fmt_bytes, wrapped

# phase key -> what it means, as the report says it
PHASES = {
    "setup": "before the first step (train() placing the model and making the optimizer)",
    "first_forward_backward": "the first step's forward/backward (no optimizer state yet)",
    "first_optimizer_step": "the first optimizer step, which creates the optimizer state",
    "forward_backward": "a later step's forward/backward (the optimizer state is alive)",
    "optimizer_step": "a later optimizer step",
    "after_step": "between steps (zero_grad, the scheduler, logging, saving)",
    "evaluation": "evaluation (Trainer.evaluate)",
    "end": "the end of train() (saving, loading the best model)",
}
# phase -> (the Estimate field predicting its peak, which components the estimate has alive then)
_EST = {"setup": ("weights_bytes", ("weights",)),
        "first_forward_backward": ("first_step_peak_bytes", ("weights", "gradients")),
        "first_optimizer_step": ("first_step_peak_bytes", ("weights", "gradients", "optimizer state")),
        "evaluation": ("eval_peak_bytes", ("weights", "optimizer state")),
        "end": ("peak_bytes", ("weights", "optimizer state"))}
_ALL = ("weights", "gradients", "optimizer state")
_FIELD = {"weights": "weights_bytes", "gradients": "gradients_bytes", "optimizer state": "optimizer_bytes"}


@dataclass
class TrainReport:
    """How ``kit.train`` went. ``oom`` True: the run died of an out-of-memory error (never hidden:
    ``str(report)`` says so first). Bytes are ints, None where there is no such reading here."""

    oom: bool
    error: str | None             # "OutOfMemoryError: CUDA out of memory. ..." when oom
    step: int                     # the optimizer step running when it died (1 = the first), or the last done
    phase: str                    # a key of PHASES
    reading: str                  # "cuda_allocated" or "live_tensor_bytes" (kit.measure.device.best_reading)
    seconds: float = 0.0
    measured: dict = field(default_factory=dict)    # component -> bytes alive when it died ("total" too)
    estimated: dict = field(default_factory=dict)   # component -> bytes the estimate has alive in that phase
    estimate_field: str | None = None               # which Estimate field predicts this phase's peak
    cuda: dict = field(default_factory=dict)        # allocated/reserved/fragmentation/peak_allocated/tried
    tensors: list = field(default_factory=list)     # lines: the largest live tensors and their holders
    freed: dict = field(default_factory=dict)       # what kit.train released after the error
    advice: str | None = None
    snapshot_path: str | None = None                # the CUDA allocator history, for pytorch.org/memory_viz
    measured_peak_bytes: int | None = None          # a completed run's peak: CUDA max allocated, or the exact
                                                    # CPU count; None where no reading saw the peak moment
    peak_exact: bool = False
    estimate_peak_bytes: int | None = None
    between_steps_bytes: int | None = None          # CPU: highest live-tensor reading between steps
    estimate_between_bytes: int | None = None       # weights + gradients + optimizer state
    notes: list = field(default_factory=list)
    cap_bytes: int | None = None                    # kit.train(cap_bytes=...): the memory cap the run had
    cap_how: str | None = None                      # how it was set (a CUDA memory fraction, or the CPU counter)
    tracker: object = field(default=None, repr=False)
    output: object = field(default=None, repr=False)  # trainer.train()'s TrainOutput when it completed

    @property
    def phase_text(self) -> str:
        return PHASES.get(self.phase, self.phase)

    @property
    def ratio(self) -> float | None:
        """Measured peak / estimated peak for a completed run (None: one of them is missing)."""
        if self.measured_peak_bytes is None or not self.estimate_peak_bytes:
            return None
        return self.measured_peak_bytes / self.estimate_peak_bytes

    @wrapped
    def text(self) -> str:
        return "\n".join(self._oom_lines() if self.oom else self._done_lines())

    __str__ = text

    def _oom_lines(self) -> list:
        what = "CUDA allocated" if self.reading == "cuda_allocated" else "CPU live tensors"
        when = "before the first step" if self.phase == "setup" else f"at step {self.step}"
        freed = "".join(f", the {k} ({fmt_bytes(v)})" for k, v in self.freed.items())
        out = [f"OUT OF MEMORY {when}, during {self.phase_text}.", f"  {self.error}",
               *([f"  The run had a memory cap of {fmt_bytes(self.cap_bytes)}: {self.cap_how}."]
                 if self.cap_bytes else []),
               f"  kit.train stopped the run and did not raise. It released the failed call's frames{freed}: "
               "the kernel is usable, and the Trainer can train again (from step 1)."]
        if self.measured:
            est = self.estimated
            out += ["", f"What was alive when it failed ({what}, read before the failed frames were released),"
                        " beside the estimate:", f"  {'component':<34}{'measured':>12}{'estimated':>12}"]
            for k in ("weights", "gradients", "optimizer state", "the rest"):
                e = est.get(k)
                out.append(f"  {_rest_label(k, self.reading):<34}{fmt_bytes(self.measured.get(k)):>12}"
                           f"{'-' if e is None else fmt_bytes(e):>12}")
            out.append(f"  {'total':<34}{fmt_bytes(self.measured.get('total')):>12}{fmt_bytes(est.get('total')):>12}"
                       + (f"  (estimate: {self.estimate_field})" if self.estimate_field else ""))
        c = self.cuda
        if c:
            out.append(f"  CUDA allocated {fmt_bytes(c.get('allocated'))}, reserved {fmt_bytes(c.get('reserved'))}: "
                       f"{fmt_bytes(c.get('fragmentation'))} reserved but not allocated (fragmentation); "
                       f"peak allocated {fmt_bytes(c.get('peak_allocated'))}"
                       + (f"; the failed call tried to allocate {c['tried']}" if c.get("tried") else ""))
        if self.tensors:
            out += ["", "Largest live tensors then, and what held them:"] + [f"  {t}" for t in self.tensors]
        out += ["", self.advice or "advisor not available"]
        if self.snapshot_path:
            out.append(f"Allocator history saved to {self.snapshot_path}: drag it onto https://pytorch.org/memory_viz.")
        return out + [f"note: {n}" for n in self.notes]

    def _done_lines(self) -> list:
        out = [f"Completed: {self.step} optimizer steps, no out-of-memory error ({self.seconds:.1f} s)."]
        what = "CUDA max allocated" if self.reading == "cuda_allocated" else "CPU live tensors, exact (every op watched)"
        if self.measured_peak_bytes is None:
            # (no CPU reading saw the peak's moment: the activations live inside a step)
            out.append("Peak: not taken (pass tensor_peak=True, or a cap, for the exact CPU peak)"
                       + (f"; estimated {fmt_bytes(self.estimate_peak_bytes)} (peak_bytes)"
                          if self.estimate_peak_bytes else ", no estimate to compare"))
        if self.measured_peak_bytes is not None:
            out.append(f"Peak: measured {fmt_bytes(self.measured_peak_bytes)} ({what})" + (
                f", estimated {fmt_bytes(self.estimate_peak_bytes)} (peak_bytes): ratio {self.ratio:.3f}"
                if self.ratio is not None else ", no estimate to compare"))
        if self.cap_bytes:
            peak = "" if self.measured_peak_bytes is None else \
                f": the peak used {self.measured_peak_bytes / self.cap_bytes:.0%} of it"
            out.append(f"Memory cap {fmt_bytes(self.cap_bytes)} ({self.cap_how}), not reached{peak}")
        if self.between_steps_bytes is not None and self.estimate_between_bytes:
            out.append(f"Between steps: measured {fmt_bytes(self.between_steps_bytes)}, estimated weights + gradients + "
                       f"optimizer state {fmt_bytes(self.estimate_between_bytes)}: ratio "
                       f"{self.between_steps_bytes / self.estimate_between_bytes:.3f}")
        if self.snapshot_path:
            out.append(f"Allocator history saved to {self.snapshot_path}: drag it onto https://pytorch.org/memory_viz.")
        return out + [f"note: {n}" for n in self.notes]


def _rest_label(k: str, reading: str) -> str:
    if k != "the rest":
        return k
    return "the rest (activations, temporaries)" if reading == "cuda_allocated" else \
        "the rest (Python-visible tensors)"


def estimated_for(est, phase: str) -> tuple[dict, str | None]:
    """The estimate's components alive in ``phase``, its predicted peak as ``"total"``, and that field's name.

    ``eval_peak_bytes`` is read with getattr: an older Estimate has none.
    """
    if est is None:
        return {}, None
    name, alive = _EST.get(phase, ("peak_bytes", _ALL))
    total = getattr(est, name, None)
    parts = {k: getattr(est, _FIELD[k]) for k in alive}
    if total is None:
        return parts, None
    parts["the rest"] = max(0, total - sum(parts.values()))
    parts["total"] = total
    return parts, name


def _optimizers(trainer) -> list:
    opt = getattr(trainer, "optimizer", None)
    return [o for o in (opt, getattr(opt, "optimizer", None)) if isinstance(o, torch.optim.Optimizer)]


def _named(trainer, on: str) -> tuple[dict, dict]:
    """(storage ptr -> (component, label)) for weights, gradients and optimizer state on ``on``, and their bytes."""
    names, sizes = {}, {"weights": 0, "gradients": 0, "optimizer state": 0}
    model = getattr(trainer, "model", None)

    def add(t, comp, label):
        if isinstance(t, torch.Tensor) and t.device.type == on and not t.is_meta:
            st = t.untyped_storage()
            if st.data_ptr() not in names and st.nbytes():
                names[st.data_ptr()] = (comp, label)
                sizes[comp] += st.nbytes()

    pname = {}
    if isinstance(model, torch.nn.Module):
        for n, p in model.named_parameters(remove_duplicate=True):
            pname[id(p)] = n
            add(p, "weights", f"weight {n}")
        for n, b in model.named_buffers():
            add(b, "weights", f"buffer {n}")
        for n, p in model.named_parameters():
            add(p.grad, "gradients", f"gradient of {n}")
    for o in _optimizers(trainer):
        for p, st in o.state.items():
            for k, v in st.items():
                add(v, "optimizer state", f"optimizer state {k!r} of {pname.get(id(p), 'a parameter')}")
    return names, sizes


def _frame_locals(exc, modules: dict) -> dict:
    """storage ptr -> "local `x` of f() (file:line)" for tensors the failed call's frames held (one level into
    lists, tuples and dicts). ``modules``: id(submodule) -> its name, to say whose forward a frame ran."""
    found = {}
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        f = tb.tb_frame
        where = f"{f.f_code.co_name}() ({f.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno})"
        me = modules.get(id(f.f_locals.get("self")))
        if me is not None:
            where = f"{where[:-1]}, in {me or 'the model'}'s call)"
        for name, v in f.f_locals.items():
            vals = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
            for t in list(vals)[:64]:
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    try:
                        found.setdefault(t.untyped_storage().data_ptr(), f"local `{name}` of {where}")
                    except Exception:
                        pass
        tb = tb.tb_next
    return found


def read_alive(trainer, exc, *, top: int = 5, holders: int = 3) -> tuple[dict, dict, list]:
    """What was alive while ``exc`` still holds the failed frames: (measured components, CUDA readings,
    lines for the ``top`` largest live tensors with what held them). Keeps no tensor.

    Tensors are named by what they are (a weight, its gradient, its optimizer state), else by the failed
    frame's local that held them, else (for the ``holders`` largest left) by climbing the garbage
    collector's referrers with :mod:`kit.measure.leaks`.
    """

    on = "cuda" if machine.has_cuda() else "cpu"
    gc.collect()
    snap = device.snapshot(live_tensors=False)
    stores = leaks._storages()                     # (device, ptr) -> [nbytes, [weakrefs]]
    names, sizes = _named(trainer, on)
    model = getattr(trainer, "model", None)
    mods = {id(m): n for n, m in model.named_modules()} if isinstance(model, torch.nn.Module) else {}
    local = _frame_locals(exc, mods)
    del model, mods
    mine = {k: v for k, v in stores.items() if k[0].startswith(on)}
    total = snap.cuda_allocated_bytes if on == "cuda" else sum(v[0] for v in mine.values())
    measured = dict(sizes, total=total)
    measured["the rest"] = max(0, total - sum(sizes.values()))
    cuda = {}
    if on == "cuda":
        cuda = {"allocated": snap.cuda_allocated_bytes, "reserved": snap.cuda_reserved_bytes,
                "fragmentation": snap.cuda_reserved_bytes - snap.cuda_allocated_bytes,
                "peak_allocated": snap.cuda_peak_allocated_bytes}
        m = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", str(exc))
        if m:
            cuda["tried"] = m[1]
    lines, unnamed = [], []
    for key, (nbytes, refs) in sorted(mine.items(), key=lambda kv: -kv[1][0])[:top]:
        ts = [t for t in (w() for w in refs) if t is not None]
        if not ts:
            continue
        t = max(ts, key=lambda x: x.numel())
        desc = f"{fmt_bytes(nbytes):>11}  {str(t.dtype).replace('torch.', '')}{list(t.shape)}"
        who = names.get(key[1], (None, None))[1] or local.get(key[1])
        if who is None and len(unnamed) < holders:
            unnamed.append((len(lines), [weakref.ref(x) for x in ts]))
        lines.append(f"{desc}  {who or ''}")
        del t, ts
    if unnamed:
        groups = [[x for x in (w() for w in refs) if x is not None] for _, refs in unnamed]
        found = leaks._holders(groups, 8, 2, sys._getframe(1)) if all(groups) else []
        for (i, _), held in zip(unnamed, found):
            lines[i] += "held by: " + ("; ".join(held) if held else "no holder found through the garbage collector")
        del groups
    stores.clear()
    del stores, mine
    return measured, cuda, [ln.rstrip() for ln in lines]


def advice_text(est, trainer, device_name: str) -> tuple[str, bool | None]:
    """The fit advisor's verdict and top changes (or why there are none), and whether it says the setup
    fits (None: no verdict). ``kit.advise`` is imported lazily: it may not be there."""
    try:
        from kit.advise import advise
    except ImportError:
        return "advisor not available", None
    if est is None:
        return "advisor: no estimate of this Trainer, so no advice", None
    try:
        a = advise(trainer, device=device_name, trainer_estimate=est)
    except (ValueError, TypeError) as exc:
        return f"advisor: could not run ({type(exc).__name__}: {exc})", None
    text = a.text(top=3) if hasattr(a, "text") else str(a)
    return "The fit advisor (prediction only):\n" + "\n".join("  " + ln for ln in text.splitlines()), \
        getattr(a, "fits", None)


def set_peak(report: TrainReport, rec, samples, est) -> None:
    """A completed run: the ``train`` stage's peak (``rec``) beside the estimate's, and on the CPU the highest
    live-tensor reading between steps beside weights + gradients + optimizer state."""
    report.peak_exact = rec.peak_exact
    # a CPU reading taken between steps is not the peak's moment: it is set beside its own estimate below, and the
    # peak is not taken (never a lower bound set beside the peak's estimate)
    report.measured_peak_bytes = rec.peak_bytes if rec.on_cuda or rec.peak_exact else None
    report.estimate_peak_bytes = est.peak_bytes if est is not None else None
    if rec.on_cuda:
        if not rec.peak_exact:
            report.notes.append(rec.peak_note)
        return
    live = [s.snap.live("cpu") for s in samples if s.has_live and s.event == "step"]
    if live:
        report.between_steps_bytes = max(live)
        if est is not None:
            report.estimate_between_bytes = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
    elif not rec.peak_exact:
        report.notes.append("no live-tensor reading between steps: pass live_tensors=True (it walks the garbage "
                            "collector, ~0.3 s a reading) or tensor_peak=True for the exact CPU peak")


def show_history(report: TrainReport) -> None:
    """In a notebook, draw the saved CUDA allocator history inline (torch's trace plot). Untested on a GPU here."""

    if not report.snapshot_path or not in_notebook():
        return
    try:
        import pickle

        from IPython.display import HTML, display
        from torch.cuda._memory_viz import trace_plot

        with open(report.snapshot_path, "rb") as f:
            html = trace_plot(pickle.load(f))
        if len(html) > 20 * 2**20:
            report.notes.append("the allocator history is too large to draw inline; open the pickle at memory_viz")
        else:
            display(HTML(html))
    except Exception as exc:  # noqa: BLE001 - a plot must not turn a report into an error
        report.notes.append(f"could not draw the allocator history inline ({type(exc).__name__}: {exc})")
