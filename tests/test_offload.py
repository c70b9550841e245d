"""Partial and offloaded checkpointing (transformers 5.24's ``activation_checkpointing_kwargs`` ``every_n_layers`` and
``offload``) and TRL 1.16's ``SFTConfig.activation_offloading``, measured on real Trainer / SFTTrainer steps of tiny
CPU twins beside ``estimate_trainer(..., device="cpu")`` (rules: kit.estimate.replay.offload, .trl_offload).

- ``every_n_layers`` changes CPU memory as it changes a GPU's: the measured peaks (TensorPeak on top of the weights
  and optimizer state, as tests/test_trl.py) are within 2% of the estimate, step 1 and the steady steps.
- ``offload=True`` and ``activation_offloading`` do not run on a CPU as shipped (both need an accelerator: see
  benchmarks/offload_meter.py, which gives each offloader the one stand-in it needs and runs its own code). On a
  CPU the host is the device, so the split shows only where the copies are counted apart: ``SplitPeak`` counts what
  the offloader's pack makes as host copies. The source implies, and the tests assert: the host copies alive at once
  are ``offloaded_bytes`` exactly; the rest (the device's bytes, less the copies brought back, which on a CPU are
  the host tensors themselves) and the sum are within 2% of the estimate's (``kit.estimate.replay.cpu_figures``).
  tests/test_gpu_offload.py reads ``max_memory_allocated()`` on a GPU.

Run with ``-s`` to print the ratios.
"""
import os
import sys
import warnings

import pytest
import torch
from transformers import Trainer, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402
import offload_meter as om  # noqa: E402

from kit import inputs, models  # noqa: E402
from kit.estimate import estimate, estimate_from, estimate_trainer  # noqa: E402
from kit.model_configs import get_config  # noqa: E402

warnings.filterwarnings("ignore")

# estimate() without the new options, recorded before they existed: byte for byte the same
BEFORE = [
    ("meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=2048, precision="bf16"), 48349962496, 38463447296),
    ("meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=2048, precision="bf16", gradient_checkpointing=True),
     29222887680, 19773030656),
    ("meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=2048, load_dtype="bf16", gradient_checkpointing=True,
                                     fused_lm_head=True), 11092173056, 9886515456),
    ("meta-llama/Llama-3.2-1B", dict(batch_size=2, seq_len=1024, quantization="4bit", lora_r=16), 5013421760,
     4999790272),
    ("Qwen/Qwen2.5-0.5B", dict(batch_size=2, seq_len=512, lora_r=8, gradient_checkpointing=True, precision="bf16"),
     4214451968, 4210126592),
    ("google/gemma-2-2b", dict(batch_size=1, seq_len=4096, precision="bf16", gradient_checkpointing=True,
                               padded=False), 50401850372, 41829471236),
    ("gpt2", dict(batch_size=8, seq_len=512), 8399186944, 7403668480),
    ("tiny-llama", dict(batch_size=4, seq_len=64, device="cpu", gradient_checkpointing=True), 31181440, 23865472),
    ("tiny-gemma3", dict(batch_size=2, seq_len=64, device="cpu", padded=False), 20519684, 14045444),
]


@pytest.mark.parametrize("model,kw,peak,first", BEFORE)
def test_estimates_without_the_options_are_unchanged(model, kw, peak, first):
    est = estimate(model, **kw)
    assert (est.peak_bytes, est.first_step_peak_bytes, est.offloaded_bytes) == (peak, first, 0)
    assert est.to_json()["offloaded_bytes"] == 0


def _config(model, L, V):
    cfg = get_config(model)
    cfg.num_hidden_layers, cfg.vocab_size = L, V
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = (list(cfg.layer_types) * L)[:L]
    return cfg


def _trainer(tmp_path, L, every=1, offload=False, model="tiny-llama", B=4, S=128, V=512, lora=False):
    """A real Trainer on a twin of L blocks; the vocabulary is small so that the blocks weigh."""
    torch.manual_seed(0)
    kw = dict({"every_n_layers": every} if every != 1 else {}, **({"offload": True} if offload else {}))
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=B, max_steps=3, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", optim="adamw_torch",
                             learning_rate=1e-4, dataloader_num_workers=0, disable_tqdm=True,
                             activation_checkpointing=True, activation_checkpointing_kwargs=kw or None)
    m = models.build_model(_config(model, L, V))
    if lora:   # (checkpointing then runs enable_input_require_grads: the embeddings' output is a leaf)
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return Trainer(model=m, args=args, train_dataset=bench._Batches(3 * B, S, V, True, batch=B))


