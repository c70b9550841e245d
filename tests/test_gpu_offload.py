"""Offloaded checkpointing on a GPU: real Trainer / SFTTrainer steps of the SmolLM2-135M twin (random weights, real
shapes, fp32 weights under bf16 autocast, AdamW), ``torch.cuda.max_memory_allocated()`` per step against
``estimate_trainer(..., device="cuda")`` within 2%, and the pinned host copies the offloader makes in one step
against ``offloaded_bytes`` exactly. Skipped without a GPU (tests/test_offload.py measures the same code on a CPU).

The figures a GPU must confirm (the estimate's, steady step / step 1 / host, bytes):

- Trainer, batch 4 x 1024 padded, ``activation_checkpointing_kwargs={"offload": True}``: 4115214336 / 3039094272 /
  283115520 (30 blocks' bf16-autocast fp32 inputs, 4 x 1024 x 576 x 4 each); with ``"every_n_layers": 2`` too:
  6308130816 / 5232010752 / 141557760 (15 blocks checkpointed). Without offload: 4398329856 and 6449688576.
- SFTTrainer, 8 rows of 2048 tokens (no padding), ``gradient_checkpointing=True, activation_offloading=True``:
  2824176384 / 2690159872 / 1246164856 (the blocks' inputs, the final norm's and the fused head's saved tensors);
  without offloading 3470489856. With LoRA r=16 on q_proj, v_proj: 1203829912 / 1170472448 / 1208285048, the steady
  peak at the forward, where the last step's embeddings output (a leaf, made so by enable_input_require_grads) and
  its grad are still held by TRL's ``curr_autograd_node`` (2 x 8 x 2048 x 576 x 4 bytes); without offloading
  2155748864.
"""
import os
import sys
import warnings

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit import models  # noqa: E402
from kit.estimate import estimate_trainer  # noqa: E402
from kit.measure import device  # noqa: E402

pytestmark = pytest.mark.gpu
warnings.filterwarnings("ignore")
MODEL = "HuggingFaceTB/SmolLM2-135M"


class CudaSteps(TrainerCallback):
    """Each optimizer step's max_memory_allocated, and the pinned host bytes the offloader's packs made in it."""

    def __init__(self):
        self.peaks, self.host, self.made = [], [], 0

    def on_step_begin(self, *a, **kw):
        torch.cuda.synchronize()
        device.reset_peak()
        self.made = 0

    def on_step_end(self, *a, **kw):
        torch.cuda.synchronize()
        self.peaks.append(device.peak_allocated_bytes())
        self.host.append(self.made)


def _count_host(hooks, meter, host_of):
    inner = hooks.pack_hook

    def pack(t):
        out = inner(t)
        meter.made += host_of(out)
        return out

    hooks.pack_hook = pack
    return hooks


def _check(est, meter, label):
    steady, first = est.peak_bytes / max(meter.peaks[1:]), est.first_step_peak_bytes / meter.peaks[0]
    print(f"{label}: estimate/measured steady {steady:.4f}, step 1 {first:.4f}; pinned host {meter.host} "
          f"(estimate {est.offloaded_bytes})")
    assert 0.98 <= steady <= 1.02 and 0.98 <= first <= 1.02, (label, est.peak_moment, est.peak_bytes, meter.peaks)
    assert set(meter.host) == {est.offloaded_bytes}, (label, meter.host)


@pytest.mark.parametrize("every", [1, 2])
def test_checkpoint_offload_on_cuda(tmp_path, monkeypatch, every):
    import transformers.modeling_utils as mu

    meter = CudaSteps()

    class Counted(mu.save_on_cpu):   # save_on_cpu as shipped; its pack's pinned copies counted
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            _count_host(self, meter, lambda out: out[1].untyped_storage().nbytes())

    monkeypatch.setattr(mu, "save_on_cpu", Counted)
    torch.manual_seed(0)
    B, S = 4, 1024
    kw = {"offload": True, **({"every_n_layers": every} if every > 1 else {})}
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=B, max_steps=3, bf16=True,
                             report_to=[], save_strategy="no", logging_strategy="no", optim="adamw_torch",
                             learning_rate=1e-4, dataloader_num_workers=0, disable_tqdm=True,
                             activation_checkpointing=True, activation_checkpointing_kwargs=kw)
    model = models.build_model(MODEL, device="cuda")
    tr = Trainer(model=model, args=args, callbacks=[meter],
                 train_dataset=bench._Batches(3 * B, S, model.config.vocab_size, True, batch=B))
    est = estimate_trainer(tr, device="cuda")
    assert est.sources["checkpoint_offload"][0] is True
    tr.train()
    _check(est, meter, f"offload, every_n_layers={every}")


@pytest.mark.parametrize("lora", [False, True])
def test_trl_activation_offloading_on_cuda(tmp_path, lora):
    trl = pytest.importorskip("trl")
    import trl.trainer.sft_trainer as sft
    from datasets import Dataset
    from peft import LoraConfig

    from kit import data

    meter = CudaSteps()
    build = sft.get_act_offloading_ctx_manager

    def counted(model, **kw):   # OffloadActivations as shipped; the host copies its pack makes counted
        ctx = build(model, **kw)
        ids = {}
        inner = ctx.pack_hook

        def pack(t):
            i = inner(t)
            entry = ctx.tracker[i]
            if entry[1] and i not in ids:
                ids[i] = True
                meter.made += entry[0].untyped_storage().nbytes()
            return i

        ctx.pack_hook = pack
        return ctx

    sft.get_act_offloading_ctx_manager = counted
    try:
        torch.manual_seed(0)
        rows = Dataset.from_dict({"input_ids": [[5 + (i * 7 + j) % 40000 for j in range(2048)] for i in range(24)]})
        args = trl.SFTConfig(output_dir=str(tmp_path), bf16=True, report_to="none", max_steps=3,
                             per_device_train_batch_size=8, save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, learning_rate=1e-4, optim="adamw_torch", max_length=2048,
                             gradient_checkpointing=True, activation_offloading=True)
        tr = trl.SFTTrainer(model=models.build_model(MODEL, device="cuda"), args=args, train_dataset=rows,
                            processing_class=data.shipped_tokenizer(), callbacks=[meter],
                            peft_config=LoraConfig(r=16, target_modules=["q_proj", "v_proj"]) if lora else None)
        est = estimate_trainer(tr, device="cuda")
        assert est.sources["activation_offloading"][0] is True
        tr.train()
    finally:
        sft.get_act_offloading_ctx_manager = build
    _check(est, meter, f"TRL activation_offloading{', LoRA' if lora else ''}")
