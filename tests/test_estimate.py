"""The estimator: arithmetic pinned to hand-computed numbers, and the replay checked against autograd."""
import json
import math
import os
import sys

import pytest
import torch

import kit.estimate as E
from kit.estimate import estimate
from kit.estimate.inventory import info_of
from kit.measure.tensor_peak import saved_tensor_bytes
from kit.presets import PRESETS, int8_bytes, nf4_bytes, optimizer_state_bytes, verdict

LLAMA8 = "meta-llama/Meta-Llama-3-8B"


# ---- parameter counts -------------------------------------------------------------
def test_parameter_counts_are_exact():
    assert estimate("distilgpt2", batch_size=1, seq_len=8).params == 81_912_576
    assert estimate(LLAMA8, batch_size=1, seq_len=8).params == 8_030_261_248
    # GPT-2 ties lm_head to wte: counted once, 124,439,808 as in the paper's model card
    assert estimate("gpt2", batch_size=1, seq_len=8).params == 124_439_808


def test_scenario1_head_and_offender():
    est = estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16")
    # 50258 x 50258 + 50258 bias: the head alone; the base gains one pad-token row (768)
    assert est.trainable_params == 50258 * 50258 + 50258 == 2_525_916_822
    assert est.params == 81_912_576 + 768 + 2_525_916_822
    name, params, train_bytes = est.offenders[0]
    assert name == "custom_layer" and params == 2_525_916_822
    # fp32 weight + grad + two AdamW states = 16 bytes a parameter
    assert train_bytes == 16 * 2_525_916_822
    everything = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
    assert train_bytes / everything > 0.99
    assert "custom_layer" in est.table()


# ---- quantization -----------------------------------------------------------------
def test_nf4_arithmetic_from_bitsandbytes_blocksizes():
    n = 4096 * 14336
    blocks = n // 64
    assert nf4_bytes(n) == n // 2 + blocks + 4 * math.ceil(blocks / 256) + 1024 + 64 + 4
    assert nf4_bytes(n) / n == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256), abs=1e-4)  # 0.51587
    assert nf4_bytes(n, double_quant=False) / n == pytest.approx(0.5 + 4 / 64, abs=1e-4)
    assert int8_bytes(4096, 1024) == 4096 * 1024 + 4 * 1024


def test_llama3_8b_nf4_weights_about_5_70_gb():
    est = estimate(LLAMA8, batch_size=1, seq_len=512, quantization="4bit", lora_r=16)
    # as loaded: 6,979,321,856 linear weights in NF4 + embeddings, lm_head, norms in bf16
    assert est.loaded_weights_bytes == pytest.approx(5.70e9, rel=0.01)
    assert est.quantized_params == 6_979_321_856
    assert est.unquantized_params == 2 * 128256 * 4096 + (2 * 32 + 1) * 4096
    # prepare_model_for_kbit_training upcasts the 1,050,939,392 non-4-bit params to fp32
    lora = 6_815_744
    assert est.trainable_params == lora  # q_proj, v_proj, r=16: 32 * 16 * (4096+4096 + 4096+1024)
    assert est.weights_bytes - est.loaded_weights_bytes == 1_050_939_392 * 2 + 4 * lora
    lean = estimate(LLAMA8, batch_size=1, seq_len=512, quantization="4bit", lora_r=16, kbit_recipe="lean")
    assert lean.weights_bytes == est.loaded_weights_bytes + 4 * lora


def test_lora_counts_match_peft_on_the_meta_model():
    from peft import LoraConfig, get_peft_model

    from kit.models import build_model

    for name, targets in (("tiny-gpt2", ["c_attn"]), ("tiny-llama", ["q_proj", "v_proj", "down_proj"])):
        model = get_peft_model(build_model(name, device="meta"), LoraConfig(r=8, target_modules=targets))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert estimate(name, batch_size=1, seq_len=8, lora_r=8, lora_targets=targets).trainable_params == trainable


