"""Real clients for the encoder families DistilBERT and DeBERTa-v3 (``benchmarks/real_clients.py``'s rows).

transformers' text-classification task guide on a CPU tiny twin (``kit/configs/tiny-distilbert.json``,
``tiny-deberta-v3.json``): ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)`` +
``DataCollatorWithPadding`` + ``Trainer`` with an eval set, full fine-tuning (and peft's
``LoraConfig(task_type="SEQ_CLS")``), built by ``real_clients.classifier_trainer``; ``estimate_trainer`` against the
profiler's meter for step 1, the steady step and ``trainer.evaluate()``.

Neither family has a causal-LM class in transformers, so the twin is saved here as its sequence classifier
(``real_clients.twin_dir`` builds causal LMs) in the folder ``classifier_trainer`` loads from.
"""
from __future__ import annotations

import os

import torch

import real_clients as rc

FAMILIES = ("tiny-distilbert", "tiny-deberta-v3")


def save_twin(name: str, work: str) -> str:
    """``kit/configs/<name>.json`` built as a 3-label sequence classifier (random weights, seed 0) and saved with
    save_pretrained where ``real_clients.twin_dir`` looks for it."""
    from kit.models import build_model

    path = os.path.join(work, name)
    if not os.path.isdir(path):
        torch.manual_seed(0)
        build_model(name, task="seq-cls", num_labels=3).save_pretrained(path)
    return path


def client_encoder(work, family, lora=False, checkpointing=False):
    """One row: the task guide's sequence classifier on ``family``'s twin (B4 x 64, eval B8 x 16 rows);
    ``checkpointing``: ``model.gradient_checkpointing_enable()`` on the built model, as transformers' docs write it."""
    save_twin(family, work)
    gen = rc.client_classifier(work, "seq-cls", lora, family, 0.0)
    label, setup, trainer, make_estimate = next(gen)
    if checkpointing:
        trainer.model.gradient_checkpointing_enable()
        setup += ", model.gradient_checkpointing_enable()"
    yield label, setup, trainer, make_estimate
    gen.close()


def rows(work):
    """(row name, thunk) for real_clients.rows_to_run: full fine-tuning on each family; on DeBERTa-v3 also LoRA (peft
    has default targets for it, query_proj and value_proj; none for DistilBERT) and gradient checkpointing."""
    out = []
    for family, lora, ckpt in ((FAMILIES[0], False, False), (FAMILIES[1], False, False), (FAMILIES[1], True, False),
                               (FAMILIES[1], False, True), (FAMILIES[1], True, True)):
        name = f"encoder seq-cls {'LoRA' if lora else 'full'} {family}" + (" checkpointing" if ckpt else "")
        out.append((name, lambda m, f=family, lo=lora, c=ckpt: rc.run_trainer_client(
            client_encoder(work, f, lo, c), m)))
    return out
