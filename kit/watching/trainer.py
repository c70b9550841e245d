"""Your own Trainer, watched: ``kit.watch(trainer)`` adds the kit's tracker and a live memory plot;
``report = kit.train(trainer)`` runs ``trainer.train()`` and, on an out-of-memory error, returns a
report instead of raising it.

>>> w = kit.watch(trainer)          # doctest: +SKIP
>>> trainer.train()                 # doctest: +SKIP
>>> report = kit.train(trainer)     # doctest: +SKIP
>>> print(report)                   # doctest: +SKIP
OUT OF MEMORY at step 2, during a later step's forward/backward (the optimizer state is alive).

**The live plot** is :func:`kit.plot.timeline` (the readings against time) with the estimate's lines
(weights, + gradients, + optimizer state, the predicted peak) and the device limit, redrawn between
steps by :class:`kit.plot.live.LivePlot` inside an ``ipywidgets.Output`` (inline backend: works in Colab).
Outside a notebook nothing is displayed (``plot=folder`` saves PNGs there instead).

**Phases.** What transformers 5 calls (5.24 read): ``on_step_begin`` before the first micro-batch
of each optimizer step, ``on_pre_optimizer_step`` / ``on_optimizer_step`` around
``optimizer.step()``, ``on_step_end`` after ``zero_grad``. Evaluation has no begin event
(``on_prediction_step`` follows each batch, ``on_evaluate`` the end), so ``trainer.evaluate`` is
wrapped on the instance. The phase callback goes first in the handler's list, so that another
callback that raises finds its phase already set.
"""
from __future__ import annotations

import contextlib
import functools
import time
import weakref
from pathlib import Path

import torch
from transformers import TrainerCallback

from kit import machine, trainer_kinds
from kit.estimate import estimate_trainer
from kit.inputs import byte_count, flag
from kit.measure import controls, device
from kit.measure.controls import check_cap, memory_cap
from kit.measure.tensor_peak import TensorPeak
from kit.measure.track import Tracker
from kit.presets import resolve_device
from kit.units import MiB, fmt_bytes
from kit.watching import recover
from kit.watching.draw import draw_watch
from kit.watching.objects import StepPeak, batch_shape, own_lengths
from kit.watching.peaks import PeakSplit
from kit.watching.core import (Redraw, Run, Stops, advise_option, estimate_option, limit_option, live_plot,
                                plot_folder, plot_note, top_option)
from kit.watching.report import TrainReport, set_peak, show_history


class PhaseCallback(TrainerCallback):
    """Knows which optimizer step (1 = the first of this ``train()``) and which phase is running. A step is
    "first" when it is this ``train()``'s first and the optimizer has no state yet (a resumed run's state is loaded:
    no first step then; an optimizer whose state stays empty, SGD without momentum, has one first step too)."""

    def __init__(self):
        self.step, self.phase, self._first = 0, "setup", 1
        self.split = None     # kit.train's PeakSplit while it runs: each step's part read apart
        self.shapes: dict = {}   # step -> (rows, tokens) of its first micro-batch, as the model's forward saw it
        self._hook = None

    def part(self) -> str:
        """The part of the run a step's phase belongs to: "first" (setup and a step with no optimizer state yet),
        "later", or "evaluation"."""
        return "evaluation" if self.phase == "evaluation" else \
            "first" if self.phase in ("setup", "first_forward_backward", "first_generation", "first_optimizer_step") \
            else "later"

    def mark(self, part: str | None = None) -> str | None:
        """Tell kit.train's PeakSplit (when one runs) that ``part`` (default: this phase's) begins; returns the part
        that was running."""
        if self.split is None:
            return None
        was = self.split.part
        part = part or self.part()
        self.split.switch(part, None if part == "evaluation" else self.step)
        return was

    def _forward(self, module, args, kwargs) -> None:
        if self.phase in ("first_forward_backward", "forward_backward") and self.step not in self.shapes:
            shape = batch_shape(kwargs if "input_ids" in kwargs else (args[0] if args else None))
            if shape is not None:
                self.shapes[self.step] = shape

    def _fresh(self, kwargs) -> bool:
        state = getattr(kwargs.get("optimizer"), "state", None)     # a resumed run's state is loaded: not first
        return self.step == self._first and (state is None or len(state) == 0)

    def on_train_begin(self, args, state, control, **kwargs):
        self.step, self.phase, self._first = state.global_step, "setup", state.global_step + 1
        model = kwargs.get("model")
        if self._hook is None and isinstance(model, torch.nn.Module):   # each step's batch shape
            self._hook = model.register_forward_pre_hook(self._forward, with_kwargs=True)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1
        self.phase = "first_forward_backward" if self._fresh(kwargs) else "forward_backward"
        self.mark()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.phase = "first_optimizer_step" if self._fresh(kwargs) else "optimizer_step"

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.phase = "after_step"

    def on_step_end(self, args, state, control, **kwargs):
        self.step, self.phase = state.global_step, "after_step"

    def on_train_end(self, args, state, control, **kwargs):
        self.phase = "end"
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


