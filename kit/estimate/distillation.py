"""TRL's ``DistillationTrainer`` and ``DistillationConfig`` for the estimator (the behaviour of TRL 1.16, read from
``trl/trainer/distillation_trainer.py``, ``distillation_config.py`` and ``trl/kernels/chunked_divergence.py``).

DistillationTrainer trains the student on-policy: it generates its own completions, then matches the teacher's
next-token distribution on them. What one step does, and how each part is estimated:

- the generation phase (``_prepare_inputs`` -> ``_generate_and_score_completions``, inside ``training_step``) runs
  as GRPOTrainer's does (:mod:`kit.estimate.grpo`, whose generation this module reuses): once every
  ``gradient_accumulation_steps`` micro-steps over ``G = per_device_train_batch_size x gradient_accumulation_steps``
  prompts, the student's ``generate()`` under ``torch.no_grad()`` with a dynamic KV cache; no old-log-prob pass and
  no reference pass (the teacher does not run here). The rollouts buffered across the micro-steps are int64
  ``prompt_ids``/``prompt_mask`` ``[G, P]``, ``completion_ids``/``completion_mask`` ``[G, C]`` and the item count
  (:func:`buffered_bytes`);
- the training step (``_compute_loss``): ``input_ids`` and ``attention_mask`` concatenated (int64 ``[B, P + C]``);
  the student's backbone (``base_model``: no LM head) with grad, as the replay runs it; its last hidden states sliced
  ``[:, :-1][:, -C:]`` (views of the final norm's ``[B, S, H]`` output); then the teacher's backbone under
  ``torch.no_grad()`` while the student's saved activations are held (:func:`teacher_forward`), its
  ``[B, S, H_t]`` output kept for the loss;
- the loss (``ChunkedDivergenceFunction``, the generalized JSD with ``beta`` and ``temperature``): both hidden
  states flattened to ``[N, H]`` (``N = B x C``; a copy where ``B > 1``), then, per tile of
  ``[min(N, 4096), min(V, 32768)]``, both heads' logits projected in fp32 into two ``[min(N, 4096), 32768]`` fp32
  buffers and folded into running statistics. Saved for backward: both flattened hidden states, ``log_z`` of each
  model and the per-token divergence (fp32, ``N`` each); the ``[N, V]`` logits never exist. Its backward
  re-projects both tiles and writes the student's gradient into them (:func:`divergence_head`). ``0 < beta < 1``
  (the JSD) takes a second pass over the vocabulary in the forward, with more temporaries in both;
- the teacher's weights are held for the whole run, in the dtype it was loaded in (``teacher_model_init_kwargs``);
- ``bf16=True`` (DistillationConfig's default): accelerate wraps the model's ``forward`` in autocast, but the loss
  calls the backbones through ``_ForwardRedirection``, which replaces that ``forward`` for the call: the training
  step runs in the weights' dtype (measured byte for byte as with ``bf16=False``). ``generate()`` calls the wrapped
  ``forward`` (a PEFT model's calls its base model's, unwrapped): each forward holds autocast's bf16 copies of the
  weights, its peak at the LM head of the last one (:func:`autocast_forward`). Half-precision weights (the divergence
  then casts its chunks) and ``fp16=True`` are refused.

Every DistillationConfig field beyond TrainingArguments' is in one of :data:`MODELED`, :data:`NO_MEMORY` or
:data:`REFUSED`.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from kit.inputs import InputError, Note

from kit import trainer_kinds
from kit.estimate import grpo
from kit.estimate import replay
from kit.estimate.dpo import held_bytes, refuse_dropout
from kit.estimate.replay import BOOL, F32, I64, dtype, lookup
from kit.estimate.replay.fused_head import TOKEN_CHUNK, VOCAB_CHUNK
from kit.estimate.trainer_reader import Reading

TRAINER, CONFIG = "DistillationTrainer", "DistillationConfig"
# DistillationConfig fields the estimate reads, and how
MODELED = {
    "model_init_kwargs": grpo.MODELED["model_init_kwargs"],
    "max_completion_length": "the completion's length C: the KV cache, the rollouts, the training rows and the "
                             "divergence's N = B x C positions",
    "pad_to_multiple_of": grpo.MODELED["pad_to_multiple_of"],
    "generation_kwargs": grpo.MODELED["generation_kwargs"],
    "temperature": "its processor's [G, V] output a generated token (other than 1); the divergence makes the "
                   "scaled tiles whatever it is",
    "beta": "0 (forward KL) or 1 (reverse KL): one pass over the vocabulary; between (the JSD): a second pass, "
            "with more temporaries",
    "use_vllm": grpo.MODELED["use_vllm"], "vllm_mode": grpo.MODELED["vllm_mode"],
    "vllm_gpu_memory_utilization": grpo.MODELED["vllm_gpu_memory_utilization"],
    "vllm_enable_sleep_mode": grpo.MODELED["vllm_enable_sleep_mode"],
    "disable_dropout": grpo.MODELED["disable_dropout"],
    "teacher_model_init_kwargs": "the dtype the teacher loads in (read from the built teacher)",
}
# DistillationConfig fields that change no byte the kit counts, and why
NO_MEMORY = {**{k: grpo.NO_MEMORY[k] for k in (
    "trust_remote_code", "ds3_gather_for_generation", "shuffle_dataset", "chat_template_kwargs", "vllm_model_impl",
    "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
    "vllm_server_timeout", "vllm_group_port", "vllm_max_model_length", "vllm_tensor_parallel_size",
    "log_completions", "num_completions_to_print", "log_unique_prompts")},
    "teacher_model_name_or_path": "which teacher is loaded (its weights are read from the built one)",
    "teacher_model_revision": "which revision of the teacher is loaded"}
# DistillationConfig fields refused when set: GRPOConfig's, where DistillationConfig has them
REFUSED = {k: grpo.REFUSED[k] for k in ("cache_implementation", "top_p", "top_k", "min_p", "repetition_penalty",
                                        "max_tool_calling_iterations")}
# The divergence's fold in torch (a CPU), at its largest, in fp32 [n, c] tiles beyond the two buffers (read from
# chunked_divergence.py's _stats_tile, _jsd_tile and _backward_tile; each op's output a new tensor):
# stats: zs, zt, gap, es and et alive while et * gap is made; the JSD's second pass: log_ps, log_pt, log_m, kl_s,
# beta * p_t and (1 - beta) * kl_s while their sum is made; backward: y, zs, zt, log_ps, log_pt, ps and grad, with
# ``grad * grad_divergence`` and its ``* inv_t`` made before the old grad is let go (and, for the JSD, log_m).
FOLD_FWD, FOLD_JSD, FOLD_BWD, FOLD_BWD_JSD = 6, 7, 9, 10
# the replay's moments at its fused head, as they are here: the divergence's
AT_THE_HEAD = {"forward (at the loss)": "forward (the divergence's tiles)",
               "backward (head)": "backward (the divergence's tiles)"}


def read_distillation_config(cfg, name: str = CONFIG):
    """(estimate options, sources, notes) of what a DistillationConfig changes; refuses in one sentence what is not
    modeled."""
    if cfg.fp16:
        raise InputError("fp16", f"{name}.fp16=True runs generate() under fp16 autocast and scales the loss with a "
                         f"GradScaler, which the kit does not model for {TRAINER}: estimate with fp16=False (bf16=True "
                         "is modeled).", code="distillation-fp16")
    src = {"beta": (cfg.beta, f"{name}.beta: " + MODELED["beta"]),
           "temperature": (cfg.temperature, f"{name}.temperature: " + MODELED["temperature"])}
    opts, src, notes = grpo.read_generating_config(cfg, name, refused=REFUSED, no_memory=NO_MEMORY, src=src)
    src["fused_lm_head"] = (True, f"{TRAINER}'s ChunkedDivergenceFunction: both heads' logits in tiles, none whole")
    if cfg.bf16:   # accelerate's autocast wraps model.forward, which _ForwardRedirection replaces for the loss's call
        opts["precision"] = "fp32"
        src["precision"] = ("fp32", f"{name}.bf16=True, but TRL 1.16 runs the loss outside accelerate's autocast (its "
                                    "forward redirection replaces the autocast forward): the training step in the "
                                    "weights' dtype; generate() runs under bf16 autocast")
    return opts, src, notes


def generation_view(cfg):
    """``cfg`` as :func:`kit.estimate.grpo.rollout` reads a generating config: one generation of ``B x
    gradient_accumulation_steps`` prompts, every ``gradient_accumulation_steps`` micro-steps, no old-log-prob pass."""
    fields = ("per_device_train_batch_size", "max_completion_length", "gradient_accumulation_steps", "use_vllm",
              "vllm_mode", "vllm_gpu_memory_utilization", "pad_to_multiple_of", "generation_kwargs", "temperature")
    return SimpleNamespace(**{k: getattr(cfg, k) for k in fields}, steps_per_generation=cfg.gradient_accumulation_steps,
                           num_iterations=1)


def rollout(cfg, prompt_len: int, name: str = CONFIG) -> dict:
    """GRPO's shapes of one generation (:func:`kit.estimate.grpo.rollout`) as DistillationTrainer draws them."""
    shapes = grpo.rollout(generation_view(cfg), prompt_len, name)
    shapes["where"] = shapes["where"].replace("steps_per_generation", "gradient_accumulation_steps")
    return shapes


