"""The evaluation loop's peak (kit.estimate.evaluation) against Trainer.evaluate() measured during training.

Real Trainer runs on tiny twins, on the CPU: two training steps with an evaluation after each; the
last evaluation is measured with TensorPeak (the exact peak of live tensor bytes, with the weights
and the optimizer state alive), and set beside ``estimate(...).eval_peak_bytes`` of the same setup.
"""
import os
import sys

import pytest
import torch

from kit.estimate import estimate
from kit.inputs import InputError
from kit.measure.tensor_peak import TensorPeak
from kit.models import build_model, get_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))


def measured_eval_peak(cfg, *, train_batch, eval_batch, S, samples, gather, accumulation, precision, tmp_path):
    from estimate_vs_measured import _Batches
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=train_batch, per_device_eval_batch_size=eval_batch,
        eval_accumulation_steps=accumulation, eval_strategy="steps", eval_steps=1, max_steps=2, use_cpu=True,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, bf16=precision == "bf16")
    trainer = Trainer(model=build_model(cfg), args=args, train_dataset=_Batches(8, S, cfg.vocab_size, True),
                      eval_dataset=_Batches(samples, S, cfg.vocab_size, True, seed=1),
                      compute_metrics=None if gather == "loss" else (lambda p: {"n": float(len(p.predictions))}),
                      preprocess_logits_for_metrics=(lambda logits, labels: logits.argmax(-1))
                      if gather == "preprocessed" else None)
    peaks, evaluate = [], trainer.evaluate

    def measured(*a, **kw):
        with TensorPeak() as p:
            out = evaluate(*a, **kw)
        peaks.append(p.peak_bytes)
        return out

    trainer.evaluate = measured
    trainer.train()
    assert len(peaks) == 2
    return peaks[-1]


@pytest.mark.parametrize("name,eval_batch,samples,gather,accumulation,precision,moment", [
    ("tiny-llama", 4, 16, "loss", None, "fp32", "forward (at the loss)"),
    ("tiny-llama", 4, 16, "loss", None, "bf16", "forward (at the loss)"),     # + autocast's cached copies
    ("tiny-llama", 4, 16, "logits", None, "fp32", "gathering predictions (torch.cat)"),
    ("tiny-llama", 4, 16, "logits", None, "bf16", "gathering predictions (torch.cat)"),  # gathered in fp32
    ("tiny-llama", 4, 16, "logits", 2, "fp32", "gathering predictions (torch.cat)"),
    ("tiny-llama", 4, 16, "preprocessed", None, "fp32", "forward (at the loss)"),
    ("tiny-gpt2", 8, 24, "logits", None, "fp32", "gathering predictions (torch.cat)"),
])
def test_eval_peak_matches_a_measured_evaluation(name, eval_batch, samples, gather, accumulation, precision,
                                                 moment, tmp_path):
    cfg = get_config(name)
    got = measured_eval_peak(cfg, train_batch=2, eval_batch=eval_batch, S=64, samples=samples, gather=gather,
                             accumulation=accumulation, precision=precision, tmp_path=tmp_path)
    est = estimate(name, batch_size=2, seq_len=64, precision=precision, eval_batch_size=eval_batch,
                   eval_gather=gather, eval_samples=samples, eval_accumulation_steps=accumulation, device="cpu")
    assert est.eval_moment == moment
    assert est.eval_peak_bytes / got == pytest.approx(1, abs=0.01)


@pytest.mark.parametrize("name,exact", [("tiny-llama", True), ("tiny-gpt2", False)])
def test_the_blocks_peak_is_exact_for_llama_and_a_said_bound_elsewhere(name, exact, tmp_path):
    """A small vocabulary: the blocks, not the logits, set the evaluation peak. Llama's loop is known
    (kit.estimate.evaluation.block_forward_bytes: the MLP's three (B, S, F) tensors beside four hidden states);
    elsewhere one block's saved bytes bound it, and a note says so."""
    cfg = get_config(name)
    cfg.vocab_size = 256
    got = measured_eval_peak(cfg, train_batch=2, eval_batch=4, S=64, samples=8, gather="loss", accumulation=None,
                             precision="fp32", tmp_path=tmp_path)
    est = estimate(cfg, batch_size=2, seq_len=64, eval_batch_size=4, device="cpu")
    assert est.eval_moment == ("forward (a block's MLP)" if exact else "forward (a block)")
    if exact:
        assert est.eval_peak_bytes / got == pytest.approx(1, abs=0.02)
    else:
        assert 1 <= est.eval_peak_bytes / got < 1.25
    assert any("upper bound" in n for n in est.notes) is not exact


def test_gathering_grows_with_the_eval_set_and_accumulation_caps_it():
    kw = dict(batch_size=1, seq_len=512, precision="bf16", quantization="4bit", lora_r=8)
    loss = estimate("meta-llama/Llama-3.2-1B", **kw).eval_peak_bytes
    small, big = (estimate("meta-llama/Llama-3.2-1B", **kw, eval_gather="logits", eval_samples=n).eval_peak_bytes
                  for n in (64, 128))
    capped = estimate("meta-llama/Llama-3.2-1B", **kw, eval_gather="logits", eval_samples=128,
                      eval_accumulation_steps=2).eval_peak_bytes
    row = 512 * 128256 * 4 + 512 * 8   # one row's fp32 logits and its labels
    assert big - small == 2 * 64 * row           # torch.cat holds the old rows, the new and the result
    assert loss < capped < small and estimate("meta-llama/Llama-3.2-1B", **kw).to_json()["eval_peak_bytes"] == loss


