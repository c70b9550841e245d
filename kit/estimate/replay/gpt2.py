"""GPT-2: ``transformers.models.gpt2.modeling_gpt2.GPT2Block`` (and ``GPT2Model`` around it).

Pre-LayerNorm; a fused ``c_attn`` split into q, k, v; ``gelu_new`` MLP; dropout on the
attention, the residual branches and the embeddings (wte + wpe); ``ln_f`` before the head.
"""
from __future__ import annotations

from kit.estimate.replay.families import register_family
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


def shapes(cfg) -> dict:
    """GPT2Config's own names for the shapes and its three dropouts."""
    H, nh = cfg.n_embd, cfg.n_head
    return dict(H=H, F=cfg.n_inner or 4 * H, nh=nh, kvh=nh, hd=H // nh, L=cfg.n_layer,
                p_attn=cfg.attn_pdrop, p_resid=cfg.resid_pdrop, p_embd=cfg.embd_pdrop)


# GPT2Block takes the attention mask positionally (checkpoint offload copies it); its dropouts are nn.Dropout modules
register_family("gpt2", block=block, shapes=shapes, positional_mask=True,
                dropout_modules=("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout"))
