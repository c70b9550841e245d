"""kit.check answers a setup the kit cannot estimate in three lines (what was found, why it cannot be predicted, the
way forward) and returns without raising; the estimate API raises the kit's one documented type, kit.inputs.Refusal;
anything else (a bug) still raises from kit.check."""
import os

import pytest
import torch.nn as nn
from datasets import Dataset
from transformers import AutoModel, AutoModelForCausalLM, Trainer, TrainingArguments

import kit
from kit.estimate import estimate_trainer
from kit.inputs import Refusal
from kit.models import get_config


def _args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, use_cpu=True,
                             report_to="none", max_steps=1)


def _rows():
    return Dataset.from_list([{"input_ids": [1, 2, 3, 4], "attention_mask": [1] * 4, "labels": [1, 2, 3, 4]}] * 8)


class LSTMLanguageModel(nn.Module):
    """An LSTM language model, as PyTorch's word_language_model example writes one, with Trainer's loss."""

    def __init__(self, vocab=100, width=32):
        super().__init__()
        self.embed, self.lstm, self.out = nn.Embedding(vocab, width), nn.LSTM(width, width, batch_first=True), \
            nn.Linear(width, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.out(self.lstm(self.embed(input_ids))[0])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()) if labels is not None else None
        return {"loss": loss, "logits": logits}


class TokenLogitsHead(nn.Module):
    """A head of one's own the kit cannot read: it gives (rows, tokens, labels) logits, not a pooled (rows, labels)."""

    def __init__(self):
        super().__init__()
        self.encoder = AutoModel.from_config(get_config("tiny-llama"))
        self.head = nn.Linear(self.encoder.config.hidden_size, 3)

    def forward(self, input_ids, attention_mask=None, labels=None):
        return {"logits": self.head(self.encoder(input_ids=input_ids).last_hidden_state)}


def _orpo_trainer(tmp_path):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    orpo = pytest.importorskip("trl.experimental.orpo")
    from kit.data import shipped_tokenizer

    tok = shipped_tokenizer()
    ds = Dataset.from_list([{"prompt": "the cat", "chosen": " sat", "rejected": " ran"}] * 4)
    args = orpo.ORPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, use_cpu=True,
                           report_to="none", max_steps=1)
    return orpo.ORPOTrainer(model=AutoModelForCausalLM.from_config(get_config("tiny-gpt2")), args=args,
                            train_dataset=ds, processing_class=tok)


def _assert_three_parts(trainer, capsys, found, why, instead):
    with pytest.raises(Refusal):   # the API raises its one documented type
        estimate_trainer(trainer)
    assert kit.check(trainer) is None   # kit.check answers, raising nothing
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("cannot estimate: found ") and found in lines[0], lines
    assert lines[1].startswith("why: ") and why in lines[1], lines
    assert lines[2].startswith("way forward: kit.watch(trainer)") and instead in lines[2], lines


def test_a_trainer_the_kit_does_not_model_is_answered_in_three_lines(tmp_path, capsys):
    trainer = _orpo_trainer(tmp_path)
    capsys.readouterr()
    _assert_three_parts(trainer, capsys, "ORPOTrainer (trl.experimental.orpo", "not ORPOTrainer, whose own forward",
                        "an SFTTrainer, a DPOTrainer, a GRPOTrainer, a KTOTrainer, a RewardTrainer, an RLOOTrainer "
                        "or a DistillationTrainer are estimated")


def test_a_model_the_kit_does_not_model_is_answered_in_three_lines(tmp_path, capsys):
    trainer = Trainer(model=LSTMLanguageModel(), args=_args(tmp_path), train_dataset=_rows())
    _assert_three_parts(trainer, capsys, "Trainer (transformers.trainer) training LSTMLanguageModel of 14,948 "
                        "parameters", "holds no transformers causal LM or classifier", "AutoModelForCausalLM")


def test_a_head_the_kit_cannot_read_is_answered_in_three_lines(tmp_path, capsys):
    trainer = Trainer(model=TokenLogitsHead(), args=_args(tmp_path), train_dataset=_rows())
    _assert_three_parts(trainer, capsys, "training TokenLogitsHead", "gives logits of shape (2, 8, 3)",
                        "pools to (rows, labels) logits is estimated")


def test_a_bug_in_the_kit_still_raises_from_check(tmp_path, monkeypatch):
    import importlib

    check_module = importlib.import_module("kit.advise.check")

    def broken(*args, **kwargs):
        raise AttributeError("a bug")

    monkeypatch.setattr(check_module, "estimate_trainer", broken)
    with pytest.raises(AttributeError, match="a bug"):
        kit.check(Trainer(model=LSTMLanguageModel(), args=_args(tmp_path), train_dataset=_rows()))


def test_an_own_head_on_bert_with_cls_pooling_counts_what_trains_without_a_false_alarm(tmp_path, capsys):
    """BERT's pooler requires grad, and a head that reads the last hidden state sends it no gradient: the
    estimate keeps no gradient or state for it, says so, and never asks to check what is frozen."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import clients_own_head as own

    trainer = own.own_head_trainer(str(tmp_path), "tiny-bert", "cls")
    requires_grad = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    pooler = sum(p.numel() for p in trainer.model.encoder.pooler.parameters())
    est = estimate_trainer(trainer, device="cpu")
    assert est.sources["trainable_params"][0] == requires_grad
    assert est.trainable_params + pooler == requires_grad and est.sources["idle_params"][0] == pooler
    assert not any("check what is frozen" in n for n in est.notes)
    assert any(getattr(n, "code", None) == "idle-pooler" for n in est.notes)
    capsys.readouterr()
    kit.check(trainer, device="cpu")
    out = capsys.readouterr().out
    assert f"{pooler:,} more get no gradient" in out and "check what is frozen" not in out
