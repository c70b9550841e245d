"""gpt-oss: ``transformers.models.gpt_oss.modeling_gpt_oss.GptOssDecoderLayer`` (and ``GptOssModel``), transformers
5.25.

- ``GptOssRMSNorm`` applies its weight in fp32 and casts after (``(weight * h).to(dtype)``), as OLMo-2's does.
- Attention with biases on q/k/v/o, grouped-query heads and rotary embeddings whose cos/sin are hd/2 wide
  (``emb = freqs``, not ``cat(freqs, freqs)``): ``_apply_rotary_emb`` multiplies the two halves of q and k by them
  and ``cat``s the results, so q and k come out (B, heads, S, hd)-contiguous and keep nothing but cos/sin.
- The attention runs eager whatever is asked: ``GptOssPreTrainedModel._supports_sdpa`` is False (on CUDA only a Hub
  flash kernel with sinks replaces it, which the kit does not replay). ``eager_attention_forward`` copies k and v up
  to the query heads (``repeat_kv``), ``matmul(q, k^T)`` keeps both; the scores (+ the mask, which every layer gets:
  eager builds one, sliding or full) are ``cat``-ed with the per-head ``sinks`` into (B, heads, S, S + 1) logits;
  ``- max(dim=-1).values`` keeps max's int64 indices; ``softmax`` keeps its (B, heads, S, S + 1) output, in the
  logits' dtype; the sink column is sliced off (a view) and ``matmul`` with v keeps that view (the softmax's
  storage) and the copied v; ``transpose(1, 2).contiguous()`` makes o_proj's input.
- ``GptOssMLP``: ``GptOssTopKRouter`` (``F.linear`` with a bias, then ``topk`` of the logits, keeping its int64
  indices, and a ``softmax`` of the k values only, keeping its (T, k) output) and ``GptOssExperts`` run by
  transformers' ``grouped_mm`` (:func:`kit.estimate.replay.moe.grouped_mm`), with what gpt-oss adds: the experts'
  biases, gathered per routed row (``gate_up_proj_bias[expert_ids_g]``, which keeps the (R,) expert ids when they
  train) and added in place, and its own gate (``_apply_gate``): gate and up interleaved (``[..., ::2]``, views of the
  (R, 2I) output, whose clamps keep that whole storage), ``gate * sigmoid(gate * alpha)`` (sigmoid keeps its output,
  the mul both operands) and ``(up + 1) * glu`` (keeps both).
- MXFP4: the released checkpoints store the experts' weights as MXFP4 blocks and scales. Training runs them
  dequantized (``Mxfp4Config(dequantize=True)``, TRL's gpt-oss recipe, and any GPU without transformers' MXFP4
  kernels, a T4 among them), so the replay and the weights take them in the load dtype; :func:`notes` says so and
  gives the bytes as stored beside it.
"""
from __future__ import annotations

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.moe import I32, grouped_mm
from kit.estimate.replay.setup import F32, I64, Covers, around, promote
from kit.estimate.replay.tape import Tape
from kit.inputs import Note

# MXFP4 as stored: 4 bits an element, and one 8-bit scale per 32 elements
MXFP4_BITS = 4 + 8 / 32


def attention_with_sinks(tp: Tape, q, k, v):
    """``eager_attention_forward`` with gpt-oss's sinks; returns o_proj's input."""
    st = tp.st
    B, S, nh = st.B, st.S, st.nh
    rg = q.rg or k.rg or v.rg
    if st.kvh != nh:   # repeat_kv's expand + reshape copies k and v up to the query heads
        k, v = tp.new(q.n, k.dt, k.rg), tp.new(q.n, v.dt, v.rg)
    if st.ac:   # matmul: autocast's lower-precision list
        q, k, v = (tp.cast(t, st.ac) for t in (q, k, v))
    tp.save(q, when=k.rg)
    tp.save(k, when=q.rg)
    cells = B * nh * S * (S + 1)   # the scores and one sink column per head and row
    tp.save(tp.new(B * nh * S, I64, False), when=rg)   # combined_logits.max(dim=-1): its indices
    probs = tp.new(cells, promote(q.dt, st.w), rg)   # cat with the sinks (the block weights' dtype) promotes
    tp.save(probs, when=rg)   # softmax keeps its output
    scores = tp.split(probs, (S, 1))[0] if S else probs   # probs[..., :-1]: a view of the softmax's storage
    scores = tp.cast(scores, v.dt)   # .to(value_states.dtype): a copy where the sinks promoted the logits
    tp.save(scores, when=v.rg)
    tp.save(v, when=rg)
    return tp.new(B * S * nh * st.hd, q.dt, rg)   # transpose(1, 2).contiguous()


