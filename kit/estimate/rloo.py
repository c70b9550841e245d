"""TRL's ``RLOOTrainer`` and ``RLOOConfig`` for the estimator (the behaviour of TRL 1.16, read from
``trl/trainer/rloo_trainer.py`` and ``rloo_config.py``).

RLOOTrainer generates as GRPOTrainer does (:mod:`kit.estimate.grpo`, whose reader this one extends): the same
``_prepare_inputs`` buffering ``G = per_device_train_batch_size x steps_per_generation`` rollouts, the same
``generate()`` under ``torch.no_grad()`` with a dynamic KV cache, the same fused LM head (log-probs and entropy, no
logits) in the training step and in the no-grad passes. What differs, and how each is estimated:

- the old-log-prob pass runs at every generation (it feeds the KL penalty and the ratio), whatever
  ``gradient_accumulation_steps`` is (modeled: ``old_pass`` always);
- ``beta`` defaults to 0.05, so a reference runs by default: a copy of the policy, or the PEFT policy with its
  adapter disabled (modeled as GRPO's); the KL is a penalty on the ``[G]`` rewards, summed per completion;
- the buffered rollouts hold the old log-probs summed per completion, fp32 ``[G]``, beside the advantages ``[G]``:
  no ``[G, C]`` log-probs and no item count (modeled: ``sequence_logps``);
- the loss works on ``[B]`` sequence log-probs (nothing per vocabulary entry, nothing the kit counts).

Every RLOOConfig field beyond TrainingArguments' is in one of :data:`MODELED`, :data:`NO_MEMORY` or :data:`REFUSED`.
"""
from __future__ import annotations

from kit import trainer_kinds
from kit.estimate import grpo

# RLOOConfig fields the estimate reads, and how (GRPOConfig's, where RLOOConfig has them, and their RLOO reading)
MODELED = {**{k: grpo.MODELED[k] for k in (
    "model_init_kwargs", "max_completion_length", "generation_batch_size", "steps_per_generation",
    "pad_to_multiple_of", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode",
    "disable_dropout", "temperature", "sync_ref_model", "generation_kwargs")},
    "num_generations": "groups the generation batch's rows for the leave-one-out baseline "
                       "(per_device_train_batch_size x steps_per_generation rows whatever it is)",
    "num_iterations": "generation every steps_per_generation x num_iterations steps",
    "beta": "beta > 0 (default 0.05): the reference model (a copy, or the adapter disabled) and its no-grad pass",
}
_SCALAR = "a scalar of the loss"
_FIELDS_AS_GRPO = ("trust_remote_code", "num_generations_eval", "ds3_gather_for_generation", "shuffle_dataset",
                   "chat_template_kwargs", "vllm_model_impl", "vllm_structured_outputs_regex",
                   "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
                   "vllm_group_port", "vllm_max_model_length", "vllm_tensor_parallel_size", "epsilon",
                   "epsilon_high", "reward_weights", "mask_truncated_completions", "ref_model_mixup_alpha",
                   "ref_model_sync_steps", "log_completions", "log_multimodal", "num_completions_to_print",
                   "log_unique_prompts")
# RLOOConfig fields that change no byte the kit counts, and why
NO_MEMORY = {**{k: grpo.NO_MEMORY[k] for k in _FIELDS_AS_GRPO},
             "normalize_advantages": "normalizes the [G] advantages", "reward_clip_range": "clamps the [G] rewards"}
# RLOOConfig fields refused when set: GRPOConfig's, where RLOOConfig has them
REFUSED = {k: grpo.REFUSED[k] for k in (
    "router_aux_loss_coef", "cache_implementation", "top_p", "top_k", "min_p", "repetition_penalty",
    "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged")}


def read_rloo_config(cfg, name: str = "RLOOConfig"):
    """(estimate options, sources, notes) of what an RLOOConfig changes; refuses in one sentence what is not
    modeled."""
    src = {"loss": ("sequence", "RLOOTrainer's loss: clipped ratios of [B] sequence log-probs (no bytes the kit "
                                "counts)")}
    return grpo.read_generating_config(cfg, name, refused=REFUSED, no_memory=NO_MEMORY, src=src)


def rollout(cfg, prompt_len: int, name: str = "RLOOConfig") -> dict:
    """GRPO's shapes of one generation, with RLOO's old-log-prob pass at every generation and its per-completion
    buffered log-probs."""
    shapes = grpo.rollout(cfg, prompt_len, name)
    shapes.update(old_pass=True, sequence_logps=True)
    return shapes


class RlooReader(grpo.GrpoReader):
    """RLOOTrainer and RLOOConfig (the module doc): GRPO's generation with RLOO's passes and rollouts."""

    trainer_name, config_name, config_keyword, article = "RLOOTrainer", "RLOOConfig", "rloo_config", "an"
    kind = "rloo"

    def read_own(self, cfg) -> tuple:
        return read_rloo_config(cfg, self.config_name)

    def rollout(self, cfg, prompt_len: int) -> dict:
        return rollout(cfg, prompt_len, self.config_name)

    def config_inputs(self, cfg) -> dict:
        return {"sft": False, "sft_config": None, "padding_free": False, "grpo_config": None, "rloo_config": cfg}


trainer_kinds.register_kind("rloo", trainer_kinds.library_classes("trl", "RLOOTrainer", "RLOOConfig"))
trainer_kinds.register_part("rloo", "estimate", RlooReader)