def buffered_bytes(shapes: dict) -> int:
    """``_buffered_inputs``: int64 prompt ids and mask ``[G, P]``, completion ids and mask ``[G, C]`` and the
    item count (one int64), held across the generation's micro-steps."""
    return 2 * shapes["G"] * (shapes["P"] + shapes["C"]) * I64 + I64


def divergence_head(*, B: int, S: int, C: int, Hs: int, Ht: int, V: int, dt: int, beta: float,
                    head_trainable: bool, device: str) -> dict:
    """Bytes of ``_chunked_divergence_loss`` at ``B`` rows of ``S`` tokens, ``C`` of them scored (fp32 throughout):
    ``saved`` (kept for backward), ``forward`` (alive at its forward's largest moment beyond what is saved: the
    student's and the teacher's ``[B, S, H]`` outputs, the ``valid`` mask, nine fp32 ``N``-vectors of statistics,
    the two ``[n, 32768]`` buffers and, in torch, the fold's tiles) and ``backward`` (its backward's largest moment
    beyond what it saved and the head weight's own grad: the incoming ``[N]`` grad, ``grad_hidden`` and
    ``grad_weight`` in fp32, two new buffers and the fold's tiles; then the slices' backward, ``[B, S-1, H]`` and
    ``[B, S, H]`` zeros filled in turn).

    >>> h = divergence_head(B=1, S=9, C=4, Hs=8, Ht=16, V=10, dt=4, beta=1.0, head_trainable=False, device="cpu")
    >>> h["saved"] == 9 * (8 + 16) * 4 + 3 * 4 * 4   # one row: views of both whole outputs; log_z x 2, aux
    True
    """
    N, T = B * C, B * S
    n, c = min(N, TOKEN_CHUNK), min(V, VOCAB_CHUNK)
    torch_fold, jsd = device != "cuda", 0.0 < beta < 1.0
    copied = B > 1 or not torch_fold   # reshape(-1, H) of a [:, -C:] slice copies for several rows; [valid] always
    saved = (N if copied else T) * (Hs + Ht) * dt + 3 * N * F32
    buffers = 2 * n * VOCAB_CHUNK * F32
    outputs = (T * (Hs + Ht) * dt if copied else 0) + N * BOOL
    fold = n * c * F32 * (FOLD_JSD if jsd else FOLD_FWD) if torch_fold else 0
    forward = outputs + 9 * N * F32 + buffers + fold
    g_hidden, g_weight = N * Hs * F32, V * Hs * F32 if head_trainable else 0
    fold_bwd = n * c * F32 * (FOLD_BWD_JSD if jsd else FOLD_BWD) if torch_fold else 0
    backward = N * F32 + g_hidden + g_weight + buffers + fold_bwd - (V * Hs * dt if head_trainable else 0)
    slices = max(g_hidden + B * (S - 1) * Hs * dt, B * (S - 1) * Hs * dt + T * Hs * dt)
    return dict(saved=saved, forward=forward, backward=max(backward, slices))


