"""Mixture-of-experts MLPs, as transformers 5 runs them: a top-k router, then the experts' fused 3-D parameters
run by ``grouped_mm_experts_forward`` (``transformers/integrations/moe.py``), the experts implementation
transformers picks by default, on a CPU and on CUDA.

Per block, with T = B x S tokens, E experts, k experts per token, I one expert's width and R = T x k routed rows:

- the router (``Qwen3MoeTopKRouter``, ``OlmoeTopKRouter``, ``MixtralTopKRouter``): ``F.linear(h, gate.weight)``
  (not an ``nn.Linear``: bitsandbytes never quantizes it and peft never adapts it); ``softmax(dtype=float32)``
  (keeps its fp32 (T, E) output); ``topk`` (keeps its (T, k) int64 indices); with ``norm_topk_prob`` (Mixtral:
  always) an in-place ``/= sum`` (keeps the (T, 1) sum and a clone of the (T, k) values); then
  ``.to(router_logits.dtype)`` (not Mixtral: its weights stay fp32, and so does the weighted experts' output
  until the final ``.to``);
- the experts: ``sort`` of the R expert ids; ``hidden_states[perm // k]`` (keeps its (R,) int64 index, makes the
  (R, H) gathered rows); ``sample_weights[perm]`` (keeps ``perm``); ``grouped_mm`` up with ``gate_up_proj``
  (keeps its input when the experts train, and the (E,) int32 offsets); ``SiLU(gate) * up`` on the two halves of
  its (R, 2I) output; ``grouped_mm`` down with ``down_proj``; ``* routing weight`` (keeps both); the inverse
  permutation's gather (keeps its (R,) int64 index); ``view(T, k, H).sum(1)``.

grouped_mm is not autocast: its input is cast to the experts' dtype, so under fp16/bf16 mixed precision fp32
experts run (and save) in fp32. Which expert gets which rows depends on the router, but nothing here does: every
saved tensor spans all R = T x k routed rows, and the offsets' (E,) tensor is all that is per expert. So the
figures are exact whatever the routing; only the kernels' own scratch on a GPU (not a saved tensor) could follow
one expert's share, which is at most T rows (a token goes to an expert once).
"""
from __future__ import annotations

from kit.estimate.replay.families import NoGradLoop
from kit.estimate.replay.setup import F32, I64, Dt, promote
from kit.estimate.replay.tape import Tape
from kit.inputs import Note

I32 = Dt("int32", 4)
# config._experts_implementation values whose saved tensors this module replays (None: transformers' default,
# grouped_mm, for a model class that declares its experts with @use_experts_implementation)
MODELED = (None, "grouped_mm")
# The config names of the experts' count (Qwen3-MoE and OLMoE, Mixtral) and of one expert's width (Qwen3-MoE;
# Mixtral and OLMoE name it intermediate_size)
_EXPERTS = ("num_experts", "num_local_experts")
_WIDTH = ("moe_intermediate_size", "intermediate_size")


def config_shapes(cfg) -> dict:
    """The :class:`~kit.estimate.replay.setup.Setup` fields of a mixture-of-experts config ({} for a dense one); a
    router that always renormalizes the top-k weights, or leaves them fp32 (Mixtral's), says so in its family's
    ``config_fields``.

    >>> from transformers import Qwen3MoeConfig
    >>> config_shapes(Qwen3MoeConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64))
    {'experts': 8, 'top_k': 2, 'moe_F': 64, 'norm_topk': False}
    """
    experts = next((getattr(cfg, k) for k in _EXPERTS if getattr(cfg, k, None)), 0)
    if not experts:
        return {}
    width = next(getattr(cfg, k) for k in _WIDTH if getattr(cfg, k, None))
    return dict(experts=experts, top_k=cfg.num_experts_per_tok, moe_F=width,
                norm_topk=bool(getattr(cfg, "norm_topk_prob", False)))


