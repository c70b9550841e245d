"""TRL's RLOOTrainer (the behaviour of TRL 1.16): every RLOOConfig field modeled or refused by name,
estimate_trainer against real RLOOTrainer steps on a tiny CPU twin (the independent meter of
benchmarks/real_clients.py, with the generation phase metered apart), estimate_from(rloo_config=...), the watch's
generation stage, kit.check's answer and the advisor's one sentence."""
import functools
import warnings

import pytest

trl = pytest.importorskip("trl")
from trl import RLOOConfig  # noqa: E402

from kind_checks import (assert_fields_in_one_table, assert_refused_in_one_sentence,  # noqa: E402
                         assert_within_2_percent, cpu_config, run_generation_row, step_ratios)

from kit import inputs  # noqa: E402
from kit.estimate import estimate_from, grpo, rloo  # noqa: E402
from kit.estimate.replay import F32, I64  # noqa: E402

warnings.filterwarnings("ignore")

# A value other than the default for each refused field (set on the built config, as test_grpo does)
REFUSED_VALUES = {"router_aux_loss_coef": 0.01, "top_p": 0.9, "top_k": 50, "min_p": 0.1, "repetition_penalty": 1.1,
                  "cache_implementation": "static", "use_transformers_continuous_batching": True,
                  "transformers_continuous_batching_config": {}, "use_transformers_paged": True}
SHAPES = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16)


_config = functools.partial(cpu_config, RLOOConfig)


def test_every_rloo_config_field_is_modeled_or_refused():
    assert_fields_in_one_table(RLOOConfig, rloo)
    assert set(REFUSED_VALUES) == set(rloo.REFUSED)


@pytest.mark.parametrize("field", sorted(rloo.REFUSED))
def test_refused_field_gets_one_sentence_naming_it(field):
    assert_refused_in_one_sentence(rloo.read_rloo_config, _config(), field, REFUSED_VALUES[field])


def test_estimate_from_rloo_config_reads_rloos_defaults_and_rollouts():
    """RLOOConfig's beta defaults to 0.05: a reference copy; the old-log-prob pass runs at every generation; the
    buffered rollouts hold [G] summed log-probs, not GRPO's [G, C] ones."""
    est = estimate_from("tiny-qwen2", rloo_config=_config(**SHAPES), seq_len=12, device="cpu")
    no_ref = estimate_from("tiny-qwen2", rloo_config=_config(beta=0.0, **SHAPES), seq_len=12, device="cpu")
    assert est.kind == "rloo" and est.setup["rloo"] and "grpo" not in est.setup
    assert est.setup["reference"] == "model" and no_ref.setup["reference"] == "none"
    assert est.weights_bytes - no_ref.weights_bytes == no_ref.loaded_weights_bytes
    assert est.setup["old_logprob_pass"] and no_ref.setup["old_logprob_pass"]
    G, P, C = 4, 12, 16
    assert est.setup["buffered_rollouts_bytes"] == 2 * G * (P + C) * I64 + 2 * G * F32
    assert est.sources["reference"][1].startswith("RLOOTrainer.__init__")
    assert est.sources["batch_size"][1].startswith("RLOOConfig.per_device_train_batch_size")
    as_grpo = estimate_from("tiny-qwen2", grpo_config=grpo_config(beta=0.05, **SHAPES), seq_len=12, device="cpu")
    assert as_grpo.setup["buffered_rollouts_bytes"] > est.setup["buffered_rollouts_bytes"]


def grpo_config(**kw):
    from trl import GRPOConfig

    return cpu_config(GRPOConfig, "/tmp/kit-rloo-test", **kw)


def test_an_rloo_config_in_the_training_args_slot_is_read_as_rloo_and_not_as_grpo():
    slot = estimate_from("tiny-qwen2", _config(**SHAPES), seq_len=12, device="cpu")
    named = estimate_from("tiny-qwen2", rloo_config=_config(**SHAPES), seq_len=12, device="cpu")
    assert slot.setup.get("rloo") and slot.peak_bytes == named.peak_bytes
    with pytest.raises(inputs.InputError, match="grpo_config is a RLOOConfig, not a trl GRPOConfig"):
        estimate_from("tiny-qwen2", grpo_config=_config(**SHAPES), seq_len=12, device="cpu")


def test_estimate_from_needs_the_prompt_length_and_names_rloo():
    with pytest.raises(inputs.InputError, match=r"estimate_from\(rloo_config=...\) needs seq_len") as caught:
        estimate_from("tiny-qwen2", rloo_config=_config())
    assert "RLOOTrainer does not truncate prompts" in str(caught.value)