def teacher_forward(est, teacher_text, *, B: int, S: int, dt: int, padded: bool) -> int:
    """The teacher's no-grad backbone over ``B x S`` positions (``base_model(...)``, ``use_cache=False``): its
    blocks' largest moment as :func:`kit.estimate.grpo.block_loop_bytes` counts a no-grad forward (refused where the
    teacher's family declares no no-grad loop: the bound would be the student's)."""
    loop = lookup(teacher_text.model_type)
    if not (loop and loop.no_grad_loop and loop.no_grad_loop.rotary):
        raise InputError("teacher_model", f"{TRAINER}'s teacher is a {teacher_text.model_type} model, whose no-grad "
                         "forward the kit does not model exactly: use a teacher of a decoder family with rotary "
                         "embeddings (Llama, Qwen2, Mistral, ...).", code="distillation-teacher-family")
    return grpo.block_loop_bytes(est, teacher_text, rows=B, seq_len=S, hidden_dt=dt, mlp_dt=dt, padded=padded)[0]


def refuse_half_weights(student: str, teacher_bytes: int) -> None:
    """Half-precision weights make the divergence cast its tiles and hidden chunks (``.float()`` copies, ``to()`` of
    the gradient tile), which the kit does not model: refused in one sentence."""
    if student != "fp32" or teacher_bytes != F32:
        which = "student's" if student != "fp32" else "teacher's"
        raise InputError("load_dtype", f"{TRAINER}'s {which} weights are in half precision, whose casts in the "
                         "chunked divergence (fp32 copies of each hidden chunk, weight slice and gradient tile) the "
                         "kit does not model: load the student and the teacher in float32.",
                         code="distillation-half-weights")


