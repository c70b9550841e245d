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
from kit.estimate.inventory import (BLOCKS_DIFFER, LAYER_TYPES, NO_REPLAY, UnsupportedModel,  # noqa: E402
                                    default_targets, family_of, info_of)
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
    "tiny-gemma3": ("gemma3_text", 877_824),
    "tiny-gpt-neox": ("gpt_neox", 1_445_376),
    "tiny-stablelm": ("stablelm", 1_524_992),
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


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-gemma3-vision", "tiny-qwen2-5-vl", "tiny-qwen3-vl"])
def test_a_vision_language_model_is_looked_up_in_peft_by_its_own_type(name):
    """peft takes LoRA's default targets from the whole model's config type (idefics3, gemma3, qwen2_5_vl, ...), not
    its language model's (llama, gemma3_text have defaults): LoraConfig without target_modules fails on each, and
    the estimate says so, naming the model's type."""
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ValueError, match="target_modules"):
        get_peft_model(build_model(name, device="meta"), LoraConfig(r=8))
    est = estimate(name, batch_size=1, seq_len=512, lora_r=8)
    said = [n for n in est.notes if getattr(n, "code", None) == "no-peft-default-targets"]
    assert len(said) == 1 and said[0].startswith(f"{get_config(name).model_type}: peft has no default"), est.notes


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

    assert family_of(Gemma3Config().text_config) == "gemma3_text"
    # the multimodal model (kit.estimate.replay.gemma3_vision), as google/gemma-3-4b-it's config says it
    assert family_of(get_config("google/gemma-3-4b-it")) == "gemma3"
    # Llama-style names, but Granite's blocks scale the residuals and attention (its multipliers): not Llama's
    with pytest.raises(UnsupportedModel, match=r"^granite \(GraniteConfig\) is not estimated") as refused:
        estimate(GraniteConfig(**_TINY), batch_size=1, seq_len=8)
    assert refused.value.code == NO_REPLAY


_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256)


def _hybrids():
    """Decoders whose blocks no family replays: the Mamba hybrids Falcon-H1 and Jamba (one expert, so dense: refused
    for its blocks, not as a mixture of experts). (Qwen3.5 text, refused here before, has its own replay now:
    tests/test_qwen3_5.py.)"""
    from transformers import FalconH1Config, JambaConfig

    return {"falcon_h1": FalconH1Config(**_TINY), "jamba": JambaConfig(**_TINY, num_experts=1)}


@pytest.mark.parametrize("model_type", ["falcon_h1", "jamba"])
def test_a_family_without_a_replay_is_refused_never_taken_for_llama(model_type):
    """Issue 46 item 5: these were estimated "as Llama's blocks" (as Qwen3.5 was, at 0.08x its measured peak,
    "fits"); now they are refused in one sentence, from the config and from the built model alike."""
    cfg = _hybrids()[model_type]
    with pytest.raises(UnsupportedModel, match=rf"^{model_type} \(\w+Config\) is not estimated: no family") as got:
        estimate(cfg, batch_size=1, seq_len=8)
    assert got.value.code == NO_REPLAY and "kit.watch(trainer)" in str(got.value) and len(str(got.value)) < 400
    assert str(got.value).count(". ") == 0      # one sentence
    if model_type != "falcon_h1":               # their layer types say why
        assert "has its blocks (its layer_types hold linear_attention)" in str(got.value)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UnsupportedModel) as built:
        estimate(model, batch_size=1, seq_len=8)
    assert built.value.code == NO_REPLAY


