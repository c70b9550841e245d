"""The 16-bit dtype rule (kit.dtypes): fp16 on a GPU without native bf16 (a T4), bf16 from Ampere up,
applied where the kit chooses a dtype for a run, with the GPU's compute capability faked."""
import pytest
import torch

from kit import dtypes, models
from kit.scenarios import notebook
from kit.scenarios.custom_head import notebook as s1nb
from kit.scenarios.custom_head import scenario as s1


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
