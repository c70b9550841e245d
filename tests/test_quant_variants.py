"""bitsandbytes variants against real Trainer steps on the CPU (tiny twins, offline), and the 8-bit finding.

- 4-bit: the BitsAndBytesConfig variants users write (FP4 / NF4, double quant off, fp32 / fp16 compute)
  give the same estimate as estimate(...)'s options, and that estimate is within 2% of the CPU peak of
  real Trainer steps (``benchmarks/estimate_vs_measured.py``'s ``run_row``: ``TensorPeak`` on top of the
  weights and optimizer state), with LoRA and checkpointing. Twins with a vocabulary of 256 put the peak in
  a block's backward, where the compute dtype changes the dequantization temporaries.
- 8-bit: bitsandbytes keeps each 8-bit layer's input as a ctx attribute (``kit.estimate.quantization``), so
  non-reentrant checkpointing cannot free it and it outlives its backward. Measured here on the CPU path
  (``MatMul8bitFp``); the CUDA path (``MatMul8bitLt``) keeps it the same way, which a test pins against
  the library's source and the arithmetic, not against a measurement.
"""
import functools
import inspect
import json
import os
import sys

import pytest
import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import BitsAndBytesConfig, Trainer, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit import data, models  # noqa: E402
from kit.estimate import (  # noqa: E402
    estimate,  # noqa: E402
    estimate_from,
    estimate_trainer,
)
from kit.estimate.inventory import info_of  # noqa: E402
from kit.estimate.quantization import recipe_reentrant  # noqa: E402
from kit.estimate.read_model import read_reentrant  # noqa: E402
from kit.inputs import InputError  # noqa: E402
from kit.model_configs import get_config  # noqa: E402
from kit.presets import nf4_bytes  # noqa: E402

LORA = dict(lora_r=8, lora_targets=["q_proj", "v_proj"])
FP4_FP32 = dict(quant_type="fp4", double_quant=False, compute_dtype="fp32")   # BitsAndBytesConfig's defaults
NF4_NODQ = dict(quant_type="nf4", double_quant=False)                           # (bf16 compute)
FIELDS = ("weights_bytes", "activations_bytes", "logits_bytes", "peak_bytes", "first_step_peak_bytes",
          "saved_bytes", "peak_moment", "components")


def _twin(tmp_dir, name, **over):
    """A config.json of ``name`` with ``over`` changed: load_model and estimate both take its path."""
    cfg = get_config(name)
    for k, v in over.items():
        setattr(cfg, k, v)
    folder = os.path.join(tmp_dir, f"{name}-" + "-".join(f"{k}{v}" for k, v in sorted(over.items())))
    cfg.save_pretrained(folder)
    return os.path.join(folder, "config.json")


def twin_paths(d):
    """tiny-llama with a vocabulary of 256 (a block sets the peak), and of 16384, tied or not (the logits do)."""
    return {"vocab256": _twin(d, "tiny-llama", vocab_size=256),
            "tied16k": _twin(d, "tiny-llama", vocab_size=16384, tie_word_embeddings=True),
            "untied16k": _twin(d, "tiny-llama", vocab_size=16384, tie_word_embeddings=False)}


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return twin_paths(str(tmp_path_factory.mktemp("twins")))


@functools.lru_cache(maxsize=None)
def _run(name, kw_json):
    torch.manual_seed(0)
    return bench.run_row("", name, json.loads(kw_json), False)


def measured(name, **kw):
    return _run(name, json.dumps(kw, sort_keys=True))


def ratio(r):
    return r["est"].peak_bytes / r["got"]["peak"]


