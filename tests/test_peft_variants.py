"""peft's adapters beyond plain LoRA (issue 47.2), each within 2% of the profiler meter of
``benchmarks/real_clients.py`` at step 1 and the steady step: trained copies of a causal LM's embeddings and head
(``LoraConfig(modules_to_save=["lm_head", "embed_tokens"])``, peft's ``ModulesToSaveWrapper``), tied and untied, and
DoRA (``use_dora=True``, fp32 and bf16 autocast); the variants the kit does not model (a LoRA bias, bias="all", a
copy of another module, trainable_token_indices, DoRA under fp16, on 16-bit weights or quantized) refused by exactly
what was found."""
import os
import sys
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import real_clients as rc  # noqa: E402

from kit import inputs, models  # noqa: E402
from kit.estimate import estimate  # noqa: E402
from kit.estimate.read_model import read_model  # noqa: E402

warnings.filterwarnings("ignore")
SAVED = ("lm_head", "embed_tokens")


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen2"])   # untied, and tied embeddings (Gemma's case)
def test_i47_2_lora_with_trained_embeddings_and_head_within_2_percent(tmp_path, family):
    """Refused before ("parameters outside the LoRA adapters are trainable")."""
    _, setup, est, peaks = rc.run_trainer_client(rc.client_peft_saved(str(tmp_path), family), rc.ProfilerMeter)
    assert est.setup["modules_to_save"] == ("lm_head", "model.embed_tokens")
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert 0.98 <= first <= 1.02 and 0.98 <= steady <= 1.02, (first, steady, peaks)


def test_the_copies_weights_grads_and_state_are_counted_from_their_shapes():
    """Each copy: V x H weights beside the frozen original, its fp32 grad and AdamW's two moments; on a tied model the
    shared original is counted once and the two copies apart (peft unties them)."""
    for family in ("tiny-llama", "tiny-qwen2"):
        cfg = models.get_config(family)
        table = cfg.vocab_size * cfg.hidden_size * 4    # [V, H] fp32
        plain = estimate(family, batch_size=2, seq_len=16, lora_r=8, device="cpu")
        saved = estimate(family, batch_size=2, seq_len=16, lora_r=8, device="cpu", modules_to_save=SAVED)
        assert saved.weights_bytes - plain.weights_bytes == 2 * table, family
        assert saved.gradients_bytes - plain.gradients_bytes == 2 * table, family
        assert saved.optimizer_bytes - plain.optimizer_bytes == 2 * 2 * table, family


def test_estimate_reads_the_copies_from_the_model_as_from_a_lora_config():
    model = get_peft_model(models.build_model("tiny-llama"), LoraConfig(r=8, modules_to_save=list(SAVED)))
    _, opts, src, _ = read_model(model)
    assert opts["modules_to_save"] == ("lm_head", "model.embed_tokens") and "ModulesToSaveWrapper" in \
        src["modules_to_save"][1]


@pytest.mark.parametrize("lora_dropout,bf16", [(0.05, False), (0.0, False), (0.05, True)])
def test_i47_2_dora_within_2_percent(tmp_path, lora_dropout, bf16):
    """Refused before ("uses DoRA or a LoRA bias"). (With dropout peft's DoRA computes the base result anew; bf16:
    Trainer's bf16 autocast.)"""
    _, setup, est, peaks = rc.run_trainer_client(rc.client_dora(str(tmp_path), lora_dropout, bf16), rc.ProfilerMeter)
    assert est.setup["use_dora"] is True and est.setup["precision"] == ("bf16" if bf16 else "fp32")
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert 0.98 <= first <= 1.02 and 0.98 <= steady <= 1.02, (first, steady, peaks)


def test_dora_adds_its_magnitude_vectors_and_what_its_forward_keeps():
    """One [out] magnitude per adapted Linear (weights, grad, AdamW's two moments); the forward keeps the base result
    and the LoRA result, [T, out] each, per adapted Linear, more than plain LoRA does."""
    cfg = models.get_config("tiny-llama")
    kw = dict(batch_size=4, seq_len=64, lora_r=8, lora_targets="q_proj,v_proj", device="cpu", padded=False)
    plain, dora = estimate("tiny-llama", **kw), estimate("tiny-llama", use_dora=True, **kw)
    hd = cfg.hidden_size // cfg.num_attention_heads
    outs = cfg.num_hidden_layers * (cfg.hidden_size + cfg.num_key_value_heads * hd)   # q_proj's and v_proj's out
    assert dora.weights_bytes - plain.weights_bytes == 4 * outs
    assert dora.optimizer_bytes - plain.optimizer_bytes == 2 * 4 * outs
    assert dora.activations_bytes - plain.activations_bytes >= 2 * 4 * 64 * 4 * outs


