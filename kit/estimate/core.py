"""Predict the memory of one training setup before anything is loaded, and name who eats it.

The model is built once on the meta device (no memory, cached), so parameter counts are
exact, tied weights count once, and the arithmetic below follows the libraries' code:
bitsandbytes for 4-bit/8-bit weights and 8-bit optimizer states, peft for LoRA and
``prepare_model_for_kbit_training``, torch for AdamW, and :mod:`kit.estimate.replay` for what
the forward saves. ``peak_bytes`` predicts ``torch.cuda.max_memory_allocated()`` over a
Trainer step: the larger of the forward/backward phase and the optimizer step, in the steady
state (from the second step, the optimizer state is alive during backward).
``first_step_peak_bytes`` is the first step's: its backward runs before the optimizer has
made its state, which is why step 1 can run and step 2 die. ``eval_peak_bytes`` is
``Trainer.evaluate()``'s during training (:mod:`kit.estimate.evaluation`).

>>> est = estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16")
>>> est.offenders[0][0], est.peak_moment
('custom_layer', 'backward (head)')
"""
from __future__ import annotations

import os

from kit.estimate import replay as act
from kit.estimate.inventory import Info, UnsupportedModel, default_targets, info_of, lora_matches  # noqa: F401 (part of the API)
from kit.presets import DTYPES, OPTIMIZERS, QUANTIZATIONS, int8_bytes, nf4_bytes, optimizer_state_bytes
from kit import inputs as kin
from kit.estimate import quantization as kq
from kit.estimate.evaluation import GATHER, eval_peak
from kit.presets import ALIASES as _ALIASES
from kit.estimate.result import Context, Estimate
from kit.estimate.strategies import STRATEGIES, per_gpu
from kit.units import fmt_bytes

