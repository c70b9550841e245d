"""Trainer kinds: each is one registration, the way peft's ``register_peft_method`` makes a method known.

A kind is a key and the classes it is read from (its trainer's class and its config's), found lazily: TRL need not
be imported for the kit to run. Each layer that does something of its own for a kind registers that part under the
kind's key, in that layer's module, so imports still point down: the estimator's reader (``"estimate"``), the watch's
stage hook (``"watch"``), the advisor's levers (``"advise"``). Every face finds a kind by walking the object's class
MRO (:func:`kind_of`), so a user's subclass of a registered trainer is read as that trainer.

>>> class Shout:
...     pass
>>> register_kind("shout", lambda: (Shout,))
>>> register_part("shout", "estimate", "its reader")
>>> class Louder(Shout):
...     pass
>>> kind_of(Louder()), part_of(Louder(), "estimate"), part_of(Louder(), "watch")
('shout', 'its reader', None)
>>> forget_kind("shout")
"""
from __future__ import annotations

import sys
from typing import Callable

LAYERS = ("estimate", "watch", "advise")   # the parts a kind may register, one per layer

# key -> a callable giving the classes the kind is read from (its trainer's and its config's, in any number)
KINDS: dict[str, Callable[[], tuple]] = {}
# (key, layer) -> the kind's part in that layer
PARTS: dict[tuple[str, str], object] = {}


def register_kind(key: str, classes: Callable[[], tuple]) -> None:
    """Make a trainer kind known under ``key``; ``classes()`` gives the classes an object of this kind is an
    instance of (its trainer's and its config's), or ``()`` where their library is not imported."""
    if key in KINDS:
        raise ValueError(f"the trainer kind {key!r} is registered already: each kind registers once")
    KINDS[key] = classes


def register_part(key: str, layer: str, part) -> None:
    """Register the kind ``key``'s part in ``layer`` (one of :data:`LAYERS`)."""
    if layer not in LAYERS:
        raise ValueError(f"a trainer kind's part is one of {', '.join(LAYERS)}, not {layer!r}")
    PARTS[key, layer] = part


def forget_kind(key: str) -> None:
    """Undo :func:`register_kind` and every part registered under ``key`` (a test's kind, once it is done)."""
    KINDS.pop(key, None)
    for layer in LAYERS:
        PARTS.pop((key, layer), None)


def library_classes(module: str, *names: str) -> Callable[[], tuple]:
    """``classes`` for :func:`register_kind`: the named classes of ``module`` where it is imported, else ``()``."""

    def classes() -> tuple:
        library = sys.modules.get(module)
        return tuple(c for c in (getattr(library, n, None) for n in names) if c is not None) if library else ()

    return classes


def kind_of(obj) -> str | None:
    """The key of the kind ``obj`` (a trainer or a config) is, by its class MRO: the most derived registered class
    wins, so a subclass of SFT's trainer is SFT's kind, and SFT's before the plain Trainer it derives from."""
    known = {c: key for key, classes in KINDS.items() for c in classes()}
    return next((known[c] for c in type(obj).__mro__ if c in known), None)


def part_of(obj_or_key, layer: str, default=None):
    """The part in ``layer`` of the kind of ``obj_or_key`` (an object, or a kind's key), else ``default``."""
    key = obj_or_key if isinstance(obj_or_key, str) else kind_of(obj_or_key)
    return PARTS.get((key, layer), default)


def keys() -> tuple:
    """Every registered kind's key, in the order of registration."""
    return tuple(KINDS)
