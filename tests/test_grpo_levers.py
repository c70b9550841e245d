"""The fit advisor's GRPO levers (kit.advise.grpo_levers): each a change in the user's own GRPOConfig, estimated by
estimate_from(grpo_config=...) as a config the user wrote with that change would be, answer first."""
import warnings

import pytest

trl = pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

from kit.advise import advise, limit_for  # noqa: E402
from kit.advise import grpo_levers as gl  # noqa: E402
from kit.estimate import estimate_from  # noqa: E402
from kit.units import wrap  # noqa: E402

warnings.filterwarnings("ignore")
MODEL, PROMPT = "Qwen/Qwen2.5-0.5B", 64
T4 = dict(bf16=False, fp16=True)   # a T4 has no bf16: fp16 mixed precision, the model loaded in fp32


def _config(**kw):
    return GRPOConfig(output_dir="/tmp/kit-grpo-levers", report_to="none", **{**T4, **kw})


BIG = dict(per_device_train_batch_size=16, num_generations=16, max_completion_length=512, beta=0.04,
           gradient_checkpointing=False)


@pytest.fixture(scope="module")
def big_advice():
    est = estimate_from(MODEL, grpo_config=_config(**BIG), seq_len=PROMPT)
    return est, advise(est, "colab-t4")


def test_each_lever_is_estimated_as_the_config_written_with_it(big_advice):
    """A lever's figure is the judged figure of estimate_from on a GRPOConfig built with its fields (TRL's own
    __post_init__ deriving generation_batch_size), so the pasted change gives what the advisor said."""
    est, a = big_advice
    lim = limit_for("colab-t4")
    singles = [c for c in a.changes if " + " not in c.name]
    assert {c.name for c in singles} >= {"gradient checkpointing", "no reference model", "LoRA", "shorter completions",
                                         "fewer generations a prompt", "half the batch, twice the steps per generation"}
    for c in singles:
        if c.peft:
            continue
        cfg = _config(**{**BIG, **c.changes})
        assert cfg.generation_batch_size % cfg.num_generations == 0
        again = estimate_from(MODEL, grpo_config=cfg, seq_len=PROMPT)
        assert c.judged_bytes == gl.judged(again, lim), c.name
        assert c.est.setup["generation_rows"] == cfg.per_device_train_batch_size * cfg.steps_per_generation


def test_batch_against_steps_keeps_the_rollouts_and_halves_the_training_rows(big_advice):
    est, a = big_advice
    c = next(c for c in a.changes if c.name.startswith("half the batch"))
    assert c.est.setup["generation_rows"] == est.setup["generation_rows"]
    assert c.est.setup["batch_size"] == est.setup["batch_size"] // 2
    assert c.changes["steps_per_generation"] == 2 * est.inputs["grpo_config"].steps_per_generation


def test_lora_lever_turns_the_reference_copy_into_the_disabled_adapter(big_advice):
    est, a = big_advice
    lora = next(c for c in a.changes if c.name == "LoRA")
    assert est.setup["reference"] == "model" and lora.est.setup["reference"] == "adapter-disabled"
    assert lora.est.setup["reference_weights_bytes"] == 0 and "LoraConfig(r=16" in lora.code()
    beta0 = next(c for c in a.changes if c.name == "no reference model")
    assert beta0.est.setup["reference"] == "none" and beta0.changes == {"beta": 0.0}


def test_answer_first_verdict_cause_and_one_best_change(big_advice):
    est, a = big_advice
    lines = a.answer()
    assert len(wrap("\n".join(lines)).splitlines()) <= 5 and lines[0].startswith("DOES NOT FIT Colab T4:")
    assert "14.56 GiB" in lines[0] and "short" in lines[0]
    assert lines[1].startswith("biggest cause: the training step") and "reference copy" in lines[1]
    best = a.suggestions[0]
    assert best.fits and lines[2].startswith(f"best change: {best.code()}")
    assert lines[2].startswith("best change: GRPOConfig(gradient_checkpointing=True, ...)")
    assert not a.fits and a.judged_bytes == gl.judged(est, limit_for("colab-t4"))


def test_a_setup_that_fits_needs_no_change():
    est = estimate_from(MODEL, grpo_config=_config(per_device_train_batch_size=4, num_generations=4,
                                                   max_completion_length=128), seq_len=PROMPT)
    a = advise(est, "colab-t4")
    assert a.fits and a.answer()[-1] == "no change needed"


def test_no_single_lever_fits_then_pairs_are_tried():
    cfg = _config(per_device_train_batch_size=32, num_generations=32, max_completion_length=4096, beta=0.04)
    est = estimate_from(MODEL, grpo_config=cfg, seq_len=PROMPT)
    a = advise(est, "colab-t4")
    assert not any(c.fits for c in a.changes if " + " not in c.name)
    assert any(" + " in c.name for c in a.changes)
    best = a.suggestions[0]
    assert best.fits and " + " in best.name
    one, two = best.name.split(" + ")
    parts = {c.name: c for c in a.changes if " + " not in c.name}
    assert best.changes == {**parts[one].changes, **parts[two].changes}
    assert best.peft == (parts[one].peft or parts[two].peft)
    assert len(wrap("\n".join(a.answer())).splitlines()) <= 5


def test_vllm_colocate_share_is_judged_and_its_levers_are_labelled_not_measured():
    cfg = _config(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.5, per_device_train_batch_size=8,
                  num_generations=8, max_completion_length=256)
    est = estimate_from(MODEL, grpo_config=cfg, seq_len=PROMPT)
    lim = limit_for("colab-t4")
    assert gl.judged(est, lim) == lim.judged(est) + int(0.5 * lim.limit_bytes)
    a = advise(est, "colab-t4")
    names = {c.name: c for c in a.changes if " + " not in c.name}
    sleep = names["vLLM sleep mode (not measured)"]
    assert sleep.judged_bytes < a.judged_bytes and "not measured" in sleep.cost
    assert names["a smaller vLLM share (not measured)"].changes == {"vllm_gpu_memory_utilization": 0.4}
    assert any("not measured" in n for n in a.notes)


def test_changed_config_refuses_what_trl_refuses():
    cfg = _config(per_device_train_batch_size=6, num_generations=6)
    assert gl.changed_config(cfg, {"num_generations": 4}) is None   # 6 rows are no whole groups of 4
    assert gl.changed_config(cfg, {"per_device_train_batch_size": 12}).generation_batch_size == 12


def test_check_prints_the_grpo_answer(capsys):
    from kit.advise.check import check

    check(estimate_from(MODEL, grpo_config=_config(**BIG), seq_len=PROMPT), device="colab-t4")
    out = capsys.readouterr().out
    assert out.startswith("DOES NOT FIT Colab T4") and "best change: GRPOConfig(" in out and "no advice" not in out
