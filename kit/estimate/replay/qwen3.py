"""Qwen-3: ``transformers.models.qwen3.modeling_qwen3.Qwen3DecoderLayer`` (and ``Qwen3Model``).

The Llama block (:func:`kit.estimate.replay.llama.layer`) with ``q_norm``/``k_norm``: an RMSNorm
over each head's hd of q and of k, after their projections and before the rotary
embeddings. Each keeps its fp32 input, rsqrt's output and (for its weight's grad) the
normalized q or k.
"""
from __future__ import annotations

from kit.estimate.replay import llama
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("Qwen3DecoderLayer",), attention=("Qwen3Attention",), mlp=("Qwen3MLP",),
                      norms=("Qwen3RMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    return llama.layer(tp, x, qk_norm=True)


# Llama's model loop, op for op
register_family("qwen3", block=block, no_grad_loop=llama.LOOP, liger=True, frozen_norms=True)