# ---- 4-bit variants --------------------------------------------------------------------------------------
CKPT, RECIPE, NONE = dict(gradient_checkpointing=True), {}, dict(gradient_checkpointing=False)
ROWS_4BIT = [  # (twin, label, estimate options); LoRA r8 on q_proj, v_proj in every row
    ("tiny-llama", "FP4, no double quant, fp32 compute, Trainer checkpointing", FP4_FP32 | CKPT),
    ("tiny-llama", "NF4, no double quant, Trainer checkpointing", NF4_NODQ | CKPT),
    ("tiny-llama", "FP4, no double quant, fp32 compute, the recipe's checkpointing", FP4_FP32 | RECIPE),
    ("tiny-qwen2", "FP4, no double quant, fp32 compute, Trainer checkpointing", FP4_FP32 | CKPT),
    ("tiny-qwen2", "NF4, no double quant, Trainer checkpointing", NF4_NODQ | CKPT),
    ("tiny-gemma3", "NF4 + double quant, fp16 compute, Trainer checkpointing", dict(compute_dtype="fp16") | CKPT),
    ("vocab256", "FP4, no double quant, fp32 compute, Trainer checkpointing", FP4_FP32 | CKPT),
    ("vocab256", "NF4, no double quant, Trainer checkpointing", NF4_NODQ | CKPT),
    ("vocab256", "FP4, no double quant, fp32 compute, no checkpointing", FP4_FP32 | NONE),
]


@pytest.mark.parametrize("twin,label,kw", ROWS_4BIT, ids=[f"{t}: {l}" for t, l, _ in ROWS_4BIT])
def test_4bit_variant_peak_within_2_percent_of_a_cpu_trainer_step(twins, twin, label, kw):
    name = twins.get(twin, twin)
    r = measured(name, batch_size=4, seq_len=128 if twin == "vocab256" else 64, quantization="4bit", **LORA, **kw)
    assert 0.98 <= ratio(r) <= 1.02, (label, r["est"].peak_moment, r["est"].peak_bytes, r["got"]["peak"])
    # packed weights, absmax (fp32, or 8-bit + its own), codes; Gemma's 0-d embed_scale buffer loads bf16 (2 bytes)
    assert r["est"].weights_bytes == pytest.approx(r["got"]["weights"], abs=2)


def test_compute_dtype_where_a_block_sets_the_peak(twins):
    """With a vocabulary of 256 a block's backward sets the peak: there a 4-bit layer's backward dequantizes its
    weight in the load dtype (bf16) and, with fp32 compute, casts it up: 6 bytes per weight, not 2. The replay
    puts that at the layer's own backward, which is where the measured peak is not (it is in the MLP's grads):
    so both compute dtypes measure the same, and so do their estimates."""
    fp32, bf16 = (measured(twins["vocab256"], batch_size=4, seq_len=128, quantization="4bit", **LORA,
                           gradient_checkpointing=True, **q) for q in (FP4_FP32, NF4_NODQ))
    assert fp32["est"].peak_moment == bf16["est"].peak_moment == "backward (block 2)"
    assert fp32["got"]["peak"] == bf16["got"]["peak"] and fp32["est"].peak_bytes == bf16["est"].peak_bytes


def test_4bit_bytes_follow_the_variant():
    """FP4 and NF4 store the same bytes; double quant off stores each block's absmax in fp32 (4 bytes, not 1)."""
    info = info_of("meta-llama/Llama-3.2-1B")
    base = dict(batch_size=1, seq_len=64, quantization="4bit", lora_r=8)
    nf4, fp4, nodq = (estimate("meta-llama/Llama-3.2-1B", **base, **q)
                      for q in ({}, {"quant_type": "fp4"}, {"double_quant": False}))
    assert nf4.weights_bytes == fp4.weights_bytes
    quantized = [l.weight for l in info.leaves if l.quantizable]
    assert nodq.weights_bytes - nf4.weights_bytes == sum(nf4_bytes(n, double_quant=False) - nf4_bytes(n)
                                                         for n in quantized)
    assert nf4.setup["quant_type"] == "nf4" and fp4.setup["quant_type"] == "fp4" and nodq.setup["double_quant"] is False


