"""The fake-CUDA meter (benchmarks/fake_cuda): a test instrument that runs real training steps on FakeTensorMode's
"cuda" tensors in this CPU-only torch. Each check runs in a process of its own (the meter's native shim must load
before torch, and its patches to torch.cuda last for the process). Skipped, with the reason, where g++ is missing."""
import importlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
METER = ROOT / "benchmarks" / "fake_cuda"
REFERENCE = ROOT / "benchmarks" / "results" / "h200-2026-reference.md"
MIB = 2**20
GIB = 2**30

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="g++ is missing: the fake-CUDA meter's shim cannot be compiled")


def _run(script: str, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(METER / script), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _meter_module(name: str):
    sys.path.insert(0, str(METER))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(METER))


def _h200_reference(setup: str) -> float:
    """The measured GiB for ``setup`` (a row label) from the reference file, the figures' one home."""
    for line in REFERENCE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == setup:
            return float(cells[1])
    raise AssertionError(f"no row {setup!r} in {REFERENCE.name}")


@needs_gxx
def test_meter_matches_memtracker_to_the_byte():
    result = _run("memtracker_check.py")
    assert result["meter_peak_bytes"] == result["memtracker_peak_bytes"]
    assert result["meter_peak_bytes"] > 10 * MIB  # the tiny Llama's weights, gradients and AdamW state alone


@needs_gxx
def test_meter_reproduces_the_h200_distilgpt2_fp16_peak_within_100_mib():
    measured = _h200_reference("distilgpt2 fp16, batch 8 x 128") * GIB
    result = _run("trainer_steps.py", "--config", "distilgpt2", "--precision", "fp16", "--batch", "8", "--seq", "128",
                  "--gpu", "H200")
    assert abs(result["peak_bytes"] - measured) <= 100 * MIB, (result["peak_bytes"] / GIB, measured / GIB)
    assert set(result["sdpa_backends"]) == {"flash"}  # fp16, no mask, dropout 0.1 on sm90: flash (cuDNN: not 1/16)


@needs_gxx
def test_a_slice_of_the_grid_kit_within_one_percent_of_the_meter():
    """Five setups of benchmarks/fake_cuda_grid.py, the kit judging each on its GPU's preset: flash (tiny-gpt2 fp16
    on an L4), memory-efficient with a mask (tiny-llama bf16, padded, on an A100), the math path (tiny-llama fp32,
    grouped-query heads without a mask, on an H100), memory-efficient without a mask after a partial rotary's
    ``cat`` (tiny-stablelm fp32: its output needs no copy for o_proj; T4 and H100 share one meter run, their SDPA
    choice being the same at every call) and eager attention (tiny-gemma2: no SDPA path, one run for both GPUs)."""
    from kit.estimate.core import estimate

    setups = [dict(config="tiny-gpt2", precision="fp16", gpu="L4"),
              dict(config="tiny-llama", precision="bf16", padded=True, gpu="A100"),
              dict(config="tiny-llama", precision="fp32", gpu="H100"),
              dict(config="tiny-stablelm", precision="fp32", gpus=["T4", "H100"]),
              dict(config="tiny-gemma2", precision="bf16", gpus=["L4", "H100"])]
    setups = [{"batch": 4, "seq": 64, **setup} for setup in setups]
    presets = {"T4": "colab-t4", "L4": "l4", "A100": "a100-80", "H100": "h100"}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(METER / "trainer_steps.py"), "--setups", json.dumps(setups)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metered = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"config"')]
    assert [(m["gpu"], m.get("metered_on"), set(m["sdpa_backends"]), m["attn"]) for m in metered] == [
        ("L4", None, {"flash"}, "sdpa"), ("A100", None, {"efficient"}, "sdpa"), ("H100", None, {"math"}, "sdpa"),
        ("T4", "T4", {"efficient"}, "sdpa"), ("H100", "T4", {"efficient"}, "sdpa"),
        ("L4", "L4", set(), "eager"), ("H100", "L4", set(), "eager")]
    for meter in metered:
        kit = estimate(meter["config"], batch_size=4, seq_len=64, precision=meter["precision"],
                       padded=meter["padded"], gradient_checkpointing=False, device="cuda", gpu=presets[meter["gpu"]])
        assert kit.peak_bytes / meter["peak_bytes"] == pytest.approx(1, abs=0.01), meter
        assert kit.first_step_peak_bytes / meter["step_peaks"][0] == pytest.approx(1, abs=0.01), meter


