"""Scenario 2: k-fold QLoRA cross-validation. The second-fold OOM, found and fixed.

- :func:`run_broken_loop` (in :mod:`.user_loop`): the user's loop. A fresh ``from_pretrained``
  every fold while the old Trainer still holds fold 1's model, so two models are alive while
  fold 2 loads; and a ``free_gpu_cache()`` whose ``del trainer`` frees nothing.
- :func:`show_advice_reset`: the advice's LoRA reset, run and checked. It resets nothing.
- :func:`run_fixed_loop`: the base loaded and wrapped once, the adapter restored to
  its saved init and *verified* at each fold start, a new Trainer (so a fresh
  optimizer) per fold, memory released and checked against the baseline, and each
  fold's metrics appended to a results file as soon as the fold ends (a rerun resumes).
- :func:`run_scenario2`: all three, shaped like summary.json's ``"scenario2"``.

Byte figures are the best reading here (``kit.measure.device.best_reading()``): CUDA
allocated on a GPU, live-tensor bytes on a CPU.

>>> s2 = run_scenario2("tiny-llama", folds=3, steps_per_fold=2)       # doctest: +SKIP
>>> s2["advice_reset_changed_nothing"]                                  # doctest: +SKIP
True
"""
from __future__ import annotations

from pathlib import Path

from kit import inputs
from kit import runtime
from kit.measure import cleanup, leaks, oom
from kit.measure.controls import memory_cap
from kit.measure.track import Tracker
from kit.scenarios.cross_validation.folds import (append_result, check_writable, fold_texts, read_results, run_key,
                                                 set_aside)
from kit.scenarios.cross_validation.lora_reset import (
    adapter_state,
    advice_reset,
    restore_adapter,
    save_adapter_init,
    states_equal,
    verify_adapter_reset,
)
from kit.scenarios.cross_validation.training import (  # noqa: F401 (callers read them here)
    DEFAULTS,
    count_live_models,
    fold_count,
    fold_record,
    fold_trainer,
    load_for_training,
    loop_params,
    notify_fold,
)
# the notebook reads these as cv.*
from kit.scenarios.cross_validation.user_loop import free_gpu_cache, run_broken_loop  # noqa: F401


def show_advice_reset(model_name: str = "tiny-llama", *, output_dir="cv-runs/advice", **settings) -> dict:
    """Train fold 1, run the advice's reset, and compare the adapter before and after.

    Returns ``changed_nothing`` (fold 2 would start from fold 1's trained adapter:
    ``torch.equal`` over every adapter tensor), ``fold1_changed_adapter`` (training did
    move it, so the comparison means something) and ``check``, the verdict of
    :func:`~kit.scenarios.cross_validation.lora_reset.verify_adapter_reset` (``check["ok"]`` is False).

    >>> show_advice_reset("tiny-llama")["changed_nothing"]      # doctest: +SKIP
    True
    """
    p = loop_params(**settings)
    tok, splits = fold_texts(model_name, 2, p["max_samples"])
    model = load_for_training(model_name, p)
    trainer = fold_trainer(model, *splits[0], tok, p, output_dir, 1, Tracker())
    init = save_adapter_init(model)  # after SFTTrainer cast the adapters to the dtype it trains them in
    trainer.train()
    trainer = cleanup.release(trainer)
    end_of_fold1 = adapter_state(model)
    advice_reset(model)  # the advice's reset, at the start of fold 2
    start_of_fold2 = adapter_state(model)
    check = verify_adapter_reset(model, init)
    out = {"changed_nothing": states_equal(start_of_fold2, end_of_fold1),
           "fold1_changed_adapter": not states_equal(end_of_fold1, init),
           "tensors_compared": len(end_of_fold1), "check": check.to_dict()}
    del model, init, end_of_fold1, start_of_fold2
    cleanup.release()
    return out


