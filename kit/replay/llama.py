"""Llama: ``transformers.models.llama.modeling_llama.LlamaDecoderLayer`` (and ``LlamaModel``).

Pre-RMSNorm; separate q/k/v projections with grouped-query attention; rotary embeddings
(cos/sin shared by all layers); SwiGLU MLP; the eager softmax in fp32; ``norm`` before the
head. The estimator replays every non-GPT-2 architecture this way.
"""
from __future__ import annotations

from .tape import Tape, around


@around(final_norm="rms_norm")
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    h = tp.rms_norm(x, st.base_trainable)
    q = tp.linear(h, H, st.nh * st.hd, "self_attn.q_proj")
    k = tp.linear(h, H, st.kvh * st.hd, "self_attn.k_proj")
    v = tp.linear(h, H, st.kvh * st.hd, "self_attn.v_proj")
    q, k = tp.rope(q, k, x)  # cos/sin in the embeddings' dtype (fp32 under autocast)
    o = tp.attention(q, k, v, st.nh * st.hd, repeat_kv=True, softmax_fp32=True)
    x = tp.binary(tp.linear(o, st.nh * st.hd, H, "self_attn.o_proj"), x)
    h = tp.rms_norm(x, st.base_trainable)
    g = tp.linear(h, H, st.F, "mlp.gate_proj")
    tp.save(g, when=g.rg)  # SiLU keeps its input
    p = tp.binary(tp.new(g.n, g.dt, g.rg), tp.linear(h, H, st.F, "mlp.up_proj"), True, True)
    return tp.binary(tp.linear(p, st.F, H, "mlp.down_proj"), x)
