"""Gated DeltaNet linear attention and gated softmax attention, the token mixers of Qwen3.5's hybrid layers, as
transformers 5.25 runs them (``transformers/models/qwen3_5/modeling_qwen3_5.py``): what each op saves for backward.

A Gated DeltaNet layer (``Qwen3_5GatedDeltaNet.forward``), with T = B x S tokens, nk key heads and nv value heads of
widths dk and dv, the conv's C = 2 nk dk + nv dv channels and its kernel K:

- a padded batch's rows are multiplied by the 2-D padding mask (``apply_mask_to_padding_states``: the mul keeps the
  batch's own mask, one storage for every layer);
- four projections of the norm's output: ``in_proj_qkv`` (C wide), ``in_proj_z`` (nv dv), ``in_proj_b`` and
  ``in_proj_a`` (nv);
- the short causal conv (``causal_conv1d_fn``): ``F.conv1d`` keeps its (B, C, S) input and makes (B, C, S + K - 1),
  sliced to S, whose whole storage SiLU keeps;
- the gates: ``beta = b.sigmoid()`` (keeps its output); ``g = -A_log.float().exp() * softplus(a.float() + dt_bias)``
  (exp keeps its (nv,) output, softplus its input, the mul both operands);
- the chunked delta rule. On a CPU (and on CUDA without flash-linear-attention) transformers' reference
  ``torch_chunk_gated_delta_rule``: q and k repeated to nv heads, everything made fp32 and (B, nv, S, d)-contiguous,
  l2norm of q and k (``x * x`` keeps x, rsqrt its output), the sequence padded to whole chunks of 64, then per chunk
  the pairwise decays (masked_fill keeps the (64, 64) bool mask, exp its output), two (64, 64) products per chunk
  kept by their muls and by the matmuls' inputs, the UT system solved twice by ``solve_triangular`` (it keeps the
  system and each solution), three more decays' exps, and the scan over chunks, which keeps every chunk's v_new and
  every state before the last. On CUDA, flash-linear-attention's ``ChunkGatedDeltaRuleFunction`` (fla-org/flash-
  linear-attention, ``fla/ops/gated_delta_rule/chunk.py``, read at bc3b101d): ``input_guard`` makes q, k and v
  contiguous, ``l2norm_fwd`` writes normed q and k (and fp32 rstd per head), ``chunk_local_cumsum`` an fp32 g,
  ``chunk_gated_delta_rule_fwd_intra`` the solved (B, S, nv, 64) A in k's dtype; it saves these, v and beta, and
  recomputes the rest in backward. Not measured here: such figures carry the modelled margin.
- ``Qwen3_5RMSNormGated`` over dv with the SiLU of z: the fp32 input (pow), rsqrt's output, the normed input (the
  weight's grad), z (SiLU's input), SiLU's output and the weighted norm (the mul's operands); then ``out_proj``.

The full-attention layers (``Qwen3_5Attention``): ``q_proj`` makes the queries and a gate (2 nh hd wide, chunked per
head), q/k RMSNorms of Qwen3.5's kind (``(1 + weight)``, per head), partial rotary embeddings whose cos/sin are made
per batch row, attention as Llama's, then ``attn_output * sigmoid(gate)`` (sigmoid keeps its output, the mul both)
and ``o_proj``.
"""
from __future__ import annotations

from kit.estimate.replay.setup import BOOL, F32, I64, promote
from kit.estimate.replay.tape import Tape
from kit.inputs import Note
from kit.presets import MODELLED_MARGIN

CHUNK = 64   # torch_chunk_gated_delta_rule's and flash-linear-attention's default chunk_size


def config_shapes(cfg) -> dict:
    """The :class:`~kit.estimate.replay.setup.Setup` fields of a hybrid config's linear-attention layers.

    >>> from transformers import Qwen3_5TextConfig
    >>> config_shapes(Qwen3_5TextConfig(num_hidden_layers=4))["linear_at"]
    (0, 1, 2)
    """
    types = getattr(cfg, "layer_types", None) or ()
    return dict(linear_at=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
                linear_heads=(cfg.linear_num_key_heads, cfg.linear_num_value_heads),
                linear_dims=(cfg.linear_key_head_dim, cfg.linear_value_head_dim),
                conv_kernel=cfg.linear_conv_kernel_dim)