def fixed_fold(model, init, train_ds, eval_ds, tokenizer, settings: dict, output_dir, fold: int, tracker):
    """One fold of the fixed loop, on the base model loaded and wrapped once. Returns (init, check, losses)."""
    trainer = fold_trainer(model, train_ds, eval_ds, tokenizer, settings, output_dir, fold, tracker)  # a new optimizer
    if init is None:  # saved once, after SFTTrainer cast the adapters to the dtype it trains them in
        init = save_adapter_init(model)
    restore_adapter(model, init)               # the adapter back at its saved init...
    check = verify_adapter_reset(model, init)  # ...and checked, not trusted
    if not check.ok:  # training on would contaminate the score: stop, loudly
        raise RuntimeError(f"fold {fold}: {check.text()}")
    losses = {"train_loss": trainer.train().training_loss, "eval_loss": trainer.evaluate()["eval_loss"]}
    trainer = cleanup.release(trainer)  # here, in the scope that owns it: optimizer, gradients, data; the base stays
    return init, check, losses


def _fixed_folds(state: dict, model, splits, tok, settings: dict, output_dir, tracker, on_fold_end,
                 done: dict, path: Path, key: str, tolerance: float):
    """The fixed loop: :func:`fixed_fold` per fold, checked against the baseline and written to disk. Runs
    inside kit.measure.oom.oom_safe."""
    baseline = leaks.take_baseline()
    state["baseline_bytes"] = baseline.snapshot.best_bytes
    for fold, (train_ds, eval_ds) in enumerate(splits, 1):
        state["fold"] = fold
        if fold in done:
            state["folds"].append({**done[fold], "resumed": True})
            continue
        models_alive = count_live_models()   # at the fold's start, where the user's loop loads its next model
        # collect=False: take_baseline() or the previous fold's release() collected; so does this one's.
        with tracker.stage("fixed fold", reset_peak=True, collect=False, tensor_peak=True) as stage:
            state["init"], check, losses = fixed_fold(model, state["init"], train_ds, eval_ds, tok, settings,
                                                      output_dir, fold, tracker)
        back = abs(stage.end_bytes - state["baseline_bytes"]) <= tolerance * state["baseline_bytes"]
        if not back:  # name what holds the excess (a slow walk, so only when it is needed)
            print(leaks.check_returned(baseline, tolerance_bytes=0, tolerance_frac=tolerance,
                                         raise_on_leak=False).text(), flush=True)
        rec = fold_record(stage, fold, adapter_reset_ok=check.ok, back_at_baseline=back, models_alive=models_alive,
                           baseline_bytes=state["baseline_bytes"], **losses, run_key=key)
        append_result(path, rec)  # on disk before anything else can fail
        state["folds"].append(rec)
        state["trained"].append(fold)
        notify_fold("fixed", state["folds"], on_fold_end)


def _load_and_run(state: dict, model_name: str, settings: dict, recipe, load: bool, splits, tok, *rest):
    """The base model loaded once (unless every fold is on file), then :func:`_fixed_folds`; the model freed after."""
    model = load_for_training(model_name, settings, recipe) if load else None  # once, outside the loop
    try:
        _fixed_folds(state, model, splits, tok, settings, *rest)
    finally:  # on any error too: the finished folds are on disk, the base model goes
        del model
        state["init"] = None
        cleanup.release()


