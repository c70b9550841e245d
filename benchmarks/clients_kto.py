"""KTO rows of ``benchmarks/real_clients.py``: TRL's KTOTrainer, as its documentation's quick start writes it, on a
tiny Llama twin.

TRL's quick start (``KTOTrainer(model=..., train_dataset=...)``), offline: the twin saved with ``save_pretrained``
and given by its path (so that, without a ``peft_config``, TRL builds the reference copy itself, by
``create_model_from_path``), unpaired rows (a 20-token prompt, a completion of 30 or 20 tokens by turns, its label
True or False by turns; one token per word with the shipped tokenizer), ``bf16=False`` on the CPU. KTOTrainer
rotates the completions by one inside each batch for its KL rows, so with ``per_device_train_batch_size=2`` every
batch is a row of 51 tokens (with EOS) and one of 41, padded to 51, and its KL rows are the same two lengths: every
step has the batch shape the estimate reads. An eval set of the same rows is metered by ``trainer.evaluate()``.
"""
from __future__ import annotations

import os

import torch

KINDS = {"full": "full FT, reference = a copy TRL loads from the path",
         "lora": "LoRA r8 q,v (peft_config), reference = the adapter disabled",
         "skew": "full FT, prompts of 40 and 5 tokens with completions of 5 and 40 by turns: KL rows of 81 tokens "
                 "beside rows of 46 (in fp32 the reference's no-grad pass on them is the step's peak)",
         "skew-lora": "LoRA r8 q,v, reference = the adapter disabled, the rows of skew (prompts 40 and 5, completions "
                      "5 and 40: KL rows of 81 tokens beside rows of 46)",
         "precompute": "full FT, precompute_ref_log_probs=True (the policy's log-probs in __init__: no reference in "
                       "training)"}


def unpaired_rows(n=16, prompts=(20, 20), completions=(30, 20)):
    """Unpaired preference rows: prompts and completions of the given lengths by turns (tokens), labels True then
    False by turns."""
    from datasets import Dataset

    def words(k):
        return " the" * k

    return Dataset.from_dict({"prompt": ["the" + words(prompts[i % 2] - 1) for i in range(n)],
                              "completion": [words(completions[i % 2]) for i in range(n)],
                              "label": [i % 2 == 0 for i in range(n)]})


def client_kto(work, kind: str, batch: int = 2, ckpt: bool | None = None, bf16: bool = False, model=None):
    """TRL's quick-start KTOTrainer; ``kind``: one of :data:`KINDS`. ``ckpt``: gradient checkpointing (KTOConfig's
    default, on, where None); ``bf16``: KTOConfig's default, bf16 autocast (fp32 where False); ``model``: the policy
    (the twin's path where None)."""
    from peft import LoraConfig
    from real_clients import tokenizer, twin_dir
    from trl import KTOConfig, KTOTrainer

    from kit.estimate import estimate_trainer

    extra = {} if ckpt is None else {"gradient_checkpointing": ckpt}
    if kind == "precompute":
        extra["precompute_ref_log_probs"] = True
    args = KTOConfig(output_dir=os.path.join(work, "kto"), use_cpu=True, bf16=bf16, report_to="none", max_steps=3,
                     per_device_train_batch_size=batch, per_device_eval_batch_size=batch, save_strategy="no",
                     logging_strategy="no", disable_tqdm=True, **extra)
    peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if kind.endswith("lora") else None
    torch.manual_seed(0)
    lengths = dict(prompts=(40, 5), completions=(5, 40)) if kind.startswith("skew") else {}
    trainer = KTOTrainer(model=model or twin_dir("tiny-llama", work), args=args, train_dataset=unpaired_rows(**lengths),
                         eval_dataset=unpaired_rows(4, **lengths), processing_class=tokenizer(),
                         peft_config=peft_config)
    on = args.gradient_checkpointing
    shape = "" if kind.startswith("skew") else " x 51 (prompt 20, completions 30 / 20 by turns, KL rows likewise)"
    precision = "bf16 autocast (KTOConfig default)" if bf16 else "fp32"
    setup = f"{KINDS[kind]}, {'ckpt (KTOConfig default)' if on else 'no ckpt'}, {precision}, B{batch}{shape}"
    yield "KTOTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