# ---- gradients and optimizer state --------------------------------------------------
def test_optimizer_state_bytes():
    n = 1_000_000
    assert optimizer_state_bytes("adamw", n, 4) == (8 * n, 0)
    assert optimizer_state_bytes("adamw", n, 2) == (4 * n, 0)       # torch: zeros_like(param)
    assert optimizer_state_bytes("sgd", n, 4) == (4 * n, 0)
    assert optimizer_state_bytes("adamw-8bit", n, 4) == (2 * n + 8 * math.ceil(n / 256), 0)
    assert optimizer_state_bytes("adamw-8bit", 4095, 4) == (8 * 4095, 0)  # under min_8bit_size
    assert optimizer_state_bytes("paged-adamw-8bit", n, 4) == (8 * math.ceil(n / 256), 2 * n)
    # Trainer registers nn.Embedding weights for 32-bit states with bitsandbytes optimizers
    assert optimizer_state_bytes("adamw-8bit", n, 4, embedding=True) == (8 * n, 0)


def test_full_finetune_fp32_totals():
    est = estimate("distilgpt2", batch_size=2, seq_len=64)
    n = 81_912_576
    assert est.trainable_params == n
    assert est.weights_bytes == 4 * n + info_of("distilgpt2").buffers_bytes
    assert est.gradients_bytes == 4 * n and est.optimizer_bytes == 8 * n
    sgd = estimate("distilgpt2", batch_size=2, seq_len=64, optimizer="sgd")
    assert sgd.optimizer_bytes == 4 * n
    bf16 = estimate("distilgpt2", batch_size=2, seq_len=64, load_dtype="bf16")
    assert bf16.gradients_bytes == 2 * n and bf16.optimizer_bytes == 4 * n


def test_components_sum_to_peak_and_json_is_ints():
    for kw in (dict(model="gpt2", batch_size=4, seq_len=256, precision="bf16"),
               dict(model="distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16"),
               dict(model=LLAMA8, batch_size=2, seq_len=1024, quantization="4bit", lora_r=16)):
        est = estimate(kw.pop("model"), **kw)
        assert sum(est.components().values()) == est.peak_bytes
        assert list(est.components()) == list(E.COMPONENTS)
        assert est.peak_phase in ("forward/backward", "optimizer step")
        js = est.to_json()
        for field in ("params", "trainable_params", "weights_bytes", "gradients_bytes", "optimizer_bytes",
                      "activations_bytes", "peak_bytes", "cpu_build_bytes"):
            assert type(js[field]) is int and js[field] >= 0


def test_scenario1_step_phase_and_cpu_build():
    k = 2_525_916_822  # the head's elements
    est = estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16", optimizer="adamw")
    # adamw_torch (foreach): the head's fp32 weights, grads, AdamW states and sqrt temporary: 5 x 4 bytes each
    assert est.peak_phase == "optimizer step" and 5 * 4 * k < est.peak_bytes < 5.1 * 4 * k
    fused = estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16")
    # Trainer's default, the fused step, makes no temporary: the head's backward peaks instead, with the
    # state alive, the fp16 grad of its half copy and that grad cast up to fp32: (1 + 2 + 0.5 + 1) x 4 bytes
    assert fused.setup["optim"] == "adamw_torch_fused" and fused.peak_moment == "backward (head)"
    assert 4.5 * 4 * k < fused.peak_bytes < 4.6 * 4 * k
    assert est.cpu_build_bytes >= 4 * 2_607_830_166
    assert not verdict(est, "colab-t4").fits and verdict(est, "colab-t4").gpu_margin_bytes < 0


def test_a_kbit_model_streams_through_ram_a_plain_one_is_built_there():
    # transformers loads a bitsandbytes model straight onto the GPU, one tensor at a time: the largest
    # (Llama-3.1-8B's embedding or head, 128256 x 4096 in bf16) passes through RAM, not the model
    q = estimate("meta-llama/Llama-3.1-8B", batch_size=1, seq_len=512, quantization="4bit", lora_r=16)
    plain = estimate("meta-llama/Llama-3.1-8B", batch_size=1, seq_len=512, load_dtype="bf16", lora_r=16)
    assert 128256 * 4096 * 2 <= q.cpu_build_bytes < 128256 * 4096 * 2 + 2**20
    assert 2 * 8.0e9 < plain.cpu_build_bytes < 2 * 8.1e9