def test_bitsandbytes_config_defaults_are_read_not_refused():
    """BitsAndBytesConfig(load_in_4bit=True) is FP4, no double quant, fp32 compute: estimate_from reads each."""
    args = TrainingArguments(output_dir="unused", per_device_train_batch_size=2, use_cpu=True)
    est = estimate_from("tiny-llama", args, BitsAndBytesConfig(load_in_4bit=True), LoraConfig(r=8), seq_len=64,
                        load_dtype="bf16")
    want = estimate("tiny-llama", batch_size=2, seq_len=64, quantization="4bit", **FP4_FP32, lora_r=8,
                    load_dtype="bf16", checkpoint_reentrant=recipe_reentrant())
    assert {k: est.to_json()[k] for k in FIELDS} == {k: want.to_json()[k] for k in FIELDS}
    s = est.sources
    assert (s["quant_type"][0], s["double_quant"][0], s["compute_dtype"][0]) == ("fp4", False, "fp32")
    assert s["compute_dtype"][1] == "BitsAndBytesConfig.bnb_4bit_compute_dtype"
    assert s["checkpoint_reentrant"][0] is recipe_reentrant()  # prepare_model_for_kbit_training's own checkpointing


def test_estimate_trainer_reads_the_variant_off_the_layers():
    model = models.load_model("tiny-llama", device="cpu", quantization=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype=torch.float32))
    model = get_peft_model(prepare_model_for_kbit_training(model), LoraConfig(r=8, task_type="CAUSAL_LM"))
    tok = data.shipped_tokenizer()
    rows = {"input_ids": [[5 + i % 50] * 32 for i in range(8)], "attention_mask": [[1] * 32] * 8}
    from datasets import Dataset

    tr = Trainer(model=model, args=TrainingArguments(output_dir="unused", use_cpu=True, report_to="none",
                                                     per_device_train_batch_size=2, activation_checkpointing=True),
                 train_dataset=Dataset.from_dict(rows), data_collator=data.collator(tok))
    est = estimate_trainer(tr)
    want = estimate("tiny-llama", batch_size=2, seq_len=32, padded=False, quantization="4bit", **FP4_FP32, **LORA,
                    load_dtype="bf16", gradient_checkpointing=True, optimizer="adamw-fused")
    assert {k: est.to_json()[k] for k in FIELDS} == {k: want.to_json()[k] for k in FIELDS}
    s = est.sources
    assert (s["quant_type"][0], s["double_quant"][0], s["compute_dtype"][0]) == ("fp4", False, "fp32")
    assert s["checkpoint_reentrant"][0] is False and "use_reentrant=False" in s["checkpoint_reentrant"][1]


@pytest.mark.parametrize("kw,name", [(dict(quantization="8bit", quant_type="fp4"), "quant_type"),
                                     (dict(quantization="none", double_quant=False), "double_quant"),
                                     (dict(quantization="4bit", compute_dtype="fp64"), "compute_dtype"),
                                     (dict(quantization="4bit", quant_type="int4"), "quant_type")])
def test_bad_variants_get_one_line(kw, name):
    with pytest.raises(InputError) as exc:
        estimate("tiny-llama", batch_size=1, seq_len=8, lora_r=8, **kw)
    assert exc.value.name == name and "\n" not in str(exc.value) and str(exc.value).endswith(".")


