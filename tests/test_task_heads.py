"""Classifier heads (sequence and token classification) on the decoder families the kit replays.

Real Trainer runs on CPU tiny twins, as transformers' task guides write them (``benchmarks/real_clients.py``'s
``classifier_trainer``), measured by that file's independent meter (PyTorch's profiler memory events) for step 1,
the steady step and ``trainer.evaluate()``, and set beside ``estimate_trainer``'s figures.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import real_clients as rc  # noqa: E402

from kit.estimate import estimate, estimate_trainer  # noqa: E402
from kit.inputs import InputError  # noqa: E402
from kit.models import build_model  # noqa: E402

BAND = (0.98, 1.02)


@pytest.mark.parametrize("task,lora,family,dropout", [
    ("seq-cls", False, "tiny-qwen2", 0), ("seq-cls", True, "tiny-qwen2", 0.1), ("token-cls", False, "tiny-llama", 0),
    ("seq-cls", False, "tiny-bert", 0), ("token-cls", False, "tiny-bert", 0), ("seq-cls", True, "tiny-bert", 0.0),
    ("seq-cls", True, "tiny-bert", 0.1),
    ("seq-cls", False, "tiny-roberta", 0), ("seq-cls", True, "tiny-roberta", 0.0)])
def test_classifier_steps_and_evaluate_within_2_percent(work, task, lora, family, dropout):
    """Step 1, the steady step and evaluate() (eval batch 8), against the profiler's meter; LoRA with peft's
    SEQ_CLS task type (the head's modules_to_save copy trains)."""
    gen = rc.client_classifier(work, task, lora, family, dropout)
    _, _, est, peaks = rc.run_trainer_client(gen, rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    for what, r in zip(("step 1", "steady", "evaluate"), rc.step_ratios(est, peaks)):
        assert BAND[0] <= r <= BAND[1], (what, r, est.peak_moment, est.eval_moment)
    assert est.setup["task"] == task and est.setup["num_labels"] == 3
    assert est.eval_moment == "forward (a block's MLP)"


def test_each_step_judged_at_its_own_length(work):
    """Batches of different lengths (DataCollatorWithPadding pads each to its longest row): each step's measured
    peak against the estimate at that step's length."""
    B, longest = 4, (48, 64, 56)
    lengths = [n - (8 if i == B - 1 else 0) for n in longest for i in range(B)]   # one padded row per batch
    trainer = rc.classifier_trainer(work, "seq-cls", lengths=lengths, rows=12, sequential=True)
    meter = rc.meter_trainer(trainer, rc.ProfilerMeter())
    trainer.train()
    for step, (n, got) in enumerate(zip(longest, meter.peaks)):
        est = estimate_trainer(trainer, seq_len=n, device="cpu")
        figure = est.first_step_peak_bytes if step == 0 else est.peak_bytes
        assert BAND[0] <= figure / got <= BAND[1], (step + 1, n, figure / got)


def test_kit_train_judges_each_step_at_its_own_length(work):
    """kit.train over batches of 48, 64 and 56 tokens (DataCollatorWithPadding): each step's exact CPU peak (read
    apart) beside estimate_trainer at that step's length, within 2%, and the report's note says so."""
    import kit

    B, longest = 4, (48, 64, 56)
    lengths = [n - (8 if i == B - 1 else 0) for n in longest for i in range(B)]
    trainer = rc.classifier_trainer(work, "seq-cls", lengths=lengths, rows=12, sequential=True)
    report = kit.train(trainer, plot=False, tensor_peak=True)
    assert [s.shape for s in report.steps] == [(B, n) for n in longest]
    for step in report.steps:
        ratio = step.estimate_bytes / step.peak_bytes
        assert BAND[0] <= ratio <= BAND[1], (step, ratio)
    assert any("each step judged at its own" in n for n in report.notes)


def test_watch_loop_judges_each_step_at_its_own_length(work):
    """kit.watch_loop over batches of 8 rows of 160, 240 and 96 tokens (the backward is each step's peak): each
    step's estimate is made at its own shape, and each measured peak (the profiler's meter) is within 2% of it; the
    report's note says the shapes varied."""
    import clients_own_head as own

    box, lengths = [], (160, 240, 96)
    _, _, est, peaks = own.client_own_head_loop(work, rc.ProfilerMeter, B=8, lengths=lengths, watch_box=box)
    steps = box[0].steps
    assert [s.shape for s in steps] == [(8, n) for n in lengths]
    for step, got in zip(steps, peaks):
        assert BAND[0] <= step.estimate_bytes / got <= BAND[1], (step.step, step.shape, step.estimate_bytes / got)
    assert steps[1].estimate_bytes > steps[2].estimate_bytes * 1.1    # the length matters at these shapes
    from dataclasses import replace

    from kit.watching.loop import own_lengths

    measured = [replace(step, peak_bytes=got) for step, got in zip(steps, peaks)]   # (the watch took no reading)
    assert own_lengths(measured)[0].startswith("batches varied in shape (8 x 96 to 8 x 240): each step judged")


def test_the_task_is_read_from_the_model_and_taken_by_name():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_model("tiny-qwen2", task="seq-cls", num_labels=5),
                           LoraConfig(task_type="SEQ_CLS", r=8))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    by_name = estimate("tiny-qwen2", batch_size=2, seq_len=32, task="seq-cls", num_labels=5, lora_r=8)
    assert by_name.trainable_params == trainable     # the adapters and score's modules_to_save copy
    assert by_name.params == sum(p.numel() for p in model.parameters())
    frozen = estimate("tiny-qwen2", batch_size=2, seq_len=32, task="seq-cls", num_labels=5, lora_r=8,
                      train_head=False)
    assert frozen.trainable_params == trainable - 5 * 128
    lm = estimate("tiny-qwen2", batch_size=2, seq_len=32)
    assert by_name.logits_bytes < lm.logits_bytes / 100     # no vocabulary logits


def test_estimate_trainer_reads_task_labels_and_the_trained_head(work):
    trainer = rc.classifier_trainer(work, "seq-cls", lora=True)
    est = estimate_trainer(trainer, device="cpu")
    assert est.sources["task"][0] == "seq-cls" and est.sources["num_labels"][0] == 3
    assert est.sources["train_head"][0] is True and "score" in est.sources["train_head"][1]


def test_a_classifier_refuses_the_fused_heads_in_one_sentence():
    with pytest.raises(InputError, match="fused_lm_head fuses a causal LM's vocabulary head"):
        estimate("tiny-qwen2", batch_size=1, seq_len=8, task="seq-cls", fused_lm_head=True)


def test_cli_takes_task_and_num_labels(capsys):
    import json

    from kit.cli import main

    main(["estimate", "--model", "tiny-llama", "--batch-size", "2", "--seq-len", "32", "--task", "token-cls",
          "--num-labels", "7", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["peak_bytes"] == estimate("tiny-llama", batch_size=2, seq_len=32, task="token-cls",
                                          num_labels=7).peak_bytes


def test_bert_by_name_and_its_refusals():
    """The shipped bert-base-uncased (BertForSequenceClassification, 2 labels: 109,483,778 parameters); an
    encoder is refused as a causal LM; LoRA dropout on an encoder is said to be approximate."""
    for name, params in (("bert-base-uncased", 109_483_778), ("roberta-base", 124_647_170)):
        est = estimate(name, batch_size=8, seq_len=128, task="seq-cls", num_labels=2)
        assert est.params == build_model(name, device="meta", task="seq-cls").num_parameters() == params
    with pytest.raises(ValueError, match="is an encoder.*task='seq-cls'"):
        estimate("tiny-bert", batch_size=1, seq_len=8)
    lora = estimate("tiny-bert", batch_size=1, seq_len=8, task="seq-cls", lora_r=8, lora_dropout=0.1)
    assert any(getattr(n, "code", None) == "encoder-lora-dropout" for n in lora.notes)


@pytest.mark.parametrize("family,pooling,hidden", [("tiny-llama", "mean", 0), ("tiny-qwen2", "last", 0),
                                                   ("tiny-bert", "cls", 0), ("tiny-llama", "mean", 32)])
def test_a_head_of_the_users_own_under_trainer_within_2_percent(work, family, pooling, hidden):
    """AutoModel + pooling + dropout + Linear layer(s) + CrossEntropyLoss (benchmarks/clients_own_head.py), under
    Trainer: step 1, the steady step and evaluate() (a decoder base keeps its config's use_cache: Trainer turns it
    off only on a model with a config) against the profiler's meter."""
    import clients_own_head as own

    _, _, est, peaks = rc.run_trainer_client(own.client_own_head(work, family, pooling, hidden), rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    for what, r in zip(("step 1", "steady", "evaluate"), rc.step_ratios(est, peaks)):
        assert BAND[0] <= r <= BAND[1], (what, r, est.peak_moment)
    assert est.setup["task"] == "seq-cls" and est.setup["num_labels"] == 3
    assert any(getattr(n, "code", None) == "own-head" for n in est.notes)


def test_a_head_of_the_users_own_under_watch_loop_within_2_percent(work):
    import clients_own_head as own

    _, _, est, peaks = own.client_own_head_loop(work, rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    assert BAND[0] <= est.first_step_peak_bytes / peaks[0] <= BAND[1]
    assert BAND[0] <= est.peak_bytes / max(peaks[1:]) <= BAND[1]


def test_a_head_of_the_users_own_that_cannot_be_read_is_refused_naming_it():
    """A head whose logits are not pooled (one per token), or whose forward reads what the stand-in hidden state
    lacks (the pooler's output), is refused in one sentence naming the module."""
    import torch.nn as nn
    from transformers import AutoModel

    from kit.models import get_config

    class PerToken(nn.Module):
        def __init__(self, name="tiny-llama", pooler=False):
            super().__init__()
            self.encoder = AutoModel.from_config(get_config(name))
            self.head = nn.Linear(self.encoder.config.hidden_size, 3)
            self.pooler = pooler

        def forward(self, input_ids, attention_mask=None, labels=None):
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
            return {"logits": self.head(out.pooler_output if self.pooler else out.last_hidden_state)}

    with pytest.raises(ValueError, match=r"^PerToken's head on its LlamaModel \(encoder\) gives logits of shape "
                                         r"\(2, 8, 3\)[^\n]*\.$"):
        estimate(PerToken(), batch_size=1, seq_len=8)
    with pytest.raises(ValueError, match=r"^PerToken's head on its BertModel \(encoder\) cannot be read: its forward "
                                         r"failed[^\n]*\.$"):
        estimate(PerToken("tiny-bert", pooler=True), batch_size=1, seq_len=8)


def test_a_head_of_the_users_own_by_estimate_and_compute_loss():
    """estimate() of the module itself; a forward without a loss (Trainer's compute_loss) is read with a note."""
    import torch.nn as nn
    from transformers import AutoModel

    from kit.models import get_config

    class NoLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = AutoModel.from_config(get_config("tiny-llama"))
            self.head = nn.Linear(128, 5)

        def forward(self, input_ids, attention_mask=None):
            return self.head(self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0])

    model = NoLoss()
    est = estimate(model, batch_size=2, seq_len=32, device="cpu")
    assert est.trainable_params == sum(p.numel() for p in model.parameters())
    from kit.estimate.read_model import read_model

    _, opts, _, notes = read_model(model)
    assert opts["task"] == "seq-cls" and opts["num_labels"] == 5
    assert any(getattr(n, "code", None) == "own-head-loss" for n in notes)


def test_kit_check_reads_a_head_of_the_users_own(work, capsys):
    import clients_own_head as own

    import kit

    kit.check(own.own_head_trainer(work, "tiny-qwen2", "last"), device=16 * 2**30)
    out = capsys.readouterr().out
    assert out.strip() and "holds no transformers" not in out and "cannot be read" not in out


def test_estimate_from_reads_a_head_of_the_users_own(work):
    """estimate_from(module, TrainingArguments) of an own-head module gives what estimate_trainer gives for the same
    setup (equal-length rows: unpadded)."""
    import clients_own_head as own
    from transformers import TrainingArguments

    from kit.estimate import estimate_from

    trainer = own.own_head_trainer(work)
    by_trainer = estimate_trainer(trainer, device="cpu")
    by_objects = estimate_from(trainer.model, trainer.args, seq_len=64, padded=False, device="cpu")
    assert isinstance(trainer.args, TrainingArguments)
    assert (by_objects.first_step_peak_bytes, by_objects.peak_bytes, by_objects.eval_peak_bytes) == \
        (by_trainer.first_step_peak_bytes, by_trainer.peak_bytes, by_trainer.eval_peak_bytes)
    assert by_objects.setup["task"] == "seq-cls" and by_objects.setup["num_labels"] == 3


def test_reading_a_head_of_the_users_own_leaves_nothing_behind():
    """The probe that reads a head keeps no graph: once the user lets the model go, it and every tensor the probe
    made are freed (a graph that keeps its own saved outputs is a cycle through C++ that gc cannot break)."""
    import gc
    import weakref

    import torch
    import torch.nn as nn
    from transformers import AutoModel

    from kit.estimate.own_head import read_own_head
    from kit.models import get_config

    class MeanHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = AutoModel.from_config(get_config("tiny-llama"))
            self.head = nn.Linear(self.encoder.config.hidden_size, 3)

        def forward(self, input_ids, attention_mask=None, labels=None):
            logits = self.head(self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                               .mean(1))
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    model = MeanHead()
    assert read_own_head(model).per_row > 0
    gone = weakref.ref(model)
    hidden_size = model.encoder.config.hidden_size
    del model
    gc.collect()
    assert gone() is None
    probes = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.dim() == 3
              and o.shape[-1] == hidden_size and not o.any()]   # the stand-in hidden states: zeros (rows, tokens, H)
    assert probes == []