def test_blocks_are_checked_class_by_class():
    """A model_type the kit replays, but a block that holds another class (the user's own attention, or a layer
    type its family does not replay), is refused; the twins of Mistral and Qwen2 are Llama's blocks op for op."""
    from transformers import Qwen2Config
    from transformers.models.llama.modeling_llama import LlamaAttention

    class MyAttention(LlamaAttention):
        pass

    model = build_model("tiny-llama", device="meta")
    model.model.layers[1].self_attn.__class__ = MyAttention
    with pytest.raises(UnsupportedModel, match=r"its block model\.layers\.1 holds MyAttention") as swapped:
        estimate(model, batch_size=1, seq_len=8)
    assert swapped.value.code == BLOCKS_DIFFER
    odd = Qwen2Config(**_TINY, layer_types=["full_attention", "linear_attention"] * 2)
    with pytest.raises(UnsupportedModel, match="its layer_types hold linear_attention") as types:
        family_of(odd)
    assert types.value.code == LAYER_TYPES
    for twin in ("tiny-mistral", "tiny-qwen2"):
        assert any("which its blocks are op for op" in n for n in estimate(twin, batch_size=1, seq_len=8).notes)


@pytest.mark.xfail(not hasattr(__import__("kit.inputs").inputs, "Refusal"), raises=UnsupportedModel, strict=True,
                   reason="kit.check prints the kit's refusals as answers once kit.inputs.Refusal (the faces' "
                          "branch) is in; until then it raises the refusal")
def test_kit_check_answers_a_hybrid_with_the_refusal(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    import kit

    model = AutoModelForCausalLM.from_config(_hybrids()["jamba"])
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=2, use_cpu=True, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=bench._Batches(4, 32, 256, True))
    kit.check(trainer)
    said = capsys.readouterr().out
    assert "jamba (JambaConfig) is not estimated" in said and "fits" not in said.split("\n")[0]
    assert "Traceback" not in said


# Issue 35's two family misses, at the shapes it names: random configs, 2 layers, rows all full length, AdamW, 3 Trainer
# steps, measured by benchmarks/real_clients.py's meter (the profiler's memory events, not the kit's TensorPeak).
# The replay is not what missed: each run did something the estimate from a bare config was not told, and told it
# (or reading the Trainer), the estimate is within 2% at step 1 and at the steady step.
#   qwen3: the run's optim was "adamw_torch" (the kit's "adamw": torch's single-tensor CPU step makes full-size
#          temporaries, so the step sets the peak); estimate(config) takes Trainer's default, adamw_torch_fused.
#   gpt_neox: the run called model.enable_input_require_grads() before get_peft_model, so block 0's first norm and
#          every LoRA input saves for backward; estimate(config) takes get_peft_model alone (input_require_grads=False
#          without checkpointing).
AUDITED = {
    "qwen3": (dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=512,
                   vocab_size=1536, num_hidden_layers=2), 2, 48,
              dict(gradient_checkpointing=True), dict(optimizer="adamw")),
    "gpt_neox": (dict(hidden_size=128, num_attention_heads=2, intermediate_size=384, vocab_size=1024,
                      num_hidden_layers=2), 2, 96,
                 dict(lora_r=8, lora_targets=["query_key_value"]), dict(input_require_grads=True)),
}


