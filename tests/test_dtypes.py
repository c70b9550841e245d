"""The 16-bit dtype rule (kit.dtypes): fp16 on a GPU without native bf16 (a T4), bf16 from Ampere up,
applied where the kit chooses a dtype for a run, with the GPU's compute capability faked; and the estimate
telling bf16 from fp16 (a bf16 weight under fp16 autocast gets an fp16 copy) against a real CPU step."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

from kit import dtypes, models  # noqa: E402
from kit.scenarios import notebook  # noqa: E402
from kit.scenarios.custom_head import notebook as s1nb  # noqa: E402
from kit.scenarios.custom_head import scenario as s1  # noqa: E402


@pytest.fixture
def t4(monkeypatch):
    """This process sees a T4: CUDA present, compute capability 7.5 (no real GPU is touched)."""
    from kit import machine

    monkeypatch.setattr(machine, "compute_capability", lambda: (7, 5))
    return machine


def test_the_rule_by_compute_capability():
    assert dtypes.run_dtype((7, 5))[0] == "fp16" and "no native bf16" in dtypes.run_dtype((7, 5))[1]
    assert [dtypes.run_dtype(c)[0] for c in ((8, 0), (8, 9), (9, 0))] == ["bf16"] * 3
    assert dtypes.run_dtype(None)[0] == "bf16"                     # a CPU
    assert dtypes.for_preset("colab-t4")[0] == "fp16" and dtypes.for_preset("h100")[0] == "bf16"


def test_on_a_t4_the_runs_take_fp16_and_say_why(t4):
    assert dtypes.for_this_device() == dtypes.run_dtype((7, 5))
    assert "16-bit dtype of the runs: fp16 (compute capability 7.5 has no native bf16" in notebook.run_note()
    c = s1.fix_setup("c", "smoke")                                 # scenario 1's fix (c)
    assert c["load_dtype"] == "fp16" and c["precision"] == "fp32" and "fp16 weights" in c["name"]


def test_a_4bit_load_on_a_t4_computes_in_fp16(t4, monkeypatch):
    seen = {}

    def fake_from_pretrained(path, **kwargs):  # stops before any weight is read: only the choice is tested
        seen.update(kwargs)
        raise RuntimeError("stop")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(models, "_check_bnb", lambda device: None)
    with pytest.raises(RuntimeError, match="stop"):
        models.load_model("tiny-llama", quantization="4bit", device="cuda")
    assert seen["quantization_config"].bnb_4bit_compute_dtype == torch.float16
    assert seen["dtype"] == torch.float16


def test_estimates_for_a_named_preset_follow_the_rule():
    text = s1nb.fixes_at_real_size("colab-t4")
    assert "(c) VxV head, fp16 weights" in text
    assert "(c) VxV head, bf16 weights" in s1nb.fixes_at_real_size("a100-80")


# ---- bf16 is not fp16: the estimate tells them apart ------------------------------------------------
def _small_vocab_llama():
    from kit.models import get_config

    cfg = get_config("tiny-llama")
    cfg.vocab_size = 256  # the blocks, not the logits, hold most of the step
    return cfg


def test_bf16_weights_under_fp16_autocast_match_a_cpu_step():
    """bf16 weights (transformers 5's default load) under fp16 autocast (a T4 with fp16=True): autocast casts
    every bf16 weight to fp16 at each use (its cast cache keeps fp32 leaves only), the backward keeps the
    copies, and bf16 embeddings plus fp16 linears promote the residual stream to fp32. The estimate of that
    setup against the peak of real hand-written steps under ``torch.autocast("cpu", dtype=torch.float16)``
    (Trainer ignores fp16 on a CPU, so the step drives autocast itself)."""
    import estimate_vs_measured as bench

    from kit.estimate import estimate
    from kit.models import build_model

    cfg = _small_vocab_llama()
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.bfloat16)
    got = bench.autocast_step_peak(model, B=4, S=128, V=cfg.vocab_size, dtype=torch.float16)
    est = estimate(cfg, batch_size=4, seq_len=128, load_dtype="bf16", precision="fp16", device="cpu")
    assert est.weights_bytes == got["weights"]
    assert 0.98 <= est.peak_bytes / got["peak"] <= 1.02, (est.peak_moment, est.peak_bytes, got["peak"])


def test_autocast_copies_only_where_the_dtypes_differ():
    """fp16 weights under fp16 and bf16 under bf16 make no autocast copies; bf16 under fp16 makes one of
    each block linear (2 bytes per weight, saved for the input's grad) and of the head."""
    from kit.estimate import estimate

    cfg = _small_vocab_llama()
    est = {(w, ac): estimate(cfg, batch_size=4, seq_len=128, load_dtype=w, precision=ac, device="cpu")
           for w, ac in (("fp16", "fp16"), ("bf16", "bf16"), ("bf16", "fp16"))}
    assert est["fp16", "fp16"].autocast_copies_bytes == est["bf16", "bf16"].autocast_copies_bytes == 0
    H, F, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * (H // cfg.num_attention_heads)
    block = H * H * 2 + H * kv * 2 + 3 * H * F   # q, o; k, v; gate, up, down (elements)
    assert est["bf16", "fp16"].autocast_copies_bytes == 2 * (L * block + V * H)
    assert est["bf16", "fp16"].peak_bytes > est["bf16", "bf16"].peak_bytes


def test_fp16_trainable_weights_under_fp16_are_still_refused():
    from kit.estimate import estimate
    from kit.inputs import InputError

    with pytest.raises(InputError, match="Attempting to unscale FP16 gradients"):
        estimate("tiny-llama", batch_size=1, seq_len=8, load_dtype="fp16", precision="fp16")
