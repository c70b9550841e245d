"""Every replay family on its tiny CPU twin: the replay against what autograd saves, and the whole
estimate against the CPU peak of real Trainer steps.

One tiny twin per family (``kit/configs/tiny-<family>.json``: 2 layers, hidden 128, vocab 4096),
under the setups of the family grid in ``benchmarks/estimate_vs_measured.py`` (its ``run_row``
builds the model the way the estimate assumes, counts the saved bytes with
``kit.measure.tensor_peak.saved_tensor_bytes`` and trains two Trainer steps under ``cpu_trainer_peak``'s
meter). Each (twin, setup) is measured once; both comparisons read it. Llama and GPT-2 have theirs
in ``tests/test_estimate.py``.
"""
import functools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit.estimate import estimate  # noqa: E402
from kit.estimate.inventory import default_targets, family_of, info_of  # noqa: E402
from kit.model_configs import get_config  # noqa: E402
from kit.models import build_model  # noqa: E402

# twin -> (its replay family, the parameters of the built model; tied embeddings count once)
TWINS = {
    "tiny-mistral": ("mistral", 1_417_856),
    "tiny-qwen2": ("qwen2", 894_080),
    "tiny-qwen3": ("qwen3", 893_696),
    "tiny-olmo2": ("olmo2", 1_418_240),
    "tiny-phi3": ("phi3", 1_417_856),
    "tiny-gemma2": ("gemma2", 894_080),
    "tiny-gemma3": ("gemma3", 877_824),
    "tiny-gpt-neox": ("gpt_neox", 1_445_376),
}
GRID = {label: (kw, over[0] if over else None) for label, kw, *over in bench.FAMILY_SETUPS}
SETUPS = ["full FT, sdpa", "full FT, checkpointing", "full FT, bf16 weights", "LoRA r8 (default targets)",
          "QLoRA 4-bit r8", "vocab 256, sdpa, unpadded", "vocab 256, eager"]
CASES = [(name, label) for name in TWINS for label in SETUPS]


@functools.lru_cache(maxsize=None)
def _measured(name, label):
    kw, over = GRID[label]
    torch.manual_seed(0)
    return bench.run_row(label, name, kw, False, over)


def _kept_for_the_recompute(name, kw, over):
    """What checkpointing keeps alive for the recompute without saving it: the rotary cos/sin (one
    pair per layer type for Gemma-3) and the attention mask of each layer type. The estimate counts
    them (they hold memory); ``saved_tensors_hooks`` cannot see them."""
    cfg = bench._config(name, over)
    B, S = kw["batch_size"], kw["seq_len"]
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters
    rotary = int(hd * rope.get("partial_rotary_factor", 1.0)) if "rope_type" in rope else hd
    window = getattr(cfg, "sliding_window", None)
    types = set(getattr(cfg, "layer_types", None) or ["sliding_attention" if window else "full_attention"])
    pairs = len(types) if cfg.model_type == "gemma3_text" else 1
    padded = kw.get("padded", True)
    if kw.get("attn_implementation") == "eager" or cfg.model_type == "gemma2":  # float masks, fp32 twins
        masks = B * S * S * 4 * len(types)
    else:  # sdpa: bool masks, where one is built
        masks = B * S * S * sum(padded or (t == "sliding_attention" and S >= window) for t in types)
    return 2 * S * rotary * 4 * pairs + masks


@pytest.mark.parametrize("name", list(TWINS))
def test_twin_family_and_parameter_count_are_pinned(name):
    family, params = TWINS[name]
    assert family_of(get_config(name)) == info_of(name).family == family
    assert build_model(name).num_parameters() == params
    assert estimate(name, batch_size=1, seq_len=8).params == params


@pytest.mark.parametrize("name,label", CASES)
def test_replay_matches_autograd_saved_tensors(name, label):
    """The replay's saved bytes against ``saved_tensors_hooks`` in one forward of the twin."""
    r = _measured(name, label)
    kw, over = GRID[label]
    kept = _kept_for_the_recompute(name, kw, over) if r["est"].setup["gradient_checkpointing"] else 0
    assert r["est"].saved_bytes - kept == pytest.approx(r["saved"], rel=1e-3)


