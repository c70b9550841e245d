"""Mixtral: ``transformers.models.mixtral.modeling_mixtral.MixtralDecoderLayer`` (and ``MixtralModel``).

Llama's attention (:func:`kit.estimate.replay.llama.layer`; a sliding window only decides which layers get a mask),
then ``MixtralSparseMoeBlock``: ``MixtralTopKRouter`` (softmax of the logits made fp32, top-k always renormalized,
the routing weights left fp32) and ``MixtralExperts`` run by grouped_mm (:func:`kit.estimate.replay.moe.sparse_moe`).
Router jitter noise is refused (:func:`kit.estimate.replay.moe.refusal`).
"""
from __future__ import annotations

from kit.estimate.replay import llama
from kit.estimate.replay.moe import sparse_moe
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("MixtralDecoderLayer",), attention=("MixtralAttention",),
                      mlp=("MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts"),
                      norms=("MixtralRMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    return llama.layer(tp, x, mlp=sparse_moe)


block.moe = True   # its config's expert counts are replayed, not refused (kit.estimate.inventory.family_of)
block.router_fp32 = True   # MixtralTopKRouter: top-k always renormalized, the weights left fp32 (.moe.config_shapes)
