"""ModernBERT: ``transformers.models.modernbert.modeling_modernbert.ModernBertEncoderLayer`` (and ``ModernBertModel``,
``ModernBertEmbeddings``), as transformers 5.24 runs it.

An encoder with pre-LayerNorm blocks (no biases): ``x + Wo(attn(attn_norm(x)))``, then ``x + mlp(mlp_norm(x))``;
layer 0's ``attn_norm`` is an ``Identity`` (the embeddings end in a LayerNorm), so block 1 saves no norm there and its
``Wqkv`` keeps the block's input (the ``first_layer`` mark: :func:`kit.estimate.replay.core.replay` replays block 1
alone). Attention is one fused ``Wqkv``, unbound into q, k, v views (sdpa keeps v's whole (B, S, 3H) storage),
rotary embeddings computed in fp32 (``q.float() * cos``, cast back) with one cos/sin pair per layer type (global
and local thetas: ``Setup.rope_sets``), and bidirectional: a full mask only where the batch has padding, a sliding
one (``|i - j| <= local_attention // 2``) on the local layers once S reaches that half window
(``Setup.layer_kinds``); every ``global_attn_every_n_layers``-th layer is global. The MLP is GeGLU:
``Wo(drop(gelu(input) * gate))`` with ``input, gate = Wi(x).chunk(2)`` (views of one (B, S, 2F) output, which GELU
keeps). The embeddings are the token embedding, LayerNorm and dropout (no positions); ``final_norm`` before the
head, which is :func:`head` below (``classifier_pooling`` "mean" or "cls", then
``ModernBertPredictionHead``: dense, GELU, LayerNorm; then dropout and ``classifier``).

Unpadding: transformers 5.24's ModernBERT does not unpad in the model (the 4.x versions, from 4.48, did, under
flash-attention-2 only): with sdpa or eager, as here and on a GPU without flash-attn, every layer runs on the padded
(B, S) batch, which is what this replays. With ``attn_implementation="flash_attention_2"`` on a GPU, transformers'
flash wrapper unpads q, k and v per layer to the batch's real tokens (``_upad_input``: index_first_axis copies,
(tokens, H) each) and pads the output back; the projections and the MLP still run on (B, S): this replay counts
sdpa's saved tensors there, not flash-attn's, so a padded batch under FA2 is estimated as sdpa would hold it.
"""
from __future__ import annotations

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.setup import F32, I64, Covers, around
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.task_heads import Head, encoder_logits


def layer(tp: Tape, x):
    """One ModernBERT encoder layer; ``tp.first``: layer 0, whose ``attn_norm`` is an Identity."""
    st, H = tp.st, tp.st.H
    h = x if tp.first else tp.layer_norm(x, st.base_trainable)           # attn_norm
    q, k, v = tp.split(tp.linear(h, H, 3 * H, "attn.Wqkv"), 3)          # qkv.view(..., 3, nh, hd).unbind(-3)
    q, k = tp.rope(q, k, x, fp32=True)                                   # q.float() * cos + ..., .to(q's dtype)
    tp.shared = tp.shared // F32 * x.dt    # ... where cos/sin are in the hidden states' dtype, not fp32
    o = tp.attention(q, k, v, H)
    x = tp.binary(tp.dropout(tp.linear(o, H, H, "attn.Wo"), st.p_attn), x)   # out_drop
    gelu_in, gate = tp.split(tp.linear(tp.layer_norm(x, st.base_trainable), H, 2 * st.F, "mlp.Wi"), 2)
    tp.save(gelu_in, when=gelu_in.rg)                                    # GELU keeps its input (all of Wi's output)
    act = tp.new(gelu_in.n, gelu_in.dt, gelu_in.rg)
    m = tp.dropout(tp.binary(act, gate, True, True), st.p_resid)        # act(input) * gate, mlp.drop
    return tp.binary(tp.linear(m, st.F, H, "mlp.Wo"), x)


