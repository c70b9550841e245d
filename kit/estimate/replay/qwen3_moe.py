"""Qwen3-MoE: ``transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeDecoderLayer`` (and ``Qwen3MoeModel``).

Qwen-3's attention (:mod:`.qwen3`: q/k RMSNorms over each head), then ``Qwen3MoeSparseMoeBlock`` in place of the
dense MLP: the router and the experts of :func:`kit.estimate.replay.moe.sparse_moe`. Every layer is sparse where
``decoder_sparse_step`` is 1 and ``mlp_only_layers`` is empty (the released models); other layouts are refused
(:func:`kit.estimate.replay.moe.refuse`).
"""
from __future__ import annotations

from kit.estimate.replay import llama
from kit.estimate.replay.moe import LOOP, sparse_moe
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("Qwen3MoeDecoderLayer",), attention=("Qwen3MoeAttention",),
                      mlp=("Qwen3MoeSparseMoeBlock", "Qwen3MoeTopKRouter", "Qwen3MoeExperts"),
                      norms=("Qwen3MoeRMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    return llama.layer(tp, x, qk_norm=True, mlp=sparse_moe)


# moe: its experts are replayed (kit.estimate.replay.moe); LOOP: evaluate()'s no_grad forward
register_family("qwen3_moe", block=block, no_grad_loop=LOOP, moe=True)
