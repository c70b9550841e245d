"""Where each option of a fit-advisor suggestion lives in the user's objects (:mod:`kit.advise.objects` is its API
and has the table): the fields to set, what no object holds, and the code to paste.

>>> from kit.advise.search import Suggestion
>>> plan(Suggestion(changes={"batch-size": 2}, cli="", peak_bytes=0, fits=True, margin_bytes=0, costs=[],
...                 tiers=(0,), cpu_build_bytes=0, eval_peak_bytes=0),
...      context({"source": "estimate_from", "training_args": None})).fields
{'training_args': {'per_device_train_batch_size': 2}}
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kit.inputs import InputError

from kit import inputs
from kit.estimate.reserved import HOW_TO
from kit.estimate.trl import SftReader
from kit.advise.search import CLI
from kit.optimizers import TRAINER_OPTIM as OPTIM   # the kit's optimizer -> TrainingArguments.optim
KEYWORD = {v: k for k, v in CLI.items()}   # the estimate CLI's option -> estimate()'s keyword
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ARGS = {"batch_size": "per_device_train_batch_size", "grad_accum": "gradient_accumulation_steps",
        "eval_batch_size": "per_device_eval_batch_size", "eval_accumulation_steps": "eval_accumulation_steps"}
LAUNCH = ("strategy", "num_gpus", "cpu_offload")


class Code(str):
    """A value written as Python source in the code (``torch.bfloat16``), its object in :attr:`value`."""

    value: object = None


def _dtype(name: str) -> Code:
    import torch

    c = Code(f"torch.{TORCH_DTYPE[name]}")
    c.value = getattr(torch, TORCH_DTYPE[name])
    return c


@dataclass
class InObjects:
    """One suggestion in the user's objects.

    ``fields``: per object name (``args`` for a Trainer's, else ``training_args`` / ``sft_config``;
    ``peft_config``; ``quantization_config``) the fields set, only those that change; ``values``:
    ``load_dtype`` / ``attn_implementation`` (``from_pretrained``'s) and ``seq_len`` where the suggestion changes
    them; ``notes``: what no object holds, one sentence each; ``code``: the Python to paste, in a namespace
    holding the user's objects (``trainer``, or estimate_from's keywords: ``training_args``, ``peft_config`` ...).
    """

    fields: dict
    values: dict
    notes: list
    code: str
    new: dict = field(default_factory=dict, repr=False)   # object name -> True: made anew (no object to copy)

    def statements(self) -> list:
        """The code's lines without its imports, comments and ``seq_len`` (no object: a note says it): what
        :func:`kit.check` prints."""
        return [ln for ln in self.code.splitlines() if ln and not ln.startswith(("import ", "from ", "#", "seq_len ="))]

    def to_json(self) -> dict:
        """``advise(...).to_json()``'s ``"objects"`` of a suggestion (object inputs only): code, fields, notes.

        >>> InObjects({"args": {"bf16": True}}, {}, [], "args = ...").to_json()["fields"]
        {'args': {'bf16': True}}
        """
        js = lambda value: str(value) if isinstance(value, Code) else list(value) if isinstance(value, tuple) else value
        return {"code": self.code, "fields": {k: {f: js(v) for f, v in d.items()} for k, d in self.fields.items()},
                "values": {k: js(v) for k, v in self.values.items()}, "notes": list(self.notes)}


# -- the user's objects -------------------------------------------------------------------------------------------
def context(inputs: dict) -> dict:
    """What the mapping needs of the user's objects: ``inputs`` as ``Estimate.inputs`` holds them (``source``:
    ``"trainer"`` or ``"estimate_from"``, the objects by estimate_from's keywords, or ``args`` for a Trainer's).

    >>> context({"source": "trainer", "args": None})["expr"]
    'trainer.args'
    """
    trainer = inputs["source"] == "trainer"
    sft = bool(inputs.get("sft"))
    args = inputs.get("args") if trainer else inputs.get("sft_config") if sft else inputs.get("training_args")
    name = "args" if trainer else "sft_config" if sft else "training_args"
    peft = inputs.get("peft_config")
    adapter = "default"
    if trainer and peft is not None:
        adapter = next((k for k, v in (inputs.get("adapters") or {}).items() if v is peft), "default")
    return {"trainer": trainer, "sft": sft, "args": args, "name": name,
            "expr": "trainer.args" if trainer else name, "peft_config": peft,
            "peft_expr": f"trainer.model.peft_config[{adapter!r}]" if trainer else "peft_config",
            "quantization_config": inputs.get("quantization_config"),
            "padding_free": bool(inputs.get("padding_free"))}


def _args_class(ctx):
    if ctx["args"] is not None:
        return type(ctx["args"])
    from transformers import TrainingArguments

    return TrainingArguments


def _current(ctx, name: str):
    """The user's args' value of a field (its class default where no args were given)."""
    if ctx["args"] is not None:
        v = getattr(ctx["args"], name, None)
        return getattr(v, "value", v)
    f = {f.name: f for f in dataclasses.fields(_args_class(ctx))}.get(name)
    return None if f is None or f.default is dataclasses.MISSING else f.default


def _has_field(ctx, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(_args_class(ctx))}


def _value(suggestion, cli: str, keyword: str):
    """The suggested value of an option: estimate()'s (``options``) where it has it, else the CLI value."""
    if keyword in (getattr(suggestion, "options", None) or {}):
        return suggestion.options[keyword]
    return suggestion.changes[cli]


