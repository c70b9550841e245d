"""TRL's SFTTrainer (the behaviour of TRL 1.16): estimate_trainer against the exact tensor peak of real SFTTrainer
steps on a tiny CPU twin (TensorPeak on top of the weights and optimizer state held when each step begins), and
each SFTConfig setting modeled or refused in one sentence.

Rows of 40 and 24 tokens alternate, so bfd packing at max_length 64 fills every bin: each micro-batch is the same
(4 x 64 tokens flattened into one row), and the steps compare like with like.
"""
import os
import sys
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit import data, inputs, models  # noqa: E402
from kit.estimate import estimate_from, estimate_trainer  # noqa: E402
from kit.measure.tensor_peak import TensorPeak  # noqa: E402

warnings.filterwarnings("ignore")


def _rows(n=32):
    ids = [[5 + (i * 7 + j) % 4000 for j in range(40 if i % 2 else 24)] for i in range(n)]
    return Dataset.from_dict({"input_ids": ids})


def _sft(tmp_path, peft_config=None, **kw):
    torch.manual_seed(0)
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=3,
                     per_device_train_batch_size=4, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                     learning_rate=1e-4, **kw)
    return SFTTrainer(model=models.build_model("tiny-llama"), args=args, train_dataset=_rows(),
                      processing_class=data.shipped_tokenizer(), peft_config=peft_config)


def _measure(tr):
    peaks = []

    class Meter(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
            self.base = bench._held_bytes(model.parameters(), model.buffers(), bench._state_tensors(optimizer))
            self.m = TensorPeak()
            self.m.__enter__()

        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            self.m.__exit__(None, None, None)
            peaks.append(self.base + self.m.peak_bytes - self.m.start_bytes)

    tr.add_callback(Meter())
    tr.train()
    return peaks


CASES = {
    "full FT, padded rows": dict(gradient_checkpointing=False),
    "full FT, bfd packing (padding-free)": dict(packing=True, max_length=64, gradient_checkpointing=False),
    "LoRA r8, packing, checkpointing": dict(packing=True, max_length=64,
                                            peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"])),
}


@pytest.mark.parametrize("label", list(CASES))
def test_estimate_matches_a_cpu_sft_trainer_step(tmp_path, label):
    kw = dict(CASES[label])
    tr = _sft(tmp_path, **kw)
    est = estimate_trainer(tr, device="cpu")
    assert est.sources["fused_lm_head"][0] is True
    got = _measure(tr)
    steady, first = est.peak_bytes / max(got[1:]), est.first_step_peak_bytes / got[0]
    print(f"{label}: estimate/measured steady {steady:.4f}, step 1 {first:.4f}")
    assert 0.98 <= steady <= 1.02, (label, est.peak_moment, est.peak_bytes, got)
    assert 0.98 <= first <= 1.02, (label, est.first_step_peak_bytes, got)


def test_packed_rows_are_one_flattened_row(tmp_path):
    est = estimate_trainer(_sft(tmp_path, packing=True, max_length=64), device="cpu")
    assert est.sources["batch_size"][0] == 1 and est.sources["seq_len"][0] == 4 * 64
    assert est.setup["batch_size"] == 1 and est.sources["padded"][0] is True


@pytest.mark.parametrize("kw,field", [
    (dict(use_liger_kernel=True), "use_liger_kernel"),
    (dict(activation_offloading=True), "activation_offloading"),
])
def test_unmodeled_settings_are_refused_by_name(kw, field):
    cfg = SFTConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **kw)
    with pytest.raises(inputs.InputError) as e:
        estimate_from("tiny-llama", sft_config=cfg)
    assert e.value.name == field and field in str(e.value) and str(e.value).count(". ") == 0


def test_estimate_from_sft_config_packing_and_qlora():
    from transformers import BitsAndBytesConfig

    cfg = SFTConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", packing=True, max_length=64,
                    per_device_train_batch_size=4)
    est = estimate_from("tiny-llama", sft_config=cfg, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16),
        peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    s = est.sources
    assert s["batch_size"][0] == 1 and s["seq_len"][0] == 256 and s["padding_free"][0] is True
    assert s["kbit_recipe"][0] == "lean" and s["adapter_dtype"][0] == "bf16"
    assert est.setup["adapter_dtype"] == "bf16" and est.setup["fused_lm_head"] is True


def test_fp16_on_a_cpu_is_the_fp32_run_and_says_so():
    from transformers import TrainingArguments

    est = estimate_from("tiny-llama", TrainingArguments(output_dir="unused", use_cpu=True, fp16=True), seq_len=32,
                        device="cpu")
    assert est.setup["precision"] == "fp32" and inputs.has_note(est.notes, "cpu-ignores-fp16")


def test_fp16_trainable_weights_under_fp16_are_refused_with_the_fix():
    from kit.estimate import estimate

    with pytest.raises(inputs.InputError) as e:
        estimate("tiny-llama", batch_size=1, seq_len=32, precision="fp16", load_dtype="fp16")
    assert e.value.code == "fp16-trainable-weights" and "fp32" in str(e.value) and "bf16" in str(e.value)
    estimate("tiny-llama", batch_size=1, seq_len=32, precision="fp16", load_dtype="fp16", lora_r=8)  # fp32 adapters: runs


def test_kit_train_and_watch_take_an_sft_trainer(tmp_path):
    """kit.train runs the user's SFTTrainer itself: its completed peak (every op counted on the CPU) beside
    estimate_trainer's estimate of the same trainer, and kit.watch attaches to it once."""
    import kit

    tr = _sft(tmp_path, packing=True, max_length=64, gradient_checkpointing=False)
    w = kit.watch(tr, plot=False)
    assert kit.watch(tr) is w
    report = kit.train(tr, tensor_peak=True, plot=False)
    assert not report.oom and report.step == 3 and report.peak_exact
    assert report.estimate_peak_bytes == estimate_trainer(tr, device="cpu").peak_bytes
    assert 0.98 <= report.ratio <= 1.02, report
