"""StableLM: ``transformers.models.stablelm.modeling_stablelm.StableLmDecoderLayer`` (and ``StableLmModel``), as
transformers 5.25 runs it.

Llama's layout with LayerNorms (with bias) in place of the RMSNorms: ``input_layernorm``; separate q/k/v
projections (biases with ``use_qkv_bias``: they save nothing more), grouped-query where the config says so; partial
rotary embeddings (``partial_rotary_factor``, 0.25 in the released models) on the first dims of q and k, ``cat``
with the rest (so sdpa's output needs a copy for ``o_proj``); the residual add; ``post_attention_layernorm``, the
SwiGLU MLP (``gate_proj``, ``up_proj``, ``down_proj``), dropout (``hidden_dropout``) on its output, the residual
add. With ``use_parallel_residual`` the MLP reads the attention's normed input instead (no second norm) and
``x + attn + mlp`` sums them. ``norm`` (a LayerNorm) before the untied head; no embedding scale or dropout.
``qk_layernorm`` (a LayerNorm per head on q and k, ``StableLmLayerNormPerHead``: StableLM-2 12B) is refused.
"""
from __future__ import annotations

from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("StableLmDecoderLayer",), attention=("StableLmAttention",), mlp=("StableLmMLP",)),
        final_norm="layer_norm")
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    h = tp.layer_norm(x, st.base_trainable)
    q = tp.linear(h, H, st.nh * st.hd, "self_attn.q_proj")
    k = tp.linear(h, H, st.kvh * st.hd, "self_attn.k_proj")
    v = tp.linear(h, H, st.kvh * st.hd, "self_attn.v_proj")
    q, k = tp.rope(q, k, x, cat=True)
    o = tp.attention(q, k, v, st.nh * st.hd, repeat_kv=True, softmax_fp32=True)
    a = tp.linear(o, st.nh * st.hd, H, "self_attn.o_proj")
    if st.parallel:   # residual + self_attn_output + mlp_output, the MLP on the same normed input
        return tp.binary(tp.binary(x, a), tp.dropout(tp.gated_mlp(h), st.p_resid))
    x = tp.binary(x, a)
    return tp.binary(x, tp.dropout(tp.gated_mlp(tp.layer_norm(x, st.base_trainable)), st.p_resid))


def config_fields(cfg) -> dict:
    """Dropout on the MLP's output (``hidden_dropout``); the parallel residual."""
    return {"p_resid": getattr(cfg, "hidden_dropout", 0.0),
            "parallel": bool(getattr(cfg, "use_parallel_residual", False))}


def refusal(cfg) -> str | None:
    """Per-head q/k LayerNorms, which this replay does not have."""
    if getattr(cfg, "qk_layernorm", False):
        return ("normalizes q and k per head (qk_layernorm=True, StableLmLayerNormPerHead), which the estimator does "
                "not replay")
    return None


register_family("stablelm", block=block, config_fields=config_fields, refusal=refusal)