def test_dora_under_fp16_16_bit_weights_or_quantization_is_refused_by_name():
    for option, found in ((dict(precision="fp16"), "precision='fp16'"), (dict(load_dtype="bf16"), "load_dtype='bf16'"),
                          (dict(quantization="4bit"), "quantization='4bit'")):
        with pytest.raises(inputs.InputError, match=f"DoRA with {found}") as e:
            estimate("tiny-llama", batch_size=2, seq_len=16, lora_r=8, use_dora=True, **option)
        assert (e.value.name, e.value.code) == ("use_dora", "dora-not-modelled")
    with pytest.raises(inputs.InputError, match="set lora_r"):
        estimate("tiny-llama", batch_size=2, seq_len=16, use_dora=True)


@pytest.mark.parametrize("config,found", [
    (dict(lora_bias=True), "has a LoRA bias (LoraConfig(lora_bias=True)"),
    (dict(bias="all"), "biases are trainable (LoraConfig(bias=...)?: model.layers.0.self_attn.q_proj.base_layer.bias"),
])
def test_a_refusal_names_exactly_what_it_found(config, found):
    cfg = models.get_config("tiny-llama")
    cfg.attention_bias = config.get("bias") == "all"      # (bias="all" needs biases to train)
    model = get_peft_model(models.build_model(cfg), LoraConfig(r=4, target_modules=["q_proj"], **config))
    with pytest.raises(inputs.Refusal) as e:
        read_model(model)
    assert found in str(e.value) and "DoRA or a LoRA bias" not in str(e.value), str(e.value)


def test_a_copy_of_another_module_is_refused_by_name():
    with pytest.raises(inputs.InputError, match="modules_to_save names 'norm', which is not this causal LM's input "
                                                "embeddings or output head") as e:
        estimate("tiny-llama", batch_size=2, seq_len=16, lora_r=8, modules_to_save=("norm",))
    assert e.value.code == "modules-to-save-not-modelled"
    with pytest.raises(inputs.InputError, match="beside LoRA adapters: set lora_r") as e:
        estimate("tiny-llama", batch_size=2, seq_len=16, modules_to_save=SAVED)
    with pytest.raises(inputs.InputError, match="both gets LoRA and is in modules_to_save"):
        estimate("tiny-llama", batch_size=2, seq_len=16, lora_r=8, lora_targets="q_proj,lm_head",
                 modules_to_save=("lm_head",))


def test_estimate_from_reads_the_copies_and_dora_from_the_lora_config():
    """The LoraConfig users write, before anything is loaded, gives the estimate the options do."""
    from transformers import TrainingArguments

    from kit.estimate import estimate_from

    args = TrainingArguments(output_dir="unused", use_cpu=True, per_device_train_batch_size=2)
    for config, option in ((dict(modules_to_save=list(SAVED)), dict(modules_to_save=SAVED)),
                           (dict(use_dora=True), dict(use_dora=True))):
        read = estimate_from("tiny-llama", args, peft_config=LoraConfig(r=8, **config), seq_len=32, device="cpu")
        given = estimate("tiny-llama", batch_size=2, seq_len=32, lora_r=8, device="cpu", **option)
        assert (read.peak_bytes, read.weights_bytes) == (given.peak_bytes, given.weights_bytes), config
        assert read.sources[next(iter(option))][1].startswith("LoraConfig.")


def test_trainable_token_indices_are_refused_by_name():
    """peft's trained rows of the embeddings (a full merged [V, H] weight in each forward) are not modelled yet."""
    model = get_peft_model(models.build_model("tiny-llama"),
                           LoraConfig(r=4, trainable_token_indices={"embed_tokens": [1, 2, 3]}))
    with pytest.raises(inputs.InputError, match=r"model.embed_tokens.token_adapter is a peft TRAINABLE_TOKENS adapter "
                                                r"\(TrainableTokensLayer\) \(LoraConfig.trainable_token_indices") as e:
        read_model(model)
    assert e.value.code == "peft-not-lora"
