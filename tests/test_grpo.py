"""TRL's GRPOTrainer (the behaviour of TRL 1.16): every GRPOConfig field modeled or refused by name,
estimate_trainer against real GRPOTrainer steps on a tiny CPU twin (the independent meter of
benchmarks/real_clients.py, with the generation phase metered apart), and estimate_from(grpo_config=...)."""
import functools
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

from kind_checks import (assert_fields_in_one_table, assert_refused_in_one_sentence,  # noqa: E402
                         assert_within_2_percent, cpu_config, run_generation_row, step_ratios)

from kit import inputs  # noqa: E402
from kit.estimate import estimate_from, grpo  # noqa: E402

warnings.filterwarnings("ignore")

# A value other than the default for each refused field (set on the built config: GRPOConfig's own checks may
# refuse some combinations first, and the estimator must refuse each by itself)
REFUSED_VALUES = {"router_aux_loss_coef": 0.01, "top_p": 0.9, "top_k": 50, "min_p": 0.1, "repetition_penalty": 1.1,
                  "cast_lm_head_to_fp32": True, "cache_implementation": "static",
                  "entropy_coef": 0.1, "use_adaptive_entropy": True, "entropy_coef_min": 0.1, "entropy_coef_max": 0.5,
                  "entropy_coef_delta": 0.01, "entropy_target": 0.3, "max_tool_calling_iterations": 2,
                  "use_transformers_continuous_batching": True, "transformers_continuous_batching_config": {},
                  "use_transformers_paged": True}


_config = functools.partial(cpu_config, GRPOConfig)


def test_every_grpo_config_field_is_modeled_or_refused():
    assert_fields_in_one_table(GRPOConfig, grpo)
    assert set(REFUSED_VALUES) == set(grpo.REFUSED)


@pytest.mark.parametrize("field", sorted(grpo.REFUSED))
def test_refused_field_gets_one_sentence_naming_it(field):
    assert_refused_in_one_sentence(grpo.read_grpo_config, _config(), field, REFUSED_VALUES[field])


def test_default_config_reads_without_refusal_and_names_no_memory_fields():
    opts, src, notes = grpo.read_grpo_config(_config())
    assert opts == {"fused_lm_head": True}
    assert all(k in src for k in grpo.NO_MEMORY)


def test_unknown_generation_kwargs_refused_by_name():
    with pytest.raises(inputs.InputError, match="num_beams") as e:
        grpo.read_grpo_config(_config(generation_kwargs={"num_beams": 4}))
    assert e.value.name == "generation_kwargs"


def test_estimate_from_grpo_config_phases():
    """Prompt 12 + completion 16 on the tiny Qwen2: the reference copy adds the loaded weights, the generation phase
    is its own figure (step 1 without optimizer state), the buffered rollouts sit beside the training step."""
    kw = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16)
    plain = estimate_from("tiny-qwen2", grpo_config=_config(**kw), seq_len=12, device="cpu")
    ref = estimate_from("tiny-qwen2", grpo_config=_config(beta=0.04, **kw), seq_len=12, device="cpu")
    assert plain.setup["reference"] == "none" and ref.setup["reference"] == "model"
    assert ref.weights_bytes - plain.weights_bytes == plain.loaded_weights_bytes
    assert plain.setup["seq_len"] == 28 and plain.setup["generation_rows"] == 4
    assert plain.setup["first_generation_peak_bytes"] < plain.setup["generation_peak_bytes"]
    assert ref.setup["generation_moment"].startswith("the reference's no-grad pass")
    spg = estimate_from("tiny-qwen2", grpo_config=_config(steps_per_generation=2, **kw), seq_len=12, device="cpu")
    assert spg.setup["generation_rows"] == 8 and spg.setup["old_logprob_pass"]


def test_estimate_from_needs_the_prompt_length():
    with pytest.raises(inputs.InputError, match="longest prompt"):
        estimate_from("tiny-qwen2", grpo_config=_config())


def test_vllm_colocate_share_labelled_not_measured():
    cfg = _config(use_vllm=True, vllm_gpu_memory_utilization=0.25, max_completion_length=64)
    est = estimate_from("tiny-qwen2", grpo_config=cfg, seq_len=12)
    assert est.setup["vllm_reserved_fraction"] == 0.25
    note = [n for n in est.notes if getattr(n, "code", "") == "grpo-vllm-share"]
    assert note and "not measured" in str(note[0])
    assert est.setup["old_logprob_pass"]   # vLLM's importance sampling correction (on by default)