def test_a_completion_length_trl_takes_but_cannot_run_names_rloo():
    with pytest.raises(inputs.InputError) as caught:
        estimate_from("tiny-qwen2", rloo_config=_config(**dict(SHAPES, max_completion_length=0)), seq_len=12)
    assert "RLOOConfig.max_completion_length=0: RLOOTrainer needs it a whole number >= 1" in str(caught.value)


@pytest.mark.parametrize("kind", ["beta", "lora", "b8"])
def test_trainer_steps_and_generation_within_2_percent(tmp_path, kind, monkeypatch):
    """estimate_trainer's step 1, steady step and generation phase against the profiler meter's readings of real
    RLOOTrainer steps (TRL's quick-start reward, fixed completion lengths): RLOOConfig's default reference copy,
    LoRA with the adapter-disabled reference, and RLOOConfig's default batch of 8, where the old-log-prob pass (run at
    every generation, unlike GRPO's) is the generation's peak."""
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    from clients_rloo import client_rloo

    est, peaks, setup = run_generation_row(client_rloo(str(tmp_path), kind))
    assert_within_2_percent(f"RLOOTrainer {kind}", step_ratios(est, peaks, generation=True), setup)
    assert est.setup["reference"] == ("adapter-disabled" if kind == "lora" else "model")
    if kind == "b8":
        assert est.setup["generation_moment"] == "a no-grad log-prob pass (at the fused head)"


def test_watch_draws_the_generation_as_a_stage_of_its_own(tmp_path, monkeypatch):
    """kit.watch on an RLOOTrainer: each step's generation is a "generation" stage, and close() puts the method back."""
    import kit
    from clients_rloo import client_rloo

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    _, _, tr, _ = next(client_rloo(str(tmp_path), "beta0"))
    tr.args.max_steps = 2
    seen = []
    inner = tr._generate_and_score_completions

    def spy(*a, **k):
        seen.append(w.phases.phase)
        return inner(*a, **k)

    tr._generate_and_score_completions = spy
    w = kit.watch(tr, plot=False, estimate=False)
    tr.train()
    stages = [r for r in w.tracker.records if r.name == "generation"]
    assert len(stages) == 2 and all(r.end is not None for r in stages)
    assert seen == ["first_generation", "generation"]
    w.close()
    assert tr._generate_and_score_completions is spy


def test_check_prints_the_generation_phase(capsys):
    """kit.check of an RLOO estimate: the answer first, then the setup with the generation phase's own peak."""
    import kit

    est = estimate_from("tiny-qwen2", rloo_config=_config(**SHAPES), seq_len=12)
    kit.check(est, device="colab-t4")
    out = capsys.readouterr().out
    assert out.startswith("fits Colab T4") and "generation phase:" in out
    assert f"{est.setup['generation_rows']} rows x 12 + 16 tokens" in out


def test_the_advisor_tries_grpos_levers_in_the_users_rloo_config():
    """Where an RLOO setup does not fit, the advisor tries GRPO's levers as changes in the RLOOConfig, each estimated
    by estimate_from(rloo_config=...): dropping the reference (RLOOConfig's default beta is 0.05) frees its copy."""
    from kit.advise import advise

    est = estimate_from("tiny-qwen2", rloo_config=_config(**SHAPES), seq_len=12)
    a = advise(est, device=est.peak_bytes)   # (judged with the allocator's gap and a margin: it does not fit)
    assert not a.fits
    no_ref = next(c for c in a.changes if c.name == "no reference model")
    assert no_ref.code() == "RLOOConfig(beta=0.0, ...)" and no_ref.est.kind == "rloo"
    assert no_ref.est.setup["reference"] == "none" and no_ref.judged_bytes < a.judged_bytes
    assert no_ref.cost == "no KL penalty towards the reference (RLOOConfig's default is beta=0.05)"
    text = a.text(details=True)
    assert "(RLOO, modelled)" in text and "each RLOO lever alone" in text and "GRPO" not in text, text


def test_kit_train_judges_each_rloo_step_against_its_estimate(tmp_path, monkeypatch):
    """kit.train on an RLOOTrainer (every op watched on the CPU): step 1 and the later steps within 2% of the
    estimate read from the same Trainer (measured 1.000 for both)."""
    import kit
    from clients_rloo import client_rloo

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    _, _, tr, _ = next(client_rloo(str(tmp_path), "beta"))
    r = kit.train(tr, plot=False, tensor_peak=True)
    print(f"RLOOTrainer under kit.train: step 1 {r.first_step_ratio:.4f}, later {r.later_steps_ratio:.4f}")
    assert not r.oom and r.step == 3 and r.peak_exact
    assert 0.98 <= r.first_step_ratio <= 1.02 and 0.98 <= r.later_steps_ratio <= 1.02
