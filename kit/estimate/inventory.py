"""What a model is made of, for the estimator: its leaves (the modules that own parameters), counted
on the meta device, and which replay family its blocks follow. Cached per model.

>>> info = info_of("tiny-llama")
>>> info.family, len([l for l in info.leaves if l.part == "block"]) > 0
('llama', True)
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, replace
from functools import lru_cache

from kit.estimate.own_head import read_own_head
from kit.estimate.replay import declared, family, key_of, lookup, moe
from kit.inputs import Refusal


@dataclass(frozen=True)
class Leaf:
    name: str
    kind: str            # "linear", "embedding", "norm", "other"
    fin: int
    fout: int
    weight: int          # weight elements this module owns (0 when tied to an earlier one)
    bias: int
    trainable: bool      # as built (scenario 1 freezes the base)
    quantizable: bool    # transformers would swap it for a bnb layer
    part: str            # "embed", "block", "head", "vision" (a vision-language model's tower and connector)
    short: str           # name inside its block ("self_attn.q_proj"), else the full name
    tied: bool = False   # uses a weight owned by an earlier module (GPT-2's lm_head)
    shape: tuple = ()    # the weight's shape, as trained (a factored optimizer state follows it)
    frozen_param: str = ""  # "bias" or "weight": the one of its two parameters frozen while the other trains


@dataclass(frozen=True)
class Info:
    config: object
    family: str
    leaves: tuple
    buffers_bytes: int
    head_layers: tuple               # Linear modules added on top of the LM's logits, in forward order (V->..->V)
    max_positions: int | None
    output_head: str | None = None   # the output embedding's module name ('all-linear' skips it, as peft)
    task: str = "causal-lm"          # the head: "causal-lm", "seq-cls", "token-cls" (kit.training_setup.TASKS)
    num_labels: int = 0              # a classifier head's classes
    classifier: str | None = None    # ... its module's name ("score", "classifier"): peft's modules_to_save copies it
    head_dropout: float = 0.0        # ... the dropout before it (token classification's)
    own_head: object = None          # a head of the user's own on a base model (kit.estimate.own_head.OwnHead)
    vision: object = None            # a vision-language model's whole config (``config`` is its language model's)

    @property
    def vocab_head(self) -> bool:
        """A head on the logits sits on top of the LM (scenario 1's ``Linear(V, V)`` is one)."""
        return bool(self.head_layers)


class UnsupportedModel(Refusal):
    """A model the estimator cannot predict (not a causal LM, or blocks it has no replay for). ``code`` says which
    refusal it is, so callers route on it, never on the message's words; ``name`` is the input it is about.

    >>> e = UnsupportedModel("x (XConfig) is not estimated: ...", code=NO_REPLAY)
    >>> e.name, e.code
    ('model', 'no-replay')
    """

    def __init__(self, message: str, code: str = "unsupported-model", instead: str | None = None):
        super().__init__(message, name="model", code=code, instead=instead)


# The module lists that hold the blocks, by the name before a block's index (their leaves are part "block")
BLOCK_LISTS = ("h", "layers", "layer", "block", "blocks")
# UnsupportedModel's codes for a family taken for no other: a model_type no family registers, layer types its
# family does not replay, blocks that are not its family's classes op for op.
NO_REPLAY, LAYER_TYPES, BLOCKS_DIFFER = "no-replay", "layer-types", "blocks-differ"


# The Llama-style replay reads these; a config without them has blocks of another shape.
_SHAPE_NAMES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# a sentence's end naming the decoders the registry declares (the first seven, in the order registered)
_COVERED = "a GPT-2 or Llama-style decoder ({}, ...)".format(
    ", ".join([t for fam in declared() if not fam.encoder and not fam.moe for t in fam.model_types][:7]))
_MEASURE = "measure it on a real step with kit.watch(trainer) and kit.train(trainer)"
# Modules inside a block that are the tape's op rules as they are, by the package that defines them: torch's layers
# (Linear, Dropout, LayerNorm...), transformers' activations and GPT-2's Conv1D, peft's LoRA layers, bitsandbytes'.
_OP_RULES = ("torch.", "transformers.activations", "transformers.pytorch_utils", "peft.", "bitsandbytes.")


def family_of(cfg) -> str:
    """The replay family of a config: the ``Setup.family`` key its model_type is declared under
    (:func:`kit.estimate.replay.key_of`: the model type itself, or for an alias its family's name), or
    UnsupportedModel in one sentence: no family is taken for another."""

    mt, cls = getattr(cfg, "model_type", None) or "?", type(cfg).__name__
    declared_as = lookup(mt)
    if declared_as is not None and (declared_as.shapes or declared_as.images):   # a config with its own names for
        # the shapes (GPT-2's), or a vision-language model's (its language model's config holds them)
        _refuse_layout(declared_as, cfg)
        return key_of(mt)
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModel(f"{mt} ({cls}) is an encoder-decoder model, not a causal language model: pass "
                               f"{_COVERED}.")
    experts = {k: getattr(cfg, k) for k in _MOE_KEYS if isinstance(getattr(cfg, k, None), int)
               and not isinstance(getattr(cfg, k), bool) and getattr(cfg, k) > 1}
    if experts and getattr(declared_as, "moe", False):   # a mixture-of-experts family with a replay
        refused = moe.refusal(cfg)
        if refused:
            raise UnsupportedModel(f"{mt} ({cls}) {refused}: measure this one on a real step with "
                                   "kit.measure.track.Tracker.")
        return mt
    if experts:
        k, v = next(iter(experts.items()))
        raise UnsupportedModel(f"{mt} ({cls}) is a mixture-of-experts model ({k}={v}) and the estimator replays "
                               f"dense blocks only, so it would undercount the experts' activations: measure this "
                               f"one on a real step with kit.measure.track.Tracker, or pass {_COVERED}.")
    _refuse_layout(declared_as, cfg)
    missing = [a for a in _SHAPE_NAMES if not isinstance(getattr(cfg, a, None), int) or getattr(cfg, a) < 1]
    text = getattr(cfg, "text_config", None)
    if missing and getattr(text, "model_type", None):  # Gemma-3 4B+, Mistral-3, ...: a decoder inside
        raise UnsupportedModel(f"{mt} ({cls}) is a multimodal model, and the estimator replays text decoders "
                               f"only: pass its text_config ({text.model_type}) to estimate the language model "
                               f"without the vision tower, or measure this one on a real step with "
                               f"kit.measure.track.Tracker.")
    if declared_as is None:
        raise UnsupportedModel(f"{mt} ({cls}) is not estimated: no family the kit replays has its blocks"
                               f"{_new_layer_types(cfg)}, and another family's would be a guess: {_MEASURE}, or pass "
                               f"{_COVERED}.", code=NO_REPLAY)
    key, covers = key_of(mt), declared_as.block.covers
    if missing and not declared_as.encoder:   # an encoder's replay reads its config's own names
        raise UnsupportedModel(f"{mt} ({cls}) has no replay in the estimator (its config has no Llama-style "
                               f"{', '.join(missing)}, so its blocks are of another shape): pass {_COVERED}, or "
                               f"measure this one on a real step with kit.measure.track.Tracker.")
    odd = sorted(set(getattr(cfg, "layer_types", None) or ()) - set(covers.layer_types))
    if odd:
        raise UnsupportedModel(f"{mt} ({cls}) is not estimated: its layer_types hold {', '.join(odd)}, which "
                               f"{key}'s replay does not have (it replays "
                               f"{', '.join(covers.layer_types)}): {_MEASURE}.", code=LAYER_TYPES)
    return key


def _refuse_layout(declared_as, cfg) -> None:
    """Refuse a layout of its model type that its family's replay does not have (the family's ``refusal``)."""
    refused = declared_as.refusal(cfg) if declared_as is not None and declared_as.refusal else None
    if refused:
        raise UnsupportedModel(f"{cfg.model_type} ({type(cfg).__name__}) {refused}: measure this one on a real step "
                               "with kit.measure.track.Tracker.")


def _new_layer_types(cfg) -> str:
    """Words on the config's layer types besides softmax attention (Jamba's Mamba layers are linear_attention), or
    "": they say why its blocks are no transformer family's."""
    new = sorted(set(getattr(cfg, "layer_types", None) or ()) - {"full_attention", "sliding_attention"})
    return f" (its layer_types hold {', '.join(new)})" if new else ""


def check_blocks(model, blocks, family: str, what: str) -> None:
    """Refuse, in one sentence, a model whose blocks (the modules at the paths ``blocks``) are not ``family``'s op
    for op: each block must be one of the block classes the family's replay registers (its
    :class:`kit.estimate.replay.setup.Covers`), and each module inside it one of the family's classes or an op rule
    of torch, peft, bitsandbytes or transformers' activations. A layer swapped for one of the user's own, or a
    remote-code class, is refused, never estimated as the family's."""
    covers = lookup(family).block.covers
    for path in sorted(blocks):
        block = model.get_submodule(path)
        odd = {type(block)} if type(block).__qualname__ not in covers.blocks else set()
        odd |= {type(m) for m in block.modules() if not _covered(type(m), covers)}
        if odd:
            names = ", ".join(sorted(f"{t.__name__} ({t.__module__})" for t in odd)[:3])
            raise UnsupportedModel(f"{what} is not estimated: its block {path} holds {names}, which {family}'s "
                                   f"replay does not follow op for op (it follows {', '.join(covers.blocks)}), and "
                                   f"taking them for {family}'s would be a guess: {_MEASURE}.", code=BLOCKS_DIFFER)


def _covered(cls, covers) -> bool:
    if cls.__module__.startswith(_OP_RULES):
        return True
    return cls.__module__.startswith("transformers.models.") and cls.__qualname__ in covers.classes


# An encoder's pooler before its classifier, replayed with the head (kit.estimate.replay.task_heads): BERT's (and
# DeBERTa's ContextPooler), ModernBERT's prediction head, DistilBERT's pre_classifier.
POOLERS = ("pooler.dense", "head.dense", "pre_classifier")


def in_module(name: str, module: str | None) -> bool:
    """Whether the leaf ``name`` is the module ``module`` or inside it."""
    return bool(module) and (name == module or name.startswith(module + "."))


def task_of(model) -> str:
    """The task of a built model, from its class: "seq-cls" (``...ForSequenceClassification``), "token-cls"
    (``...ForTokenClassification``), else "causal-lm"."""
    name = type(model).__name__
    return "seq-cls" if name.endswith("ForSequenceClassification") else \
        "token-cls" if name.endswith("ForTokenClassification") else "causal-lm"


def _classifier(model, leaves, what: str) -> tuple:
    """(its module's name, classes, the dropout before it) of a classifier model's head: the Linear outside the
    blocks that gives ``config.num_labels`` outputs, alone or in a head module with a dense layer before it
    (RoBERTa's ``classifier.dense`` -> ``classifier.out_proj``); the module is the model's attribute that holds it
    (what peft's modules_to_save copies). Anything else there but a known pooler is refused, naming it."""
    import torch.nn as nn

    labels = model.config.num_labels
    heads = [l for l in leaves if l.part == "head" and l.kind == "linear" and not l.name.endswith(POOLERS)]
    last = [l for l in heads if l.fout == labels]
    module = last[0].name.split(".")[0] if len(last) == 1 else None
    if module is None or any(l.name.split(".")[0] != module for l in heads) or len(heads) > 2:
        names = ", ".join(l.name for l in heads) or "none"
        raise UnsupportedModel(f"{what}'s classifier head is not one Linear to its {labels} labels (its Linear "
                               f"layers outside the blocks: {names}), which the estimator does not replay: measure "
                               "this one on a real step with kit.measure.track.Tracker.")
    drop = getattr(model, "dropout", None) or getattr(model, "drop", None) \
        or getattr(getattr(model, module, None), "dropout", None)   # ModernBERT names it drop
    return module, labels, float(drop.p) if isinstance(drop, nn.Dropout) else 0.0


def _check_task(cfg, task: str, what: str) -> None:
    """Refuse an encoder as a causal LM, in one sentence (before a model is built for it), and a config its
    family's declaration refuses (:func:`family_of` says why), before transformers' Auto class is asked for it."""
    declared_as = lookup(getattr(cfg, "model_type", None))
    if declared_as is not None and declared_as.refusal and declared_as.refusal(cfg):
        family_of(cfg)
    if task == "causal-lm" and declared_as is not None and declared_as.encoder:
        raise UnsupportedModel(f"{what} is an encoder, which the estimator replays under a classifier head: pass "
                               "task='seq-cls' (--task seq-cls) or 'token-cls', with num_labels.")


def inventory(model, cfg, own=None) -> Info:
    import torch.nn as nn
    from transformers import PreTrainedModel
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    base, prefix = (model.get_submodule(own.base), own.base + ".") if own else base_lm(model)
    base_cfg = base.config
    family = family_of(base_cfg)
    images = lookup(base_cfg.model_type).images
    what = f"{base_cfg.model_type} ({type(model).__name__})"
    out = model.get_output_embeddings() if isinstance(model, PreTrainedModel) else None
    skip = [prefix + k for k in get_keys_to_not_convert(base)] if hasattr(base, "all_tied_weights_keys") else []
    seen, leaves, blocks = set(), [], set()
    for name, mod in model.named_modules():
        params = list(mod.named_parameters(recurse=False))
        if not params:
            continue
        if not {"weight", "bias"} & dict(params).keys():   # the experts' fused 3-D parameters: one leaf each
            fused = [_fused_leaf(name + "." + pname, p, own) for pname, p in params]
            in_vision = images and set(images.modules) & set(name.split("."))   # (Gemma 3's projection Parameter)
            leaves += [replace(leaf, part="vision") for leaf in fused] if in_vision else fused
            seen.update(id(p) for _, p in params)
            continue
        w = dict(params).get("weight")
        b = dict(params).get("bias")
        tied = w is not None and id(w) in seen
        seen.update(id(p) for _, p in params)
        linear = isinstance(mod, (nn.Linear, Conv1D))  # bnb's Linear4bit/8bitLt are nn.Linear too
        # count from the layer's shape: a 4-bit Params4bit's numel() is the packed, halved size
        fin, fout = (w.shape[0], w.shape[1]) if isinstance(mod, Conv1D) else \
            (mod.in_features, mod.out_features) if linear else (0, 0)
        kind = "linear" if linear else "embedding" if isinstance(mod, nn.Embedding) else \
            "norm" if "norm" in type(mod).__name__.lower() else "other"
        parts = name.split(".")
        idx = next((i for i, p in enumerate(parts) if p.isdigit() and i and parts[i - 1] in BLOCK_LISTS), None)
        # GPT-2's transformer.h.N, Llama's model.layers.N, BERT's encoder.layer.N, T5's encoder.block.N
        part = "vision" if images and set(images.modules) & set(parts) else \
            "block" if idx is not None else "embed" if kind == "embedding" else "head"
        if idx is not None and part == "block":
            blocks.add(".".join(parts[:idx + 1]))
        leaves.append(Leaf(
            name=name, kind=kind, fin=fin, fout=fout,
            weight=0 if tied else fin * fout if linear else (w.numel() if w is not None else 0),
            bias=b.numel() if b is not None else 0, trainable=any(p.requires_grad for _, p in params)
            and not (own and name.endswith(POOLERS)),   # a head of one's own reads the last hidden state: no grad
            # reaches the base's pooler (a head that reads pooler_output is refused by its probe)
            quantizable=linear and name.startswith(prefix) and should_convert_module(name, skip) and name not in skip,
            part=part, short=".".join(parts[idx + 1:]) if idx is not None else name, tied=tied,
            shape=(fout, fin) if linear else tuple(w.shape) if w is not None else (),
            frozen_param=frozen_param(w, b)))
    text_cfg = images.text(base_cfg) if images else base_cfg   # (a vision-language model's language model)
    layers = text_cfg.num_hidden_layers + (getattr(base_cfg, "num_decoder_layers", 0) or 0
                                           if getattr(base_cfg, "is_encoder_decoder", False) else 0)
    if len(blocks) != layers:
        raise UnsupportedModel(f"{what} is not a decoder-only causal LM the estimator can replay (it has "
                               f"{len(blocks)} blocks named like GPT-2's transformer.h.N or Llama's model.layers.N, "
                               f"and its config says {layers}): pass {_COVERED}.")
    check_blocks(model, blocks, family, what)
    task = "seq-cls" if own else task_of(model)
    _check_task(base_cfg, task, what)
    if isinstance(model, PreTrainedModel) and out is None and task == "causal-lm":
        raise UnsupportedModel(f"{what} has no language-model head (get_output_embeddings() is None), so it is "
                               "not a causal LM and has no vocabulary loss to estimate: pass its ...ForCausalLM "
                               "model, its config or a config.json path.")
    head_layers = () if own else _head_on_logits(leaves, prefix, text_cfg.vocab_size, what)
    head_name = next((n for n, m in model.named_modules() if m is out), None) if out is not None else None
    maxpos = getattr(text_cfg, "n_positions", None) or getattr(text_cfg, "max_position_embeddings", None)
    bufs = sum(b.numel() * b.element_size() for b in model.buffers())
    cls = (_own_module(leaves, prefix), own.labels, own.dropout) if own else \
        _classifier(model, leaves, what) if task != "causal-lm" else (None, 0, 0.0)
    return Info(config=text_cfg, family=family, leaves=tuple(leaves), buffers_bytes=bufs, head_layers=head_layers,
                max_positions=maxpos, output_head=head_name, task=task, num_labels=cls[1], classifier=cls[0],
                head_dropout=cls[2],
                own_head=own, vision=base_cfg if images else None)


def frozen_param(weight, bias) -> str:
    """Which of a module's weight and bias is frozen while the other trains ("bias": Muon recipes freeze every 1-D
    parameter, Qwen2's q/k/v biases among them; "weight": BitFit), or "" (both alike, or no bias)."""
    if weight is None or bias is None or weight.requires_grad == bias.requires_grad:
        return ""
    return "weight" if bias.requires_grad else "bias"


def _fused_leaf(name: str, param, own) -> Leaf:
    """A parameter that is neither a module's weight nor its bias: a mixture-of-experts block's fused experts,
    (E, out, in) each (``Qwen3MoeExperts.gate_up_proj``, ``down_proj``), or a vector of a module's own (Qwen3.5's
    ``A_log``, ``dt_bias``). bitsandbytes quantizes only
    ``nn.Linear`` layers, so these stay in the load dtype (and the k-bit recipe casts them to fp32 like the norms);
    peft's ``target_modules`` never adapts them."""
    parts = name.split(".")
    idx = next((i for i, p in enumerate(parts) if p.isdigit() and i and parts[i - 1] in BLOCK_LISTS), None)
    kind = "experts" if param.dim() == 3 else "other"   # (Qwen3.5's Gated DeltaNet A_log and dt_bias: vectors)
    return Leaf(name=name, kind=kind, fin=0, fout=0, weight=param.numel(), bias=0,
                trainable=param.requires_grad and not own, quantizable=False,
                part="head" if idx is None else "block", short=name if idx is None else ".".join(parts[idx + 1:]),
                shape=tuple(param.shape))


def _own_module(leaves, prefix: str) -> str | None:
    """The module of a head of the user's own that holds its last Linear layer (its child of the top module)."""
    linears = [l.name for l in leaves if l.kind == "linear" and not l.name.startswith(prefix)]
    return linears[-1].split(".")[0] if linears else None


def base_lm(model):
    """``(base, prefix)``: the transformers causal LM a module is or holds (the outermost one with an LM
    head), and the prefix of its parameters' names; ``(None, "")`` when there is none.

    >>> from kit.models import build_model
    >>> base_lm(build_model("tiny-gpt2+vocab-head", device="meta"))[1]
    'gpt2.'
    """
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model, ""
    for name, mod in model.named_modules():
        if isinstance(mod, PreTrainedModel) and mod.get_output_embeddings() is not None:
            return mod, name + "."
    return None, ""


def _head_on_logits(leaves, prefix: str, vocab: int, what: str) -> tuple:
    """The Linear layers outside the LM, recognised by their shapes: a chain that takes the logits (in width
    V) and gives logits back (out width V), V->V or V->r->V, in the order the forward runs them. Any other
    layer outside the LM has no place in the replay, so it is refused."""
    outside = [l for l in leaves if prefix and not l.name.startswith(prefix)]
    linears = [l for l in outside if l.kind == "linear"]
    chain = [l for l in linears if l.fin == vocab][:1]
    while chain and chain[-1].fout != vocab:
        nxt = [l for l in linears if l.fin == chain[-1].fout and l not in chain]
        if not nxt:
            break
        chain.append(nxt[0])
    if chain and chain[-1].fout != vocab:
        chain = []
    rest = [l.name for l in outside if l not in chain]
    if rest:
        raise UnsupportedModel(f"{what} adds {', '.join(rest)} on top of its language model, and the estimator "
                               f"replays only layers on the logits (Linear(V, V), or V->r->V, with V = {vocab}): "
                               "measure this one on a real step with kit.measure.track.Tracker, or pass the LM.")
    return tuple(l.name for l in chain)


@lru_cache(maxsize=32)
def _cached(key: str, stamp: str = "", task: str = "causal-lm", labels: int = 2) -> Info:   # stamp: a config.json's
    from kit import models                                                                  # hash (edited: new)

    cfg = models.get_config(key)
    _check_task(cfg, task, f"{cfg.model_type} ({type(cfg).__name__})")
    return inventory(models.build_model(key, device="meta", task=task, num_labels=labels), models.get_config(key))


_CONFIG_CACHE: dict = {}


def _cached_config(key: str, cfg, task: str = "causal-lm", labels: int = 2) -> Info:
    from kit import models

    key = (key, task, labels)
    _check_task(cfg, task, f"{cfg.model_type} ({type(cfg).__name__})")
    if key not in _CONFIG_CACHE:
        if len(_CONFIG_CACHE) > 32:
            _CONFIG_CACHE.clear()
        _CONFIG_CACHE[key] = inventory(models.build_model(cfg, device="meta", task=task, num_labels=labels), cfg)
    return _CONFIG_CACHE[key]


def info_of(model, task: str = "causal-lm", num_labels: int = 2) -> Info:
    """The inventory of a registry name, config path, PretrainedConfig or nn.Module (cached). A name or a config
    is built for ``task`` with ``num_labels``; a module's own class says its task."""
    from transformers import PretrainedConfig

    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, str):
        from kit.model_configs import config_stamp

        return _cached(model, config_stamp(model), task, num_labels)
    if isinstance(model, PretrainedConfig):
        return _cached_config(model.to_json_string() + str(getattr(model, "kit_vocab_head", ""))
                              + str(getattr(model, "_experts_implementation", "")), model, task, num_labels)
    if hasattr(model, "named_modules"):
        held = _READ_ONCE.get()
        if held is None:
            return _module_info(model)
        key = (id(model), task, num_labels)
        if key not in held:
            held[key] = (model, _module_info(model))   # (the model kept alive, so that its id stays its own)
        return held[key][1]
    raise UnsupportedModel(f"model must be a registry name, a config.json path, a PretrainedConfig or an "
                           f"nn.Module, not {type(model).__name__}.")