@pytest.mark.parametrize("L,every", [(4, 2), (5, 2), (6, 3)])
def test_every_n_layers_matches_a_real_trainer_step(tmp_path, L, every):
    tr = _trainer(tmp_path, L, every)
    est = estimate_trainer(tr, device="cpu")
    assert est.sources["ckpt_every_n_layers"][0] == every and inputs.has_note(est.notes, "ckpt-every-n-layers")
    assert [l.ckpt for l in est.context.rp.layers] == [i % every == 0 for i in range(L)]
    got = bench.step_peaks(tr)
    steady, first = est.peak_bytes / max(got[1:]), est.first_step_peak_bytes / got[0]
    print(f"every_n_layers={every}, {L} blocks: estimate/measured steady {steady:.4f}, step 1 {first:.4f} "
          f"({est.peak_moment})")
    assert 0.98 <= steady <= 1.02 and 0.98 <= first <= 1.02, (est.peak_moment, est.peak_bytes, got)
    full = estimate_trainer(_trainer(tmp_path, L), device="cpu")
    assert full.peak_bytes < est.peak_bytes   # the unchecked blocks keep their activations


def _check_split(est, got, label):
    for first, step in ((True, got[0]), (False, max(got[1:], key=lambda s: s["total"]))):
        want = om.expected(est, first=first)
        r = {k: want[k] / step[k] for k in ("device", "total")}
        print(f"{label}, {'step 1' if first else 'steady'}: estimate/measured device {r['device']:.4f}, device + host "
              f"{r['total']:.4f}; host {step['host']} bytes (estimate {est.offloaded_bytes})")
        assert all(0.98 <= v <= 1.02 for v in r.values()), (label, first, want, step)
        assert step["host"] == want["host"] == est.offloaded_bytes, (label, step, est.offloaded_bytes)
        assert step["made"] == est.offloaded_bytes   # every copy made in a step is alive at the forward's end


@pytest.mark.parametrize("model,L,every,lora", [("tiny-llama", 4, 1, False), ("tiny-llama", 5, 2, False),
                                                ("tiny-gpt2", 4, 1, False), ("tiny-llama", 4, 1, True)])
def test_checkpoint_offload_on_a_real_trainer_step(tmp_path, model, L, every, lora):
    """offload=True: save_on_cpu's copies of each checkpointed block's positional arguments (the hidden states;
    GPT-2's mask too, one copy per block) are offloaded_bytes; the rest of the step matches the estimate. With LoRA
    block 1's input is a leaf (enable_input_require_grads), which autograd keeps on the device though copied."""
    tr = _trainer(tmp_path, L, every, offload=True, model=model, lora=lora)
    est = estimate_trainer(tr, device="cpu")
    assert est.sources["checkpoint_offload"][0] is True and inputs.has_note(est.notes, "checkpoint-offload")
    T, H = 4 * 128, tr.model.config.hidden_size
    n = -(-L // every)
    assert est.offloaded_bytes == n * (T * H * 4 + (4 * 128 * 128 if model == "tiny-gpt2" else 0))
    with om.save_on_cpu_unpinned():
        got = om.measure(tr)
    _check_split(est, got, f"offload, {model}{', LoRA' if lora else ''}, every_n_layers={every}")


def _sft(tmp_path, model="tiny-llama", L=4, packing=True, lora=False):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from kit import data

    torch.manual_seed(0)
    ids = [[5 + (i * 7 + j) % 4000 for j in range(40 if i % 2 else 24)] for i in range(32)]
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=3,
                     per_device_train_batch_size=4, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                     learning_rate=1e-4, activation_offloading=True, max_length=64, packing=packing)
    return SFTTrainer(model=models.build_model(_config(model, L, 4096)), args=args,
                      train_dataset=Dataset.from_dict({"input_ids": ids}), processing_class=data.shipped_tokenizer(),
                      peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if lora else None)


TRL_CASES = {
    "llama, packed": dict(),
    "llama, padded rows": dict(packing=False),
    "llama, LoRA": dict(lora=True),
    "gpt2 (layer norm, positional mask)": dict(model="tiny-gpt2"),
    "olmo2 (fp32 norm)": dict(model="tiny-olmo2"),
}


@pytest.mark.parametrize("label", list(TRL_CASES))
def test_trl_activation_offloading_on_a_real_sft_step(tmp_path, label):
    """TRL's OffloadActivations, its own pack / stash / dedup / unpack code on the CPU (use_streams, the SFTTrainer
    default): its host copies are offloaded_bytes exactly; the rest of the step matches the estimate."""
    pytest.importorskip("trl")
    with om.trl_on_cpu():
        tr = _sft(tmp_path, **TRL_CASES[label])
        est = estimate_trainer(tr, device="cpu")
        got = om.measure(tr)
    assert est.sources["activation_offloading"][0] is True and inputs.has_note(est.notes, "trl-activation-offloading")
    _check_split(est, got, f"TRL activation_offloading, {label}")


