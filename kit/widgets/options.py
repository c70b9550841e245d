"""The panel's options, read the way users write them: ``kit.panel(batch_size=100, lora_r=12, preset="16GiB")``.

Each option is read with :mod:`kit.inputs` and refused in one sentence naming it (an
:class:`kit.inputs.InputError`), never an ipywidgets ``TraitError``, and never changed silently: a value the
panel's list does not offer but can estimate (a LoRA rank of 12, 3 GPUs, a device of 16GiB) joins that list;
a batch size above the slider's 64 stretches the slider.

>>> read("lora_r", "12"), read("num_gpus", 3.0), read("quantization", "4BIT")
(12, 3, '4bit')
>>> read("precision", "fp8")
Traceback (most recent call last):
...
kit.inputs.InputError: precision must be one of fp32, fp16, bf16, not 'fp8'.
"""
from __future__ import annotations

import os

from kit.inputs import InputError

from kit import inputs
from kit.measure.session import session_preset
from kit.presets import ALIASES, PRESETS, Preset, resolve_device
from kit.training_setup import FIELDS

PRESET_CHOICES = [("Colab T4", "colab-t4"), ("L4", "l4"), ("A100 40 GB", "a100-40"), ("A100 80 GB", "a100-80"),
                  ("H100", "h100"), ("this machine", "this")]
SEQ_CAP = 32768                        # a slider over 131072 positions is unusable
LORA_RANKS = (0, 4, 8, 16, 32, 64)
BATCH_MAX = 64     # the batch slider's end, unless the panel is given more
# the panel's choices are the declared setup's (kit.training_setup)
_CHOICES = {k: FIELDS[k].metadata["choices"] for k in ("quantization", "precision", "optimizer", "strategy")}


def this_machine(measured_bytes: int | None = None) -> Preset:
    """The "this machine" preset: this GPU's memory for torch, or (no GPU) the CPU's RAM, with the runtime's own RAM
    measured in this session (``measured_bytes`` where the caller measured it)."""
    return session_preset("this", measured_bytes)


def session_presets(measured_bytes: int) -> dict[str, Preset]:
    """The presets that are the machine this session runs on (the ``cpu`` preset; ``colab-t4`` inside Colab), by
    name, carrying ``measured_bytes`` as the runtime's own RAM (:func:`kit.measure.session.session_preset`)."""
    made = (session_preset(name, measured_bytes) for name in ("cpu", "colab-t4"))
    return {p.name: p for p in made if isinstance(p, Preset)}


def control(kind, label: str, value, **kwargs):
    """One of the panel's controls. ``description_width`` and ``Layout(width)`` mean the same in ipywidgets 7.7
    and 8."""
    import ipywidgets as W

    return kind(value=value, description=label, style={"description_width": "150px"},
                layout=W.Layout(width="440px"), **kwargs)


def read(name: str, value):
    """One panel option as the panel's control takes it, or an :class:`kit.inputs.InputError` naming it."""
    if name in _CHOICES:
        return inputs.choice(name, value, _CHOICES[name], ALIASES if name == "optimizer" else None)
    if name in ("batch_size", "num_gpus", "steps"):
        return inputs.whole_number(name, value)
    if name == "seq_len":
        return inputs.whole_number(name, value, minimum=8)
    if name == "lora_r":
        return inputs.whole_number(name, value, minimum=0)
    if name == "gradient_checkpointing":
        return inputs.flag(name, value)
    if name == "preset":
        return preset_key(value)
    if name == "model":
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            raise InputError("model", f"model must be a shipped name, a Hub id or a config.json path, not "
                                          f"{value!r}.")
        return str(os.fspath(value)).strip()
    if name == "sweep_sizes":
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(inputs.whole_number("sweep_sizes", v) for v in items)
    return value


def preset_key(value) -> str:
    """A preset's name, ``"this"``, or a size the device resolver reads (``"16GiB"``, ``16e9``) as its text.

    >>> preset_key("Colab-T4"), preset_key("16GiB")
    ('colab-t4', '16GiB')
    """
    key = value.strip().lower() if isinstance(value, str) else value
    if key in PRESETS or key == "this":
        return key
    try:
        resolve_device(value)
    except (InputError, ValueError, TypeError):
        raise InputError("preset", f"preset must be one of {', '.join(PRESETS)}, 'this', or a GPU's size in "
                                       f"bytes (16GiB, 16e9), not {value!r}.") from None
    return value.strip() if isinstance(value, str) else str(value)


def read_all(options: dict) -> dict:
    """Every option of ``options`` read (see :func:`read`).

    >>> read_all({"batch_size": "8", "gradient_checkpointing": "no"})
    {'batch_size': 8, 'gradient_checkpointing': False}
    """
    return {k: read(k, v) for k, v in options.items()}


def with_value(options: list, value, label=None) -> list:
    """A Dropdown's ``options`` ((label, value) pairs or values) with ``value`` added where missing, in order.

    >>> with_value([("0 (full fine-tune)", 0), ("4", 4), ("16", 16)], 12)
    [('0 (full fine-tune)', 0), ('4', 4), ('12', 12), ('16', 16)]
    """
    pairs = [o if isinstance(o, tuple) else (str(o), o) for o in options]
    if any(v == value for _, v in pairs):
        return list(options)
    new = (label or str(value), value)
    if all(isinstance(v, (int, float)) for _, v in pairs):
        pairs = sorted(pairs + [new], key=lambda pair: pair[1])
    else:
        pairs.append(new)
    return pairs if any(isinstance(o, tuple) for o in options) else [v for _, v in pairs]
