"""Distillation rows of ``benchmarks/real_clients.py``: TRL's DistillationTrainer (on-policy knowledge distillation,
TRL 1.16) on tiny Qwen2 twins: a student and a wider teacher of the same vocabulary.

As TRL's documentation writes it (``DistillationTrainer(model=..., teacher_model=..., train_dataset=...)``),
offline: both twins saved with ``save_pretrained`` and given by their paths, prompts of one length in tokens, every
completion exactly ``max_completion_length`` tokens (``generation_kwargs={"min_new_tokens": ...}``), ``use_vllm=False``,
fp32 weights on the CPU, ``bf16=False`` but in the ``bf16`` rows (DistillationConfig's default). DistillationTrainer
generates and buffers its completions in the methods GRPOTrainer does, so each step and its generation phase are
metered as :func:`clients_grpo.run_grpo_client` meters GRPO's; the teacher's weights are held at every step as a DPO
reference's are.
"""
from __future__ import annotations

import os

import torch

from clients_grpo import _prompts, mark_generation

TEACHER = dict(hidden_size=256, intermediate_size=704)   # a wider tiny-qwen2: the same vocabulary, twice the width
KINDS = {"full": "full FT student, beta=1.0 (DistillationConfig's default: reverse KL)",
         "jsd": "full FT student, beta=0.5 (generalized JSD: a second pass over the vocabulary)",
         "lora": "LoRA r8 q,v student, beta=1.0",
         "accum2": "full FT student, beta=1.0, gradient_accumulation_steps=2 (one generation of 8 rows for two "
                   "micro-batches)",
         "bf16": "full FT student, beta=1.0, bf16=True (DistillationConfig's default: the loss outside autocast, "
                 "generate() under it)",
         "bf16-lora": "LoRA r8 q,v student, beta=1.0, bf16=True"}


def client_distillation(work, kind: str, prompt_len: int = 12, completion_len: int = 16, batch: int = 4):
    """TRL's DistillationTrainer, a tiny-qwen2 student and a wider tiny-qwen2 teacher; ``kind``: one of
    :data:`KINDS`."""
    from peft import LoraConfig
    from real_clients import tokenizer, twin_dir
    from trl import DistillationConfig, DistillationTrainer

    from kit.estimate import estimate_trainer

    tok = tokenizer()
    student, teacher = twin_dir("tiny-qwen2", work), twin_dir("tiny-qwen2", work, **TEACHER)
    extra = {"beta": 0.5} if kind == "jsd" else {}
    bf16 = kind.startswith("bf16")
    if kind == "accum2":
        extra["gradient_accumulation_steps"] = 2
    args = DistillationConfig(output_dir=os.path.join(work, "distillation"), use_cpu=True, bf16=bf16,
                              report_to="none", max_steps=3, save_strategy="no", logging_strategy="no",
                              disable_tqdm=True, per_device_train_batch_size=batch,
                              max_completion_length=completion_len,
                              generation_kwargs={"min_new_tokens": completion_len}, **extra)
    peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if kind in ("lora", "bf16-lora") else None
    torch.manual_seed(0)
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=args, processing_class=tok,
                                  train_dataset=_prompts(tok, prompt_len, 32), peft_config=peft_config)
    mark_generation(trainer)
    setup = (f"{KINDS[kind]}, teacher tiny-qwen2 x2 wide, ckpt (DistillationConfig default), fp32 weights, "
             f"B{batch}, "
             f"prompt {prompt_len} + completion {completion_len} tokens")
    yield "DistillationTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
