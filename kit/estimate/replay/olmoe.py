"""OLMoE: ``transformers.models.olmoe.modeling_olmoe.OlmoeDecoderLayer`` (and ``OlmoeModel``).

Pre-norm like Llama, with ``q_norm``/``k_norm`` RMSNorms over the whole q and k projections (nh*hd and kvh*hd
wide, applying their weight as Llama's does), then ``OlmoeSparseMoeBlock``: the router and grouped_mm experts of
:func:`kit.estimate.replay.moe.sparse_moe`. ``clip_qkv`` (in-place clamps) is refused
(:func:`kit.estimate.replay.moe.refusal`).
"""
from __future__ import annotations

from kit.estimate.replay import llama
from kit.estimate.replay.moe import LOOP, sparse_moe
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("OlmoeDecoderLayer",), attention=("OlmoeAttention",),
                      mlp=("OlmoeSparseMoeBlock", "OlmoeTopKRouter", "OlmoeExperts"),
                      norms=("OlmoeRMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    return llama.layer(tp, x, qk_norm=True, mlp=sparse_moe, qk_norm_whole=True)


# moe: its experts are replayed (kit.estimate.replay.moe); LOOP: evaluate()'s no_grad forward
register_family("olmoe", block=block, no_grad_loop=LOOP, moe=True)