@around(covers=Covers(blocks=("ModernBertEncoderLayer",), attention=("ModernBertAttention",), mlp=("ModernBertMLP",)),
        final_norm="layer_norm", embd_dropout=True, embed_norm=True, first_layer=True)
def block(tp: Tape, x):
    return layer(tp, x)


def no_grad_loop(st, T: int, hidden, mlp) -> int:
    """ModernBERT's no_grad forward at a block's largest moment, its GeGLU (``ModernBertEncoderLayer``,
    ``ModernBertMLP``), for :mod:`kit.estimate.evaluation`: five hidden states (the embeddings' output, which
    ``ModernBertModel.forward``'s ``mask_kwargs`` holds till it returns; the block's input, the model loop's
    ``hidden_states``; ``attn_output``, a local of the layer till it returns; the residual after attention;
    ``mlp_norm``'s output; four where block 1 is the only one: its input is the embeddings' output), beside
    ``Wi``'s (B, S, 2F) output (input and gate are views of it), GELU's output and their product; or, at ``Wo``,
    the product and ``Wi``'s output beside ``Wo``'s (B, S, H) output. Besides the blocks: the cos/sin of both layer
    types, (S, hd) each in the hidden states' dtype, and the local layers' mask (B, S, S) bool, built once S reaches
    the half window (the full layers' one, where padded, the caller counts)."""
    hold = (5 if st.L > 1 else 4) * st.H * hidden
    local_mask = (T // st.S) * st.S * st.S if st.sliding and (st.padded or 0 < st.window <= st.S) else 0
    return T * (hold + max(4 * st.F * mlp, st.H * mlp + 3 * st.F * mlp)) + local_mask \
        + st.rope_sets * 2 * st.S * st.hd * hidden


def config_fields(cfg) -> dict:
    """Cos/sin per layer type (global, local); its dropouts (attention, MLP, embeddings) and classifier pooling."""
    return {"rope_sets": len(set(cfg.layer_types)), "p_attn": cfg.attention_dropout, "p_resid": cfg.mlp_dropout,
            "p_embd": cfg.embedding_dropout, "pooling": cfg.classifier_pooling}


def head(tp: Tape, h) -> Head:
    """ModernBERT's ``...ForSequenceClassification`` and ``...ForTokenClassification``: sequence classification pools
    first (``Setup.pooling``: "mean", ``(h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)``, whose product
    keeps only the batch's mask and whose division keeps the (B, 1) int64 count; "cls", ``h[:, 0]``, a view that
    makes the dense layer keep the whole hidden state); then ``ModernBertPredictionHead`` (dense, GELU, LayerNorm:
    part of the base, frozen under LoRA), dropout and ``classifier``, and ``CrossEntropyLoss`` on the logits."""
    st = tp.st
    if st.task == "seq-cls" and st.pooling == "mean":
        masked = tp.new(h.n, h.dt, h.rg)                  # h * mask: a new (B, S, H), nothing of h kept
        h = tp.new(st.B * st.H, h.dt, h.rg)               # .sum(dim=1), then / count: (B, H)
        tp.save(tp.new(st.B, I64, False), when=masked.rg)   # the divisor, kept for the quotient's grad
        h = tp.new(h.n, h.dt, h.rg)
    elif st.task == "seq-cls":
        h = tp.split(h, st.S)[0]
    dense = tp.linear(h, st.H, st.H, "head.dense", trainable=st.base_trainable, w=st.w_other, quant="none")
    tp.save(dense, when=dense.rg)                         # GELU keeps its input
    return encoder_logits(tp, tp.layer_norm(tp.new(dense.n, dense.dt, dense.rg), st.base_trainable), "classifier")


# peft has no default LoRA targets for ModernBERT: its fused qkv projection
register_family("modernbert", block=block, config_fields=config_fields, lora_targets=("Wqkv",),
                no_grad_loop=NoGradLoop(no_grad_loop), task_head=head)
