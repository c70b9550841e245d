"""Scenario 2's Run on the panel: the fold loop its controls describe, run here fold by fold, each fold's load,
training and release drawn beside its own estimate as it ends (:class:`kit.widgets.stages.StageChart`).

The loop: the model loaded each fold (the user's ``from_pretrained`` at every fold start) or once (its adapter reset
to the saved init at each fold, as the fixed loop does); the old Trainer kept until ``trainer = ...`` replaces it
(the user's ``free_gpu_cache()`` frees nothing) or released first (:func:`kit.measure.cleanup.release`); the k-bit
recipe 2024's (peft's fp32 upcast, at the load) or the lean one. The estimates are
:func:`~kit.scenarios.cross_validation.predict.fold_timeline`'s, of the run as it goes here.

In smoke mode the tiny twin runs one row of 8 tokens (as notebook 02's crash does: the twin is then mostly weights,
as the 8B is) under :func:`~kit.scenarios.cross_validation.cap.scaled_cap`, which is to the twin what the chosen
GPU is to the real model: the user's loop runs out at fold 2's load, the fixed loop does not.

>>> plan = fold_plan(run_estimate("tiny-llama", "standard", batch_size=1, seq_len=8), 2, "each", "kept")
>>> [stage.name for stage in plan]
['fold 1: load', 'fold 1: training', 'fold 1: release', 'fold 2: load', 'fold 2: training', 'fold 2: release', \
'cleanup']
"""
from __future__ import annotations

import shutil
import tempfile

from kit import machine, runtime
from kit.measure import cleanup, leaks, oom
from kit.measure import device as kdevice
from kit.measure.controls import memory_cap
from kit.scenarios.cross_validation.cap import run_estimate, scaled_cap
from kit.scenarios.cross_validation.folds import fold_texts
from kit.scenarios.cross_validation.lora_reset import restore_adapter, save_adapter_init
from kit.scenarios.cross_validation.notebook import crash_settings
from kit.scenarios.cross_validation.predict import fold1_leftovers, fold_timeline
from kit.scenarios.cross_validation.training import fold_trainer, load_for_training, loop_params
from kit.scenarios.cross_validation.user_loop import free_gpu_cache
from kit.widgets import views
from kit.widgets.runs import files_ready
from kit.widgets.stages import STAGE, PlannedStage, StageChart, finish

RECIPES = {"2024": "standard", "lean": "lean"}   # the panel's recipe -> kit.scenarios.cross_validation's


def fold_plan(est, folds: int, load: str, trainer: str) -> list[PlannedStage]:
    """Each fold's load (the fold that loads a model), training and release, then the cleanup, each with its
    ESTIMATED figure: the load's and the training's peaks (:func:`fold_timeline`), and what a release leaves alive
    (fold 1's model and optimizer state while the old Trainer is kept, the model loaded once, or nothing)."""
    kept, once = trainer == "kept" and load == "each", load == "once"
    left = fold1_leftovers(est) if kept else est.weights_bytes if once else 0
    plan = []
    for row in fold_timeline(est, folds, load_each_fold=not once, release=not kept):
        name = f"fold {row['fold']}"
        if row["load_peak_bytes"] is not None:
            plan.append(PlannedStage(f"{name}: load", row["load_peak_bytes"]))
        plan += [PlannedStage(f"{name}: training", row["train_peak_bytes"]), PlannedStage(f"{name}: release", left,
                                                                                          "end")]
    return plan + [PlannedStage("cleanup", 0, "end")]


def _folds(model_name: str, settings: dict, recipe: str | None, loop: dict, tracker, output_dir: str) -> None:
    tok, splits = fold_texts(model_name, loop["folds"], settings["max_samples"])
    model = trainer = init = None
    try:
        for fold, (train_ds, eval_ds) in enumerate(splits, 1):
            if model is None or loop["load"] == "each":
                with tracker.stage(f"fold {fold}: load", **{**STAGE, "live_tensors": True}):
                    model = load_for_training(model_name, settings, recipe)   # beside the old Trainer's, if kept
            with tracker.stage(f"fold {fold}: training", **STAGE):
                trainer = fold_trainer(model, train_ds, eval_ds, tok, settings, output_dir, fold, tracker)
                if loop["load"] == "once":     # the adapter back at its init, as the fixed loop does
                    init = init or save_adapter_init(model)
                    restore_adapter(model, init)
                trainer.train()
            with tracker.stage(f"fold {fold}: release"):
                if loop["trainer"] == "kept" and loop["load"] == "each":
                    free_gpu_cache()           # the user's helper: it frees nothing
                else:
                    trainer = cleanup.release(trainer, model if loop["load"] == "each" else None,
                                              free_model=loop["load"] == "each")
                    model = None if loop["load"] == "each" else model
    finally:
        trainer = model = init = cleanup.release(trainer, model, free_model=model is not None)


def fold_run(setup: dict, loop: dict, steps: int, preset, real_est):
    """The panel's Run of scenario 2: ``(chart, go)``; ``go(tracker)`` runs the fold loop ``loop`` (``folds``,
    ``load``, ``trainer``, ``recipe``) of ``setup`` under the cap and returns its record (as
    :func:`kit.widgets.stages.staged_run`'s)."""
    twin = setup.get("twin_of") is not None
    sizes = {"batch_size": setup["batch_size"], "seq_len": setup["seq_len"]}
    settings = loop_params(**(crash_settings(sizes) if twin else sizes), steps_per_fold=steps,
                           lora_r=setup["lora_r"] or 8, quantization=setup["quantization"],
                           max_samples=24 if runtime.is_smoke() else None)
    recipe = None if settings["quantization"] == "none" else RECIPES[loop["recipe"]]
    keep = {k: settings[k] for k in ("batch_size", "seq_len", "lora_r", "lora_targets", "quantization")}
    est = run_estimate(setup["model"], recipe, **keep)
    cap = None
    if preset.gpu_bytes is not None and twin:
        cap = scaled_cap(setup["model"], preset.name, setup["twin_of"], recipe, **keep)["cap_bytes"]
    elif preset.gpu_bytes is not None and machine.has_cuda():
        cap = preset.gpu_bytes
    rows = f"batch {settings['batch_size']} x {settings['seq_len']}"
    chart = StageChart(fold_plan(est, loop["folds"], loop["load"], loop["trainer"]),
                       title=f"{views.run_label(setup)}, {rows}: each fold's stages beside their estimates",
                       limit_bytes=cap, measured_label=f"measured ({kdevice.best_reading()})",
                       limit_label=f"cap: {preset.label.split(' (')[0]} scaled to the twin" if twin else "memory cap")

    def go(tracker) -> dict:
        record = dict(setup, batch_size=settings["batch_size"], seq_len=settings["seq_len"], status="refused",
                      predicted_peak_bytes=est.peak_bytes, measured_peak_bytes=None,
                      oom_stage=None, stages={}, returned=None, error=None, cap_bytes=cap)
        files_ready(setup["model"], settings["quantization"])
        base = leaks.take_baseline()
        chart.base_bytes = base.snapshot.best_bytes or 0
        out = tempfile.mkdtemp(prefix="kit-panel-folds-")
        try:
            with memory_cap(None if cap is None else chart.base_bytes + cap):
                result = oom.oom_safe(_folds, setup["model"], settings, recipe, loop, tracker, out, setup=setup)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        record = finish(record, chart, tracker, result, base)
        trained = [b for name, b in record["stages"].items() if name.endswith("training") and b is not None]
        record["measured_peak_bytes"] = max(trained, default=None)
        return record

    return chart, go
