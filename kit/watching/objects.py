"""What a plain PyTorch loop's own objects say, for its estimate: the optimizer's name (:func:`optimizer_name`),
a batch's shape (:func:`batch_shape`) and whether it pads (:func:`has_padding`); and one watched step
(:class:`StepPeak`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kit import optimizers
from kit.units import fmt_bytes


@dataclass
class StepPeak:
    """One watched step: its number (1 = the first), whether the optimizer had no state yet, its peak bytes
    (None: not taken), the time it ended (``time.time()``, as the tracker's readings), its batch's shape and the
    estimate at that shape: where batches vary in length, each step is judged at its own."""

    step: int
    first: bool
    peak_bytes: int | None
    end: float
    shape: tuple | None = None           # (rows, tokens) of its batch, as its first forward read it
    estimate_bytes: int | None = None    # the estimate at that shape (step 1's figure for a first step)


def optimizer_name(optimizer) -> str:
    """The kit's name for a torch (or bitsandbytes, or transformers) optimizer object; an optimizer the kit does not
    model is refused by its class name (:func:`kit.optimizers.name_of`).

    >>> optimizer_name(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True))
    'adamw-fused'
    """
    return optimizers.name_of(optimizer)


def batch_shape(batch) -> tuple[int, int] | None:
    """(rows, tokens) of a batch: a dict with ``input_ids``, or a tensor of token ids; None if it has neither.

    >>> batch_shape({"input_ids": torch.zeros(4, 40, dtype=torch.long)})
    (4, 40)
    """
    ids = batch.get("input_ids") if isinstance(batch, dict) else batch
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return int(ids.shape[0]), int(ids.shape[1])
    return None


def has_padding(batch) -> bool | None:
    """Whether a batch dict's ``attention_mask`` has a 0 (None: it has no mask).

    >>> has_padding({"attention_mask": torch.tensor([[1, 1, 0]])})
    True
    """
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    return bool((mask == 0).any()) if isinstance(mask, torch.Tensor) else None


def own_lengths(steps) -> list:
    """Where batches varied in shape, a note judging each step at its own: the step whose measured peak is
    furthest from the estimate at its shape, and the ratio.

    >>> note = own_lengths([StepPeak(1, True, 110, 0.0, (4, 64), 100), StepPeak(2, False, 90, 0.0, (4, 48), 100)])
    >>> note[0].split(": each step")[0], note[0].split("ratio ")[1]
    ('batches varied in shape (4 x 48 to 4 x 64)', '1.100')
    """
    judged = [s for s in steps if s.peak_bytes and s.estimate_bytes and s.shape]
    if len({s.shape for s in judged}) < 2:
        return []
    worst = max(judged, key=lambda s: abs(s.peak_bytes / s.estimate_bytes - 1))
    low, high = min(s.shape for s in judged), max(s.shape for s in judged)
    return [f"batches varied in shape ({low[0]} x {low[1]} to {high[0]} x {high[1]}): each step judged at its own, "
            f"the furthest is step {worst.step} ({worst.shape[0]} x {worst.shape[1]}): measured "
            f"{fmt_bytes(worst.peak_bytes)}, estimated {fmt_bytes(worst.estimate_bytes)} at its shape, ratio "
            f"{worst.peak_bytes / worst.estimate_bytes:.3f}"]
