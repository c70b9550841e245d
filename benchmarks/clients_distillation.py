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
         "bf16-lora": "LoRA r8 q,v student, beta=1.0, bf16=True",
         "padded": "full FT student, beta=1.0, prompts of 8 and 12 tokens in turn (left-padded), no min_new_tokens "
                   "(the completions end where they sample the end token)"}


def _mixed_prompts(tok, lengths=(8, 12), n_rows: int = 32):
    """Prompts of each length in turn, so that every batch of several rows is left-padded to the longest."""
    from datasets import Dataset
    from kit.data import equal_token_rows

    columns = [equal_token_rows(tok, n, n_rows // len(lengths)) for n in lengths]
    return Dataset.from_dict({"prompt": [row for rows in zip(*columns) for row in rows]})


def _options(kind: str, completion_len: int) -> dict:
    """The DistillationConfig fields ``kind`` sets beyond the rows' shared ones."""
    extra = {"beta": 0.5} if kind == "jsd" else {}
    if kind == "accum2":
        extra["gradient_accumulation_steps"] = 2
    if kind == "padded":   # each batch holds both prompt lengths, in the dataset's order
        extra["shuffle_dataset"] = False
    else:
        extra["generation_kwargs"] = {"min_new_tokens": completion_len}
    return dict(extra, bf16=kind.startswith("bf16"))


def client_distillation(work, kind: str, prompt_len: int = 12, completion_len: int = 16, batch: int = 4):
    """TRL's DistillationTrainer, a tiny-qwen2 student and a wider tiny-qwen2 teacher; ``kind``: one of
    :data:`KINDS`."""
    from peft import LoraConfig
    from real_clients import tokenizer, twin_dir
    from trl import DistillationConfig, DistillationTrainer

    from kit.estimate import estimate_trainer

    tok = tokenizer()
    student, teacher = twin_dir("tiny-qwen2", work), twin_dir("tiny-qwen2", work, **TEACHER)
    args = DistillationConfig(output_dir=os.path.join(work, "distillation"), use_cpu=True, report_to="none",
                              max_steps=3, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                              per_device_train_batch_size=batch, max_completion_length=completion_len,
                              **_options(kind, completion_len))
    peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if kind in ("lora", "bf16-lora") else None
    rows = _mixed_prompts(tok) if kind == "padded" else _prompts(tok, prompt_len, 32)
    torch.manual_seed(0)
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=args, processing_class=tok,
                                  train_dataset=rows, peft_config=peft_config)
    mark_generation(trainer)
    prompt = "8 or 12" if kind == "padded" else prompt_len
    setup = (f"{KINDS[kind]}, teacher tiny-qwen2 x2 wide, ckpt (DistillationConfig default), fp32 weights, "
             f"B{batch}, prompt {prompt} + completion {completion_len} tokens")
    yield "DistillationTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
