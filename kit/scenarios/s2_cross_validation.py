"""Scenario 2: k-fold QLoRA cross-validation. The second-fold OOM, found and fixed.

- :func:`run_broken_loop`: the user's loop. A fresh ``from_pretrained`` every fold,
  and a ``free_gpu_cache()`` whose ``del trainer`` frees nothing, so at the start
  of fold 2 the old Trainer still holds fold 1's model: two models are alive.
- :func:`show_advice_reset`: the advice's LoRA reset, run and checked. It resets nothing.
- :func:`run_fixed_loop`: the base loaded and wrapped once, the adapter restored to
  its saved init and *verified* at each fold start, a new Trainer (so a fresh
  optimizer) per fold, memory released and checked against the baseline, and each
  fold's metrics appended to a results file as soon as the fold ends (a rerun resumes).
- :func:`run_scenario2`: all three, shaped like summary.json's ``"scenario2"``.

Byte figures are the best reading here (``kit.device.best_reading()``): CUDA
allocated on a GPU, live-tensor bytes on a CPU.

>>> s2 = run_scenario2("tiny-llama", folds=3, steps_per_fold=2)       # doctest: +SKIP
>>> s2["advice_reset_changed_nothing"]                                  # doctest: +SKIP
True
"""
from __future__ import annotations

import gc
from pathlib import Path

from peft import get_peft_model
from torch import nn
from transformers import PrinterCallback, Trainer, TrainingArguments

from .. import cleanup, leaks, oom
from .. import device as kdevice
from .. import inputs as kin
from .. import models as kmodels
from ..track import Tracker
from ..units import fmt_bytes
from .s2_folds import append_result, fold_data, read_results, run_key, set_aside
from .s2_lora_reset import (advice_reset, adapter_state, lora_config, restore_adapter, save_adapter_init,
                         states_equal, verify_adapter_reset)

DEFAULTS = dict(batch_size=4, seq_len=64, steps_per_fold=4, lora_r=8,
                lora_targets=("q_proj", "v_proj"), quantization="4bit", max_samples=200, seed=0)


def free_gpu_cache() -> None:
    """The user's cleanup helper, as the advice wrote it. It frees nothing.

    ``del trainer`` makes ``trainer`` a *local* name of this function, so it raises
    ``UnboundLocalError`` (a ``NameError``), which is swallowed. The caller's
    ``trainer``, which holds the model, the optimizer and the data, lives on.
    """
    try:
        del trainer  # noqa: F821 (the bug, on purpose)
    except NameError:
        pass
    gc.collect()
    kdevice.empty_cache()  # torch.cuda.empty_cache(), through the kit's one CUDA module


def count_live_models() -> int:
    """How many models loaded by ``kit.models.load_model`` are still alive in this process.

    >>> count_live_models()                                    # doctest: +SKIP
    2
    """
    # type(): isinstance() reads __class__, which warns on some lazy torch objects. vars(): a
    # PeftModel forwards attribute lookups to its base, so hasattr() would count it too.
    return sum(1 for o in gc.get_objects() if issubclass(type(o), nn.Module) and "kit_source" in vars(o))


def _trainer(model, train_ds, eval_ds, collate, p: dict, output_dir, fold: int, tracker) -> Trainer:
    # A new Trainer makes a new optimizer in train(): no optimizer state carries over.
    args = TrainingArguments(
        output_dir=str(Path(output_dir) / f"fold{fold}"), per_device_train_batch_size=p["batch_size"],
        per_device_eval_batch_size=p["batch_size"], max_steps=p["steps_per_fold"], learning_rate=2e-4,
        logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=not kdevice.has_cuda(), seed=p["seed"])
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      data_collator=collate, callbacks=[tracker.callback()])
    trainer.remove_callback(PrinterCallback)  # we print one line per fold instead
    return trainer


def _load(model_name: str, quantization: str):
    model = kmodels.load_model(model_name, quantization=quantization)
    model.config.use_cache = False  # as the user did; the KV cache is useless in training
    return model


