"""What scenario 2's loops share: their settings, the model a fold trains, its SFTTrainer, a count of models.

- :func:`sft_config`: the user's ``SFTConfig`` (packing, a max length, checkpointing, fp16), in TRL 1.x's names;
  :func:`fold_trainer`: one fold's ``SFTTrainer``, as the user builds it.
- :func:`load_for_training`: the fixed loop's model, loaded once (4-bit by default) and wrapped with LoRA once;
  :func:`kbit_recipe`: peft's ``prepare_model_for_kbit_training`` (what SFTTrainer ran in the TRL of the user's
  post) or the lean recipe, which is what today's TRL amounts to.
- :func:`count_live_models`: the loaded models still in memory.
- ``loop_params`` reads the loops' settings.

>>> sorted(DEFAULTS)[:3]
['batch_size', 'lora_r', 'lora_targets']
"""
from __future__ import annotations

import gc
from pathlib import Path

from peft import get_peft_model
from transformers import PreTrainedModel, PrinterCallback
from trl import SFTConfig, SFTTrainer

from kit.inputs import ALL_LINEAR, InputError

from kit import inputs
from kit import machine
from kit import models as kmodels
from kit.measure import device as kdevice
from kit.scenarios.cross_validation.lora_reset import lora_config
from kit.units import fmt_bytes

DEFAULTS = dict(batch_size=4, seq_len=64, steps_per_fold=4, lora_r=8,
                lora_targets=("q_proj", "v_proj"), quantization="4bit", max_samples=200, seed=0)


def count_live_models() -> int:
    """How many loaded models are alive in this process: ``PreTrainedModel`` objects with real weights (not on
    the meta device) that are not part of another one (a ``LlamaForCausalLM`` counts once, not again for the
    ``LlamaModel`` inside it; a peft wrapper is not a ``PreTrainedModel``, so it adds nothing).

    >>> count_live_models()                                    # doctest: +SKIP
    2
    """
    # type(): isinstance() reads __class__, which warns on some lazy torch objects.
    found = [o for o in gc.get_objects() if issubclass(type(o), PreTrainedModel)]
    inner = {id(m) for o in found for m in o.modules() if m is not o and issubclass(type(m), PreTrainedModel)}
    return sum(1 for o in found if id(o) not in inner and not _on_meta(o))


def _on_meta(model) -> bool:
    return next((p.is_meta for p in model.parameters()), True)


def sft_config(settings: dict, output_dir, gpu: bool | None = None) -> SFTConfig:
    """The user's ``SFTConfig``, in TRL 1.x's names, with the loop's settings ``settings`` (:func:`loop_params`).

    The user's: ``packing=True``, ``dataset_text_field="text"``, a max length (``max_seq_length`` in the TRL of
    their post, ``max_length`` now; both moved from ``SFTTrainer(...)`` into ``SFTConfig``), gradient
    checkpointing and ``fp16=True``. ``gpu`` None: a run on this machine: the user's fp16 on a GPU; on a CPU,
    Trainer ignores fp16, and ``SFTConfig``'s own default (bf16) would run there slowly, so a CPU run is fp32
    (``use_cpu``). ``gpu=True``: the user's own GPU run, for a prediction of their T4.

    >>> c = sft_config(loop_params(seq_len=30), "/tmp/cv")
    >>> c.packing, c.max_length, c.dataset_text_field, c.gradient_checkpointing
    (True, 30, 'text', True)
    """
    cuda = machine.has_cuda() if gpu is None else gpu
    return SFTConfig(
        output_dir=str(output_dir), per_device_train_batch_size=settings["batch_size"],
        per_device_eval_batch_size=settings["batch_size"], gradient_checkpointing=True,
        fp16=cuda, bf16=False,
        dataset_text_field="text", max_length=settings["seq_len"], packing=True,
        max_steps=settings["steps_per_fold"], learning_rate=2e-4, logging_strategy="no", save_strategy="no",
        report_to="none", disable_tqdm=True, use_cpu=not cuda, seed=settings["seed"])


