"""Predicted against measured training memory, over a grid of setups.

Run: ``python benchmarks/estimate_vs_measured.py [--out benchmarks/results/DATE-DEVICE.md]``;
``--families [--out benchmarks/results/families-DATE-DEVICE.md]`` runs the family grid instead: each
replay family's tiny twin (``kit/configs/tiny-<family>.json``) under the same setups (on a GPU, with
mixed-precision setups added).

- With a CUDA GPU: each setup trains real Trainer steps on an architecture twin at real
  size and reads ``torch.cuda.max_memory_allocated()`` (through ``kit.measure.device``) over the
  steady-state steps; the prediction is ``estimate(..., device="cuda", gpu=<the preset of its architecture>)``.
- Without one (a CPU): the CUDA allocator does not exist, so this measures what a CPU
  can measure honestly, on real Trainer steps of tiny twins (and one real-size twin):
  * ``peak``: the most bytes held by tensors at any moment of a training step, counted by
    :class:`kit.measure.tensor_peak.TensorPeak` (a ``TorchDispatchMode`` that adds every storage an aten op
    creates and subtracts it when freed) on top of the weights and optimizer state
    alive when the step starts. This is the CPU analogue of max_memory_allocated; it is
    compared with ``estimate(..., device="cpu")``, which models CPU kernels.
  * ``saved``: the bytes autograd saves for backward, by ``saved_tensors_hooks``.
  * ``weights/grads/state``: ``kit.measure.device.live_tensor_bytes`` around real steps.
  It also times an estimate of a cached model (the widget calls it on every change).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import sys
import time

from results_file import OUT_HELP, write_table

from kit import machine

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402


def _with_quant_state(t):
    """A parameter and the tensors bitsandbytes keeps beside it (4-bit absmax and codes, 8-bit scales)."""
    yield t
    qs = getattr(t, "quant_state", None)
    for q in (qs, getattr(qs, "state2", None)):
        for name in ("absmax", "code", "offset"):
            yield getattr(q, name, None)
    yield getattr(t, "SCB", None)


def _int8_states(model):
    """The int8 weights and row scales a Linear8bitLt moves from its weight to ``layer.state`` at its first
    forward (``init_8bit_state``: then ``weight.SCB`` is None, and the scales live only there)."""
    for m in model.modules():
        st = getattr(m, "state", None)
        if type(st).__name__ == "MatmulLtState":
            yield from (t for t in (st.CB, st.SCB) if t is not None)


def _held_bytes(*groups) -> int:
    """Bytes of the unique storages of the tensors given (weights, buffers, optimizer state)."""
    seen = {}
    for group in groups:
        for t in (x for g in group for x in _with_quant_state(g)):
            if isinstance(t, torch.Tensor) and not t.is_meta and t.device.type == "cpu":
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _state_tensors(optimizer):
    opt = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


class _Batches(torch.utils.data.Dataset):
    def __init__(self, n, S, V, padded, seed=0, batch=2):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, V, (n, S), generator=g)
        self.mask = torch.ones_like(self.ids)
        if padded:  # every other row of each batch ends in padding, so transformers builds a mask in every
            # batch (batch 1 too: there every row is padded, or the measured steady step would have no mask)
            self.mask[torch.arange(n) % batch % 2 == 0, -max(1, S // 4):] = 0
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        labels = self.ids[i].masked_fill(self.mask[i] == 0, -100)
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": labels}


def _ckpt_kw(on: bool) -> dict:
    from transformers import TrainingArguments

    name = "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__ \
        else "gradient_checkpointing"
    return {name: on}


class StepPeaks(TrainerCallback):
    """Each optimizer step's exact CPU peak: the ``kit.measure.tensor_peak.TensorPeak`` rise over the step, plus what
    is held when it begins: the weights (with bitsandbytes' quantized state), buffers and optimizer state, and the
    weights and buffers of the modules in ``also`` (a DPO reference model). ``peaks``: one per step; ``base`` and
    ``m`` (the open TensorPeak, None between steps) are there for a caller that watches part of a step."""

    def __init__(self, also=()):
        self.peaks, self.also, self.m = [], [m for m in also if m is not None], None

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
        from kit.measure.tensor_peak import TensorPeak

        self.base = _held_bytes(model.parameters(), model.buffers(), _int8_states(model), _state_tensors(optimizer),
                                *(g for m in self.also for g in (m.parameters(), m.buffers())))
        self.m = TensorPeak()
        self.m.__enter__()

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
        self.m.__exit__(None, None, None)
        self.peaks.append(self.base + self.m.peak_bytes - self.m.start_bytes)
        self.m = None


def step_peaks(trainer) -> list:
    """Train ``trainer`` and return each optimizer step's exact CPU peak (:class:`StepPeaks`)."""
    meter = StepPeaks()
    trainer.add_callback(meter)
    trainer.train()
    return meter.peaks


def trainer_peak(model, *, B, S, V, steps=3, optim="adamw_torch", padded=False, ckpt=False, accum=1,
                 precision="fp32", cuda=False, workdir="/tmp/kit-bench/out", **more) -> dict:
    """Real Trainer steps; the peak of each steady-state step (the first creates the optimizer state).
    ``more``: further TrainingArguments (``use_liger_kernel=True``, ...).

    On CUDA: ``torch.cuda.max_memory_allocated`` per step (kit.measure.device.reset_peak /
    peak_allocated_bytes). On a CPU: the ``kit.measure.tensor_peak.TensorPeak`` rise plus the weights and
    optimizer state held when the step begins.
    """
    from transformers import Trainer, TrainingArguments

    from kit.measure import device

    held = {}

    class Meter(StepPeaks):
        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
            if cuda:
                device.reset_peak()
                return
            super().on_step_begin(args, state, control, model=model, optimizer=optimizer, **kw)

        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            if cuda:
                self.peaks.append(device.peak_allocated_bytes())
                return
            super().on_step_end(args, state, control, model=model, optimizer=optimizer, **kw)
            held["weights"] = _held_bytes(model.parameters(), model.buffers(), _int8_states(model))
            held["state"] = _held_bytes(_state_tensors(optimizer))

    optim_args = "momentum=0.9" if optim == "sgd" else None
    args = TrainingArguments(
        output_dir=workdir, per_device_train_batch_size=B, max_steps=steps, use_cpu=not cuda,
        report_to=[], save_strategy="no", logging_strategy="no", optim=optim, optim_args=optim_args,
        learning_rate=1e-4, gradient_accumulation_steps=accum, dataloader_num_workers=0, disable_tqdm=True,
        fp16=precision == "fp16", bf16=precision == "bf16", **_ckpt_kw(ckpt), **more)
    trainer = Trainer(model=model, args=args, train_dataset=_Batches(steps * B * accum, S, V, padded, batch=B),
                      callbacks=[meter := Meter()])
    trainer.train()
    del trainer
    gc.collect()
    peaks = meter.peaks
    return {"peak": max(peaks[1:] or peaks), "first_step_peak": peaks[0], **held}


def autocast_step_peak(model, *, B, S, V, dtype, steps=2, padded=True, optim="adamw_torch_fused") -> dict:
    """Hand-written training steps on the CPU under ``torch.autocast("cpu", dtype=dtype)``: forward, loss,
    backward, optimizer step, ``zero_grad(set_to_none=True)`` (Trainer's loop without Trainer, which ignores
    fp16 on a CPU). The peak of each step after the first: the ``TensorPeak`` rise (the batch is made inside
    it) on top of the weights, buffers and optimizer state held when the step begins.
    """
    from kit.measure import tensor_peak

    if getattr(model, "config", None) is not None:
        model.config.use_cache = False
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True) if optim == "adamw_torch_fused" else \
        torch.optim.AdamW(params, lr=1e-4, foreach=False)
    g = torch.Generator().manual_seed(0)
    peaks = []
    for _ in range(steps):
        base = _held_bytes(model.parameters(), model.buffers(), _state_tensors(opt))
        with tensor_peak.TensorPeak() as m:
            ids = torch.randint(2, V, (B, S), generator=g)
            mask = torch.ones_like(ids)
            if padded:
                mask[::2, -max(1, S // 4):] = 0
            labels = ids.masked_fill(mask == 0, -100)
            with torch.autocast("cpu", dtype=dtype):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, ids, mask, labels
        peaks.append(base + m.peak_bytes - m.start_bytes)
    return {"peak": max(peaks[1:] or peaks), "first_step_peak": peaks[0],
            "weights": _held_bytes(model.parameters(), model.buffers()), "state": _held_bytes(_state_tensors(opt))}


def cpu_trainer_peak(model, **kw) -> dict:
    """:func:`trainer_peak` on the CPU (used by tests/test_estimate.py)."""
    return trainer_peak(model, cuda=False, **kw)


# ---- the grid ------------------------------------------------------------------------
# (label, registry name, estimate kwargs[, config overrides]). The same setup is built and trained.
SMALL_VOCAB = {"vocab_size": 256, "n_layer": 4, "num_hidden_layers": 4}
CPU_GRID = [
    ("full FT fp32, sdpa", "tiny-gpt2", dict(batch_size=4, seq_len=64, padded=False)),
    ("full FT fp32, eager, padded", "tiny-gpt2", dict(batch_size=4, seq_len=64, attn_implementation="eager")),
    ("full FT fp32, checkpointing", "tiny-gpt2", dict(batch_size=4, seq_len=128, gradient_checkpointing=True)),
    ("full FT fp32, long seq (eager S^2)", "tiny-gpt2", dict(batch_size=2, seq_len=256,
                                                               attn_implementation="eager", padded=False)),
    ("full FT fp32, padded sdpa", "tiny-llama", dict(batch_size=4, seq_len=64)),
    ("full FT fp32, eager, long seq", "tiny-llama", dict(batch_size=2, seq_len=256,
                                                         attn_implementation="eager", padded=False)),
    ("full FT fp32, checkpointing", "tiny-llama", dict(batch_size=8, seq_len=128, gradient_checkpointing=True)),
    ("full FT bf16 weights", "tiny-llama", dict(batch_size=4, seq_len=64, load_dtype="bf16")),
    ("full FT, grad accum 2", "tiny-llama", dict(batch_size=2, seq_len=64, grad_accum=2)),
    ("full FT, SGD momentum", "tiny-gpt2", dict(batch_size=4, seq_len=64, optimizer="sgd")),
    ("full FT, 8-bit AdamW", "tiny-llama", dict(batch_size=4, seq_len=64, optimizer="adamw-8bit")),
    ("LoRA r8 q,v", "tiny-llama", dict(batch_size=4, seq_len=64, lora_r=8, lora_targets=["q_proj", "v_proj"])),
    ("LoRA r8 c_attn, checkpointing", "tiny-gpt2", dict(batch_size=4, seq_len=64, lora_r=8,
                                                           gradient_checkpointing=True)),
    ("QLoRA 4-bit r8 (bnb CPU)", "tiny-llama", dict(batch_size=2, seq_len=64, quantization="4bit", lora_r=8)),
    ("scenario 1 twin (vocab head)", "tiny-gpt2+vocab-head", dict(batch_size=2, seq_len=64)),
    ("small vocab: a block sets the peak, eager", "tiny-llama", dict(batch_size=2, seq_len=256, padded=False,
                                                                   attn_implementation="eager"), SMALL_VOCAB),
    ("small vocab: a block sets the peak", "tiny-gpt2", dict(batch_size=4, seq_len=128, gradient_checkpointing=True),
     SMALL_VOCAB),
    ("REAL SIZE full FT fp32", "distilgpt2", dict(batch_size=1, seq_len=64)),
]
GPU_GRID = [
    ("full FT fp32", "distilgpt2", dict(batch_size=8, seq_len=512)),
    ("full FT fp16 mixed", "distilgpt2", dict(batch_size=8, seq_len=512, precision="fp16")),
    ("full FT bf16 mixed, checkpointing", "gpt2", dict(batch_size=8, seq_len=1024, precision="bf16",
                                                         gradient_checkpointing=True)),
    ("full FT fp32, batch 16", "gpt2", dict(batch_size=16, seq_len=256)),
    ("full FT bf16 mixed", "meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=512, precision="bf16")),
    ("full FT bf16 mixed, checkpointing", "meta-llama/Llama-3.2-1B",
     dict(batch_size=8, seq_len=1024, precision="bf16", gradient_checkpointing=True)),
    ("LoRA r16 bf16 mixed", "meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=1024, precision="bf16",
                                                            lora_r=16, load_dtype="bf16")),
    ("QLoRA 4-bit r16", "meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=1024, precision="bf16",
                                                        quantization="4bit", lora_r=16)),
    ("scenario 1 (fp16, as the user ran it)", "distilgpt2+vocab-head",
     dict(batch_size=1, seq_len=128, precision="fp16")),
]
# fp32 with grouped-query heads and no mask: torch 2.13's rules (the kit's, read from source) take SDPA's math path;
# if the GPU takes the memory-efficient kernel instead, the measured peak is the figure without an architecture.
# Run on a GPU only (the CPU report's GPU predictions list GPU_GRID).
KERNEL_ROWS = [
    ("full FT fp32, GQA unpadded: SDPA math or efficient?", "HuggingFaceTB/SmolLM2-360M-Instruct",
     dict(batch_size=8, seq_len=512, padded=False)),
]


# ---- the family grid: one tiny twin per replay family, the same setups on each --------------------
# Each row trains real Trainer steps on the twin (on the CPU; with a GPU, on it, plus mixed-precision rows);
# kit.estimate.replay has one block replay per family.
FAMILY_TWINS = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-olmo2", "tiny-phi3",
                "tiny-gemma2", "tiny-gemma3", "tiny-gpt-neox")
