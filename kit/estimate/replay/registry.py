"""The registry of families: it imports every module of this package, so that each family module declares its
family (:func:`~kit.estimate.replay.families.register_family`, once, when imported), and reads what every config
shares besides the shapes.

Ask it, never a family's name: :func:`family` (a ``Setup.family`` key's declaration), :func:`lookup` (a config's
``model_type``), :func:`declared` (all of them). Adding a family is one module beside this one, found here by
itself (see :mod:`kit.estimate.replay`)."""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from kit.estimate.replay.families import Family, NoGradLoop, declared, family, key_of, lookup, register_family

__all__ = ["Family", "NoGradLoop", "register_family", "family", "lookup", "key_of", "declared", "config_shapes"]


def config_shapes(cfg, family_key: str, hd: int) -> dict:
    """The :class:`Setup` fields a config decides besides the shapes (all defaults for Llama): what every family's
    config may set, then the family's own (its declaration's ``config_fields``).

    Partial rotary (``partial_rotary_factor``); sliding-window layers (``layer_types``, or a
    ``sliding_window`` on every layer as Mistral and Phi-3 use it).
    """
    out = {}
    rope = getattr(cfg, "rope_parameters", None) or {}
    factor = rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0
    if factor < 1:
        out["rotary"] = int(hd * factor)
    window, types = getattr(cfg, "sliding_window", None), getattr(cfg, "layer_types", None)
    if window:
        out["window"] = window
        out["sliding"] = sum(t == "sliding_attention" for t in types) if types else cfg.num_hidden_layers
        out["first_sliding"] = types[0] == "sliding_attention" if types else True
        if types and 0 < out["sliding"] < len(types):
            out["sliding_at"] = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    own = family(family_key).config_fields
    return out | own(cfg) if own else out


def _import_family_modules() -> None:
    """Import every module of this package (a module imported already is not run again): each family module
    registers its family as it is imported, in the order of their names."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{module.name}")


_import_family_modules()
