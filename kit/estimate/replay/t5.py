"""T5 (Flan-T5): ``transformers.models.t5.modeling_t5.T5ForConditionalGeneration`` (``T5Stack``, ``T5Block``), as
transformers 5.25 runs it: an encoder-decoder, replayed whole (the registry's ``whole``), not as one stack of blocks.

The encoder: ``shared(input_ids)``, dropout, ``num_layers`` blocks, ``final_layer_norm``, dropout: its output E.
The decoder: ``shared(decoder_input_ids)`` (the collator's, made from the labels), dropout, ``num_decoder_layers``
blocks, ``final_layer_norm``, dropout, ``lm_head`` (untied in Flan-T5: ``tie_word_embeddings`` false, so no
``d_model ** -0.5`` scale), and ``CrossEntropyLoss`` on the logits as they are (no fp32 copy, no shifted labels).

A block: ``T5LayerSelfAttention`` (``layer_norm``, q/k/v/o without biases, ``x + dropout(o)``); in the decoder
``T5LayerCrossAttention`` (q from the decoder, k and v from E: every decoder block's k/v keep E, one storage, and their
grads of E add up in one buffer through the decoder's backward); ``T5LayerFF`` (``layer_norm``, Flan-T5's gated GELU
``wo(dropout(gelu_new(wi_0(h)) * wi_1(h)))``, or ``wo(dropout(act(wi(h))))``, then ``x + dropout(.)``).
``T5LayerNorm`` is RMS-style: ``x.float().pow(2).mean()``, ``x * rsqrt(...)`` (it keeps x, its fp32 copy and the
rsqrt), ``weight * h`` (h kept for the weight's grad). The relative position bias is made once per stack by block 0
(``compute_bias``: the embedding of a (S, S) int64 bucket table, kept where the bias trains), and sdpa takes it as a
float mask (``create_position_bias_mask``: a contiguous copy in the encoder; in the decoder ``torch.where`` with a
causal (S, S) bool, which it keeps); the cross-attention's bias is zeros, made once. On a CPU (dropout on the
attention) sdpa runs its math path, which keeps the contiguous copies of q and k, the softmax, the dropout's noise
and output, and a copy of v. The backward walks the head, the decoder's blocks, the decoder's embeddings, the
encoder's final norm and blocks, then the encoder's embeddings, each part holding what the parts before it saved.
Gradient checkpointing, an attention mask with padding and 4/8-bit layers are refused by name (not replayed yet).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.setup import BOOL, F32, FP16, BF16, I64, Covers, around, promote
from kit.estimate.replay.tape import Tape

COVERS = Covers(blocks=("T5Block",),
                attention=("T5LayerSelfAttention", "T5LayerCrossAttention", "T5Attention"),
                mlp=("T5LayerFF", "T5DenseGatedActDense", "T5DenseActDense"), norms=("T5LayerNorm",))


def norm(tp: Tape, x, trainable: bool):
    """``T5LayerNorm``: ``x.to(fp32).pow(2)`` keeps the fp32 copy, ``x * rsqrt(var + eps)`` keeps x and the rsqrt
    ((B, S, 1) fp32), ``weight * h`` keeps h (cast to a half weight's dtype first) for the weight's grad."""
    st = tp.st
    xf = tp.cast(x, F32)
    rs = tp.new(x.n // st.H, F32, False)
    tp.save(xf, x, rs, when=x.rg)
    h = tp.new(x.n, promote(x.dt, F32), x.rg)
    h = tp.cast(h, st.w_other) if st.w_other in (BF16, FP16) else h
    tp.save(h, when=trainable)
    return tp.new(x.n, promote(h.dt, st.w_other), x.rg or trainable)


def math_attention(tp: Tape, q, k, v, rows_q: int, rows_k: int):
    """sdpa's math path (a CPU with dropout on the attention, or eager): contiguous copies of q and k for their
    matmul, the softmax's output, dropout's noise and output, a contiguous copy of v; the (B, S, heads x d)
    output copy that ``o`` reads. ``rows_q``/``rows_k``: B x the query's and the key's length."""
    st = tp.st
    inner = st.nh * st.hd
    rg = q.rg or k.rg or v.rg
    c = st.ac or promote(q.dt, k.dt)
    c = c if st.eager else F32 if c in (BF16, FP16) and st.device == "cpu" else c
    qc, kc, vc = tp.new(q.n, c, q.rg), tp.new(k.n, c, k.rg), tp.new(v.n, c, v.rg)
    tp.save(qc, when=k.rg)
    tp.save(kc, when=q.rg)
    probs = tp.new(rows_q * st.nh * (rows_k // st.B), F32 if st.ac else c, rg)
    tp.save(probs, when=rg)
    p = tp.dropout(probs, st.p_attn)
    tp.save(p, when=v.rg)
    tp.save(vc, when=rg)
    return tp.new(rows_q * inner, st.ac or c, rg)


def kernel_attention(tp: Tape, q, k, v, rows_q: int, rows_k: int, bias_rows: int):
    """CUDA's memory-efficient sdpa with a float bias (flash takes no mask): it keeps q, k, v (autocast's copies),
    the bias, its output and the logsumexp."""
    st = tp.st
    rg = q.rg or k.rg or v.rg
    if st.ac:
        q, k, v = (tp.cast(t, st.ac) for t in (q, k, v))
    lse = tp.new(rows_q * st.nh, F32, False)
    tp.save(q, k, v, lse, tp.new(bias_rows, q.dt, False), when=rg)
    out = tp.new(q.n, q.dt, rg)
    tp.save(out, when=rg)
    return out


def attention(tp: Tape, h, kv, prefix: str, rows_q: int, rows_k: int, causal: bool, bias_grad: bool):
    """One ``T5Attention``: q from ``h``, k and v from ``kv`` (h itself, or the encoder's output E), sdpa with the
    position bias as its float mask, ``o``. ``causal``: the decoder's self-attention, whose mask is
    ``torch.where(causal, bias, min)``: the (S, S) bool is kept where the bias needs a grad."""
    st = tp.st
    inner, H = st.nh * st.hd, st.H
    q = tp.linear(h, H, inner, f"{prefix}.q")
    k = tp.linear(kv, H, inner, f"{prefix}.k")
    v = tp.linear(kv, H, inner, f"{prefix}.v")
    if causal:
        S = rows_q // st.B
        tp.save(tp.new(S * S, BOOL, False), when=bias_grad)
    if st.math_attn or st.device != "cuda":
        o = math_attention(tp, q, k, v, rows_q, rows_k)
    else:
        # the bias is (1, heads, Sq, Sk), expanded over the batch, unless a padded batch's mask made it per row
        rows = rows_q if st.padded and not causal else rows_q // st.B
        o = kernel_attention(tp, q, k, v, rows_q, rows_k, st.nh * rows * (rows_k // st.B))
    return tp.linear(o, inner, H, f"{prefix}.o")


def feed_forward(tp: Tape, x, prefix: str):
    """``T5LayerFF``: norm, the gated GELU (``wi_0``, ``gelu_new``, ``wi_1``, their product) or one ``wi`` and
    its activation, dropout, ``wo``, ``x + dropout(.)``."""
    st = tp.st
    h = norm(tp, x, st.base_trainable)
    gate = tp.linear(h, st.H, st.F, f"{prefix}.DenseReluDense.wi_0" if st.gated else f"{prefix}.DenseReluDense.wi")
    a = tp.gelu_new(gate) if st.act == "gelu_new" else tp.gelu(gate)
    if st.gated:
        a = tp.binary(a, tp.linear(h, st.H, st.F, f"{prefix}.DenseReluDense.wi_1"), True, True)
    out = tp.linear(tp.dropout(a, st.p_resid), st.F, st.H, f"{prefix}.DenseReluDense.wo")
    return tp.binary(x, tp.dropout(out, st.p_resid))


def self_block(tp: Tape, x, rows: int, causal: bool):
    """``T5LayerSelfAttention``: norm, attention over x itself, ``x + dropout(o)``."""
    st = tp.st
    h = norm(tp, x, st.base_trainable)
    o = attention(tp, h, h, "layer.0.SelfAttention", rows, rows, causal, st.base_trainable)
    return tp.binary(x, tp.dropout(o, st.p_resid))


@around(covers=COVERS, final_norm="rms_norm")
def block(tp: Tape, x):
    """An encoder block: self-attention, feed-forward (what the registry's block mark carries; the whole model is
    :func:`whole`)."""
    return feed_forward(tp, self_block(tp, x, tp.st.T, False), "layer.1")


def decoder_block(tp: Tape, x, enc, rows: int, rows_enc: int):
    """A decoder block: causal self-attention, cross-attention over the encoder's output ``enc``, feed-forward."""
    st = tp.st
    x = self_block(tp, x, rows, True)
    h = norm(tp, x, st.base_trainable)
    o = attention(tp, h, enc, "layer.1.EncDecAttention", rows, rows_enc, False, False)
    x = tp.binary(x, tp.dropout(o, st.p_resid))
    return feed_forward(tp, x, "layer.2")


@dataclass(frozen=True)
class Part:
    """One part of the forward, in forward order, as the backward walk needs it."""

    where: str
    saved: int       # what it saves for backward
    bwd: int         # its backward's peak of saved and activation grads (Tape.backward_peak)
    bwd_grads: int   # ... the weight grads made by then
    grads: int       # its weight grads, all made (linear weights from the tape, and its norms')
    beside: int = 0  # the head: what the forward holds at the loss beside the saved tensors and the logits (the
    #                  decoder's KV cache, and E where nothing saved it)


def whole(st):
    """The replay of one T5 training forward (``st.S``: the source length, ``st.S_dec``: the target length,
    ``st.L``: the encoder's blocks, ``st.L_dec``: the decoder's), as a :class:`~kit.estimate.replay.core.Replay`
    whose moments are :func:`walk`'s."""
    from kit.estimate.replay.core import Replay

    refuse(st)
    tp = Tape(st)
    B, H, V = st.B, st.H, st.V
    rows_e, rows_d = B * st.S, B * st.S_dec
    emb_rg = st.base_trainable or st.input_grad
    parts = []
    norm_w = H * st.w_other if st.base_trainable else 0

    ever = {}   # uids saved by an earlier part: one storage (E, kept by every decoder block's k and v) counts once

    def run(where, fn, flowing, norms=0, bias=False):
        tp.saved, tp.order, tp.outs, tp.cache, tp.copies, tp.wsaved, tp.held = dict(ever), [], [], 0, 0, set(), {}
        out = fn()
        ever.update(dict.fromkeys(tp.saved, 0))
        peak, made = tp.backward_peak(flowing) if tp.outs else (tp.total(), 0)
        grads = sum(o.weight_grad for o in tp.outs) + norms * norm_w
        if bias and st.base_trainable:    # block 0's relative_attention_bias (buckets x heads)
            grads += st.buckets * st.nh * st.w_other
        parts.append(Part(where, tp.total(), peak, made, grads))
        return out

    def embed(rows):
        x = tp.new(rows * H, st.w_other, emb_rg)
        return tp.dropout(x, st.p_resid)

    x = run("encoder embeddings", lambda: embed(rows_e), 0)
    for j in range(st.L):
        x = run(f"encoder block {j + 1}", lambda x=x, j=j: first_bias(tp, rows_e, j, st.padded) or block(tp, x),
                rows_e * H * x.dt, norms=2, bias=j == 0)
    enc = run("encoder final norm", lambda: tp.dropout(norm(tp, x, st.base_trainable and not st.final_norm_frozen),
                                                       st.p_resid), rows_e * H * x.dt)
    y = run("decoder embeddings", lambda: embed(rows_d), 0)
    for j in range(st.L_dec):
        y = run(f"decoder block {j + 1}", lambda y=y, j=j: first_bias(tp, rows_d, j, False)
                or decoder_block(tp, y, enc, rows_d, rows_e), rows_d * H * y.dt, norms=3, bias=j == 0)
    h = run("decoder final norm", lambda: tp.dropout(norm(tp, y, st.base_trainable and not st.final_norm_frozen),
                                                     st.p_resid), rows_d * H * y.dt)
    head_trains = (st.base_trainable and not st.lm_head_frozen) or st.lm_head_trains
    box = {}

    def head():
        logits = tp.linear(h, H, V, "lm_head", trainable=head_trains, w=st.w_other, quant="none")
        box["logits"] = logits
        ls = tp.new(logits.n, F32 if st.ac else logits.dt, logits.rg)   # log_softmax (autocast: fp32), kept
        tp.save(ls, when=logits.rg)
        return tp.new(1, F32, logits.rg)

    run("head", head, 0)
    logits = box["logits"]
    # T5Stack copies the config for the decoder when the model is built: Trainer's use_cache=False reaches the top
    # config only, so the decoder fills an EncoderDecoderCache (torch.cat copies of every layer's self- and
    # cross-attention k and v) in training and evaluation alike, alive till the model's outputs go
    kv_dt = promote(enc.dt, st.w)   # (under autocast: the half linear's output, the cache's dtype)
    cache = 2 * st.L_dec * B * (st.S_dec + st.S) * st.nh * st.hd * (st.ac or kv_dt)
    e_bytes = rows_e * H * enc.dt
    parts[-1] = replace(parts[-1], beside=cache - cache_saved(st, cache, kv_dt) + (0 if enc.uid in ever else e_bytes))
    return Replay(L=st.L + st.L_dec, ckpt=False, embed=parts[0].saved + parts[st.L + 2].saved,
                  block=max(p.saved for p in parts if " block " in p.where),
                  block_sum=sum(p.saved for p in parts if " block " in p.where), block_in=0, shared=0,
                  head=parts[st.L + 1].saved + parts[-2].saved + parts[-1].saved - logits.n * (4 if st.ac else
                                                                                              logits.dt),
                  head_in=0, loss=logits.n * (4 if st.ac else logits.dt), logits_live=logits.n * logits.dt, cache=0,
                  block_bwd=0, block_bwd_grads=0, hidden=rows_d * H * h.dt, copies_block=0,
                  copies_head=0, copies_head_in=0, last_logits=logits.n * logits.dt,
                  ls=logits.n * (4 if st.ac else logits.dt), parts=tuple(parts), forward_held=cache + e_bytes,
                  enc_grad=rows_e * H * enc.dt if enc.rg else 0,
                  walk=walk)


def cache_saved(st, cache: int, kv_dt) -> int:
    """Of the decoder's KV cache, what attention saves as it is (counted among the saved bytes already): attention
    reads k and v from the cache (``cache.update`` returns its cat copies, contiguous); sdpa's math path saves v for
    its last matmul without a copy (k is scaled first: a new tensor), CUDA's kernel saves both, unless autocast (or a
    CPU's fp32 math on half inputs) casts them."""
    if st.ac or (st.device == "cpu" and kv_dt in (BF16, FP16)):
        return 0
    return cache // 2 if st.math_attn or st.device != "cuda" else cache


# What the whole replay does not follow yet: the Setup field, and its name in the refusal
NOT_REPLAYED = (("ckpt", "gradient checkpointing"), ("quant", "4-bit/8-bit layers"), ("liger", "Liger's kernels"),
                ("fused_head", "TRL's fused LM head"), ("trl_offload", "activation offloading"),
                ("frozen_below", "frozen bottom blocks"), ("own", "a head of one's own"), ("dora", "DoRA"))


def refuse(st) -> None:
    """Refuse, in one sentence, what this replay does not follow (:data:`NOT_REPLAYED`, a classifier head, the
    frozen embeddings of a full fine-tune)."""
    from kit.inputs import InputError

    found = next((name for field, name in NOT_REPLAYED if getattr(st, field) not in (False, 0, (), "none")), None)
    found = found or ("a classifier head" if st.task != "causal-lm" else
                      "weights loaded in half precision (T5 keeps its wo layers in fp32, _keep_in_fp32_modules)"
                      if st.w != F32 else
                      "frozen embeddings, final norm or LM head in a full fine-tune"
                      if st.embed_frozen or st.final_norm_frozen or st.lm_head_frozen else None)
    if found:
        raise InputError("model", f"T5 (an encoder-decoder) is replayed with full fine-tuning or LoRA, not yet with "
                         f"{found}: estimate it without, or measure the run with kit.watch(trainer).",
                         code="t5-not-replayed")


def first_bias(tp: Tape, rows: int, j: int, masked: bool):
    """Block 0 of a stack makes the relative position bias: the embedding keeps its (S, S) int64 bucket table where
    the bias trains; ``masked`` (the encoder of a padded batch): every block's ``torch.where(mask, bias, min)`` keeps
    the one (B, 1, S, S) bool mask. Returns None (the block runs after it)."""
    st = tp.st
    if j == 0:
        S = rows // st.B
        tp.save(tp.new(S * S, I64, False), when=st.base_trainable)
        if masked:
            tp.save(tp.new(rows * S, BOOL, False), when=st.base_trainable)
    return None


def walk(rp, *, grads_embed: int, grads_block: int, grads_head: int, wtemp_block: int, wtemp_head: int,
         grads_before: int = 0, head_half: int = 0, tied: int = 0) -> list:
    """The moments of a T5 forward and backward (:func:`kit.estimate.replay.core.moments`' arguments; the blocks'
    grads are each part's own, from the tape): at the loss; the loss's and the head's backward; then every part's
    backward, last part first, beside what the parts before it saved and the grads made so far. E's grad grows in one
    buffer through the decoder's backward (every block's cross-attention k and v add to it); the shared embedding's
    grad from the decoder waits in autograd's buffer until the encoder's embeddings add theirs."""
    from kit.estimate.replay.core import Moment

    parts, acc = rp.parts, bool(grads_before)
    below = [0]
    for p in parts:
        below.append(below[-1] + p.saved)
    head = parts[-1]
    kept = head.saved - rp.ls   # the head's saved input (lm_head's)
    last = len(parts) - 1
    out = [Moment(where="forward (at the loss)", activations=below[last] + kept + head.beside,
                  logits=rp.ls + rp.logits_live, copies=0, gradients=grads_before, temporaries=0),
           Moment(where="backward (loss)", activations=below[last] + kept, logits=3 * rp.ls, copies=0,
                  gradients=grads_before, temporaries=0),
           Moment(where="backward (head)", activations=below[last] + kept, logits=rp.last_logits, copies=0,
                  gradients=grads_before + (0 if acc else grads_head), temporaries=wtemp_head + rp.hidden)]
    done = grads_before + (0 if acc else grads_head)
    decoder_from = next(i for i, p in enumerate(parts) if p.where == "decoder embeddings")
    for i in range(last - 1, -1, -1):
        p = parts[i]
        waiting = rp.enc_grad if i >= decoder_from and p.where != "decoder final norm" else 0
        # the shared weight's grad: the LM head's (tied, counted among the head's grads from its backward on) waits
        # in autograd's buffer; the decoder's embeddings make theirs and the two are summed out of place (a
        # transposed view is not added into), the encoder's make theirs and add it in place. Untied (grads_embed),
        # the decoder's waits for the encoder's.
        waiting += (2 * tied + grads_embed if i == decoder_from else grads_embed if i < decoder_from else 0)
        made = tied + (0 if acc else grads_embed) if i == 0 else 0
        out.append(Moment(where=f"backward ({p.where})", activations=below[i] + p.saved, logits=0, copies=0,
                          gradients=done + (0 if acc else p.bwd_grads),
                          temporaries=p.bwd - p.saved + waiting + made + (wtemp_block if " block " in p.where else 0)))
        done += 0 if acc else p.grads
    return out


def shapes(cfg) -> dict:
    """T5Config's own names for the shapes: both stacks' depths, the gated feed-forward and its activation, the
    relative position buckets, and its one dropout (``dropout_rate``: embeddings, attention, residual branches)."""
    return dict(H=cfg.d_model, F=cfg.d_ff, nh=cfg.num_heads, kvh=cfg.num_heads, hd=cfg.d_kv, L=cfg.num_layers,
                L_dec=cfg.num_decoder_layers, gated=bool(cfg.is_gated_act), act=cfg.dense_act_fn,
                buckets=cfg.relative_attention_num_buckets, p_attn=cfg.dropout_rate, p_resid=cfg.dropout_rate)


def refusal(cfg) -> str | None:
    """T5 v1.0's scaled decoder output (transformers 5.25's ``T5Config``: ``scale_decoder_outputs`` unless the config
    says ``tie_word_embeddings: false``, as Flan-T5's does; the LM head is tied to ``shared`` either way) and an
    activation other than GELU's, which this replay does not have."""
    if getattr(cfg, "scale_decoder_outputs", False):
        return ("scales the decoder's output by d_model ** -0.5 before its LM head (scale_decoder_outputs, T5 v1.0's: "
                "its config.json does not say tie_word_embeddings: false), which the estimator does not replay (it "
                "replays T5 v1.1 and Flan-T5)")
    if cfg.dense_act_fn not in ("gelu_new", "gelu"):
        return f"runs its feed-forward with {cfg.dense_act_fn}, which the estimator does not replay (it replays GELU's)"
    return None


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """T5's no_grad forward (``T5Stack.forward``, ``T5LayerFF``, ``NewGELUActivation``), at its largest: a feed-forward
    of the encoder's last block, or of the decoder's beside the encoder's output and the full KV cache. Beside
    ``inputs_embeds`` (a local of the stack's forward), the block's input, the attention's output and the normed one,
    the gated GELU holds four (tokens, d_ff) tensors at once (its input, ``0.5 * input`` and two of the tanh's
    temporaries; three with another activation), and the stack keeps its position bias, (1, heads, S, S)."""
    rows = tokens // setup.S
    ffn = (4 if setup.act == "gelu_new" else 3) if setup.gated else 2

    def stack(S, keys, layers):
        return rows * S * ((4 if layers > 1 else 3) * setup.H * hidden + ffn * setup.F * mlp) \
            + setup.nh * S * keys * setup.w_other

    kv = mlp
    cache = 2 * setup.L_dec * rows * (setup.S_dec + setup.S) * setup.nh * setup.hd * kv
    decoder = stack(setup.S_dec, setup.S_dec, setup.L_dec) + setup.nh * setup.S_dec * setup.S * kv \
        + rows * setup.S * setup.H * hidden + cache
    return max(stack(setup.S, setup.S, setup.L), decoder)


register_family("t5", block=block, shapes=shapes, refusal=refusal, whole=whole, no_grad_loop=NoGradLoop(no_grad_loop),
                dropout_modules=("dropout_rate",))
