"""Reading a built model for the estimator: its bitsandbytes layers, peft LoRA adapters, dtypes,
checkpointing, attention and tied weights, and the ``BitsAndBytesConfig`` / ``LoraConfig`` objects
users write. Each reader returns what it read and where from, and refuses in one sentence what the
kit does not model. Used by :mod:`kit.estimate.from_objects`.
"""
from __future__ import annotations

import copy
import sys

from kit.inputs import InputError, Note, Refusal

from kit.estimate.inventory import POOLERS, info_of, task_of
from kit.estimate.offload_options import from_model
from kit.estimate.own_head import own_head_notes, read_own_head
from kit.estimate.read_peft import experts_lora_refusal, targets_for

_DTYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def read_model(model):
    """(what estimate() is given, options, sources, notes) from a built model."""
    import torch.nn as nn
    from transformers import PreTrainedModel

    peft = sys.modules.get("peft")
    if peft and isinstance(model, peft.PeftModel):
        kinds = {str(getattr(c.peft_type, "value", c.peft_type)) for c in model.peft_config.values()}
        if kinds - {"LORA"}:
            raise InputError("peft_config", f"the model carries a peft {', '.join(sorted(kinds - {'LORA'}))} "
                             "adapter, which the kit does not model: it models LoRA.", code="peft-not-lora")
    base = model.get_base_model() if peft and isinstance(model, peft.PeftModel) else model
    if not isinstance(base, nn.Module):
        raise Refusal(f"trainer.model is a {type(base).__name__}, not an nn.Module: the kit reads a causal LM "
                         "built by transformers.")
    cfg = getattr(base, "config", None)
    opts, src, notes = {}, {}, []
    # a head of the user's own on a base model (AutoModel); a SentenceTransformer hands on its base's config
    own = read_own_head(base) if cfg is None or not isinstance(base, PreTrainedModel) else None
    cfg = base.get_submodule(own.base).config if own else cfg
    adapters = _read_adapters(base)
    task = "seq-cls" if own else task_of(base)
    if own:
        notes += own_head_notes(base, own)
        opts.update(task=task, num_labels=own.labels)
        src.update(task=(task, f"{type(base).__name__}'s own head on its {own.base} (pooled logits, read by running "
                               "the head on a stand-in hidden state)"),
                   num_labels=(own.labels, "the width of the head's logits"))
    elif task != "causal-lm":   # the head, from the model's class; its classes from the config
        opts.update(task=task, num_labels=cfg.num_labels)
        src.update(task=(task, f"the model's class ({type(base).__name__})"),
                   num_labels=(cfg.num_labels, "model.config.num_labels"))
    quant, qlayers, qsrc = _read_quant(base, cfg)
    if adapters and not isinstance(base, PreTrainedModel):
        raise Refusal(f"LoRA on a {type(base).__name__} is not modeled: the kit reads LoRA on a transformers "
                         "causal LM (AutoModelForCausalLM).")
    if adapters:  # peft's layers hide the Linear modules: estimate from the base config plus the options
        target = copy.deepcopy(cfg)
        if hasattr(target, "quantization_config"):
            del target.quantization_config
        tied = _tied(base)
        if tied is not None and tied != bool(getattr(target, "tie_word_embeddings", False)):
            target.tie_word_embeddings = tied
        src["model"] = (model_name(model, cfg), f"{type(model).__name__}'s base config (with the options below)")
    else:  # the module itself: what is trainable and what is tied come from it
        target = model
        src["model"] = (model_name(model, cfg), f"the {type(model).__name__} module")
    info = info_of(target, task, getattr(cfg, "num_labels", 2))
    kit_q = {l.name for l in info.leaves if l.quantizable} if quant != "none" else set()
    if kit_q != qlayers:
        odd = sorted(kit_q ^ qlayers)[:3]
        raise Refusal(f"the model's {quant} layers differ from the ones transformers quantizes by default "
                         f"(e.g. {', '.join(odd)}; llm_int8_skip_modules?), which the kit does not model.")
    opts["quantization"], src["quantization"] = quant, (quant, qsrc)
    load, recipe, dsrc, rsrc = _read_dtypes(base, cfg, quant)
    opts["load_dtype"], src["load_dtype"] = load, (load, dsrc)
    if quant != "none":
        opts["kbit_recipe"], src["kbit_recipe"] = recipe, (recipe, rsrc)
    if quant == "4bit":
        q4, q4src = read_4bit(base)
        opts.update(q4)
        src.update(q4src)
    if adapters:
        r, names, dropout, saved, dora = adapters
        if dora:
            opts["use_dora"], src["use_dora"] = True, (True, "the LoRA layers' use_dora (lora_magnitude_vector)")
        if task != "causal-lm":
            opts["train_head"] = bool(saved)
            src["train_head"] = (bool(saved), f"peft's modules_to_save copy of {', '.join(saved)}" if saved else
                                 "the classifier head is frozen (no modules_to_save copy)")
        elif saved:
            opts["modules_to_save"] = tuple(saved)
            src["modules_to_save"] = (tuple(saved), "peft's modules_to_save copies (ModulesToSaveWrapper) that train")
        dts = {dtype_name(p.dtype) for n, p in base.named_parameters() if ".lora_A." in n or ".lora_B." in n}
        if dts not in ({"fp32"}, {"bf16"}):
            raise InputError("adapter_dtype", f"the LoRA adapters are {', '.join(sorted(dts))}; the kit models "
                             "them in fp32 (peft's default) or bf16 (TRL's cast on a quantized model).",
                             code="adapter-dtype")
        opts["adapter_dtype"] = dts.pop()
        src["adapter_dtype"] = (opts["adapter_dtype"], "the LoRA layers' parameter dtype")
        targets, tnote = targets_for(info, names)
        notes += tnote
        opts.update(lora_r=r, lora_targets=targets, lora_dropout=dropout)
        src.update(lora_r=(r, "the LoRA layers' r"), lora_targets=(targets, "the modules peft wrapped"),
                   lora_dropout=(dropout, "the LoRA layers' lora_dropout"))
    # enable_input_require_grads (transformers modeling_utils.py) registers a forward hook on the input
    # embeddings and keeps it as _require_grads_hook(s); with none yet, the estimate's rule decides (Trainer's
    # gradient checkpointing runs it at train(), when it enables checkpointing)
    if getattr(base, "_require_grads_hooks", None) or getattr(base, "_require_grads_hook", None) is not None:
        opts["input_require_grads"] = True
        src["input_require_grads"] = (True, "the model's enable_input_require_grads hook on its input embeddings")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in base.parameters() if p.dtype.is_floating_point)
    src["trainable_params"] = (trainable, "parameters with requires_grad")
    idle = {n: p.numel() for n, p in base.named_parameters() if own and p.requires_grad and
            n.startswith(own.base + ".") and n.rsplit(".", 1)[0].endswith(POOLERS)}
    if idle:   # a head of one's own reads the last hidden state: no gradient reaches the base's pooler
        src["idle_params"] = (sum(idle.values()), f"{', '.join(sorted({n.rsplit('.', 1)[0] for n in idle}))}: "
                              "requires_grad, and no gradient reaches it (the head reads the last hidden state)")
        notes.append(Note(f"{sum(idle.values()):,} of the {trainable:,} parameters with requires_grad (the base's "
                          "pooler) get no gradient: the head reads the last hidden state, so no gradient or "
                          "optimizer state is kept for them", field="trainable_params", code="idle-pooler"))
    if not adapters and 0 < trainable < total and not info.vocab_head:
        notes.append(f"{total - trainable:,} parameters are frozen: their weights, gradients and optimizer state "
                     "are counted as they are, and activations follow which layers train")
    ckpt, csrc, copts, ccsrc = _read_ckpt(model)
    opts["gradient_checkpointing"], src["gradient_checkpointing"] = ckpt, (ckpt, csrc)
    # every_n_layers / offload, as the layers were set
    opts.update(copts)
    src.update(ccsrc)
    reentrant, where = read_reentrant(model) if ckpt else (None, None)
    if reentrant is not None:  # (Trainer's activation_checkpointing turns its own on: see estimate_trainer)
        opts["checkpoint_reentrant"], src["checkpoint_reentrant"] = reentrant, (reentrant, where)
    attn = getattr(cfg, "_attn_implementation", None)
    where = "model.config._attn_implementation" if attn else "assumed: the model's config names none, and sdpa " \
        "is transformers' default"
    attn = attn or "sdpa"
    if attn not in ("sdpa", "eager"):
        raise InputError("attn_implementation", f"config._attn_implementation={attn!r} is not modeled: the "
                                                    "kit replays 'sdpa' and 'eager'; load the model with one of them.")
    opts["attn_implementation"], src["attn_implementation"] = attn, (attn, where)
    src["tied_weights"] = (_tied(base), "get_output_embeddings().weight is get_input_embeddings().weight")
    return target, opts, src, notes