def read_teacher(trainer) -> tuple:
    """(weights bytes, text config, dtype bytes) of ``trainer.teacher_model``; refused where there is none on this
    device (a subclass that asks a server), or it is quantized, or its logits are soft-capped."""
    teacher = getattr(trainer, "teacher_model", None)
    if teacher is None:
        raise InputError("teacher_model", f"{type(trainer).__name__} has no teacher_model on this device (a "
                         "teacher served elsewhere), which the kit does not model: pass the teacher model.",
                         code="distillation-no-teacher")
    if getattr(teacher, "is_loaded_in_4bit", False) or getattr(teacher, "is_loaded_in_8bit", False):
        raise InputError("teacher_model", f"{TRAINER}'s teacher is quantized (bitsandbytes), which the kit does not "
                         "model: load the teacher unquantized.", code="distillation-teacher-quantized")
    text = teacher.config.get_text_config()
    if getattr(text, "final_logit_softcapping", None):
        raise InputError("teacher_model", f"{TRAINER}'s teacher soft-caps its logits (final_logit_softcapping), "
                         "whose tanh temporaries the kit does not model: use a teacher without it.",
                         code="distillation-softcap")
    return held_bytes(teacher), text, next(teacher.parameters()).dtype.itemsize


def autocast_casts(model) -> int:
    """The bf16 copies autocast holds at the LM head's matmul in a generate() forward under accelerate's autocast:
    those it caches (of fp32 Linear weights and biases that require grad, kept till the forward returns) and the
    head weight's own (cached where it trains, a temporary of the matmul where it is frozen)."""
    import torch

    head = model.get_output_embeddings()
    own = [t for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
           for t in (m.weight, m.bias) if t is not None and t.requires_grad and t.dtype == torch.float32]
    return sum(t.numel() * 2 for t in own) + sum(t.numel() * 2 for t in (head.weight, head.bias) if t is not None)