# ---- monotonicity ------------------------------------------------------------------
def test_monotonic():
    base = dict(batch_size=4, seq_len=256)
    small, big = estimate("gpt2", **base), estimate("gpt2", batch_size=8, seq_len=256)
    assert big.activations_bytes > small.activations_bytes and big.peak_bytes > small.peak_bytes
    assert estimate("gpt2", **base, gradient_checkpointing=True).activations_bytes < small.activations_bytes
    assert estimate("gpt2", **base, attn_implementation="eager").activations_bytes > small.activations_bytes
    q = dict(batch_size=1, seq_len=512, lora_r=16)
    w = {k: estimate(LLAMA8, **q, quantization=k).weights_bytes for k in ("none", "8bit", "4bit")}
    assert w["4bit"] < w["8bit"] < w["none"]


# ---- what the forward saves: the replay against autograd ---------------------------------
@pytest.mark.parametrize("name,attn,dtype,padded,ckpt,lora", [
    ("tiny-gpt2", "sdpa", "fp32", False, False, None),
    ("tiny-gpt2", "eager", "fp32", True, False, None),
    ("tiny-gpt2", "sdpa", "bf16", True, True, None),
    ("tiny-gpt2", "sdpa", "fp32", False, False, ["c_attn"]),
    ("tiny-llama", "sdpa", "fp32", True, False, None),
    ("tiny-llama", "eager", "bf16", False, False, None),
    ("tiny-llama", "sdpa", "fp32", False, True, None),
    ("tiny-llama", "sdpa", "bf16", False, False, ["q_proj", "v_proj"]),
    ("tiny-gpt2+vocab-head", "sdpa", "fp32", True, None, None),
])
def test_replay_matches_autograd_saved_tensors(name, attn, dtype, padded, ckpt, lora):
    """Formula vs the bytes autograd really saves, on a tiny twin with the real code paths.

    Tolerance 1.5%: with checkpointing Llama's rotary cos/sin and the mask stay alive
    without being saved tensors (the estimate counts them; the hooks do not).
    """
    from kit.models import as_dtype, build_model, get_config

    torch.manual_seed(0)
    model = build_model(name, dtype=as_dtype(dtype))
    for mod in model.modules():
        if hasattr(mod, "config"):
            mod.config._attn_implementation = attn
    model.train()
    if ckpt:
        model.gradient_checkpointing_enable()
    if lora:
        from peft import LoraConfig, get_peft_model

        model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=8, target_modules=lora))
    B, S = 2, 24
    ids = torch.randint(2, get_config(name).vocab_size, (B, S))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, -3:] = 0
    got = saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": mask, "labels": ids})
    est = estimate(name, batch_size=B, seq_len=S, load_dtype=dtype, attn_implementation=attn,
                   padded=padded, gradient_checkpointing=ckpt, lora_r=8 if lora else 0,
                   lora_targets=lora, device="cpu", input_require_grads=True if lora else None)
    assert est.saved_bytes == pytest.approx(got, rel=0.015)


@pytest.mark.parametrize("vocab,optimizer,moment", [(None, "adamw", "optimizer step"),
                                                     (None, "adamw-fused", "backward (embeddings)"),
                                                     (256, "adamw", "backward (block 2)")])
def test_peak_matches_a_cpu_trainer_step(vocab, optimizer, moment):
    """The whole timeline, not just saved tensors: the CPU allocation peak of real Trainer steps
    (benchmarks/estimate_vs_measured.py's meter). Small batches: adamw_torch's step, whose temporaries
    Trainer's default (adamw_torch_fused) does not make; a small vocab: a block."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    from estimate_vs_measured import cpu_trainer_peak

    from kit.models import build_model, get_config

    cfg = get_config("tiny-llama")
    cfg.vocab_size = vocab or cfg.vocab_size
    torch.manual_seed(0)
    B, S = (2, 32) if vocab is None else (2, 128)
    est = estimate(cfg, batch_size=B, seq_len=S, padded=True, device="cpu", optimizer=optimizer)
    got = cpu_trainer_peak(build_model(cfg), B=B, S=S, V=cfg.vocab_size, steps=2, padded=True,
                           optim=est.setup["optim"])
    assert est.peak_moment == moment
    assert est.peak_bytes == pytest.approx(got["peak"], rel=0.02)
    assert est.weights_bytes == got["weights"] and est.optimizer_bytes == pytest.approx(got["state"], abs=1024)


@pytest.mark.parametrize("name,B,S,moment", [("tiny-gpt2", 1, 32, "backward (embeddings)"),
                                             ("tiny-gpt2+vocab-head", 2, 64, "backward (head)")])
def test_with_the_fused_step_the_backward_sets_the_peak(name, B, S, moment):
    """Trainer's default fused AdamW makes no step temporaries, so a backward sets the peak: at GPT-2's tied
    embedding (its two grads summed out of place) and at scenario 1's head (the V-wide grad of its input, the
    frozen base's logits, which require grad under checkpointing). Both were hidden by foreach AdamW's step."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    from estimate_vs_measured import build, cpu_trainer_peak

    from kit.models import get_config

    torch.manual_seed(0)
    est = estimate(name, batch_size=B, seq_len=S, padded=True, device="cpu")
    got = cpu_trainer_peak(build(name, {}), B=B, S=S, V=get_config(name).vocab_size, steps=2, padded=True,
                           optim=est.setup["optim"])
    assert est.setup["optim"] == "adamw_torch_fused" and est.peak_moment == moment
    assert est.peak_bytes == pytest.approx(got["peak"], rel=0.003)