def test_what_the_objects_say_is_read(tmp_path):
    args = TrainingArguments(output_dir="unused", activation_checkpointing=True,
                             activation_checkpointing_kwargs={"every_n_layers": 3, "offload": True})
    est = estimate_from("tiny-llama", args, seq_len=64)
    assert est.sources["ckpt_every_n_layers"] == (3, "TrainingArguments.activation_checkpointing_kwargs"
                                                     "['every_n_layers']")
    assert est.sources["checkpoint_offload"][0] is True and est.setup["checkpoint_offload"] is True
    assert est.sources["checkpoint_reentrant"][0] is False   # the rest of the kwargs: none, so use_reentrant=False
    off = estimate_from("tiny-llama", TrainingArguments(output_dir="unused", activation_checkpointing_kwargs={
        "every_n_layers": 3}), seq_len=64)   # without activation_checkpointing Trainer ignores the kwargs
    assert "ckpt_every_n_layers" not in off.sources and off.offloaded_bytes == 0
    # a model whose checkpointing the user enabled: its layers' pattern and checkpoint function are read
    m = models.build_model(_config("tiny-llama", 4, 512))
    m.activation_checkpointing_enable(every_n_layers=2, offload=True)
    tr = Trainer(model=m, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]))
    est = estimate_trainer(tr, seq_len=32, device="cpu")
    assert est.sources["ckpt_every_n_layers"][0] == 2 and est.sources["checkpoint_offload"][0] is True
    assert est.offloaded_bytes == 2 * 8 * 32 * 128 * 4   # blocks 1 and 3, each its batch 8 x 32 x 128 fp32 input


def test_sft_config_activation_offloading_is_read():
    from trl import SFTConfig

    cfg = SFTConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", activation_offloading=True,
                    per_device_train_batch_size=2, max_length=128)
    est = estimate_from("tiny-llama", sft_config=cfg)
    assert est.sources["activation_offloading"][0] is True and est.offloaded_bytes > 0
    plain = estimate_from("tiny-llama", sft_config=SFTConfig(output_dir="unused", use_cpu=True, bf16=False,
                                                             report_to="none", per_device_train_batch_size=2,
                                                             max_length=128))
    assert plain.offloaded_bytes == 0 and est.activations_bytes < plain.activations_bytes


@pytest.mark.parametrize("kw,field,code", [
    (dict(activation_offloading=True, gradient_checkpointing=True), "activation_offloading", "trl-offloading"),
    (dict(activation_offloading=True, fused_lm_head=True, gradient_checkpointing=False), "activation_offloading",
     "trl-offloading"),
    (dict(activation_offloading=True, fused_lm_head=True, gradient_checkpointing=True, ckpt_every_n_layers=2),
     "activation_offloading", "trl-offloading"),
    (dict(activation_offloading=True, fused_lm_head=True, gradient_checkpointing=True, checkpoint_reentrant=True),
     "activation_offloading", "trl-offloading"),
    (dict(ckpt_every_n_layers=2), "ckpt_every_n_layers", "offload-needs-ckpt"),
    (dict(checkpoint_offload=True, gradient_checkpointing=False), "checkpoint_offload", "offload-needs-ckpt"),
    (dict(checkpoint_offload=True, gradient_checkpointing=True, strategy="ddp", num_gpus=2), "checkpoint_offload",
     "offload-one-gpu"),
    (dict(ckpt_every_n_layers=0, gradient_checkpointing=True), "ckpt_every_n_layers", None),
])
def test_what_is_not_modeled_is_refused_in_one_sentence(kw, field, code):
    with pytest.raises(inputs.InputError) as e:
        estimate("tiny-llama", batch_size=1, seq_len=32, **kw)
    assert e.value.name == field and (code is None or e.value.code == code), (e.value.name, e.value.code)
    assert str(e.value).count(". ") == 0


def test_real_size_figures_follow_the_rules():
    """Llama-3.2-1B full fine-tuning, bf16 weights and autocast, batch 4 x 2048: offload moves each checkpointed
    block's bf16 input (4 x 2048 x 2048 x 2 bytes) to the host; every_n_layers=2 checkpoints 8 of the 16 blocks."""
    m, kw = "meta-llama/Llama-3.2-1B", dict(batch_size=4, seq_len=2048, load_dtype="bf16", precision="bf16",
                                            gradient_checkpointing=True)
    one = 4 * 2048 * 2048 * 2
    ck, off = estimate(m, **kw), estimate(m, **kw, checkpoint_offload=True)
    assert off.offloaded_bytes == 16 * one and ck.activations_bytes - off.activations_bytes == 16 * one
    half = estimate(m, **kw, ckpt_every_n_layers=2, checkpoint_offload=True)
    assert half.offloaded_bytes == 8 * one and sum(l.ckpt for l in half.context.rp.layers) == 8
    none = estimate(m, batch_size=4, seq_len=2048, load_dtype="bf16", precision="bf16")
    assert ck.peak_bytes < estimate(m, **kw, ckpt_every_n_layers=2).peak_bytes < none.peak_bytes
    trl = estimate(m, **kw, fused_lm_head=True, activation_offloading=True)
    assert trl.offloaded_bytes > 16 * one and "pinned CPU RAM" in trl.table()


def test_the_flags(capsys):
    import argparse
    import json

    from kit.cli.estimate import register

    parser = argparse.ArgumentParser(prog="kit")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["estimate", "--model", "tiny-llama", "--batch-size", "2", "--seq-len", "64",
                              "--gradient-checkpointing", "--ckpt-every-n-layers", "2", "--checkpoint-offload",
                              "--json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["offloaded_bytes"] == 2 * 64 * 128 * 4 and data["setup"]["ckpt_every_n_layers"] == 2
