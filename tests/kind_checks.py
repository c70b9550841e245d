"""What the tests of TRL's trainer kinds share: a kind's config for the CPU, the check that every field of that config
is in exactly one of its module's tables, a generating trainer's row run on the profiler meter, and the window of
0.98 to 1.02 every ratio of an estimate to the meter's reading must fall in. Importing it puts benchmarks/ on the path
(the real clients)."""
import dataclasses
import os
import sys

import pytest
import torch
from transformers import TrainingArguments

from kit import inputs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))


def cpu_config(config_class, output_dir: str | None = None, **kw):
    """``config_class`` (a TRL config) on the CPU, in fp32 unless ``kw`` says ``bf16=True``, reporting nowhere; its
    output_dir (never written by a config alone) names the kind."""
    kind = config_class.__name__.removesuffix("Config").lower()
    return config_class(output_dir=output_dir or f"/tmp/kit-{kind}-test", use_cpu=True, report_to="none",
                        **{"bf16": False, **kw})


def assert_fields_in_one_table(config_class, module) -> None:
    """Every field ``config_class`` adds to TrainingArguments is in one of the kind's ``module``'s tables (MODELED,
    NO_MEMORY, REFUSED), in no more than one, and no table names a field the config lacks."""
    name = config_class.__name__
    tables = {"modeled": module.MODELED, "no memory": module.NO_MEMORY, "refused": module.REFUSED}
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    fields = {f.name for f in dataclasses.fields(config_class)}
    missing = [f for f in fields - base if not any(f in t for t in tables.values())]
    assert not missing, f"{name} fields neither modeled, listed nor refused: {missing}"
    stale = [f for t in tables.values() for f in t if f not in fields]
    assert not stale, f"tables name fields {name} no longer has: {stale}"
    twice = [f for f in fields if sum(f in t for t in tables.values()) > 1]
    assert not twice, f"fields in more than one table: {twice}"


def assert_refused_in_one_sentence(read_config, cfg, field: str, value) -> None:
    """``field`` set to ``value`` on ``cfg`` (on the built config: the config's own checks may refuse some
    combinations first, and the kit must refuse each by itself): ``read_config`` refuses it in one sentence that names
    it."""
    setattr(cfg, field, value)
    with pytest.raises(inputs.InputError) as raised:
        read_config(cfg)
    msg = str(raised.value)
    assert f"{type(cfg).__name__}.{field} " in msg and msg.count(". ") == 0 and msg.endswith("estimate without it.")
    assert raised.value.name == field


def run_generation_row(client):
    """(estimate, peaks, setup) of a generating trainer's row (``client``: its generator in benchmarks/) on the
    profiler meter, from seed 0 (the sampled completions' lengths follow it)."""
    import real_clients
    from clients_grpo import run_grpo_client

    torch.manual_seed(0)
    _, setup, est, peaks = run_grpo_client(client, real_clients.ProfilerMeter)
    return est, peaks, setup


def step_ratios(est, peaks, *, generation: bool = False, evaluate: bool = False) -> dict:
    """estimate/measured at step 1 and the steady step (the largest later one) and, where asked, for the generation
    phase and ``evaluate()``."""
    out = {"step 1": est.first_step_peak_bytes / peaks[0], "steady": est.peak_bytes / max(peaks[1:])}
    if generation:
        out["generation"] = est.setup["generation_peak_bytes"] / peaks.generation
    if evaluate:
        out["evaluate"] = est.eval_peak_bytes / peaks.evaluate
    return out


def assert_within_2_percent(label: str, ratios: dict, *context) -> None:
    """Print ``ratios`` after ``label`` and assert each in [0.98, 1.02] (``context``: what a failure shows)."""
    print(f"{label}: estimate/measured " + ", ".join(f"{name} {r:.4f}" for name, r in ratios.items()))
    assert all(0.98 <= r <= 1.02 for r in ratios.values()), (ratios, *context)