_READ_ONCE: contextvars.ContextVar = contextvars.ContextVar("modules_read_once", default=None)


@contextlib.contextmanager
def modules_read_once():
    """Within it, :func:`info_of` reads each module once and reuses the reading. A search estimates one model many
    times and the module cannot change while it runs, so walking it at every probe is waste; outside, each estimate
    reads the module as it is then (its user may freeze, unfreeze or wrap it between two calls)."""
    token = _READ_ONCE.set({}) if _READ_ONCE.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _READ_ONCE.reset(token)


def _module_info(model) -> Info:
    """The inventory of a module, read as it is now: a transformers model, or a module of the user's own around one."""
    base, _ = base_lm(model)
    own = read_own_head(model) if base is None else None   # refuses a head it cannot read, naming it
    if own is not None:
        return inventory(model, model.get_submodule(own.base).config, own)
    if base is None:
        raise UnsupportedModel(f"a bare {type(model).__name__} holds no transformers causal LM or classifier, "
                               "so the estimator cannot read its architecture (it replays transformers' blocks).",
                               instead="a transformers model (AutoModelForCausalLM, a classifier, or a module of "
                               "your own holding an AutoModel), its config, a config.json path or a registry name "
                               "is estimated")
    return inventory(model, base.config)


def info_for(options: dict) -> Info:
    """The inventory of estimate() options' model, built for their task (``task``, ``num_labels``)."""
    return info_of(options["model"], options.get("task") or "causal-lm", options.get("num_labels") or 2)


@lru_cache(maxsize=256)
def lora_matches(names: tuple, targets: tuple) -> tuple:
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    regex = len(targets) == 1 and any(c in targets[0] for c in "*|()[\\")   # one pattern: peft full-matches it
    cfg = LoraConfig(target_modules=targets[0] if regex else list(targets))
    return tuple(n for n in names if check_target_module_exists(cfg, n))


def default_targets(info: Info) -> tuple:
    """peft's default LoRA targets for the architecture; where peft has none (Phi-3, OLMo-2), the
    attention projections as ``LoraConfig(target_modules=...)`` must name them (the family's ``lora_targets``)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_defaults

    return tuple(peft_defaults.get(info.config.model_type) or family(info.family).lora_targets or ["q_proj", "v_proj"])
