"""Paged 32-bit AdamW (bitsandbytes' PagedAdamW32bit, ``optim="paged_adamw_32bit"``): the single-GPU CPU offload of
the optimizer state. Its rules, measured on real Trainer steps on a CPU twin (bitsandbytes falls back to plain
tensors there, so the state counts in the CPU's peak, as the estimate for device="cpu" holds it):

- two fp32 states whatever the weight's dtype: a bf16 model's state is 8 bytes a parameter, not AdamW's 4;
- on a CPU its update runs in torch ops inside bitsandbytes' custom op, whose temporaries a dispatch mode never
  sees (the kit's TensorPeak read step 1 20-37% low): the meter is PyTorch's profiler (benchmarks/real_clients.py),
  which sees every allocation;
- on CUDA, a tensor of 1e5 elements or more keeps them in managed memory, outside max_memory_allocated.
"""
import os
import sys
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import real_clients  # noqa: E402

from kit import data, models  # noqa: E402
from kit.estimate import estimate, estimate_trainer  # noqa: E402

pytest.importorskip("bitsandbytes")
warnings.filterwarnings("ignore")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_adamw_32bit_measured_on_a_cpu_twin(tmp_path, dtype):
    tok = data.shipped_tokenizer()
    ids = [[5 + (i * 7 + j) % 4000 for j in range(64)] for i in range(16)]
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 64 for _ in ids]})
    model = models.build_model("tiny-llama", dtype=dtype)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                             max_steps=3, optim="paged_adamw_32bit", save_strategy="no", logging_strategy="no",
                             disable_tqdm=True)
    tr = Trainer(model=model, args=args, train_dataset=ds, data_collator=data.collator(tok))
    est = estimate_trainer(tr, device="cpu")
    assert est.setup["optimizer"] == "paged-adamw" and est.paged_optimizer_bytes == 0   # on a CPU: plain tensors
    meter = real_clients.meter_trainer(tr, real_clients.ProfilerMeter())
    tr.train()
    peaks = meter.peaks
    state = sum(t.numel() * t.element_size() for s in tr.optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim())
    assert state == 8 * est.trainable_params   # two fp32 states a parameter, whatever the weight's dtype
    ratio = est.peak_bytes / max(peaks[1:])
    print(f"{dtype}: estimate/measured steady {ratio:.4f}, step 1 {est.first_step_peak_bytes / peaks[0]:.4f}")
    assert 0.98 <= ratio <= 1.02 and 0.98 <= est.first_step_peak_bytes / peaks[0] <= 1.02


def test_on_cuda_the_big_states_leave_the_allocator():
    e = estimate("meta-llama/Llama-3.2-1B", batch_size=1, seq_len=256, optimizer="paged-adamw")
    plain = estimate("meta-llama/Llama-3.2-1B", batch_size=1, seq_len=256)
    assert e.paged_optimizer_bytes == 8 * e.trainable_params - (e.optimizer_bytes - e.paged_optimizer_bytes)
    assert e.optimizer_bytes - e.paged_optimizer_bytes < 0.001 * e.optimizer_bytes   # only the norms' small states
    assert plain.peak_bytes - e.peak_bytes >= 0.99 * plain.optimizer_bytes   # the state off the device's peak
