"""How :func:`kit.estimate.estimate` puts an estimate together, in three stages:

1. :func:`~kit.estimate.counts.count_parameters` walks the model's layers once: weights as loaded and as trained (4-bit, 8-bit,
   LoRA adapters, the k-bit recipe's fp32 upcast), gradients, optimizer state and the CPU RAM to build it;
2. :func:`replay_setup` turns the config and those counts into the :class:`~kit.estimate.replay.Setup` the
   activation replay runs on;
3. :func:`phases` finds the peak of the forward/backward phase (from the replay's backward timeline) and of
   the optimizer step, and of ``Trainer.evaluate()``, and writes the :class:`~kit.estimate.result.Estimate`.

:class:`Plan` is what the options decide before anything is counted. Bytes are ints, per part of the model
(``"embed"``, ``"block"``, ``"head"``) where a dict.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from kit import inputs as kin
from kit import optimizers
from kit.estimate import quantization as kq
from kit.estimate import replay as act
from kit.estimate import reserved as kr
from kit.estimate.evaluation import block_forward_bytes, eval_peak
from kit.estimate.inventory import Info, default_targets, in_module, lora_matches
from kit.estimate.offload_options import offload_notes, refuse_offload
from kit.estimate.result import Context, Estimate
from kit.estimate.counts import Counts


@dataclass
class Plan:
    """The options as read, and what they decide before anything is counted."""

    model: str
    batch: int
    seq: int
    precision: str
    quant: str
    lora_r: int
    lora: set                 # names of the Linear modules that get adapters
    optimizer: str
    ckpt: bool                # checkpointing on, the model's default resolved
    reentrant: bool           # ... and reentrant
    kbit_recipe: bool         # prepare_model_for_kbit_training runs (quantized, standard recipe, no head on logits)
    accum: int
    load: str                 # the load dtype's name
    attn: str
    recipe: str
    lora_dropout: float
    padded: bool
    device: str
    ev: dict                  # evaluate()'s batch size, gather, samples and accumulation
    bnb: kq.Bnb
    fused: bool = False       # TRL's fused LM head (kit.estimate.replay.fused_head)
    adapter: act.Dt = act.FP32  # LoRA adapters' dtype (fp32; TRL casts them to bf16 on k-bit models)
    input_grad: bool | None = None  # enable_input_require_grads ran (None: input_requires_grad decides)
    liger: tuple = ()         # Liger's kernels that run (kit.estimate.replay.liger.kernels)
    offload: dict = field(default_factory=dict)  # ckpt_every_n_layers, checkpoint_offload, activation_offloading
    task: str = "causal-lm"   # the head (Info.task): "causal-lm", "seq-cls", "token-cls"
    head_copy: bool = False   # LoRA on a classifier: peft's modules_to_save copy of its head trains

    # The dtypes are act.Dt: bytes per element (ints, for the byte counts) that tell bf16 from fp16.
    @property
    def load_bytes(self) -> act.Dt:        # the loaded weights' dtype
        return act.dtype(self.load)

    @property
    def half(self) -> act.Dt | None:       # autocast's dtype (None: fp32, no autocast)
        return act.dtype(self.precision) if self.precision != "fp32" else None

    @property
    def trained_bytes(self) -> act.Dt:     # the dtype of the parameters that are not 4-bit/8-bit, after the recipe
        return act.FP32 if self.kbit_recipe else self.load_bytes  # (the recipe casts fp16/bf16 ones to fp32)


def plan(info: Info, *, model, B, S, precision, quant, lora_r, lora_targets, optimizer, ckpt, accum, load, attn,
         recipe, lora_dropout, padded, device, ev, bnb=kq.Bnb(), fused=False, adapter="fp32",
         input_grad=None, liger=(), offload=None, train_head=None) -> Plan:
    """Read the options against the model: which layers get LoRA, whether the k-bit recipe and checkpointing
    run; refuse what cannot be trained."""
    vh, leaves = info.vocab_head, info.leaves
    if quant != "none" and not lora_r and not vh:
        raise kin.InputError("quantization", "4-bit/8-bit weights cannot be trained directly (Trainer refuses a "
                             "purely quantized model): add LoRA adapters with lora_r > 0.", code="quantized-needs-lora")
    if lora_targets and not lora_r:
        raise kin.InputError("lora_targets", "lora_targets needs lora_r > 0: set lora_r (e.g. 16), or leave "
                                             "lora_targets out.", code="targets-need-lora")
    lora = set()
    if lora_r and lora_targets == kin.ALL_LINEAR:  # peft: every Linear/Conv1D but a PreTrainedModel's output
        lora = {l.name for l in leaves if l.kind == "linear" and l.name != info.output_head}
    elif lora_r:
        targets = lora_targets or tuple(default_targets(info))
        lora = set(lora_matches(tuple(l.name for l in leaves if l.kind == "linear"), targets))
        if not lora:
            names = sorted({l.short.split(".")[-1] for l in leaves if l.kind == "linear"})
            raise kin.InputError("lora_targets", f"lora_targets {list(targets)} match no Linear module of this "
                                 f"model (its Linear modules: {', '.join(names)}): name some of those, or pass "
                                 f"'{kin.ALL_LINEAR}'.", code="targets-match-nothing")
    std = quant != "none" and recipe == "standard" and not vh  # prepare_model_for_kbit_training
    reentrant = bnb.reentrant_for(ckpt, std)  # (8-bit layers keep their inputs through non-reentrant checkpointing)
    ckpt = (vh or std) if ckpt is None else bool(ckpt)
    head_trains = vh and not set(info.head_layers) & lora   # a head on the logits, not adapted, trains as loaded
    if precision == "fp16" and load == "fp16" and device == "cuda" and not std and (not lora_r or head_trains):
        raise kin.InputError("load_dtype", "fp16 trainable weights under fp16 mixed precision fail at the first "
                             "optimizer step (GradScaler: 'Attempting to unscale FP16 gradients'): load the model in "
                             "fp32, or in bf16 on a GPU that has it.", code="fp16-trainable-weights")
    if fused and (vh or getattr(info.config, "final_logit_softcapping", None)):
        raise kin.InputError("fused_lm_head", "TRL's fused LM head is modeled on a plain causal LM without final-logit "
                             "soft-capping or a head on the logits: estimate this model without it.",
                             code="fused-head-not-modeled")
    if "flce" in liger and info.output_head in lora:
        raise kin.InputError("lora_targets", "Liger's fused linear cross-entropy reads lm_head.weight directly, past "
                             "a LoRA adapter on it: leave lm_head out of lora_targets.", code="liger-head-lora")
    refuse_offload(offload or {}, ckpt=ckpt, reentrant=reentrant, fused=fused)
    refuse_for_classifier(info, fused=fused, liger=liger)
    head_copy = bool(info.classifier and lora_r and not any(in_module(n, info.classifier) for n in lora)
                     and train_head is not False)
    return Plan(model, B, S, precision, quant, lora_r, lora, optimizer, ckpt, reentrant, std, accum, load, attn,
                recipe, lora_dropout, padded, device, ev, bnb, fused, act.dtype(adapter), input_grad, tuple(liger),
                offload or {}, info.task, head_copy)


def refuse_for_classifier(info: Info, *, fused: bool, liger) -> None:
    """A classifier head has no vocabulary logits: TRL's fused LM head and Liger's fused cross-entropy have none to
    fuse, and are refused there in one sentence."""
    if info.task == "causal-lm":
        return
    if fused or "flce" in liger:
        name = "fused_lm_head" if fused else "liger_kernel"
        raise kin.InputError(name, f"{name} fuses a causal LM's vocabulary head, and this {info.task} model has a "
                             f"classifier head ({info.classifier}) instead: estimate it without {name}.",
                             code="fused-head-classifier")


def input_requires_grad(p: Plan) -> bool:
    """Whether the embeddings' output requires grad: ``enable_input_require_grads`` registered its hook (read
    from a real model where there is one: ``Plan.input_grad``), else as the libraries and the kit's loaders do.

    ``PreTrainedModel.gradient_checkpointing_enable`` runs it for a model fed ``input_ids`` (transformers
    ``modeling_utils.py``), and ``peft.prepare_model_for_kbit_training`` only with its checkpointing
    (``use_gradient_checkpointing``, peft ``utils/other.py``); ``get_peft_model`` alone does not, unless the
    model already checkpoints (peft ``PeftModel.__init__``: ``if getattr(model, "is_gradient_checkpointing",
    True)``). So: with checkpointing, and otherwise not (a trained embedding makes its output require grad
    anyway: the replay's own rule).
    """
    return p.input_grad if p.input_grad is not None else p.ckpt


def replay_setup(info: Info, p: Plan) -> act.Setup:
    """Stage 2: the shapes, dtypes and layers the activation replay runs on."""
    cfg = info.config
    if info.family == "gpt2":
        H, nh = cfg.n_embd, cfg.n_head
        shapes = dict(H=H, F=cfg.n_inner or 4 * H, nh=nh, kvh=nh, hd=H // nh, L=cfg.n_layer,
                      p_attn=cfg.attn_pdrop, p_resid=cfg.resid_pdrop, p_embd=cfg.embd_pdrop)
    else:
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        shapes = dict(H=H, F=cfg.intermediate_size, nh=nh, kvh=getattr(cfg, "num_key_value_heads", None) or nh,
                      hd=getattr(cfg, "head_dim", None) or H // nh, L=cfg.num_hidden_layers,
                      p_attn=getattr(cfg, "attention_dropout", 0.0))
        shapes |= act.config_shapes(cfg, info.family, shapes["hd"])  # windows, soft-caps, partial rotary, ...
    # a head on the logits (scenario 1's Linear(V, V), or the V->r->V of its fix (b)), in forward order
    head = [next(l for l in info.leaves if l.name == n) for n in info.head_layers]
    lora = {l.short: p.lora_r for l in info.leaves if l.name in p.lora and l.part == "block"} \
        | {l.name.split(".")[-1]: p.lora_r for l in info.leaves if l.name in p.lora and l.part == "head"}
    return act.Setup(family=info.family, B=p.batch, S=p.seq, V=cfg.vocab_size, w=p.load_bytes,
                     w_other=p.trained_bytes, ac=p.half, base_trainable=not p.lora_r and not info.vocab_head,
                     quant=p.quant, compute=act.dtype(p.bnb.compute_dtype),
                     dequant=kq.dequant_bytes(p.bnb, p.load),  # (the replay puts each layer's at its backward)
                     reentrant=p.reentrant, lora=lora, lora_dropout=p.lora_dropout,
                     input_grad=input_requires_grad(p), attn=p.attn, padded=p.padded, ckpt=p.ckpt, device=p.device,
                     head=tuple((l.name, l.fout) for l in head), head_w=p.load_bytes,
                     head_trainable=bool(head) and all(l.trainable for l in head) and not p.lora_r,
                     fused_head=p.fused, adapter=p.adapter, liger=p.liger, task=info.task, labels=info.num_labels,
                     head_trains=p.head_copy or (not p.lora_r and any(l.trainable for l in info.leaves
                                                                      if in_module(l.name, info.classifier))),
                     p_head=info.head_dropout, own=own_bytes(info.own_head), **shapes,
                     **{k: v for k, v in (("ckpt_every", p.offload.get("ckpt_every_n_layers", 1)),
                                          ("ckpt_offload", p.offload.get("checkpoint_offload", False)),
                                          ("trl_offload", p.offload.get("activation_offloading", False))) if v})


def own_bytes(head) -> tuple:
    """The replay's figures of a head of the user's own (:class:`kit.estimate.own_head.OwnHead`): saved bytes per
    token, per row and once, and the logits' bytes per row; () for a transformers head."""
    return (head.per_token, head.per_row, head.fixed, head.logits_row) if head else ()


def own_head_cache(info: Info, st: act.Setup, rows: int, dt: int) -> int:
    """The KV cache a decoder base under a head of the user's own builds in evaluation (bytes): Trainer sets
    ``model.config.use_cache = args.use_cache`` (False) only on a model with a ``config``, so a plain module's base
    keeps its own (``use_cache=True`` in most configs), and its eval-mode forward fills a cache of every layer's
    k and v, (rows, kvh, S, hd) each, alive till the module's forward returns."""
    if not info.own_head or act.FAMILIES[info.family].encoder or not getattr(info.config, "use_cache", False):
        return 0
    return 2 * st.L * rows * st.kvh * st.S * st.hd * dt


def encoder_notes(info: Info, p: Plan) -> list:
    """What the replay of an encoder does not yet follow, said where it applies: LoRA dropout on the attention's
    inputs, whose backward autograd runs while the attention's other grads wait (on tiny BERT twins, measured from
    -2.7% with dropout on ``query`` to +4.3% on ``value``; exact without dropout)."""
    if not (act.FAMILIES[info.family].encoder and p.lora_r and p.lora_dropout):
        return []
    return [kin.Note(f"LoRA dropout on an encoder ({info.family}): the backward's order around its attention is not "
                     "replayed op for op, so the peak may be a few percent off (exact with lora_dropout=0)",
                     field="lora_dropout", code="encoder-lora-dropout")]


def batch_row_bytes(task: str, S: int) -> int:
    """One row of the batch on the device: input_ids and attention_mask, [S] int64 each, and the labels: [S]
    int64 per token (causal LM, token classification), one int64 per sequence (sequence classification)."""
    return 2 * S * 8 + (8 if task == "seq-cls" else S * 8)


def phases(info: Info, p: Plan, c: Counts, st: act.Setup, notes: list, loop: dict | None = None,
           expandable: bool = False) -> Estimate:
    """Stage 3: the forward/backward phase, the optimizer step and evaluation; the larger of the first two
    is the peak.

    ``loop``: what a plain PyTorch loop holds beyond Trainer (:class:`~kit.training_setup.TrainingSetup`'s
    ``outputs_kept`` and ``grads_kept``; ``optimizer_before_move`` changes nothing on one device)."""
    loop = loop or {}
    rp = act.replay(st)
    g, L = c.grads, st.L
    # the model's outputs, held from the forward into the next step's (`outputs = model(**batch)` rebound only when
    # the next forward returns): the logits Trainer lets go at the loss, and the KV cache (config.use_cache), whose
    # k/v sdpa does not save itself where GQA repeats them (one storage otherwise)
    cache = 2 * L * p.batch * p.seq * st.kvh * st.hd * (p.half or p.load_bytes) \
        if getattr(info.config, "use_cache", False) and st.kvh != st.nh else 0
    held_out = rp.last_logits + cache if loop.get("outputs_kept") else 0

    def peak(later: bool, **kw):   # step 1's forward has no earlier outputs beside it
        return max((replace(x, logits=x.logits + held_out) if later or x.where.startswith("backward") else x
                    for x in act.step_moments(rp, act.moments(rp, **kw), later)), key=lambda x: x.total)

    fresh = dict(grads_embed=g["embed"], grads_block=g["block"] // L, grads_head=g["head"],
                 wtemp_block=c.wtemp["block"], wtemp_head=c.wtemp["head"], head_half=c.wtemp["head"], tied=c.moved)
    # every grad alive from the forward on, each new one added in place: gradient accumulation's later
    # micro-batches, and every step after the first where zero_grad(set_to_none=False) keeps the grads
    alive = dict(grads_embed=c.wnew["embed"], grads_block=0, grads_head=0, wtemp_block=max(c.wtemp["block"],
                 c.wnew["block"]), wtemp_head=c.wnew["head"], grads_before=c.gradients, head_half=c.wtemp["head"],
                 tied=c.moved)
    first, m = peak(False, **fresh), peak(True, **fresh)   # step 1 (no grads before its backward), the later steps
    if p.accum > 1 and c.gradients:
        first, m = (max(x, peak(later, **alive), key=lambda x: x.total) for x, later in ((first, False), (m, True)))
    if loop.get("grads_kept") and c.gradients:
        m = max(m, peak(True, **alive), key=lambda x: x.total)
    weights = c.weights + info.buffers_bytes
    inputs = p.batch * batch_row_bytes(p.task, p.seq)
    fwdbwd = weights + c.optimizer + m.total + inputs
    step_temp = optimizers.step_temporaries(p.optimizer, c.trained, p.device)   # its step's own, at their highest
    step = weights + c.gradients + c.optimizer + step_temp + held_out
    ev = eval_peak(rp, B=p.batch, Be=p.ev["batch_size"], S=p.seq, V=st.labels or st.V, held=weights + c.optimizer,
                   copies=c.halves, inputs_per_row=batch_row_bytes(p.task, p.seq), gather=p.ev["gather"],
                   samples=p.ev["samples"], accumulation=p.ev["accumulation"], device=p.device, mixed=bool(p.half),
                   pooled=p.task == "seq-cls", blocks=block_forward_bytes(st, p.ev["batch_size"]),
                   head=info.own_head.eval_bytes(p.ev["batch_size"], p.seq) if info.own_head else 0,
                   kv_cache=own_head_cache(info, st, p.ev["batch_size"], p.half or p.load_bytes))
    if fwdbwd >= step:
        phase, moment = "forward/backward", m.where
        parts = {"weights": weights, "gradients": m.gradients, "optimizer state": c.optimizer,
                 "activations": m.activations, "logits & loss": m.logits, "autocast weight copies": m.copies,
                 "temporaries": m.temporaries + inputs}
    else:
        phase = moment = "optimizer step"
        parts = {"weights": weights, "gradients": c.gradients, "optimizer state": c.optimizer,
                 "temporaries": step_temp, **({"model outputs held": held_out} if held_out else {})}
    notes = notes + kq.notes(rp)
    host = act.host_peak(act.moments(rp, **fresh)) if rp.layers else 0   # pinned RAM for saved activations
    notes += offload_notes(rp, p.offload, host, p.device) if rp.layers else []
    if ev.moment == "forward (a block)":
        notes.append(kin.Note("the evaluation peak is set by the blocks, where the kit counts at most what one block "
                              "saves in training: an upper bound (it is exact where the logits set it)",
                              field="eval_batch_size", code="eval-upper-bound"))
    by_bytes = sorted(c.offenders, key=lambda t: (t[2], t[1]), reverse=True)
    peak = max(fwdbwd, step)

    def reserve(peak_bytes):   # on first use only: the allocator's model runs over the step laid out as tensors
        if p.device != "cuda":
            return kr.Reserved(peak_bytes, 0, expandable, peak_bytes)
        return kr.reserved(c.tensors, rp, peak_bytes, inputs=inputs, step_temp=step_temp, accum=p.accum,
                           expandable=expandable)

    return Estimate(
        params=c.params, trainable_params=c.trainable, weights_bytes=weights, gradients_bytes=c.gradients,
        optimizer_bytes=c.optimizer + c.paged, activations_bytes=rp.activation_bytes(), logits_bytes=rp.logits_bytes(),
        peak_bytes=peak, first_step_peak_bytes=max(weights + first.total + inputs, step),
        eval_peak_bytes=ev.peak_bytes, eval_moment=ev.moment,
        cpu_build_bytes=c.build + c.streamed + info.buffers_bytes, peak_phase=phase, peak_moment=moment,
        loaded_weights_bytes=c.loaded + info.buffers_bytes, paged_optimizer_bytes=c.paged,
        autocast_copies_bytes=rp.copies_saved + rp.cache, saved_bytes=rp.saved_bytes(),
        quantized_params=c.quantized, unquantized_params=c.unquantized, offloaded_bytes=host,
        offenders=by_bytes[:10] + [o for o in sorted(by_bytes, key=lambda t: t[1], reverse=True)[:5]
                                   if o not in by_bytes[:10]],
        notes=notes, setup=dict(model=p.model, batch_size=p.batch, seq_len=p.seq, precision=p.precision,
                                quantization=p.quant, lora_r=p.lora_r, optimizer=p.optimizer,
                                optim=optimizers.trainer_optim(p.optimizer),
                                gradient_checkpointing=p.ckpt, grad_accum=p.accum,
                                load_dtype=p.load, attn_implementation=p.attn, kbit_recipe=p.recipe,
                                device=p.device, **p.bnb.setup(p.quant, p.ckpt, p.reentrant),
                                eval_batch_size=p.ev["batch_size"], eval_gather=p.ev["gather"],
                                eval_samples=p.ev["samples"], eval_accumulation_steps=p.ev["accumulation"],
                                expandable_segments=expandable, **({"fused_lm_head": True} if p.fused else {}),
                                **({"liger_kernel": True} if p.liger else {}),
                                **p.offload,   # (only the options that differ from their defaults)
                                **({"adapter_dtype": "bf16"} if p.adapter == 2 else {}),
                                **({"task": p.task, "num_labels": info.num_labels} if info.classifier else {}),
                                **({"train_head": True} if p.head_copy else {})),
        _parts=parts,
        context=Context(rp=rp, grads=c.grads, wtemp=c.wtemp, moved=c.moved, inputs=inputs, step_temp=step_temp,
                        L=L, weights=c.part_weights, opt=c.part_optimizer, trainable=c.part_trainable,
                        buffers=info.buffers_bytes, H=st.H, fwdbwd=fwdbwd, step=step, reserve=reserve,
                        tensors=c.tensors),
        expandable_segments=expandable)
