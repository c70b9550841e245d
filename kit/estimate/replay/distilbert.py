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

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.task_heads import Head, pooler_head


@around(covers=Covers(blocks=("TransformerBlock",), attention=("DistilBertSelfAttention",), mlp=("FFN",)),
        final_norm=None, embd_dropout=True, embed_norm=True)
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


def config_fields(cfg) -> dict:
    """DistilBertConfig's own names: the MLP's width, one dropout for the residual branch and the embeddings."""
    return {"F": cfg.hidden_dim, "p_resid": cfg.dropout, "p_embd": cfg.dropout}


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """DistilBERT's loop (DistilBertModel.forward, TransformerBlock, FFN.ff_chunk): beside ``embeddings`` (a local of
    ``DistilBertModel.forward``), the block's input and ``attention_output``, the larger of lin1's and the
    activation's (B, S, F) outputs, the activation's output with lin2's, or, once ``ff_chunk`` has returned,
    ``output_layer_norm(ffn_output + attention_output)``'s three hidden states."""
    hold = (3 if setup.L > 1 else 2) * setup.H * hidden
    return tokens * (hold + max(2 * setup.F * mlp, setup.F * mlp + setup.H * hidden, 3 * setup.H * hidden))


def head(tp: Tape, h) -> Head:
    """``classifier(dropout(relu(pre_classifier(hidden[:, 0]))))``: BERT's pooler, its Linear ``pre_classifier``."""
    return pooler_head(tp, h, "pre_classifier")


# peft has no default LoRA targets for DistilBERT: q_lin and v_lin
register_family("distilbert", block=block, config_fields=config_fields, lora_targets=("q_lin", "v_lin"),
                no_grad_loop=NoGradLoop(no_grad_loop), task_head=head)