def test_cli_flags_land_in_the_json_setup(run_kit):
    base = ["estimate", "--model", "meta-llama/Llama-3.2-1B", "--batch-size", "2", "--seq-len", "256",
            "--quantization", "4bit", "--lora-r", "8", "--json"]
    got = json.loads(run_kit(*base, "--quant-type", "fp4", "--no-double-quant", "--compute-dtype", "fp32")[1])
    want = estimate("meta-llama/Llama-3.2-1B", batch_size=2, seq_len=256, quantization="4bit", lora_r=8, **FP4_FP32)
    assert got["peak_bytes"] == want.peak_bytes and got["weights_bytes"] == want.weights_bytes
    assert (got["setup"]["quant_type"], got["setup"]["double_quant"], got["setup"]["compute_dtype"]) == \
        ("fp4", False, "fp32")
    plain = json.loads(run_kit(*base)[1])  # the defaults: the kit's 4bit, as before the flags
    assert plain["peak_bytes"] == estimate("meta-llama/Llama-3.2-1B", batch_size=2, seq_len=256, quantization="4bit",
                                           lora_r=8).peak_bytes and plain["setup"]["quant_type"] == "nf4"
    code, _, err = run_kit("estimate", "--model", "tiny-llama", "--batch-size", "1", "--seq-len", "8", "--quant-type",
                           "fp4")
    assert code == 2 and err.startswith("error: argument --quant-type: quant_type applies to 4-bit")


# ---- 8-bit: what its layers keep ------------------------------------------------------------------------
MODES_8BIT = {  # estimate options -> how run_row runs it (checkpoint_reentrant in the estimate's setup)
    "Trainer checkpointing (non-reentrant)": dict(gradient_checkpointing=True),
    "reentrant checkpointing (the recipe's before peft 0.22)": dict(checkpoint_reentrant=True),
    "no checkpointing": dict(gradient_checkpointing=False),
}
ROWS_8BIT = [(t, m) for t in ("tied16k", "untied16k", "vocab256") for m in MODES_8BIT]


@pytest.mark.parametrize("twin,mode", ROWS_8BIT, ids=[f"{t}: {m}" for t, m in ROWS_8BIT])
def test_8bit_lora_peak_within_2_percent_of_a_cpu_trainer_step(twins, twin, mode):
    r = measured(twins[twin], batch_size=4, seq_len=128 if twin == "vocab256" else 64, quantization="8bit", **LORA,
                 **MODES_8BIT[mode])
    assert 0.98 <= ratio(r) <= 1.02, (mode, r["est"].peak_moment, r["est"].peak_bytes, r["got"]["peak"])
    assert r["est"].weights_bytes == r["got"]["weights"]  # int8 weights + fp32 row scales (layer.state.SCB)


@pytest.mark.parametrize("twin", ["tied16k", "untied16k"])
def test_8bit_inputs_kept_through_checkpointing_measured(twins, twin):
    """What non-reentrant checkpointing costs over reentrant, measured, is the 8-bit layers' inputs the
    estimate keeps, to the byte; they are a block's activations, whatever the vocabulary or the tying."""
    kw = dict(batch_size=4, seq_len=64, quantization="8bit", **LORA)
    non, re = measured(twins[twin], **kw, gradient_checkpointing=True), measured(twins[twin], **kw,
                                                                                  checkpoint_reentrant=True)
    assert re["est"].setup["checkpoint_reentrant"] and not non["est"].setup["checkpoint_reentrant"]
    cfg = get_config(twins[twin])
    T, H, F = 4 * 64, cfg.hidden_size, cfg.intermediate_size
    inputs = cfg.num_hidden_layers * T * (3 * H + F) * 4  # q/k/v, o, gate/up, down inputs, fp32 (the recipe)
    assert non["est"].peak_bytes - re["est"].peak_bytes == inputs
    assert non["got"]["peak"] - re["got"]["peak"] == inputs
    assert any("8-bit layers keep their inputs" in n for n in non["est"].notes)


def test_bitsandbytes_keeps_8bit_inputs_as_ctx_attributes():
    """The library rule the 8-bit model rests on, read from its source (CUDA and CPU paths alike): A is kept
    on ctx, never through save_for_backward, so torch's non-reentrant checkpoint (saved-tensor hooks) cannot
    drop it, and the engine's release of saved tensors after each node does not free it."""
    from bitsandbytes.autograd import _functions as f

    lt, fp = inspect.getsource(f.MatMul8bitLt.forward), inspect.getsource(f.MatMul8bitFp.forward)
    assert "ctx.tensors = (CAt, subA, A)" in lt and "save_for_backward(None, None)" in lt
    assert "save_for_backward(" not in lt.replace("ctx.save_for_backward(None, None)", "")
    assert "ctx.A = A" in fp and "save_for_backward" not in fp
    assert 'A.device.type in ("cpu", "xpu")' in inspect.getsource(f.matmul)  # CPU training takes MatMul8bitFp
    assert "CB = state.CB.to(ctx.dtype_A, copy=True)" in inspect.getsource(f.MatMul8bitLt.backward)