# ---- errors ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(model="no-such-model"), "distilgpt2"),
    (dict(batch_size=0), "batch_size"),
    (dict(seq_len=0), "seq_len"),
    (dict(seq_len=5000), "1024 positions"),
    (dict(lora_r=8, lora_targets=["q_proj"]), "c_attn"),
    (dict(optimizer="adam9"), "adamw-8bit"),
    (dict(precision="fp8"), "bf16"),
    (dict(quantization="3bit"), "4bit"),
    (dict(quantization="4bit"), "lora_r"),
])
def test_clear_errors(kwargs, match):
    args = dict(model="gpt2", batch_size=1, seq_len=128) | kwargs
    with pytest.raises(ValueError, match=match):
        estimate(args.pop("model"), **args)


def test_presets_and_verdict():
    assert PRESETS["colab-t4"].gpu_bytes == int(14.56 * 1024**3)   # what torch can allocate on a Colab T4
    assert PRESETS["colab-t4"].ram_bytes == int(12.7 * 1024**3)
    assert {"l4", "a100-40", "a100-80", "h100", "cpu"} <= set(PRESETS)
    v = verdict(estimate("tiny-gpt2", batch_size=2, seq_len=64), "colab-t4")
    assert v.fits and v.gpu_margin_bytes > 0 and "fits" in v.text
    with pytest.raises(ValueError, match="colab-t4"):
        verdict(estimate("tiny-gpt2", batch_size=2, seq_len=64), "tpu")


def test_biggest_and_optim_aliases():
    est = estimate("gpt2", batch_size=1, seq_len=64, optimizer="adamw_torch")
    assert est.setup["optimizer"] == "adamw" and est.setup["optim"] == "adamw_torch"
    assert est.biggest("params", 1)[0][0] == "transformer.wte"
    assert [o[2] for o in est.biggest()] == sorted((o[2] for o in est.offenders), reverse=True)[:5]
    note = estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128, optimizer="adamw_bnb_8bit").notes
    assert any("2^31" in n for n in note)  # bnb 8-bit AdamW kills the process on this head (docs/known-failures.md)


def test_frozen_base_without_checkpointing_estimates():
    """Regression: a frozen base with no grad flowing made the replay index an empty op list."""
    on = estimate("tiny-gpt2+vocab-head", batch_size=4, seq_len=64, gradient_checkpointing=True)
    off = estimate("tiny-gpt2+vocab-head", batch_size=4, seq_len=64, gradient_checkpointing=False)
    assert off.activations_bytes == 0 < on.activations_bytes   # nothing in the frozen base needs saving
    assert off.logits_bytes == on.logits_bytes > 0             # the head still saves its input


# ---- models outside GPT-2/Llama: estimated, or refused in one sentence ---------------------
def _config_json(tmp_path, cfg):
    cfg.save_pretrained(tmp_path)
    return tmp_path / "config.json"