def _read_adapters(base):
    """(r, {module names peft wrapped}, lora_dropout, [modules_to_save copies that train], DoRA) of a model with
    LoRA layers, or None; refuses the rest."""
    peft = sys.modules.get("peft")
    if peft is None:
        return None
    import torch.nn as nn
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [(n, m) for n, m in base.named_modules() if isinstance(m, BaseTunerLayer)]
    if not layers:
        return None
    ranks, drops, names, doras = set(), set(), set(), set()
    for n, m in layers:
        if not isinstance(m, LoraLayer):
            tuner = type(m).__module__.split("peft.tuners.")[-1].split(".")[0].upper()
            how = " (LoraConfig.trainable_token_indices: trained rows of the embeddings)" \
                if tuner == "TRAINABLE_TOKENS" else ""
            raise InputError("peft_config", f"{n} is a peft {tuner} adapter ({type(m).__name__}){how}, which the "
                             "kit does not model: it models LoRA.", code="peft-not-lora")
        if len(m.r) != 1:
            raise Refusal(f"{n} holds {len(m.r)} LoRA adapters ({', '.join(m.r)}); the kit models one: delete "
                             "the others (delete_adapter) or estimate one setup at a time.")
        a = next(iter(m.r))
        doras.add(bool(m.use_dora.get(a)))
        if getattr(m, "lora_bias", {}).get(a):
            raise Refusal(f"{n} has a LoRA bias (LoraConfig(lora_bias=True): a trained bias on lora_B), which "
                             "the kit does not model: estimate it without lora_bias, or measure it with "
                             "kit.watch(trainer).")
        if type(m).__name__ == "ParamWrapper":   # LoraConfig.target_parameters
            raise experts_lora_refusal(n)
        if not isinstance(m.get_base_layer(), nn.Linear) and type(m.get_base_layer()).__name__ != "Conv1D":
            raise Refusal(f"{n} puts LoRA on a {type(m.get_base_layer()).__name__}; the kit models LoRA on "
                             "Linear layers only: leave it out of target_modules.")
        d = m.lora_dropout[a]
        ranks.add(m.r[a])
        drops.add(float(d.p) if isinstance(d, nn.Dropout) else 0.0)
        names.add(n)
    if len(doras) > 1:
        raise Refusal("some LoRA layers use DoRA and some do not; the kit models one kind for all of them.")
    if len(ranks) > 1 or len(drops) > 1:
        raise Refusal(f"the LoRA layers have different ranks {sorted(ranks)} or dropouts {sorted(drops)} "
                         "(rank_pattern?); the kit models one r and one lora_dropout for all of them.")
    extra = [n for n, p in base.named_parameters() if p.requires_grad and not _adapter(n)]
    saved = sorted({n.split(".modules_to_save.")[0] for n in extra if ".modules_to_save." in n})
    head = _classifier_name(base)
    copies = {n for n in saved if _copy_modelled(base, n, head)}
    other = [n for n in extra if n.split(".modules_to_save.")[0] not in copies or ".modules_to_save." not in n]
    if other:
        biases = [n for n in other if n.endswith(".bias")]
        what = f"the classifier head {head}'s modules_to_save copy" if head else \
            "modules_to_save copies of the input embeddings and the output head"
        found = f"biases are trainable (LoraConfig(bias=...)?: {', '.join(biases[:3])}" if len(biases) == len(other) \
            else f"parameters outside the LoRA adapters are trainable ({', '.join(other[:3])}"
        raise Refusal(f"{found}{', ...' if len(other) > 3 else ''}), which the kit does not model with LoRA (it "
                         f"models the adapters and {what}): freeze them, or measure this setup with "
                         "kit.watch(trainer).")
    return ranks.pop(), names, drops.pop(), sorted(copies), doras.pop()


