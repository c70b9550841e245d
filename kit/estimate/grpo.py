"""TRL's ``GRPOTrainer`` and ``GRPOConfig`` for the estimator (the behaviour of TRL 1.16, read from
``trl/trainer/grpo_trainer.py`` and ``grpo_config.py``).

What one GRPOTrainer step does, and how each part is estimated:

- the generation phase (``_prepare_inputs`` -> ``_generate_and_score_completions``, inside ``training_step``) runs
  once every ``steps_per_generation x num_iterations`` steps over the local generation batch of
  ``G = per_device_train_batch_size x steps_per_generation`` prompts, left-padded to the longest (prompts are not
  truncated), under ``torch.no_grad()`` with checkpointing off and without autocast: ``generate`` with a dynamic KV
  cache of ``G x (prompt + completion - 1)`` positions in the model's dtype, ``logits_to_keep=1`` (one ``[G, V]``
  row of logits a token, copied to fp32 and processed). Then, still no-grad and in chunks of
  ``per_device_train_batch_size`` rows through TRL's fused head: the old-log-prob pass (when
  ``gradient_accumulation_steps % (steps_per_generation x num_iterations) != 0``, or vLLM's importance sampling)
  and, with ``beta > 0``, the reference's (a separate model in the policy's dtype, or the PEFT policy with its
  adapter disabled). Its peak is its own phase (``setup["generation_peak_bytes"]``, :func:`generation_peak`);
- the rollouts are shuffled, split in ``steps_per_generation`` parts and buffered (``_buffered_inputs``): int64
  ``prompt_ids``/``prompt_mask`` ``[G, P]`` and ``completion_ids``/``completion_mask`` ``[G, C]``, fp32
  ``advantages`` and the old/reference log-probs ``[G, C]``, held across the steps (:func:`buffered_bytes`);
- the training step: the policy's forward/backward over ``B x (P + C)`` rows through TRL's fused LM head with
  ``outputs=("log_probs", "entropy")`` (no ``is_top1``), log-probs in tiles, never the logits (modeled as for
  SFTTrainer, :mod:`kit.estimate.replay.fused_head`); the loss works on ``[B, C]`` tensors (nothing per vocabulary
  entry);
- vLLM (``use_vllm=True``) cannot run here: in ``colocate`` mode it reserves ``vllm_gpu_memory_utilization`` of the
  device beside training (not measured: ``setup["vllm_reserved_fraction"]``); in ``server`` mode it runs elsewhere.

Every GRPOConfig field is in one of :data:`MODELED`, :data:`NO_MEMORY`, :data:`REFUSED` or TrainingArguments'
fields (read by :func:`kit.estimate.read_training.read_args`).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from kit.inputs import InputError, Note

from kit import inputs
from kit import trainer_kinds
from kit.estimate.dpo import held_bytes, refuse_dropout
from kit.estimate.replay import BOOL, F32, FP32, I64, dtype, lookup
from kit.estimate.replay.fused_head import TOKEN_CHUNK, VOCAB_CHUNK, chunked_head
from kit.estimate.trainer_reader import Given, Reading, TrainerReader
from kit.estimate.trl import SftReader, model_init, refuse_shared, refuser, version_notes

# GRPOConfig fields the estimate reads, and how
MODELED = {
    "model_init_kwargs": f"the dtype a model given by id loads in (TRL's default: float32), as for "
                         f"{SftReader.config_name}",
    "num_generations": "groups the generation batch's rows (per_device_train_batch_size x steps_per_generation "
                       "rows whatever it is); its divisibility is TRL's check",
    "max_completion_length": "the completion's length C: the KV cache, the rollouts and the training rows",
    "generation_batch_size": "with steps_per_generation: the local generation batch G",
    "steps_per_generation": "G = per_device_train_batch_size x steps_per_generation rows generated at once",
    "num_iterations": "generation every steps_per_generation x num_iterations steps; the old-log-prob pass",
    "beta": "beta > 0: the reference model (a copy, or the adapter disabled) and its no-grad pass",
    "generation_kwargs": "min_new_tokens = max_completion_length: every completion its full length (no padding)",
    "pad_to_multiple_of": "the prompts and completions padded up to a multiple of it",
    "use_vllm": "colocate: a reserved share of the device (not measured); server: generation off this GPU",
    "vllm_mode": "colocate (a share of this GPU) or server (another GPU)",
    "vllm_gpu_memory_utilization": "the share of the device vLLM colocate reserves (not measured)",
    "vllm_enable_sleep_mode": "vLLM colocate releases its share during the optimizer step (not measured)",
    "vllm_importance_sampling_correction": "with vLLM: the old-log-prob pass always runs",
    "disable_dropout": "zeroes nn.Dropout modules (refused where the config names a dropout the replay applies)",
    "temperature": "its processor's [G, V] output a generated token (other than 1), a scalar of the fused head",
    "sync_ref_model": "SyncRefModelCallback mixes the reference's weights in place: no bytes beyond the reference's",
}
# GRPOConfig fields that change no byte the kit counts, and why
_SCALAR = "a scalar of the loss"
_VLLM = "vLLM's own setting, inside its share or on its server"
_LOG = "what is logged"
NO_MEMORY = {
    "trust_remote_code": "how the model's code is loaded", "num_generations_eval": "evaluation (not modeled)",
    "ds3_gather_for_generation": "DeepSpeed ZeRO-3 only (refused under strategies)",
    "shuffle_dataset": "the order of the prompts",
    "chat_template_kwargs": "how the prompts are rendered (their lengths are read from the dataset)",
    "vllm_model_impl": _VLLM, "vllm_structured_outputs_regex": _VLLM, "vllm_server_base_url": _VLLM,
    "vllm_server_host": _VLLM, "vllm_server_port": _VLLM, "vllm_server_timeout": _VLLM, "vllm_group_port": _VLLM,
    "vllm_max_model_length": _VLLM, "vllm_tensor_parallel_size": _VLLM,
    "vllm_importance_sampling_mode": "a [G, C] ratio", "vllm_importance_sampling_clip_max": _SCALAR,
    "vllm_importance_sampling_clip_min": _SCALAR, "vllm_importance_sampling_cap": _SCALAR,
    "epsilon": _SCALAR, "delta": _SCALAR, "epsilon_high": _SCALAR, "sapo_temperature_neg": _SCALAR,
    "sapo_temperature_pos": _SCALAR, "vespo_k_pos": _SCALAR, "vespo_lambda_pos": _SCALAR, "vespo_k_neg": _SCALAR,
    "vespo_lambda_neg": _SCALAR, "importance_sampling_level": "[B, C] or [B, 1] weights",
    "reward_weights": "weights of the [G] rewards", "multi_objective_aggregation": "how the [G] rewards combine",
    "scale_rewards": "how the [G] rewards are normalized", "loss_type": "every variant works on [B, C] log-probs",
    "mask_truncated_completions": "a [G, C] mask", "ref_model_mixup_alpha": "a scalar of the sync",
    "ref_model_sync_steps": "when the sync runs", "top_entropy_quantile": "a [B, C] mask from the entropies",
    "off_policy_mask_threshold": "a [B, C] mask", "use_bias_correction_kl": "a [B, C] product",
    "log_completions": _LOG, "log_multimodal": _LOG, "num_completions_to_print": _LOG, "log_unique_prompts": _LOG,
    "log_completions_hub_repo": _LOG,
}


def _set(field):
    return lambda cfg: bool(getattr(cfg, field))


# GRPOConfig fields refused when set: (is it set?, what it does)
REFUSED = {
    "router_aux_loss_coef": (lambda cfg: bool(cfg.router_aux_loss_coef),
                             "adds a Mixture-of-Experts load-balancing loss (router logits)"),
    "cast_lm_head_to_fp32": (_set("cast_lm_head_to_fp32"), "casts the LM head and its tiles to fp32"),
    "cache_implementation": (lambda cfg: cfg.cache_implementation not in (None, "dynamic"),
                             "sets another KV cache than the dynamic one generate grows"),
    "entropy_coef": (_set("entropy_coef"), "adds the entropy's gradient to the fused head's backward"),
    "use_adaptive_entropy": (_set("use_adaptive_entropy"), "adds the entropy's gradient to the fused head's "
                             "backward"),
    "entropy_coef_min": (lambda cfg: cfg.entropy_coef_min != 0.0, "bounds the adaptive entropy bonus"),
    "entropy_coef_max": (lambda cfg: cfg.entropy_coef_max != 1.0, "bounds the adaptive entropy bonus"),
    "entropy_coef_delta": (lambda cfg: cfg.entropy_coef_delta != 0.005, "steps the adaptive entropy bonus"),
    "entropy_target": (lambda cfg: cfg.entropy_target != 0.2, "steers the adaptive entropy bonus"),
    "max_tool_calling_iterations": (lambda cfg: cfg.max_tool_calling_iterations is not None,
                                    "runs tool calls between generations (longer, multi-turn completions)"),
    "use_transformers_continuous_batching": (_set("use_transformers_continuous_batching"),
                                             "generates with transformers' continuous batching (a paged cache)"),
    "transformers_continuous_batching_config": (lambda cfg: cfg.transformers_continuous_batching_config is not None,
                                                "configures transformers' continuous batching (a paged cache)"),
    "use_transformers_paged": (_set("use_transformers_paged"), "generates with a paged KV cache"),
    "top_p": (lambda cfg: cfg.top_p < 1.0, "sorts each generated token's logits (nucleus sampling's temporaries)"),
    "top_k": (lambda cfg: bool(cfg.top_k), "keeps each generated token's top-k logits (topk's temporaries)"),
    "min_p": (lambda cfg: cfg.min_p is not None, "filters each generated token's logits (its temporaries)"),
    "repetition_penalty": (lambda cfg: cfg.repetition_penalty != 1.0, "gathers and scatters each generated token's "
                           "logits"),
}
# generate() keywords that change no byte the kit counts (the others are refused by name)
_GEN_KW = ("min_new_tokens", "eos_token_id", "pad_token_id", "bos_token_id")


def read_grpo_config(cfg, name: str = "GRPOConfig"):
    """(estimate options, sources, notes) of what a GRPOConfig changes; refuses in one sentence what is not modeled."""
    src = {"loss_type": (cfg.loss_type, f"{name}.loss_type: every variant works on [B, C] log-probs")}
    return read_generating_config(cfg, name, refused=REFUSED, no_memory=NO_MEMORY, src=src)


def read_generating_config(cfg, name: str, *, refused: dict, no_memory: dict, src: dict):
    """(estimate options, sources, notes) of a config whose trainer generates as GRPOTrainer does (GRPO's, RLOO's):
    refuses in one sentence each of ``refused`` that is set, and what no such trainer's estimate models; ``src``:
    the kind's own sources, to which ``no_memory``'s fields are added."""
    trainer_name = name.replace("Config", "Trainer")
    refuse = refuser(name)
    refuse_shared(cfg, refuse)
    for field, (is_set, what) in refused.items():
        if is_set(cfg):
            refuse(field, what, f"grpo-{field.replace('_', '-')}")
    for field, what, code in (("use_liger_kernel", "swaps Liger's kernels into the policy's and the no-grad passes' "
                               "forwards", "trl-liger"),
                              ("activation_offloading", "moves the saved activations to the CPU", "trl-offloading"),
                              ("torch_compile", "compiles the model, whose fused kernels save other tensors",
                               "trl-compile")):
        if getattr(cfg, field, False):
            refuse(field, what, code)
    extra = sorted(set(cfg.generation_kwargs or {}) - set(_GEN_KW))
    if extra:
        refuse("generation_kwargs", f"holds {', '.join(extra)} (generate() keywords that change its memory)",
               "grpo-generation-kwargs")
    src = {"fused_lm_head": (True, f"{trainer_name}'s add_fused_lm_head, outputs log_probs and entropy (no logits)"),
           **src}
    src.update({k: (getattr(cfg, k), f"{name}.{k}: {why} (no memory of its own)") for k, why in no_memory.items()})
    notes = [Note(f"{trainer_name}'s evaluation (generation and scoring of the eval prompts) is not modeled: "
                  "eval_peak_bytes is a plain forward's", field="eval_batch_size", code="grpo-eval-unmodeled")]
    notes.extend(version_notes(trainer_name))
    return {"fused_lm_head": True}, src, notes


def rollout(cfg, prompt_len: int, name: str = "GRPOConfig") -> dict:
    """The shapes of one generation: ``B`` rows a step, ``G`` generated at once, ``P`` prompt and ``C`` completion
    tokens (each padded up to ``pad_to_multiple_of``), whether the old-log-prob pass runs, whether every completion is
    its full length (``generation_kwargs['min_new_tokens']``), and where each was read."""
    B, spg, completion = cfg.per_device_train_batch_size, *checked_lengths(cfg, name)
    every = spg * cfg.num_iterations
    vllm_is = cfg.use_vllm and getattr(cfg, "vllm_importance_sampling_correction", False)
    m = cfg.pad_to_multiple_of or 1
    prompt_len = inputs.whole_number("seq_len", prompt_len)   # the longest prompt, in tokens, as for any Trainer
    P, C = -(-prompt_len // m) * m, -(-completion // m) * m
    min_tokens = (cfg.generation_kwargs or {}).get("min_new_tokens") or 0
    return dict(B=B, G=B * spg, P=P, C=C, spg=spg, old_pass=bool(cfg.gradient_accumulation_steps % every or vllm_is),
                full=min_tokens == cfg.max_completion_length, min_tokens=min_tokens > 0, temperature=cfg.temperature,
                vllm=cfg.use_vllm and cfg.vllm_mode == "colocate" and cfg.vllm_gpu_memory_utilization,
                where=f"{name}: G = per_device_train_batch_size ({B}) x steps_per_generation ({spg}), completion "
                      f"max_completion_length ({completion})")


def checked_lengths(cfg, name: str = "GRPOConfig") -> tuple[int, int]:
    """(steps_per_generation, max_completion_length) of ``cfg``, or one sentence on a value GRPOConfig takes and
    GRPOTrainer cannot run (TRL 1.16): ``max_completion_length=None`` hands the length to generate()'s defaults
    (transformers' 20 new tokens, the model's generation_config, or vLLM's max_model_len), which the kit cannot read;
    ``steps_per_generation=0`` is a DataLoader of 0 prompts a batch; ``num_iterations=0`` repeats each generation 0
    times and divides the step by 0 (``_step % (steps_per_generation x num_iterations)``)."""
    if cfg.max_completion_length is None:
        raise InputError("max_completion_length", f"{name}.max_completion_length=None leaves the completion's "
                         "length to generate()'s defaults (20 new tokens in transformers, the model's "
                         "generation_config, or vLLM's max_model_len), which the kit cannot read: set it to the "
                         "longest completion you allow (TRL's default: 512).", code="grpo-completion-length")
    for field, default in (("max_completion_length", "512"), ("steps_per_generation", "gradient_accumulation_steps"),
                           ("num_iterations", "1")):
        value = getattr(cfg, field)
        if inputs.whole_number(field, value, minimum=None) < 1:   # (a fraction or text: refused by whole_number)
            raise InputError(field, f"{name}.{field}={value!r}: {name.replace('Config', 'Trainer')} needs it a "
                             "whole number >= 1 "
                             f"(default {default}); {_AT_ZERO[field]}.", code="grpo-" + field.replace("_", "-"))
    return cfg.steps_per_generation, cfg.max_completion_length


_AT_ZERO = {"max_completion_length": "generate() would make no completion to score",
            "steps_per_generation": "TRL's DataLoader would draw batches of no prompts",
            "num_iterations": "TRL would reuse each generation 0 times and divide its step count by 0"}


def check_positions(shapes: dict, config, name: str = "GRPOConfig") -> None:
    """Refuse, naming ``max_completion_length``, a prompt plus completion longer than the model's positions (the
    user's prompt length is theirs: the completion is what the GRPOConfig adds)."""
    most = getattr(config.get_text_config(), "max_position_embeddings", None)
    P, C = shapes["P"], shapes["C"]
    if most and P + C > most:
        fix = f"use max_completion_length <= {most - P}" if most > P else f"use prompts of fewer than {most} tokens"
        raise InputError("max_completion_length", f"the longest prompt ({P} tokens) plus {name}."
                         f"max_completion_length ({C}) is {P + C} positions, beyond the model's {most}: {fix}.",
                         code="grpo-positions")


def buffered_bytes(shapes: dict, reference: bool) -> int:
    """``_buffered_inputs``: the shuffled rollouts of one generation, held across its steps: int64 prompt ids and
    mask ``[G, P]``, completion ids and mask ``[G, C]``, fp32 advantages ``[G]``, and then either (GRPO) the summed
    item count and the old and reference log-probs ``[G, C]`` fp32 where they were computed, or (a kind whose
    rollout has ``sequence_logps``: RLOO) the old log-probs summed per completion, fp32 ``[G]``."""
    G, P, C = shapes["G"], shapes["P"], shapes["C"]
    ids = 2 * G * (P + C) * I64 + G * F32
    if shapes.get("sequence_logps"):
        return ids + G * F32
    return ids + I64 + G * C * F32 * (int(shapes["old_pass"]) + int(reference))


def _pass_peak(est, shapes, *, text, seq_len, hidden_dt, weight_dt, separate: bool) -> tuple[int, str]:
    """One no-grad log-prob pass (``_get_per_token_logps_and_entropies``) over a chunk of ``B`` rows: the chunk's
    labels (``masked_fill``, int64), the fused head's no-grad moment (the final norm's output and its reshape copy,
    the targets, seven fp32 statistics, the ``[n, 32768]`` tile and, on a CPU, the fold's fp32 temporaries: no
    ``is_top1`` mask, which neither the policy's outputs nor a separate reference's ask), or a block's (at most what
    one block saves in training: an upper bound), whichever is larger. The pass runs under the trainer's autocast."""
    rows, H, V = min(shapes["B"], shapes["G"]), text.hidden_size, text.vocab_size
    half = dtype(est.setup["precision"]) if est.setup["precision"] != "fp32" else None
    fh = chunked_head(B=rows, S=seq_len, H=H, V=V, hidden_dt=hidden_dt, weight_dt=weight_dt,
                      compute_dt=half or hidden_dt,
                      head_trainable=False, hidden_grad=False, device=est.setup["device"])
    N = rows * (seq_len - 1)
    mask = 0 if est.setup["device"] == "cuda" else min(N, TOKEN_CHUNK) * min(V, VOCAB_CHUNK) * BOOL
    head = fh["forward"] + fh["saved"] - 2 * N * F32 - mask
    outputs = N * (F32 + BOOL) if separate else N * (2 * F32 + BOOL)   # log_probs (+ entropy), label_mask
    block, exact = block_loop_bytes(est, text, rows=rows, seq_len=seq_len, hidden_dt=hidden_dt,
                                    mlp_dt=half or hidden_dt,
                                    padded=shapes["padded"])
    labels = rows * seq_len * I64
    if head + outputs >= block:
        return labels + head + outputs, "a no-grad log-prob pass (at the fused head)"
    return labels + block, "a no-grad log-prob pass (a block" + (")" if exact else ", bounded)")


def block_loop_bytes(est, text, *, rows: int, seq_len: int, hidden_dt: int, mlp_dt: int,
                     padded: bool) -> tuple[int, bool]:
    """(bytes, exact) of the largest a no-grad forward holds inside the blocks over ``rows x seq_len`` positions: for
    a decoder whose family declares its no-grad loop with rotary embeddings (Llama's: its MLP
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, three ``[T, F]`` tensors beside four hidden states), the loop's
    tensors (as :func:`kit.estimate.evaluation.block_forward_bytes` counts them), the rotary cos/sin and, where a row
    is padded, the ``[rows, 1, seq_len, seq_len]`` bool mask; elsewhere at most what one block saves in training,
    scaled to these tokens (an upper bound: ``exact`` False)."""
    T = rows * seq_len
    declared = lookup(text.model_type)
    loop = declared.no_grad_loop if declared else None
    if loop is not None and loop.rotary:
        hd = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        shape = SimpleNamespace(L=text.num_hidden_layers, H=text.hidden_size, F=text.intermediate_size)
        return loop.bytes(shape, T, hidden_dt, mlp_dt) + 2 * seq_len * hd * hidden_dt + \
            (rows * seq_len * seq_len * BOOL if padded else 0), True
    rp = est.context.rp
    return max(rp.block, rp.block_in) * T // (est.setup["batch_size"] * est.setup["seq_len"]), False


def sampling_bytes(shapes: dict, vocab: int, model_dt: int, temperature: float) -> tuple[int, int]:
    """(at the last token's sampling, during its forward) the bytes of ``[G, V]`` logits (``V``: ``vocab``) ``_sample``
    holds (transformers 5): the model's ``[G, 1, V]`` logits (model dtype) and ``next_token_logits`` (an fp32 copy)
    beside the previous token's ``next_token_scores`` and ``probs`` (bound till rebound). With ``min_new_tokens``, two
    processors run (``MinLengthLogitsProcessor``, as ``min_length = min_new_tokens + prompt``, and
    ``MinNewTokensLengthLogitsProcessor``), each a ``clone`` and a ``torch.where`` (fp32 ``[G, V]``) beside the previous
    one's output, an int64 ``arange(V)`` and its bool ``isin`` mask; without, a ``temperature`` other than 1 adds its
    output. During the next forward the previous token's ``next_token_logits``, scores (one tensor when no processor
    ran) and ``probs`` are held."""
    G = shapes["G"]
    if shapes["min_tokens"]:
        return G * vocab * (model_dt + 6 * F32) + vocab * (I64 + BOOL), 3 * G * vocab * F32
    scaled = temperature != 1.0
    return G * vocab * (model_dt + (4 if scaled else 3) * F32), (3 if scaled else 2) * G * vocab * F32


def generate_bytes(est, shapes, *, text, kv_heads, head_dim, model_dt, temperature) -> tuple[int, str]:
    """``generate()`` over ``G`` left-padded prompts, beside the prompt ids and mask (int64 ``[G, P]``): the largest
    of the prefill (the KV cache of ``P`` positions, the blocks' no-grad moment, :func:`block_loop_bytes`, and the
    first token's logits), the last token's sampling (the dynamic cache of ``P + C - 1`` positions: ``L`` layers x
    keys and values x ``G`` rows in the model's dtype, and the ``[G, V]`` logits of :func:`sampling_bytes`) and its
    forward's ``torch.cat`` (one layer's keys re-made one position longer while the old ones are alive); the ids and
    attention mask grow to ``[G, P + C]`` (int64)."""
    G, P, C, L, V = shapes["G"], shapes["P"], shapes["C"], text.num_hidden_layers, text.vocab_size
    S = P + C
    per_pos = G * kv_heads * head_dim * model_dt
    sample, between = sampling_bytes(shapes, V, model_dt, temperature)
    ids = 2 * G * S * I64
    prefill = 2 * L * per_pos * P + block_loop_bytes(est, text, rows=G, seq_len=P, hidden_dt=model_dt, mlp_dt=model_dt,
                                                     padded=shapes["padded"])[0]
    last = 2 * L * per_pos * (S - 1) + ids + sample
    cat = 2 * L * per_pos * (S - 2) + per_pos * (S - 1) + ids + between
    best = max((prefill, "the prefill of the prompts"), (last, "the last token's sampling"),
               (cat, "the KV cache at its largest"), key=lambda t: t[0])
    return 2 * G * P * I64 + best[0], f"generate() ({best[1]})"


def generation_peak(est, shapes, *, config, reference: str, later: bool) -> tuple[int, str]:
    """The generation phase's peak and its moment: held (the weights with a separate reference's, the optimizer state
    after step 1, and the previous generation's buffered rollouts after step 1) + the largest of ``generate()`` and
    the no-grad passes (the old-log-prob pass, the reference's), each beside the rollouts built from the
    completions (int64 ``[G, P]``, ``[G, C]`` ids and masks, and ``prompt_completion_ids`` and ``attention_mask``
    ``[G, P + C]``)."""
    text = config.get_text_config()
    H = text.hidden_size
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or H // text.num_attention_heads
    load = est.setup["load_dtype"]
    model_dt = dtype(load) if load in ("fp32", "bf16", "fp16") else FP32
    S, G = shapes["P"] + shapes["C"], shapes["G"]
    opt = est.optimizer_bytes - est.paged_optimizer_bytes
    held = est.weights_bytes + (opt + buffered_bytes(shapes, reference != "none") if later else 0)
    if shapes["vllm"]:   # vLLM generates inside its own share (setup["vllm_reserved_fraction"], not counted here)
        gen, moment = 0, "generation in vLLM (its share, not counted)"
    else:
        gen, moment = generate_bytes(est, shapes, text=text, kv_heads=kv_heads, head_dim=head_dim, model_dt=model_dt,
                                     temperature=shapes["temperature"])
    rollouts = 2 * G * S * I64 * 2   # prompt/completion ids and masks, and their concatenations
    passes = []
    if shapes["old_pass"]:
        passes.append(_pass_peak(est, shapes, text=text, seq_len=S, hidden_dt=model_dt, weight_dt=model_dt,
                                 separate=False))
    if reference != "none":
        old = G * shapes["C"] * F32 if shapes["old_pass"] else 0   # the old log-probs, held through the reference pass
        ref = _pass_peak(est, shapes, text=text, seq_len=S, hidden_dt=model_dt, weight_dt=model_dt,
                         separate=reference == "model")
        passes.append((ref[0] + old, ref[1].replace("a no-grad log-prob pass", "the reference's no-grad pass")))
    best = max([(gen, moment)] + [(rollouts + p, w) for p, w in passes], key=lambda t: t[0])
    return held + best[0], best[1]


def reference_of(cfg, peft: bool, ref_model=None, trainer_name: str = "GRPOTrainer") -> tuple[str, str]:
    """(kind, where): "none" (beta=0), "model" (a separate copy in the policy's dtype) or "adapter-disabled" (the PEFT
    policy inside use_adapter(model, None): no weights of its own)."""
    if cfg.beta == 0.0:
        return "none", f"{type(cfg).__name__}.beta=0.0: no reference model, no reference pass"
    if peft and ref_model is None:
        return "adapter-disabled", f"{trainer_name}: the PEFT policy inside use_adapter(model, None), no weights"
    return "model", f"{trainer_name}.__init__: create_model_from_path of the policy's id, in its dtype (a copy)"


def finish(est, cfg, shapes, *, config, reference: str, where: str, ref_weights: int, kind: str = "grpo") -> dict:
    """The fields of ``est`` with GRPO's phases in: the buffered rollouts beside the training step, the reference's
    weights (held all along), and the generation phase (its own peak: ``setup["generation_peak_bytes"]`` and step 1's
    ``setup["first_generation_peak_bytes"]``); where the generation is the largest, it is the peak."""
    buffered = buffered_bytes(shapes, reference != "none")
    held = dataclasses.replace(est, weights_bytes=est.weights_bytes + ref_weights)   # the reference's, held too
    steady, moment = generation_peak(held, shapes, config=config, reference=reference, later=True)
    first, _ = generation_peak(held, shapes, config=config, reference=reference, later=False)
    setup = dict(est.setup, **{kind: True}, reference=reference, reference_weights_bytes=ref_weights,
                 generation_rows=shapes["G"], prompt_len=shapes["P"], completion_len=shapes["C"],
                 buffered_rollouts_bytes=buffered, generation_peak_bytes=steady, first_generation_peak_bytes=first,
                 generation_moment=moment, old_logprob_pass=shapes["old_pass"])
    notes = list(est.notes)
    if shapes["vllm"]:
        setup.update(vllm_reserved_fraction=shapes["vllm"], vllm_sleep_mode=bool(cfg.vllm_enable_sleep_mode))
        notes.append(Note(f"not measured: vLLM colocate reserves {shapes['vllm']:g} of the device's memory "
                          "(vllm_gpu_memory_utilization) beside this estimate"
                          + ("; sleep mode releases it during the optimizer step"
                             if cfg.vllm_enable_sleep_mode else ""), field="vllm_gpu_memory_utilization",
                          code="grpo-vllm-share"))
    if cfg.use_vllm and cfg.use_cpu:
        notes.append(Note("use_vllm=True with use_cpu=True: vLLM's share is a fraction of a GPU's memory, "
                          "which a run on the CPU does not use: set use_vllm=False to generate with "
                          "transformers on the CPU, or drop use_cpu to train on the GPU", field="use_vllm",
                          code="grpo-vllm-cpu"))
    if est.setup["device"] == "cuda":
        notes.append(Note("on CUDA TRL's fused head scores the completion tokens only (B x C); the estimate "
                          "counts every position (B x (P + C - 1)), the most it can be", field="seq_len",
                          code="grpo-scored-positions"))
    out = dict(peak_bytes=est.peak_bytes + buffered + ref_weights,
               first_step_peak_bytes=max(est.first_step_peak_bytes + buffered + ref_weights, first),
               weights_bytes=held.weights_bytes, eval_peak_bytes=est.eval_peak_bytes + ref_weights,
               _parts={**est._parts, "weights": est._parts.get("weights", 0) + ref_weights,
                       "temporaries": est._parts.get("temporaries", 0) + buffered},
               setup=setup, notes=notes, sources={**est.sources, "reference": (reference, where)})
    if steady > out["peak_bytes"]:
        opt = est.optimizer_bytes - est.paged_optimizer_bytes
        out.update(peak_bytes=steady, peak_phase="generation", peak_moment=moment,
                   _parts={"weights": held.weights_bytes, "optimizer state": opt,
                           "temporaries": steady - held.weights_bytes - opt})
    return out


def trainer_prompts(trainer, seq_len=None, name: str = "GRPOTrainer") -> tuple[int, bool, str]:
    """(P, same_length, where): the longest prompt of the first 64 rows of ``trainer.train_dataset`` in tokens, as
    GRPOTrainer tokenizes them (its ``_tokenize_prompts``, which renders a conversation's chat template as training
    does: called rather than re-implemented), and whether they are all one length (no left padding)."""
    if seq_len is not None:
        return seq_len, False, "estimate_trainer(seq_len=...): the longest prompt, in tokens"
    ds = trainer.train_dataset
    if ds is None or not len(ds) or "prompt" not in ds.column_names:
        raise InputError("seq_len", f"{name}'s train_dataset has no prompt rows to read: pass seq_len=... "
                         "(the longest prompt, in tokens).")
    if getattr(trainer, "environment_factories", None) is not None:
        raise InputError("environment_factory", f"{name} with environments (multi-turn rollouts) is not "
                         "modeled: estimate without environment_factory.", code="grpo-environments")
    n = min(len(ds), 64)
    ids = trainer._tokenize_prompts([ds[i]["prompt"] for i in range(n)])[0]
    lengths = [len(x) for x in ids]
    return max(lengths), len(set(lengths)) == 1, f"{name}'s tokenization of the first {n} prompts: the longest"


def seq_options(shapes: dict, same_length: bool, where: str, name: str = "GRPOConfig") -> tuple[dict, dict]:
    """(options, sources) of the training step's rows: ``B`` rows of ``P + C`` tokens, padded unless every prompt
    is one length and every completion its full length."""
    S, padded = shapes["P"] + shapes["C"], not (same_length and shapes["full"])
    shapes["padded"] = padded
    return {"batch_size": shapes["B"], "seq_len": S, "padded": padded}, {
        "batch_size": (shapes["B"], f"{name}.per_device_train_batch_size: the rows of one training step"),
        "seq_len": (S, f"{shapes['P']} prompt tokens ({where}) + {shapes['C']} completion tokens "
                       "(max_completion_length)"),
        "padded": (padded, "prompts of one length and completions of max_completion_length (min_new_tokens)"
                   if not padded else "prompts left-padded to the longest, completions right-padded after the "
                   "end-of-sequence token (assumed: some are)"),
        "generation_batch": (shapes["G"], shapes["where"])}


def refuse_unmodeled(opts: dict, name: str = "GRPOTrainer") -> None:
    """GRPOTrainer on a bitsandbytes model (what it does to it is not read), or under DeepSpeed/FSDP (the
    generation's gathered weights, the reference prepared by them): refused in one sentence."""
    if opts.get("strategy", "single") != "single":
        raise InputError("strategy", f"{name} under {opts['strategy']} (the weights gathered for generation, "
                         "the reference prepared by DeepSpeed or FSDP) is not modeled: the kit estimates "
                         f"{name} on one GPU.", code="grpo-strategy")
    if opts.get("quantization", "none") != "none":
        raise InputError("quantization", f"{name} on a quantized (bitsandbytes) model is not modeled: "
                         "estimate it unquantized.", code="grpo-quantized")


def refuse_reward_models(trainer) -> None:
    """Reward models (``reward_funcs`` given as ids or modules: loaded, held on the device, run on every
    generation's completions) are not modeled: refused in one sentence that names them."""
    import torch

    models = [type(f).__name__ for f in getattr(trainer, "reward_funcs", []) if isinstance(f, torch.nn.Module)]
    if models:
        raise InputError("reward_funcs", f"{type(trainer).__name__}'s reward_funcs hold a reward model "
                         f"({', '.join(models)}), whose weights and forward the kit does not model: estimate with "
                         "reward functions only.", code="grpo-reward-model")


class GrpoReader(TrainerReader):
    """GRPOTrainer and GRPOConfig (the module doc): its rollouts, the generation phase, the reference. A kind whose
    trainer generates as GRPOTrainer does (RLOO's) overrides :meth:`read_own` and :meth:`rollout`."""

    trainer_name, config_name, config_keyword = "GRPOTrainer", "GRPOConfig", "grpo_config"
    kind = "grpo"   # the setup's flag and the kind's key
    trl = True
    reads_eval_rows, keeps_training_args = False, False
    shapes = rows_read = finishing = None   # the rollout's shapes; (seq_len, padded); finish()'s keywords
    peft = False                            # estimate_from was given a peft_config

    def read_own(self, cfg) -> tuple:
        """(options, sources, notes) of the kind's config."""
        return read_grpo_config(cfg, self.config_name)

    def rollout(self, cfg, prompt_len: int) -> dict:
        """The shapes of one generation (:func:`rollout`)."""
        return rollout(cfg, prompt_len, self.config_name)

    def read_trainer(self, trainer) -> None:
        self.own.take(*self.read_own(trainer.args))
        refuse_dropout(trainer.args, trainer.model.config, self.config_name)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        """B rows of prompt + completion a step; G generated at once."""
        opts = reading.opts
        reading.take(self.own.opts, self.own.src, self.own.notes)
        refuse_unmodeled(opts, self.trainer_name)
        refuse_reward_models(trainer)
        P, same, at = trainer_prompts(trainer, seq_len, self.trainer_name)
        self.shapes = self.rollout(trainer.args, P)
        check_positions(self.shapes, trainer.model.config, self.config_name)
        reading.take(*seq_options(self.shapes, same, at, self.config_name))
        self.rows_read = opts.pop("seq_len"), opts.pop("padded")

    def rows(self, trainer, reading: Reading, seq_len) -> tuple:
        return self.rows_read

    def compose(self, draft, trainer, reading: Reading) -> dict:
        ref = getattr(trainer, "ref_model", None)
        reference, where = reference_of(trainer.args, hasattr(trainer.model, "peft_config"), ref, self.trainer_name)
        return finish(draft, trainer.args, self.shapes, config=trainer.model.config, reference=reference, where=where,
                      ref_weights=held_bytes(ref) if ref is not None else 0, kind=self.kind)

    def read_config(self, cfg, given: Given) -> None:
        self.own.take(*self.read_own(cfg))
        model_init(cfg, self.config_name, given)
        if given.seq_len is None:
            raise InputError("seq_len", f"estimate_from({self.config_keyword}=...) needs seq_len: the longest prompt "
                             f"in tokens ({self.trainer_name} does not truncate prompts).")
        self.peft = given.peft_config is not None

    def after_quantization(self, opts: dict) -> None:
        refuse_unmodeled(opts, self.trainer_name)

    def finish_options(self, reading: Reading, cfg, config, seq_len, padded) -> tuple:
        """B rows of prompt + completion a step; G generated at once."""
        reading.take(self.own.opts, self.own.src, self.own.notes)
        refuse_dropout(cfg, config, self.config_name)
        self.shapes = self.rollout(cfg, seq_len)
        check_positions(self.shapes, config, self.config_name)
        options, sources = seq_options(self.shapes, not padded, "estimate_from(seq_len=...)", self.config_name)
        seq_len, padded = options.pop("seq_len"), options.pop("padded")
        reading.take(options, sources)
        reference, where = reference_of(cfg, self.peft, trainer_name=self.trainer_name)
        self.finishing = dict(config=config, reference=reference, where=where, kind=self.kind)
        return seq_len, padded

    def compose_from(self, draft, cfg, info, config) -> dict:
        # the reference (a copy as loaded, or the adapter-disabled policy), the generation phase
        model = self.finishing["reference"] == "model"
        return finish(draft, cfg, self.shapes, **self.finishing, ref_weights=draft.loaded_weights_bytes if model else 0)

    def config_inputs(self, cfg) -> dict:
        return {"sft": False, "sft_config": None, "padding_free": False, "grpo_config": cfg}


trainer_kinds.register_kind("grpo", trainer_kinds.library_classes("trl", "GRPOTrainer", "GRPOConfig"))
trainer_kinds.register_part("grpo", "estimate", GrpoReader)