def test_the_recipes_checkpointing_is_as_the_installed_peft_runs_it():
    """prepare_model_for_kbit_training's own checkpointing, read off a real 8-bit model's layers, is what the
    estimate assumes by default (reentrant before peft 0.22, non-reentrant since), and so are its bytes."""
    model = prepare_model_for_kbit_training(models.load_model("tiny-llama", quantization="8bit", device="cpu"))
    assert read_reentrant(model)[0] is recipe_reentrant()
    kw = dict(batch_size=4, seq_len=64, quantization="8bit", **LORA)
    default = estimate("tiny-llama", **kw)
    assert default.setup["checkpoint_reentrant"] is recipe_reentrant()
    assert default.peak_bytes == estimate("tiny-llama", **kw, checkpoint_reentrant=recipe_reentrant()).peak_bytes


def test_cuda_8bit_arithmetic_for_the_1b_command():
    """The H200 case (Llama-3.2-1B, bf16 mixed, batch 2 x 256, LoRA r8 q,v, --gradient-checkpointing): the
    kept inputs per block under CUDA autocast are q/k/v's and gate/up's fp32 norms (the recipe upcast the
    norms), o_proj's bf16 sdpa output and down_proj's fp32 SiLU product. Pinned against that rule, not a run."""
    cmd = dict(batch_size=2, seq_len=256, precision="bf16", quantization="8bit", lora_r=8,
               lora_targets="q_proj,v_proj", gradient_checkpointing=True)
    non = estimate("meta-llama/Llama-3.2-1B", **cmd)
    re = estimate("meta-llama/Llama-3.2-1B", **cmd, checkpoint_reentrant=True)
    cfg = get_config("meta-llama/Llama-3.2-1B")
    T, H, F, L = 2 * 256, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kept = L * T * (H * 4 + H * 2 + H * 4 + F * 4)
    assert kept == 436_207_616 and non.peak_bytes - re.peak_bytes == kept and non.peak_moment == "backward (loss)"
    assert any("416.00 MiB of activations that checkpointing does not free" in n for n in non.notes)
    cfg.tie_word_embeddings, cfg.vocab_size = False, 32000  # neither the embedding's size nor its tying enters
    assert estimate(cfg, **cmd).peak_bytes - estimate(cfg, **cmd, checkpoint_reentrant=True).peak_bytes == kept


if __name__ == "__main__":  # the table of the rows above: python tests/test_quant_variants.py
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="kit-quant-"))
    paths = twin_paths(tempfile.mkdtemp(prefix="kit-quant-twins-"))
    print("| twin | setup (LoRA r8 q_proj,v_proj) | estimated peak | measured peak | error | weights est/meas |")
    print("|---|---|---:|---:|---:|---:|")
    rows = [(t, "4-bit " + l, dict(quantization="4bit", **kw)) for t, l, kw in ROWS_4BIT] + \
        [(t, "8-bit, " + m, dict(quantization="8bit", **MODES_8BIT[m])) for t, m in ROWS_8BIT]
    for twin, label, kw in rows:
        r = measured(paths.get(twin, twin), batch_size=4, seq_len=128 if twin == "vocab256" else 64, **LORA, **kw)
        e, g = r["est"], r["got"]
        print(f"| {twin} | {label} | {e.peak_bytes:,} | {g['peak']:,} | {100 * (ratio(r) - 1):+.2f}% | "
              f"{e.weights_bytes:,} / {g['weights']:,} |", flush=True)
