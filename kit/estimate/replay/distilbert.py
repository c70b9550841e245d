"""DistilBERT: ``transformers.models.distilbert.modeling_distilbert.TransformerBlock`` (and ``Embeddings``,
``DistilBertModel``, ``DistilBertForSequenceClassification``).

BERT's post-LayerNorm encoder under other names (``attention.q_lin``, ``k_lin``, ``v_lin``, ``out_lin``,
``sa_layer_norm``; ``ffn.lin1``, ``ffn.lin2``, ``output_layer_norm``), with two differences in what it saves:
no dropout after the attention's ``out_lin`` (only the FFN's output has one), and embeddings of word + position
only (no token types; the position ids are a slice of a buffer, no new memory), then LayerNorm and dropout. The
sequence classifier is ``classifier(dropout(relu(pre_classifier(hidden[:, 0]))))`` (:mod:`.task_heads`), with
``seq_classif_dropout``; ``pre_classifier`` is the model's own layer (peft's SEQ_CLS copies only ``classifier``).
"""
from __future__ import annotations

from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("TransformerBlock",), attention=("DistilBertSelfAttention",), mlp=("FFN",)),
        final_norm=None, embd_dropout=True, embed_norm=True, encoder="distilbert")
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    q = tp.linear(x, H, H, "attention.q_lin")
    k = tp.linear(x, H, H, "attention.k_lin")
    v = tp.linear(x, H, H, "attention.v_lin")
    o = tp.attention(q, k, v, H)
    a = tp.linear(o, H, H, "attention.out_lin")
    x = tp.layer_norm(tp.binary(a, x), st.base_trainable)
    f = tp.gelu(tp.linear(x, H, st.F, "ffn.lin1"))
    m = tp.dropout(tp.linear(f, st.F, H, "ffn.lin2"), st.p_resid)
    return tp.layer_norm(tp.binary(m, x), st.base_trainable)