class _Evaluate:
    """``trainer.evaluate``, marked for the phase callback. Holds the Trainer weakly (no cycle); not
    restored when it raises, so the report sees "evaluation"."""

    def __init__(self, trainer, phases: PhaseCallback):
        self.trainer, self.phases = weakref.ref(trainer), phases
        self.inner = trainer.__dict__.get("evaluate")      # someone else's wrapper, kept

    def __call__(self, *args, **kwargs):
        tr, p = self.trainer(), self.phases
        before = (p.step, p.phase)
        p.step, p.phase = tr.state.global_step, "evaluation"
        was = p.mark("evaluation")
        out = self.inner(*args, **kwargs) if self.inner else type(tr).evaluate(tr, *args, **kwargs)
        p.step, p.phase = before
        if was is not None:
            p.mark(was)       # back to the training part it interrupted
        return out


class Watch:
    """What :func:`watch` attached: ``tracker`` (the readings; ``tracker.samples`` grow between steps),
    ``callback`` (its TrainerCallback), ``phases``, ``live`` (the LivePlot, or None), ``estimate`` (or
    None, with ``estimate_error``) and the device ``limit_bytes``. ``close()`` detaches it all."""

    def __init__(self, trainer, tracker, callback, phases, live, est, est_error, limit_bytes, limit_label):
        self.trainer = weakref.ref(trainer)
        self.tracker, self.callback, self.phases, self.live = tracker, callback, phases, live
        self.estimate, self.estimate_error = est, est_error
        self.limit_bytes, self.limit_label = limit_bytes, limit_label
        # a Trainer-made optimizer and scheduler are dropped after an OOM, so that a retry makes fresh ones
        self.made_optimizer = getattr(trainer, "optimizer", None) is None
        self.made_scheduler = getattr(trainer, "lr_scheduler", None) is None

    @property
    def attached(self) -> bool:
        tr = self.trainer()
        return tr is not None and self.callback in tr.callback_handler.callbacks

    def close(self) -> None:
        """Detach the callbacks, the evaluate marker and the live plot from the Trainer."""
        tr = self.trainer()
        if tr is not None:
            for cb in (self.phases, self.callback):
                if cb in tr.callback_handler.callbacks:
                    tr.callback_handler.callbacks.remove(cb)
            ev = tr.__dict__.get("evaluate")
            if isinstance(ev, _Evaluate):
                if ev.inner is None:
                    del tr.evaluate
                else:
                    tr.evaluate = ev.inner
            hook = trainer_kinds.part_of(tr, "watch")
            if hook is not None:   # the trainer kind's own stage (kit.trainer_kinds)
                hook.detach(tr)
            tr.__dict__.pop("_kit_watch", None)
        self.tracker.listeners[:] = [f for f in self.tracker.listeners if not isinstance(f, Redraw)]

    def __repr__(self) -> str:
        est = f"estimate peak {fmt_bytes(self.estimate.peak_bytes)}" if self.estimate else "no estimate"
        return (f"<kit.watch: {len(self.tracker.samples)} readings, {est}, limit {fmt_bytes(self.limit_bytes)}"
                f"{'' if self.attached else ', detached'}>")