def _params(**kw) -> dict:
    """The loops' settings, read with :mod:`kit.inputs` (numpy ints, '8', a comma string of targets ...).

    >>> _params(steps_per_fold="2", lora_targets="q_proj,k_proj")["lora_targets"]
    ['q_proj', 'k_proj']
    >>> _params(steps_per_fold=0)
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: steps_per_fold must be a whole number >= 1, not 0.
    """
    unknown = set(kw) - set(DEFAULTS)
    if unknown:
        raise kin.InputError(sorted(unknown)[0], f"unknown settings {sorted(unknown)}; the settings are "
                                                 f"{sorted(DEFAULTS)}.")
    p = {**DEFAULTS, **{k: v for k, v in kw.items() if v is not None}}
    for name in ("batch_size", "seq_len", "steps_per_fold", "lora_r", "max_samples"):
        p[name] = kin.whole_number(name, p[name])
    p["seed"] = kin.whole_number("seed", p["seed"], minimum=0)
    p["quantization"] = kin.choice("quantization", p["quantization"], ("none", "8bit", "4bit"))
    targets = kin.targets(p["lora_targets"])
    if targets is None:
        raise kin.InputError("lora_targets", "lora_targets names no module: pass names such as 'q_proj,v_proj', "
                                             "or 'all-linear'.")
    p["lora_targets"] = targets if targets == kin.ALL_LINEAR else list(targets)
    return p


def _folds(folds) -> int:
    return kin.whole_number("folds", folds, minimum=2)


def _fold_record(stage, fold: int, **extra) -> dict:
    return dict(fold=fold, start_bytes=stage.start_bytes, peak_bytes=stage.peak_bytes, end_bytes=stage.end_bytes,
                **extra)


def _broken_folds(state: dict, splits, collate, model_name: str, p: dict, output_dir, tracker, on_fold_end):
    """The user's loop body. Runs inside kit.oom.oom_safe, which frees its frame on OOM."""
    model = trainer = None
    for fold, (train_ds, eval_ds) in enumerate(splits, 1):
        state["fold"] = fold
        with tracker.stage("broken: load model", reset_peak=True, collect=False):  # free_gpu_cache collected
            model = _load(model_name, p["quantization"])  # the user's from_pretrained, every fold
            # The user passed peft_config=lora_config to TRL's SFTTrainer, which wraps the model
            # itself. transformers 5's Trainer has no peft_config argument, so we wrap it here.
            model = get_peft_model(model, lora_config(p["lora_r"], p["lora_targets"]))
        gc.collect()  # so that only models someone still references are counted and measured
        alive = state["alive"] = count_live_models()
        with tracker.stage("broken fold", reset_peak=True, collect=False, tensor_peak=True) as stage:
            trainer = _trainer(model, train_ds, eval_ds, collate, p, output_dir, fold, tracker)
            train_loss = trainer.train().training_loss
            free_gpu_cache()  # frees nothing: `trainer` (and this fold's model) stays alive
        state["folds"].append(_fold_record(stage, fold, models_alive_at_start=alive, train_loss=train_loss))
        _notify("broken", state["folds"], on_fold_end)


def run_broken_loop(model_name: str = "tiny-llama", *, folds: int = 3, output_dir="cv-runs/broken",
                    tracker=None, on_fold_end=None, **settings) -> dict:
    """The user's loop, tracked per fold, OOM-safe: ``{"folds": [...], "oom_at_fold": int|None}``.

    Each fold reads ``start_bytes`` once its model is loaded and wrapped, ``peak_bytes``
    over its training and ``end_bytes`` after ``free_gpu_cache()``; ``models_alive_at_start``
    counts the loaded models alive then (2 from fold 2 on). An out-of-memory error is
    caught (``kit.oom.oom_safe``), its fold recorded as ``oom_at_fold`` and the memory
    freed. ``on_fold_end(folds)`` gets the fold records so far, to redraw a chart.
    ``settings``: batch_size, seq_len, steps_per_fold, lora_r, lora_targets, quantization,
    max_samples, seed (see ``DEFAULTS``).

    >>> broken = run_broken_loop("tiny-llama", folds=2)        # doctest: +SKIP
    >>> broken["folds"][1]["models_alive_at_start"]              # doctest: +SKIP
    2
    """
    p, folds = _params(**settings), _folds(folds)
    tracker = tracker if tracker is not None else Tracker()
    _, collate, splits = fold_data(model_name, folds, p["seq_len"], p["max_samples"])
    state, first = {"fold": 0, "folds": [], "alive": None}, len(tracker.records)
    result = oom.oom_safe(_broken_folds, state, splits, collate, model_name, p, output_dir, tracker,
                              on_fold_end, setup={"model": model_name, **p})
    cleanup.release()  # the loop's models die with its frame; collect them and empty the CUDA cache
    if result.oom:
        print(f"OUT OF MEMORY at fold {state['fold']}: {result.error}", flush=True)
        failed = [r for r in tracker.records[first:] if r.name == "broken fold" and r.error and r.end is not None]
        if failed and len(state["folds"]) < state["fold"]:
            state["folds"].append(_fold_record(failed[-1], state["fold"], oom=True,
                                               models_alive_at_start=state["alive"]))
            _notify("broken", state["folds"], on_fold_end)
    return {"folds": state["folds"], "oom_at_fold": state["fold"] if result.oom else None}