@pytest.mark.parametrize("make,match", [
    ("OPTConfig", r"^opt \(OPTConfig\) is not estimated: no family the kit replays has its blocks, .*: measure it on "
                  r"a real step with kit.watch\(trainer\) .*, or pass a GPT-2 or Llama-style decoder"),
    ("BloomConfig", r"^bloom \(BloomConfig\) is not estimated: no family the kit replays has its blocks"),
    ("GPTJConfig", r"^gptj \(GPTJConfig\) is not estimated: no family the kit replays has its blocks"),
    # T5 v1.0 (Flan-T5 is replayed)
    ("T5Config", r"^t5 \(T5Config\) scales the decoder's output by d_model \*\* -0.5"),
    ("BartConfig", r"^bart \(BartConfig\) is an encoder-decoder model, not a causal language model"),
    ("BertConfig", r"^bert \(BertConfig\) is an encoder, which the estimator replays under a classifier head: "
                   r"pass task='seq-cls'"),
    ("Qwen2MoeConfig", r"^qwen2_moe \(Qwen2MoeConfig\) is a mixture-of-experts model"),   # (Mixtral is replayed)
])
def test_other_architectures_are_refused_in_words(tmp_path, make, match):
    import transformers

    path = _config_json(tmp_path, getattr(transformers, make)())
    for model in (path, str(path), transformers.AutoConfig.from_pretrained(path)):
        with pytest.raises(ValueError, match=match) as exc:
            estimate(model, batch_size=1, seq_len=64)
        assert "\n" not in str(exc.value) and len(str(exc.value)) < 400


def test_a_truncated_config_json_is_one_sentence(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64})[:25])
    with pytest.raises(ValueError, match="is not a readable config.json .*download or copy it again"):
        estimate(path, batch_size=1, seq_len=8)


def test_modules_that_are_not_causal_lms_are_refused():
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    for module in (torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4))):
        with pytest.raises(E.UnsupportedModel, match="holds no transformers causal LM"):
            estimate(module, batch_size=1, seq_len=8)
    tiny = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    with pytest.raises(E.UnsupportedModel, match=r"^bert \(BertModel\) is an encoder.*task='seq-cls'"):
        estimate(BertModel(BertConfig(**tiny)), batch_size=1, seq_len=8)   # a bare encoder: no classifier head
    with pytest.raises(E.UnsupportedModel, match=r"LlamaModel\) has no language-model head.*ForCausalLM"):
        estimate(LlamaModel(LlamaConfig(**tiny)), batch_size=1, seq_len=8)


def test_a_head_on_the_logits_is_found_by_its_shapes_in_the_users_own_module():
    """Scenario 1's model as its user wrote it: a plain nn.Module with no .config, and the head under another
    name. The estimate is the registry model's to the byte; a layer that is not on the logits is refused."""
    from kit.models import build_model

    class Custom_GPT2_Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt2 = build_model("tiny-gpt2", device="meta")
            self.gpt2.resize_token_embeddings(self.gpt2.config.vocab_size + 1, mean_resizing=False)  # the pad token
            for p in self.gpt2.parameters():
                p.requires_grad = False
            V = self.gpt2.config.vocab_size
            self.vocab_projection = torch.nn.Linear(V, V, device="meta")

    kw = dict(batch_size=2, seq_len=32, precision="fp16", gradient_checkpointing=True)
    mine, shipped = estimate(Custom_GPT2_Model(), **kw), estimate("tiny-gpt2+vocab-head", **kw)
    assert (mine.peak_bytes, mine.trainable_params, mine.peak_moment) == \
        (shipped.peak_bytes, shipped.trainable_params, shipped.peak_moment)
    assert mine.offenders[0][0] == "vocab_projection"
    extra = Custom_GPT2_Model()
    extra.classifier = torch.nn.Linear(extra.gpt2.config.n_embd, 2, device="meta")
    with pytest.raises(E.UnsupportedModel, match="adds classifier on top of its language model"):
        estimate(extra, **kw)


def test_llama_style_families_still_estimate(tmp_path):
    from transformers import MistralConfig

    cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256)
    est = estimate(_config_json(tmp_path, cfg), batch_size=1, seq_len=16)
    assert est.peak_bytes > 0 and any("counted as Llama's blocks" in n for n in est.notes)