def watch(trainer, *, plot=None, estimate=True, limit_bytes: int | None = None, every_n_steps: int | None = None,
          live_tensors: bool | None = None, overhead: float = 0.01, limit_label: str = "limit") -> Watch:
    """Attach the kit's tracker and a live memory plot to ``trainer``; ``trainer.train()`` then runs as usual.

    - ``plot``: None draws in a notebook only; a folder saves PNGs there; False draws nothing.
    - ``estimate``: True reads the Trainer (:func:`kit.estimate.from_objects.estimate_trainer`, on this device's
      kernels); an Estimate is used as given; False draws no estimate lines. A Trainer the estimator
      cannot read is said so once, and the plot shows the measurement alone.
    - ``limit_bytes``: the line the plot calls ``limit_label`` (None: this GPU's memory, else this machine's RAM).
    - ``every_n_steps`` / ``live_tensors`` / ``overhead``: as :meth:`kit.measure.track.Tracker.callback`.

    A second ``watch`` of the same Trainer returns the first, attached once.

    >>> w = watch(trainer); trainer.train(); w.tracker.samples[-1].event     # doctest: +SKIP
    'train_end'
    """
    if not (hasattr(trainer, "callback_handler") and hasattr(trainer, "train") and hasattr(trainer, "state")):
        raise ValueError(f"kit.watch takes a transformers Trainer (the one you built), not a {type(trainer).__name__}.")
    estimate, plot = estimate_option(estimate, "kit.watch"), plot_folder(plot, "kit.watch")
    limit_bytes, limit_label = limit_option(limit_bytes, limit_label)
    old = trainer.__dict__.get("_kit_watch")
    if old is not None and old.attached:
        return old
    est, why = _estimate(trainer, estimate)
    if limit_bytes is None:
        here, _ = resolve_device("this", cpu_ok=True)   # this GPU, what torch can have of it; or the RAM
        limit_bytes, label = (here.gpu_bytes, here.label) if here.gpu_bytes else (here.ram_bytes, "this machine's RAM")
    else:
        label = limit_label
    tracker = Tracker()
    callback = tracker.callback(every_n_steps, overhead=overhead, live_tensors=live_tensors)
    phases = PhaseCallback()
    trainer.callback_handler.callbacks.insert(0, phases)
    trainer.callback_handler.add_callback(callback)
    trainer.evaluate = _Evaluate(trainer, phases)
    hook = trainer_kinds.part_of(trainer, "watch")
    if hook is not None:   # the trainer kind's own stage (GRPO's generation: kit.watching.generation)
        hook.attach(trainer, phases, tracker)
    draw = functools.partial(draw_watch, est=est, limit_bytes=limit_bytes, limit_label=label)
    live = live_plot(plot, tracker, draw, "watch")
    w = Watch(trainer, tracker, callback, phases, live, est, why, limit_bytes, label)
    trainer._kit_watch = w
    return w


def _estimate(trainer, estimate):
    if estimate is False:
        return None, "not asked for"
    if estimate is not True:
        return estimate, None

    try:
        return estimate_trainer(trainer, device=machine.device_name()), None
    except ValueError as exc:
        why = f"{type(exc).__name__}: {exc}"
    print(f"kit.watch: no estimate of this Trainer ({why}); the plot shows the measurement alone.", flush=True)
    return None, why


