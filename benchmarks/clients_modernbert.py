"""ModernBERT's rows for ``real_clients.py``: transformers' text-classification task guide on a CPU twin of
``answerdotai/ModernBERT-base`` (``kit/configs/tiny-modernbert.json``: global and local layers, the local window
acting at 64 tokens), through ``real_clients.classifier_trainer`` (``AutoModelForSequenceClassification`` +
``DataCollatorWithPadding`` + ``Trainer`` with an eval set), measured by that file's meter.

The twin is saved as the Hub's checkpoint is, a ``ModernBertForMaskedLM`` (ModernBERT has no causal LM class, which
``real_clients.twin_dir`` builds), so that ``from_pretrained`` puts a new classifier head on it as it does on the
real one.
"""
from __future__ import annotations

import os

import torch

TWIN = "tiny-modernbert"


def masked_lm_twin(folder: str, name: str = TWIN) -> str:
    """The twin ``kit/configs/<name>.json`` saved as a ``ModernBertForMaskedLM``, where ``twin_dir`` looks for it."""
    from transformers import AutoModelForMaskedLM

    from kit.models import get_config

    path = os.path.join(folder, name)
    if not os.path.isdir(path):
        torch.manual_seed(0)
        AutoModelForMaskedLM.from_config(get_config(name)).save_pretrained(path)
    return path


def client_modernbert(work, task="seq-cls", lora=False, lora_dropout=0.0):
    """``real_clients.client_classifier`` on the ModernBERT twin (full fine-tuning, or peft's SEQ_CLS LoRA)."""
    import real_clients as rc

    masked_lm_twin(work)
    yield from rc.client_classifier(work, task, lora, TWIN, lora_dropout)