# ---- inputs read the way users mean them ------------------------------------------------
def test_string_flags_mean_what_they_say():
    base = dict(batch_size=2, seq_len=64)
    off, on = (estimate("tiny-llama", **base, gradient_checkpointing=v) for v in (False, True))
    assert off.activations_bytes > on.activations_bytes
    for text, want in (("no", off), ("false", off), ("0", off), ("yes", on), ("True", on)):
        got = estimate("tiny-llama", **base, gradient_checkpointing=text)
        assert got.activations_bytes == want.activations_bytes and got.setup == want.setup
    unpadded = estimate("tiny-llama", **base, padded=False)
    assert unpadded.saved_bytes < estimate("tiny-llama", **base, padded=True).saved_bytes
    assert estimate("tiny-llama", **base, padded="no").saved_bytes == unpadded.saved_bytes
    with pytest.raises(ValueError, match="^gradient_checkpointing must be True or False"):
        estimate("tiny-llama", **base, gradient_checkpointing="maybe")


def test_numpy_sizes_and_path_configs_are_read():
    import numpy as np

    from kit.models import CONFIG_DIR

    want = estimate("gpt2", batch_size=2, seq_len=64, lora_r=4, lora_targets="c_attn")
    got = estimate(CONFIG_DIR / "gpt2.json", batch_size=np.int64(2), seq_len=np.int32(64), lora_r=np.int64(4),
                   lora_targets=["c_attn"])
    assert got.peak_bytes == want.peak_bytes and got.trainable_params == want.trainable_params
    assert json.dumps(got.to_json())  # plain ints, not numpy ones


@pytest.mark.parametrize("kwargs,match", [
    (dict(lora_r=8, lora_dropout=5), "^lora_dropout must be a number from 0 to 1"),
    (dict(lora_r=8, lora_targets=[1, 2]), "^lora_targets must be module names"),
    (dict(batch_size=2.5), "^batch_size must be a whole number >= 1"),
    (dict(grad_accum=True), "^grad_accum must be a whole number >= 1"),
    (dict(padded="maybe"), "^padded must be True or False"),
])
def test_bad_inputs_are_refused_by_name(kwargs, match):
    args = dict(batch_size=1, seq_len=32) | kwargs
    with pytest.raises(ValueError, match=match):
        estimate("tiny-llama", **args)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gpt2+vocab-head"])
def test_all_linear_targets_what_peft_targets(name):
    """peft's 'all-linear': every Linear/Conv1D except a PreTrainedModel's output layer."""
    from peft import LoraConfig, get_peft_model

    from kit.models import build_model

    model = get_peft_model(build_model(name, device="meta"), LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    for targets in ("all-linear", ["all-linear"]):
        assert estimate(name, batch_size=1, seq_len=8, lora_r=8, lora_targets=targets).trainable_params == trainable


def test_saved_tensor_bytes_leaves_no_graph_and_no_model_alive():
    """The count keeps nothing in the graph: a saved output kept there would be a cycle through C++
    that the gc cannot collect, and the model and its activations would outlive the call (seen: 111 MiB)."""
    from kit.measure import leaks
    from kit.models import build_model, get_config

    base = leaks.take_baseline()
    model = build_model("tiny-gpt2+vocab-head")
    model.train()
    ids = torch.randint(2, get_config("tiny-gpt2+vocab-head").vocab_size, (2, 24))
    assert saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}) > 0
    del model, ids
    assert leaks.check_returned(base).ok


@pytest.mark.parametrize("vocab,B,S", [(None, 2, 32), (256, 2, 128)])
def test_first_step_peak_matches_a_cpu_trainer_first_step(vocab, B, S):
    """The first step has no optimizer state during its backward; measured on its own, with TensorPeak."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    from estimate_vs_measured import cpu_trainer_peak

    from kit.models import build_model, get_config

    cfg = get_config("tiny-llama")
    cfg.vocab_size = vocab or cfg.vocab_size
    torch.manual_seed(0)
    est = estimate(cfg, batch_size=B, seq_len=S, padded=True, device="cpu")  # Trainer's default optimizer
    got = cpu_trainer_peak(build_model(cfg), B=B, S=S, V=cfg.vocab_size, steps=2, padded=True,
                           optim=est.setup["optim"])
    assert est.first_step_peak_bytes == pytest.approx(got["first_step_peak"], rel=0.02)
    assert est.first_step_peak_bytes <= est.peak_bytes
    assert est.to_json()["first_step_peak_bytes"] == est.first_step_peak_bytes
