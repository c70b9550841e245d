"""TRL's DistillationTrainer (the behaviour of TRL 1.16): every DistillationConfig field modeled or refused by name,
estimate_trainer against real DistillationTrainer steps on tiny CPU twins (a tiny-qwen2 student and a wider
tiny-qwen2 teacher, the independent meter of benchmarks/real_clients.py, with the generation phase metered apart),
and kit.check's answer with the advisor's one sentence."""
import functools
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import DistillationConfig  # noqa: E402

from kind_checks import (assert_fields_in_one_table, assert_refused_in_one_sentence,  # noqa: E402
                         assert_within_2_percent, cpu_config, run_generation_row, step_ratios)

from kit import inputs  # noqa: E402
from kit.estimate import distillation, estimate_from  # noqa: E402

warnings.filterwarnings("ignore")

# A value other than the default for each refused field
REFUSED_VALUES = {"top_p": 0.9, "top_k": 50, "min_p": 0.1, "repetition_penalty": 1.1, "cache_implementation": "static",
                  "max_tool_calling_iterations": 2}


_config = functools.partial(cpu_config, DistillationConfig)


def test_every_distillation_config_field_is_modeled_or_refused():
    assert_fields_in_one_table(DistillationConfig, distillation)
    assert set(REFUSED_VALUES) == set(distillation.REFUSED)


@pytest.mark.parametrize("field", sorted(distillation.REFUSED))
def test_refused_field_gets_one_sentence_naming_it(field):
    assert_refused_in_one_sentence(distillation.read_distillation_config, _config(), field, REFUSED_VALUES[field])


def test_bf16_is_read_as_trl_runs_it_and_fp16_is_refused_in_one_sentence():
    """DistillationConfig defaults to bf16=True: TRL 1.16 runs the loss outside accelerate's autocast (the training
    step measured byte for byte as fp32's), generate() under it; fp16 (a GradScaler) is refused by name."""
    opts, src, _ = distillation.read_distillation_config(
        DistillationConfig(output_dir="/tmp/kit-distillation-test", use_cpu=True, report_to="none"))
    assert opts["precision"] == "fp32" and "outside accelerate's autocast" in src["precision"][1]
    with pytest.raises(inputs.InputError) as e:
        distillation.read_distillation_config(_config(fp16=True))
    assert e.value.name == "fp16" and e.value.code == "distillation-fp16"
    assert "estimate with fp16=False" in str(e.value) and str(e.value).count(". ") == 0


def test_a_half_precision_teacher_is_refused_by_name(tmp_path, monkeypatch):
    """Half weights make the divergence cast its chunks and tiles (not modeled): refused, naming the teacher."""
    from clients_distillation import client_distillation

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    gen = client_distillation(str(tmp_path), "full")
    _, _, trainer, make_estimate = next(gen)
    trainer.teacher_model.to(torch.bfloat16)
    with pytest.raises(inputs.InputError) as e:
        make_estimate()
    assert e.value.code == "distillation-half-weights" and "teacher's weights are in half precision" in str(e.value)
    gen.close()


def test_estimate_from_a_distillation_config_says_the_teacher_is_read_from_the_trainer():
    with pytest.raises(inputs.InputError) as e:
        estimate_from("tiny-qwen2", distillation_config=_config(), seq_len=12)
    assert e.value.code == "distillation-from-config" and "pass it to estimate_trainer or kit.check" in str(e.value)


def test_the_divergence_saves_both_hidden_states_and_three_vectors():
    """Several rows: both [:, -C:] slices copied by reshape (N = B x C rows each), and log_z twice and the
    per-token divergence, fp32."""
    B, S, C, Hs, Ht, V = 4, 28, 16, 128, 256, 4096
    head = distillation.divergence_head(B=B, S=S, C=C, Hs=Hs, Ht=Ht, V=V, dt=4, beta=1.0, head_trainable=True,
                                        device="cpu")
    assert head["saved"] == B * C * (Hs + Ht) * 4 + 3 * B * C * 4
    jsd = distillation.divergence_head(B=B, S=S, C=C, Hs=Hs, Ht=Ht, V=V, dt=4, beta=0.5, head_trainable=True,
                                       device="cpu")
    assert jsd["forward"] - head["forward"] == B * C * V * 4   # one more [n, c] tile in the JSD's second pass


@pytest.mark.parametrize("kind", ["full", "jsd", "lora", "accum2", "bf16", "bf16-lora", "padded"])
def test_trainer_steps_and_generation_within_2_percent(tmp_path, kind, monkeypatch):
    """estimate_trainer's step 1, steady step and generation phase against the profiler meter's readings of real
    DistillationTrainer steps: the default reverse KL, the JSD's second pass, a LoRA student, gradient accumulation
    (one generation for two micro-batches, the grads alive in the second), and DistillationConfig's default bf16=True
    (generate() under autocast with its cast weights; a PEFT student's generate() outside it), and prompts of two
    lengths (left-padded: the masks in both models' forwards) with completions of the length they sample."""
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    from clients_distillation import client_distillation

    est, peaks, setup = run_generation_row(client_distillation(str(tmp_path), kind))
    assert not isinstance(est, Exception), est
    assert_within_2_percent(f"DistillationTrainer {kind}", step_ratios(est, peaks, generation=True), setup)
    assert est.kind == "distillation" and est.setup["distillation"] and est.setup["teacher_weights_bytes"] > 0


def test_check_prints_an_answer_and_the_advisors_sentence(tmp_path, capsys, monkeypatch):
    """kit.check of a DistillationTrainer: the answer first; where it does not fit, the advisor's one sentence on
    the DistillationConfig fields that move its peak (it does not search without the teacher)."""
    import kit
    from clients_distillation import client_distillation

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    gen = client_distillation(str(tmp_path), "full")
    _, _, trainer, _ = next(gen)
    capsys.readouterr()
    kit.check(trainer, device="colab-t4")
    out = capsys.readouterr().out
    assert out.startswith("fits Colab T4") and "generation phase:" in out, out
    kit.check(trainer, device=2**20)
    out = capsys.readouterr().out
    assert out.startswith("DOES NOT FIT") and "does not search DistillationTrainer setups" in out, out
    gen.close()


def test_kit_train_judges_each_distillation_step_against_its_estimate(tmp_path, monkeypatch):
    """kit.train on a DistillationTrainer (every op watched on the CPU, the generation a stage of its own): step 1
    and the later steps within 2% of the estimate read from the same Trainer."""
    import kit
    from clients_distillation import client_distillation

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))
    gen = client_distillation(str(tmp_path), "full")
    _, _, trainer, _ = next(gen)
    r = kit.train(trainer, plot=False, tensor_peak=True)
    print(f"DistillationTrainer under kit.train: step 1 {r.first_step_ratio:.4f}, later {r.later_steps_ratio:.4f}")
    assert not r.oom and r.step == 3 and r.peak_exact
    assert 0.98 <= r.first_step_ratio <= 1.02 and 0.98 <= r.later_steps_ratio <= 1.02
    gen.close()