BLOCKS_VOCAB = {"vocab_size": 256}  # a small vocabulary: the blocks, not the logits, set the peak
FAMILY_SETUPS = [  # (label, estimate kwargs[, config overrides])
    ("full FT, sdpa", dict(batch_size=4, seq_len=128)),
    ("full FT, eager", dict(batch_size=4, seq_len=128, attn_implementation="eager")),
    ("full FT, checkpointing", dict(batch_size=4, seq_len=128, gradient_checkpointing=True)),
    ("full FT, bf16 weights", dict(batch_size=4, seq_len=128, load_dtype="bf16")),
    ("LoRA r8 (default targets)", dict(batch_size=4, seq_len=128, lora_r=8)),
    ("LoRA r8, enable_input_require_grads", dict(batch_size=4, seq_len=128, lora_r=8, input_require_grads=True)),
    ("LoRA r8 all-linear, eager", dict(batch_size=4, seq_len=128, lora_r=8, lora_targets="all-linear",
                                       attn_implementation="eager")),
    ("QLoRA 4-bit r8", dict(batch_size=4, seq_len=128, quantization="4bit", lora_r=8)),
    ("vocab 256, sdpa, unpadded", dict(batch_size=4, seq_len=128, padded=False), BLOCKS_VOCAB),
    ("vocab 256, eager", dict(batch_size=4, seq_len=128, attn_implementation="eager"), BLOCKS_VOCAB),
]
FAMILY_CUDA_SETUPS = [  # with a GPU, mixed precision too (CPU autocast follows other op lists than CUDA's)
    ("bf16 mixed, sdpa", dict(batch_size=4, seq_len=128, precision="bf16")),
    ("fp16 mixed, eager, checkpointing", dict(batch_size=4, seq_len=128, precision="fp16",
                                              attn_implementation="eager", gradient_checkpointing=True)),
    ("bf16 mixed, LoRA r8 all-linear", dict(batch_size=4, seq_len=128, precision="bf16", lora_r=8,
                                            lora_targets="all-linear")),
    ("bf16 mixed, QLoRA 4-bit r8", dict(batch_size=4, seq_len=128, precision="bf16", quantization="4bit", lora_r=8)),
    ("bf16 mixed, vocab 256, unpadded", dict(batch_size=4, seq_len=128, precision="bf16", padded=False),
     BLOCKS_VOCAB),
]