def router(tp: Tape, h):
    """``GptOssTopKRouter``: its (T, E) logits, the (T, k) routing weights (in the logits' dtype) and indices."""
    st = tp.st
    logits = tp.linear(h, st.H, st.experts, "mlp.router", w=st.w_other, quant="none")
    indices = tp.new(st.T * st.top_k, I64, False)
    tp.save(indices, when=logits.rg)   # topk keeps its indices
    weights = tp.new(st.T * st.top_k, logits.dt, logits.rg)
    tp.save(weights, when=logits.rg)   # softmax of the top-k values keeps its output
    return logits, weights, indices


def gate(tp: Tape, gate_up, alive: list):
    """``GptOssExperts._apply_gate`` on the (R, 2I) output: gate and up interleaved, clamped, gated. ``alive``: the
    forward's locals so far; the gate's own are added to it (the forward's largest moment is its last mul).

    In backward each strided view's grad is a zero-filled (R, 2I) tensor (``slice_backward``); up's branch runs
    first, and its (R, 2I) grad waits beside the gate's until the two are summed."""
    g, up = tp.split(gate_up, 2)   # gate_up[..., ::2], gate_up[..., 1::2]: views of one storage
    full = gate_up.n * gate_up.dt
    tp.save(g, when=g.rg)   # clamp keeps its input (up's clamp: the same storage)
    g = tp.new(g.n, g.dt, g.rg, gin=full)
    if g.rg:
        tp.outs[-1].temporaries = full   # up's grad, waiting to be summed
    sig = tp.new(g.n, g.dt, g.rg)   # sigmoid(gate * alpha): the scalar mul keeps nothing
    tp.save(sig, when=g.rg)   # sigmoid keeps its output
    glu = tp.binary(g, sig, True, True)
    up = tp.new(up.n, up.dt, up.rg, gin=full)   # up.clamp(-limit, limit)
    up_1 = tp.new(up.n, up.dt, up.rg)
    gated = tp.binary(up_1, glu, True, True)   # (up + 1) * glu
    alive += [g, sig, glu, up, up_1, gated]
    return gated


