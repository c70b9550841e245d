"""A workshop's compute time, as a PLAN: counted from what the notebook's code runs at real size on a T4, never
measured. Each section adds up model loads (bytes over a planning bandwidth) and training steps (FLOPs over a
planning throughput). The three planning figures are assumptions, named and sourced here; change them for
another room.

>>> from kit.estimate import estimate
>>> est = estimate("distilgpt2", batch_size=2, seq_len=128)
>>> round(step_seconds(est), 3) > 0
True
>>> print(plan_table([("1 · Predict", 6, []), ("3 · Fixes", 8, [("load", 353_000_000), ("steps", est, 4)])]))
section                 teaching  compute (plan)  total
1 · Predict                  6 min         0.0 min    6.0 min
3 · Fixes                    8 min         0.1 min    8.1 min
all                         14 min         0.1 min   14.1 min
"""
from __future__ import annotations

# NVIDIA T4 datasheet (https://www.nvidia.com/en-us/data-center/tesla-t4/): 65 TFLOPS of mixed-precision
# (FP16/FP32) Tensor Core throughput at its peak.
T4_PEAK_FLOPS = 65e12
# A planning assumption, not a measurement: the share of that peak a small-batch fine-tune reaches in a notebook
# (short rows, a frozen base, bitsandbytes' kernels). Lower it if a dry run is slower.
UTILISATION = 0.25
# A planning assumption: Colab downloads from the Hub and loads at about this many bytes a second.
LOAD_BYTES_PER_S = 100e6


def step_flops(est) -> float:
    """FLOPs of one optimizer step of ``est``'s setup: per token, 2 x params for the forward, 2 x params more for
    the grads of the activations, 2 x trainable params for the weights' grads, and one forward more under
    gradient checkpointing (the rule of thumb of Kaplan et al. 2020, 6 x params per token for full training)."""
    s = est.setup
    tokens = s["batch_size"] * s["seq_len"] * s.get("grad_accum", 1)
    forwards = 2 if s.get("gradient_checkpointing") else 1
    return tokens * (2 * est.params * forwards + 2 * est.params + 2 * est.trainable_params)


def step_seconds(est) -> float:
    """Planned seconds of one optimizer step on a T4 (:data:`T4_PEAK_FLOPS` x :data:`UTILISATION`)."""
    return step_flops(est) / (T4_PEAK_FLOPS * UTILISATION)


def compute_minutes(work: list) -> float:
    """Planned minutes of a section's work: ``("load", bytes)`` and ``("steps", estimate, n)`` items."""
    seconds = 0.0
    for item in work:
        if item[0] == "load":
            seconds += item[1] / LOAD_BYTES_PER_S
        elif item[0] == "steps":
            seconds += item[2] * step_seconds(item[1])
        else:
            raise ValueError(f"a plan item is ('load', bytes) or ('steps', estimate, n), not {item!r}")
    return seconds / 60


def plan_table(sections: list) -> str:
    """``[(section, teaching minutes, work)]`` as a table: teaching, planned compute and their sum per section."""
    lines = [f"{'section':<24}{'teaching':>8}  {'compute (plan)':>14}  total"]
    total_t = total_c = 0.0
    for name, teach, work in sections:
        c = compute_minutes(work)
        total_t, total_c = total_t + teach, total_c + c
        lines.append(f"{name:<24}{teach:>6} min  {c:>10.1f} min  {teach + c:>5.1f} min")
    lines.append(f"{'all':<24}{total_t:>6.0f} min  {total_c:>10.1f} min  {total_t + total_c:>5.1f} min")
    return "\n".join(lines)