def estimate(model, *, batch_size: int, seq_len: int, precision: str = "fp32", quantization: str = "none",
             lora_r: int = 0, lora_targets=None, optimizer: str = "adamw-fused", gradient_checkpointing=None,
             grad_accum: int = 1, load_dtype=None, attn_implementation: str = "sdpa",
             kbit_recipe: str = "standard", lora_dropout: float = 0.0, padded: bool = True,
             device: str = "cuda", eval_batch_size: int = 8, eval_gather: str = "loss", eval_samples=None,
             eval_accumulation_steps=None, quant_type: str = "nf4", double_quant: bool = True,
             compute_dtype: str = "bf16", checkpoint_reentrant=None, strategy: str = "single", num_gpus: int = 1,
             cpu_offload: bool = False) -> Estimate:
    """Predict the memory of training ``model`` with Trainer in this setup. See the module doc.

    ``precision`` fp16/bf16 is Trainer mixed precision (autocast, weights stay in
    ``load_dtype``). ``load_dtype`` defaults to fp32, or bf16 with quantization.
    ``gradient_checkpointing=None`` keeps the model's default (on for scenario 1 and for
    the k-bit recipe). ``kbit_recipe="standard"`` is ``prepare_model_for_kbit_training``
    (non-quantized weights upcast to fp32); ``"lean"`` skips the upcast. ``padded``: the
    batches have padding, so an attention mask is built. ``device="cpu"`` predicts CPU kernels.

    ``eval_*`` describe ``Trainer.evaluate()`` (see :mod:`kit.estimate.evaluation`): ``eval_batch_size`` is
    ``per_device_eval_batch_size`` (TrainingArguments' default, 8); ``eval_gather`` is "loss" (no
    ``compute_metrics``), "logits" (``compute_metrics``: the logits are gathered) or "preprocessed"
    (``preprocess_logits_for_metrics`` returning one id per token, as ``argmax`` does);
    ``eval_samples`` is ``len(eval_dataset)``; ``eval_accumulation_steps`` as in TrainingArguments.

    ``quant_type`` ("nf4"|"fp4"), ``double_quant`` and ``compute_dtype`` are BitsAndBytesConfig's 4-bit
    options (the defaults are the kit's 4bit; BitsAndBytesConfig's own are fp4, no double quant, fp32).
    ``checkpoint_reentrant``: whether the checkpointing is reentrant; None: only the k-bit recipe's own
    (``gradient_checkpointing=None``) is, an explicit one is Trainer's. It matters with 8-bit weights,
    whose inputs non-reentrant checkpointing cannot free (:mod:`kit.estimate.quantization`).

    ``strategy`` ("single", "ddp", "fsdp", "fsdp-grad-op", "zero1", "zero2", "zero3"), ``num_gpus`` and
    ``cpu_offload``: the bytes are per GPU, as :mod:`kit.estimate.strategies` models each engine.

    >>> estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512, quantization="4bit",
    ...          lora_r=16).trainable_params
    6815744
    """
    batch_size, seq_len, grad_accum = (kin.whole_number(n, v) for n, v in (
        ("batch_size", batch_size), ("seq_len", seq_len), ("grad_accum", grad_accum)))
    lora_r = kin.whole_number("lora_r", lora_r, minimum=0)
    lora_targets = kin.targets(lora_targets)
    gradient_checkpointing = kin.flag("gradient_checkpointing", gradient_checkpointing, allow_none=True)
    padded = kin.flag("padded", padded)
    lora_dropout = kin.fraction("lora_dropout", lora_dropout)
    ev = dict(batch_size=kin.whole_number("eval_batch_size", eval_batch_size),
              gather=kin.choice("eval_gather", eval_gather, GATHER),
              samples=None if eval_samples is None else kin.whole_number("eval_samples", eval_samples),
              accumulation=None if eval_accumulation_steps is None else kin.whole_number(
                  "eval_accumulation_steps", eval_accumulation_steps))
    if ev["gather"] != "loss" and ev["samples"] is None and ev["accumulation"] is None:
        raise kin.InputError("eval_samples", f"eval_gather={ev['gather']!r} keeps every eval batch's predictions on "
                             "the device until the loop ends: give eval_samples (len(eval_dataset)) or "
                             "eval_accumulation_steps.")
    optimizer = kin.choice("optimizer", optimizer, OPTIMIZERS, _ALIASES)
    precision, quantization, attn_implementation, kbit_recipe, device = (kin.choice(*c) for c in (
        ("precision", precision, DTYPES), ("quantization", quantization, QUANTIZATIONS),
        ("attn_implementation", attn_implementation, ("sdpa", "eager")),
        ("kbit_recipe", kbit_recipe, ("standard", "lean")), ("device", device, ("cuda", "cpu"))))
    load_dtype = load_dtype or ("bf16" if quantization != "none" else "fp32")
    bnb = kq.options(quantization, quant_type, double_quant, compute_dtype, checkpoint_reentrant)
    load_dtype = kin.choice("load_dtype", str(load_dtype).replace("torch.", ""), DTYPES,
                               {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"})
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    try:
        info = info_of(model)
    except ValueError as exc:  # what is wrong is the model: say so, so the CLI can name --model
        exc.name = getattr(exc, "name", None) or "model"
        raise
    if info.max_positions and seq_len > info.max_positions:
        raise kin.InputError("seq_len", f"seq_len {seq_len} is beyond the model's {info.max_positions} "
                                f"positions: use seq_len <= {info.max_positions}.")
    multi = kin.choice("strategy", strategy, STRATEGIES), kin.whole_number("num_gpus", num_gpus), \
        kin.flag("cpu_offload", cpu_offload)
    est = _assemble(info, model=model if isinstance(model, str) else type(model).__name__,
                    B=batch_size, S=seq_len, precision=precision, quant=quantization, lora_r=lora_r,
                    lora_targets=lora_targets, optimizer=optimizer, ckpt=gradient_checkpointing,
                    accum=grad_accum, load=load_dtype, attn=attn_implementation, recipe=kbit_recipe,
                    lora_dropout=lora_dropout, padded=padded, device=device, ev=ev, bnb=bnb)
    return per_gpu(est, *multi)  # the same object for one GPU (strategy "single")


def _assemble(info: Info, *, model, B, S, precision, quant, lora_r, lora_targets, optimizer, ckpt,
              accum, load, attn, recipe, lora_dropout, padded, device, ev, bnb=kq.Bnb()) -> Estimate:
    vh, leaves = info.vocab_head, info.leaves
    if quant != "none" and not lora_r and not vh:
        raise ValueError("4-bit/8-bit weights cannot be trained directly (Trainer refuses a purely "
                         "quantized model): add LoRA adapters with lora_r > 0.")
    if lora_targets and not lora_r:
        raise kin.InputError("lora_targets", "lora_targets needs lora_r > 0: set lora_r (e.g. 16), or leave "
                                "lora_targets out.")
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
                                    f"'{kin.ALL_LINEAR}'.")
    std = quant != "none" and recipe == "standard" and not vh  # prepare_model_for_kbit_training
    reentrant = bnb.reentrant_for(ckpt, std)  # (8-bit layers keep their inputs through non-reentrant checkpointing)
    ckpt = (vh or std) if ckpt is None else bool(ckpt)
    lb, ac = DTYPES[load], (2 if precision != "fp32" else None)
    other = 4 if std else lb  # the recipe casts every fp16/bf16 parameter that is not 4-bit to fp32
    tot = dict.fromkeys(("params", "trainable", "weights", "loaded", "qparams", "uparams", "build",
                         "opt", "paged", "grads", "halves", "streamed"), 0)
    grads, groups, offenders = dict.fromkeys(("embed", "block", "head"), 0), {}, []
    wtemp, wnew = dict(grads), dict(grads)  # per part: backward temporaries; + a new grad (accumulating)
    pw, po, pt = dict(grads), dict(grads), dict(grads)  # per part: weights, optimizer state, trainable params
    for l in leaves:
        n = l.weight + l.bias
        q = quant if l.quantizable else "none"
        wq = nf4_bytes(l.weight, double_quant=bnb.double_quant) if q == "4bit" else int8_bytes(l.fin, l.fout) \
            if q == "8bit" else None
        w_bytes = n * other if wq is None else kq.weight_bytes(l, q, bnb, other)
        tot["params"] += n
        # CPU RAM to build: a k-bit model loads straight onto the GPU (bitsandbytes needs a device map, which
        # transformers sets to the current GPU), one tensor at a time through RAM; a plain from_pretrained, and
        # a layer the user's own __init__ makes (scenario 1's head), build it all in RAM
        if quant == "none" or "custom_layer" in l.name.split("."):
            tot["build"] += n * lb
        else:
            tot["streamed"] = max(tot["streamed"], l.weight * lb)
        tot["loaded"] += n * lb if wq is None else wq + l.bias * lb
        tot["qparams" if wq is not None else "uparams"] += l.weight if wq is not None else n
        pieces = []
        if l.name in lora:  # peft keeps adapters in fp32 (autocast_adapter_dtype=True)
            pieces = [(lora_r * l.fin, 4), (lora_r * l.fout, 4)]
            w_bytes += 4 * lora_r * (l.fin + l.fout)
            tot["params"] += lora_r * (l.fin + l.fout)
        elif l.trainable and not lora_r and wq is None:  # a tied weight counts at its owner
            pieces = [(l.weight, other), (l.bias, other)]
        train_bytes = w_bytes
        for k, dt in pieces:
            if not k:
                continue
            o, p = optimizer_state_bytes(optimizer, k, dt, embedding=l.kind == "embedding")
            grads[l.part] += k * dt
            tot["trainable"] += k
            tot["opt"], tot["paged"] = tot["opt"] + o, tot["paged"] + p
            po[l.part], pt[l.part] = po[l.part] + o + p, pt[l.part] + k
            groups.setdefault((l.kind != "norm" and k != l.bias, dt), []).append(k * dt)  # Trainer's
            half = 2 * k if ac and dt != ac else 0  # autocast: the grad of the half copy, then cast up
            wtemp[l.part], wnew[l.part] = max(wtemp[l.part], half), max(wnew[l.part], half + k * dt)
            tot["halves"] += half if l.kind == "linear" else 0  # autocast caches a half copy of each
            train_bytes += k * dt + o + p
        tot["weights"] += w_bytes
        pw[l.part] += w_bytes
        offenders.append((l.name, n, train_bytes))
    moved = sum(l.fin * l.fout * other for l in leaves if l.tied and l.trainable and not lora_r)
    grads["embed"], grads["head"] = grads["embed"] - moved, grads["head"] + moved  # lm_head makes it first
    if moved:  # ... and a tied weight's new grad comes first in the head's backward
        wnew["head"] = max(wnew["head"], wnew["embed"])
        tot["halves"] += moved // other * 2 if ac and other != ac else 0  # lm_head casts the tied weight
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
    # scenario 1's custom_layer: the user's Linear(V, V), or the V->r->V of fix (b), in forward order
    head = [l for l in leaves if l.kind == "linear" and "custom_layer" in l.name.split(".")]
    st = act.Setup(family=info.family, B=B, S=S, V=cfg.vocab_size, w=lb, w_other=other, ac=ac,
                   base_trainable=not lora_r and not vh, quant=quant, compute=DTYPES[bnb.compute_dtype],
                   dequant=kq.dequant_bytes(bnb, load),  # (the replay puts each layer's at its backward)
                   reentrant=reentrant,
                   lora={l.short: lora_r for l in leaves if l.name in lora and l.part == "block"}
                   | {l.name.split(".")[-1]: lora_r for l in leaves if l.name in lora and l.part == "head"},
                   lora_dropout=lora_dropout, input_grad=ckpt or std, attn=attn, padded=padded, ckpt=ckpt,
                   device=device, head=tuple((l.name, l.fout) for l in head), head_w=lb,
                   head_trainable=bool(head) and all(l.trainable for l in head) and not lora_r, **shapes)
    rp = act.replay(st)
    tot["grads"] = sum(grads.values())
    m = act.peak_moment(rp, grads_embed=grads["embed"], grads_block=grads["block"] // shapes["L"],
                        grads_head=grads["head"], wtemp_block=wtemp["block"], wtemp_head=wtemp["head"],
                        head_half=wtemp["head"], tied=moved)
    if accum > 1 and tot["grads"]:  # the later micro-batches: every grad alive, each new one added in place
        m = max(m, act.peak_moment(rp, grads_embed=wnew["embed"], grads_block=0, grads_head=0,
                                   wtemp_block=max(wtemp["block"], wnew["block"]), wtemp_head=wnew["head"],
                                   grads_before=tot["grads"], head_half=wtemp["head"], tied=moved), key=lambda x: x.total)
    weights = tot["weights"] + info.buffers_bytes
    inputs = 3 * B * S * 8  # input_ids, attention_mask, labels (int64)
    fwdbwd = weights + tot["opt"] + m.total + inputs
    step_temp = 0  # AdamW's sqrt(exp_avg_sq) / bias_correction, per (weight-decay group, dtype)
    if optimizer == "adamw" and groups:  # CUDA: foreach, all at once; CPU: per tensor, + the last denom
        # (adamw-fused makes none: one kernel per step, element by element, on CUDA and on the CPU)
        step_temp = max(sum(g) if device == "cuda" else max(2 * b + (g[i - 1] if i else 0)
                                                             for i, b in enumerate(g)) for g in groups.values())
    step = weights + tot["grads"] + tot["opt"] + step_temp
    ev_peak = eval_peak(rp, B=B, Be=ev["batch_size"], S=S, V=cfg.vocab_size, held=weights + tot["opt"],
                        copies=tot["halves"], inputs_per_row=3 * S * 8, gather=ev["gather"], samples=ev["samples"],
                        accumulation=ev["accumulation"], device=device, mixed=bool(ac))
    if fwdbwd >= step:
        phase, moment = "forward/backward", m.where
        parts = {"weights": weights, "gradients": m.gradients, "optimizer state": tot["opt"],
                 "activations": m.activations, "logits & loss": m.logits, "autocast weight copies": m.copies,
                 "temporaries": m.temporaries + inputs}
    else:
        phase = moment = "optimizer step"
        parts = {"weights": weights, "gradients": tot["grads"], "optimizer state": tot["opt"],
                 "temporaries": step_temp}
    notes = _notes(optimizer, leaves, tot["paged"], info, lora_r, quant) + kq.notes(rp)
    if ev_peak.moment == "forward (a block)":
        notes.append("the evaluation peak is set by the blocks, where the kit counts at most what one block saves in "
                     "training: an upper bound (it is exact where the logits set it)")
    offenders.sort(key=lambda t: (t[2], t[1]), reverse=True)
    est = Estimate(
        params=tot["params"], trainable_params=tot["trainable"], weights_bytes=weights,
        gradients_bytes=tot["grads"], optimizer_bytes=tot["opt"] + tot["paged"],
        activations_bytes=rp.activation_bytes(), logits_bytes=rp.logits_bytes(),
        peak_bytes=max(fwdbwd, step), first_step_peak_bytes=max(fwdbwd - tot["opt"], step),
        eval_peak_bytes=ev_peak.peak_bytes, eval_moment=ev_peak.moment,
        cpu_build_bytes=tot["build"] + tot["streamed"] + info.buffers_bytes, peak_phase=phase,
        peak_moment=moment, loaded_weights_bytes=tot["loaded"] + info.buffers_bytes,
        paged_optimizer_bytes=tot["paged"], autocast_copies_bytes=rp.copies_saved + rp.cache,
        saved_bytes=rp.saved_bytes(),
        quantized_params=tot["qparams"], unquantized_params=tot["uparams"],
        offenders=offenders[:10] + [o for o in sorted(offenders, key=lambda t: t[1], reverse=True)[:5]
                                    if o not in offenders[:10]],
        notes=notes, setup=dict(model=model, batch_size=B, seq_len=S, precision=precision, quantization=quant,
                                lora_r=lora_r, optimizer=optimizer, optim=OPTIMIZERS[optimizer],
                                gradient_checkpointing=ckpt, grad_accum=accum, load_dtype=load,
                                attn_implementation=attn, kbit_recipe=recipe, device=device,
                                **bnb.setup(quant, ckpt, reentrant),
                                eval_batch_size=ev["batch_size"], eval_gather=ev["gather"],
                                eval_samples=ev["samples"], eval_accumulation_steps=ev["accumulation"]),
        _parts=parts,
        context=Context(rp=rp, grads=grads, wtemp=wtemp, moved=moved, inputs=inputs, step_temp=step_temp,
                        L=shapes["L"], weights=pw, opt=po, trainable=pt, buffers=info.buffers_bytes, H=H,
                        fwdbwd=fwdbwd, step=step))
    return est


def _notes(optimizer, leaves, paged, info, lora_r, quant) -> list:
    notes = []
    if paged:
        notes.append(f"{fmt_bytes(paged)} of optimizer state is paged (CUDA managed memory): "
                     "outside max_memory_allocated, evicted to RAM under pressure")
    if optimizer in ("adamw-8bit", "paged-adamw-8bit") and any(
            l.trainable and not lora_r and l.weight >= 2**31 for l in leaves):
        notes.append("a trainable tensor has >= 2^31 elements: bitsandbytes 8-bit AdamW kills the process "
                     "on it (ops.cu 'invalid argument'); do not run this")
    if optimizer == "sgd":
        notes.append("sgd counts a momentum buffer: TrainingArguments(optim='sgd', optim_args='momentum=0.9')")
    mt = info.config.model_type
    if info.family == "llama" and mt != "llama":
        notes.append(f"{mt}: activations follow the Llama-style replay (it has no replay of its own, so they "
                     "are as exact as its blocks are like Llama's)")
    elif info.family != "llama" and act.FAMILIES[info.family] is act.FAMILIES["llama"]:  # mistral, qwen2
        notes.append(f"{mt}: activations follow the Llama-style replay, which is its block op for op")
    if info.family == "gemma2" and getattr(info.config, "attn_logit_softcapping", None):
        notes.append("gemma2: attention runs eager whatever attn_implementation says (sdpa cannot soft-cap the "
                     "attention scores), so its scores take B x heads x S^2 per layer")
    if lora_r:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_targets

        if mt not in peft_targets:
            notes.append(f"{mt}: peft has no default LoRA targets for it, so LoraConfig needs target_modules (with "
                         f"no lora_targets this estimate takes {', '.join(default_targets(info))})")
    if quant != "none" and info.vocab_head:
        notes.append("quantization applies to the GPT-2 base; custom_layer stays a float nn.Linear")
    return notes