@pytest.mark.parametrize("name,label", CASES)
def test_peak_matches_a_cpu_trainer_step(name, label):
    """The whole timeline: the estimate against the CPU allocation peak of real Trainer steps."""
    r = _measured(name, label)
    est, got = r["est"], r["got"]
    assert 0.98 <= est.peak_bytes / got["peak"] <= 1.02, (est.peak_moment, est.peak_bytes, got["peak"])
    if "QLoRA" not in label:  # (Gemma's 0-d embed_scale buffer goes bf16 with bf16 weights: 2 bytes, not 4)
        assert est.weights_bytes == pytest.approx(got["weights"], abs=2)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_lora_without_input_grads_is_exact(name):
    """LoRA on a frozen embedding, no checkpointing, no enable_input_require_grads (get_peft_model alone):
    block 1's input needs no grad, so its first norm saves nothing. The estimate's default follows it, and
    a real model's hook is read off it (estimate_trainer)."""
    label = "LoRA r8 (default targets)"
    r = _measured(name, label) if name in TWINS else bench.run_row(label, name, GRID[label][0], False)
    assert r["est"].saved_bytes == pytest.approx(r["saved"], rel=1e-6)  # (a 0-d scalar or so apart)
    assert 0.998 <= r["est"].peak_bytes / r["got"]["peak"] <= 1.002, (r["est"].peak_moment, r["got"])
    hooked = estimate(name, **GRID[label][0], device="cpu", input_require_grads=True)
    assert hooked.saved_bytes > r["est"].saved_bytes


def test_estimate_trainer_reads_the_input_grads_hook(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    seen = {}
    for hook in (False, True):
        model = build_model("tiny-llama")
        if hook:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        args = TrainingArguments(str(tmp_path), per_device_train_batch_size=2, use_cpu=True, report_to=[])
        tr = Trainer(model=model, args=args, train_dataset=bench._Batches(4, 32, 4096, True))
        seen[hook] = estimate_trainer(tr, seq_len=32, device="cpu")
    assert seen[True].sources["input_require_grads"][0] is True and "input_require_grads" not in seen[False].sources
    assert seen[True].saved_bytes > seen[False].saved_bytes


def test_gemma2_runs_eager_whatever_is_asked():
    """sdpa cannot soft-cap Gemma-2's attention scores: transformers refuses it, so the model runs eager."""
    sdpa, eager = (estimate("tiny-gemma2", batch_size=2, seq_len=64, attn_implementation=a) for a in ("sdpa", "eager"))
    assert sdpa.peak_bytes == eager.peak_bytes and sdpa.saved_bytes == eager.saved_bytes
    assert any("gemma2: attention runs eager" in n for n in sdpa.notes)
    cfg = get_config("tiny-gemma2")
    cfg.final_logit_softcapping = None  # the soft-capped logits keep a (B, S, V) tanh output
    assert estimate(cfg, batch_size=2, seq_len=64).saved_bytes == eager.saved_bytes - 2 * 64 * 4096 * 4


@pytest.mark.parametrize("name,targets", [("tiny-phi3", ("qkv_proj",)), ("tiny-olmo2", ("q_proj", "v_proj"))])
def test_lora_targets_where_peft_has_no_default(name, targets):
    """peft has no default LoRA targets for Phi-3 or OLMo-2 (LoraConfig without target_modules fails):
    the estimate takes their attention projections, as LoraConfig must name them, and says so."""
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ValueError, match="target_modules"):
        get_peft_model(build_model(name, device="meta"), LoraConfig(r=8))
    assert default_targets(info_of(name)) == targets
    model = get_peft_model(build_model(name, device="meta"), LoraConfig(r=8, target_modules=list(targets)))
    est = estimate(name, batch_size=1, seq_len=8, lora_r=8)
    assert est.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert any("peft has no default LoRA targets" in n and targets[0] in n for n in est.notes)


@pytest.mark.parametrize("name", list(TWINS))
def test_all_linear_lora_counts_match_peft(name):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_model(name, device="meta"), LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert estimate(name, batch_size=1, seq_len=8, lora_r=8, lora_targets="all-linear").trainable_params == trainable


def test_families_by_model_type():
    from transformers import Gemma3Config, GraniteConfig

    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256)
    assert family_of(Gemma3Config().text_config) == "gemma3"        # model_type gemma3_text
    granite = estimate(GraniteConfig(**tiny), batch_size=1, seq_len=8)  # Llama-style, no replay of its own
    assert any("(the kit has no model of" in n for n in granite.notes)
    with pytest.raises(ValueError, match=r"^gemma3 \(Gemma3Config\) is a multimodal model.*text_config"):
        estimate(Gemma3Config(), batch_size=1, seq_len=8)
