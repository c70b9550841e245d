"""What scenario 2's loops share: their settings, the model a fold trains, its Trainer, a count of models.

- :func:`load_for_training`: load (4-bit by default), the k-bit recipe (:func:`kbit_recipe`), LoRA:
  what the user's ``SFTTrainer(model, peft_config=...)`` does to a 4-bit model.
- :func:`count_live_models`: the loaded models still in memory.
- ``loop_params`` reads the loops' settings; ``fold_trainer`` makes one fold's Trainer.

>>> sorted(DEFAULTS)[:3]
['batch_size', 'lora_r', 'lora_targets']
"""
from __future__ import annotations

import gc
from pathlib import Path

from peft import get_peft_model
from torch import nn
from transformers import PrinterCallback, Trainer, TrainingArguments

from kit import inputs as kin
from kit import machine
from kit import models as kmodels
from kit.measure import device as kdevice
from kit.scenarios.cross_validation.lora_reset import lora_config
from kit.units import fmt_bytes

DEFAULTS = dict(batch_size=4, seq_len=64, steps_per_fold=4, lora_r=8,
                lora_targets=("q_proj", "v_proj"), quantization="4bit", max_samples=200, seed=0)


def count_live_models() -> int:
    """How many models loaded by ``kit.models.load_model`` are still alive in this process.

    >>> count_live_models()                                    # doctest: +SKIP
    2
    """
    # type(): isinstance() reads __class__, which warns on some lazy torch objects. vars(): a
    # PeftModel forwards attribute lookups to its base, so hasattr() would count it too.
    return sum(1 for o in gc.get_objects() if issubclass(type(o), nn.Module) and "kit_source" in vars(o))


def fold_trainer(model, train_ds, eval_ds, collate, p: dict, output_dir, fold: int, tracker, callbacks=()) -> Trainer:
    # A new Trainer makes a new optimizer in train(): no optimizer state carries over.
    args = TrainingArguments(
        output_dir=str(Path(output_dir) / f"fold{fold}"), per_device_train_batch_size=p["batch_size"],
        per_device_eval_batch_size=p["batch_size"], max_steps=p["steps_per_fold"], learning_rate=2e-4,
        logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=not machine.has_cuda(), seed=p["seed"])
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      data_collator=collate, callbacks=[tracker.callback(), *callbacks])
    trainer.remove_callback(PrinterCallback)  # we print one line per fold instead
    return trainer


def kbit_recipe(model, recipe: str = "standard"):
    """Prepare a loaded k-bit model for training: ``"standard"`` is peft's ``prepare_model_for_kbit_training``
    (what TRL's SFTTrainer runs on the user's model), ``"lean"`` the same minus its fp32 upcast.

    Both freeze the base and turn on gradient checkpointing (non-reentrant, torch's
    recommendation, so that only the upcast differs). A model that is not k-bit is returned as
    it is.
    """
    from peft import prepare_model_for_kbit_training

    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        return model
    if recipe == "standard":
        return prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                               gradient_checkpointing_kwargs={"use_reentrant": False})
    for param in model.parameters():  # lean
        param.requires_grad = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()  # checkpointing a frozen base needs inputs that want grad
    return model


def _load(model_name: str, quantization: str):
    model = kmodels.load_model(model_name, quantization=quantization)
    model.config.use_cache = False  # as the user did; the KV cache is useless in training
    return model


def load_for_training(model_name: str, p: dict, recipe: str = "standard"):
    """The model a fold trains: loaded (4-bit by default), prepared by the k-bit recipe, wrapped with LoRA.

    This is what the user's ``SFTTrainer(model, peft_config=...)`` does to a 4-bit model.
    """
    model = kbit_recipe(_load(model_name, p["quantization"]), recipe)
    return get_peft_model(model, lora_config(p["lora_r"], p["lora_targets"]))


def loop_params(**kw) -> dict:
    """The loops' settings, read with :mod:`kit.inputs` (numpy ints, '8', a comma string of targets ...).

    >>> loop_params(steps_per_fold="2", lora_targets="q_proj,k_proj")["lora_targets"]
    ['q_proj', 'k_proj']
    >>> loop_params(steps_per_fold=0)
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


def fold_count(folds) -> int:
    return kin.whole_number("folds", folds, minimum=2)


def fold_record(stage, fold: int, **extra) -> dict:
    return dict(fold=fold, start_bytes=stage.start_bytes, peak_bytes=stage.peak_bytes, end_bytes=stage.end_bytes,
                **extra)


def notify_fold(loop: str, fold_records: list, on_fold_end) -> None:
    rec = fold_records[-1]
    oom = " OUT OF MEMORY" if rec.get("oom") else ""
    print(f"{loop} fold {rec['fold']}: start {fmt_bytes(rec['start_bytes'])}, peak {fmt_bytes(rec['peak_bytes'])}, "
          f"end {fmt_bytes(rec['end_bytes'])} ({kdevice.best_reading()}){oom}", flush=True)
    if on_fold_end is not None:
        on_fold_end(list(fold_records))