def show_advice_reset(model_name: str = "tiny-llama", *, output_dir="cv-runs/advice", **settings) -> dict:
    """Train fold 1, run the advice's reset, and compare the adapter before and after.

    Returns ``changed_nothing`` (fold 2 would start from fold 1's trained adapter:
    ``torch.equal`` over every adapter tensor), ``fold1_changed_adapter`` (training did
    move it, so the comparison means something) and ``check``, the verdict of
    :func:`~kit.scenarios.s2_lora_reset.verify_adapter_reset` (``check["ok"]`` is False).

    >>> show_advice_reset("tiny-llama")["changed_nothing"]      # doctest: +SKIP
    True
    """
    p = _params(**settings)
    _, collate, splits = fold_data(model_name, 2, p["seq_len"], p["max_samples"])
    model = get_peft_model(_load(model_name, p["quantization"]), lora_config(p["lora_r"], p["lora_targets"]))
    init = save_adapter_init(model)
    trainer = _trainer(model, *splits[0], collate, p, output_dir, 1, Tracker())
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


def _fixed_folds(state: dict, model, init, splits, collate, p: dict, output_dir, tracker, on_fold_end,
                 done: dict, path: Path, key: str, tolerance: float):
    """The fixed loop body. Runs inside kit.oom.oom_safe."""
    baseline = leaks.take_baseline()
    state["baseline_bytes"] = baseline.snapshot.best_bytes
    for fold, (train_ds, eval_ds) in enumerate(splits, 1):
        state["fold"] = fold
        if fold in done:
            state["folds"].append({**done[fold], "resumed": True})
            continue
        # collect=False: take_baseline() or the previous fold's release() collected; so does this one's.
        with tracker.stage("fixed fold", reset_peak=True, collect=False, tensor_peak=True) as stage:
            restore_adapter(model, init)
            check = verify_adapter_reset(model, init)
            if not check.ok:  # training on would contaminate the score: stop, loudly
                raise RuntimeError(f"fold {fold}: {check.text()}")
            trainer = _trainer(model, train_ds, eval_ds, collate, p, output_dir, fold, tracker)
            train_loss = trainer.train().training_loss
            eval_loss = trainer.evaluate()["eval_loss"]
            trainer = cleanup.release(trainer)  # optimizer, gradients, data loaders; the base stays
        back = abs(stage.end_bytes - state["baseline_bytes"]) <= tolerance * state["baseline_bytes"]
        if not back:  # name what holds the excess (a slow walk, so only when it is needed)
            print(leaks.check_returned(baseline, tolerance_bytes=0, tolerance_frac=tolerance,
                                         raise_on_leak=False).text(), flush=True)
        rec = _fold_record(stage, fold, adapter_reset_ok=check.ok, back_at_baseline=back,
                           baseline_bytes=state["baseline_bytes"], eval_loss=eval_loss, train_loss=train_loss,
                           run_key=key)
        append_result(path, rec)  # on disk before anything else can fail
        state["folds"].append(rec)
        state["trained"].append(fold)
        _notify("fixed", state["folds"], on_fold_end)


