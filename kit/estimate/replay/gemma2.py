"""Gemma-2: ``transformers.models.gemma2.modeling_gemma2.Gemma2DecoderLayer`` (and ``Gemma2Model``,
``Gemma2ForCausalLM``).

Four RMSNorms a block: ``input_layernorm`` and ``pre_feedforward_layernorm`` before
attention and MLP, ``post_attention_layernorm`` and ``post_feedforward_layernorm`` on
their outputs, before each residual add. ``Gemma2RMSNorm`` scales by ``1 + weight`` in fp32
(``rms_norm_offset``). GeGLU MLP (``gelu_pytorch_tanh``, which keeps its input like SiLU).
The embeddings are multiplied by sqrt(hidden); the attention scores are soft-capped
(``attn_logit_softcapping``: sdpa cannot, so the model runs eager whatever is asked) and
so are the final logits (``final_logit_softcapping``, in :func:`kit.estimate.replay.core.replay`).
"""
from __future__ import annotations

from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


def layer(tp: Tape, x, qk_norm: bool = False):
    """One Gemma decoder layer; ``qk_norm``: Gemma-3's ``q_norm``/``k_norm`` over each head."""
    st, H, norm = tp.st, tp.st.H, tp.rms_norm_offset
    h = norm(x, st.base_trainable)
    q = tp.linear(h, H, st.nh * st.hd, "self_attn.q_proj")
    k = tp.linear(h, H, st.kvh * st.hd, "self_attn.k_proj")
    v = tp.linear(h, H, st.kvh * st.hd, "self_attn.v_proj")
    if qk_norm:
        q, k = norm(q, st.base_trainable, st.hd), norm(k, st.base_trainable, st.hd)
    q, k = tp.rope(q, k, x)
    o = tp.attention(q, k, v, st.nh * st.hd, repeat_kv=True, softmax_fp32=True)
    x = tp.binary(x, norm(tp.linear(o, st.nh * st.hd, H, "self_attn.o_proj"), st.base_trainable))
    m = tp.gated_mlp(norm(x, st.base_trainable))
    return tp.binary(x, norm(m, st.base_trainable))


@around(covers=Covers(blocks=("Gemma2DecoderLayer",), attention=("Gemma2Attention",), mlp=("Gemma2MLP",),
                      norms=("Gemma2RMSNorm",)),
        final_norm="rms_norm_offset", embed_scale=True)
def block(tp: Tape, x):
    return layer(tp, x)


def config_fields(cfg) -> dict:
    """Soft-capping: the attention scores' (Gemma-2 only) and the final logits'."""
    return {"attn_cap": bool(getattr(cfg, "attn_logit_softcapping", None)),
            "logit_cap": bool(getattr(cfg, "final_logit_softcapping", None))}


def notes(cfg) -> list:
    """Soft-capped attention scores run eager."""
    if not getattr(cfg, "attn_logit_softcapping", None):
        return []
    return [f"{cfg.model_type}: attention runs eager whatever attn_implementation says (sdpa cannot soft-cap the "
            "attention scores), so its scores take B x heads x S^2 per layer"]


register_family("gemma2", block=block, config_fields=config_fields, notes=notes)
