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

from dataclasses import dataclass, field

from kit.estimate.from_objects import PACKED_EVAL
from kit.estimate.grpo import GrpoReader
from kit.estimate.rloo import RlooReader
from kit.plot.live import in_notebook
from kit.units import fmt_bytes, wrapped
from kit.watching.advice import advice_text  # noqa: F401 (the report's advice, kept here by name)
from kit.watching.alive import read_alive  # noqa: F401 (the report's reading, kept here by name)

# phase key -> what it means, as the report says it
PHASES = {
    "setup": "before the first step (train() placing the model and making the optimizer)",
    "first_forward_backward": "the first step's forward/backward (no optimizer state yet)",
    "first_optimizer_step": "the first optimizer step, which creates the optimizer state",
    "forward_backward": "a later step's forward/backward (the optimizer state is alive)",
    "optimizer_step": "a later optimizer step",
    "after_step": "between steps (zero_grad, the scheduler, logging, saving)",
    "evaluation": "evaluation (Trainer.evaluate)",
    "first_generation": f"the first step's generation ({GrpoReader.trainer_name}'s or {RlooReader.trainer_name}'s "
                        "completions and no-grad passes, no optimizer state yet)",
    "generation": f"a later step's generation ({GrpoReader.trainer_name}'s or {RlooReader.trainer_name}'s "
                  "completions and no-grad passes)",
    "end": "the end of train() (saving, loading the best model)",
}
# phase -> (the Estimate field predicting its peak, which components the estimate has alive then)
_EST = {"setup": ("weights_bytes", ("weights",)),
        "first_forward_backward": ("first_step_peak_bytes", ("weights", "gradients")),
        "first_optimizer_step": ("first_step_peak_bytes", ("weights", "gradients", "optimizer state")),
        "evaluation": ("eval_peak_bytes", ("weights", "optimizer state")),
        "first_generation": ("first_step_peak_bytes", ("weights",)),
        "generation": ("peak_bytes", ("weights", "optimizer state")),
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
    # read apart (kit.watching.peaks): step 1 (no optimizer state yet), the later steps, evaluation; None: not
    # taken (or, for evaluation, not run: eval_ran says which)
    first_step_peak_bytes: int | None = None
    later_steps_peak_bytes: int | None = None
    eval_peak_bytes: int | None = None
    eval_ran: bool = False
    estimate_first_step_bytes: int | None = None
    estimate_eval_bytes: int | None = None
    eval_estimate_note: str | None = None          # why the eval estimate is not set beside the measurement
    by: str = "kit.train"                           # or "kit.watch_loop": a plain PyTorch loop (no evaluate())
    judged_at: str | None = None                    # a loop: what it was judged at, where not fp32, one micro-batch
    between_steps_bytes: int | None = None          # CPU: highest live-tensor reading between steps
    estimate_between_bytes: int | None = None       # weights + gradients + optimizer state
    notes: list = field(default_factory=list)
    steps: list = field(default_factory=list)       # StepPeak per step, each beside the estimate at its own shape
                                                    # (kit.train, where the batches' lengths varied)
    cap_bytes: int | None = None                    # kit.train(cap_bytes=...): the memory cap the run had
    cap_how: str | None = None                      # how it was set (a CUDA memory fraction, or the CPU counter)
    others_bytes: int | None = None                 # alive before train() and not this Trainer's (in the peaks)
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

    @property
    def eval_ratio(self) -> float | None:
        """Measured evaluation peak / ``eval_peak_bytes`` (None: not run, not taken, or not modeled)."""
        if self.eval_peak_bytes is None or not self.estimate_eval_bytes or self.eval_estimate_note:
            return None
        return self.eval_peak_bytes / self.estimate_eval_bytes

    @property
    def first_step_ratio(self) -> float | None:
        """Measured step-1 peak / ``first_step_peak_bytes`` (None: one of them is missing)."""
        return _ratio(self.first_step_peak_bytes, self.estimate_first_step_bytes)

    @property
    def later_steps_ratio(self) -> float | None:
        """Measured peak of the later steps / ``peak_bytes`` (None: one of them is missing)."""
        return _ratio(self.later_steps_peak_bytes, self.estimate_peak_bytes)

    @wrapped
    def text(self, details: bool = False) -> str:
        """The answer first (at most 5 lines); ``details``: everything the run read, and the advisor in full."""
        if not self.oom:
            return "\n".join(self._done_lines(details))
        return "\n".join(self._oom_answer() + (self._oom_lines() if details else self._oom_brief()))

    __str__ = text

    def _oom_answer(self) -> list:
        """What died and where, the figure that was alive then, the biggest part of it, and the best change."""
        what = "CUDA allocated" if self.reading == "cuda_allocated" else "CPU live tensors"
        when = "before the first step" if self.phase == "setup" else f"at step {self.step}"
        total = self.measured.get("total")
        cap = f" of the {fmt_bytes(self.cap_bytes)} cap" if self.cap_bytes else ""
        alive = f" Alive then: {fmt_bytes(total)} ({what}, measured){cap}." if total is not None else \
            f" The run had a{cap[3:]}." if cap else ""
        out = [f"OUT OF MEMORY {when}, during {self.phase_text}.{alive}"]
        parts = {k: v for k, v in self.measured.items() if k != "total" and v is not None}
        if parts:   # beside it the one estimated figure of this run, named: its phase's estimated peak
            top, est = max(parts, key=parts.get), self.estimated.get("total")
            named = SAID.get(self.estimate_field, self.estimate_field)
            out.append(f"biggest then: {_rest_label(top, self.reading)}, {fmt_bytes(parts[top])} measured"
                       + (f"; this phase's estimated peak: {fmt_bytes(est)} ({named})" if est is not None else ""))
        best = getattr(self.advice, "best", None)
        if best:
            out.append(best)
        return out

    def _oom_brief(self) -> list:
        said = (self.error or "").split(". ")[0]
        who = "run and did not raise: the kernel is usable, and the Trainer can train again (from step 1)." \
            if self.by == "kit.train" else ("loop and did not raise: the kernel is usable, and the model and optimizer "
                                            "train again; your loop's outputs and loss hold theirs until you del them.")
        return [f"  {said}", f"{self.by} stopped the {who}",
                "details: report.text(details=True): what was alive by component beside the estimate, the largest "
                "tensors and their holders, the fit advisor in full"]

    def _oom_lines(self) -> list:
        freed = "".join(f", the {k} ({fmt_bytes(v)})" for k, v in self.freed.items())
        what = "CUDA allocated" if self.reading == "cuda_allocated" else "CPU live tensors"
        out = ["", f"  {self.error}",
               *([f"  The run had a memory cap of {fmt_bytes(self.cap_bytes)}: {self.cap_how}."]
                 if self.cap_bytes else []),
               (f"  kit.train stopped the run and did not raise. It released the failed call's frames{freed}: "
                "the kernel is usable, and the Trainer can train again (from step 1)." if self.by == "kit.train" else
                f"  {self.by} stopped the loop and did not raise. It released the failed step's frames{freed}: the "
                "kernel is usable, and the model and the optimizer train again (its state starts afresh, as at step "
                "1). Your loop's own variables (outputs, loss) hold their tensors until you rebind or del them.")]
        if self.measured:
            est = self.estimated
            out += ["", f"What was alive when it failed ({what}, read before the failed frames were released),"
                        " beside the estimate:", f"  {'component':<34}{'measured':>12}{'estimated':>12}"]
            for k in ("weights", "gradients", "optimizer state", "the rest"):
                e = est.get(k)
                out.append(f"  {_rest_label(k, self.reading):<34}{fmt_bytes(self.measured.get(k)):>12}"
                           f"{'-' if e is None else fmt_bytes(e):>12}")
            out.append(f"  {'total':<34}{fmt_bytes(self.measured.get('total')):>12}{fmt_bytes(est.get('total')):>12}"
                       + (f"  (the estimate: {SAID.get(self.estimate_field, self.estimate_field)})"
                          if self.estimate_field else ""))
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

    def _done_lines(self, details: bool = False) -> list:
        """The run's verdict and its peaks beside the estimate; ``details``: the notes too."""
        out = [f"Completed: {self.step} optimizer steps, no out-of-memory error ({self.seconds:.1f} s)."
               if self.by == "kit.train" else
               f"Watched {self.step} steps of your loop, no out-of-memory error ({self.seconds:.1f} s)"
               + (f"; judged at {self.judged_at}." if self.judged_at else ".")]
        what = ("CUDA max allocated" if self.reading == "cuda_allocated"
                else "CPU live tensors, exact (every op watched)")
        if self.measured_peak_bytes is None:
            # (no CPU reading saw the peak's moment: the activations live inside a step)
            out.append("Training peak: not taken (pass tensor_peak=True, or a cap, for the exact CPU peak)"
                       + (f"; estimated {fmt_bytes(self.estimate_peak_bytes)} ({SAID['peak_bytes']})"
                          if self.estimate_peak_bytes else ", no estimate to compare"))
        if self.measured_peak_bytes is not None:
            out.append(f"Training peak: measured {fmt_bytes(self.measured_peak_bytes)} ({what})" + (
                f", estimated {fmt_bytes(self.estimate_peak_bytes)} ({SAID['peak_bytes']}): ratio {self.ratio:.3f}"
                if self.ratio is not None else ", no estimate to compare"))
            out += [f"  {k}: {v}" for k, v in (
                ("step 1 (no optimizer state yet)", _beside(self.first_step_peak_bytes, self.estimate_first_step_bytes,
                                                            "first_step_peak_bytes")),
                ("the later steps", _beside(self.later_steps_peak_bytes, self.estimate_peak_bytes, "peak_bytes")))
                if v is not None]
        est = (f"estimated {fmt_bytes(self.estimate_eval_bytes)} ({SAID['eval_peak_bytes']})"
               if self.estimate_eval_bytes else "no estimate to compare")
        if self.by != "kit.train":
            pass                  # a plain loop: no Trainer.evaluate() to read
        elif not self.eval_ran:
            out.append(f"Evaluation peak: not run (no evaluate() in this train()); {est}")
        elif self.eval_peak_bytes is None:
            out.append(f"Evaluation peak: not taken (pass tensor_peak=True, or a cap, for the exact CPU peak); {est}")
        elif self.eval_estimate_note:
            out.append(f"Evaluation peak: measured {fmt_bytes(self.eval_peak_bytes)} ({what}), {est}, no ratio: "
                       f"{self.eval_estimate_note}")
        else:
            out.append(f"Evaluation peak: measured {fmt_bytes(self.eval_peak_bytes)} ({what}), {est}"
                       + (f": ratio {self.eval_ratio:.3f}" if self.eval_ratio is not None else ""))
        if self.cap_bytes:
            peak = "" if self.measured_peak_bytes is None else \
                f": the peak used {self.measured_peak_bytes / self.cap_bytes:.0%} of it"
            out.append(f"Memory cap {fmt_bytes(self.cap_bytes)} ({self.cap_how}), not reached{peak}")
        if self.between_steps_bytes is not None and self.estimate_between_bytes:
            out.append(f"Between steps: measured {fmt_bytes(self.between_steps_bytes)}, "
                       "estimated weights + gradients + "
                       f"optimizer state {fmt_bytes(self.estimate_between_bytes)}: ratio "
                       f"{self.between_steps_bytes / self.estimate_between_bytes:.3f}")
        if self.snapshot_path:
            out.append(f"Allocator history saved to {self.snapshot_path}: drag it onto https://pytorch.org/memory_viz.")
        if details:
            return out + [f"note: {n}" for n in self.notes]
        # bytes alive before train() that are not this Trainer's change how the ratio above reads: said at once
        # (kit.watching.trainer puts that note first)
        said, rest = (self.notes[:1], self.notes[1:]) if self.others_bytes else ([], self.notes)
        out += [f"note: {n}" for n in said]
        return out + [f"details: report.text(details=True): {len(rest)} note{'s' * (len(rest) > 1)}"] if rest else out


def _ratio(measured, estimated) -> float | None:
    return None if measured is None or not estimated else measured / estimated


# an Estimate's peak fields, as the report names them (the field names are the JSON's, not a reader's words)
SAID = {"peak_bytes": "its step 2 on", "first_step_peak_bytes": "its step 1", "eval_peak_bytes": "its evaluation"}


def _beside(measured, estimated, name: str) -> str | None:
    """"measured X, estimated Y (name): ratio r", or None where the part was not read."""
    if measured is None:
        return None
    if not estimated:
        return f"measured {fmt_bytes(measured)}, no estimate to compare"
    return (f"measured {fmt_bytes(measured)}, estimated {fmt_bytes(estimated)} ({SAID.get(name, name)}): "
            f"ratio {measured / estimated:.3f}")


def eval_not_modeled(est) -> str | None:
    """Why ``est.eval_peak_bytes`` is not this run's evaluation, in one sentence (None: it is modeled).

    >>> eval_not_modeled(None) is None
    True
    """
    notes = getattr(est, "notes", None) or []
    why = next((n for n in notes if getattr(n, "code", None) in (PACKED_EVAL, "trl-eval-unmodeled")), None)
    return str(why) if why is not None else None


def _rest_label(name: str, reading: str) -> str:
    if name != "the rest":
        return name
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


def set_peak(report: TrainReport, rec, samples, est, split=None) -> None:
    """A completed run: the training peak (step 1 and the later steps apart) and the evaluation peak, each beside
    its own estimate, from ``split`` (a :class:`kit.watching.peaks.PeakSplit`, or None: the ``train`` stage's
    peak ``rec`` alone); and on the CPU the highest live-tensor reading between steps beside weights + gradients
    + optimizer state."""
    if est is not None:
        report.estimate_peak_bytes, report.estimate_first_step_bytes = est.peak_bytes, est.first_step_peak_bytes
        report.estimate_eval_bytes = getattr(est, "eval_peak_bytes", None)
        report.eval_estimate_note = eval_not_modeled(est)
    if split is not None:
        report.eval_ran = "evaluation" in split.parts_seen
        train = [split.get(k) for k in ("setup", "first", "later") if split.get(k) is not None]
        report.measured_peak_bytes = max(train) if train else None
        report.peak_exact = split.taken
        report.first_step_peak_bytes = split.get("first")
        report.later_steps_peak_bytes = split.get("later")
        report.eval_peak_bytes = split.get("evaluation")
        if split.cuda:
            report.notes.append("CUDA's peak counter was reset at each step 1 / later steps / evaluation boundary, "
                                "to read each part's peak apart")
    else:
        report.peak_exact = rec.peak_exact
        # a CPU reading taken between steps is not the peak's moment: it is set beside its own estimate below, and
        # the peak is not taken (never a lower bound set beside the peak's estimate)
        report.measured_peak_bytes = rec.peak_bytes if rec.on_cuda or rec.peak_exact else None
    if rec.on_cuda:
        if not report.peak_exact:
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