def _adapter(name: str) -> bool:
    """Whether a parameter is a LoRA adapter's: lora_A, lora_B, or DoRA's magnitude vector."""
    return any(part in name for part in (".lora_A.", ".lora_B.", ".lora_magnitude_vector."))


def _copy_modelled(base, name: str, head: str | None) -> bool:
    """Whether peft's modules_to_save copy at ``name`` is one the kit models: a classifier's head, or a causal LM's
    input embeddings or output head."""
    if head:
        return name == head
    import torch.nn as nn

    wrapper = base.get_submodule(name)
    original = getattr(wrapper, "original_module", wrapper)
    try:
        output = base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        output = None
    return isinstance(original, nn.Embedding) or (output is not None and wrapper is output)


def _classifier_name(base) -> str | None:
    """The name of a classifier model's head (its Linear to the labels, peft's modules_to_save), or None."""
    if task_of(base) == "causal-lm":
        return None
    return next((n for n in ("score", "classifier") if hasattr(base, n)), None)


def _read_quant(base, cfg):
    """("none"|"4bit"|"8bit", {names of the bitsandbytes layers}, where it was read)."""
    qc = getattr(cfg, "quantization_config", None)
    if isinstance(qc, dict) and qc.get("quant_method") == "bitsandbytes":
        from transformers import BitsAndBytesConfig

        qc = BitsAndBytesConfig.from_dict(qc)
    if qc is not None:
        read_bnb(qc, "model.config.quantization_config")
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return "none", set(), "no bitsandbytes layer in the model"
    kinds = {}
    for n, m in base.named_modules():
        kind = "4bit" if isinstance(m, bnb.nn.Linear4bit) else "8bit" if isinstance(m, bnb.nn.Linear8bitLt) else None
        if kind:
            kinds[n.removesuffix(".base_layer")] = kind
    if not kinds:
        return "none", set(), "no bitsandbytes layer in the model"
    if len(set(kinds.values())) > 1:
        raise Refusal("the model mixes 4-bit and 8-bit bitsandbytes layers, which the kit does not model.")
    quant = next(iter(kinds.values()))
    kind_name = "Linear4bit" if quant == "4bit" else "Linear8bitLt"
    return quant, set(kinds), f"the model's bitsandbytes {kind_name} layers"


