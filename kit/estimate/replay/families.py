"""A model family, declared once: everything the estimator knows of one architecture, in one record.

Each family module (``llama.py``, ``gpt2.py``, ...) ends with one registration, as peft's ``register_peft_method``
registers a tuner::

    register_family("phi3", block=block, lora_targets=("qkv_proj",), config_fields=config_fields, liger=True)

:mod:`.registry` imports every family module, so a declaration is known wherever the registry is. Every other
module asks the registry (:func:`family`, :func:`lookup`, :func:`declared`) for a capability by attribute
(``family(key).no_grad_loop``, ``.liger``, ``.encoder``, ...) and never names a family.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable


@dataclass(frozen=True)
class NoGradLoop:
    """The largest a family's no_grad forward holds inside its blocks (``Trainer.evaluate()``, GRPO's log-prob
    passes: :mod:`kit.estimate.evaluation`): ``bytes(setup, tokens, hidden, mlp)``, the model loop's tensors at its
    largest moment over ``tokens`` positions (``hidden``, ``mlp``: the residual stream's and the MLP's element
    bytes). ``rotary``: the caller adds the rotary cos/sin the model made, which the loop leaves out; ``own_mask``:
    the loop counts the attention mask the model makes itself (the caller adds none)."""

    bytes: Callable
    rotary: bool = False
    own_mask: bool = False


@dataclass(frozen=True)
class ImageModel:
    """A vision-language family's images (:class:`Family`'s ``images``): ``modules``, the names of the modules that
    hold its vision tower and connector (their leaves are the ``"vision"`` part); ``text(cfg)``, the config of its
    language model; ``rows(cfg, per_row, size, splitting)``, the vision tower's rows for a batch row, their side,
    the image size taken (a default for None) and the image tokens they take in the row;
    ``shape(cfg, rows, side, lora=, trains=, connector_trains=)``, the :attr:`Setup.vision` the replay reads;
    ``row_bytes(cfg, rows, side, tokens)``, the bytes its collator adds to a batch row of ``tokens`` tokens
    (pixel values, masks, token types);
    ``from_batch(cfg, image_processor, batch)``, (the image options, what they were read from) of a trainer's
    collated batch and its processor's image processor, refused with an InputError where they do not fit;
    ``fixed_size(cfg)``, the side its processor resizes every image to where no other can be given (None: the
    images' size is the user's)."""

    modules: tuple
    text: Callable
    rows: Callable
    shape: Callable
    row_bytes: Callable
    from_batch: Callable
    fixed_size: Callable | None = None


@dataclass(frozen=True)
class Family:
    """One family's declaration (:func:`register_family`'s keywords).

    ``name``: its key, the first of ``model_types``; ``model_types``: the ``config.model_type`` values it replays,
    each its own ``Setup.family`` key (Llama's module declares Mistral's and Qwen2's, op for op its blocks);
    ``aliases``: model types read as ``name``; ``block``: the block replay, marked by
    :func:`~kit.estimate.replay.setup.around` (the classes it covers, what the model does outside its blocks).
    ``shapes(cfg)``: the :class:`~kit.estimate.replay.setup.Setup` shapes (H, F, nh, kvh, hd, L, dropouts) of a
    config that names them its own way (GPT-2's ``n_embd``, ...), in place of the Llama-style names;
    ``config_fields(cfg)``: the Setup fields its config decides besides the shapes (dropouts, soft-caps, ...).
    ``lora_targets``: LoRA targets where peft has no default. ``no_grad_loop``: its :class:`NoGradLoop`, where
    known. ``liger``: Liger's kernels for its model types are modeled (:mod:`.liger`). ``positional_mask``: its
    blocks take the attention mask as a positional argument (checkpoint offload copies it: :mod:`.offload`).
    ``dropout_modules``: the config fields whose dropout the model applies with ``nn.Dropout`` modules (TRL's
    ``disable_dropout`` zeroes those, while the replay reads the config: refused). ``task_head(tp, h)``: an
    encoder's classifier head (:mod:`.task_heads`; None: a decoder's ``score``).
    ``refusal(cfg)``: words on a config of this model type the replay does not model (the estimate is refused),
    or None. ``notes(cfg)``: what an estimate says of this family. ``moe``: its config's expert counts are
    replayed (:mod:`.moe`), not refused. ``weights_notes(info, load_dtype)``: what an estimate says of how its
    weights are taken (gpt-oss's MXFP4 experts, dequantized); ``weights_assumed(load_dtype)``: the same in the few
    words the verdict's line adds. ``frozen_norms``: its block replays its norms by ``Setup.norms_train``, so a full
    fine-tune whose trained blocks all have their norms frozen (and their other weights trained) is replayed.
    ``whole(setup)``: the replay of the whole forward, for a model that is not one stack of blocks (an
    encoder-decoder), in place of :func:`kit.estimate.replay.core.replay`'s; its Replay carries its parts and walks
    its own moments. ``images``: a vision-language model's :class:`ImageModel`, or None."""

    name: str
    block: Callable
    model_types: tuple = ()
    aliases: tuple = ()
    shapes: Callable | None = None
    config_fields: Callable | None = None
    lora_targets: tuple = ()
    no_grad_loop: NoGradLoop | None = None
    liger: bool = False
    positional_mask: bool = False
    dropout_modules: tuple = ()
    task_head: Callable | None = None
    refusal: Callable | None = None
    notes: Callable | None = None
    moe: bool = False
    weights_notes: Callable | None = None
    weights_assumed: Callable | None = None
    frozen_norms: bool = False
    whole: Callable | None = None
    images: ImageModel | None = None

    @property
    def encoder(self) -> bool:
        """An encoder: replayed under a classifier head of its own, never as a causal LM."""
        return self.task_head is not None


_DECLARED: dict = {}    # model type (or alias) -> its Family, in the order the family modules registered


def register_family(name: str, **declaration) -> Family:
    """Declare a family once (see :class:`Family` for the keywords); each family module calls it once. A model type
    two families claim is refused at import, so no family is taken for another by accident."""
    fam = Family(name=name, **declaration)
    fam = fam if fam.model_types else replace(fam, model_types=(name,))
    taken = [key for key in fam.model_types + fam.aliases if key in _DECLARED]
    if taken:
        raise ValueError(f"model type {taken[0]!r} is declared twice: by {_DECLARED[taken[0]].name} and by {name}")
    _DECLARED.update(dict.fromkeys(fam.model_types + fam.aliases, fam))
    return fam


def lookup(model_type) -> Family | None:
    """The family that replays ``model_type`` (one of its model types or aliases), or None."""
    return _DECLARED.get(model_type)


def family(key: str) -> Family:
    """The family of a ``Setup.family`` key (a model type it declares)."""
    return _DECLARED[key]


def key_of(model_type: str) -> str:
    """The ``Setup.family`` key of a declared model type: itself, or for an alias the family's name."""
    fam = _DECLARED[model_type]
    return fam.name if model_type in fam.aliases else model_type


def declared() -> tuple:
    """Every family, once each, in the order registered."""
    return tuple(dict.fromkeys(_DECLARED.values()))
