"""OLMo-2: ``transformers.models.olmo2.modeling_olmo2.Olmo2DecoderLayer`` (and ``Olmo2Model``).

No norm before attention or MLP: the block's input goes straight into q/k/v and into the
MLP's gate/up projections; RMSNorms come after them instead (``post_attention_layernorm``,
``post_feedforward_layernorm``), plus ``q_norm``/``k_norm`` over the whole q and k
projections (nh*hd and kvh*hd wide, before the rotary embeddings). ``Olmo2RMSNorm`` applies
its weight in fp32 and casts after (``(weight * h).to(dtype)``), so it keeps the fp32 h;
the rotary cos/sin stay fp32 and q, k are cast back after them. SwiGLU MLP; ``norm``
before the head.
"""
from __future__ import annotations

from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("Olmo2DecoderLayer",), attention=("Olmo2Attention",), mlp=("Olmo2MLP",),
                      norms=("Olmo2RMSNorm",)),
        final_norm="rms_norm_fp32")
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    q = tp.rms_norm_fp32(tp.linear(x, H, st.nh * st.hd, "self_attn.q_proj"), st.base_trainable, st.nh * st.hd)
    k = tp.rms_norm_fp32(tp.linear(x, H, st.kvh * st.hd, "self_attn.k_proj"), st.base_trainable,
                         st.kvh * st.hd)
    v = tp.linear(x, H, st.kvh * st.hd, "self_attn.v_proj")
    q, k = tp.rope(q, k, x, fp32=True)  # Olmo2RotaryEmbedding keeps cos/sin fp32; q, k cast back
    o = tp.attention(q, k, v, st.nh * st.hd, repeat_kv=True, softmax_fp32=True)
    a = tp.rms_norm_fp32(tp.linear(o, st.nh * st.hd, H, "self_attn.o_proj"), st.base_trainable)
    x = tp.binary(x, a)
    return tp.binary(x, tp.rms_norm_fp32(tp.gated_mlp(x), st.base_trainable))


# peft has no default LoRA targets for OLMo-2: q and v, as peft's default for Llama
register_family("olmo2", block=block, lora_targets=("q_proj", "v_proj"), liger=True)
