"""DeBERTa-v2/v3: ``transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2Layer`` (and ``DebertaV2Embeddings``,
``DebertaV2Encoder``, ``DisentangledSelfAttention``, ``ContextPooler``).

BERT's post-LayerNorm layer around a disentangled attention, run in eager ops (no sdpa). Per layer, what autograd
keeps (B batch, S length, H hidden, nh heads, 2 x span rows of the relative-position table):

- the content projections' input, and ``transpose_for_scores``' contiguous (B * nh, S, hd) copies: the query and
  ``key.T / scale`` kept by the content score's ``bmm``; the key again by p2c's, the value by the context's;
- the relative table: ``pos_dropout`` of the encoder's normed ``rel_embeddings`` (its mask, and its output, which
  the projections keep), then through the query and key projections (``share_att_key``, v3) and repeated per
  batch row, (B * nh, 2 span, hd) each, kept by the c2p and p2c ``bmm``;
- c2p and p2c: ``gather`` keeps its whole (B * nh, S, 2 span) input and its index, the clamped (S, S) int64 bucket
  positions (one per term, per layer);
- the scores: ``masked_fill`` keeps the (B, 1, S, S) bool of ``~mask``, softmax its output, dropout its mask, the
  context's ``bmm`` the dropped probabilities;
- the output dense, dropout and LayerNorm, and the MLP, as BERT's.

Outside the layers: the embeddings are word embeddings only (v3: no positions, no token types), LayerNorm,
``* mask`` (the float (B, S, 1) mask, kept), dropout; the encoder norms ``rel_embeddings`` once per forward (its
statistics are shared by the layers). The sequence classifier is ``ContextPooler`` (``gelu(dense(hidden[:, 0]))``,
``pooler_dropout`` 0: the dense layer keeps the whole hidden state), dropout and ``classifier`` (:mod:`.task_heads`).
"""
from __future__ import annotations

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.setup import BOOL, F32, I64, Covers, around, promote
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.task_heads import pooler_head


def _bmm(tp: Tape, a, b, n: int):
    """``torch.bmm`` (autocast's fp16 list): keeps each operand the other's grad needs."""
    if tp.st.ac:
        a, b = tp.cast(a, tp.st.ac), tp.cast(b, tp.st.ac)
    tp.save(a, when=b.rg)
    tp.save(b, when=a.rg)
    return tp.new(n, promote(a.dt, b.dt), a.rg or b.rg)


def _heads(tp: Tape, t, rows: int = 1):
    """``transpose_for_scores``: a contiguous copy, laid out per head; ``rows`` > 1: then ``.repeat`` per batch row."""
    t = tp.new(t.n, t.dt, t.rg)
    return tp.new(t.n * rows, t.dt, t.rg) if rows > 1 else t


def _relative(tp: Tape, q, k, rel):
    """c2p and p2c (``disentangled_attention_bias``): the (B * nh, S, S) bias, or None without a term."""
    st, H = tp.st, tp.st.H
    BH, S, span2 = st.B * st.nh, st.S, 2 * st.rel_span
    rel = tp.dropout(rel, st.p_resid)   # pos_dropout (hidden_dropout_prob), once per layer
    names = ("query_proj", "key_proj") if st.rel_share else ("pos_query_proj", "pos_key_proj")
    pos = {term: _heads(tp, tp.linear(rel, H, H, f"attention.self.{name}"), st.B)
           for term, name in zip(("p2c", "c2p"), names) if term in st.rel_att}
    score, present = None, [t for t in ("c2p", "p2c") if t in st.rel_att]
    for j, term in enumerate(present):
        att = _bmm(tp, q if term == "c2p" else k, pos[term], BH * S * span2)
        tp.save(tp.new(S * S, I64, False), when=att.rg)   # the clamped bucket positions, gather's index
        tp.save(att, when=att.rg)                         # gather keeps its whole input
        term_bias = tp.new(BH * S * S, att.dt, att.rg)    # gather -> (B * nh, S, S)
        if term_bias.rg:   # its backward (zeros like its input, scatter_add_ into it) runs while grads wait: the
            later = len(present) - 1 - j   # scores' (one tensor the adds pass on), and a later term's inputs'
            tp.outs[-1].temporaries = (BH * S * S + later * (st.B * span2 * H + st.T * H)) * att.dt
        term_bias = tp.new(term_bias.n, term_bias.dt, term_bias.rg)   # / scale (a 0-d tensor)
        score = tp.new(term_bias.n, term_bias.dt, term_bias.rg) if score is None else score   # 0 + ...; then +=
    return score


