"""Out-of-memory-safe runs: catch the error, free what the failed call held, keep the kernel usable.

>>> r = oom_safe(train, setup={"batch_size": 64})              # doctest: +SKIP
>>> r.oom, r.error                                               # doctest: +SKIP
(True, 'OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')

:func:`largest_batch_size` searches the largest batch that runs, each attempt OOM-safe.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from kit.measure import device
from kit.measure.cleanup import forget_exceptions, scrub
from kit.measure.track import Tracker


@dataclass
class RunResult:
    """What :func:`oom_safe` saw: ``ok``, or ``oom`` with the error text and the setup."""

    ok: bool
    oom: bool = False
    value: Any = None
    error: str | None = None
    setup: dict = field(default_factory=dict)
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.ok

    def text(self) -> str:
        setup = ", ".join(f"{k}={v}" for k, v in self.setup.items()) or "no setup given"
        if self.ok:
            return f"ran ({setup}) in {self.seconds:.1f} s"
        return f"OUT OF MEMORY ({setup}) after {self.seconds:.1f} s: {self.error}"


def oom_safe(func, *args, setup: dict | None = None, tracker=None, stage: str | None = None, **kwargs) -> RunResult:
    """Run ``fn(*args, **kwargs)``; on an out-of-memory error, free its memory and return a result.

    Catches ``torch.OutOfMemoryError``, CUDA's "out of memory" RuntimeError and
    ``MemoryError`` (other errors propagate untouched). The failed call's frames are
    cleared (the exception's traceback keeps every tensor they held), stored exceptions
    are dropped, gradients of modules passed as arguments are dropped, then gc and the
    CUDA cache run. The kernel stays usable. With ``tracker``, the call is a stage.

    >>> r = oom_safe(train, setup={"batch_size": 64})              # doctest: +SKIP
    >>> r.oom, r.error                                               # doctest: +SKIP
    (True, 'OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')
    """
    return _guarded(func, args, kwargs, setup, tracker, stage, collect=True)


def _guarded(func, args, kwargs, setup, tracker, stage, collect: bool) -> RunResult:
    setup = dict(setup or {})
    t = time.perf_counter()
    try:
        if tracker is not None:
            with tracker.stage(stage or getattr(func, "__name__", "run")):
                value = func(*args, **kwargs)
        else:
            value = func(*args, **kwargs)
        return RunResult(True, value=value, setup=setup, seconds=time.perf_counter() - t)
    except BaseException as exc:
        if not device.is_oom(exc):
            raise
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]
        scrub(exc)
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.nn.Module):
            a.zero_grad(set_to_none=True)
    forget_exceptions()
    if collect:
        gc.collect()
        device.empty_cache()
    return RunResult(False, oom=True, error=error, setup=setup, seconds=time.perf_counter() - t)


class SweepPoint(NamedTuple):
    size: int
    peak_bytes: int | None
    oom: bool


@dataclass
class BatchSizeSearch:
    best: int | None                      # the largest batch size that ran, None if none did
    points: list                          # SweepPoint per attempt, by size: ready for plot.sweep
    results: list                         # RunResult per attempt, in the order tried

    def text(self) -> str:
        tried = ", ".join(f"{p.size}{' OOM' if p.oom else ''}" for p in self.points)
        return f"largest batch size that fits: {self.best} (tried {tried})"


def largest_batch_size(train_fn, start: int, *, min_size: int = 1, refine: bool = True,
                       precision: int | None = None, tracker=None, reset_peak: bool = True) -> BatchSizeSearch:
    """Find the largest batch size for which ``train_fn(batch_size)`` runs without OOM.

    Halves from ``start`` with accelerate's ``find_executable_batch_size`` until a size
    fits, then (``refine``) bisects between it and the smallest failure, to within
    ``precision`` (default: a tenth of the size that fits). Each attempt runs as an
    :func:`oom_safe` stage of ``tracker``, with the peak counters reset at its start
    (``reset_peak``): this sweep owns the peak while it runs. Peaks are CUDA max
    allocated on a GPU, else the process's peak RSS.

    >>> search = largest_batch_size(lambda bs: trainer_at(bs).train(), start=64)   # doctest: +SKIP
    >>> plot.sweep(search.points, "batch size")                                   # doctest: +SKIP
    """
    from accelerate.utils import find_executable_batch_size


    if not isinstance(start, int) or start < min_size or min_size < 1:
        raise ValueError(f"need integers start >= min_size >= 1, got start={start!r}, min_size={min_size!r}")
    tracker = tracker or Tracker()
    results: list[RunResult] = []
    points: dict[int, SweepPoint] = {}

    def attempt(batch_size: int, collect: bool = True) -> RunResult:
        r = _guarded(_run_stage, (tracker, f"batch size {batch_size}", reset_peak, train_fn, batch_size), {},
                     {"batch_size": batch_size},
                     None, None, collect)
        rec = tracker.records[-1]
        peak = rec.cuda_peak_bytes if rec.on_cuda else rec.rss_peak_bytes
        points[batch_size] = SweepPoint(batch_size, None if r.oom else peak, r.oom)
        results.append(r)
        return r

    def probe(batch_size: int) -> int:
        if attempt(batch_size, collect=False).oom:      # accelerate collects after a failure
            # accelerate retries only RuntimeErrors whose text has " out of memory.". Raise a
            # fresh one: the failed run's frames are already cleared, so accelerate's gc.collect
            # inside its except-block can free them (the original exception would keep them).
            raise RuntimeError(f"kit: out of memory. at batch size {batch_size}")
        return batch_size

    size = [start]

    def halve() -> int:
        size[0] = size[0] // 2 if size[0] // 2 >= min_size else 0   # 0 makes accelerate stop
        return size[0]

    try:
        best = find_executable_batch_size(probe, starting_batch_size=start, reduce_batch_size_fn=halve)()
    except RuntimeError as exc:
        if "reached zero" not in str(exc):
            raise
        best = None
    if best is not None and refine:
        fails = [p.size for p in points.values() if p.oom and p.size > best]
        hi, step = (min(fails) if fails else best), precision or max(1, best // 10)
        while hi - best > step:
            mid = (best + hi) // 2
            if attempt(mid).oom:
                hi = mid
            else:
                best = mid
    return BatchSizeSearch(best, sorted(points.values()), results)


def _run_stage(tracker, name, reset_peak, func, batch_size):
    # no gc walks: a sweep reads the peak counters, and oom_safe collects after a failure
    with tracker.stage(name, reset_peak=reset_peak, collect=False, live_tensors=False):
        return func(batch_size)
