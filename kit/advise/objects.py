"""The fit advisor's suggestions in the user's own objects: where each option of a suggestion's ``changes`` lives,
the code to paste, and :func:`apply`, which returns changed copies (the user's objects are never mutated).

The objects are those of a built Trainer / SFTTrainer (its ``args``, its model's LoraConfig and
BitsAndBytesConfig), or those given to :func:`kit.estimate.estimate_from` (an Estimate remembers them in
``est.inputs``). Where each option goes:

======================================  =====================================================================
``batch-size``, ``grad-accum``          ``per_device_train_batch_size``, ``gradient_accumulation_steps``
``gradient-checkpointing``              ``activation_checkpointing`` (transformers 5's name; ``gradient_checkpointing``
                                        is its deprecated alias, which ``dataclasses.replace`` overwrites from it)
``precision``                           ``fp16`` / ``bf16`` (both set: at most one may be True)
``optimizer``                           ``optim`` (``adamw-8bit`` -> ``"adamw_bnb_8bit"``, ...)
``eval-batch-size``, ...                ``per_device_eval_batch_size``, ``eval_accumulation_steps``
``seq-len``                             ``SFTConfig.max_length``; with a plain Trainer no argument holds it (the
                                        tokenizer's ``max_length`` / the data): ``seq_len``, said in a comment
``padding-free``, ``loss-type``         ``SFTConfig.padding_free``, ``SFTConfig.loss_type``
``quantization``                        a new ``BitsAndBytesConfig(load_in_4bit=True, ...)`` for ``from_pretrained``
``lora-r``, ``lora-targets``            ``LoraConfig(r=..., target_modules=...)``
``load-dtype``, ``attn``                ``from_pretrained(..., dtype=torch.bfloat16, attn_implementation=...)``
``kbit-recipe``, ``strategy``, others   no object field: a sentence (what to do instead), and the CLI form
======================================  =====================================================================

``dataclasses.replace`` copies a TrainingArguments, SFTConfig or LoraConfig with fields changed (their
``__post_init__`` runs again on the copy; checked with transformers 5.24, TRL 1.16 and peft 0.21). With a padding-free
SFTConfig the estimate's row is ``per_device_train_batch_size x max_length`` tokens: a shorter row is a shorter
``max_length`` (rounded down to whole rows, said where it is).

>>> from transformers import TrainingArguments
>>> from kit.advise import advise
>>> from kit.estimate import estimate_from
>>> args = TrainingArguments(output_dir="out", report_to="none", per_device_train_batch_size=8)
>>> est = estimate_from("tiny-llama", args, seq_len=128, device="cpu")
>>> s = advise(est, 80_000_000, safety=0).suggestions[0]
>>> s.cli
'--batch-size 4 --grad-accum 2'
>>> print(in_objects(s, est).code)
import dataclasses
training_args = dataclasses.replace(training_args, per_device_train_batch_size=4, gradient_accumulation_steps=2)
>>> new = apply(s, training_args=args)
>>> new["training_args"].per_device_train_batch_size, args.per_device_train_batch_size
(4, 8)
"""
from __future__ import annotations

import copy
import dataclasses

from kit.inputs import InputError

from kit.advise.mapping import Code, InObjects, context, plan
from kit.estimate import Estimate
from kit.estimate import trl
from kit.estimate.from_objects import trainer_inputs

__all__ = ["InObjects", "apply", "in_objects"]


def _kinds() -> dict:
    """estimate_from's keyword -> (the class it takes, its name as the user reads it)."""
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, TrainingArguments

    return {"sft_config": (trl.is_sft, f"trl {trl.SftReader.config_name}"),
            "training_args": (lambda obj: isinstance(obj, TrainingArguments), "transformers TrainingArguments"),
            "peft_config": (lambda obj: isinstance(obj, LoraConfig), "peft LoraConfig"),
            "quantization_config": (lambda obj: isinstance(obj, BitsAndBytesConfig), "transformers BitsAndBytesConfig")}


def _check_kinds(given: dict) -> None:
    """Refuse an object passed under another's keyword (a LoraConfig as training_args), naming where it goes."""
    kinds = _kinds()
    for keyword, obj in given.items():
        test, wanted = kinds[keyword]
        if obj is None or test(obj):
            continue
        home = next((k for k, (t, _) in kinds.items() if t(obj)), None)
        where = f"pass it as {home}=" if home else (
            "a dict is read by estimate_from, not copied here" if isinstance(obj, dict) else f"pass a {wanted}")
        raise InputError(keyword, f"{keyword} is a {type(obj).__name__}, not a {wanted}: {where}.")


# -- the public faces --------------------------------------------------------------------------------------------
def in_objects(suggestion, source) -> InObjects:
    """``suggestion`` (one of ``advise(...).suggestions``) in the user's objects. ``source``: the Trainer, or
    the Estimate made by :func:`kit.estimate.estimate_trainer` / :func:`kit.estimate.estimate_from` (which
    remembers the objects it read).

    >>> from kit.estimate import estimate_from
    >>> from kit.advise import advise
    >>> est = estimate_from("tiny-llama", {"per_device_train_batch_size": 8, "report_to": "none"}, seq_len=128,
    ...                     device="cpu")
    >>> in_objects(advise(est, 80_000_000, safety=0).suggestions[1], est).statements()
    ['training_args = dataclasses.replace(training_args, activation_checkpointing=True)']
    """
    if isinstance(source, Estimate):
        inputs = source.inputs
        if not inputs:
            raise InputError("source", "this Estimate was not read from your objects (estimate_trainer or "
                                           "estimate_from remember them): pass the Trainer, or the objects to apply().")
    elif hasattr(source, "args") and hasattr(source, "model"):
        inputs = trainer_inputs(source)
        inputs["adapters"] = getattr(source.model, "peft_config", None)
    else:
        raise InputError("source", f"source must be a Trainer or an Estimate from estimate_trainer / "
                                       f"estimate_from, not {type(source).__name__}.")
    return plan(suggestion, context(inputs))