def attention(tp: Tape, x, rel):
    """``DisentangledSelfAttention.forward``: returns the (B, S, H) context, the output dense's input, and the bytes
    its locals hold unsaved at its last op (the context's contiguous copy): ``rel_att`` (the relative terms' sum),
    the masked scores (softmax keeps its output, not its input), ``attention_mask.bool()`` (its ``~`` is what
    masked_fill keeps), the context ``bmm``'s output and its copy."""
    st, H = tp.st, tp.st.H
    BH, S = st.B * st.nh, st.S
    q = _heads(tp, tp.linear(x, H, H, "attention.self.query_proj"))
    k = _heads(tp, tp.linear(x, H, H, "attention.self.key_proj"))
    v = _heads(tp, tp.linear(x, H, H, "attention.self.value_proj"))
    scores = _bmm(tp, q, tp.new(k.n, k.dt, k.rg), BH * S * S)   # bmm(q, key.T / scale)
    bias = _relative(tp, q, k, rel) if st.rel_span and st.rel_att else None
    if bias is not None:
        scores = tp.new(scores.n, promote(scores.dt, bias.dt), scores.rg or bias.rg)
    tp.save(tp.new(st.B * S * S, BOOL, False), when=scores.rg)   # masked_fill keeps ~mask, (B, 1, S, S)
    scores = tp.new(scores.n, scores.dt, scores.rg)
    probs = tp.new(scores.n, F32 if st.ac else scores.dt, scores.rg)   # softmax: autocast's fp32 list
    tp.save(probs, when=probs.rg)
    probs = tp.dropout(probs, st.p_attn)
    context = _bmm(tp, probs, v, v.n)
    out = tp.new(context.n, context.dt, context.rg)   # permute(0, 2, 1, 3).contiguous()
    unsaved = [t for t in (bias, scores, context, out) if t is not None and t.uid not in tp.saved]
    return out, sum(t.n * t.dt for t in unsaved) + st.B * S * S * BOOL


def rel_table(tp: Tape):
    """The encoder's ``get_rel_embedding``: LayerNorm (``norm_rel_ebd``) of the (2 span, H) table, made once per
    forward; its statistics count once (``Tape.shared``)."""
    st = tp.st
    n = 2 * st.rel_span * st.H
    dt = F32 if st.ac else st.w_other
    tp.shared = 2 * 2 * st.rel_span * (F32 if st.device == "cuda" else dt) if st.base_trainable else 0
    tp.shared += _encoder_args(st) if st.ckpt else 0   # checkpointing keeps each layer's arguments
    tp.shared_grad = n * dt if st.base_trainable else 0   # its grad, summed over the layers as backward goes
    return tp.new(n, dt, st.base_trainable)


@around(covers=Covers(blocks=("DebertaV2Layer",),
                      attention=("DebertaV2Attention", "DisentangledSelfAttention", "DebertaV2SelfOutput"),
                      mlp=("DebertaV2Intermediate", "DebertaV2Output")),
        final_norm=None, embd_dropout=True, embed_norm=True, embed_mask=True)
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    o, in_attention = attention(tp, x, rel_table(tp) if st.rel_span and st.rel_att else None)
    saved_by_then = tp.total()
    a = tp.dropout(tp.linear(o, H, H, "attention.output.dense"), st.p_resid)
    x = tp.layer_norm(tp.binary(a, x), st.base_trainable)
    f = tp.gelu(tp.linear(x, H, st.F, "intermediate.dense"))
    m = tp.dropout(tp.linear(f, st.F, H, "output.dense"), st.p_resid)
    out = tp.layer_norm(tp.binary(m, x), st.base_trainable)
    tp.transient = _forward_end(tp, (x, f, m, out))
    if not st.ckpt:   # the last attention's end, where the layer has saved less than at its own end
        tp.transient = max(tp.transient, in_attention + _encoder_args(st) + st.T * I64 - (tp.total() - saved_by_then))
    return out