class _FullRows(torch.utils.data.Dataset):
    def __init__(self, n, S, V):
        self.ids = torch.randint(2, V, (n, S), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def _audited_run(family, tmp_path):
    """(config, the Trainer's estimate, the profiler meter's per-step peaks) of one audited case, run as it ran."""
    import real_clients as rc
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    shape, B, S, kw, told = AUDITED[family]
    cfg = AutoConfig.for_model(family, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    if told.get("input_require_grads"):
        model.enable_input_require_grads()
    if kw.get("lora_r"):
        model = get_peft_model(model, LoraConfig(r=kw["lora_r"], target_modules=kw["lora_targets"]))
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=B, max_steps=3, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             optim="adamw_torch" if told.get("optimizer") == "adamw" else "adamw_torch_fused",
                             **bench._ckpt_kw(kw.get("gradient_checkpointing", False)))
    trainer = Trainer(model=model, args=args, train_dataset=_FullRows(3 * B, S, cfg.vocab_size))
    est = estimate_trainer(trainer, device="cpu")
    meter = rc.meter_trainer(trainer, rc.ProfilerMeter())
    trainer.train()
    return cfg, est, meter.peaks


@pytest.mark.parametrize("family", list(AUDITED))
def test_the_audited_qwen3_and_gpt_neox_cases_are_within_2_percent_told_what_ran(family, tmp_path):
    cfg, from_trainer, peaks = _audited_run(family, tmp_path)
    _, B, S, kw, told = AUDITED[family]
    steady = max(peaks[1:])
    assert len(peaks) == 3
    told_est = estimate(cfg, batch_size=B, seq_len=S, padded=False, device="cpu", **kw, **told)
    for est in (from_trainer, told_est):
        assert 0.98 <= est.first_step_peak_bytes / peaks[0] <= 1.02, (family, est.first_step_peak_bytes, peaks)
        assert 0.98 <= est.peak_bytes / steady <= 1.02, (family, est.peak_bytes, peaks)
    # the cause: the one option the bare-config estimate was not told moves it by the audit's miss (-9.4%, -5.5%)
    untold = estimate(cfg, batch_size=B, seq_len=S, padded=False, device="cpu", **kw)
    assert untold.peak_bytes / steady < 0.96


def test_a_model_type_declared_twice_is_refused_and_a_new_family_is_known_at_once(monkeypatch):
    """register_family refuses a model type another family declared (no family is taken for another by accident,
    and nothing of the refused declaration is kept); a new declaration is what the registry's lookups answer."""
    from kit.estimate.replay import families, family, lookup

    monkeypatch.setattr(families, "_DECLARED", dict(families._DECLARED))
    llama = family("llama")
    with pytest.raises(ValueError, match="'mistral' is declared twice: by llama and by my_family"):
        families.register_family("my_family", block=llama.block, model_types=("my_family", "mistral"))
    assert lookup("my_family") is None and lookup("mistral") is llama
    mine = families.register_family("my_family", block=llama.block, lora_targets=("q_proj",))
    assert lookup("my_family") is mine and family("my_family").lora_targets == ("q_proj",) and not mine.encoder


# StableLM was added as one module (kit/estimate/replay/stablelm.py) and one register_family line, with its configs:
# its tiny twin is held to 0.5% of the tensor peak of real Trainer steps where it was added, a tighter bound than the
# grid's 2% above.
@pytest.mark.parametrize("label", ["full FT, sdpa", "full FT, checkpointing", "LoRA r8 (default targets)"])
def test_stablelm_twin_within_half_a_percent_of_a_cpu_trainer_step(label):
    r = _measured("tiny-stablelm", label)
    assert 0.995 <= r["est"].peak_bytes / r["got"]["peak"] <= 1.005, (r["est"].peak_moment, r["got"])


def test_stablelm_parallel_residual_and_dropout_match_autograd():
    """The layout the released StableLM models do not use but the config allows: attention and MLP on the same
    normed input (use_parallel_residual), dropout on the MLP's output (hidden_dropout)."""
    over = {"use_parallel_residual": True, "hidden_dropout": 0.1}
    r = bench.run_row("parallel residual, dropout", "tiny-stablelm", dict(batch_size=4, seq_len=128), False, over)
    assert r["est"].saved_bytes == pytest.approx(r["saved"], rel=1e-3)
    assert 0.98 <= r["est"].peak_bytes / r["got"]["peak"] <= 1.02, (r["est"].peak_moment, r["got"])


def test_stablelm_per_head_qk_norms_are_refused():
    """StableLM-2 12B's per-head q/k LayerNorms (qk_layernorm) are not replayed: refused in one sentence."""
    cfg = get_config("tiny-stablelm")
    cfg.qk_layernorm = True
    with pytest.raises(UnsupportedModel, match=r"^stablelm \(StableLmConfig\) normalizes q and k per head"):
        estimate(cfg, batch_size=1, seq_len=8)