def grouped_mm(tp: Tape, x, fin: int, fout: int, trainable: bool, offsets):
    """``grouped_mm(x.to(w.dtype), w, offs)`` over the (E, fout, fin) experts' weight ``w`` and R rows of ``x``:
    keeps ``x`` for the weight's grad, and the (E,) int32 offsets (one tensor for both calls of a block)."""
    st = tp.st
    x = tp.cast(x, st.w_other)
    tp.save(x, when=trainable)
    tp.save(offsets, when=x.rg or trainable)
    out = tp.new(x.n // fin * fout, st.w_other, x.rg or trainable)
    if out.rg:
        tp.outs[-1].weight_grad = st.experts * fin * fout * st.w_other if trainable else 0
    return out


def router(tp: Tape, h):
    """The router's routing weights, (T, k) in the router logits' dtype."""
    st = tp.st
    T, E, k = st.T, st.experts, st.top_k
    logits = tp.linear(h, st.H, E, "mlp.gate", w=st.w_other, quant="none")
    tp.save(tp.new(T * E, F32, False), when=logits.rg)   # softmax(dtype=float32) keeps its output
    tp.save(tp.new(T * k, I64, False), when=logits.rg)   # topk keeps its indices
    top = tp.new(T * k, F32, logits.rg)
    if st.norm_topk:  # top /= top.sum(-1, keepdim=True), in place: keeps the sum and top's value before it
        tp.save(tp.new(T, F32, False), tp.new(T * k, F32, False), when=logits.rg)
        top = tp.new(T * k, F32, logits.rg)
    return top if st.weights_fp32 else tp.cast(top, logits.dt)   # .to(router_logits.dtype), but for Mixtral


def sparse_moe(tp: Tape, h):
    """One sparse MoE MLP on ``h``, the post-attention norm's (T, H) output; returns the block's MLP output."""
    st = tp.st
    H, I, rows = st.H, st.moe_F, st.T * st.top_k
    weights = router(tp, h)
    offsets = tp.new(st.experts, I32, False)                # cumsum(histc(expert ids)): (E,) int32
    tp.save(tp.new(rows, I64, False), when=h.rg)            # perm // k: the tokens' gather keeps its index
    xs = tp.new(rows * H, h.dt, h.rg)                       # hidden_states[perm // k]: (R, H)
    tp.save(tp.new(rows, I64, False), when=weights.rg)      # perm: the routing weights' gather keeps it
    ws = tp.new(rows, weights.dt, weights.rg)               # sample_weights[perm]: (R,)
    gate, up = tp.split(grouped_mm(tp, xs, H, 2 * I, st.base_trainable, offsets), 2)   # views of the (R, 2I) output
    tp.save(gate, when=gate.rg)                             # SiLU keeps its input (the whole (R, 2I) storage)
    act = tp.new(gate.n, gate.dt, gate.rg)
    down = grouped_mm(tp, tp.binary(act, up, True, True), I, H, st.base_trainable, offsets)
    weighted = tp.binary(down, ws, True, True)              # proj_out * sample_weights_g.unsqueeze(-1)
    tp.save(tp.new(rows, I64, False), when=weighted.rg)     # weighted_out[inv_perm] keeps its index
    restored = tp.new(rows * H, weighted.dt, weighted.rg)
    out = tp.new(restored.n // st.top_k, restored.dt, restored.rg)   # .view(T, k, H).sum(1)
    return tp.cast(out, h.dt)


def shared_expert_moe(tp: Tape, h):
    """A sparse MoE MLP with a shared expert beside the routed ones (``Qwen3_5MoeSparseMoeBlock``): the shared gated
    MLP (``Setup.shared_F`` wide) on ``h``, the router and experts of :func:`sparse_moe`, then
    ``sigmoid(shared_expert_gate(h)) * shared + routed`` (sigmoid keeps its (T, 1) output, the mul both operands)."""
    st = tp.st
    H, width = st.H, st.shared_F
    gate = tp.linear(h, H, width, "mlp.shared_expert.gate_proj")
    tp.save(gate, when=gate.rg)                             # SiLU keeps its input
    up = tp.linear(h, H, width, "mlp.shared_expert.up_proj")
    shared = tp.linear(tp.binary(tp.new(gate.n, gate.dt, gate.rg), up, True, True), width, H,
                       "mlp.shared_expert.down_proj")
    routed = sparse_moe(tp, h)
    scale = tp.sigmoid(tp.linear(h, H, 1, "mlp.shared_expert_gate"))
    return tp.binary(routed, tp.binary(scale, shared, True, True))


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """What ``Qwen3MoeModel.forward`` (``MixtralModel``'s and ``OlmoeModel``'s, op for op the same here) holds at its
    largest under ``no_grad`` (``evaluate()``), in the last block's ``grouped_mm_experts_forward``, over ``tokens``
    positions (``hidden``: the residual stream's element bytes; ``mlp`` is unused: the router runs in autocast's
    dtype or the stream's, the experts in their weights' dtype, as grouped_mm is not autocast).

    Alive throughout the experts' forward: four hidden states (``inputs_embeds``, a local of the model's forward
    till it returns; the block's input; the residual after attention; the MLP's normed input: three where block 1
    is the only one), the attention's probabilities where eager runs (the decoder layer keeps them as ``_``), the
    rotary cos/sin, the router's (T, E) logits (the sparse block keeps them as ``_``), the (T, k) routing weights
    and int64 indices; then the sort's expert ids and ``perm`` (R int64 each), the gathered (R, H) rows, the gathered
    (R,) weights, histc's 4-byte input, and the (E,) histc and offsets. On top, the larger of two moments:

    - the gate: ``act_fn(gate) * up`` holds the (R, 2I) up projection, the activation and the product;
    - the restore: ``weighted_out[inv_perm]`` holds the (R, H) down projection, the weighted rows, their reordered
      copy (in the weights' promoted dtype) and the (R,) int64 ``inv_perm``. In one dtype it is the larger where
      3H > 4I: Qwen3-30B-A3B's shipped widths (H 2048, I 768) put the peak here, Mixtral-8x7B's (4096, 14336) at
      the gate.

    LoRA on the attention adds only temporaries inside its projections, freed before the experts run. The
    attention mask is the caller's (:func:`kit.estimate.evaluation.block_forward_bytes`)."""
    st = setup
    rows = tokens * st.top_k
    router_dt = st.ac or hidden                               # F.linear on the normed stream
    weights_dt = F32 if st.weights_fp32 else router_dt        # Mixtral's stay fp32
    experts_dt = st.w_other
    weighted_dt = promote(experts_dt, weights_dt)             # proj_out * sample_weights_g
    model = (4 if st.L > 1 else 3) * tokens * st.H * hidden + 2 * st.S * st.hd * st.w_other   # + cos/sin
    probs = tokens * st.nh * st.S * (st.ac or st.w) if st.eager else 0
    router = tokens * st.experts * router_dt + tokens * st.top_k * (weights_dt + I64)
    routed = rows * (2 * I64 + st.H * hidden + weights_dt + 4) + 2 * st.experts * 4
    gate = rows * 4 * st.moe_F * experts_dt
    restore = rows * (st.H * (experts_dt + 2 * weighted_dt) + I64)
    return model + probs + router + routed + max(gate, restore)


LOOP = NoGradLoop(no_grad_loop)   # counts its own cos/sin (GRPO's rotary path reads dense configs only)


def refusal(cfg) -> str | None:
    """Why a mixture-of-experts config is not replayed (a clause after its name), or None where it is."""
    impl = getattr(cfg, "_experts_implementation", None)
    if impl not in MODELED:
        return (f"runs its experts with experts_implementation={impl!r}, and the estimator replays transformers' "
                "default, 'grouped_mm', only: load it without experts_implementation (or with 'grouped_mm')")
    if getattr(cfg, "mlp_only_layers", None) or getattr(cfg, "decoder_sparse_step", 1) != 1:
        return ("mixes dense and sparse layers (mlp_only_layers, decoder_sparse_step), and the estimator replays "
                "models whose every layer is sparse")
    if getattr(cfg, "router_jitter_noise", 0):
        return ("multiplies the router's input by jitter noise in training (router_jitter_noise), which the "
                "estimator does not replay: set router_jitter_noise=0")
    if getattr(cfg, "clip_qkv", None) is not None:
        return "clamps q, k and v in place (clip_qkv), which the estimator does not replay: set clip_qkv=None"
    if getattr(cfg, "output_router_logits", False):
        return ("computes the router's auxiliary loss (output_router_logits=True), which the estimator does not "
                "replay: set output_router_logits=False")
    return None


def notes(info, quantization: str, kbit_prepared: bool, batch_size: int, seq_len: int) -> list:
    """What a mixture-of-experts estimate rests on, said beside it (none for a dense model): the routing, the
    experts' dtype under quantization, and the kernel a GPU below sm80 runs instead."""
    experts = [l for l in info.leaves if l.kind == "experts"]
    if not experts:
        return []
    cfg, mt = info.config, info.config.model_type
    k, tokens = cfg.num_experts_per_tok, batch_size * seq_len
    out = [Note(f"{mt}: routing decides which expert gets which rows, not how many rows there are: every tensor the "
                f"experts save spans all {tokens:,} tokens x top-{k} = {tokens * k:,} routed rows, so the figure holds "
                f"for any routing (one expert's share lies between 0 and {tokens:,} rows)", field="model",
                code="moe-routing")]
    if quantization != "none":
        fused = sum(l.weight for l in experts)
        kept = "cast to fp32 by prepare_model_for_kbit_training (--kbit-recipe lean keeps them in the load dtype)" \
            if kbit_prepared else "kept in the load dtype"
        out.append(Note(f"{mt}: {quantization} quantizes nn.Linear layers only; the experts' fused 3-D parameters "
                        f"({fused:,} of them) and the router stay unquantized, {kept}", field="quantization",
                        code="moe-experts-unquantized",
                        cause=("weights", "the experts stay unquantized, in "
                                          f"{'fp32' if kbit_prepared else 'the load dtype'}")))
    out.append(Note(f"{mt}: on a GPU below sm80 (a T4) transformers runs its grouped_mm fallback, whose backward "
                    "also makes a zero-filled grad of each layer's experts' weights while it runs, frozen or not: "
                    "that temporary is not in this figure", field="device", code="moe-grouped-mm-fallback"))
    return out