def test_placeholder_kernels_are_the_ops_a_cpu_build_decomposes():
    """CUDA_ONLY_KERNELS equals the ops of torch's own native_functions.yaml with a CompositeImplicitAutograd kernel
    and a CUDA one (written, or generated by a structured delegate), nested-tensor kernels aside."""
    yaml = pytest.importorskip("yaml")
    shim = _meter_module("shim")
    import torchgen

    path = pathlib.Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    found = set()
    for entry in yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        keys = {key.strip() for spec in (entry.get("dispatch") or {}) for key in spec.split(",")}
        if "CompositeImplicitAutograd" in keys and ("CUDA" in keys or "structured_delegate" in entry):
            found.add(re.match(r"[\w.]+", entry["func"]).group(0))
    assert found == set(shim.CUDA_ONLY_KERNELS)


def _qkv(dtype, heads=(4, 4, 4), head_dim=32, seq=64, batch=2):
    import torch

    return [torch.empty(batch, h, seq, head_dim, device="meta", dtype=dtype, requires_grad=True) for h in heads]


@pytest.mark.parametrize("gpu, dtype, kwargs, expected", [
    ("T4", "float16", {}, "efficient"),                   # sm75: no flash, no cuDNN attention
    ("T4", "bfloat16", {}, "math"),                       # the efficient kernel takes bf16 from sm80 only
    ("A100", "bfloat16", {"is_causal": True}, "flash"),
    ("L4", "float16", {"is_causal": True, "dropout_p": 0.1}, "flash"),
    ("H100", "bfloat16", {"is_causal": True}, "cudnn"),   # cuDNN first on sm90 with cuDNN > 9.15
    ("H100", "bfloat16", {"is_causal": True, "dropout_p": 0.1}, "flash"),  # cuDNN: dropout in 1/16 steps only
    ("A100", "float32", {"is_causal": True}, "efficient"),  # flash and cuDNN take half precision only
    ("H100", "float32", {"is_causal": True}, "efficient"),
    ("A100", "bfloat16", {"mask": True}, "efficient"),    # flash takes no mask
    ("H100", "bfloat16", {"mask": True}, "cudnn"),
])
def test_sdpa_choice_per_architecture(gpu, dtype, kwargs, expected):
    import torch

    sdpa_choice = _meter_module("sdpa_choice")
    q, k, v = _qkv(getattr(torch, dtype))
    mask = torch.ones(2, 1, 64, 64, dtype=torch.bool, device="meta") if kwargs.pop("mask", False) else None
    assert sdpa_choice.choose(sdpa_choice.GPUS[gpu], q, k, v, mask, **kwargs) == expected


@pytest.mark.parametrize("gpu", ["T4", "L4", "A100", "H100"])
def test_fp32_grouped_query_attention_without_a_mask_takes_math_in_torch_2_13(gpu):
    """Flash and cuDNN take no fp32; torch 2.13's memory-efficient kernel no GQA (its meta backward assumes equal
    head counts). A GPU question: newer PyTorch admits GQA there."""
    import torch

    sdpa_choice = _meter_module("sdpa_choice")
    q, k, v = _qkv(torch.float32, heads=(4, 2, 2))
    assert sdpa_choice.choose(sdpa_choice.GPUS[gpu], q, k, v, None, is_causal=True, enable_gqa=True) == "math"
    q, k, v = _qkv(torch.bfloat16, heads=(4, 2, 2))
    expected = {"T4": "math", "L4": "flash", "A100": "flash", "H100": "cudnn"}[gpu]
    assert sdpa_choice.choose(sdpa_choice.GPUS[gpu], q, k, v, None, is_causal=True, enable_gqa=True) == expected


def test_flash_refuses_training_head_dims_in_192_to_224_on_sm89():
    """sm86-sm89 train flash attention at head_dim <= 192, or above 224 without dropout."""
    import torch

    sdpa_choice = _meter_module("sdpa_choice")
    l4, a100 = sdpa_choice.GPUS["L4"], sdpa_choice.GPUS["A100"]
    q, k, v = _qkv(torch.bfloat16, head_dim=208)
    assert sdpa_choice.choose(l4, q, k, v, None, is_causal=True) == "efficient"
    assert sdpa_choice.choose(a100, q, k, v, None, is_causal=True) == "flash"
    q, k, v = _qkv(torch.bfloat16, head_dim=256)
    assert sdpa_choice.choose(l4, q, k, v, None, is_causal=True) == "flash"
    assert sdpa_choice.choose(l4, q, k, v, None, is_causal=True, dropout_p=0.1) == "efficient"
