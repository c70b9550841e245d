"""Reading what users pass: one small rule per kind of input, one sentence when it is wrong.

Every function takes the control's ``name`` (the keyword the user wrote), returns a plain
Python value (``int``, ``bool``, ``float``, ``str``, ``tuple``), and raises
:class:`InputError`, a ``ValueError`` that names the control, says what was wrong and what
to pass. Users pass numpy integers, whole floats, strings from widgets or the environment
('yes', '10'), comma strings or lists: those are read; anything else is refused, never
guessed (``'no'`` is False, not a truthy string).

>>> whole_number("steps", "10"), flag("padded", "no"), targets("q_proj, v_proj")
(10, False, ('q_proj', 'v_proj'))
>>> whole_number("steps", 0)
Traceback (most recent call last):
...
kit.inputs.InputError: steps must be a whole number >= 1, not 0.
"""
from __future__ import annotations

import math
import numbers
import operator
import re

ALL_LINEAR = "all-linear"  # peft's shortcut: every Linear/Conv1D layer except the output (lm_head)
_TRUE = ("true", "yes", "y", "on", "1")
_FALSE = ("false", "no", "n", "off", "0")


class Refusal(ValueError):
    """The kit's own refusal: a setup or a value it cannot estimate, said in a sentence that names what was found,
    why the kit cannot predict it and what to pass instead. ``estimate``, ``estimate_from`` and ``estimate_trainer``
    raise it (or a subclass: :class:`InputError`, ``UnsupportedModel``, ``OwnHeadError``) and nothing else for what
    they refuse; ``kit.check`` prints it as its answer. Any other exception is a bug, and propagates.

    ``instead`` (optional): the input that would make it estimable, said after the reason.

    >>> e = Refusal("LoRA on a Conv2d is not modeled.", name="lora_targets", instead="target its Linear layers")
    >>> isinstance(e, ValueError), e.name, e.code, str(e)
    (True, 'lora_targets', 'refused', 'LoRA on a Conv2d is not modeled; target its Linear layers.')
    """

    def __init__(self, message: str, *, name: str | None = None, code: str = "refused", instead: str | None = None):
        super().__init__(f"{message.rstrip('.')}; {instead}." if instead else message)   # one sentence
        self.name, self.code, self.why, self.instead = name, code, message, instead


class InputError(Refusal):
    """A value that cannot be read, or a combination refused. ``name`` is the control (keyword) it was passed
    for; ``code`` says which refusal it is, so callers route on it, never on the message's words.

    >>> e = InputError("steps", "steps must be a whole number >= 1, not 0.")
    >>> e.name, e.code
    ('steps', 'invalid')
    """

    def __init__(self, name: str, message: str, code: str = "invalid", *, instead: str | None = None):
        super().__init__(message, name=name, code=code, instead=instead)


class Note(str):
    """A note on an estimate: its text, with the ``field`` it is about and a ``code`` to route on; ``cause``, where
    the note says why a component of the peak is as big as it is: (the component, a short clause the answer's
    "biggest cause" line adds). It is a ``str``, so it prints and serialises as its text.

    >>> n = Note("8-bit AdamW kills the process here", field="optimizer", code="int32-optimizer")
    >>> n, n.code, n.field
    ('8-bit AdamW kills the process here', 'int32-optimizer', 'optimizer')
    """

    def __new__(cls, text: str, *, field: str | None = None, code: str = "note", cause: tuple | None = None):
        self = super().__new__(cls, text)
        self.field, self.code, self.cause = field, code, cause
        return self

    def __reduce__(self):  # copies (the estimate's JSON deep-copies its notes) keep the field, code and cause
        return (_note, (str(self), self.field, self.code, self.cause))


def _note(text, field, code, cause=None):
    return Note(text, field=field, code=code, cause=cause)


def has_note(notes, code: str) -> bool:
    """Whether any of ``notes`` carries ``code``.

    >>> has_note([Note("x", code="a"), "plain text"], "a"), has_note(["plain text"], "a")
    (True, False)
    """
    return any(getattr(n, "code", None) == code for n in notes)


ASSUMED = "-assumed"   # the end of a note's code that says a value the figures rest on was assumed, not given


