"""bitsandbytes weights in a training step: the 4-bit variants users write, and what each format
keeps beyond its stored bytes. Pure arithmetic, read off the library code (bitsandbytes 0.50.2,
torch 2.13, transformers 5.25, peft 0.22; paths under site-packages):

- **4-bit** (``Linear4bit.forward``, bitsandbytes/nn/modules.py:609-637) casts its input to
  ``compute_dtype`` (:628) and its bias too, in place (:634), and casts the product back to the
  input's dtype (:637). ``MatMul4Bit`` keeps only the packed weight (autograd/_functions.py:358);
  its backward dequantizes it in ``quant_state.dtype`` (the dtype it was loaded in) and casts that
  to the grad's dtype, the compute dtype (:384): one weight's ``n * (load + compute)`` bytes at once
  when the two differ. NF4 and FP4 store the same bytes (:func:`kit.presets.nf4_bytes`); double
  quant stores each block's absmax in 1 byte instead of 4.
- **8-bit** keeps its input ``A`` for A's grad as a *ctx attribute*, not through
  ``save_for_backward``: ``ctx.tensors = (CAt, subA, A)`` in ``MatMul8bitLt`` (CUDA,
  autograd/_functions.py:187) and ``ctx.A = A`` in ``MatMul8bitFp`` (what ``matmul`` picks for a
  training CPU/XPU layer, :403; kept at :269). The engine frees a node's saved tensors once it has
  run, but a ctx attribute lives as long as the graph, which the loss holds till backward ends: so
  each 8-bit layer's input stays alive from its forward to the end of backward. Non-reentrant
  checkpointing (torch/utils/checkpoint.py ``_checkpoint_hook``, :1153) drops only saved tensors, so it
  keeps them too; reentrant checkpointing runs the forward without a graph (none kept), then each
  block's backward on a graph of its own, which holds its inputs and its recomputed output till that
  block's backward ends. transformers 5 checkpoints non-reentrant when given no keywords
  (``_activation_checkpointing_enable``: ``{"use_reentrant": False}``, transformers/modeling_utils.py
  :3159; ``gradient_checkpointing_enable`` before 5.23 alike), which is what
  ``TrainingArguments(activation_checkpointing=True)`` turns on. ``prepare_model_for_kbit_training``'s own
  checkpointing depends on peft's version (:func:`recipe_reentrant`): reentrant before 0.22, non-reentrant since. The
  backward makes ``CB.to(A.dtype, copy=True)`` (autograd/_functions.py:237, :292): one weight in
  the input's dtype. On CUDA ``A``'s outlier columns (``subA``, llm_int8_threshold 6.0) are kept
  too: they depend on the values, a few columns, and are not counted.

>>> from kit.training_setup import read
>>> given = dict(batch_size=1, seq_len=8, quant_type="FP4", double_quant=False, compute_dtype="float32")
>>> options(read({**given, "quantization": "4bit"})).setup("4bit", False, False)
{'quant_type': 'fp4', 'double_quant': False, 'compute_dtype': 'fp32'}
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata

from packaging.version import Version

from kit.inputs import InputError

from kit.presets import DTYPES, int8_bytes, nf4_bytes
from kit.training_setup import DEFAULTS as SETUP_DEFAULTS
from kit.units import fmt_bytes



@dataclass(frozen=True)
class Bnb:
    """The bitsandbytes options of one estimate (see :func:`options`)."""

    quant_type: str = "nf4"
    double_quant: bool = True
    compute_dtype: str = "bf16"
    reentrant: bool | None = None   # None: as the checkpointing's origin implies (see reentrant_for)

    def reentrant_for(self, given_ckpt, std: bool) -> bool:
        """Does the checkpointing run reentrant? ``given_ckpt``: estimate()'s gradient_checkpointing
        as given (None: the model's default). Unless set, the k-bit recipe's own checkpointing
        (``prepare_model_for_kbit_training``) runs as the installed peft makes it (:func:`recipe_reentrant`);
        an explicit one is Trainer's, non-reentrant."""
        return self.reentrant if self.reentrant is not None else (given_ckpt is None and std and recipe_reentrant())

    def setup(self, quant: str, ckpt: bool, reentrant: bool) -> dict:
        """The keys this adds to ``Estimate.setup``: the 4-bit options with 4-bit weights; the
        checkpointing's kind where it can be reentrant (the k-bit recipe's, or one asked for)."""
        out = dict(quant_type=self.quant_type, double_quant=self.double_quant,
                   compute_dtype=self.compute_dtype) if quant == "4bit" else {}
        if ckpt and (quant != "none" or self.reentrant is not None):
            out["checkpoint_reentrant"] = reentrant
        return out


@functools.cache
def recipe_reentrant() -> bool:
    """Whether ``prepare_model_for_kbit_training``'s own checkpointing runs reentrant with the installed peft.

    peft before 0.22 passes ``gradient_checkpointing_kwargs={}`` to ``gradient_checkpointing_enable``
    (peft/utils/other.py of 0.20 and 0.21), so torch's ``checkpoint`` runs with no ``use_reentrant``: its
    default, reentrant (torch/utils/checkpoint.py:486-496). peft 0.22 passes ``None``, to
    ``activation_checkpointing_enable(activation_checkpointing_kwargs=None)`` where transformers has it (5.23 on)
    and to ``gradient_checkpointing_enable(gradient_checkpointing_kwargs=None)`` before; every transformers 5
    (the kit's floor) turns ``None`` into ``{"use_reentrant": False}`` (``_activation_checkpointing_enable``,
    transformers/modeling_utils.py:3159 in 5.25; ``gradient_checkpointing_enable`` in 5.0 and 5.15), so it is
    non-reentrant. transformers turns on the input embeddings' grad for an input_ids model either way.
    """
    return Version(metadata.version("peft")) < Version("0.22")


def options(read: dict) -> Bnb:
    """The bitsandbytes options of estimate()'s options as :func:`kit.training_setup.read` read them; the 4-bit ones
    must stay at their defaults (the kit's 4bit: the QLoRA recipe) without 4-bit weights.

    >>> from kit.training_setup import read
    >>> options(read({"batch_size": 1, "seq_len": 8, "quantization": "8bit", "quant_type": "fp4"}))
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: quant_type applies to 4-bit weights: set quantization='4bit', or leave quant_type out.
    """
    got = {k: read[k] for k in ("quant_type", "double_quant", "compute_dtype")}
    if read["quantization"] != "4bit":
        for k, v in got.items():
            if v != SETUP_DEFAULTS[k]:
                raise InputError(k, f"{k} applies to 4-bit weights: set quantization='4bit', or leave {k} out.")
    return Bnb(**got, reentrant=read["checkpoint_reentrant"])


def weight_bytes(leaf, quant: str, bnb: Bnb, other: int) -> int | None:
    """Bytes of a quantizable layer's weight and bias as trained (None: the layer is not quantized).

    A 4-bit layer's bias ends in the compute dtype (``Linear4bit.forward`` casts it in place); an
    8-bit one's in the input's, which is ``other`` (the dtype of the unquantized parameters).
    """
    if quant == "4bit":
        return nf4_bytes(leaf.weight, double_quant=bnb.double_quant) + leaf.bias * DTYPES[bnb.compute_dtype]
    if quant == "8bit":
        return int8_bytes(leaf.fin, leaf.fout) + leaf.bias * other
    return None


def dequant_bytes(bnb: Bnb, load: str) -> int:
    """Bytes per weight element of a 4-bit layer's backward temporaries: the weight dequantized in the
    load dtype (``quant_state.dtype``), then cast to the compute dtype (the grad's) when they differ.
    The replay adds them at that layer's backward (:meth:`kit.estimate.replay.tape.Tape.linear`), where an 8-bit
    layer's are ``CB.to(x.dtype)``: one weight in its input's dtype, and the row scales / 127.

    >>> dequant_bytes(Bnb(), "bf16"), dequant_bytes(Bnb(compute_dtype="fp32"), "bf16")
    (2, 6)
    """
    return DTYPES[load] + (DTYPES[bnb.compute_dtype] if bnb.compute_dtype != load else 0)


def notes(replay) -> list:
    """What the estimate says about the formats: the 8-bit inputs that checkpointing keeps."""

    if not (replay.ckpt and replay.kept()):
        return []
    return [f"8-bit layers keep their inputs through non-reentrant checkpointing (bitsandbytes holds them as ctx "
            f"attributes, not saved tensors): {fmt_bytes(replay.kept())} of activations that checkpointing does "
            f"not free ({_reentrant_hint()})"]


def recipe_checkpointing() -> tuple:
    """(reentrant, why) of ``prepare_model_for_kbit_training``'s own checkpointing with the installed peft."""
    with_peft = f"prepare_model_for_kbit_training with peft {metadata.version('peft')}"
    if recipe_reentrant():
        return True, f"{with_peft} passes no use_reentrant: torch's default, reentrant"
    return False, f"{with_peft} passes none: transformers' default, use_reentrant=False"


def _reentrant_hint() -> str:
    """Where reentrant checkpointing (which keeps no 8-bit input) comes from with the installed peft."""
    if recipe_reentrant():
        return "prepare_model_for_kbit_training's own reentrant checkpointing keeps none: checkpoint_reentrant=True"
    return ("reentrant checkpointing keeps none: checkpoint_reentrant=True; prepare_model_for_kbit_training's own is "
            f"non-reentrant with peft {metadata.version('peft')}")
