"""GPT-NeoX (Pythia): ``transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXLayer`` (and
``GPTNeoXModel``, ``GPTNeoXForCausalLM``).

LayerNorms with bias; one ``query_key_value`` projection viewed (B, nh, S, 3*hd) and
chunked into q, k, v (views: sdpa's saved v holds the whole projection output); partial
rotary embeddings (``partial_rotary_factor``, 0.25 by default) on the first dims of q and k,
``cat`` with the rest (so sdpa's output needs a copy for ``dense``); a GELU MLP
(``dense_h_to_4h``, ``dense_4h_to_h``). With
``use_parallel_residual`` attention and MLP both read the block's input through their own
LayerNorm and ``mlp + attn + x`` sums them; dropout (``hidden_dropout``) on both branches
and on the embeddings; ``final_layer_norm`` before the untied ``embed_out`` head.
"""
from __future__ import annotations

from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("GPTNeoXLayer",), attention=("GPTNeoXAttention",), mlp=("GPTNeoXMLP",)),
        final_norm="layer_norm", embd_dropout=True)
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    qkv = tp.linear(tp.layer_norm(x, st.base_trainable), H, 3 * H, "attention.query_key_value")
    q, k, v = tp.split(qkv, 3)
    q, k = tp.rope(q, k, x, cat=True)
    o = tp.attention(q, k, v, H, softmax_fp32=True)
    a = tp.dropout(tp.linear(o, H, H, "attention.dense"), st.p_resid)
    if not st.parallel:
        x = tp.binary(a, x)
    f = tp.gelu(tp.linear(tp.layer_norm(x, st.base_trainable), H, st.F, "mlp.dense_h_to_4h"))
    m = tp.dropout(tp.linear(f, st.F, H, "mlp.dense_4h_to_h"), st.p_resid)
    return tp.binary(tp.binary(m, a), x) if st.parallel else tp.binary(m, x)


def config_fields(cfg) -> dict:
    """Dropout on both branches and the embeddings (``hidden_dropout``); the parallel residual."""
    p = getattr(cfg, "hidden_dropout", 0.0)
    return {"p_resid": p, "p_embd": p, "parallel": bool(getattr(cfg, "use_parallel_residual", True))}


# its dropouts are nn.Dropout modules (TRL's disable_dropout zeroes them)
register_family("gpt_neox", block=block, config_fields=config_fields,
                dropout_modules=("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout"))