def _forward_end(tp: Tape, locals_) -> int:
    """What the last layer's forward holds at its end beside what is saved: its locals (``attention_output``, the
    MLP's activation, the output dropout's and LayerNorm's outputs) where nothing saved them, and the encoder's: the
    (B, 1, S, S) int64 mask it multiplies out, the (S, S) int64 ``relative_pos``, the normed (2 span, H) table, and
    ``DebertaV2Model.forward``'s zero ``token_type_ids``, (B, S) int64."""
    st = tp.st
    mine = sum(t.n * t.dt for t in locals_ if st.ckpt or t.uid not in tp.saved)
    return mine + (0 if st.ckpt and st.rel_span and st.rel_att else _encoder_args(st)) + st.T * I64


def _encoder_args(st) -> int:
    """What the encoder hands every layer besides the hidden state: the (B, 1, S, S) int64 mask, the (S, S) int64
    ``relative_pos`` and the normed (2 span, H) table (what checkpointing keeps for the recompute)."""
    rel = st.S * st.S * I64 + 2 * st.rel_span * st.H * (F32 if st.ac else st.w_other) if st.rel_span else 0
    return st.B * st.S * st.S * I64 + rel


def config_fields(cfg) -> dict:
    """Its dropouts; the relative attention's span (``DisentangledSelfAttention.pos_ebd_size``), terms and sharing."""
    out = dict(p_attn=cfg.attention_probs_dropout_prob, p_resid=cfg.hidden_dropout_prob, p_embd=cfg.hidden_dropout_prob)
    if cfg.relative_attention:
        span = cfg.max_relative_positions if cfg.max_relative_positions >= 1 else cfg.max_position_embeddings
        out.update(rel_span=cfg.position_buckets if getattr(cfg, "position_buckets", -1) > 0 else span,
                   rel_att=tuple(cfg.pos_att_type or ()), rel_share=bool(getattr(cfg, "share_att_key", False)))
    return out


def refusal(cfg) -> str | None:
    """DeBERTa-v2 xlarge's and xxlarge's layout, which this replay does not have."""
    if getattr(cfg, "conv_kernel_size", 0) or getattr(cfg, "embedding_size", cfg.hidden_size) != cfg.hidden_size:
        return ("has a convolution after its first layer or projected embeddings (DeBERTa-v2 xlarge and xxlarge), "
                "which the estimator does not replay (it replays DeBERTa-v3's layout)")
    return None


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """DeBERTa-v2's loop (DebertaV2Model.forward, DebertaV2Encoder.forward, DisentangledSelfAttention) at the last
    layer. The encoder keeps every layer's output (``all_hidden_states``: it always asks for them) beside
    ``embedding_output``, the zero ``token_type_ids`` (B, S) int64, the (B, 1, S, S) int64 mask it multiplies out,
    the (S, S) int64 ``relative_pos`` and the normed (2 span, H) table. In the attention: q, k and v, the content
    scores, and, at the last disentangled term's ``gather``, its (B * nh, S, 2 span) input and (B * nh, S, S)
    output, the earlier terms' results and their running sum, the repeated position projections and each term's
    (S, S) int64 positions; else the MLP's two (B, S, F) tensors beside the attention's output."""
    B, S, span2, terms = tokens // setup.S, setup.S, 2 * setup.rel_span, len(setup.rel_att)
    square = B * setup.nh * S * S
    table = S * S * 8 + span2 * setup.H * hidden if terms else 0   # relative positions and the normed table
    fixed = tokens * 8 + B * S * S * 8 + table + setup.L * tokens * setup.H * hidden
    attn = 3 * tokens * setup.H * mlp + square * mlp * (2 * terms if terms else 1)
    if terms:
        attn += (B * setup.nh * S * span2 + terms * B * span2 * setup.H) * mlp + terms * S * S * 8
    return fixed + max(attn, tokens * setup.H * hidden + 2 * tokens * setup.F * mlp)


# its no_grad loop counts the int64 mask the encoder makes, padded or not; its classifier pools as BERT's
# (ContextPooler: gelu(dense(hidden[:, 0])), which keeps its input: the same bytes as tanh's output)
register_family("deberta-v2", block=block, config_fields=config_fields, refusal=refusal,
                no_grad_loop=NoGradLoop(no_grad_loop, own_mask=True), task_head=pooler_head)