# Qwen-3 at other shapes (head_dim apart from hidden / heads, few kv heads, longer rows, a small vocabulary so
# that the blocks set the peak), full fine-tuning, LoRA and checkpointing: an independent measurement once
# found one random Qwen-3 case with checkpointing 9.4% low; these keep such shapes in the grid.
QWEN3_SHAPES = [dict(hidden_size=h, num_attention_heads=nh, num_key_value_heads=kvh, head_dim=hd, intermediate_size=f,
                     vocab_size=256) for h, nh, kvh, hd, f in ((64, 8, 4, 32, 352), (32, 2, 1, 64, 352),
                                                              (128, 2, 2, 16, 352), (192, 2, 1, 64, 352))]
QWEN3_SETUPS = [(f"qwen3 {o['hidden_size']}h {o['num_attention_heads']}x{o['head_dim']} kv{o['num_key_value_heads']}, "
                 f"{what}", dict(batch_size=B, seq_len=S, **kw), o)
                for o, (B, S) in zip(QWEN3_SHAPES, ((2, 128), (4, 512), (1, 256), (1, 256)))
                for what, kw in (("full FT", {}), ("checkpointing", dict(gradient_checkpointing=True)),
                                 ("LoRA r8", dict(lora_r=8)),
                                 ("LoRA r8, checkpointing", dict(lora_r=8, gradient_checkpointing=True)))]


