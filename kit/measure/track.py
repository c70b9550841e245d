"""Stages and a Trainer callback: what each stage of a run really took.

>>> tracker = Tracker()
>>> with tracker.stage("load model"):                         # doctest: +SKIP
...     model = build_model("tiny-gpt2")
>>> trainer = Trainer(model, args, callbacks=[tracker.callback()])  # doctest: +SKIP
>>> with tracker.stage("train"):                              # doctest: +SKIP
...     trainer.train()
>>> print(tracker.summary())                                  # doctest: +SKIP

**Which counter each number comes from.** A stage takes a full ``kit.measure.device.snapshot()``
before and after (after ``gc.collect()``, so garbage waiting in reference cycles is not
counted as live). Its peak comes from:

- CUDA: ``torch.cuda.max_memory_allocated`` (read through ``kit.measure.device``);
- CPU RSS: Linux's ``VmHWM`` (peak resident memory of the process);
- CPU live tensors: there is no allocator peak on a CPU, so ``live_peak_bytes`` is the
  largest live-tensor reading seen at the stage's start, end and samples. It is a
  *lower bound*: activations inside a step live in autograd's graph, out of the garbage
  collector's sight, and are gone before any callback runs. ``stage(..., tensor_peak=True)``
  makes it exact with ``kit.measure.tensor_peak.TensorPeak``, which watches every op.

**Living with other tools.** Peak counters are global to the process:
``torch.cuda.reset_peak_memory_stats`` resets CUDA's for everyone (and a write to
``/proc/self/clear_refs`` the RSS peak; ``kit.measure.device.reset_peak`` does both). By default
(``reset_peak="auto"``) the tracker never resets the CUDA peak; it reads
``max_memory_allocated`` at the start and end of a stage instead. If the peak rose during
the stage, the end value *is* the stage's peak (``cuda_peak_exact=True``); if it did not,
the stage stayed under an older peak and the tracker reports the highest reading it saw,
marked not exact. Pass ``stage(..., reset_peak=True)`` when you want an exact peak and no
other tool is measuring across that stage. On a CPU-only machine the RSS peak is reset at
each stage start, since nothing else reads it.

Trainer's own memory metrics (``TrainingArguments(skip_memory_metrics=False)``, the
``TrainerMemoryTracker``) reset the CUDA peak when ``Trainer()``, ``train()``, ``evaluate()``
and ``predict()`` start, and run a busy thread polling RSS. They stay correct next to this
tracker, which never resets behind them. A stage that contains such a reset sees the peak
drop below its start value; it then reports the peak since that reset, marked not exact.
Keep ``skip_memory_metrics=True`` (the default) unless you want both: the busy RSS thread
costs a CPU core for the whole run.
"""
from __future__ import annotations

import contextlib
import gc
import json
import time
from pathlib import Path

from kit import machine
from kit.measure import device
from kit.measure.callback import MemoryCallback
from kit.measure.device import Snapshot
from kit.measure.files import load, write_csv
from kit.measure.records import Sample, StageRecord, stage_peak  # noqa: F401 (StageRecord: part of the API)
from kit.measure.tensor_peak import TensorPeak
from kit.units import GiB, fmt_bytes

# What a reading costs in this process, shared by all trackers. The walk's cost grows with
# the number of Python objects; until measured, assume a pessimistic second, so that the
# callback's budget is never spent on a walk it cannot afford.
_COST = {"live": 1.0, "cheap": 0.0005}



