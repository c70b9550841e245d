"""Mixtral: ``transformers.models.mixtral.modeling_mixtral.MixtralDecoderLayer`` (and ``MixtralModel``).

Llama's attention (:func:`kit.estimate.replay.llama.layer`; a sliding window only decides which layers get a mask),
then ``MixtralSparseMoeBlock``: ``MixtralTopKRouter`` (softmax of the logits made fp32, top-k always renormalized,
the routing weights left fp32) and ``MixtralExperts`` run by grouped_mm (:func:`kit.estimate.replay.moe.sparse_moe`).
Router jitter noise is refused (:func:`kit.estimate.replay.moe.refusal`).
"""
from __future__ import annotations

from kit.estimate.replay import llama
from kit.estimate.replay.moe import LOOP, sparse_moe
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("MixtralDecoderLayer",), attention=("MixtralAttention",),
                      mlp=("MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts"),
                      norms=("MixtralRMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    return llama.layer(tp, x, mlp=sparse_moe)


def config_fields(cfg) -> dict:
    """``MixtralTopKRouter``: the top-k weights always renormalized, and left fp32."""
    return {"norm_topk": True, "weights_fp32": True}


# moe: its experts are replayed (kit.estimate.replay.moe); LOOP: evaluate()'s no_grad forward
register_family("mixtral", block=block, no_grad_loop=LOOP, config_fields=config_fields, moe=True)