@runtime.once_per_run()
def run_fixed_loop(model_name: str = "tiny-llama", *, folds: int = 5, output_dir="cv-runs/fixed",
                   results_path=None, resume: bool = True, tolerance: float = 0.01,
                   tracker=None, on_fold_end=None, recipe: str | None = None, cap_bytes: int | None = None,
                   **settings) -> dict:
    """The fixed loop. Returns ``{"folds", "baseline_bytes", "results_path", "trained_folds", "oom_at_fold"}``.

    The base model is loaded and wrapped with peft once; at each fold start the adapter
    is restored to its saved init and verified; each fold gets a new SFTTrainer and is
    released with ``kit.measure.cleanup.release``. Each fold record has ``start_bytes``,
    ``peak_bytes``, ``end_bytes``, ``adapter_reset_ok``, ``back_at_baseline`` (within
    ``tolerance`` of the memory before fold 1), ``eval_loss`` and ``train_loss``, and is
    appended to ``results_path`` (default ``output_dir/cv_results.jsonl``) as soon as the
    fold ends. With ``resume=True`` folds already in that file are not trained again; a file
    of other settings, or with an unreadable line, is refused in words and left as it is.
    With ``resume=False`` an existing file is moved aside (``cv_results.before-N.jsonl``),
    never deleted, and the run starts a new one. ``recipe``: the k-bit recipe of the model loaded once (None:
    today's TRL; ``"standard"``: peft's fp32 upcast, as the TRL of the user's post). ``cap_bytes``: the loop, load
    included, runs under that memory cap (``kit.measure.controls.memory_cap``); ``cap`` says which.

    >>> fixed = run_fixed_loop("tiny-llama", folds=5)            # doctest: +SKIP
    >>> [f["adapter_reset_ok"] for f in fixed["folds"]]           # doctest: +SKIP
    [True, True, True, True, True]
    """
    p, folds = loop_params(**settings), fold_count(folds)
    resume, tolerance = inputs.flag("resume", resume), inputs.fraction("tolerance", tolerance)
    tracker = tracker if tracker is not None else Tracker()
    path = Path(results_path or Path(output_dir) / "cv_results.jsonl")
    key = run_key(model_name, {"folds": folds, **p, **({"recipe": recipe} if recipe else {})})
    done = read_results(path, key, folds) if resume else {}
    if not resume and (aside := set_aside(path)) is not None:
        print(f"resume=False: the earlier folds in {path} are kept in {aside}; this run starts a new file.",
              flush=True)
    check_writable(path)   # before any fold trains: a finished fold's figures always have somewhere to go
    tok, splits = fold_texts(model_name, folds, p["max_samples"])
    state = {"fold": 0, "folds": [], "trained": [], "baseline_bytes": None, "init": None}
    with memory_cap(cap_bytes) as cap:
        result = oom.oom_safe(_load_and_run, state, model_name, p, recipe, len(done) < len(splits), splits, tok,
                              output_dir, tracker, on_fold_end, done, path, key, tolerance,
                              setup={"model": model_name, **p})
    if result.oom:
        print(f"OUT OF MEMORY at fold {state['fold']}; the folds before it are kept in {path}", flush=True)
    return {"folds": state["folds"], "baseline_bytes": state["baseline_bytes"], "results_path": str(path),
            "trained_folds": state["trained"], "oom_at_fold": state["fold"] if result.oom else None,
            "cap_bytes": cap.cap_bytes, "cap": cap.how}


def run_scenario2(model_name: str = "tiny-llama", *, folds: int = 5, broken_folds: int = 3,
                  output_dir="cv-runs", tracker=None, recipe: str | None = None, cap_bytes: int | None = None,
                  **settings) -> dict:
    """Broken loop, advice reset and fixed loop, shaped like summary.json's ``"scenario2"``; both loops with
    ``recipe`` under ``cap_bytes`` (see :func:`run_fixed_loop`).

    >>> s2 = run_scenario2("tiny-llama", folds=3, steps_per_fold=2)   # doctest: +SKIP
    """
    out = Path(output_dir)
    broken = run_broken_loop(model_name, folds=broken_folds, output_dir=out / "broken", tracker=tracker,
                             recipe=recipe, cap_bytes=cap_bytes, **settings)
    advice = show_advice_reset(model_name, output_dir=out / "advice", **settings)
    fixed = run_fixed_loop(model_name, folds=folds, output_dir=out / "fixed", resume=False, tracker=tracker,
                           recipe=recipe, cap_bytes=cap_bytes, **settings)
    keep = ("start_bytes", "peak_bytes", "end_bytes")
    extra = ("load_peak_bytes", "loaded_bytes", "models_alive_after_load", "train_peak_bytes",
             "models_alive_in_training", "oom", "oom_during")
    return {"broken": {"folds": [{k: f[k] for k in keep + extra if k in f} for f in broken["folds"]],
                       "oom_at_fold": broken["oom_at_fold"]},
            "fixed": {"folds": [{**{k: f[k] for k in keep + ("models_alive",) if k in f},
                                 "adapter_reset_ok": f["adapter_reset_ok"]} for f in fixed["folds"]],
                      "oom_at_fold": fixed["oom_at_fold"]},
            "cap_bytes": broken["cap_bytes"], "cap": broken["cap"], "recipe": recipe or "today's TRL",
            "advice_reset_changed_nothing": bool(advice["changed_nothing"] and advice["fold1_changed_adapter"])}
