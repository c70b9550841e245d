"""Which 16-bit dtype a run takes: bf16 where the GPU computes it natively, fp16 where it does not.

A T4 (compute capability 7.5) has no native bf16. ``torch.cuda.is_bf16_supported()`` counts
emulation, so transformers accepts ``bf16=True`` there, and the work runs emulated and slowly;
the popular Colab notebooks use fp16 on a T4. So wherever the kit chooses a 16-bit dtype for a run
(the 4-bit compute dtype and the 16-bit load dtype of a quantized model, scenario 1's fix (c)), it
takes :func:`run_dtype`: bf16 from compute capability 8.0 (Ampere) up, fp16 below. On a CPU it
takes bf16 (bitsandbytes' CPU path computes in it; Trainer ignores ``fp16=True`` there). Both are 2
bytes, but the choice can still change a memory estimate: to torch they are different dtypes (a bf16
weight under fp16 autocast is cast to an fp16 copy at each use, and bf16 with fp16 promotes to fp32),
and the estimator tells them apart (:class:`kit.estimate.replay.Dt`).

>>> run_dtype((7, 5))
('fp16', 'compute capability 7.5 has no native bf16, so fp16 (as Colab notebooks do on a T4)')
>>> run_dtype((9, 0))[0], run_dtype(None)[0]
('bf16', 'bf16')
"""
from __future__ import annotations

from kit import machine
from kit.inputs import Note
from kit.presets import PRESETS


def run_dtype(capability: tuple[int, int] | None) -> tuple[str, str]:
    """``(dtype, why)`` for a GPU of this compute capability (None: a CPU)."""
    if capability is None:
        return "bf16", "a CPU, where bitsandbytes' kernels compute in bf16"
    major, minor = capability
    if major >= 8:
        return "bf16", f"compute capability {major}.{minor} has native bf16"
    return "fp16", f"compute capability {major}.{minor} has no native bf16, so fp16 (as Colab notebooks do on a T4)"


CPU_IGNORES_FP16 = "cpu-ignores-fp16"   # the note's code


def trainer_precision(precision: str, device: str) -> tuple:
    """``(precision, note or None)``: the mixed precision Trainer really runs on ``device`` ("cuda" or "cpu"). It
    silently ignores ``fp16=True`` on a CPU (no CUDA GradScaler), so that run is fp32, and is estimated as such,
    said in the note. The one place for this rule: every face that models a Trainer on a CPU (the CLI, kit.check,
    the user's objects, the advisor, the panel) asks it. (``estimate(precision="fp16", device="cpu")`` itself
    models fp16 autocast, as a loop of one's own runs it.)

    >>> trainer_precision("fp16", "cpu")[0], trainer_precision("fp16", "cuda"), trainer_precision("bf16", "cpu")
    ('fp32', ('fp16', None), ('bf16', None))
    """
    if precision == "fp16" and device == "cpu":
        return "fp32", Note("fp16=True: Trainer ignores it on a CPU, so this is the estimate of the fp32 run that "
                            "happens", field="precision", code=CPU_IGNORES_FP16)
    return precision, None


def run_precision(precision: str) -> str:
    """:func:`trainer_precision` on this machine.

    >>> run_precision("bf16")
    'bf16'
    """
    return trainer_precision(precision, machine.device_name())[0]


def for_this_device() -> tuple[str, str]:
    """:func:`run_dtype` for the GPU this process sees (or the CPU).

    >>> for_this_device()[0] in ("bf16", "fp16")
    True
    """

    return run_dtype(machine.compute_capability())


def for_preset(preset) -> tuple[str, str]:
    """:func:`run_dtype` for a named machine (:data:`kit.presets.PRESETS`): what an estimate for it assumes.

    >>> for_preset("colab-t4")[0], for_preset("a100-80")[0]
    ('fp16', 'bf16')
    """

    p = PRESETS[preset] if isinstance(preset, str) else preset
    return run_dtype(p.capability)