def family_grid(only=None, cuda=False) -> list:
    """Every (twin, setup) of the family grid: the rows of :func:`family_report`."""
    rows = []
    for name in FAMILY_TWINS:
        extra = QWEN3_SETUPS if name == "tiny-qwen3" else []
        for label, kw, *over in FAMILY_SETUPS + (FAMILY_CUDA_SETUPS if cuda else []) + extra:
            if only and only not in f"{name} {label}":
                continue
            r = run_row(label, name, kw, cuda, over[0] if over else None)
            r["twin"] = name
            saved = f"{_pct(r['est'].saved_bytes, r['saved']):+.2f}%" if r["saved"] else "n/a"
            print(f"{name:14s} {label:28s} predicted {r['est'].peak_bytes:>12,} measured {r['got']['peak']:>12,} "
                  f"({_pct(r['est'].peak_bytes, r['got']['peak']):+.2f}%), saved {saved} [{r['seconds']:.0f} s]",
                  flush=True)
            rows.append(r)
    return rows


def family_report(rows, cuda=False) -> str:
    import peft
    import transformers

    from kit.units import fmt_bytes

    where = torch.cuda.get_device_name(0) if cuda else "CPU"
    lines = [f"# Estimate vs measured, per replay family ({'GPU' if cuda else 'CPU'}, tiny twins)", "",
             f"- date: {datetime.date.today().isoformat()}",
             f"- device: {where}; hardware: {machine.hardware()}",
             f"- libraries: torch {torch.__version__}, transformers {transformers.__version__}, "
             f"peft {peft.__version__}",
             "- command: `python benchmarks/estimate_vs_measured.py --families`", "",
             ("Measured: `torch.cuda.max_memory_allocated()` over steady-state Trainer steps; predicted: "
              "`estimate(..., device=\"cuda\")`; the mixed-precision rows run on a GPU only. " if cuda else
              "Measured: the CPU allocation peak of real Trainer steps (`TensorPeak` on top of the weights and "
              "optimizer state, the steady-state step) and the bytes autograd saves in one forward "
              "(`saved_tensors_hooks`). Predicted: `estimate(..., device=\"cpu\")`. ") + "Each twin: 2 layers, "
             "hidden 128, vocab 4096 (`kit/configs/tiny-<family>.json`); the vocab-256 rows shrink the "
             "vocabulary so that the blocks, not the logits, set the peak. Batch 4 x 128 tokens, padded "
             "unless the row says so. Gemma-2 runs eager in every row (sdpa cannot soft-cap its attention). "
             "With checkpointing (and QLoRA, whose recipe turns it on) the estimate's saved bytes also hold "
             "the rotary cos/sin and the attention masks kept for the recompute, which are no saved tensors: "
             "that is the saved error of those rows (`tests/test_families.py` checks it to the byte).", "",
             "| family | twin | setup | estimated peak | measured peak | error | saved error | peak moment |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        e, g = r["est"], r["got"]
        saved = f"{_pct(e.saved_bytes, r['saved']):+.2f}%" if r["saved"] else "n/a"
        lines.append(f"| {_family(r['twin'])} | {r['twin']} | {r['label']} | {fmt_bytes(e.peak_bytes)} | "
                     f"{fmt_bytes(g['peak'])} | {_pct(e.peak_bytes, g['peak']):+.2f}% | {saved} | {e.peak_moment} |")
    labels = list(dict.fromkeys(r["label"] for r in rows))
    lines += ["", "Peak error (estimated / measured - 1), family x setup:", "",
              "| twin | " + " | ".join(labels) + " | worst |", "|---|" + "---:|" * (len(labels) + 1)]
    for name in dict.fromkeys(r["twin"] for r in rows):
        errs = {r["label"]: _pct(r["est"].peak_bytes, r["got"]["peak"]) for r in rows if r["twin"] == name}
        worst = max(errs.values(), key=abs)
        lines.append(f"| {name} | " + " | ".join(f"{errs[k]:+.2f}%" if k in errs else "" for k in labels)
                     + f" | {worst:+.2f}% |")
    errs = [abs(_pct(r["est"].peak_bytes, r["got"]["peak"])) for r in rows]
    lines += ["", f"Peak error: median {statistics.median(errs):.2f}%, worst {max(errs):.2f}% over {len(errs)} "
              "rows (CPU allocation meter, not a GPU).", ""]
    return "\n".join(lines) + "\n"


def _family(name):
    from kit.estimate.inventory import info_of

    return info_of(name).family


def _config(name, overrides):
    from kit.models import get_config

    cfg = get_config(name)
    for k, v in (overrides or {}).items():
        if k in cfg.to_dict():
            setattr(cfg, k, v)
    return cfg


def build(name, kw, cuda=False, overrides=None):
    """The model of one grid row, set up the way the estimate assumes."""
    from kit import models

    quant, lora_r = kw.get("quantization", "none"), kw.get("lora_r", 0)
    if overrides and quant == "none":
        model = models.build_model(_config(name, overrides))
    elif quant != "none" or cuda:
        bnb = models.bnb_config(quant, **{k: kw[k] for k in ("compute_dtype", "quant_type", "double_quant") if k in kw})
        model = models.load_model(name, quantization=bnb or "none", load_dtype=kw.get("load_dtype"),
                                  device="cuda" if cuda else "cpu")
    else:
        model = models.build_model(name, dtype=models.as_dtype(kw.get("load_dtype", "fp32")))
    attn = kw.get("attn_implementation", "sdpa")
    if attn == "eager" or getattr(model, "_supports_sdpa", True):  # Gemma-2 runs eager only (soft-capping)
        for mod in model.modules():
            if hasattr(mod, "config"):
                mod.config._attn_implementation = attn
    if quant != "none":
        from peft import prepare_model_for_kbit_training

        # (gradient_checkpointing=False: the recipe without its own checkpointing, so that none runs)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=kw.get("gradient_checkpointing")
                                                is not False)
    if lora_r:
        from peft import LoraConfig, get_peft_model

        from kit.estimate.inventory import default_targets, info_of

        if kw.get("input_require_grads"):  # as the estimate is told (its default: only with checkpointing, whose
            model.enable_input_require_grads()  # gradient_checkpointing_enable, or the k-bit recipe's, runs it)
        targets = kw.get("lora_targets") or list(default_targets(info_of(_config(name, overrides))))
        model = get_peft_model(model, LoraConfig(r=lora_r, target_modules=targets))  # peft has none for phi3
    return model