@pytest.mark.parametrize("kind", ["beta0", "beta"])
def test_trainer_steps_and_generation_within_2_percent(tmp_path, kind, monkeypatch):
    """estimate_trainer's step 1, steady step and generation phase against the profiler meter's readings of real
    GRPOTrainer steps (TRL's quick-start reward, fixed completion lengths)."""
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    from clients_grpo import client_grpo

    est, peaks, setup = run_generation_row(client_grpo(str(tmp_path), kind))
    assert_within_2_percent(f"GRPOTrainer {kind}", step_ratios(est, peaks, generation=True), setup)


@pytest.mark.gpu
def test_gpu_vllm_colocate_reserves_its_share():
    """What a GPU must confirm (vLLM cannot run on this CPU machine): GRPOTrainer with use_vllm=True in colocate mode
    takes about vllm_gpu_memory_utilization of the device beside training, as the estimate's setup says."""
    pytest.importorskip("vllm")
    from clients_grpo import reward_num_unique_chars
    from real_clients import twin_dir
    from trl import GRPOTrainer

    from kit import data

    free_before, total = torch.cuda.mem_get_info()
    args = GRPOConfig(output_dir=str("/tmp/kit-grpo-vllm"), use_vllm=True, vllm_mode="colocate",
                      vllm_gpu_memory_utilization=0.3, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=16, max_steps=1, report_to="none")
    from datasets import Dataset

    tr = GRPOTrainer(model=twin_dir("tiny-qwen2", "/tmp/kit-grpo-vllm"), reward_funcs=reward_num_unique_chars,
                     args=args, processing_class=data.shipped_tokenizer(),
                     train_dataset=Dataset.from_dict({"prompt": ["the the the"] * 8}))
    taken = free_before - torch.cuda.mem_get_info()[0]
    est = estimate_from("tiny-qwen2", grpo_config=args, seq_len=3)
    assert abs(taken - est.setup["vllm_reserved_fraction"] * total) <= 0.05 * total
    del tr


def test_watch_draws_the_generation_as_a_stage_of_its_own(tmp_path, monkeypatch):
    """kit.watch on a GRPOTrainer: each step's generation is a "generation" stage (the phase callback says which
    step's), the timeline draws it, and close() puts GRPOTrainer's method back."""
    import kit
    from clients_grpo import client_grpo
    from kit.plot import timeline

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    _, _, tr, _ = next(client_grpo(str(tmp_path), "beta0"))
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
    assert timeline(w.tracker) is not None
    w.close()
    assert tr._generate_and_score_completions is spy


def test_check_prints_the_generation_phase(capsys):
    """kit.check of a GRPO estimate: the answer first, then the setup with the generation phase's own peak."""
    import kit

    est = estimate_from("tiny-qwen2", grpo_config=_config(beta=0.04, max_completion_length=16), seq_len=12)
    kit.check(est, device="colab-t4")
    out = capsys.readouterr().out
    assert out.startswith("fits Colab T4") and "generation phase:" in out
    assert f"{est.setup['generation_rows']} rows x 12 + 16 tokens" in out


@pytest.mark.parametrize("field, value, words", [
    ("max_completion_length", None, "max_completion_length=None leaves the completion's length to generate()"),
    ("max_completion_length", 0, "max_completion_length=0: GRPOTrainer needs it a whole number >= 1"),
    ("max_completion_length", -5, "max_completion_length=-5: GRPOTrainer needs it a whole number >= 1"),
    ("steps_per_generation", 0, "steps_per_generation=0: GRPOTrainer needs it a whole number >= 1"),
    ("num_iterations", 0, "num_iterations=0: GRPOTrainer needs it a whole number >= 1"),
])
def test_i50_3_8_lengths_trl_takes_but_cannot_run_are_refused_by_name(field, value, words):
    """TRL 1.16's GRPOConfig accepts each; GRPOTrainer cannot run it (generate's own defaults, a DataLoader of 0
    prompts, a step count divided by 0): one sentence naming the field, never a TypeError or ZeroDivisionError."""
    cfg = _config(per_device_train_batch_size=4, num_generations=4, **{field: value})
    with pytest.raises(inputs.InputError) as caught:
        estimate_from("tiny-qwen2", grpo_config=cfg, seq_len=12, device="cpu")
    assert words in str(caught.value) and caught.value.name == field, str(caught.value)


