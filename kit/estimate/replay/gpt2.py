"""GPT-2: ``transformers.models.gpt2.modeling_gpt2.GPT2Block`` (and ``GPT2Model`` around it).

Pre-LayerNorm; a fused ``c_attn`` split into q, k, v; ``gelu_new`` MLP; dropout on the
attention, the residual branches and the embeddings (wte + wpe); ``ln_f`` before the head.
"""
from __future__ import annotations

from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("GPT2Block",), attention=("GPT2Attention",), mlp=("GPT2MLP",)),
        final_norm="layer_norm", positions=True, embd_dropout=True)
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    qkv = tp.linear(tp.layer_norm(x, st.base_trainable), H, 3 * H, "attn.c_attn")
    q, k, v = tp.split(qkv, 3)
    a = tp.dropout(tp.linear(tp.attention(q, k, v, H), H, H, "attn.c_proj"), st.p_resid)
    x = tp.binary(a, x)
    f = tp.gelu_new(tp.linear(tp.layer_norm(x, st.base_trainable), H, st.F, "mlp.c_fc"))
    return tp.binary(tp.dropout(tp.linear(f, st.F, H, "mlp.c_proj"), st.p_resid), x)