def _read_dtypes(base, cfg, quant):
    """(load_dtype, kbit_recipe, where each was read) from the parameters and the config."""
    from collections import Counter

    floats = Counter()
    bnb = sys.modules.get("bitsandbytes")
    packed = (bnb.nn.Params4bit, bnb.nn.Int8Params) if bnb else ()
    cast = _cast_biases(base, bnb)
    for n, p in base.named_parameters():  # (4-bit weights stored as bf16, bnb_4bit_quant_storage, are packed bytes)
        if p.is_floating_point() and not _adapter(n) and not isinstance(p, packed) \
                and id(p) not in cast:
            floats[dtype_name(p.dtype)] += p.numel()
    if quant == "none":
        load = floats.most_common(1)[0][0] if floats else "fp32"
        mixed = f" (most of them; also {', '.join(d for d in floats if d != load)})" if len(floats) > 1 else ""
        return load, None, f"the model's parameter dtypes{mixed}", None
    load = dtype_name(getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or "fp32")
    where = "model.config.dtype (what from_pretrained loaded)"
    if load == "fp32" or set(floats) == {"fp32"}:
        return load, "standard", where, ("the unquantized parameters are fp32: prepare_model_for_kbit_training "
                                         "upcast them" if load != "fp32" else "the model loaded in fp32")
    if set(floats) == {load}:
        return load, "lean", where, f"the unquantized parameters are still {load}: no fp32 upcast"
    raise Refusal(f"the unquantized parameters mix {', '.join(sorted(floats))}; the kit models them all in the "
                     f"load dtype ({load}) or all in fp32 (prepare_model_for_kbit_training).")


