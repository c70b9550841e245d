"""The panel's image controls: a vision-language model's images per row, their size and whether its processor
splits them (the training setup's ``images_per_row``, ``image_size`` and ``image_splitting``).

They show only while the model is a vision-language one (its family declares images): a text model has no images,
and the estimate refuses image options for it. Their first values are the family's defaults (one image a row, the
size its processor resizes to, splitting as its processor does), so the verdict is the one ``kit fit`` gives with
no image options, without the notes saying that they were assumed.

>>> is_vision_language("tiny-smolvlm"), is_vision_language("tiny-gpt2")
(True, False)
>>> defaults("HuggingFaceTB/SmolVLM-Instruct")
(1, 1536, True)
"""
from __future__ import annotations

import functools

from kit import models as kmodels
from kit.estimate.replay import lookup
from kit.training_setup import FIELDS

KEYS = ("images_per_row", "image_size", "image_splitting")
PER_ROW_MAX = 8
SIZE_MIN, SIZE_STEP, SIZE_MAX = 64, 32, 4096
TEXT_TOKENS = 64   # the text a row holds beside its image tokens, where the panel makes room for them


@functools.lru_cache(maxsize=64)
def _declared(model: str):
    """(the model's config, its family's images declaration) or (its config, None) for a text model."""
    cfg = kmodels.get_config(model.removesuffix(kmodels.VOCAB_HEAD))
    family = lookup(cfg.model_type)
    return cfg, None if family is None else family.images


def is_vision_language(model: str) -> bool:
    """Whether ``model``'s family declares images (a vision tower the estimate replays)."""
    return _declared(model)[1] is not None


def defaults(model: str) -> tuple:
    """(images per row, the image size, splitting) the estimate assumes for ``model`` when none is given."""
    cfg, images = _declared(model)
    splitting = FIELDS["image_splitting"].default
    return 1, images.rows(cfg, 1, None, splitting)[2], splitting


def image_controls(control) -> dict:
    """The three controls, hidden until :func:`adjust` shows them for a vision-language model."""
    import ipywidgets as W

    return {"images_per_row": control(W.IntSlider, "images per row", 1, min=1, max=PER_ROW_MAX),
            "image_size": control(W.IntSlider, "image size (px)", SIZE_MIN, min=SIZE_MIN, max=SIZE_MAX,
                                  step=SIZE_STEP),
            "image_splitting": control(W.Checkbox, "split images into crops", FIELDS["image_splitting"].default)}


def adjust(controls: dict, rows: dict, why: dict, model: str, shown_for: list) -> None:
    """Show the image rows for a vision-language ``model`` and hide them otherwise; a model newly shown starts at
    its family's defaults (``shown_for`` holds the model they were last set for)."""
    vision = is_vision_language(model)
    for k in KEYS:
        rows[k].layout.display = None if vision else "none"
    if not vision:
        return
    per_row, size, splitting = defaults(model)
    rows["image_splitting"].layout.display = None if splits(model, size) else "none"
    fixed = _declared(model)[1].fixed_size is not None
    controls["image_size"].disabled = fixed
    why["image_size"] = (f"fixed at {size:,} px: the processor resizes every image to its vision tower's size"
                         if fixed else f"the images' side in pixels (the processor's default: {size:,})")
    if shown_for[:1] == [model]:
        return
    shown_for[:] = [model]
    controls["images_per_row"].value = per_row
    controls["image_size"].max = max(SIZE_MAX, size)
    controls["image_size"].value = size
    controls["image_splitting"].value = splitting
    make_room(controls["seq_len"], why, image_tokens(model, per_row, size, splitting))


def refusal(model: str, size: int, splitting: bool) -> str | None:
    """The family's refusal of images of ``size`` px, split or not, on ``model`` (a processor that resizes every
    image to one size, or splits none), or None where it takes them."""
    from kit.inputs import InputError

    cfg, images = _declared(model)
    try:
        images.rows(cfg, 1, size, splitting)
    except InputError as refused:
        return str(refused)
    return None


def splits(model: str, size: int) -> bool:
    """Whether ``model``'s processor can split images of ``size`` px into crops (splitting changes their tokens); a
    processor that splits none (the estimate refuses the choice, or it changes nothing) gets no splitting control."""
    if refusal(model, size, True) or refusal(model, size, False):
        return False
    return image_tokens(model, 1, size, True) != image_tokens(model, 1, size, False)


def image_tokens(model: str, per_row: int, size: int, splitting: bool) -> int:
    """The image tokens ``per_row`` images of ``size`` px take in a row of ``model`` (its family's count)."""
    cfg, images = _declared(model)
    return images.rows(cfg, per_row, size, splitting)[3]


def make_room(seq_len, why: dict, tokens: int) -> None:
    """Raise the sequence length slider to hold ``tokens`` image tokens and a short text beside them, where it
    holds fewer, saying so beside it (never silently)."""
    if seq_len.value > tokens:
        return
    seq_len.value = min(seq_len.max, -(-(tokens + TEXT_TOKENS) // seq_len.step) * seq_len.step)
    why["seq_len"] = f"raised to {seq_len.value:,} to hold the row's {tokens:,} image tokens; " + why.get("seq_len", "")


def options(controls: dict, model: str) -> dict:
    """The image options the estimate takes from the controls: none for a text model."""
    return {k: controls[k].value for k in KEYS} if is_vision_language(model) else {}
