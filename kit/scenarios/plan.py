"""A workshop's time, as a PLAN: counted from what the notebook's code runs at real size on a T4, never measured.
Each section adds up model loads and downloads (bytes over a planning bandwidth), training steps (FLOPs over a
planning throughput) and fixed waits (the runtime's start, pip's own work). Before the first section, the
notebook's setup: the runtime starts, the install cell adds what Colab's image lacks (the wheels' sizes as PyPI
serves them) and the data is fetched. The planning figures are assumptions, named and sourced here; change them
for another room.

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
# A planning assumption: Colab downloads from the Hub and PyPI, and loads, at about this many bytes a second.
LOAD_BYTES_PER_S = 100e6
# A planning assumption, not a measurement: from "Connect" (or a change of runtime type) to a ready Colab T4
# runtime. Each notebook starts one: the recap of each asks for "Disconnect and delete runtime".
RUNTIME_START_S = 90
# A planning assumption: pip's own work in the install cell (resolving, unpacking, building the kit from git),
# beside the bytes it downloads.
INSTALL_OVERHEAD_S = 60
# What the install cell downloads into Colab's image, which lacks bitsandbytes and trl and holds datasets 4.0
# where trl 1.16 needs >= 4.7 (Colab's published package list, August 2026): each wheel with its size in bytes as
# PyPI serves it (pip download --no-deps, Python 3.12, manylinux x86_64, December 2026). A dependency of these that
# Colab's image would lack too is not counted.
INSTALL_WHEELS = {"bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl": 43_139_553,
                  "trl-1.16.0-py3-none-any.whl": 948_205,
                  "datasets-4.7.0-py3-none-any.whl": 527_530}
# A planning assumption, an upper bound: the tokenizer's files and wikitext-2-raw-v1's parquet files, whose sizes
# no file in this repository records.
SMALL_FILES_BYTES = 20e6


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
    """Planned minutes of a section's work: ``("load", bytes)``, ``("download", bytes)``, ``("wait", seconds)``
    and ``("steps", estimate, n)`` items."""
    seconds = 0.0
    for item in work:
        if item[0] in ("load", "download"):
            seconds += item[1] / LOAD_BYTES_PER_S
        elif item[0] == "wait":
            seconds += item[1]
        elif item[0] == "steps":
            seconds += item[2] * step_seconds(item[1])
        else:
            raise ValueError("a plan item is ('load', bytes), ('download', bytes), ('wait', seconds) or "
                             f"('steps', estimate, n), not {item!r}")
    return seconds / 60


def setup_work(downloads: dict) -> dict:
    """A notebook's setup before its first section, as labelled items: ``{label: [items]}``. The runtime's start
    (:data:`RUNTIME_START_S`), the install cell (:data:`INSTALL_WHEELS` plus :data:`INSTALL_OVERHEAD_S`), each of
    ``downloads`` (``{label: bytes}``) and the small files (:data:`SMALL_FILES_BYTES`).

    >>> work = setup_work({})
    >>> round(compute_minutes([i for items in work.values() for i in items]), 2)
    2.51
    """
    wheels = sum(INSTALL_WHEELS.values())
    work = {f"the runtime's start: {RUNTIME_START_S} s (assumed)": [("wait", RUNTIME_START_S)],
            f"the install cell: {len(INSTALL_WHEELS)} wheels, {wheels / 1e6:.1f} MB (PyPI's sizes), and "
            f"{INSTALL_OVERHEAD_S} s of pip (assumed)": [("download", wheels), ("wait", INSTALL_OVERHEAD_S)]}
    work.update({f"{label}: {size / 1e6:.1f} MB": [("download", size)] for label, size in downloads.items()})
    work[f"tokenizer and wikitext-2 files: at most {SMALL_FILES_BYTES / 1e6:.0f} MB (assumed)"] = \
        [("download", SMALL_FILES_BYTES)]
    return work


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
