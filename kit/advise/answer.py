"""The answer first: the lines that open ``kit.check``, the advisor's text, ``python -m kit estimate|fit`` and the
reports of ``kit.train``: the biggest cause of an estimate (:func:`biggest_cause`) and a suggestion in the user's
own objects, in one line (:func:`in_short`). Prediction only.

>>> from kit.estimate import estimate
>>> biggest_cause(estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128))  # doctest: +ELLIPSIS
'biggest cause: custom_layer, 2,525,916,822 parameters: ... GiB, 99% of weights + grads + optimizer state'
"""
from __future__ import annotations

import dataclasses

from kit.estimate.trl import SftReader
from kit.units import fmt_bytes

ANSWER_LINES = 5     # the answer's lines at most, folded at the page's width
OUTSIZED = 0.5       # a module holding this share of the training state is named as the cause, not a component
SHORT_WIDTH = 140    # characters: a suggestion in two lines at most; later objects are counted past it
FIELDS = 2           # an object's changed fields written in short; the rest are "..." (the details write them)
ENVIRONMENT = {"--expandable-segments": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (before CUDA starts)"}
CLASSES = {"training_args": "TrainingArguments", "sft_config": SftReader.config_name, "args": "TrainingArguments",
           "peft_config": "LoraConfig", "quantization_config": "BitsAndBytesConfig"}


def biggest_cause(est) -> str:
    """The module holding most of the training state (weights, gradients, optimizer state) where one holds at
    least :data:`OUTSIZED` of it and no component at the peak is bigger, else the biggest component at the peak,
    with its share: the cause named is never smaller than a part the breakdown shows.

    >>> from kit.estimate import estimate
    >>> biggest_cause(estimate("tiny-llama", batch_size=8, seq_len=128, device="cpu"))  # doctest: +ELLIPSIS
    'biggest cause: ... of the ... peak (...%)'
    """
    state = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
    offenders = getattr(est, "offenders", None) or []
    parts = est.components()
    top = max(parts, key=parts.get)
    if offenders and state and getattr(est, "num_gpus", 1) == 1:
        name, params, held = offenders[0]
        if held >= OUTSIZED * state and held >= parts[top]:   # never a module smaller than a part beside it
            return (f"biggest cause: {name}, {params:,} parameters: {fmt_bytes(held)}, {held / state:.0%} of weights "
                    "+ grads + optimizer state")
    share = parts[top] / est.peak_bytes if est.peak_bytes else 0
    why = next((n.cause[1] for n in est.notes if getattr(n, "cause", None) and n.cause[0] == top), None)
    return f"biggest cause: {top}, {fmt_bytes(parts[top])} of the {fmt_bytes(est.peak_bytes)} peak ({share:.0%})" + (
        f"; {why}" if why else "")


def classes_of(inputs: dict | None) -> dict:
    """Object name -> the class to name in a suggestion (the user's own: ``SFTConfig`` for an SFTTrainer's args)."""
    out = dict(CLASSES)
    for k, v in (inputs or {}).items():
        if k in CLASSES and v is not None and dataclasses.is_dataclass(v):
            out[k] = type(v).__name__
    return out


def _value(value) -> str:
    return str(value) if type(value).__name__ == "Code" else repr(value)


def in_short(objects, classes: dict | None = None, width: int = SHORT_WIDTH) -> str | None:
    """A suggestion in the user's objects (:class:`kit.advise.mapping.InObjects`), one line: each object's class
    with the fields that change, then ``from_pretrained``'s values; past ``width`` characters the rest is counted
    (``+N more``: the details write them); at most :data:`FIELDS` fields an object. None where no field of an
    object changes.

    >>> from kit.advise.mapping import InObjects
    >>> in_short(InObjects({"sft_config": {"max_length": 512, "optim": "paged_adamw_32bit"}}, {}, [], ""))
    "SFTConfig(max_length=512, optim='paged_adamw_32bit')"
    """
    classes = classes or CLASSES
    parts = [f"{classes.get(k, k)}({', '.join([f'{f}={_value(v)}' for f, v in d.items()][:FIELDS])}"
             f"{', ...' if len(d) > FIELDS else ''})" for k, d in objects.fields.items() if d or objects.new.get(k)]
    parts += [f"from_pretrained({k.replace('load_', '')}={_value(v)})" for k, v in objects.values.items()
              if k in ("load_dtype", "attn_implementation")]
    outside = [n.split(":")[0] for n in objects.notes if ": no object field" in n]   # as apply() finds them
    parts += [ENVIRONMENT[f] for f in outside if f in ENVIRONMENT]
    outside = [f for f in outside if f not in ENVIRONMENT]
    if outside:
        parts.append(f"and outside your objects {', '.join(outside)}")
    if not parts:
        return None
    shown = [parts[0]]
    for p in parts[1:]:
        if len(", ".join(shown + [p])) > width:
            break
        shown.append(p)
    left = len(parts) - len(shown)
    return ", ".join(shown) + (f" +{left} more" if left else "")
