"""The peak of each part of a run, read apart: step 1 (no optimizer state yet), the later steps, evaluation.

One counter runs through the whole run; at each boundary :meth:`PeakSplit.switch` reads the peak since the last
boundary, credits it to the part that just ended, and starts the counter again from what is alive now. So a part's
peak is the most that was alive at once while it ran, and an evaluation's peak never shows as the training peak.

- **CPU**: the counter is a :class:`kit.measure.tensor_peak.TensorPeak` (every op watched: exact); its
  ``peak_bytes`` is set back to ``current_bytes`` at each boundary.
- **CUDA**: ``torch.cuda.max_memory_allocated``, reset (``torch.cuda.reset_peak_memory_stats``, through
  :func:`kit.measure.device.reset_peak`) at each boundary: exact, and another tool reading that peak across the
  run sees it reset (the kit's own tracker counts the resets and says so).
- Neither (a CPU run without the exact meter): no reading is taken, and each part's peak is None, never 0.

>>> from kit.measure.tensor_peak import TensorPeak
>>> import torch
>>> with TensorPeak() as meter:
...     split = PeakSplit(meter); split.switch("first")
...     x = torch.ones(1024, dtype=torch.uint8); del x          # 1 KiB at most, in step 1
...     split.switch("evaluation")
...     y = torch.ones(4096, dtype=torch.uint8); del y          # 4 KiB at most, in the evaluation
...     split.close()
>>> split.peaks["evaluation"] - split.peaks["first"]
3072
>>> PeakSplit(None, cuda=False).get("first") is None            # not taken: None
True
"""
from __future__ import annotations

from kit import machine
from kit.measure import device


class PeakSplit:
    """Each part's peak bytes (``peaks[part]``), read with one counter reset at each boundary (see the module doc).

    ``meter``: a running TensorPeak (CPU), or None; ``cuda``: read CUDA's max allocated (default: when there is a
    GPU and no meter). ``parts_seen`` lists the parts that ran, in order, whether or not a reading was taken.
    """

    def __init__(self, meter=None, *, cuda: bool | None = None):
        self.meter = meter
        self.cuda = (meter is None and machine.has_cuda()) if cuda is None else bool(cuda)
        self.part: str | None = None
        self.peaks: dict = {}
        self.parts_seen: list = []
        self.step: int | None = None   # the optimizer step running (None: none, or evaluation)
        self.steps: dict = {}          # step -> its peak: each step read apart, to be judged at its own length

    @property
    def taken(self) -> bool:
        """Whether a counter runs (else every part's peak is not taken)."""
        return self.meter is not None or self.cuda

    def _read_and_restart(self) -> int:
        if self.meter is not None:
            peak = self.meter.peak_bytes
            self.meter.peak_bytes = self.meter.current_bytes
            return peak
        peak = device.peak_allocated_bytes() or 0
        device.reset_peak()
        return peak

    def switch(self, part: str | None, step: int | None = None) -> None:
        """End the running part (its peak is kept, the larger where it ran before) and start ``part``; ``step``:
        the optimizer step it belongs to (a new step starts a new reading even within the same part)."""
        if part == self.part and step == self.step:
            return
        if self.taken:
            peak = self._read_and_restart()
            if self.part is not None:
                self.peaks[self.part] = max(self.peaks.get(self.part, 0), peak)
            if self.step is not None:
                self.steps[self.step] = max(self.steps.get(self.step, 0), peak)
        self.part, self.step = part, step
        if part is not None and part not in self.parts_seen:
            self.parts_seen.append(part)

    def close(self) -> None:
        """End the running part."""
        self.switch(None)

    def get(self, part: str) -> int | None:
        """``part``'s peak, or None where it did not run or no reading was taken."""
        return self.peaks.get(part) if self.taken else None
