"""Liger's kernels on a GPU: real ``Trainer(use_liger_kernel=True)`` steps on a Llama-architecture random-weights
twin (Meta-Llama-3-8B's config cut to 2 layers: H 4096, F 14336, V 128256, 32 heads, 8 kv heads; about 1.49 B
parameters) against the kit's estimate of the same setup, whose Liger terms are computed from Liger-Kernel
0.8.2's source (kit.estimate.replay.liger) and not yet measured anywhere else.

B 4 x S 1024, bf16 mixed precision, adamw_torch_fused, padded rows (a mask in every batch). The figures a GPU
must confirm (``torch.cuda.max_memory_allocated()`` over the steady steps, within 2%):

- full FT, bf16 weights: 14,517,760,544 bytes (13.52 GiB), at the forward's fused loss, whose
  ``torch.mm(...).float()`` makes a [V, H] bf16 product and its fp32 copy (3.15 GB) beside the bf16
  grad_weight (without Liger: 17,123,090,944, at the loss's backward);
- LoRA r16 (q_proj, v_proj), bf16 weights: 4,156,285,440 bytes (3.87 GiB), in block 2's backward
  (without Liger: 10,678,346,240);
- full FT, fp32 weights: 23,857,660,416 bytes (22.22 GiB), in the embeddings' backward; the fused loss's
  forward (fp32 grad_weight through ``addmm(out_dtype=float32)``, autocast's cached bf16 weight) is 0.15 GiB
  under it (without Liger: 28,337,209,856).
"""
import gc
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("liger_kernel")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit import models  # noqa: E402
from kit.estimate import estimate  # noqa: E402
from kit.measure import device  # noqa: E402
from kit.model_configs import get_config  # noqa: E402

B, S = 4, 1024
CASES = {   # label -> (estimate options beyond B, S, bf16 and liger_kernel; the estimated peak_bytes)
    "full FT, bf16 weights": (dict(load_dtype="bf16"), 14_517_760_544),
    "LoRA r16, bf16 weights": (dict(load_dtype="bf16", lora_r=16), 4_156_285_440),
    "full FT, fp32 weights": (dict(load_dtype="fp32"), 23_857_660_416),
}


def _twin_config():
    cfg = get_config("meta-llama/Meta-Llama-3-8B")
    cfg.num_hidden_layers = 2
    return cfg


@pytest.mark.parametrize("label", list(CASES))
def test_liger_trainer_step_matches_the_estimate(label, tmp_path):
    kw, stated = CASES[label]
    cfg = _twin_config()
    est = estimate(cfg, batch_size=B, seq_len=S, precision="bf16", liger_kernel=True, **kw)
    assert est.peak_bytes == stated, (label, est.peak_bytes)   # the figure the docstring states
    torch.manual_seed(0)
    model = models.build_model(cfg, device="cuda", dtype=models.as_dtype(kw["load_dtype"]))
    if kw.get("lora_r"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=kw["lora_r"], target_modules=["q_proj", "v_proj"]))
    got = bench.trainer_peak(model, B=B, S=S, V=cfg.vocab_size, steps=3, optim="adamw_torch_fused", padded=True,
                             precision="bf16", cuda=True, workdir=str(tmp_path), use_liger_kernel=True)
    del model
    gc.collect()
    device.empty_cache()
    ratio = est.peak_bytes / got["peak"]
    print(f"{label}: estimate {est.peak_bytes:,} ({est.peak_moment}), measured {got['peak']:,}, ratio {ratio:.4f}")
    assert 0.98 <= ratio <= 1.02, (label, est.peak_moment, est.peak_bytes, got)
