"""Notebook 01's workshop plan: the notebook's setup (the runtime's start, the install cell, DistilGPT2's download),
then the instructor notes' sections with their teaching minutes and the compute each one runs at real size on a
T4, counted by :mod:`kit.scenarios.plan` (a PLAN, never a measurement).

>>> sum(minutes for _, minutes, _ in WORKSHOP_SECTIONS) <= WORKSHOP_MINUTES
True
"""
from __future__ import annotations

from kit import dtypes
from kit.estimate import estimate
from kit.presets import verdict
from kit.scenarios import plan
from kit.scenarios.custom_head import scenario
from kit.scenarios.custom_head.exercises import largest_rank
from kit.units import fmt_bytes, wrapped

# The instructor notes' table: (section, teaching minutes, what to skip when short). The compute minutes are
# workshop_plan's, counted from the code the notebook runs at real size on a T4.
WORKSHOP_SECTIONS = [
    ("setup, the user's code", 3, ""),
    ("words, 1 · Predict", 6, "the figure"),
    ("2 · The advice", 4, ""),
    ("3 · Fixes, the rank task", 8, "fix (c)'s run, the advisor, the rank solution's run"),
    ("PyTorch's own tools", 3, "the history cell (homework)"),
    ("4 · The original", 3, "the real-size cell"),
    ("5 · The panel", 3, "its Run (homework)"),
    ("6 · Your own culprit", 2, ""),
    ("recap, free memory", 1, ""),
]
WORKSHOP_MINUTES = 40     # notebook 01's share of the 90-minute workshop: setup, teaching and compute
SETUP = "start, install, download"   # the plan's first row: kit.scenarios.plan.setup_work


def setup_work() -> dict:
    """The notebook's setup, as :func:`kit.scenarios.plan.setup_work` counts it, with DistilGPT2's checkpoint: its
    shipped config's parameters at 4 bytes (the config names no dtype, so the checkpoint is fp32); buffers a
    checkpoint may also hold are not counted. Later loads of it read the local cache, and are counted again at the
    same rate (an over-count).

    >>> list(setup_work())[2]
    "DistilGPT2's weights (the shipped config's 81,912,576 parameters x 4 B): 327.7 MB"
    """
    est = estimate("distilgpt2", batch_size=1, seq_len=1, load_dtype="fp32")
    label = f"DistilGPT2's weights (the shipped config's {est.params:,} parameters x 4 B)"
    return plan.setup_work({label: est.weights_bytes})


def planned_sections(steps: int = 2, grad_accum: int = 2, preset: str = "colab-t4") -> tuple:
    """``(work, sections)``: :func:`plan_work` with the setup first (``{row: [(label, [items])]}``), and the plan's
    rows ``[(row, teaching minutes, [items])]``."""
    work = {SETUP: list(setup_work().items()), **plan_work(steps, grad_accum, preset)}
    sections = [(name, minutes, [i for _, items in work[name] for i in items])
                for name, minutes, _ in [(SETUP, 0, ""), *WORKSHOP_SECTIONS]]
    return work, sections


def workshop_minutes(steps: int = 2, grad_accum: int = 2, preset: str = "colab-t4") -> float:
    """Notebook 01's planned minutes in all: setup, teaching and compute (:func:`workshop_plan`'s "all" row)."""
    _, sections = planned_sections(steps, grad_accum, preset)
    return sum(m + plan.compute_minutes(w) for _, m, w in sections)


def plan_work(steps: int = 2, grad_accum: int = 2, preset: str = "colab-t4") -> dict:
    """What each section runs at real size on ``preset``, as :mod:`kit.scenarios.plan` items with a label:
    ``{section: [(label, [items])]}``, one label per run. Loads are the weights' bytes (ESTIMATED: DistilGPT2
    from the Hub, and a V x V head built in RAM counted as a load of its bytes); steps are each measured run's, in
    the workshop's ``grad_accum`` micro-batches. A run that the estimate says runs out of memory on ``preset``
    (fix (c), the original) is counted for one step at most: the error comes in its first. Estimates only:
    nothing is loaded.

    >>> sorted(k for k, v in plan_work().items() if v)
    ['3 · Fixes, the rank task', '4 · The original', "PyTorch's own tools"]
    """
    dtype = dtypes.for_preset(preset)[0]

    def run(label, est):
        n = steps if verdict(est, preset).fits else 1
        return [(f"{label}: load {fmt_bytes(est.weights_bytes)}, {n} step(s)" + ("" if n == steps else
                 " (out of memory in it)"), [("load", est.weights_bytes), ("steps", est, n)])]

    fix = {w: scenario.estimate_fix(w, "real", dtype=dtype, grad_accum=grad_accum) for w in scenario.FIXES}
    best = largest_rank(preset)
    rank = scenario.estimate_fix("b", "real", rank=best, grad_accum=grad_accum)
    user = scenario.estimate_user(scenario.NAMES["real"], grad_accum=grad_accum)
    work = {name: [] for name, _, _ in WORKSHOP_SECTIONS}
    work["3 · Fixes, the rank task"] = run("fix (a)", fix["a"]) + run("fix (b)", fix["b"]) + \
        run(f"the rank solution (rank {best})", rank) + run(f"fix (c), {dtype} weights", fix["c"])
    work["PyTorch's own tools"] = run("fix (a), counters", fix["a"]) + run("fix (a), history", fix["a"])
    work["4 · The original"] = run("the user's Trainer", user)
    return work


@wrapped
def workshop_plan(steps: int = 2, grad_accum: int = 2, preset: str = "colab-t4") -> str:
    """The workshop's PLAN for notebook 01: the setup first (:func:`setup_work`), then each section's teaching
    minutes (:data:`WORKSHOP_SECTIONS`) and its compute minutes, counted by :mod:`kit.scenarios.plan` from what the
    notebook runs at real size on a T4 (:func:`plan_work`), whatever this run's mode. Nothing is loaded or measured.

    >>> print(workshop_plan().splitlines()[0])
    A PLAN, not a measurement: compute counted at real size on a T4 (kit.scenarios.plan), 2 step(s) of 2
    """
    work, sections = planned_sections(steps, grad_accum, preset)
    total = sum(m + plan.compute_minutes(w) for _, m, w in sections)
    lines = [f"A PLAN, not a measurement: compute counted at real size on a T4 (kit.scenarios.plan), {steps} step(s) "
             f"of {grad_accum} micro-batches per run, loads and downloads at {plan.LOAD_BYTES_PER_S / 1e6:.0f} MB/s, "
             f"steps at {plan.UTILISATION:.0%} of the T4's {plan.T4_PEAK_FLOPS / 1e12:.0f} TFLOPS (assumptions):",
             plan.plan_table(sections),
             f"{'within' if total <= WORKSHOP_MINUTES else 'OVER'} the {WORKSHOP_MINUTES} minutes planned for notebook "
             "01; what the setup and each section run at real size:"]
    for name, runs in work.items():
        for label, items in runs:
            lines.append(f"  {name}: {label}: {plan.compute_minutes(items):.1f} min")
    return "\n".join(lines)