def apply(suggestion, *, trainer=None, training_args=None, sft_config=None, peft_config=None,
          quantization_config=None, strict: bool = False) -> dict:
    """Copies of the user's objects with ``suggestion`` applied; the objects passed are never changed.

    Pass the Trainer (``trainer=``), or the objects given to :func:`kit.estimate.estimate_from`. The dict has
    estimate_from's keywords: ``training_args`` or ``sft_config`` (``args`` for a Trainer: build the Trainer
    again with it), ``peft_config``, ``quantization_config`` (a copy of each passed, or read from the Trainer's
    model, changed or not; a new LoraConfig or BitsAndBytesConfig where the suggestion makes one; a suggestion
    that changes training arguments none of which were passed is refused, as new defaults would drop the user's
    settings), and ``load_dtype`` /
    ``attn_implementation`` (``from_pretrained``'s) and ``seq_len`` only where the suggestion changes them. What
    no object holds (``kbit-recipe``, ``expandable-segments``, a multi-GPU launch) is not applied:
    :func:`in_objects`' ``notes`` say it; ``strict=True`` refuses such a suggestion instead, naming the change.

    >>> from peft import LoraConfig
    >>> from kit.advise import advise
    >>> from kit.estimate import estimate_from
    >>> lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"])
    >>> est = estimate_from("tiny-llama", {"per_device_train_batch_size": 1, "report_to": "none"}, peft_config=lora,
    ...                     seq_len=256, device="cpu")
    >>> s = advise(est, int(est.peak_bytes * 0.6), safety=0).suggestions[0]
    >>> s.cli
    '--seq-len 120'
    >>> sorted(apply(s, peft_config=lora, training_args=est.inputs["training_args"]))
    ['peft_config', 'seq_len', 'training_args']
    """
    if trainer is not None:
        if any(x is not None for x in (training_args, sft_config, peft_config, quantization_config)):
            raise InputError("trainer", "pass the Trainer alone: its args and its model's configs are read "
                                            "from it.")
        if not (hasattr(trainer, "args") and hasattr(trainer, "model")):
            raise InputError("trainer", f"trainer must be a transformers Trainer, not {type(trainer).__name__}.")
        inputs = {**trainer_inputs(trainer), "adapters": getattr(trainer.model, "peft_config", None)}
    else:
        if training_args is not None and sft_config is not None:
            raise InputError("sft_config", f"pass the {trl.SftReader.config_name} alone: it is "
                             f"{trl.SftReader.trainer_name}'s TrainingArguments.")
        _check_kinds({"training_args": training_args, "sft_config": sft_config, "peft_config": peft_config,
                      "quantization_config": quantization_config})
        inputs = {"source": "estimate_from", "sft": sft_config is not None, "training_args": training_args,
                  "sft_config": sft_config, "peft_config": peft_config, "quantization_config": quantization_config,
                  "padding_free": sft_config is not None and trl.read_sft_config(sft_config)[3]}
    ctx = context(inputs)
    p = plan(suggestion, ctx)
    if ctx["args"] is None and ctx["name"] in p.fields:
        changed = ", ".join(f"{k}={v!r}" for k, v in p.fields[ctx["name"]].items())
        raise InputError(ctx["name"], f"this suggestion sets {changed}, and no {ctx['name']} were passed, so "
                                          f"apply() would make new defaults and drop your own settings (learning "
                                          f"rate, epochs, output_dir): pass yours, apply(suggestion, "
                                          f"{ctx['name']}=your_args), or trainer=your_trainer.",
                         code="missing-object")
    missing = [n for n in p.notes if ": no object field" in n]
    if strict and missing:
        raise InputError("suggestion", f"{missing[0]}: no object of yours holds the change "
                                           f"{missing[0].split(':')[0]}, so apply() cannot make it.")
    plain = lambda fields: {k: v.value if isinstance(v, Code) else v for k, v in fields.items()}
    out = {}
    name = ctx["name"]
    if ctx["args"] is not None:
        fields = plain(p.fields.get(name, {}))
        try:
            out[name] = dataclasses.replace(ctx["args"], **fields)
        except ValueError as exc:  # its __post_init__ checks the hardware: bf16/fp16 on a machine without the GPU
            raise InputError("precision", f"{name} refuses {fields} on this machine ({str(exc).splitlines()[0]}): "
                                              "apply the change where the run will happen, or paste the code that "
                                              "in_objects(...).code gives there.") from None
    if p.new.get("peft_config"):
        from peft import LoraConfig

        out["peft_config"] = LoraConfig(**plain(p.fields["peft_config"]), task_type="CAUSAL_LM")
    elif ctx["peft_config"] is not None:
        out["peft_config"] = dataclasses.replace(ctx["peft_config"], **plain(p.fields.get("peft_config", {})))
    if "quantization_config" in p.fields:
        from transformers import BitsAndBytesConfig

        q = p.fields["quantization_config"]
        out["quantization_config"] = BitsAndBytesConfig(**plain(q)) if q else None
    elif ctx["quantization_config"] is not None:
        out["quantization_config"] = copy.deepcopy(ctx["quantization_config"])
    out.update(plain(p.values))
    return out
