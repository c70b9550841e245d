"""TRL's SFTTrainer (the behaviour of TRL 1.16): estimate_trainer against the exact tensor peak of real SFTTrainer
steps on a tiny CPU twin (TensorPeak on top of the weights and optimizer state held when each step begins), and
each SFTConfig setting modeled or refused in one sentence.

Rows of 40 and 24 tokens alternate, so bfd packing at max_length 64 fills every bin: each micro-batch is the same
(4 x 64 tokens flattened into one row), and the steps compare like with like.
"""
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from kind_checks import assert_within_2_percent, cpu_config, step_ratios  # noqa: E402

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
    args = cpu_config(SFTConfig, str(tmp_path), max_steps=3, per_device_train_batch_size=4, save_strategy="no",
                      logging_strategy="no", disable_tqdm=True, learning_rate=1e-4, **kw)
    return SFTTrainer(model=models.build_model("tiny-llama"), args=args, train_dataset=_rows(),
                      processing_class=data.shipped_tokenizer(), peft_config=peft_config)


def _measure(tr):
    return bench.step_peaks(tr)   # each step's exact CPU peak over what it holds


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
    assert_within_2_percent(label, step_ratios(est, got), est.peak_moment, got)


def test_packed_rows_are_one_flattened_row(tmp_path):
    est = estimate_trainer(_sft(tmp_path, packing=True, max_length=64), device="cpu")
    assert est.sources["batch_size"][0] == 1 and est.sources["seq_len"][0] == 4 * 64
    assert est.setup["batch_size"] == 1 and est.sources["padded"][0] is True


@pytest.mark.parametrize("kw,field", [
    (dict(activation_offloading=True, gradient_checkpointing=False, max_length=64), "activation_offloading"),
])
def test_unmodeled_settings_are_refused_by_name(kw, field):
    cfg = cpu_config(SFTConfig, "unused", **kw)
    with pytest.raises(inputs.InputError) as e:
        estimate_from("tiny-llama", sft_config=cfg)
    assert e.value.name == field and field in str(e.value) and str(e.value).count(". ") == 0


def test_estimate_from_sft_config_packing_and_qlora():
    from transformers import BitsAndBytesConfig

    cfg = cpu_config(SFTConfig, "unused", packing=True, max_length=64, per_device_train_batch_size=4)
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
    # fp32 adapters: runs
    estimate("tiny-llama", batch_size=1, seq_len=32, precision="fp16", load_dtype="fp16", lora_r=8)


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


# bf16 hidden states and LM head (no autocast): a 4-bit QLoRA model (TRL casts the adapters to bf16; embeddings and
# lm_head stay bf16) and LoRA on bf16 weights. "4 x 64 packed" is the fp32 cases' data; "one packed row of 16" (rows
# of 10 and 6 tokens, batch 1) scores 15 positions, so the backward's largest moment is _addmm_fp32's fp32 copies of
# the bf16 [15, 4096] tile and [4096, 128] weight slice, not the fold (it was 0.90 before they were counted).
BF16_HEAD_DATA = {
    "4 x 64 packed": (4, 64, None),
    "one packed row of 16": (1, 16, (10, 6)),
}


@pytest.mark.parametrize("weights", ["4bit", "bf16"])
@pytest.mark.parametrize("shape", list(BF16_HEAD_DATA))
def test_estimate_matches_a_bf16_head_sft_trainer_step(tmp_path, weights, shape):
    from datasets import Dataset

    batch, max_length, lengths = BF16_HEAD_DATA[shape]
    torch.manual_seed(0)
    if weights == "4bit":
        pytest.importorskip("bitsandbytes")
        model = models.load_model("tiny-llama", quantization="4bit", device="cpu")  # NF4, bf16 compute and rest
    else:
        model = models.build_model("tiny-llama", dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    rows = _rows() if lengths is None else Dataset.from_dict(
        {"input_ids": [[5 + (i * 7 + j) % 4000 for j in range(lengths[i % 2])] for i in range(32)]})
    args = cpu_config(SFTConfig, str(tmp_path), max_steps=3, per_device_train_batch_size=batch, save_strategy="no",
                      logging_strategy="no", disable_tqdm=True, learning_rate=1e-4, packing=True,
                      max_length=max_length)
    tr = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=data.shipped_tokenizer(),
                    peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    est = estimate_trainer(tr, device="cpu")
    assert est.sources["fused_lm_head"][0] is True and est.setup["seq_len"] == batch * max_length
    got = _measure(tr)
    assert_within_2_percent(f"{weights}, {shape}", step_ratios(est, got), est.peak_moment, got)


@pytest.mark.parametrize("B,S,H", [(1, 120, 128), (1, 9, 512)])
def test_chunked_head_matches_the_kernel_on_bf16_tensors(B, S, H):
    """chunked_head's forward and backward against ChunkedLogProbFunction itself on bf16 hidden states and weight
    (V 4096, frozen head), as add_fused_lm_head calls it: [:, :-1] reshaped, the clamped labels, TRL's outputs.
    The forward's half tile costs no extra fp32 copy; the backward's (1, 9, 512) moment is _addmm_fp32's."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from kit.estimate.replay.fused_head import chunked_head

    V = 4096
    torch.manual_seed(0)
    w = (torch.randn(V, H) * 0.05).to(torch.bfloat16)
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (B, S))
    with TensorPeak() as p:
        h = x * 1.0                      # the final norm's output
        base = p.current_bytes
        out = ChunkedLogProbFunction.apply(h[:, :-1].reshape(-1, H), w, None, labels[:, 1:].clamp(min=0).reshape(-1),
                                           1.0, 32768, None, 1.0, ("log_probs", "entropy", "is_top1"))
        forward = p.peak_bytes - base
        loss = -out[0].sum()
        del out, h
        p.peak_bytes = start = p.current_bytes
        loss.backward()
        backward = p.peak_bytes - start
    est = chunked_head(B=B, S=S, H=H, V=V, hidden_dt=2, weight_dt=2, compute_dt=2, head_trainable=False,
                       hidden_grad=True, device="cpu")
    assert 0.99 <= forward / est["forward"] <= 1.01, (forward, est)
    assert 0.99 <= backward / est["backward"] <= 1.01, (backward, est)
