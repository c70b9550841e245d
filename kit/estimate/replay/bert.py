"""BERT: ``transformers.models.bert.modeling_bert.BertLayer`` (and ``BertEmbeddings``, ``BertModel``, ``BertPooler``).

An encoder: attention is bidirectional, masked only where the batch has padding (``create_bidirectional_mask``);
post-LayerNorm blocks (``LayerNorm(dropout(dense(x)) + input)`` after attention and after the GELU MLP), so no
final norm before the head. Dropout on the attention probabilities, on both residual branches and on the
embeddings. The embeddings are word + token-type + position, then LayerNorm and dropout; the word embedding keeps
the ids, the token-type one the ``(1, S)`` int64 its buffer's ``gather`` makes (the ``positions`` mark: S int64; the
position ids are a slice of a buffer, no new memory). The classifier heads are :mod:`.task_heads`' (the pooler:
``tanh(dense(hidden[:, 0]))``).
"""
from __future__ import annotations

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.task_heads import pooler_head


def layer(tp: Tape, x):
    """One BERT layer (``RobertaLayer`` is this layer, copied)."""
    st, H = tp.st, tp.st.H
    q = tp.linear(x, H, H, "attention.self.query")
    k = tp.linear(x, H, H, "attention.self.key")
    v = tp.linear(x, H, H, "attention.self.value")
    o = tp.attention(q, k, v, H)
    a = tp.dropout(tp.linear(o, H, H, "attention.output.dense"), st.p_resid)
    h = tp.layer_norm(tp.binary(a, x), st.base_trainable)
    f = tp.gelu(tp.linear(h, H, st.F, "intermediate.dense"))
    m = tp.dropout(tp.linear(f, st.F, H, "output.dense"), st.p_resid)
    y = tp.layer_norm(tp.binary(m, h), st.base_trainable)
    # alive at the block's last op, saved or not: its input (the encoder loop's hidden_states), attention_output,
    # the GELU's output (BertLayer's intermediate_output), the dropout's output (BertOutput's hidden_states), and y
    tp.block_locals = (x, h, f, m, y)
    return y


@around(covers=Covers(blocks=("BertLayer",), attention=("BertAttention", "BertSelfAttention", "BertSelfOutput"),
                      mlp=("BertIntermediate", "BertOutput")),
        final_norm=None, positions=True, embd_dropout=True, embed_norm=True)
def block(tp: Tape, x):
    return layer(tp, x)


def config_fields(cfg) -> dict:
    """Dropout on the attention probabilities, on both residual branches and on the embeddings."""
    p = getattr(cfg, "hidden_dropout_prob", 0.0)
    return {"p_attn": getattr(cfg, "attention_probs_dropout_prob", 0.0), "p_resid": p, "p_embd": p}


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """BERT's loop (BertModel.forward, BertLayer.feed_forward_chunk), at block 2's (or 1's) feed-forward: beside
    ``embedding_output`` (a local of ``BertModel.forward``), the block's input and ``attention_output``, either the
    dense layer's and GELU's (B, S, F) outputs, or GELU's output with ``LayerNorm(dense(h) + attention_output)``'s
    three hidden states (the dense output, the sum, the norm's output)."""
    hold = (3 if setup.L > 1 else 2) * setup.H * hidden
    return tokens * max(hold + 2 * setup.F * mlp, hold + setup.H * (2 * hidden + mlp) + setup.F * mlp)


LOOP = NoGradLoop(no_grad_loop)
register_family("bert", block=block, config_fields=config_fields, no_grad_loop=LOOP, task_head=pooler_head)
