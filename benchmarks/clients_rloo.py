"""RLOO rows of ``benchmarks/real_clients.py``: TRL's RLOOTrainer, as its documentation's quick start writes it, on a
tiny Qwen2 twin.

TRL's quick start (``RLOOTrainer(model=..., reward_funcs=reward_num_unique_chars, train_dataset=...)``), offline,
as :mod:`clients_grpo` runs GRPOTrainer: the twin saved with ``save_pretrained`` and given by its path (so that the
default ``beta=0.05`` builds the reference the way TRL does), prompts of one length in tokens, every completion
exactly ``max_completion_length`` tokens (``generation_kwargs={"min_new_tokens": ...}``), ``use_vllm=False``, fp32
on the CPU (``bf16=False``). Each step and its generation phase are metered as :func:`clients_grpo.run_grpo_client`
meters GRPOTrainer's (RLOOTrainer buffers its rollouts and generates in the same methods).
"""
from __future__ import annotations

import os

import torch

from clients_grpo import _prompts, mark_generation, reward_num_unique_chars

KINDS = {"beta": "full FT, beta=0.05 (RLOOConfig's default: a reference copy)",
         "beta0": "full FT, beta=0 (no reference)",
         "lora": "LoRA r8 q,v, beta=0.05 (reference: the adapter disabled)",
         "spg2": "full FT, beta=0.05, steps_per_generation=2 (one generation of 8 rows for two steps)",
         "b8": "full FT, beta=0.05, RLOOConfig's default batch of 8 (the old-log-prob pass is the generation's peak)"}


def client_rloo(work, kind: str, prompt_len: int = 12, completion_len: int = 16, batch: int = 4,
                generations: int = 4):
    """TRL's quick-start RLOOTrainer; ``kind``: one of :data:`KINDS`."""
    from peft import LoraConfig
    from real_clients import tokenizer, twin_dir
    from trl import RLOOConfig, RLOOTrainer

    from kit.estimate import estimate_trainer

    tok = tokenizer()
    path = twin_dir("tiny-qwen2", work)
    extra = {"beta": 0.0} if kind == "beta0" else {}
    if kind == "spg2":
        extra["steps_per_generation"] = 2
    if kind == "b8":
        batch = 8
    args = RLOOConfig(output_dir=os.path.join(work, "rloo"), use_cpu=True, bf16=False, report_to="none",
                      max_steps=3, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                      per_device_train_batch_size=batch, num_generations=generations,
                      max_completion_length=completion_len,
                      generation_kwargs={"min_new_tokens": completion_len}, **extra)
    peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None
    torch.manual_seed(0)
    trainer = RLOOTrainer(model=path, reward_funcs=reward_num_unique_chars, args=args, processing_class=tok,
                          train_dataset=_prompts(tok, prompt_len, 32), peft_config=peft_config)
    mark_generation(trainer)
    setup = (f"{KINDS[kind]}, ckpt (RLOOConfig default), fp32, B{batch}, num_generations {generations}, prompt "
             f"{prompt_len} + completion {completion_len} tokens")
    yield "RLOOTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