def run_row(label, name, kw, cuda, overrides=None):
    from kit.estimate import estimate
    from kit.measure.tensor_peak import saved_tensor_bytes
    from kit.presets import OPTIMIZERS

    torch.manual_seed(0)
    cfg = _config(name, overrides)
    gpu = gpu_preset() if cuda else None   # the estimate follows SDPA's kernel choice for this GPU's architecture
    est = estimate(cfg if overrides else name, **kw, device="cuda" if cuda else "cpu", gpu=gpu)
    # the figure without an architecture (flash / memory-efficient), where the kit's rules took the math path
    other = estimate(cfg if overrides else name, **kw, device="cuda") if est.setup.get("attention_kernel") else None
    model = build(name, kw, cuda, overrides)
    B, S, padded = kw["batch_size"], kw["seq_len"], kw.get("padded", True)
    V = cfg.vocab_size
    saved = None
    # checkpoint_reentrant (k-bit): the model's own checkpointing runs, of the kind the estimate says (the recipe's
    # is reentrant before peft 0.22 only), and the Trainer turns on none; else the Trainer's, non-reentrant
    reentrant = est.setup.get("checkpoint_reentrant", False)
    kind = {"gradient_checkpointing_kwargs": {"use_reentrant": True}} if reentrant else {}
    if est.setup["gradient_checkpointing"] and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(**kind)
    if not cuda:
        ids = torch.randint(2, V, (B, S))
        mask = torch.ones_like(ids)
        if padded:
            mask[::2, -max(1, S // 4):] = 0
        model.train()
        if getattr(model, "config", None) is not None:  # as Trainer sets it (TrainingArguments.use_cache=False):
            model.config.use_cache = False              # no DynamicCache copying k and v
        saved = saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": mask, "labels": ids})
    t = time.time()
    got = trainer_peak(model, B=B, S=S, V=V, steps=3 if cuda else 2, optim=OPTIMIZERS[est.setup["optimizer"]],
                       padded=padded, ckpt=est.setup["gradient_checkpointing"] and not reentrant,
                       accum=kw.get("grad_accum", 1), precision=kw.get("precision", "fp32"), cuda=cuda)
    del model
    gc.collect()
    if cuda:
        from kit.measure import device

        device.empty_cache()
    name = f"{name} ({', '.join(f'{k}={v}' for k, v in overrides.items() if k in cfg.to_dict())})" \
        if overrides else name
    return dict(label=label, model=name, est=est, got=got, saved=saved, seconds=time.time() - t, other=other)


def gpu_preset() -> str | None:
    """The kit's GPU preset of this GPU's architecture (its compute capability), for the attention kernel's rules;
    None where no preset has it."""
    from kit.presets import PRESETS

    capability = torch.cuda.get_device_capability(0)
    return next((name for name, p in PRESETS.items() if p.capability == capability), None)


def kernel_lines(rows) -> list:
    """Where the kit's rules took SDPA's math path: the measured peak beside both figures, which says the kernel."""
    from kit.units import fmt_bytes

    lines = []
    for r in (r for r in rows if r["other"] is not None):
        measured, math, fused = r["got"]["peak"], r["est"].peak_bytes, r["other"].peak_bytes
        nearer = "math" if abs(measured - math) < abs(measured - fused) else "flash / memory-efficient"
        lines.append(f"- {r['label']} ({r['model']}): measured {fmt_bytes(measured)}; SDPA's math path (the kit's "
                     f"rules) {fmt_bytes(math)}, flash / memory-efficient {fmt_bytes(fused)}: nearer {nearer}")
    return ["SDPA's kernel where torch 2.13's rules, read from source, take the math path:", *lines, ""] if lines \
        else []


def time_cached_estimate(n=200) -> dict:
    from kit.estimate import estimate

    out = {}
    for name, kw in (("meta-llama/Meta-Llama-3-8B", dict(batch_size=1, seq_len=512, quantization="4bit",
                                                         lora_r=16)),
                     ("distilgpt2+vocab-head", dict(batch_size=1, seq_len=128, precision="fp16"))):
        estimate(name, **kw)  # build and cache
        times = []
        for i in range(n):
            t = time.perf_counter()
            estimate(name, **kw | {"batch_size": 1 + i % 8})
            times.append(1000 * (time.perf_counter() - t))
        out[name] = (statistics.median(times), max(times))
    return out


def _pct(pred, got):
    return 100.0 * (pred - got) / got if got else float("nan")


def report(rows, timing, cuda) -> str:
    import bitsandbytes
    import peft
    import transformers

    from kit.units import fmt_bytes

    hw = machine.hardware()
    lines = [f"# Estimate vs measured ({'GPU' if cuda else 'CPU, no GPU available'})", "",
             f"- date: {datetime.date.today().isoformat()}",
             f"- device: {torch.cuda.get_device_name(0) if cuda else 'CPU'}; hardware: {hw}",
             f"- libraries: torch {torch.__version__}, transformers {transformers.__version__}, "
             f"peft {peft.__version__}, bitsandbytes {bitsandbytes.__version__}",
             "- command: `python benchmarks/estimate_vs_measured.py`", ""]
    if cuda:
        lines += ["Measured: `torch.cuda.max_memory_allocated()` over steady-state Trainer steps (step 2 on), "
                  "real-size architecture twins. Predicted: `estimate(..., device=\"cuda\", gpu=<this GPU's "
                  "preset>)`.", ""]
    else:
        lines += [
            "**No GPU was available.** Nothing here measures `torch.cuda.max_memory_allocated()`. What was "
            "measured instead, on real Trainer steps on the CPU (tiny twins, plus distilgpt2 at real size):",
            "- *peak*: bytes held by tensors at the busiest moment of a steady-state step: an aten-level "
            "allocation meter (TorchDispatchMode + storage finalizers) on top of the weights and optimizer "
            "state held when the step starts; compared with `estimate(..., device=\"cpu\")`, which models the "
            "CPU kernels (float dropout masks, sdpa's math path with dropout, single-tensor AdamW);",
            "- *saved*: bytes autograd saves in one training forward (`saved_tensors_hooks`, unique storages);",
            "- *weights*, *state*: weights/buffers and optimizer state held after the steps.",
            "Mixed precision (autocast) is not in the CPU grid: CPU autocast uses other op lists than CUDA's, "
            "which the estimate models. Those rows need a GPU run.", ""]
    head = "| setup | model | predicted peak | measured peak | error |"
    sep = "|---|---|---:|---:|---:|"
    if not cuda:
        head += " saved pred/meas | weights pred/meas | state pred/meas |"
        sep += "---:|---:|---:|"
    lines += [head, sep]
    errs = []
    for r in rows:
        e, g = r["est"], r["got"]
        err = _pct(e.peak_bytes, g["peak"])
        errs.append(abs(err))
        line = f"| {r['label']} | {r['model']} | {fmt_bytes(e.peak_bytes)} | {fmt_bytes(g['peak'])} | {err:+.1f}% |"
        if not cuda:
            line += (f" {_pct(e.saved_bytes, r['saved']):+.1f}% | {_pct(e.weights_bytes, g['weights']):+.1f}% |"
                     f" {_pct(e.optimizer_bytes, g['state']):+.1f}% |")
        lines.append(line)
    lines += ["", f"Peak error: median {statistics.median(errs):.2f}%, worst {max(errs):.2f}% "
              f"over {len(errs)} setups ({'GPU' if cuda else 'CPU allocation meter, not a GPU'}).", ""]
    lines += kernel_lines(rows)
    if not cuda:
        from kit.estimate import estimate

        lines += ["What the GPU grid predicts (`estimate(..., device=\"cuda\")`), NOT measured here: "
                  "the rows a GPU run of this script checks against `max_memory_allocated`.", "",
                  "| setup | model | predicted peak | phase (moment) |", "|---|---|---:|---|"]
        for label, name, kw in GPU_GRID:
            e = estimate(name, **kw)
            lines.append(f"| {label} | {name} | {fmt_bytes(e.peak_bytes)} | {e.peak_phase} ({e.peak_moment}) |")
        lines.append("")
    lines += ["Time of one estimate for a cached model (the widget calls it on every slider move):"]
    for name, (med, worst) in timing.items():
        lines.append(f"- {name}: median {med:.2f} ms, worst {worst:.2f} ms")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import tempfile


    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help=OUT_HELP)
    p.add_argument("--only", default=None, help="run the rows whose label contains this")
    p.add_argument("--families", action="store_true",
                   help="the family grid instead: every replay family's tiny twin x the same setups (CPU)")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="kit-bench-")
    os.environ.setdefault("KIT_CACHE", os.path.join(tmp, "twins"))
    os.environ.setdefault("HF_HOME", os.path.join(tmp, "hf"))
    cuda = machine.has_cuda()
    if a.families:
        return _publish(family_report(family_grid(a.only, cuda), cuda), a.out, "families", cuda)
    grid = [g for g in (GPU_GRID + KERNEL_ROWS if cuda else CPU_GRID) if not a.only or a.only in g[0] + g[1]]
    if cuda and not a.only:  # the CPU grid's twins too: cheap, and they cover more code paths
        grid += [g for g in CPU_GRID if "REAL SIZE" not in g[0]]
    rows = []
    for label, name, kw, *over in grid:
        r = run_row(label, name, kw, cuda, over[0] if over else None)
        print(f"{label:40s} {name:24s} predicted {r['est'].peak_bytes:>14,} measured {r['got']['peak']:>14,} "
              f"({_pct(r['est'].peak_bytes, r['got']['peak']):+.2f}%) [{r['seconds']:.0f} s]", flush=True)
        rows.append(r)
    return _publish(report(rows, time_cached_estimate(), cuda), a.out, "estimate_vs_measured", cuda)


def _publish(text: str, out: str | None, name: str, cuda: bool) -> int:
    """Print the table, and write it where ``--out`` says (:func:`results_file.write_table`)."""
    print(text)
    write_table(text, out, name, "cuda" if cuda else "cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