def under_autocast(trainer) -> bool:
    """Whether generate() runs under accelerate's bf16 autocast: it wraps the model's ``forward``, which generate()
    calls on a plain model; a PEFT model's generate() calls its base model's, unwrapped."""
    return bool(trainer.args.bf16) and not hasattr(trainer.model, "peft_config")


def autocast_forward(shapes, config, casts: int, hidden_dt: int) -> int:
    """generate()'s last forward under bf16 autocast, at the LM head's matmul: the dynamic cache of ``P + C - 1``
    positions (keys in the hidden states' dtype, as the rotary embedding's fp32 cos/sin promote them; values in
    bf16), the ids and attention mask ``[G, P + C]`` and the prompt's ``[G, P]`` (int64), the previous token's
    sampling tensors (:func:`kit.estimate.grpo.sampling_bytes`), the cast weights and the bf16 ``[G, 1, V]``
    logits."""
    text = config.get_text_config()
    G, S, V = shapes["G"], shapes["P"] + shapes["C"], text.vocab_size
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    cache = text.num_hidden_layers * G * kv_heads * head_dim * (S - 1) * (hidden_dt + 2)
    between = grpo.sampling_bytes(shapes, V, hidden_dt, shapes["temperature"])[1]
    return cache + 2 * G * S * I64 + 2 * G * shapes["P"] * I64 + between + casts + G * V * 2


def step_peaks(est, shapes, *, teacher_text, teacher_dt: int, beta: float) -> tuple:
    """(step 1's peak, a later step's peak, its phase, its moment, its parts) of the training step: the replay's
    moments with the divergence for the fused head (:func:`divergence_head`), and the teacher's forward as a moment
    of its own; the optimizer step's (the draft's) where it is larger."""
    ctx, rp, s = est.context, est.context.rp, est.setup
    B, S, C = s["batch_size"], s["seq_len"], shapes["C"]
    dt = dtype(s["load_dtype"])
    head_trainable = ctx.grads["head"] > 0 or ctx.moved > 0
    head = divergence_head(B=B, S=S, C=C, Hs=ctx.H, Ht=teacher_text.hidden_size, V=teacher_text.vocab_size, dt=dt,
                           beta=beta, head_trainable=head_trainable, device=s["device"])
    norm = rp.head - rp.head_order[-1]   # the final norm's saved tensors (the fused head's were last)
    swapped = dataclasses.replace(rp, head=norm + head["saved"], logits_live=head["forward"],
                                  last_logits=head["backward"], head_order=rp.head_order[:-1] + (head["saved"],))
    # the student's saved activations and its [B, S, H] output, beside the teacher's no-grad blocks
    teacher = teacher_forward(est, teacher_text, B=B, S=S, dt=teacher_dt, padded=shapes["padded"])
    fresh = dict(grads_embed=ctx.grads["embed"], grads_block=ctx.grads["block"] // rp.L, grads_head=ctx.grads["head"],
                 wtemp_block=ctx.wtemp["block"], wtemp_head=ctx.wtemp["head"], head_half=ctx.wtemp["head"],
                 tied=ctx.moved)
    # gradient accumulation's later micro-batches: every grad alive from the forward on, each new one added in place
    alive = dict(grads_embed=ctx.wnew["embed"], grads_block=0, grads_head=0,
                 wtemp_block=max(ctx.wtemp["block"], ctx.wnew["block"]), wtemp_head=ctx.wnew["head"],
                 grads_before=est.gradients_bytes, head_half=ctx.wtemp["head"], tied=ctx.moved)
    variants = [fresh] + ([alive] if s["grad_accum"] > 1 and est.gradients_bytes else [])
    weights, opt = est.weights_bytes, est.optimizer_bytes - est.paged_optimizer_bytes

    def top(later: bool):
        found = [m for kw in variants for m in replay.step_moments(swapped, replay.moments(swapped, **kw), later)]
        found += [replay.Moment(where="the teacher's no-grad forward", activations=rp.embed + rp.blocks() + rp.shared
                                + norm, logits=0, copies=rp.cache, gradients=kw.get("grads_before", 0),
                                temporaries=B * S * ctx.H * dt + teacher) for kw in variants]
        return max(found, key=lambda m: m.total)

    first, m = top(False), top(True)
    first_peak, steady = weights + first.total + ctx.inputs, weights + opt + m.total + ctx.inputs
    if steady < ctx.step:
        return max(first_peak, ctx.step), ctx.step, "optimizer step", "optimizer step", est._parts
    parts = {"weights": weights, "gradients": m.gradients, "optimizer state": opt, "activations": m.activations,
             "logits & loss": m.logits, "autocast weight copies": m.copies, "temporaries": m.temporaries + ctx.inputs}
    return max(first_peak, ctx.step), steady, "forward/backward", AT_THE_HEAD.get(m.where, m.where), parts


