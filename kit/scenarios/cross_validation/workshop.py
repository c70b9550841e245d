"""Notebook 02 before the lesson: the model's files fetched while the teacher talks, and the workshop's minutes.

- :func:`download_ahead`: ``huggingface_hub.snapshot_download`` in a daemon thread, where it can help (real mode,
  the Hub reachable), one line said either way.
- :func:`workshop_work` / :func:`workshop_plan`: what each section of the notebook runs at real size (model
  loads, training steps), turned into minutes by :mod:`kit.scenarios.plan`: a PLAN, never a measurement.

>>> print(download_ahead("tiny-llama"))
Nothing is downloaded: tiny-llama is a tiny twin, built here from its config.
"""
from __future__ import annotations

import threading

from kit import models as kmodels
from kit import runtime
from kit.inputs import InputError
from kit.scenarios import plan
from kit.scenarios.cross_validation.predict import user_estimate
from kit.units import wrapped

DOWNLOADS: dict = {}  # model id -> the thread fetching its files (one per id and process)
# The files a from_pretrained of a safetensors checkpoint reads: no original/*.pth copies of the same weights.
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]


def download_ahead(model_id: str) -> str:
    """Start fetching ``model_id``'s files into the Hub cache in a background (daemon) thread, so that the first
    ``from_pretrained`` finds them there; say so in one line. Nothing is fetched in smoke mode (the loops train a
    tiny twin), for a tiny twin, or where the Hub is not reachable (the loops build the architecture twin). A
    refusal (a gated model without a token) is kept in ``DOWNLOADS[model_id].error``; the loaders say it again.

    >>> download_ahead("tiny-llama")
    'Nothing is downloaded: tiny-llama is a tiny twin, built here from its config.'
    """
    if not isinstance(model_id, str) or not model_id.strip():
        raise InputError("model_id", f"download_ahead takes a model name (a Hub id such as "
                                     f"'meta-llama/Meta-Llama-3-8B', or a shipped name), not {model_id!r}.")
    base, _ = kmodels.split_name(model_id.strip())
    if base in kmodels.TINY:
        return f"Nothing is downloaded: {base} is a tiny twin, built here from its config."
    if runtime.is_smoke():
        return f"Nothing is downloaded: SMOKE mode trains {kmodels.smoke_twin(base)}, built here from its config."
    if not runtime.hub_reachable():
        return f"Nothing is downloaded: the Hub is not reachable, so the loops build {base}'s architecture twin."
    if base in DOWNLOADS and (DOWNLOADS[base].is_alive() or DOWNLOADS[base].error is None):
        return f"{base}'s files: already {'downloading' if DOWNLOADS[base].is_alive() else 'downloaded'}."
    thread = threading.Thread(target=_fetch, args=(base,), name=f"download {base}", daemon=True)
    thread.error = None
    DOWNLOADS[base] = thread
    thread.start()
    return (f"Downloading {base}'s files in the background (huggingface_hub.snapshot_download, a daemon thread): "
            "go on; the first load waits only for what is left.")


def _fetch(model_id: str) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model_id, allow_patterns=DOWNLOAD_PATTERNS)
    except Exception as exc:  # noqa: BLE001 (a thread has nobody to raise to: keep it for whoever asks)
        DOWNLOADS[model_id].error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


# The notebook's default model, at real size, and its workshop preset: what the plan counts in every mode.
DEFAULT_MODEL = "unsloth/Llama-3.2-1B"
WORKSHOP_RUN = dict(folds=3, steps=5, batch_size=4, seq_len=30, lora_r=8, lora_targets=("q_proj", "v_proj"))
# The teaching minutes per section (a plan, the instructor's), and whether a short slot skips it. The instructor
# notes' table lists the same minutes.
TEACHING = {"setup, download": (2, False), "1 · Predict": (7, False), "2 · The user's loop": (8, False),
            "3 · The advice's reset": (4, False), "Exercise": (6, False), "PyTorch's own tools": (3, True),
            "4 · The fixed loop": (5, False), "4 · the resume demo": (1, True), "5 · k-bit recipes": (3, True),
            "6 · The panel": (4, False), "7 · Checklist, recap": (3, False)}
SLOT_MINUTES = 45   # notebook 02's share of the 90-minute workshop: setup, teaching and compute
SETUP = "start, install"   # the plan's first row: kit.scenarios.plan.setup_work (the model's download is the next)


