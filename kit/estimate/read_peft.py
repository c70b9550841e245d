"""Reading peft's ``LoraConfig`` for the estimator: which modules it wraps on a model, matched as peft matches
them, and the shortest ``lora_targets`` that name them. Used by :mod:`kit.estimate.read_model` and
:mod:`kit.estimate.from_objects`.
"""
from __future__ import annotations

import copy

from kit.inputs import ALL_LINEAR, InputError, Refusal

from kit.estimate.inventory import default_targets, lora_matches


# peft's classifier_module_names: what its SEQ_CLS and TOKEN_CLS task types add to modules_to_save
CLASSIFIER_NAMES = ("classifier", "score")
# LoraConfig.task_type -> the kit's task
TASK_TYPES = {"SEQ_CLS": "seq-cls", "TOKEN_CLS": "token-cls"}


def read_task(lora_config, task=None, num_labels=None, cfg=None):
    """(task, num_labels, train_head, {option: (value, where)}) for estimate_from: given, else from the LoraConfig's
    task_type (SEQ_CLS, TOKEN_CLS) and the config's num_labels; the head trains as peft's modules_to_save copy where
    the task type (or modules_to_save) puts it there."""
    kind = str(getattr(getattr(lora_config, "task_type", None), "value", getattr(lora_config, "task_type", None)))
    src = {}
    if task is None:
        task = TASK_TYPES.get(kind, "causal-lm")
        if task != "causal-lm":
            src["task"] = (task, f"LoraConfig.task_type={kind}")
    else:
        src["task"] = (task, "estimate_from(task=...)")
    if task == "causal-lm":
        return task, None, None, src
    labels = num_labels or getattr(cfg, "num_labels", None) or 2
    src["num_labels"] = (labels, "estimate_from(num_labels=...)" if num_labels else "the config's num_labels")
    saved = kind in TASK_TYPES or bool(set(getattr(lora_config, "modules_to_save", None) or ()) & set(CLASSIFIER_NAMES))
    if lora_config is not None:
        src["train_head"] = (saved, "peft's modules_to_save copy of the classifier head (LoraConfig.task_type or "
                             "modules_to_save)" if saved else "LoraConfig has no classifier task_type: the head stays "
                             "frozen")
    return task, labels, saved if lora_config is not None else None, src


def experts_lora_refusal(what: str):
    """The refusal of LoRA on a mixture-of-experts model's fused expert parameters (``LoraConfig.target_parameters``:
    peft 0.21's ``ParamWrapper``), ``what`` saying where it was found."""
    return Refusal(f"{what} puts LoRA on fused parameters (LoraConfig.target_parameters, peft's ParamWrapper), "
                   "which the kit does not replay: each forward folds W + scaling * B @ A into a new full copy of "
                   "the layer's experts, kept for backward, whose grad backward makes in full; estimate LoRA on "
                   "the attention (target_modules), or measure this setup with kit.watch(trainer).")


def read_lora_config(lora_config, info):
    """(r, {module names peft would wrap}, lora_dropout) from a LoraConfig, matched on the model as peft does."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    if not isinstance(lora_config, LoraConfig):
        raise Refusal(f"peft_config is a {type(lora_config).__name__}: the kit models LoRA (a peft LoraConfig).")
    if getattr(lora_config, "target_parameters", None):
        raise experts_lora_refusal(f"LoraConfig(target_parameters={lora_config.target_parameters!r})")
    bad = [k for k in ("lora_bias", "modules_to_save", "rank_pattern", "trainable_token_indices")
           if getattr(lora_config, k, None)]
    if (info.classifier and set(lora_config.modules_to_save or ()) <= set(CLASSIFIER_NAMES)) or \
            info.task == "causal-lm":  # the head's copy; a causal LM's embeddings / head copies (the plan checks them)
        bad = [k for k in bad if k != "modules_to_save"]
    if lora_config.bias != "none" or bad:
        key = (bad or ["bias"])[0]
        raise Refusal(f"LoraConfig.{key}={getattr(lora_config, key)!r} is set, which the kit does not model: it "
                         "models plain LoRA (one r, bias='none'), with modules_to_save copies of a causal LM's "
                         "embeddings and head or of a classifier's head.")
    lora_config = copy.copy(lora_config)
    linear = {l.name for l in info.leaves if l.kind == "linear"}
    if isinstance(lora_config.target_modules, str) and lora_config.target_modules.lower() == ALL_LINEAR:
        lora_config.target_modules = linear - {info.output_head}
    elif lora_config.target_modules is None:
        lora_config.target_modules = set(default_targets(info))
    found = {l.name: check_target_module_exists(lora_config, l.name) for l in info.leaves}
    names = {n for n, hit in found.items() if hit and type(hit).__name__ != "_ExcludedModule"}
    if names - linear:
        raise Refusal(f"LoraConfig.target_modules matches {', '.join(sorted(names - linear)[:3])}, which is not a "
                         "Linear layer: the kit models LoRA on Linear layers only.")
    if not names:
        raise InputError("lora_targets",
                         f"LoraConfig.target_modules={lora_config.target_modules!r} matches no Linear "
                                             "module of this model.")
    return lora_config.r, names, float(lora_config.lora_dropout)


def targets_for(info, names):
    """The shortest lora_targets that make estimate() wrap exactly ``names`` (+ a note when blocks differ)."""
    linear = tuple(l.name for l in info.leaves if l.kind == "linear")
    if names == set(linear) - {info.output_head}:
        return ALL_LINEAR, []
    for key in (lambda name: name.rsplit(".", 1)[-1],
                lambda name: next(l.short for l in info.leaves if l.name == name)):
        short = tuple(sorted({key(n) for n in names}))
        if set(lora_matches(linear, short)) == names:
            return short, []
    blocks = {}   # (a vision-language model's text blocks alone adapted: one set of targets for every block)
    for leaf in (l for l in info.leaves if l.part == "block"):
        blocks.setdefault(leaf.name[:-len(leaf.short)], set()).add((leaf.short, leaf.name in names))
    alike = len({frozenset(v) for v in blocks.values()}) <= 1
    return tuple(sorted(names)), [] if alike else [
        "the LoRA targets differ between blocks: adapter weights, grads and state are exact, activations are "
        "replayed as if every block had them"]