@pytest.mark.parametrize("kw,match", [
    (dict(eval_gather="logits"), "eval_samples"),
    (dict(eval_gather="everything"), "eval_gather"),
    (dict(eval_batch_size=0), "eval_batch_size"),
])
def test_eval_options_are_checked(kw, match):
    with pytest.raises(InputError, match=match):
        estimate("tiny-llama", batch_size=2, seq_len=32, **kw)


# -- kit.train on a TRL SFTTrainer that evaluates: the training and evaluation peaks apart -------------------------
def _sft_trainer(tmp_path, **kw):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from kit import data

    def rows(n):   # rows of 40 and 24 tokens: padded to 40 in a batch of 4
        return Dataset.from_dict({"input_ids": [[5 + (i * 7 + j) % 4000 for j in range(40 if i % 2 else 24)]
                                                for i in range(n)]})

    torch.manual_seed(0)
    args = trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=3,
                         per_device_train_batch_size=4, per_device_eval_batch_size=4, save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, eval_strategy="steps", eval_steps=1,
                         gradient_checkpointing=False, **kw)
    return trl.SFTTrainer(model=build_model("tiny-llama"), args=args, train_dataset=rows(32), eval_dataset=rows(8),
                          processing_class=data.shipped_tokenizer())


def test_kit_train_sets_an_sft_trainers_evaluation_beside_its_estimate(tmp_path):
    # TRL 1.16 computes the eval loss through its fused LM head too (prediction_loss_only: no logits are built)
    import kit

    r = kit.train(_sft_trainer(tmp_path), tensor_peak=True, plot=False)
    assert not r.oom and r.step == 3 and r.eval_ran and r.eval_estimate_note is None
    print(f"SFT: training {r.ratio:.4f}, step 1 {r.first_step_ratio:.4f}, evaluation {r.eval_ratio:.4f}")
    assert 0.98 <= r.ratio <= 1.02 and 0.98 <= r.first_step_ratio <= 1.02     # measured 1.00
    assert 0.98 <= r.eval_ratio <= 1.02                                        # measured 1.000


def test_a_packed_sft_evaluation_is_one_flattened_row_beside_its_estimate(tmp_path):
    # eval rows are flattened like the training rows (4 x 64 tokens into one row): the same row, modeled
    import kit

    r = kit.train(_sft_trainer(tmp_path, packing=True, max_length=64), tensor_peak=True, plot=False)
    assert not r.oom and r.eval_ran and r.eval_estimate_note is None
    print(f"packed SFT: training {r.ratio:.4f}, evaluation {r.eval_ratio:.4f}")
    assert 0.98 <= r.ratio <= 1.02 and 0.98 <= r.eval_ratio <= 1.02


def test_a_packed_evaluation_of_other_rows_is_said_not_modeled_never_given_a_ratio(tmp_path):
    import kit

    trainer = _sft_trainer(tmp_path, packing=True, max_length=64)
    trainer.args.per_device_eval_batch_size = 2   # a flattened eval row of 2 rows' tokens, training's of 4
    r = kit.train(trainer, tensor_peak=True, plot=False)
    assert not r.oom and r.eval_ran and r.eval_peak_bytes is not None and r.eval_ratio is None
    assert "a padding-free evaluation flattens 2 rows into one, and training 4" in " ".join(str(r).split())


# -- an encoder classifier's evaluate() at its eval rows' length (issue 50 item 29) ----------------------------------
@pytest.mark.parametrize("family,lora", [("tiny-bert", False), ("tiny-bert", True), ("tiny-distilbert", False),
                                         ("tiny-deberta-v3", False), ("tiny-modernbert", False)])
def test_an_encoder_classifier_is_evaluated_at_its_eval_batches_length(work, family, lora):
    """transformers' text-classification task guide (benchmarks/real_clients.py's classifier_trainer: training rows
    of 64 tokens, DataCollatorWithPadding), with an eval set of its own shorter rows (16, 40, 24 tokens: its batches
    of 8 are padded to 40). evaluate() is read at the eval batches' length, not the training rows', and its
    estimate is within 2% of the profiler's meter after 3 training steps; at the training length it was 3-6% over."""
    import clients_encoders as ce
    import real_clients as rc

    from kit.estimate import estimate_trainer

    ce.save_twin(family, work)   # a sequence classifier twin where classifier_trainer loads it from
    trainer = rc.classifier_trainer(work, "seq-cls", lora=lora, family=family, eval_lengths=(16, 40, 24),
                                    lora_dropout=0.0)
    est = estimate_trainer(trainer, device="cpu")
    assert est.setup["seq_len"] == 64 and est.sources["eval_seq_len"][0] == est.setup["eval_seq_len"] == 40
    trainer.train()
    measured = rc.meter_evaluate(trainer, rc.ProfilerMeter)
    assert 0.98 <= est.eval_peak_bytes / measured <= 1.02, (est.eval_peak_bytes, measured, est.eval_moment)


def test_eval_seq_len_is_checked():
    with pytest.raises(InputError, match="eval_seq_len 4096 is beyond the model's") as exc:
        estimate("tiny-bert", batch_size=2, seq_len=64, eval_seq_len=4096, task="seq-cls")
    assert exc.value.name == "eval_seq_len"
    short, same = (estimate("tiny-bert", batch_size=2, seq_len=64, eval_seq_len=n, task="seq-cls") for n in (16, 64))
    assert short.eval_peak_bytes < same.eval_peak_bytes == estimate("tiny-bert", batch_size=2, seq_len=64,
                                                                    task="seq-cls").eval_peak_bytes
    assert short.peak_bytes == same.peak_bytes    # training is unchanged