def assumed(notes) -> list:
    """The notes that say a value was assumed where none was given (their code ends in :data:`ASSUMED`): said
    beside the setup wherever an answer is, since the figures rest on them.

    >>> assumed([Note("1 image a row assumed", code="images-assumed"), Note("x", code="moe-routing"), "text"])
    ['1 image a row assumed']
    """
    return [n for n in notes if str(getattr(n, "code", "")).endswith(ASSUMED)]


def whole_number(name: str, value, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``value`` as an ``int`` within ``[minimum, maximum]`` (either bound may be None).

    Reads ints, numpy integers, whole floats (``8.0``) and digit strings (``"8"``).
    Refuses booleans, fractions, NaN and other text.

    >>> import numpy as np
    >>> whole_number("batch_size", np.int64(4)), whole_number("batch_size", 8.0), whole_number("seed", "0", 0)
    (4, 8, 0)
    >>> whole_number("steps", -1)
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: steps must be a whole number >= 1, not -1.
    >>> whole_number("lora_r", True, minimum=0)
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: lora_r must be a whole number >= 0, not True.
    """
    n = _as_int(value)
    if n is None or (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        bounds = (f"from {minimum} to {maximum}" if minimum is not None and maximum is not None else
                  f">= {minimum}" if minimum is not None else f"<= {maximum}" if maximum is not None else "")
        raise InputError(name, f"{name} must be a whole number{' ' + bounds if bounds else ''}, not {value!r}.")
    return n


def _as_int(value) -> int | None:
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    if isinstance(value, numbers.Integral) or (hasattr(value, "__index__") and not isinstance(value, numbers.Real)):
        try:
            return operator.index(value)
        except TypeError:
            return None
    if isinstance(value, numbers.Real):
        try:
            f = float(value)
        except (TypeError, ValueError):
            return None
        return int(f) if math.isfinite(f) and f.is_integer() else None
    return None


def flag(name: str, value, allow_none: bool = False) -> bool | None:
    """``value`` as a ``bool``: True/False, 1/0, or the strings 'true'/'false', 'yes'/'no',
    'on'/'off', '1'/'0' (any case). ``None`` stays None when ``allow_none`` (the default).

    >>> flag("gradient_checkpointing", "No"), flag("padded", 1), flag("resume", None, allow_none=True)
    (False, True, None)
    >>> flag("padded", "maybe")
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: padded must be True or False (or 'true'/'false', 'yes'/'no', '1'/'0'), not 'maybe'.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        return value
    if type(value).__name__ in ("bool_", "bool"):  # numpy.bool_, torch-free
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if not isinstance(value, str) and _as_int(value) in (0, 1):
        return bool(_as_int(value))
    raise InputError(name, f"{name} must be True or False (or 'true'/'false', 'yes'/'no', '1'/'0'), "
                           f"not {value!r}.")


def fraction(name: str, value, maximum: float = 1.0) -> float:
    """``value`` as a ``float`` from 0 to ``maximum`` (a probability such as a dropout rate).

    >>> fraction("lora_dropout", 0.05), fraction("lora_dropout", "0.1"), fraction("lora_dropout", 0)
    (0.05, 0.1, 0.0)
    >>> fraction("lora_dropout", 5)
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: lora_dropout must be a number from 0 to 1 (0.05 is 5%), not 5.
    """
    f = None
    if not isinstance(value, bool) and type(value).__name__ not in ("bool_", "bool"):
        try:
            f = float(value.strip() if isinstance(value, str) else value) \
                if isinstance(value, (str, numbers.Real)) else None
        except (TypeError, ValueError):
            f = None
    if f is None or not math.isfinite(f) or not 0.0 <= f <= maximum:
        raise InputError(name, f"{name} must be a number from 0 to {maximum:g} (0.05 is 5%), not {value!r}.")
    return f


def choice(name: str, value, options, aliases: dict | None = None) -> str:
    """``value`` as one of ``options`` (any case, surrounding spaces ignored; ``aliases`` maps
    other spellings to an option).

    >>> choice("precision", "BF16", ("fp32", "fp16", "bf16"))
    'bf16'
    >>> choice("optimizer", "adamw_torch", ("adamw", "sgd"), {"adamw_torch": "adamw"})
    'adamw'
    >>> choice("quantization", "3bit", ("none", "8bit", "4bit"))
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: quantization must be one of none, 8bit, 4bit, not '3bit'.
    """
    options, aliases = list(options), dict(aliases or {})
    if isinstance(value, str):
        for spelled in (value, value.strip(), value.strip().lower()):
            if spelled in options:
                return spelled
            if spelled in aliases:
                return aliases[spelled]
    raise InputError(name, f"{name} must be one of {', '.join(map(str, options))}, not {value!r}.")


def targets(value, name: str = "lora_targets"):
    """LoRA target module names as a tuple, ``"all-linear"`` (peft's shortcut), or None (the
    default targets). Reads a comma (or space) separated string or a list of names.

    >>> targets("q_proj,v_proj"), targets(["q_proj", " v_proj"]), targets("ALL-LINEAR"), targets("")
    (('q_proj', 'v_proj'), ('q_proj', 'v_proj'), 'all-linear', None)
    >>> targets([1, 2])                                   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: lora_targets must be module names, as 'q_proj,v_proj' or [...], or 'all-linear', not [1, 2].
    """
    if value is None:
        return None
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        items = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    else:
        items = None
    if items is None:
        raise InputError(name, f"{name} must be module names, as 'q_proj,v_proj' or ['q_proj', 'v_proj'], "
                               f"or '{ALL_LINEAR}', not {value!r}.")
    names = tuple(n for item in items for n in re.split(r"[,\s]+", item) if n)
    if any(n.lower() == ALL_LINEAR for n in names):
        if len(names) > 1:
            others = ", ".join(n for n in names if n.lower() != ALL_LINEAR)
            raise InputError(name, f"{name}: '{ALL_LINEAR}' already means every linear layer but the output "
                                   f"head; pass it alone, not with {others}.")
        return ALL_LINEAR
    return names or None


def byte_count(name: str, value, none_means: str | None = None) -> int | None:
    """``value`` as a positive whole number of bytes: ints, numpy integers, whole floats (``1.5e9``) and digit
    strings; ``None`` stays None where ``none_means`` says what None is. Infinity, NaN, fractions, booleans and
    other text are refused in one sentence.

    >>> import numpy as np
    >>> (byte_count("cap_bytes", np.int64(2**30)), byte_count("cap_bytes", 1.5e9),
    ...  byte_count("cap_bytes", None, "no cap"))
    (1073741824, 1500000000, None)
    >>> byte_count("cap_bytes", float("inf"), "no cap")
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: cap_bytes must be a positive whole number of bytes (or None: no cap), not inf.
    """
    if value is None and none_means is not None:
        return None
    n = _as_int(value)
    if n is None or n < 1:
        also = f" (or None: {none_means})" if none_means is not None else ""
        raise InputError(name, f"{name} must be a positive whole number of bytes{also}, not {value!r}.")
    return n


def training_arguments(name: str, value):
    """``value`` as a ``transformers.TrainingArguments``: one as given; a dict of its keywords built into one
    (``report_to`` defaults to none); anything else refused in one sentence, named ``name``.

    >>> training_arguments("training_args", {"per_device_train_batch_size": 4}).per_device_train_batch_size
    4
    >>> training_arguments("training_args", {"batch_size": 4})            # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: training_args: TrainingArguments takes no keyword 'batch_size' ...
    """
    from transformers import TrainingArguments

    if isinstance(value, TrainingArguments):
        return value
    if isinstance(value, dict):
        try:
            return TrainingArguments(**{"report_to": "none", **value})
        except TypeError as exc:
            bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
            raise InputError(name, f"{name}: TrainingArguments takes no keyword {bad[1] if bad else '?'!r} (did you "
                                   "mean per_device_train_batch_size, gradient_accumulation_steps, ...?): pass "
                                   "TrainingArguments(...) or a dict of its keywords.") from None
        except ValueError as exc:
            raise InputError(name, f"{name}: TrainingArguments refused these keywords: "
                                   f"{' '.join(str(exc).split())[:300]}") from None
    raise InputError(name, f"{name} must be a transformers TrainingArguments (or a dict of its keywords), not "
                           f"{type(value).__name__}.")
