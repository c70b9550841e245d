"""``kit.check(trainer)``: the estimate of a built Trainer (or of any Estimate), its verdict for a device, where
each setting was read from and, when it does not fit, the fit advisor's top changes. Prediction only.

>>> from kit.estimate import estimate_from
>>> est = check(estimate_from("tiny-gpt2", seq_len=64), device="colab-t4")  # doctest: +ELLIPSIS
tiny-gpt2: batch 8 x seq 64, fp32, ...
"""
from __future__ import annotations

from kit.advise.core import advise
from kit.estimate import Estimate, estimate_trainer
from kit.presets import resolve_device, verdict
from kit.units import wrap


def check(trainer_or_estimate, device=None, *, seq_len=None):
    """Print the estimate table, the verdict and where each setting was read from; return the Estimate.

    ``device``: None judges against this GPU (what torch can have of it now: total memory less
    what other processes and the CUDA context use), or, with no GPU here, the ``"colab-t4"``
    preset, and says so. A preset name (``"l4"``, ``"a100-80"``...), ``"this"`` or a number of
    bytes judges against that (:func:`kit.presets.resolve_device`).
    """
    preset, why = resolve_device(device)
    est = trainer_or_estimate if isinstance(trainer_or_estimate, Estimate) else \
        estimate_trainer(trainer_or_estimate, seq_len=seq_len, device="cuda" if preset.gpu_bytes else "cpu")
    lines = [est.table(preset)] + ([why] if why else [])
    sources = getattr(est, "sources", None)
    if sources:
        lines.append("where each setting was read from:")
        lines += [f"  {k:<24}{show_value(v):<22}{w}" for k, (v, w) in sources.items()]
    if not verdict(est, preset).fits:  # the fit advisor's top 3 changes
        try:
            lines.append(advise(trainer_or_estimate, preset, trainer_estimate=est).text(top=3))
        except ValueError as exc:
            lines.append(f"(no advice: {exc})")
    print(wrap("\n".join(lines)), flush=True)  # a notebook page is WIDTH wide: the long source lines fold
    return est


def show_value(v) -> str:
    """A setting's value as :func:`check` prints it: a list joined by commas, or its count when long.

    >>> show_value(("q_proj", "v_proj")), show_value(16)
    ('q_proj,v_proj', '16')
    """
    if isinstance(v, (tuple, list)):
        return ",".join(map(str, v)) if len(",".join(map(str, v))) <= 40 else f"{len(v)} modules"
    return str(v)