def train(trainer, *, plot=None, history: bool = True, snapshot_path=None, history_entries: int = 100_000,
          tensor_peak: bool = False, advise_device=None, top: int = 5, train_kwargs: dict | None = None,
          cap_bytes: int | None = None, **watch_kwargs) -> TrainReport:
    """Run ``trainer.train()`` under :func:`watch`; on an out-of-memory error return a report, never raise it.

    - The OOM (``torch.OutOfMemoryError``, the CPU allocator's error, ``MemoryError``) is caught, read
      (step, phase, what was alive by component beside the estimate, the largest tensors and their
      holders, the advisor's top changes), then the failed frames, the gradients and the optimizer
      state are released (a Trainer-made optimizer and scheduler are dropped, so a retry starts
      fresh). Ctrl-C (``KeyboardInterrupt``) is cleaned up the same way, said in one line, then re-raised
      (:func:`kit.watching.core.interrupted`). Any other exception propagates, after the watch's cleanup.
    - ``history`` (CUDA only): the allocator's last ``history_entries`` events are recorded and saved to
      ``snapshot_path`` (default ``<output_dir>/kit-memory-history.pickle``) for pytorch.org/memory_viz.
    - ``tensor_peak``: on the CPU, watch every op, so the completed run's peaks are exact (slower). The training
      peak (step 1 apart from the later steps) and the evaluation peak are read apart, each beside its own
      estimate (``first_step_peak_bytes``, ``peak_bytes``, ``eval_peak_bytes``): on CUDA always (max allocated,
      reset at each boundary), on a CPU with ``tensor_peak`` or a cap (:mod:`kit.watching.peaks`).
    - ``advise_device``: what the advisor judges against (None: the cap when there is one, else this GPU,
      or the ``cpu`` preset).
    - ``cap_bytes``: run as on a device of that many bytes (:func:`kit.measure.controls.memory_cap`): on CUDA a
      memory fraction, restored after; on a CPU a live-tensor counter that raises ``torch.OutOfMemoryError``
      the moment an op's outputs pass it (a simulated cap; its count is then the run's exact peak). The
      OOM goes through the same report. The plot's limit line is the cap.
    - ``train_kwargs``: passed to ``trainer.train`` (``resume_from_checkpoint=...``); the rest to :func:`watch`.

    >>> report = train(trainer); report.oom, report.step, report.phase      # doctest: +SKIP
    (True, 2, 'forward_backward')
    """
    cap_bytes = check_cap(byte_count("cap_bytes", cap_bytes, none_means="no cap"))
    advise_device, top = advise_option(advise_device), top_option(top)
    history, tensor_peak = flag("history", history), flag("tensor_peak", tensor_peak)
    plot = plot_folder(plot, "kit.train")      # before training: a finished run's plot must have a folder to go to
    if cap_bytes is not None and "limit_bytes" not in watch_kwargs:
        watch_kwargs.update(limit_bytes=cap_bytes, limit_label="memory cap")
    w = watch(trainer, plot=plot, **watch_kwargs)
    path = None
    counting = cap_bytes is not None and not machine.has_cuda()   # the cap's counter is the exact peak
    if history and machine.has_cuda():
        path = Path(snapshot_path or Path(trainer.args.output_dir) / "kit-memory-history.pickle")
        path.parent.mkdir(parents=True, exist_ok=True)
    split = None
    exact = tensor_peak and not counting and not machine.has_cuda()
    others = _others_bytes(trainer)    # the readings count every tensor in the process: said apart at the end
    run = TrainerRun(trainer, w, top=top, advise_device=advise_device or cap_bytes, snapshot_path=path)
    with Stops(run) as stops:
        with (controls.cuda_memory_history(path, max_entries=history_entries) if path else contextlib.nullcontext()), \
                w.tracker.stage("train"), memory_cap(cap_bytes) as cap, \
                (TensorPeak() if exact else contextlib.nullcontext()) as meter:
            run.cap = cap
            # one counter through the run, read apart at each step's and each evaluation's start (kit.watching.peaks)
            split = PeakSplit(cap.counter or meter)
            w.phases.split = split
            split.switch("setup")
            try:
                output = trainer.train(**(train_kwargs or {}))
            finally:
                split.close()
                w.phases.split = None
    if stops.report is not None:
        stops.report.notes += plot_note(w.live)
        show_history(stops.report)
        return stops.report
    report = TrainReport(oom=False, error=None, step=trainer.state.global_step, phase=w.phases.phase,
                         reading=device.best_reading(),
                         seconds=time.perf_counter() - run.t0, tracker=w.tracker, output=output, **run.report_fields())
    rec = w.tracker.records[-1]
    if split.meter is not None:   # what the stage's own TensorPeak would have counted: every op watched
        rec.live_peak_bytes["cpu"] = max([rec.live_peak_bytes.get("cpu", 0), *split.peaks.values()])
        rec.live_peak_exact = True
    set_peak(report, rec, w.tracker.samples, w.estimate, split)
    report.steps = judged_steps(trainer, w, split)
    report.notes += own_lengths(report.steps) + plot_note(w.live)
    _say_others(report, others)
    return report