# -- the mapping -------------------------------------------------------------------------------------------------
def plan(suggestion, ctx) -> InObjects:
    """``suggestion`` in the objects of :func:`context` ``ctx``: the fields that change, the notes, the code (the
    module doc has an example)."""
    if not hasattr(suggestion, "changes") or not isinstance(suggestion.changes, dict):
        raise InputError("suggestion", f"suggestion must be one of advise(...).suggestions, not "
                                           f"{type(suggestion).__name__}.")
    o = getattr(suggestion, "options", None) or {}
    sft, trainer = ctx["sft"], ctx["trainer"]
    args, peft, quant, values, notes, new = {}, {}, {}, {}, [], {}
    kws = {KEYWORD.get(c, c.replace("-", "_")): c for c in suggestion.changes}
    free_after = ctx["padding_free"] or bool(o.get("padding_free")) or kws.get("padding_free") is not None and bool(
        suggestion.changes[kws["padding_free"]])
    quant_after = o.get("quantization", ctx["quantization_config"] is not None and "k-bit" or "none")

    def put(name, value):   # a TrainingArguments / SFTConfig field, where it changes
        if _current(ctx, name) != value:
            args[name] = value

    launch = [c for kw, c in kws.items() if kw in LAUNCH]
    for kw, cli in kws.items():
        v = _value(suggestion, cli, kw)
        flag = f"--{cli} {v}" if not isinstance(v, bool) else f"--{cli}" if v else f"--no-{cli}"
        if kw in ARGS:
            if kw == "batch_size" and free_after:
                continue   # the flattened row's batch of 1: the rows per micro-batch stay (seq_len below)
            put(ARGS[kw], v)
        elif kw == "gradient_checkpointing":
            ckpt = "activation_checkpointing" if _has_field(ctx, "activation_checkpointing") else kw
            recipe = quant_after != "none" and o.get("kbit_recipe", "standard") == "standard" and not sft
            if recipe and not v:
                notes.append(f"{flag}: no object field: prepare_model_for_kbit_training(model, "
                             "use_gradient_checkpointing=False), as its default turns checkpointing on")
            if not (recipe and not v and not _current(ctx, ckpt)):
                put(ckpt, bool(v))
        elif kw == "precision":
            put("fp16", v == "fp16")
            put("bf16", v == "bf16")
        elif kw == "optimizer":
            put("optim", OPTIM.get(v, v))
            if v == "sgd" and not _current(ctx, "optim_args"):
                put("optim_args", "momentum=0.9")
        elif kw == "seq_len":
            if "padding_free" in kws and not ctx["padding_free"]:
                continue   # padding-free turned on: the flattened row holds the same rows (max_length unchanged)
            if sft and free_after:
                rows = args.get("per_device_train_batch_size", _current(ctx, "per_device_train_batch_size"))
                put("max_length", max(1, v // rows))
                if v % rows:
                    notes.append(f"{flag}: the flattened row is per_device_train_batch_size x max_length = {rows} x "
                                 f"{max(1, v // rows)} = {rows * max(1, v // rows)} tokens ({v} rounded down to "
                                 "whole rows)")
            elif sft:
                put("max_length", v)
            else:
                values["seq_len"] = v
                notes.append(f"{flag}: no argument object holds it: rows of at most {v} tokens (the tokenizer's "
                             f"truncation=True, max_length={v}, or chunk longer texts)"
                             + ("" if trainer else f"; estimate_from(..., seq_len={v})"))
        elif kw == "quantization":
            if v == "4bit":
                quant = {"load_in_4bit": True, "bnb_4bit_quant_type": o.get("quant_type", "nf4"),
                         "bnb_4bit_use_double_quant": o.get("double_quant", True),
                         "bnb_4bit_compute_dtype": _dtype(o.get("compute_dtype", "bf16"))}
            elif v == "8bit":
                quant = {"load_in_8bit": True}
            else:
                quant = None
            new["quantization_config"] = True
            if v != "none":
                notes.append(f"{flag}: from_pretrained(..., quantization_config=quantization_config)" + (
                    f"; {SftReader.trainer_name} does the rest: it runs no prepare_model_for_kbit_training, which "
                    "this suggestion's "
                    "peak assumes, so these objects estimate lower (estimate_from(..., sft_config=...) says how much)"
                    if sft and o.get("kbit_recipe", "standard") == "standard" else
                    f"; {SftReader.trainer_name} does the rest (no prepare_model_for_kbit_training)" if sft else
                    "; then prepare_model_for_kbit_training(model), as the estimate assumes (peft's recipe)"))
        elif kw in ("lora_r", "lora_targets"):
            t = inputs.targets(o.get("lora_targets")) if "lora_targets" in o else inputs.targets(v) \
                if kw == "lora_targets" else None
            if kw == "lora_r":
                peft["r"] = v
            mine = ctx["peft_config"] is not None
            if (not mine or kw == "lora_targets") and (t is not None or mine):
                peft["target_modules"] = list(t) if isinstance(t, tuple) else t
            if ctx["peft_config"] is None and kw == "lora_r":
                new["peft_config"] = True
        elif kw == "load_dtype":
            values["load_dtype"] = _dtype(v)
        elif kw == "attn_implementation":
            values["attn_implementation"] = v
        elif kw == "kbit_recipe":
            notes.append(f"{flag}: no object field: " + (
                "skip prepare_model_for_kbit_training (the other weights stay in their dtype, not fp32); turn on "
                "checkpointing (activation_checkpointing=True) and model.enable_input_require_grads() yourself"
                if v == "lean" else "run prepare_model_for_kbit_training(model)"))
        elif kw in LAUNCH:
            if cli == launch[0]:
                n = o.get("num_gpus", suggestion.changes.get("num-gpus"))
                said = suggestion.changes
                flags = " ".join("--" + c + ("" if said[c] is True else f" {said[c]}") for c in launch)
                notes.append(f"{flags}"
                             f": no object field: launch on {n} GPUs (accelerate launch --num_processes {n}, "
                             "distributed_type: FSDP, fsdp_version: 2"
                             + (", offloading to the CPU" if o.get("cpu_offload") else "") + ")")
        elif kw in ("ckpt_every_n_layers", "checkpoint_offload"):
            field_ = "activation_checkpointing_kwargs" if _has_field(ctx, "activation_checkpointing_kwargs") else \
                "gradient_checkpointing_kwargs"
            now = dict(args.get(field_) or _current(ctx, field_) or {})
            put(field_, {**now, ("every_n_layers" if kw == "ckpt_every_n_layers" else "offload"): v})
        elif kw == "liger_kernel":
            put("use_liger_kernel", bool(v))
        elif kw == "expandable_segments":
            notes.append(f"{flag}: no object field: an environment variable torch reads once, before CUDA starts: "
                         + HOW_TO)
        elif kw == "padding_free" and not sft:
            notes.append(f"{flag}: no object field: a plain Trainer pads its batches; TRL's "
                         f"{SftReader.config_name}(padding_free=True) flattens them (or transformers' "
                         "DataCollatorWithFlattening)")
        elif _has_field(ctx, kw) and (sft or kw != "loss_type"):   # padding_free, loss_type, packing, ...
            put(kw, v)
        else:
            notes.append(f"{flag}: no object field: " + (
                f"{kw} is TRL's {SftReader.config_name}'s, and this is a plain Trainer" if kw == "loss_type" else
                f"{_args_class(ctx).__name__} has no {kw}: the kit's estimate option only"))
    fields_ = {k: d for k, d in ((ctx["name"], args), ("peft_config", peft)) if d}
    if "quantization_config" in new:
        fields_["quantization_config"] = quant if quant is not None else {}
    out = InObjects(fields_, values, notes, "", new)
    out.code = _code(out, ctx, quant)
    return out


def _src(value) -> str:
    return str(value) if isinstance(value, Code) else repr(value)


def _code(mapped: InObjects, ctx, quant) -> str:
    imports, lines = [], []
    kw = lambda fields: ", ".join(f"{k}={_src(v)}" for k, v in fields.items())
    name, f = ctx["name"], mapped.fields

    def made(var, fields, expr, new_from):   # a copy of the user's object with fields changed, or a new one
        if expr is None:
            module, cls = new_from
            imports.append(f"from {module} import {cls}")
            lines.append(f"{var} = {cls}({kw(fields)})")
        else:
            imports.append("import dataclasses")
            lines.append(f"{var} = dataclasses.replace({expr}, {kw(fields)})")

    if name in f:
        made(name, f[name], None if ctx["args"] is None else ctx["expr"], ("transformers", "TrainingArguments"))
    if "peft_config" in f:
        new = mapped.new.get("peft_config")
        made("peft_config", {**f["peft_config"], "task_type": "CAUSAL_LM"} if new else f["peft_config"],
             None if new else ctx["peft_expr"], ("peft", "LoraConfig"))
    if "quantization_config" in f:
        if quant is None:
            lines.append("quantization_config = None")
        else:
            imports.append("from transformers import BitsAndBytesConfig")
            lines.append(f"quantization_config = BitsAndBytesConfig({kw(quant)})")
    for k, v in mapped.values.items():
        where = {"load_dtype": "from_pretrained(..., dtype=load_dtype)",
                 "attn_implementation": "from_pretrained(..., attn_implementation=attn_implementation)",
                 "seq_len": "no object holds it: your rows' length (the note below)"}[k]
        lines.append(f"{k} = {_src(v)}  # {where}")
    if any(isinstance(v, Code) for d in [*f.values(), mapped.values] for v in (d or {}).values()):
        imports.append("import torch")
    if ctx["trainer"] and (set(f) - {"args"} or set(mapped.values) - {"seq_len"}):
        lines.append("# then load the model again with these, and build the Trainer with args=args")
    elif ctx["trainer"] and "args" in f:
        lines.append("# then build the Trainer again with args=args")
    lines += [f"# {n}" for n in mapped.notes]
    return "\n".join(sorted(set(imports), key=imports.index) + lines)