@pytest.mark.parametrize("seq_len", [0, -3])
def test_i50_8_a_prompt_length_below_one_is_refused_as_plain_trainers_refuse_it(seq_len):
    cfg = _config(per_device_train_batch_size=4, num_generations=4, max_completion_length=16)
    with pytest.raises(inputs.InputError, match=f"seq_len must be a whole number >= 1, not {seq_len}") as caught:
        estimate_from("tiny-qwen2", grpo_config=cfg, seq_len=seq_len, device="cpu")
    assert caught.value.name == "seq_len"


def test_i50_8_a_completion_beyond_the_positions_names_max_completion_length_not_the_prompt():
    cfg = _config(per_device_train_batch_size=4, num_generations=4, max_completion_length=10_000_000)
    with pytest.raises(inputs.InputError) as caught:
        estimate_from("tiny-qwen2", grpo_config=cfg, seq_len=12, device="cpu")
    from kit.model_configs import get_config

    most = get_config("tiny-qwen2").max_position_embeddings
    assert caught.value.name == "max_completion_length" and "seq_len <=" not in str(caught.value)
    assert f"use max_completion_length <= {most - 12}" in str(caught.value), str(caught.value)


def test_i50_9_a_grpo_config_in_the_training_args_slot_is_read_as_grpo():
    kw = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16)
    slot = estimate_from("tiny-qwen2", _config(**kw), seq_len=12, device="cpu")
    named = estimate_from("tiny-qwen2", grpo_config=_config(**kw), seq_len=12, device="cpu")
    assert slot.setup.get("grpo") and slot.peak_bytes == named.peak_bytes
    assert slot.setup["generation_peak_bytes"] == named.setup["generation_peak_bytes"]


def test_i50_9_another_trl_config_in_the_training_args_slot_is_refused_by_its_type():
    from trl.experimental.orpo import ORPOConfig

    with pytest.raises(inputs.InputError, match="ORPOConfig") as caught:
        estimate_from("tiny-qwen2", ORPOConfig(output_dir="/tmp/kit-orpo", use_cpu=True, bf16=False), seq_len=12)
    assert caught.value.code == "trl-trainer"


def test_i50_7_vllm_colocate_share_is_in_the_verdicts_figure(capsys):
    """The verdict's judged figure holds vLLM colocate's share (vllm_gpu_memory_utilization x the device), named on
    its first line, not only under details; with sleep mode it sits beside the generation phase only."""
    import kit
    from kit.presets import PRESETS, verdict

    kw = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=64, use_vllm=True)
    est = estimate_from("tiny-qwen2", grpo_config=_config(**kw), seq_len=12)
    t4 = PRESETS["colab-t4"].gpu_bytes
    v = verdict(est, "colab-t4")
    assert v.judged_bytes == est.reserved_bytes + int(0.3 * t4) and "with vLLM's share of 4.37 GiB" in v.text
    kit.check(est, device="colab-t4")
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("fits Colab T4: ") and "vLLM's share" in first, first
    asleep = estimate_from("tiny-qwen2", grpo_config=_config(vllm_enable_sleep_mode=True, **kw), seq_len=12)
    gap = asleep.reserved_bytes - asleep.peak_bytes
    assert verdict(asleep, "colab-t4").judged_bytes == max(
        asleep.reserved_bytes, asleep.setup["generation_peak_bytes"] + gap + int(0.3 * t4))


def test_i50_7_vllm_with_use_cpu_gets_a_word_in_the_brief(capsys):
    import kit

    est = estimate_from("tiny-qwen2", grpo_config=_config(use_vllm=True, max_completion_length=16,
                                                          per_device_train_batch_size=4, num_generations=4),
                        seq_len=12)
    assert any(getattr(n, "code", "") == "grpo-vllm-cpu" for n in est.notes)
    kit.check(est, device="colab-t4")
    assert "use_vllm=True with use_cpu=True" in capsys.readouterr().out