def fold_trainer(model, train_ds, eval_ds, tokenizer, settings: dict, output_dir, fold: int, tracker, callbacks=(),
                 peft_config=None) -> SFTTrainer:
    """One fold's ``SFTTrainer``, on text datasets (``"text"`` column), with the kit's tracker. A new trainer
    makes a new optimizer in ``train()``: no optimizer state carries over. With ``peft_config`` it wraps the
    model itself (the user's way); given a ``PeftModel`` it trains that one."""
    trainer = SFTTrainer(model=model, args=sft_config(settings, Path(output_dir) / f"fold{fold}"),
                         train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[tracker.callback(), *callbacks])
    trainer.remove_callback(PrinterCallback)  # we print one line per fold instead
    return trainer


def kbit_recipe(model, recipe: str = "standard"):
    """Prepare a loaded k-bit model for training: ``"standard"`` is peft's ``prepare_model_for_kbit_training``
    (what TRL's SFTTrainer ran on the user's model in 2024; TRL 1.x no longer does), ``"lean"`` the same minus
    its fp32 upcast.

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
    kmodels.set_checkpointing(model, kwargs={"use_reentrant": False})
    model.enable_input_require_grads()  # checkpointing a frozen base needs inputs that want grad
    return model


class PostSFTTrainer(SFTTrainer):
    """``SFTTrainer`` as the TRL of the user's 2024 post ran it on a k-bit model: peft's
    ``prepare_model_for_kbit_training`` (:func:`kbit_recipe` ``"standard"``: every 16-bit part upcast to fp32)
    before the trainer wraps the model. TRL 1.x no longer calls it; all else is today's SFTTrainer."""

    def __init__(self, model=None, *args, **kwargs):
        super().__init__(kbit_recipe(model, "standard"), *args, **kwargs)


def _load(model_name: str, quantization: str):
    model = kmodels.load_model(model_name, quantization=quantization)
    model.config.use_cache = False  # as the user did; the KV cache is useless in training
    return model


def load_for_training(model_name: str, settings: dict, recipe: str | None = None):
    """The model the fixed loop trains: loaded once (4-bit by default), wrapped with LoRA once.

    ``recipe`` None is today's TRL: ``SFTTrainer`` turns on checkpointing and the inputs' grads itself, and
    casts the adapters to bf16 on a quantized model. ``"standard"`` / ``"lean"``: :func:`kbit_recipe` first.
    """
    model = _load(model_name, settings["quantization"])
    if recipe is not None:
        model = kbit_recipe(model, recipe)
    return get_peft_model(model, lora_config(settings["lora_r"], settings["lora_targets"]))


def loop_params(**settings) -> dict:
    """The loops' settings, read with :mod:`kit.inputs` (numpy ints, '8', a comma string of targets ...).

    >>> loop_params(steps_per_fold="2", lora_targets="q_proj,k_proj")["lora_targets"]
    ['q_proj', 'k_proj']
    >>> loop_params(steps_per_fold=0)
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: steps_per_fold must be a whole number >= 1, not 0.
    """
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise InputError(sorted(unknown)[0], f"unknown settings {sorted(unknown)}; the settings are "
                                                 f"{sorted(DEFAULTS)}.")
    p = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    for name in ("batch_size", "seq_len", "steps_per_fold", "lora_r", "max_samples"):
        p[name] = inputs.whole_number(name, p[name])
    p["seed"] = inputs.whole_number("seed", p["seed"], minimum=0)
    p["quantization"] = inputs.choice("quantization", p["quantization"], ("none", "8bit", "4bit"))
    targets = inputs.targets(p["lora_targets"])
    if targets is None:
        raise InputError("lora_targets", "lora_targets names no module: pass names such as 'q_proj,v_proj', "
                                             "or 'all-linear'.")
    p["lora_targets"] = targets if targets == ALL_LINEAR else list(targets)
    return p


def fold_count(folds) -> int:
    return inputs.whole_number("folds", folds, minimum=2)


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