def notes(info, device: str) -> list:
    """What a hybrid estimate rests on, said beside it (none for a model without linear-attention layers): on CUDA,
    flash-linear-attention's kernels, read from its source and not measured."""
    types = getattr(info.config, "layer_types", None) or ()
    if device != "cuda" or "linear_attention" not in types:
        return []
    mt = info.config.model_type
    return [Note(f"{mt}: its {types.count('linear_attention')} Gated DeltaNet layers are replayed as "
                 "flash-linear-attention's chunk_gated_delta_rule saves for backward (read from its source, not "
                 f"measured on a GPU: a fit keeps the {MODELLED_MARGIN:.0%} modelled margin); without "
                 "flash-linear-attention installed transformers runs its reference PyTorch path, which saves more "
                 "(device='cpu' replays that path), and the causal-conv1d package, where installed, saves less in the "
                 "short convolution than the torch conv1d replayed here", field="device", code="linear-attention-fla")]


def gated_delta_net(tp: Tape, h):
    """One ``Qwen3_5GatedDeltaNet`` on ``h``, the input norm's (T, H) output; returns ``out_proj``'s output."""
    st = tp.st
    (nk, nv), (dk, dv) = st.linear_heads, st.linear_dims
    if tp.masked and h.rg:   # hidden_states * attention_mask[:, :, None]: keeps the batch's (B, S) int64 mask
        tp.once["padding mask"] = st.T * I64
    h = tp.new(h.n, h.dt, h.rg) if tp.masked else h
    qkv = tp.linear(h, st.H, 2 * nk * dk + nv * dv, "linear_attn.in_proj_qkv")
    z = tp.linear(h, st.H, nv * dv, "linear_attn.in_proj_z")
    b = tp.linear(h, st.H, nv, "linear_attn.in_proj_b")
    a = tp.linear(h, st.H, nv, "linear_attn.in_proj_a")
    q, k, v = tp.split(causal_conv(tp, qkv), (nk * dk, nk * dk, nv * dv))
    beta, g = gates(tp, b, a)
    core = chunk_rule_fla(tp, q, k, v, beta, g) if st.fla else chunk_rule_torch(tp, q, k, v, beta, g)
    return tp.linear(gated_rms_norm(tp, core, z), nv * dv, st.H, "linear_attn.out_proj")


def causal_conv(tp: Tape, x):
    """``causal_conv1d_fn``: a depthwise ``F.conv1d`` (padding K - 1) of ``x.to(weight.dtype)``, sliced to S, SiLU,
    then back to ``x``'s dtype. The conv keeps its input for the weight's grad and its weight for the input's: one
    formula, so its input is kept whenever either grad is needed."""
    st = tp.st
    channels = x.n // st.T
    xin = tp.cast(x, st.w_other)
    trainable = st.base_trainable
    if st.ac:   # conv1d is on autocast's lower-precision list: input and weight cast to the autocast dtype
        xin = tp.cast(xin, st.ac)
    tp.save(xin, when=xin.rg or trainable)
    full = tp.new(st.B * channels * (st.S + st.conv_kernel - 1), st.ac or xin.dt, xin.rg or trainable)
    if full.rg:
        tp.outs[-1].weight_grad = channels * st.conv_kernel * st.w_other if trainable else 0
    tp.save(full, when=full.rg)                       # SiLU keeps its input: the whole (B, C, S + K - 1) storage
    return tp.cast(tp.new(st.T * channels, full.dt, full.rg), x.dt)


def gates(tp: Tape, b, a):
    """``beta = b.sigmoid()`` and ``g = -A_log.float().exp() * softplus(a.float() + dt_bias)``: (T, nv) each."""
    st = tp.st
    nv, trainable = st.linear_heads[1], st.base_trainable
    beta = tp.sigmoid(b)
    decay = tp.new(nv, F32, trainable)                # A_log.float().exp() keeps its output (A_log's grad)
    tp.save(decay, when=trainable)
    negated = tp.new(nv, F32, trainable)
    shifted = tp.new(a.n, F32, a.rg or trainable)     # a.float() + dt_bias
    tp.save(shifted, when=shifted.rg)                 # softplus keeps its input
    soft = tp.new(a.n, F32, shifted.rg)
    return beta, tp.binary(negated, soft, True, True)