def finish(est, cfg, shapes, *, config, teacher_weights: int, teacher_text, teacher_dt: int, vllm_cpu: bool,
           casts: int | None = None) -> dict:
    """The fields of ``est`` with DistillationTrainer's parts in: the teacher's weights (held all along), its forward
    and the divergence in the training step, the buffered rollouts, and the generation phase (its own peak:
    ``setup["generation_peak_bytes"]`` and step 1's ``setup["first_generation_peak_bytes"]``). ``casts``: with
    bf16, what :func:`autocast_casts` counts (None: no autocast)."""
    buffered = buffered_bytes(shapes)
    first, steady, phase, moment, parts = step_peaks(est, shapes, teacher_text=teacher_text, teacher_dt=teacher_dt,
                                                     beta=cfg.beta)
    held = dataclasses.replace(est, weights_bytes=est.weights_bytes + teacher_weights)
    gen_first, gen_moment = grpo.generation_peak(held, shapes, config=config, reference="none", later=False)
    if casts is not None:   # bf16: generate() under accelerate's autocast, its cast weights at each forward's head
        under = held.weights_bytes + autocast_forward(shapes, config, casts, dtype(est.setup["load_dtype"]))
        gen_first, gen_moment = max((gen_first, gen_moment), (under, "generate() (the last forward's LM head, "
                                                                     "under autocast)"))
    opt = est.optimizer_bytes - est.paged_optimizer_bytes
    gen_steady = gen_first + opt + buffered
    setup = dict(est.setup, distillation=True, teacher_weights_bytes=teacher_weights, beta=cfg.beta,
                 generation_rows=shapes["G"], prompt_len=shapes["P"], completion_len=shapes["C"],
                 buffered_rollouts_bytes=buffered, generation_peak_bytes=gen_steady,
                 first_generation_peak_bytes=gen_first, generation_moment=gen_moment, old_logprob_pass=False,
                 reference="none")
    notes = list(est.notes)
    if shapes["vllm"]:
        setup.update(vllm_reserved_fraction=shapes["vllm"], vllm_sleep_mode=bool(cfg.vllm_enable_sleep_mode))
        notes.append(Note(f"not measured: vLLM colocate reserves {shapes['vllm']:g} of the device's memory "
                          "(vllm_gpu_memory_utilization) beside this estimate", field="vllm_gpu_memory_utilization",
                          code="distillation-vllm-share"))
    if vllm_cpu:
        notes.append(Note("use_vllm=True with use_cpu=True: vLLM's share is a fraction of a GPU's memory: set "
                          "use_vllm=False to generate with transformers on the CPU", field="use_vllm",
                          code="distillation-vllm-cpu"))
    if est.setup["device"] == "cuda":
        notes.append(Note("on CUDA TRL's divergence projects the completion tokens left after the end of each "
                          "sequence only; the estimate counts every completion position (B x C), the most it can be",
                          field="seq_len", code="distillation-scored-positions"))
    peak, first_peak = steady + teacher_weights + buffered, first + teacher_weights + buffered
    out = dict(peak_bytes=peak, first_step_peak_bytes=max(first_peak, gen_first), peak_phase=phase, peak_moment=moment,
               weights_bytes=held.weights_bytes, eval_peak_bytes=est.eval_peak_bytes + teacher_weights,
               _parts={**parts, "weights": parts.get("weights", 0) + teacher_weights,
                       "temporaries": parts.get("temporaries", 0) + buffered},
               setup=setup, notes=notes, sources={**est.sources, "teacher": (
                   teacher_weights, f"{TRAINER}.teacher_model: held for the whole run, no grad")})
    if gen_steady > peak:
        out.update(peak_bytes=gen_steady, peak_phase="generation", peak_moment=gen_moment,
                   _parts={"weights": held.weights_bytes, "optimizer state": opt,
                           "temporaries": gen_steady - held.weights_bytes - opt})
    return out


