"""The watcher core that ``kit.train`` (:mod:`kit.watching.trainer`) and ``kit.watch_loop``
(:mod:`kit.watching.loop`) share, each rule written once:

- the options both take, checked before anything runs: :func:`estimate_option`, :func:`plot_folder`,
  :func:`limit_option`, :func:`advise_option`, :func:`top_option`;
- the live plot: :func:`live_plot` makes it, and a plot that cannot be saved never stops a run nor loses its report
  (:class:`Redraw` says it once, as a note);
- a watched run that stops early, :class:`Stops`: an out-of-memory error becomes the report (:func:`oom_report`: what
  was alive, what was released, the advisor), never raised; Ctrl-C gives the memory back, says so in one line
  (:func:`interrupted`) and goes on up; any other exception goes on up after the same tidy-up.

Each watcher says what the core needs to know of it in a :class:`Run`: who speaks, what holds the model and the
optimizer, where the run is (step and phase), what the advisor reads, and its own notes.

>>> error_line(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB.\\nmore"))
'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB.'
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, NamedTuple

from kit import machine
from kit.inputs import InputError, byte_count, flag, whole_number
from kit.measure import device
from kit.measure.cleanup import scrub
from kit.units import fmt_bytes
from kit.watching import recover
from kit.watching.report import TrainReport, advice_text, estimated_for, read_alive

_ALWAYS_DRAWN = ("evaluate", "train_end")      # tracker events the live plot always draws at: the run's whole story


class StageHook(NamedTuple):
    """A trainer kind's part in ``kit.watch`` (:mod:`kit.trainer_kinds`, layer ``"watch"``): ``attach(trainer,
    phases, tracker)`` marks a stage of the kind's own (GRPO's generation) and returns whether it did; ``detach(
    trainer)`` puts back what it wrapped."""

    attach: Callable
    detach: Callable


class Run:
    """What a watcher tells the core. ``owner`` holds ``.model`` and ``.optimizer`` (the Trainer, or the loop's
    watch); ``watch`` holds ``.tracker``, ``.live``, ``.estimate``, ``.estimate_error``, ``.limit_label``,
    ``.made_optimizer`` and ``.made_scheduler``. A watcher overrides :meth:`where` and what differs."""

    by = "kit.train"          # who speaks
    keeps_state = False       # Ctrl-C keeps the optimizer's state (a loop trains on), or drops it (a Trainer restarts)
    after_interrupt = ""      # the Ctrl-C line's last sentence: what the user can do next

    def __init__(self, owner, watch, *, top: int = 5, advise_device=None):
        self.owner, self.watch, self.top, self.advise_device = owner, watch, top, advise_device
        self.t0 = time.perf_counter()

    def where(self) -> tuple[int, str]:
        """(the optimizer step running, its phase: a key of :data:`kit.watching.report.PHASES`)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Called before an out-of-memory report is read (a loop makes its estimate here if it has none yet)."""

    def advice_input(self):
        """What the fit advisor reads besides the estimate (the Trainer; a loop's options)."""
        return self.owner

    def notes(self) -> list:
        """The watcher's own notes for the report (a loop's assumptions)."""
        return []

    def on_interrupt(self) -> None:
        """Called after Ctrl-C's cleanup (a loop starts its micro-batches' count again: the gradients are gone)."""

    def report_fields(self) -> dict:
        """More :class:`~kit.watching.report.TrainReport` fields (the allocator history's path, the cap)."""
        return {}


class Stops:
    """``with Stops(run) as stops:`` around a watched run. An out-of-memory error is caught and read into
    ``stops.report`` (the block ends there); Ctrl-C and any other exception go on up after the cleanup."""

    def __init__(self, run: Run):
        self.run, self.report = run, None

    def __enter__(self) -> Stops:
        return self

    def __exit__(self, kind, exc, traceback) -> bool:
        if exc is None:
            return False
        if isinstance(exc, KeyboardInterrupt):   # memory back, said so, then the interrupt goes on
            print(interrupted(self.run, exc), flush=True)
            return False
        if not device.is_oom(exc):
            tidy(self.run)
            return False
        self.report = oom_report(self.run, exc)
        return True


def tidy(run: Run) -> None:
    """After a run stopped: forget stored exceptions, return the allocator's cache (:func:`kit.watching.recover.tidy`),
    and redraw the live plot."""
    recover.tidy()
    redraw(run.watch.live)


def error_line(exc: BaseException) -> str:
    """The exception's class and the first line of its message (at most 400 characters)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def oom_report(run: Run, exc: BaseException) -> TrainReport:
    """The out-of-memory report: the step and phase, what was alive by component beside the estimate and the largest
    tensors with their holders (read before the failed frames go), what was released (the gradients and the optimizer
    state: :func:`kit.watching.recover.release`), and the fit advisor's changes."""
    run.prepare()
    watch = run.watch
    step, phase = run.where()
    report = TrainReport(oom=True, error=error_line(exc), step=step, phase=phase, reading=device.best_reading(),
                         seconds=time.perf_counter() - run.t0,
                         tracker=watch.tracker, by=run.by, **run.report_fields())
    report.measured, report.cuda, report.tensors = read_alive(run.owner, exc, top=run.top)
    scrub(exc)
    report.freed = recover.release(run.owner, watch, report.measured)
    report.estimated, report.estimate_field = estimated_for(watch.estimate, report.phase)
    tidy(run)
    report.advice, fits = advice_text(watch.estimate, run.advice_input(),
                                      run.advise_device or ("this" if machine.has_cuda() else "cpu"))
    if fits:      # its changes would make something fit that already does: not this error's fix
        report.advice = (f"The fit advisor: the estimate fits {watch.limit_label}, yet this step ran out of memory, "
                         "so the advisor's changes are not the fix: look for what the estimate does not count: "
                         "another model, Trainer or tensors alive in this process (the largest tensors above), other "
                         "processes on the device, a memory cap, or fragmentation.")
    report.notes += run.notes()
    if watch.estimate is None:
        report.notes.append(f"no estimate beside the measurement: {watch.estimate_error}")
    return report


def interrupted(run: Run, exc: BaseException) -> str:
    """Clean up after Ctrl-C (a ``KeyboardInterrupt``) inside a watched run, and return the line that says so: the
    interrupted frames and the gradients are released, and the optimizer's state too unless the run keeps it
    (:attr:`Run.keeps_state`). The caller re-raises the interrupt."""
    step, phase = run.where()
    before = recover.alive_bytes()                # the interrupted frames still alive
    scrub(exc)
    if run.keeps_state:
        model = getattr(run.owner, "model", None)
        if model is not None:
            model.zero_grad(set_to_none=True)
    else:
        recover.release(run.owner, run.watch)
    tidy(run)
    run.on_interrupt()
    now = recover.alive_bytes()
    when = "before the first step" if phase == "setup" else f"at step {step}"
    released, still = ("the gradients", "the weights, the optimizer's state and anything else you hold") \
        if run.keeps_state else ("the gradients and the optimizer state", "the model's weights, and anything else "
                                                                          "you hold")
    half = " Interrupted inside optimizer.step(): some parameters may have taken this step and others not." \
        if phase in ("optimizer_step", "first_optimizer_step") else ""
    return (f"{run.by}: interrupted {when} ({phase}). Released the interrupted step's frames and {released}: "
            f"{fmt_bytes(max(before - now, 0))} back, {fmt_bytes(now)} still allocated ({still}). "
            f"{run.after_interrupt}{half}")


# the options both watchers take ---------------------------------------------------------------------------------
def estimate_option(value, by: str):
    """``estimate=``: an Estimate, used as given; else True (estimate it) or False/None (none), read as a flag
    (``"no"`` is False).

    >>> estimate_option("no", "kit.train"), estimate_option(None, "kit.train")
    (False, False)
    """
    from kit.estimate import Estimate

    if isinstance(value, Estimate):
        return value
    if value is None:
        return False
    try:
        return flag("estimate", value)
    except InputError:
        raise InputError("estimate", f"{by}'s estimate must be True (read it), False (none) or an Estimate "
                                     f"(kit.estimate.estimate(...)), not {value!r}.") from None


def plot_folder(plot, by: str):
    """``plot=``: None (a notebook's live plot), False (none), or a folder the PNGs can be saved in, checked now: a
    file, or a folder under a file or where nothing can be written, is refused before anything runs.

    >>> plot_folder(False, "kit.train") is False
    True
    """
    if plot is None or plot is False:
        return plot
    try:
        folder = Path(plot).expanduser()
    except TypeError:
        raise InputError("plot", f"{by}'s plot must be a folder (a str or Path), None (a notebook's live plot) or "
                                 f"False (none), not a {type(plot).__name__}.") from None
    what = "must be a folder to save the PNGs in"
    if folder.exists() and not folder.is_dir():
        raise InputError("plot", f"plot {what}, not the file {plot}: pass a folder (new or existing: no file in it is "
                                 "overwritten), None (a notebook's live plot) or False.")
    above = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not above.is_dir():
        raise InputError("plot", f"plot {what}, and {plot} lies under the file {above}: pass a folder that is not "
                                 "inside a file, None (a notebook's live plot) or False.")
    if not os.access(above, os.W_OK | os.X_OK):
        raise InputError("plot", f"plot {what}, and {above} (where {plot} would be made) cannot be written to: pass a "
                                 "folder you can write in, None (a notebook's live plot) or False.")
    return folder


def limit_option(limit_bytes, limit_label) -> tuple[int | None, str]:
    """``limit_bytes=`` (a positive whole number of bytes, or None: this GPU or this machine's RAM) and its label."""
    if not isinstance(limit_label, str) or not limit_label.strip():
        raise InputError("limit_label", f"limit_label must be a short text naming the limit line, not {limit_label!r}.")
    return byte_count("limit_bytes", limit_bytes, none_means="this GPU's memory, or this machine's RAM"), limit_label


def advise_option(advise_device):
    """``advise_device=``: None (the default device), or a device the advisor can judge against, checked now."""
    if advise_device is None:
        return None
    from kit.presets import resolve_device

    try:
        resolve_device(advise_device, cpu_ok=True)
    except InputError as exc:
        raise InputError("advise_device", f"advise_device: {exc}") from None
    return advise_device


def top_option(top) -> int:
    """``top=``: how many of the largest tensors the out-of-memory report lists."""
    return whole_number("top", top)


def live_plot(plot, tracker, draw, prefix: str):
    """The live plot (:class:`kit.plot.live.LivePlot`): in a notebook when ``plot`` is None, in ``plot`` (a folder)
    as PNGs, or none (False, or no notebook); redrawn by the tracker's readings through :class:`Redraw`."""
    if plot is False:
        return None
    from kit.plot.live import LivePlot, in_notebook

    if plot is None and not in_notebook():
        return None
    live = LivePlot(None, draw, folder=None if plot is None else Path(plot), prefix=prefix)
    live.tracker = tracker
    tracker.add_listener(Redraw(live))
    return live


class Redraw:
    """The live plot's listener: throttled redraws between steps (LivePlot's rule), and always one at an evaluation
    and at the end of a run, so the plot shows it whole. A plot that cannot be saved (the disk full, the folder
    removed) is said once in ``failed`` and drawn no more: the run and its report go on."""

    def __init__(self, live):
        self.live = live

    def __call__(self, event, tracker):
        if getattr(self.live, "failed", None):
            return
        if event == "sample" and tracker.samples[-1].event in _ALWAYS_DRAWN:
            redraw(self.live)
        else:
            redraw(self.live, lambda: self.live._on_event(event, tracker))


def redraw(live, how=None) -> None:
    """Draw the live plot now (or as ``how`` does); an error saving it is kept in ``live.failed``, never raised."""
    if live is None or getattr(live, "failed", None):
        return
    try:
        (how or live.update)()
    except OSError as exc:
        live.failed = f"the live plot could not be saved ({error_line(exc)}); the run went on without it"


def plot_note(live) -> list:
    """The note a report carries where its plot could not be saved."""
    failed = getattr(live, "failed", None)
    return [failed] if failed else []