def _cast_biases(base, bnb) -> set:
    """ids of the Linear4bit biases already in their layer's compute dtype: bitsandbytes casts a bias to it in place
    at the layer's first forward (``Linear4bit.forward``, 0.50), so a model read after a step carries them whatever
    its recipe was; their dtype says nothing of the recipe."""
    if bnb is None:
        return set()
    return {id(m.bias) for m in base.modules() if isinstance(m, bnb.nn.Linear4bit) and m.bias is not None
            and m.compute_dtype is not None and m.bias.dtype == m.compute_dtype}


def _read_ckpt(model):
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers < 4.52
        GradientCheckpointingLayer = ()
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    on = [m for m in layers if getattr(m, "gradient_checkpointing", False)]
    copts, csrc = from_model(layers, on)
    on = bool(on) or any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    return on, f"the model's layers (is_gradient_checkpointing {'on' if on else 'off'})", copts, csrc


def _tied(base):
    try:
        inp, out = base.get_input_embeddings(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if inp is None or out is None:
        return None
    # (peft's modules_to_save wrapper answers with its trained copy's weight: the originals say what is tied)
    return getattr(out, "original_module", out).weight is getattr(inp, "original_module", inp).weight


def read_bnb(quant_config, name: str) -> str:
    """"none"|"4bit"|"8bit" from a BitsAndBytesConfig; refuses what the kit does not model."""
    if quant_config is None:
        return "none"
    if type(quant_config).__name__ != "BitsAndBytesConfig":
        raise Refusal(f"{type(quant_config).__name__} is not modeled: the kit models bitsandbytes 4-bit and 8-bit "
                         "(BitsAndBytesConfig).")
    if getattr(quant_config, "llm_int8_skip_modules", None) or \
            getattr(quant_config, "llm_int8_enable_fp32_cpu_offload", False):
        raise Refusal(f"{name}.llm_int8_skip_modules / llm_int8_enable_fp32_cpu_offload are not modeled: the kit "
                         "quantizes the layers transformers quantizes by default, all on the GPU.")
    if quant_config.load_in_4bit:
        bnb_options(quant_config, name)  # refuses what is not modeled
        return "4bit"
    if quant_config.load_in_8bit:
        if getattr(quant_config, "llm_int8_has_fp16_weight", False):
            raise Refusal(f"{name}.llm_int8_has_fp16_weight=True keeps 16-bit weights, which the kit does not "
                             "model: leave it False.")
        return "8bit"
    return "none"


def bnb_options(quant_config, name: str = "BitsAndBytesConfig") -> dict:
    """estimate()'s 4-bit options (quant_type, double_quant, compute_dtype) from a 4-bit BitsAndBytesConfig.

    >>> from transformers import BitsAndBytesConfig
    >>> bnb_options(BitsAndBytesConfig(load_in_4bit=True))      # its defaults: FP4, no double quant, fp32
    {'quant_type': 'fp4', 'double_quant': False, 'compute_dtype': 'fp32'}
    """
    qt = str(quant_config.bnb_4bit_quant_type)
    if qt not in ("nf4", "fp4"):
        raise InputError("quant_type", f"{name}.bnb_4bit_quant_type={qt!r} is not a bitsandbytes 4-bit type: "
                                           "pass 'nf4' or 'fp4'.")
    cd = str(quant_config.bnb_4bit_compute_dtype)
    if cd not in _DTYPE_NAMES:
        raise InputError("compute_dtype", f"{name}.bnb_4bit_compute_dtype={cd} is not modeled: pass "
                                              "torch.float32, torch.float16 or torch.bfloat16.")
    return dict(quant_type=qt, double_quant=bool(quant_config.bnb_4bit_use_double_quant),
                compute_dtype=_DTYPE_NAMES[cd])


def read_4bit(base):
    """(estimate()'s 4-bit options, where each was read) from a model's Linear4bit layers (their quant_state
    and compute_dtype); refuses layers that differ. Empty for a model without them."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return {}, {}
    seen = set()
    for m in base.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            qs = getattr(m.weight, "quant_state", None) or getattr(m, "quant_state", None)
            if qs is None or m.compute_dtype is None:
                raise Refusal("a Linear4bit layer has no quant_state or compute_dtype yet (not quantized, or "
                                 "built by hand): load the model with from_pretrained(quantization_config=...).")
            seen.add((qs.quant_type, bool(qs.nested), dtype_name(m.compute_dtype)))
    if len(seen) > 1:
        raise Refusal(f"the model's 4-bit layers differ ({sorted(seen)}: quant type, double quant, compute "
                         "dtype), which the kit does not model: one BitsAndBytesConfig for all of them.")
    if not seen:
        return {}, {}
    qt, dq, cd = seen.pop()
    opts = dict(quant_type=qt, double_quant=dq, compute_dtype=cd)
    where = dict(quant_type="the Linear4bit layers' quant_state.quant_type", double_quant="the Linear4bit "
                 "layers' quant_state.nested", compute_dtype="the Linear4bit layers' compute_dtype")
    return opts, {k: (v, where[k]) for k, v in opts.items()}


def read_reentrant(model):
    """(reentrant, where) of the checkpointing the model's layers run now: the keywords of their
    ``_gradient_checkpointing_func``; torch's ``checkpoint`` runs reentrant when ``use_reentrant`` is not passed
    (peft's ``prepare_model_for_kbit_training`` passes none). None when no layer is checkpointed."""
    for m in model.modules():
        f = getattr(m, "_gradient_checkpointing_func", None)
        if getattr(m, "gradient_checkpointing", False) is True and f is not None:
            kw = getattr(f, "keywords", None) or {}
            if "use_reentrant" in kw:
                return bool(kw["use_reentrant"]), "the layers' checkpoint function (use_reentrant=" \
                                                  f"{kw['use_reentrant']})"
            return True, "the layers' checkpoint function (no use_reentrant: torch's default, reentrant)"
    return None, None


def trainer_reentrant(args, name: str = "TrainingArguments"):
    """(reentrant, where) of the checkpointing Trainer turns on for ``activation_checkpointing=True``: it passes
    its ``activation_checkpointing_kwargs`` (less every_n_layers / offload), and none makes transformers 5
    pass ``use_reentrant=False``."""
    attr = "activation_checkpointing_kwargs" if getattr(args, "activation_checkpointing_kwargs", None) else \
        "gradient_checkpointing_kwargs"
    kw = {k: v for k, v in (getattr(args, attr, None) or {}).items() if k not in ("every_n_layers", "offload")}
    if not kw:
        return False, f"{name}.{attr} is empty: transformers passes use_reentrant=False"
    if "use_reentrant" in kw:
        return bool(kw["use_reentrant"]), f"{name}.{attr}['use_reentrant']"
    return True, f"{name}.{attr} has no use_reentrant: torch's default, reentrant"


def dtype_name(dtype) -> str:
    name = str(dtype)
    if name not in _DTYPE_NAMES and name not in ("fp32", "fp16", "bf16"):
        raise InputError("load_dtype", f"dtype {name} is not modeled: the kit models fp32, fp16 and bf16 weights.")
    return _DTYPE_NAMES.get(name, name)


def model_name(model, cfg) -> str:
    if isinstance(model, str):
        return model
    return getattr(model, "kit_name", None) or getattr(cfg, "kit_name", None) or \
        getattr(cfg, "_name_or_path", None) or type(model).__name__
