"""Qwen3.5 (text): ``transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5DecoderLayer`` (and ``Qwen3_5TextModel``).

A hybrid: ``config.layer_types`` says each layer's token mixer, Gated DeltaNet linear attention (``linear_attention``,
three layers in four in the released models) or gated softmax attention (``full_attention``); both are
:mod:`kit.estimate.replay.linear_attention`'s rules. Around the mixer, Llama's pre-norm block with Qwen3.5's RMSNorm
(``output * (1.0 + weight.float())``, in fp32: the tape's "offset" kind, as Gemma's) and the gated MLP; the same
norm before the head. The released checkpoints are ``Qwen3_5ForConditionalGeneration`` (a vision tower beside the
language model): the kit ships and replays their ``text_config``.
"""
from __future__ import annotations

from kit.estimate.replay import linear_attention
from kit.estimate.replay.families import register_family
from kit.estimate.replay.moe import shared_expert_moe
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


def layer(tp: Tape, x, mlp=None):
    """One hybrid layer: its token mixer (``tp.mixer``), then the gated MLP (or ``mlp``: the MoE block)."""
    st = tp.st
    h = tp.rms_norm_offset(x, st.base_trainable)
    if tp.mixer == "linear_attention":
        mixed = linear_attention.gated_delta_net(tp, h)
    else:
        mixed = linear_attention.gated_attention(tp, h, tp.rms_norm_offset)
    x = tp.binary(mixed, x)
    h = tp.rms_norm_offset(x, st.base_trainable)
    return tp.binary(mlp(tp, h) if mlp else tp.gated_mlp(h), x)


@around(covers=Covers(blocks=("Qwen3_5DecoderLayer",), attention=("Qwen3_5Attention", "Qwen3_5GatedDeltaNet"),
                      mlp=("Qwen3_5MLP",), norms=("Qwen3_5RMSNorm", "Qwen3_5RMSNormGated"),
                      layer_types=("full_attention", "linear_attention")),
        final_norm="rms_norm_offset")
def block(tp: Tape, x):
    return layer(tp, x)


@around(covers=Covers(blocks=("Qwen3_5MoeDecoderLayer",),
                      attention=("Qwen3_5MoeAttention", "Qwen3_5MoeGatedDeltaNet"),
                      mlp=("Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeTopKRouter", "Qwen3_5MoeExperts", "Qwen3_5MoeMLP"),
                      norms=("Qwen3_5MoeRMSNorm", "Qwen3_5MoeRMSNormGated"),
                      layer_types=("full_attention", "linear_attention")),
        final_norm="rms_norm_offset")
def moe_block(tp: Tape, x):
    """Qwen3.5-MoE (``Qwen3_5MoeDecoderLayer``): the same layers, every MLP ``Qwen3_5MoeSparseMoeBlock`` (routed
    experts, always renormalized, beside a gated shared expert: :func:`kit.estimate.replay.moe.shared_expert_moe`)."""
    return layer(tp, x, mlp=shared_expert_moe)


def config_fields(cfg) -> dict:
    """What a Qwen3.5 text config decides besides the shapes: its linear-attention layers and their widths."""
    return linear_attention.config_shapes(cfg)


def moe_config_fields(cfg) -> dict:
    """Qwen3.5-MoE's besides: the shared expert's width, and its router (``Qwen3_5MoeTopKRouter``), which always
    renormalizes the top-k weights."""
    return config_fields(cfg) | {"shared_F": cfg.shared_expert_intermediate_size, "norm_topk": True}


register_family("qwen3_5_text", block=block, config_fields=config_fields)
register_family("qwen3_5_moe_text", block=moe_block, config_fields=moe_config_fields, moe=True)
