"""The attention kernel the estimate assumes on CUDA follows torch 2.13's SDPA choice for the GPU it is judged on
(kit.estimate.replay.kernels, the kit's own reading of PyTorch's sdp_utils.cpp), and the verdict names it where it
changes the figure."""
import pathlib
import re

import pytest

from kit.estimate import estimate
from kit.estimate.replay.kernels import sdpa_kernel
from kit.inputs import InputError
from kit.presets import verdict

ACCURACY = pathlib.Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"
LLAMA_1B = "meta-llama/Llama-3.2-1B"


@pytest.mark.parametrize("sm, dtype, masked, gqa, head_dim, dropout, expected", [
    ((7, 5), "fp16", False, False, 64, 0.0, "efficient"),  # sm75: no flash, no cuDNN attention
    ((7, 5), "fp16", False, True, 64, 0.0, "math"),        # ... and torch 2.13's memory-efficient kernel: no GQA
    ((7, 5), "bf16", True, False, 64, 0.0, "math"),        # memory-efficient takes bf16 from sm80 only
    ((7, 5), "fp32", True, False, 64, 0.0, "efficient"),
    ((8, 0), "bf16", False, True, 64, 0.0, "flash"),       # flash takes GQA
    ((8, 0), "bf16", True, False, 64, 0.0, "efficient"),   # flash takes no mask
    ((8, 0), "fp32", False, False, 64, 0.0, "efficient"),  # flash and cuDNN take half precision only
    ((8, 0), "fp32", False, True, 64, 0.0, "math"),
    ((8, 9), "bf16", False, False, 208, 0.0, "efficient"),  # sm86-sm89 train flash up to 192, or over 224 ...
    ((8, 9), "bf16", False, False, 256, 0.0, "flash"),     # ... without dropout
    ((8, 9), "bf16", False, False, 256, 0.1, "efficient"),
    ((9, 0), "bf16", True, False, 64, 0.0, "cudnn"),       # cuDNN first on sm90
    ((9, 0), "bf16", False, False, 64, 0.1, "flash"),      # cuDNN: dropout in sixteenths only
    ((9, 0), "fp32", False, True, 64, 0.0, "math"),
    ((9, 0), "fp16", False, False, 256, 0.0, "flash"),     # cuDNN: head dims up to 128
    (None, "fp32", False, True, 64, 0.0, None),            # no architecture known: no choice made
])
def test_the_rule_table(sm, dtype, masked, gqa, head_dim, dropout, expected):
    assert sdpa_kernel(sm, dtype, masked, gqa, head_dim, dropout) == expected


def _meter_figure() -> int:
    """The fake-CUDA meter's peak for Llama-3.2-1B fp32 1 x 2048 unpadded (math path), as docs/accuracy.md quotes
    it with its command."""
    return int(re.search(r"peaks at ([\d,]+) B", ACCURACY.read_text()).group(1).replace(",", ""))


@pytest.mark.parametrize("gpu", ["colab-t4", "h100"])
def test_llama_1b_fp32_unpadded_gets_the_math_path_figure_and_the_verdict_names_it(gpu):
    est = estimate(LLAMA_1B, batch_size=1, seq_len=2048, padded=False, gpu=gpu)
    assert est.peak_bytes / _meter_figure() == pytest.approx(1, abs=0.001)
    assert est.setup["attention_kernel"] == "math"
    text = verdict(est, gpu).text
    assert "SDPA math path on sm" in text and "unmeasured" in text
    assert ("sm75" if gpu == "colab-t4" else "sm90") in text


def test_without_an_architecture_flash_is_assumed_and_nothing_is_said():
    est = estimate(LLAMA_1B, batch_size=1, seq_len=2048, padded=False)
    with_gpu = estimate(LLAMA_1B, batch_size=1, seq_len=2048, padded=False, gpu="h100")
    assert est.peak_bytes / with_gpu.peak_bytes < 0.8   # the flash figure, the math path's probabilities left out
    assert "attention_kernel" not in est.setup and "math path" not in verdict(est, "h100").text


def test_a_kernel_that_keeps_what_the_default_keeps_changes_nothing():
    """bf16 GQA without a mask on an A100 takes flash, as the kit assumes without an architecture."""
    options = dict(batch_size=4, seq_len=64, padded=False, precision="bf16")
    est = estimate("tiny-llama", **options, gpu="a100-80")
    assert est.peak_bytes == estimate("tiny-llama", **options).peak_bytes
    assert "attention_kernel" not in est.setup and "math path" not in verdict(est, "a100-80").text


def test_the_cli_judges_on_the_presets_architecture(capsys):
    from kit.cli import main

    assert main(["estimate", "--model", LLAMA_1B, "--batch-size", "1", "--seq-len", "2048", "--no-padding"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SDPA math path on sm75 (torch 2.13's rule, unmeasured)" in out


@pytest.mark.parametrize("options, code", [(dict(gpu="t5"), "invalid"), (dict(gpu="h100", device="cpu"),
                                                                        "gpu-on-cpu")])
def test_a_gpu_that_cannot_be_used_is_refused_by_name(options, code):
    with pytest.raises(InputError) as caught:
        estimate("tiny-llama", batch_size=1, seq_len=8, **options)
    assert caught.value.name == "gpu" and caught.value.code == code


def test_the_gpu_check_asks_the_kernel_question():
    """benchmarks/estimate_vs_measured.py's GPU rows (make gpu-check) hold an fp32 full fine-tune of a GQA model
    without a mask, where the two kernels' figures lie far enough apart for one measurement to tell them apart, and
    its report names the nearer."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import estimate_vs_measured as bench

    [(label, name, options)] = bench.KERNEL_ROWS
    math = estimate(name, **options, device="cuda", gpu="h100")
    fused = estimate(name, **options, device="cuda")
    assert math.setup["attention_kernel"] == "math" and options["padded"] is False
    assert fused.peak_bytes / math.peak_bytes < 0.9
    row = dict(label=label, model=name, est=math, other=fused, got={"peak": math.peak_bytes - 2**20})
    assert bench.kernel_lines([row])[1].endswith("nearer math")