def run_fixed_loop(model_name: str = "tiny-llama", *, folds: int = 5, output_dir="cv-runs/fixed",
                   results_path=None, resume: bool = True, tolerance: float = 0.01,
                   tracker=None, on_fold_end=None, **settings) -> dict:
    """The fixed loop. Returns ``{"folds", "baseline_bytes", "results_path", "trained_folds", "oom_at_fold"}``.

    The base model is loaded and wrapped with peft once; at each fold start the adapter
    is restored to its saved init and verified; each fold gets a new Trainer and is
    released with ``kit.cleanup.release``. Each fold record has ``start_bytes``,
    ``peak_bytes``, ``end_bytes``, ``adapter_reset_ok``, ``back_at_baseline`` (within
    ``tolerance`` of the memory before fold 1), ``eval_loss`` and ``train_loss``, and is
    appended to ``results_path`` (default ``output_dir/cv_results.jsonl``) as soon as the
    fold ends. With ``resume=True`` folds already in that file are not trained again; a file
    of other settings, or with an unreadable line, is refused in words and left as it is.
    With ``resume=False`` an existing file is moved aside (``cv_results.before-N.jsonl``),
    never deleted, and the run starts a new one.

    >>> fixed = run_fixed_loop("tiny-llama", folds=5)            # doctest: +SKIP
    >>> [f["adapter_reset_ok"] for f in fixed["folds"]]           # doctest: +SKIP
    [True, True, True, True, True]
    """
    p, folds = _params(**settings), _folds(folds)
    resume, tolerance = kin.flag("resume", resume), kin.fraction("tolerance", tolerance)
    tracker = tracker if tracker is not None else Tracker()
    path = Path(results_path or Path(output_dir) / "cv_results.jsonl")
    key = run_key(model_name, {"folds": folds, **p})
    done = read_results(path, key, folds) if resume else {}
    if not resume and (aside := set_aside(path)) is not None:
        print(f"resume=False: the earlier folds in {path} are kept in {aside}; this run starts a new file.",
              flush=True)
    _, collate, splits = fold_data(model_name, folds, p["seq_len"], p["max_samples"])
    model = init = None
    if len(done) < len(splits):
        model = _load(model_name, p["quantization"])  # once, outside the loop
        model = get_peft_model(model, lora_config(p["lora_r"], p["lora_targets"]))  # once
        init = save_adapter_init(model)
    state = {"fold": 0, "folds": [], "trained": [], "baseline_bytes": None}
    try:
        result = oom.oom_safe(_fixed_folds, state, model, init, splits, collate, p, output_dir, tracker,
                                  on_fold_end, done, path, key, tolerance, setup={"model": model_name, **p})
    finally:  # on any error too: the finished folds are on disk, the base model goes
        del model, init
        cleanup.release()
    if result.oom:
        print(f"OUT OF MEMORY at fold {state['fold']}; the folds before it are kept in {path}", flush=True)
    return {"folds": state["folds"], "baseline_bytes": state["baseline_bytes"], "results_path": str(path),
            "trained_folds": state["trained"], "oom_at_fold": state["fold"] if result.oom else None}


def _notify(loop: str, fold_records: list, on_fold_end) -> None:
    rec = fold_records[-1]
    oom = " OUT OF MEMORY" if rec.get("oom") else ""
    print(f"{loop} fold {rec['fold']}: start {fmt_bytes(rec['start_bytes'])}, peak {fmt_bytes(rec['peak_bytes'])}, "
          f"end {fmt_bytes(rec['end_bytes'])} ({kdevice.best_reading()}){oom}", flush=True)
    if on_fold_end is not None:
        on_fold_end(list(fold_records))


def run_scenario2(model_name: str = "tiny-llama", *, folds: int = 5, broken_folds: int = 3,
                  output_dir="cv-runs", tracker=None, **settings) -> dict:
    """Broken loop, advice reset and fixed loop, shaped like summary.json's ``"scenario2"``.

    >>> s2 = run_scenario2("tiny-llama", folds=3, steps_per_fold=2)   # doctest: +SKIP
    """
    out = Path(output_dir)
    broken = run_broken_loop(model_name, folds=broken_folds, output_dir=out / "broken", tracker=tracker, **settings)
    advice = show_advice_reset(model_name, output_dir=out / "advice", **settings)
    fixed = run_fixed_loop(model_name, folds=folds, output_dir=out / "fixed", resume=False, tracker=tracker,
                           **settings)
    keep = ("start_bytes", "peak_bytes", "end_bytes")
    return {"broken": {"folds": [{k: f[k] for k in keep + ("oom", "models_alive_at_start") if k in f}
                                 for f in broken["folds"]],
                       "oom_at_fold": broken["oom_at_fold"]},
            "fixed": {"folds": [{**{k: f[k] for k in keep}, "adapter_reset_ok": f["adapter_reset_ok"]}
                                for f in fixed["folds"]]},
            "advice_reset_changed_nothing": bool(advice["changed_nothing"] and advice["fold1_changed_adapter"])}