def experts(tp: Tape, h, weights, alive: list):
    """``grouped_mm_experts_forward`` over gpt-oss's experts (transposed weights with biases); ``alive``: the
    forward's locals outside it, to which its own are added up to the gate's last mul."""
    st = tp.st
    H, I, rows, train = st.H, st.moe_F, st.T * st.top_k, st.base_trainable
    ids, perm = tp.new(rows, I64, False), tp.new(rows, I64, False)   # sort: expert_ids_g, perm
    index = tp.new(rows, I64, False)
    tp.save(index, when=h.rg)                              # hidden_states[perm // k] keeps its index
    xs = tp.new(rows * H, h.dt, h.rg)
    tp.save(perm, when=weights.rg)                         # sample_weights[perm] keeps perm
    ws = tp.new(rows, weights.dt, weights.rg)
    histc = tp.new(rows, I32, False)                       # expert ids as float (a CPU) or int32 (CUDA) for histc
    counts, offsets = tp.new(st.experts, I32, False), tp.new(st.experts, I32, False)   # histc, its cumsum
    tp.save(ids, when=train)                               # the biases' gathers keep expert_ids_g
    bias = tp.new(rows * 2 * I, st.w_other, False)         # gate_up_proj_bias[expert_ids_g], added in place
    gate_up = grouped_mm(tp, xs, H, 2 * I, train, offsets)
    alive += [ids, perm, xs, ws, histc, counts, offsets, bias, gate_up]
    gated = gate(tp, gate_up, alive)
    tp.at_peak = (tp.total(), set(tp.saved))   # the forward's largest moment: what is saved by then
    down = grouped_mm(tp, gated, I, H, train, offsets)     # + down_proj_bias[ids], in place
    weighted = tp.binary(down, ws, True, True)             # proj_out * sample_weights_g.unsqueeze(-1)
    tp.save(tp.new(rows, I64, False), when=weighted.rg)    # weighted_out[inv_perm] keeps its index
    out = tp.new(rows * H // st.top_k, weighted.dt, weighted.rg)   # .view(T, k, H).sum(1)
    return tp.cast(out, h.dt)


def forward_locals(tp: Tape, x, rest: list) -> list:
    """What the model's forward holds beside a block's tensors: ``inputs_embeds`` (a local of ``GptOssModel.forward``
    till it returns; block 1's norm saves it where it is fp32 and requires grad), the two eager masks (full and
    sliding, (B, 1, S, S) in the embeddings' dtype: the model builds both, and eager always builds them), and the
    block's input (the loop's ``hidden_states``)."""
    st = tp.st
    masks = [tp.new(st.B * st.S * st.S, st.w_other, False) for _ in range(2)]
    embeds_saved = (st.base_trainable or st.input_grad or st.embed_trains) and st.w_other == F32
    embeds = [tp.new(x.n, st.w_other, False)] if st.L > 1 and not embeds_saved else []
    return [x, *masks, *embeds, *rest]


@around(covers=Covers(blocks=("GptOssDecoderLayer",), attention=("GptOssAttention",),
                      mlp=("GptOssMLP", "GptOssTopKRouter", "GptOssExperts"), norms=("GptOssRMSNorm",)),
        final_norm="rms_norm_fp32")
def block(tp: Tape, x):
    st, H = tp.st, tp.st.H
    h = tp.rms_norm_fp32(x, st.base_trainable)
    q = tp.linear(h, H, st.nh * st.hd, "self_attn.q_proj")
    k = tp.linear(h, H, st.kvh * st.hd, "self_attn.k_proj")
    v = tp.linear(h, H, st.kvh * st.hd, "self_attn.v_proj")
    q, k = tp.rope(q, k, x, cat=True)
    tp.shared //= 2   # cos/sin are hd/2 wide (GptOssRotaryEmbedding: emb = freqs)
    o = attention_with_sinks(tp, q, k, v)
    residual = tp.binary(tp.linear(o, st.nh * st.hd, H, "self_attn.o_proj"), x)
    h = tp.rms_norm_fp32(residual, st.base_trainable)
    logits, weights, indices = router(tp, h)   # (GptOssMLP keeps the logits as ``_``)
    alive = forward_locals(tp, x, [residual, h, logits, weights, indices])
    y = tp.binary(residual, experts(tp, h, weights, alive))
    # the forward's largest moment: the gate's last mul, all of these alive; what they hold beside what the block
    # has saved by then, less what it saves after, is the replay's transient (its moment: "forward (the last
    # block)", kit.estimate.replay.core)
    saved_by_then, saved = tp.at_peak
    unsaved = sum((t.sn or t.n) * t.dt for t in {t.uid: t for t in alive}.values() if t.uid not in saved)
    tp.transient = 0 if st.ckpt else max(0, unsaved - (tp.total() - saved_by_then))
    return y


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """What ``GptOssModel.forward`` holds at its largest under ``no_grad`` (``evaluate()``): the last block's gate's
    last mul, with the tensors alive at :func:`block`'s forward moment but the sigmoid's output (nothing saves it:
    freed after its mul) and with the attention's probabilities (``GptOssDecoderLayer`` keeps the returned weights as
    ``_``, a view of them), none of them saved, beside the model's own (``inputs_embeds``, both eager masks, cos/sin);
    ``hidden``: the residual stream's dtype (``mlp`` is unused: the experts run in their weights' dtype, the router
    and attention in autocast's or their own). Its masks are its own (:func:`kit.estimate.evaluation.
    block_forward_bytes` adds none: ``own_mask``)."""
    st = setup
    rows, router_dt, experts_dt = tokens * st.top_k, st.ac or st.w_other, st.w_other
    model = 2 * (tokens // st.S) * st.S * st.S * st.w_other + st.S * st.hd * st.w_other \
        + (tokens * st.H * st.w_other if st.L > 1 else 0)
    block = 3 * tokens * st.H * hidden + tokens * st.experts * router_dt + tokens * st.top_k * (router_dt + 8)
    routed = rows * (2 * 8 + st.H * hidden + router_dt + 4) + 2 * st.experts * 4   # ids, perm, rows, weights, histc
    gated = rows * st.moe_F * experts_dt * (2 * 2 + 5)   # the gathered biases and gate_up (2I); five (R, I) tensors
    probs = tokens * st.nh * (st.S + 1) * (st.ac or st.w)
    return model + block + routed + gated + probs


def assumed(load_dtype: str) -> str:
    """The weights the figure assumes, for the verdict's line."""
    return f"MXFP4 experts dequantized to {load_dtype}"


def notes(info, load_dtype: str) -> list:
    """What a gpt-oss estimate assumes of MXFP4: the experts dequantized to the load dtype, as training runs them,
    and their bytes as stored beside it."""
    fused = sum(l.weight for l in info.leaves if l.kind == "experts" and l.short.endswith(("gate_up_proj",
                                                                                          "down_proj")))
    stored = int(fused * MXFP4_BITS / 8)
    return [Note(f"gpt_oss: its experts' {fused:,} weights, {stored / 2**30:.2f} GiB as stored (MXFP4), are taken "
                 f"dequantized to {load_dtype} (Mxfp4Config(dequantize=True)), as training and GPUs without MXFP4 "
                 "kernels (a T4) run them", field="quantization", code="mxfp4-dequantized")]


register_family("gpt_oss", block=block, no_grad_loop=NoGradLoop(no_grad_loop, own_mask=True), moe=True,
                weights_notes=notes, weights_assumed=assumed)
