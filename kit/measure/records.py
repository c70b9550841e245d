"""What a tracker records: a :class:`StageRecord` per stage, a :class:`Sample` per reading, and the
rule that says whether a stage's peak is exact (:func:`stage_peak`). See :mod:`kit.measure.track`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kit.measure.device import Snapshot

STAGE_FIELDS = ("reset_peak", "cuda_peak_bytes", "cuda_peak_exact", "rss_peak_bytes", "rss_peak_exact",
                 "live_peak_exact", "peak_note", "error")
@dataclass
class Sample:
    """One reading taken between stage boundaries (from the callback, or ``Tracker.sample``)."""

    snap: Snapshot
    step: int | None = None
    event: str = "manual"        # "step", "train_begin", "train_end", "evaluate", "manual"
    stage: str | None = None     # innermost open stage when taken
    stage_index: int | None = None
    has_live: bool = False       # whether the live-tensor walk ran (it is the expensive part)
    cost_s: float = 0.0          # seconds the reading took

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Sample":
        return cls(**{**data, "snap": Snapshot.from_dict(data["snap"])})


@dataclass
class StageRecord:
    """One run of a stage: snapshots at start and end, and the peaks inside it."""

    name: str
    index: int                   # 0 for the first stage of this name, 1 for the second (folds)
    order: int                   # position among all stages
    start: Snapshot
    end: Snapshot | None = None  # None while the stage is open
    depth: int = 0
    reset_peak: bool = False
    cuda_peak_bytes: int | None = None
    cuda_peak_exact: bool | None = None
    rss_peak_bytes: int | None = None
    rss_peak_exact: bool | None = None
    live_peak_bytes: dict = field(default_factory=dict)
    live_peak_exact: bool = False    # True when kit.measure.tensor_peak.TensorPeak watched the stage (tensor_peak=True)
    peak_note: str = ""
    error: str | None = None     # "OutOfMemoryError: ..." when the stage raised

    @property
    def on_cuda(self) -> bool:
        return self.start.cuda_allocated_bytes is not None

    @property
    def duration_s(self) -> float | None:
        return None if self.end is None else self.end.time - self.start.time

    @property
    def start_bytes(self) -> int | None:
        """The best reading (CUDA allocated, else CPU live tensors) at the start; None: not read."""
        return self.start.best_bytes

    @property
    def end_bytes(self) -> int | None:
        return None if self.end is None else self.end.best_bytes

    @property
    def delta_bytes(self) -> int | None:
        if self.end_bytes is None or self.start_bytes is None:
            return None
        return self.end_bytes - self.start_bytes

    @property
    def peak_bytes(self) -> int | None:
        """Peak of the best reading: CUDA max allocated, else the live-tensor peak (exact when
        TensorPeak watched, else a lower bound); None when no live-tensor reading was taken."""
        if self.on_cuda:
            return self.cuda_peak_bytes
        return self.live_peak_bytes.get("cpu")

    @property
    def peak_exact(self) -> bool:
        return bool(self.cuda_peak_exact) if self.on_cuda else self.live_peak_exact

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StageRecord":
        end = Snapshot.from_dict(data["end"]) if data.get("end") else None
        return cls(**{**data, "start": Snapshot.from_dict(data["start"]), "end": end})


def stage_peak(reset: bool, peak_at_start, peak_at_end, seen: list, counters: list = (), reset_inside: bool = False
               ) -> tuple[int | None, bool | None, str]:
    """Peak inside a stage from a global peak counter read at start (p0) and end (p1).

    ``reset``: the counter was reset at the stage's start (and the reset took). ``counters``:
    the counter's readings in between (samples); a drop among them, or ``reset_inside``, means
    someone reset it inside the stage, so what came before that reset is lost: never exact.
    """
    seen = [x for x in seen if x is not None]
    if peak_at_end is None:
        return (max(seen) if seen else None), None, "no peak counter here"
    readings = [c for c in (peak_at_start, *counters, peak_at_end) if c is not None]
    if reset_inside or any(b < a for a, b in zip(readings, readings[1:])):
        return max([peak_at_end] + seen), False, ("the counter was reset inside the stage (by a nested stage or "
                                                  "another tool); highest reading since")
    if reset:
        return max([peak_at_end] + seen), True, "reset at stage start"
    if peak_at_end > peak_at_start:
        return max([peak_at_end] + seen), True, "the process peak rose during the stage"
    if peak_at_end < peak_at_start:
        return max([peak_at_end] + seen), False, "another tool reset the peak inside the stage; peak since then"
    return (max(seen) if seen else peak_at_end), False, "stayed under an earlier peak; highest reading seen"
