"""Phi-3: ``transformers.models.phi3.modeling_phi3.Phi3DecoderLayer`` (and ``Phi3Model``).

The Llama block with fused projections: one ``qkv_proj`` sliced into q, k and v, and one
``gate_up_proj`` chunked into gate and up. The slices are views, so what keeps one keeps
the fused output's whole storage: SiLU's input (gate) holds the whole ``gate_up_proj``
output, and so does the up the mul keeps; sdpa's saved v holds the whole ``qkv_proj``
output unless ``repeat_kv`` copied it. The rotary code ends in a ``cat`` (partial rotary
where ``partial_rotary_factor`` < 1), so sdpa's output needs a copy for ``o_proj``. Dropout
(``resid_pdrop``) on both residual branches; ``norm`` before the head.
"""
from __future__ import annotations

from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("Phi3DecoderLayer",), attention=("Phi3Attention",), mlp=("Phi3MLP",),
                      norms=("Phi3RMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    qw, kvw = st.nh * st.hd, st.kvh * st.hd
    qkv = tp.linear(tp.rms_norm(x, st.base_trainable), H, qw + 2 * kvw, "self_attn.qkv_proj")
    q, k, v = tp.split(qkv, (qw, kvw, kvw))
    q, k = tp.rope(q, k, x, cat=True)
    o = tp.attention(q, k, v, qw, repeat_kv=True, softmax_fp32=True)
    x = tp.binary(x, tp.dropout(tp.linear(o, qw, H, "self_attn.o_proj"), st.p_resid))
    m = tp.gated_mlp(tp.rms_norm(x, st.base_trainable), fused=True)
    return tp.binary(x, tp.dropout(m, st.p_resid))


def config_fields(cfg) -> dict:
    """Dropout on both residual branches (``resid_pdrop``)."""
    return {"p_resid": getattr(cfg, "resid_pdrop", 0.0)}


# peft has no default LoRA targets for Phi-3: its fused qkv projection
register_family("phi3", block=block, config_fields=config_fields, lora_targets=("qkv_proj",), liger=True)