def chunk_rule_torch(tp: Tape, q, k, v, beta, g):
    """transformers' ``torch_chunk_gated_delta_rule`` with ``use_qk_l2norm_in_kernel``; returns its (T, nv, dv)
    output in q's dtype."""
    st = tp.st
    B, S, (nk, nv), (dk, dv) = st.B, st.S, st.linear_heads, st.linear_dims
    chunks = -(-S // CHUNK)
    Sp = chunks * CHUNK                                # the sequence padded to whole chunks
    rg = q.rg or k.rg or v.rg or beta.rg or g.rg
    # repeat_interleave to nv heads (a copy), then .transpose(1, 2).to(float32, memory_format=contiguous_format),
    # which copies half inputs but returns an fp32 one as it is: a (B, nv, S, d) view of a (B, S, nv, d) layout
    if nk == nv and q.dt == F32:
        qf, kf = q, k                                  # views of the conv's output
    else:
        qf, kf = (tp.new(B * nv * S * dk, F32, t.rg) for t in (q, k))
    for t in (qf, kf):   # l2norm: x * x keeps x; rsqrt keeps its (B, nv, S, 1) output
        tp.save(t, tp.new(B * nv * S, F32, False), when=t.rg)
    # F.pad copies into a (B, nv, S', d)-contiguous tensor where it pads; without padding it clones, and an fp32
    # input keeps its (B, S, nv, d) layout: then each chunked matmul copies its inputs, and each chunk's slice too
    seq_major = q.dt == F32 and S % CHUNK == 0
    padded = [tp.new(B * nv * Sp * d, F32, t.rg) for t, d in ((qf, dk), (kf, dk), (v, dv))]   # scaled q, F.pad
    qp, kp, vp = padded
    bp, gp = (tp.new(B * nv * Sp, F32, t.rg) for t in (beta, g))
    tp.binary(vp, bp, True, True)   # v_beta = value * beta.unsqueeze(-1): the mul keeps both operands for backward
    k_beta = tp.binary(kp, bp, True, True)
    tp.save(tp.new(CHUNK * CHUNK, BOOL, False), when=gp.rg)   # masked_fill keeps the strictly upper mask
    square = B * nv * chunks * CHUNK * CHUNK
    pairwise = tp.new(square, F32, gp.rg)
    tp.save(pairwise, when=gp.rg)                     # .exp() keeps its output
    ut = _decayed_scores(tp, k_beta, kp, pairwise, seq_major)    # (k_beta @ key^T) * pairwise decay
    intra = _decayed_scores(tp, qp, kp, pairwise, seq_major)     # (query @ key^T) * pairwise decay
    decayed_k_beta = tp.binary(k_beta, _exp(tp, gp), True, True)
    tp.save(ut, when=rg)                               # solve_triangular keeps the system ...
    new_values = tp.new(B * nv * Sp * dv, F32, rg)
    tp.save(new_values, when=rg)                       # ... and its solution, for each right-hand side
    k_cumdecay = tp.new(B * nv * Sp * dk, F32, decayed_k_beta.rg or ut.rg)
    tp.save(k_cumdecay, when=rg)
    query = tp.binary(qp, _exp(tp, gp), True, True)   # query * cum_decay.exp()
    key = tp.binary(kp, _exp(tp, gp), True, True)      # key * (cum_decay[..., -1:] - cum_decay).exp()
    # chunk_decay = cum_decay[..., -1].exp(): its exp keeps it, and S_i * chunk_decay_i from the second chunk on
    tp.save(tp.new(B * nv * chunks, F32, False), when=gp.rg or (rg and chunks > 1))
    state = B * nv * dk * dv
    for i in range(chunks):   # v_new = new_values_i - k_cumdecay_i @ S; out_i = q_i @ S + intra_i @ v_new;
        tp.save(tp.new(state, F32, False), when=rg)   # S = S * chunk_decay_i + key_i^T @ v_new: S_i and v_new kept
        tp.save(tp.new(B * nv * CHUNK * dv, F32, False), intra, when=rg)
        # key_i^T and (from the second chunk on, where the state needs a grad) q_i, kept by their matmuls: views of
        # the decayed key and query, or each chunk's own copy in the (B, S, nv, d) layout
        for t, kept in ((key, True), (query, i > 0)):
            tp.save(tp.new(B * nv * CHUNK * dk, F32, False) if seq_major else t, when=rg and kept)
    return tp.new(st.T * nv * dv, q.dt, rg)           # .transpose(1, 2).to(initial_dtype, contiguous)


def _decayed_scores(tp: Tape, left, key, pairwise, copied: bool):
    """``(left @ key.transpose(-1, -2)) * pairwise``: the batched matmul keeps both inputs (``copied``: contiguous
    copies of them, where their layout cannot be folded into three dimensions), the mul its product."""
    rg = left.rg or key.rg
    tp.save(*((tp.new(left.n, F32, False), tp.new(key.n, F32, False)) if copied else (left, key)), when=rg)
    product = tp.new(pairwise.n, F32, rg)
    return tp.binary(product, pairwise, True, True)


def _exp(tp: Tape, cum):
    """An ``.exp()`` of the (B, nv, S') cumulated decays: keeps its output."""
    out = tp.new(cum.n, F32, cum.rg)
    tp.save(out, when=cum.rg)
    return out


def chunk_rule_fla(tp: Tape, q, k, v, beta, g):
    """flash-linear-attention's ``chunk_gated_delta_rule`` with ``use_qk_l2norm_in_kernel`` (its saved tensors, read
    from its source); returns its (T, nv, dv) output in q's dtype."""
    st = tp.st
    (nk, nv), (dk, dv) = st.linear_heads, st.linear_dims
    rg = q.rg or k.rg or v.rg or beta.rg or g.rg
    T = st.T
    for t, heads, d in ((q, nk, dk), (k, nk, dk)):   # contiguous copy, l2norm_fwd's output and rstd
        tp.save(tp.new(T * heads * d, t.dt, False), tp.new(T * heads, F32, False), when=rg)
    tp.save(tp.new(T * nv * dv, v.dt, False), when=rg)            # v, made contiguous
    tp.save(tp.new(T * nv, F32, False), beta, when=rg)            # g's chunk-local cumsum (fp32), beta
    tp.save(tp.new(T * nv * CHUNK, k.dt, False), when=rg)         # A: the solved (I + A)^-1, per chunk
    return tp.new(T * nv * dv, q.dt, rg)


def gated_rms_norm(tp: Tape, x, z):
    """``Qwen3_5RMSNormGated(x, z)`` over dv: ``weight * norm(x).to(x.dtype) * silu(z.float())``, back to x's dtype."""
    st = tp.st
    dv, trainable = st.linear_dims[1], st.base_trainable
    xf = tp.cast(x, F32)
    tp.save(xf, tp.new(x.n // dv, F32, False), when=x.rg)   # pow keeps the fp32 input; rsqrt its output
    normed = tp.cast(tp.new(x.n, F32, x.rg), x.dt)
    tp.save(normed, when=trainable)                           # weight * normed: the weight's grad
    weighted = tp.new(x.n, promote(x.dt, st.w_other), x.rg or trainable)
    zf = tp.cast(z, F32)
    tp.save(zf, when=zf.rg)                                   # SiLU keeps its input
    gate = tp.new(z.n, F32, zf.rg)
    return tp.cast(tp.binary(weighted, gate, True, True), x.dt)


def gated_attention(tp: Tape, h, qk_norm):
    """One ``Qwen3_5Attention`` on ``h``: its queries and output gate from one ``q_proj``, q/k norms (``qk_norm``,
    a tape rule over hd), rotary embeddings with cos/sin per row, attention, ``* sigmoid(gate)``, ``o_proj``."""
    st = tp.st
    width = st.nh * st.hd
    q, gate = tp.split(tp.linear(h, st.H, 2 * width, "self_attn.q_proj"), 2)   # chunk(2) of each head's 2 hd
    gate = tp.new(gate.n, gate.dt, gate.rg)            # gate.reshape(B, S, -1): a copy of the strided half
    q = qk_norm(q, st.base_trainable, st.hd)
    k = qk_norm(tp.linear(h, st.H, st.kvh * st.hd, "self_attn.k_proj"), st.base_trainable, st.hd)
    v = tp.linear(h, st.H, st.kvh * st.hd, "self_attn.v_proj")
    q, k = tp.rope(q, k, h, cat=True, rows=st.B)      # partial rotary: torch.cat([rotated, rest], -1)
    o = tp.attention(q, k, v, width, repeat_kv=True, softmax_fp32=True)
    o = tp.binary(o, tp.sigmoid(gate), True, True)
    return tp.linear(o, width, st.H, "self_attn.o_proj")