class Tracker:
    """Records stages (``with tracker.stage(name)``) and samples (``tracker.callback()``).

    ``reset_peak``: ``"auto"`` (reset the RSS peak at each stage on CPU-only machines, never
    the CUDA peak), ``True`` (reset both at each stage start) or ``False`` (never reset).

    >>> t = Tracker()
    >>> with t.stage("alloc"):
    ...     x = torch.zeros(1024)                               # doctest: +SKIP
    >>> t.records[0].delta_bytes                                # doctest: +SKIP
    4096
    """

    def __init__(self, *, reset_peak="auto"):
        if reset_peak not in ("auto", True, False):
            raise ValueError(f"reset_peak must be 'auto', True or False, not {reset_peak!r}")
        self.reset_peak = reset_peak
        self.records: list[StageRecord] = []
        self.samples: list[Sample] = []
        self.listeners: list = []            # fn(event, tracker); event in stage_start/stage_end/sample
        self.device = machine.device_name()
        self.reading = device.best_reading()
        self._open: list[StageRecord] = []
        self._counts: dict[str, int] = {}

    # readings -----------------------------------------------------------------
    @property
    def cost_live_s(self) -> float:
        """Seconds the last reading with the live-tensor walk took in this process (1 s until measured)."""
        return _COST["live"]

    @property
    def cost_cheap_s(self) -> float:
        """Seconds a reading without the walk takes (moving average)."""
        return _COST["cheap"]

    def _snap(self, live: bool) -> tuple[Snapshot, float]:
        t = time.perf_counter()
        snap = device.snapshot(live_tensors=live)
        cost = time.perf_counter() - t
        if live:
            _COST["live"] = cost
        else:
            _COST["cheap"] = 0.8 * _COST["cheap"] + 0.2 * cost
        return snap, cost

    def _emit(self, event: str) -> None:
        for fn in list(self.listeners):
            fn(event, self)

    def add_listener(self, listener) -> None:
        """Call ``fn(event, tracker)`` on ``"stage_start"``, ``"stage_end"`` and ``"sample"`` (LivePlot uses it)."""
        self.listeners.append(listener)

    @property
    def current_stage(self) -> StageRecord | None:
        return self._open[-1] if self._open else None

    def sample(self, step: int | None = None, *, live_tensors: bool = True, event: str = "manual") -> Sample:
        """Take one reading now, attributed to the innermost open stage.

        >>> Tracker().sample(live_tensors=False).snap.rss_bytes > 0
        True
        """
        snap, cost = self._snap(live_tensors)
        cur = self.current_stage
        s = Sample(snap, step, event, cur.name if cur else None, cur.index if cur else None, live_tensors, cost)
        self.samples.append(s)
        self._emit("sample")
        return s

    # stages -------------------------------------------------------------------
    @contextlib.contextmanager
    def stage(self, name: str, *, reset_peak: bool | None = None, collect: bool = True, live_tensors: bool = True,
              tensor_peak: bool = False):
        """Record a stage: snapshots before and after, and the peak inside. Stages may repeat.

        ``collect=False`` skips the ``gc.collect()`` at both ends and ``live_tensors=False``
        the live-tensor walk; each costs ~0.3 s with transformers loaded. On a CPU,
        ``tensor_peak=True`` watches every op with ``kit.measure.tensor_peak.TensorPeak``, so the
        live-tensor peak becomes exact, activations included (it slows the ops: use it for
        short measured runs). The record is kept even when the body raises.

        >>> with Tracker().stage("fold") as rec:
        ...     pass
        >>> rec.index
        0
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a stage needs a non-empty name, got {name!r}")
        if reset_peak is None:
            reset_peak = (not machine.has_cuda()) if self.reset_peak == "auto" else self.reset_peak
        if collect:
            gc.collect()
        took = device.reset_peak() if reset_peak else {}  # CUDA's too when there is a GPU: only on request there
        resets = device.peak_resets()
        start, _ = self._snap(live_tensors)
        index = self._counts.get(name, 0)
        self._counts[name] = index + 1
        rec = StageRecord(name=name, index=index, order=len(self.records), start=start, depth=len(self._open),
                          reset_peak=bool(reset_peak))
        self.records.append(rec)
        self._open.append(rec)
        self._emit("stage_start")
        watch = TensorPeak() if tensor_peak and not machine.has_cuda() else None
        try:
            if watch is not None:
                watch.__enter__()
            yield rec
        except BaseException as exc:
            text = str(exc).strip().splitlines()
            rec.error = f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
            raise
        finally:
            self._open.remove(rec)
            if watch is not None:
                watch.__exit__(None, None, None)
            if collect:
                gc.collect()
            rec.end, _ = self._snap(live_tensors)
            self._finish(rec, watch, took, resets)
            self._emit("stage_end")

    def _finish(self, rec: StageRecord, watch=None, took: dict | None = None, resets: dict | None = None) -> None:
        """The stage's peaks. ``took``: which counters the stage's own reset reset; ``resets``: the
        process's reset counts just after it (more at the end: someone reset inside the stage)."""
        took, now = took or {}, device.peak_resets()
        resets = resets or now
        t0, t1 = rec.start.time, rec.end.time
        inside = [s.snap for s in self.samples if t0 <= s.snap.time <= t1]
        kids = [r for r in self.records
                if r is not rec and r.end is not None and t0 <= r.start.time and r.end.time <= t1]
        snaps = [rec.start, rec.end] + inside
        rec.cuda_peak_bytes, rec.cuda_peak_exact, cuda_note = stage_peak(
            bool(took.get("cuda")), rec.start.cuda_peak_allocated_bytes, rec.end.cuda_peak_allocated_bytes,
            [s.cuda_allocated_bytes for s in snaps] + [k.cuda_peak_bytes for k in kids],
            [s.cuda_peak_allocated_bytes for s in inside], now["cuda"] > resets["cuda"])
        if not rec.on_cuda:
            rec.cuda_peak_bytes = rec.cuda_peak_exact = None
        rec.rss_peak_bytes, rec.rss_peak_exact, rss_note = stage_peak(
            bool(took.get("rss")), rec.start.rss_peak_bytes, rec.end.rss_peak_bytes,
            [s.rss_bytes for s in snaps] + [k.rss_peak_bytes for k in kids],
            [s.rss_peak_bytes for s in inside], now["rss"] > resets["rss"])
        if rec.reset_peak and not took.get("rss"):
            rss_note = f"its reset at stage start failed (/proc/self/clear_refs not writable); {rss_note}"
        live: dict[str, int] = {}
        for s in [rec.start, rec.end] + [s.snap for s in self.samples if s.has_live and t0 <= s.snap.time <= t1]:
            if s.live_tensor_bytes is not None:
                live.setdefault("cpu", 0)       # read, and no CPU tensor: a true 0
            for dev, n in (s.live_tensor_bytes or {}).items():
                live[dev] = max(live.get(dev, 0), n)
        for k in kids:
            for dev, n in k.live_peak_bytes.items():
                live[dev] = max(live.get(dev, 0), n)
        if watch is not None:
            live["cpu"] = max(live.get("cpu", 0), watch.peak_bytes)
            rec.live_peak_exact = True
        rec.live_peak_bytes = live
        rec.peak_note = (f"CUDA peak: {cuda_note}. " if rec.on_cuda else "") + f"RSS peak: {rss_note}. " + (
            "Live-tensor peak: exact (every op watched)." if rec.live_peak_exact
            else "Live-tensor peak: highest reading seen (a lower bound).")

    def folds(self, name: str) -> list[dict]:
        """The records of one repeated stage as dicts for ``plot.folds``: start/peak/end bytes.

        Bytes of the best reading; on a CPU ``peak_bytes`` is exact when the stage ran with
        ``tensor_peak=True``, else the live-tensor lower bound: ``peak_exact`` says which (see
        the module docstring). A reading that was not taken is None.

        >>> Tracker().folds("fold")
        []
        """
        return [{"start_bytes": r.start_bytes, "peak_bytes": r.peak_bytes, "end_bytes": r.end_bytes,
                 "peak_exact": r.peak_exact, "oom": bool(r.error and "memory" in r.error.lower())}
                for r in self.records if r.name == name and r.end is not None]

    def callback(self, every_n_steps: int | None = None, *, overhead: float = 0.01, live_tensors: bool | None = None,
                 min_interval_s: float = 1.0):
        """A ``transformers.TrainerCallback`` that samples memory during ``Trainer.train()``.

        It reads after each optimizer step (gradients and optimizer state are alive then).
        ``every_n_steps=None`` samples whenever the time spent sampling (redraws of a
        LivePlot included) stays under ``overhead`` of the training time, at most once
        per ``min_interval_s`` (so a long run keeps a few thousand samples, not millions);
        an int samples every N steps. ``live_tensors=None`` adds the gc walk for live
        tensors (~0.3 s with transformers loaded) only when that budget allows; True/False
        force it.

        >>> trainer = Trainer(..., callbacks=[tracker.callback()])  # doctest: +SKIP
        """
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
            raise ValueError(f"every_n_steps must be a positive int or None, not {every_n_steps!r}")
        if not 0 < overhead < 1:
            raise ValueError(f"overhead is a fraction of training time (e.g. 0.01), not {overhead!r}")
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0 seconds, not {min_interval_s!r}")

        return MemoryCallback(self, every_n_steps, overhead, live_tensors, min_interval_s)

    # text and files -----------------------------------------------------------
    def summary(self) -> str:
        """A text table, one line per stage; ``>=`` marks a peak that is a lower bound.

        >>> print(Tracker().summary())
        no stages recorded
        """
        done = [r for r in self.records if r.end is not None]
        if not done:
            return "no stages recorded"
        top = max([r.peak_bytes or 0 for r in done] + [r.end.rss_bytes for r in done])
        unit = "GiB" if top >= GiB else "MiB"
        what = "CUDA allocated" if self.reading == "cuda_allocated" else "CPU live tensors"
        lines = [f"reading: {what} ({self.reading}); RSS = process resident memory",
                 f"{'stage':<24}{'start':>12}{'end':>12}{'change':>12}{'peak':>13}{'RSS peak':>13}{'time':>9}"]
        for r in done:
            label = r.name if self._counts.get(r.name, 1) == 1 else f"{r.name} #{r.index + 1}"
            label = ("  " * r.depth + label)[:23]
            peak = ("not read" if r.peak_bytes is None
                    else ("" if r.peak_exact else ">=") + fmt_bytes(r.peak_bytes, unit))
            rss = ("" if r.rss_peak_exact else ">=") + fmt_bytes(r.rss_peak_bytes, unit)
            change = "not read" if r.delta_bytes is None else ("+" if r.delta_bytes >= 0 else "-") + fmt_bytes(
                abs(r.delta_bytes), unit)
            start, end = (("not read" if b is None else fmt_bytes(b, unit)) for b in (r.start_bytes, r.end_bytes))
            lines.append(f"{label:<24}{start:>12}{end:>12}{change:>12}{peak:>13}{rss:>13}{r.duration_s:>8.1f}s"
                         + (f"  ({r.error})" if r.error else ""))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"kit": "track", "version": 1, "device": self.device, "reading": self.reading,
                "stages": [r.to_dict() for r in self.records], "samples": [s.to_dict() for s in self.samples]}

    def to_json(self, path: str | Path | None = None) -> str:
        """The whole record as JSON text; written to ``path`` when given. ``Tracker.load`` reads it back."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    def to_csv(self, path: str | Path) -> None:
        """One row per reading (``kind`` = stage_start, stage_end or sample); stage peaks on stage_end rows."""

        write_csv(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "Tracker":
        """Read back a tracker written by ``to_json`` (``.json``) or ``to_csv`` (``.csv``)."""

        return load(cls(), Path(path))