class DistillationReader(grpo.GrpoReader):
    """DistillationTrainer and DistillationConfig (the module doc): GRPO's generation, the teacher's forward and the
    chunked divergence."""

    trainer_name, config_name, config_keyword = TRAINER, CONFIG, "distillation_config"
    kind = "distillation"
    teacher = None   # (weights bytes, text config, dtype bytes)

    def read_own(self, cfg) -> tuple:
        return read_distillation_config(cfg, self.config_name)

    def rollout(self, cfg, prompt_len: int) -> dict:
        return rollout(cfg, prompt_len, self.config_name)

    def read_trainer(self, trainer) -> None:
        self.own.take(*self.read_own(trainer.args))
        refuse_dropout(trainer.args, trainer.model.config, self.config_name)
        self.teacher = read_teacher(trainer)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        super().after_model(trainer, reading, seq_len)
        vocab = trainer.model.config.get_text_config().vocab_size
        if vocab != self.teacher[1].vocab_size:   # (TRL refuses it when built; a teacher swapped in after is not)
            raise InputError("teacher_model", f"the student's vocabulary ({vocab}) is not the teacher's "
                             f"({self.teacher[1].vocab_size}); {TRAINER} compares the full next-token distributions: "
                             "use a teacher of the same vocabulary.", code="distillation-vocab")

    def compose(self, draft, trainer, reading: Reading) -> dict:
        weights, text, dt = self.teacher
        refuse_half_weights(draft.setup["load_dtype"], dt)
        return finish(draft, trainer.args, self.shapes, config=trainer.model.config, teacher_weights=weights,
                      teacher_text=text, teacher_dt=dt, vllm_cpu=trainer.args.use_vllm and trainer.args.use_cpu,
                      casts=autocast_casts(trainer.model) if under_autocast(trainer) else None)

    def read_config(self, cfg, given) -> None:
        raise InputError("distillation_config", f"estimate_from({self.config_keyword}=...) is not modeled: the "
                         f"teacher's weights and forward are read from a built {TRAINER}: pass it to "
                         "estimate_trainer or kit.check.", code="distillation-from-config")

    def config_inputs(self, cfg) -> dict:
        return {"sft": False, "sft_config": None, "padding_free": False, "grpo_config": None,
                "distillation_config": cfg}


trainer_kinds.register_kind("distillation", trainer_kinds.library_classes("trl", TRAINER, CONFIG))
trainer_kinds.register_part("distillation", "estimate", DistillationReader)