def workshop_work(model_id: str = DEFAULT_MODEL, **run) -> dict:
    """What each section of notebook 02 runs at real size: ``{section: [("load", bytes) | ("steps", est, n)]}``
    (:func:`kit.scenarios.plan.compute_minutes`'s items). A load reads the model's bf16 checkpoint (2 bytes a
    parameter; the first one downloads it); a step is one fold's estimated step (:func:`user_estimate`); a fold's
    evaluation is counted as one step more (an over-count: a forward pass costs less).

    >>> work = workshop_work()
    >>> sum(1 for item in work["2 · The user's loop"] if item[0] == "load")   # a fresh model every fold
    3
    """
    r = {**WORKSHOP_RUN, **run}
    folds, steps = r["folds"], r["steps"]
    est = user_estimate(model_id, batch_size=r["batch_size"], seq_len=r["seq_len"], lora_r=r["lora_r"],
                        lora_targets=r["lora_targets"])
    load = ("load", 2 * (est.params - est.trainable_params))
    return {"setup, download": [load], "1 · Predict": [],
            "2 · The user's loop": [load] * folds + [("steps", est, folds * steps)],
            "3 · The advice's reset": [load, ("steps", est, steps)],
            # one load: the reset's fold, the trainer to free
            "Exercise": [load, ("steps", est, 1), ("steps", est, 1)],
            "PyTorch's own tools": [("steps", est, steps + 1)],               # on the exercise's model: no load
            "4 · The fixed loop": [load, ("steps", est, folds * (steps + 1))],
            "4 · the resume demo": [load, ("steps", est, steps + 1)],
            "5 · k-bit recipes": [load, load, ("steps", est, 2 * steps)],
            "6 · The panel": [],                                  # the exercise reads estimates; its Run is homework
            "7 · Checklist, recap": []}


def planned_sections(model_id: str = DEFAULT_MODEL, **run) -> tuple:
    """``(core, skipped)``: the plan's rows ``[(row, teaching minutes, items)]``, the setup
    (:func:`kit.scenarios.plan.setup_work`: the runtime's start, the install cell, the small files) first among
    the core ones, and the sections a short slot skips apart."""
    work = workshop_work(model_id, **run)
    setup = [i for items in plan.setup_work({}).values() for i in items]
    core = [(SETUP, 0, setup), *[(name, t, work[name]) for name, (t, skip) in TEACHING.items() if not skip]]
    return core, [(name, t, work[name]) for name, (t, skip) in TEACHING.items() if skip]


def workshop_minutes(model_id: str = DEFAULT_MODEL, **run) -> float:
    """Notebook 02's planned minutes, the skipped sections left out: :func:`workshop_plan`'s "the plan"."""
    core, _ = planned_sections(model_id, **run)
    return sum(t + plan.compute_minutes(w) for _, t, w in core)


@wrapped
def workshop_plan(model_id: str = DEFAULT_MODEL, slot_minutes: int = SLOT_MINUTES, **run) -> str:
    """Notebook 02's minutes, as a PLAN (never measured): the setup (the runtime's start, the install cell, the
    small files), then teaching per section (:data:`TEACHING`) plus compute counted from what each section runs at
    real size on a T4 (:func:`workshop_work`, :mod:`kit.scenarios.plan`), the sections a short slot skips apart,
    against ``slot_minutes``.

    >>> "PLAN" in workshop_plan()
    True
    """
    r = {**WORKSHOP_RUN, **run}
    core, extra = planned_sections(model_id, **run)
    total = sum(t + plan.compute_minutes(w) for _, t, w in core)
    more = sum(t + plan.compute_minutes(w) for _, t, w in extra)
    loads = sum(1 for _, _, w in core for item in w if item[0] == "load")
    setup = plan.setup_work({})
    return "\n".join([
        f"A PLAN for notebook 02 at real size ({model_id}, {r['folds']} folds of {r['steps']} steps) on a T4: "
        f"compute from {plan.LOAD_BYTES_PER_S / 1e6:.0f} MB/s loads and downloads and {plan.UTILISATION:.0%} of the "
        f"T4's {plan.T4_PEAK_FLOPS / 1e12:.0f} TFLOPS (kit.scenarios.plan's assumptions), not measured",
        plan.plan_table(core),
        f"{SETUP}: " + "; ".join(setup) + f"; the model's download is its first load, in setup, download: its "
        f"checkpoint at 2 B a parameter (bf16, the shipped config's dtype), {core[1][2][0][1] / 1e6:,.0f} MB "
        f"({loads} model loads above)",
        "skip when short:",
        plan.plan_table(extra),
        f"the plan: {total:.1f} min of the {slot_minutes}-minute slot "
        + (f"(fits, {slot_minutes - total:.1f} min to spare)" if total <= slot_minutes else
           f"(DOES NOT FIT: {total - slot_minutes:.1f} min over; skip more)")
        + f"; with the skipped sections {total + more:.1f} min"])
