"""Qwen3.5 text (``tiny-qwen3-5``: 4 layers, Gated DeltaNet x3 then gated full attention, hidden 128, vocab 4096;
``tiny-qwen3-5-moe``: the same with 8 experts, top-2, and a shared expert in every MLP) on the CPU, where
transformers runs its reference PyTorch paths for the causal conv and the chunked gated delta rule: the replay
against what autograd saves, and the estimate read off a Trainer against ``benchmarks/real_clients.py``'s profiler
meter at step 1, the steady step and ``evaluate()``.
"""
import functools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit.estimate import estimate  # noqa: E402
from kit.estimate.inventory import family_of, info_of  # noqa: E402
from kit.model_configs import get_config  # noqa: E402
from kit.models import build_model  # noqa: E402

TWIN = "tiny-qwen3-5"
# (batch, tokens a row, options): S = 100 pads the chunked rule to 128 tokens; 128 and 192 fill whole chunks of 64,
# where an fp32 run keeps the (B, S, heads, d) layout and its matmuls copy their inputs
CASES = {
    "full FT, padded rows, S 100": dict(batch_size=2, seq_len=100),
    "full FT, unpadded, S 128": dict(batch_size=2, seq_len=128, padded=False),
    "full FT, checkpointing, S 192": dict(batch_size=2, seq_len=192, padded=False, gradient_checkpointing=True),
    "LoRA r8 (in_proj_qkv, out_proj, q_proj, v_proj), S 96": dict(
        batch_size=2, seq_len=96, lora_r=8, lora_targets=["in_proj_qkv", "out_proj", "q_proj", "v_proj"]),
}


MOE = "tiny-qwen3-5-moe"
TWINS = {label: TWIN for label in CASES}
for label, kw in (("MoE, full FT, padded rows, S 100", dict(batch_size=2, seq_len=100)),
                  ("MoE, full FT, unpadded, S 128", dict(batch_size=2, seq_len=128, padded=False))):
    CASES[label], TWINS[label] = kw, MOE


@functools.lru_cache(maxsize=None)
def _measured(label):
    torch.manual_seed(0)
    return bench.run_row(label, TWINS[label], CASES[label], False)


def test_the_twin_is_its_own_family_with_every_parameter_counted():
    info = info_of(TWIN)
    assert family_of(get_config(TWIN)) == info.family == "qwen3_5_text"
    # Gated DeltaNet's A_log and dt_bias are vectors of its own, not mixture-of-experts weights
    assert {l.short.split(".")[-1] for l in info.leaves if l.kind == "other" and l.part == "block"} >= {"A_log",
                                                                                                      "dt_bias"}
    assert not [l for l in info.leaves if l.kind == "experts"]
    assert estimate(TWIN, batch_size=1, seq_len=8).params == build_model(TWIN, device="meta").num_parameters()
    # the MoE twin: its fused 3-D experts (8 x 2 x 64 x 128 and 8 x 128 x 64 a layer) and the shared expert counted
    moe = info_of(MOE)
    assert family_of(get_config(MOE)) == moe.family == "qwen3_5_moe_text"
    assert {l.shape for l in moe.leaves if l.kind == "experts"} == {(8, 128, 128), (8, 128, 64)}
    assert estimate(MOE, batch_size=1, seq_len=8).params == build_model(MOE, device="meta").num_parameters()


@pytest.mark.parametrize("label", list(CASES))
def test_replay_matches_autograd_saved_tensors(label):
    r = _measured(label)
    kw = CASES[label]
    B, S = kw["batch_size"], kw["seq_len"]
    # checkpointing keeps the rotary cos/sin (per row: (B, S, 8) each, fp32) for the recompute, unsaved
    kept = 2 * B * S * 8 * 4 if kw.get("gradient_checkpointing") else 0
    assert r["est"].saved_bytes - kept == pytest.approx(r["saved"], rel=1e-6)


@pytest.mark.parametrize("label", list(CASES))
def test_peak_matches_a_cpu_trainer_step(label):
    r = _measured(label)
    assert 0.99 <= r["est"].peak_bytes / r["got"]["peak"] <= 1.01, (r["est"].peak_moment, r["got"])
    assert r["est"].weights_bytes == r["got"]["weights"]


@pytest.mark.parametrize("twin", [TWIN, MOE])
def test_trainer_steps_and_evaluate_within_2_percent_of_the_profiler_meter(twin, tmp_path):
    """A full fine-tune under a real Trainer (3 steps, AdamW fused, rows of 96 tokens, no padding), read by
    real_clients' profiler meter: the estimate read off the Trainer is within 2% at step 1, the steady step and
    ``evaluate()`` (8 rows a batch, metered after training)."""
    import real_clients as rc
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    cfg = get_config(twin)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=8, max_steps=3,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=bench._Batches(12, 96, cfg.vocab_size, padded=False),
                      eval_dataset=bench._Batches(16, 96, cfg.vocab_size, padded=False))
    est = estimate_trainer(trainer, device="cpu")   # reads a batch: 96 tokens a row, no padding
    meter = rc.meter_trainer(trainer, rc.ProfilerMeter())
    trainer.train()
    peaks = meter.peaks
    evaluated = rc.meter_evaluate(trainer, rc.ProfilerMeter)
    assert len(peaks) == 3
    print(f"{twin}: estimate/measured step 1 {est.first_step_peak_bytes / peaks[0]:.4f}, steady "
          f"{est.peak_bytes / max(peaks[1:]):.4f}, evaluate {est.eval_peak_bytes / evaluated:.4f}")
    assert 0.98 <= est.first_step_peak_bytes / peaks[0] <= 1.02, (est.first_step_peak_bytes, peaks)
    assert 0.98 <= est.peak_bytes / max(peaks[1:]) <= 1.02, (est.peak_bytes, peaks)
    assert 0.98 <= est.eval_peak_bytes / evaluated <= 1.02, (est.eval_peak_bytes, evaluated)


def test_a_cuda_figure_says_it_follows_flash_linear_attention_unmeasured():
    """On CUDA the Gated DeltaNet layers follow flash-linear-attention's saved tensors (read from its source): fewer
    than the reference path's, and the estimate says so beside the figure, with the modelled margin."""
    cuda = estimate(TWIN, batch_size=2, seq_len=512)
    cpu = estimate(TWIN, batch_size=2, seq_len=512, device="cpu")
    said = [n for n in cuda.notes if n.code == "linear-attention-fla"]
    assert len(said) == 1 and "not measured" in said[0] and "5% modelled margin" in said[0]
    assert not [n for n in cpu.notes if n.code == "linear-attention-fla"]
    assert cuda.activations_bytes < cpu.activations_bytes


def test_fit_answers_a_qwen3_5_model_in_five_lines(capsys):
    from kit.cli import main

    main(["fit", "--model", TWIN, "--batch-size", "4", "--seq-len", "512", "--device", "colab-t4"])
    out = capsys.readouterr().out.strip().splitlines()
    said = [line for line in out if not line.startswith(" ")]   # (a long line wraps, indented)
    assert said[0].startswith("fits Colab T4") and len(said) <= 5 and said[-1].startswith("details: --details")