class TrainerRun(Run):
    """What :mod:`kit.watching.core` needs of one ``kit.train`` run: the Trainer holds the model and the optimizer; a
    Ctrl-C drops the optimizer's state (the Trainer trains again from step 1, with a fresh optimizer)."""

    after_interrupt = ("The kernel is usable, and the Trainer trains again from step 1 (a fresh optimizer), never "
                       "from the interrupted step's state.")

    def __init__(self, trainer, w, *, top, advise_device, snapshot_path):
        super().__init__(trainer, w, top=top, advise_device=advise_device)
        self.snapshot_path, self.cap = snapshot_path, None

    def where(self) -> tuple[int, str]:
        return self.watch.phases.step, self.watch.phases.phase

    def report_fields(self) -> dict:
        cap = self.cap
        return dict(snapshot_path=str(self.snapshot_path) if self.snapshot_path else None,
                    cap_bytes=cap and cap.cap_bytes, cap_how=cap and cap.how)


def judged_steps(trainer, w, split) -> list:
    """Each optimizer step's peak (read apart) beside the estimate at its own batch shape: where the batches vary in
    length (``DataCollatorWithPadding`` pads each to its longest row), each step is judged at its own length
    (``estimate_trainer(trainer, seq_len=...)`` once per length, the estimate's own where it matches)."""
    est, shapes, at = w.estimate, w.phases.shapes, {}
    if est is None or len({s for _, s in shapes.values()}) < 2:
        return []
    steps = []
    for n, shape in sorted(shapes.items()):
        if shape[1] not in at:
            try:
                at[shape[1]] = est if shape[1] == est.setup.get("seq_len") else \
                    estimate_trainer(trainer, seq_len=shape[1], device=machine.device_name())
            except ValueError:
                at[shape[1]] = None
        first = n == w.phases._first
        figure = None if at[shape[1]] is None else \
            at[shape[1]].first_step_peak_bytes if first else at[shape[1]].peak_bytes
        steps.append(StepPeak(n, first, split.steps.get(n) if split.taken else None, 0.0, shape, figure))
    return steps


def _others_bytes(trainer) -> int:
    """Bytes alive now (CUDA allocated, or every CPU tensor) that are not the Trainer's weights, buffers (its reference
    model's too) or optimizer state: another model, tensors the user holds (and on CUDA torch's cuBLAS workspaces)."""
    on = "cuda" if machine.has_cuda() else "cpu"
    model, opt = getattr(trainer, "model", None), getattr(trainer, "optimizer", None)
    tensors = [*(model.parameters() if model is not None else ()), *(model.buffers() if model is not None else ())]
    ref = getattr(trainer, "ref_model", None)   # DPOTrainer's and GRPOTrainer's reference: the Trainer's own
    if isinstance(ref, torch.nn.Module):
        tensors += [*ref.parameters(), *ref.buffers()]
    for inner in (opt, getattr(opt, "optimizer", None)):        # accelerate's AcceleratedOptimizer wraps one
        state = getattr(inner, "state", None)
        if isinstance(state, dict):
            tensors += [t for per in state.values() for t in per.values() if isinstance(t, torch.Tensor)]
    own = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device.type == on}
    return max(0, recover.alive_bytes() - sum(own.values()))


def _say_others(report: TrainReport, others: int) -> None:
    if others < MiB:       # the leak check's tolerance: below it, a few buffers and the batch of a call
        return
    report.others_bytes = others
    what = "another model, tensors you hold" + (", cuBLAS workspaces" if report.reading == "cuda_allocated" else "")
    text = (f"{fmt_bytes(others)} were alive before train() and are not this Trainer's ({what}): the measured "
            "peaks count them")
    if report.measured_peak_bytes is not None and report.estimate_peak_bytes:
        own = report.measured_peak_bytes - others
        text += f"; without them the training peak is {fmt_bytes(own)}: ratio {own / report.estimate_peak_bytes:.3f}"
    report.notes.insert(0, text)
