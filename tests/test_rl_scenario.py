"""Notebook 04's logic (kit/scenarios/rl/): the GRPO run at real and smoke size, the three suspects read off the
estimate (and the claims the notebook's prose makes of them), and a measured smoke run beside estimate_trainer's
figures, the generation phase metered apart."""
import warnings

import pytest

pytest.importorskip("trl")

from kit.advise import advise, limit_for  # noqa: E402
from kit.advise.grpo_levers import judged  # noqa: E402
from kit.scenarios.rl import phases, runs  # noqa: E402
from kit.scenarios.rl import setup as rl  # noqa: E402

warnings.filterwarnings("ignore")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    args = rl.grpo_config("real", str(tmp_path_factory.mktemp("rl-real")))
    est = rl.real_estimate(args)
    return args, est, advise(est, "colab-t4")


def test_real_config_is_the_tutorial_setup_and_does_not_fit_a_t4(real):
    """The notebook's story: as written (beta=0.04, checkpointing off, fp16 on a T4) it does not fit, and the
    advisor's best change, a line of the user's GRPOConfig, fits."""
    args, est, advice = real
    assert args.beta == 0.04 and not args.gradient_checkpointing and args.fp16 and not args.bf16
    assert args.generation_batch_size % args.num_generations == 0
    assert not advice.fits and advice.suggestions[0].fits
    assert advice.answer()[-1].startswith("best change: GRPOConfig(")


def test_the_prose_claims_about_the_suspects_hold(real):
    """Notebook 04 says: of the three suspects the reference model is the largest at real size, and the training
    step's saved activations are larger than all three together."""
    _, est, _ = real
    found = phases.suspects(est)
    assert phases.largest(est) == "reference"
    assert found["reference"] == est.setup["reference_weights_bytes"] == est.loaded_weights_bytes
    assert found["activations"] > sum(found[k] for k in phases.SUSPECTS)
    text = phases.read_aloud(est)
    assert "largest of the three: reference" in text and "a second copy of the model" in text


def test_prompts_are_cut_from_the_shipped_text_at_one_length():
    from kit import data

    tok = data.shipped_tokenizer()
    ds = rl.prompts(tok, 12, 6)
    assert len(ds) == 6 and {len(tok(p)["input_ids"]) for p in ds["prompt"]} == {12}
    with pytest.raises(ValueError, match="only"):
        rl.prompts(tok, 12, 10**6)


def test_try_completion_judges_as_the_advisor(real):
    args, est, _ = real
    fits, line = rl.try_completion(args, args.max_completion_length)
    assert not fits and "does NOT fit" in line
    assert judged(est, limit_for("colab-t4")) > limit_for("colab-t4").usable_bytes
    assert rl.try_completion(args, 128)[0]


def test_apply_best_makes_the_same_lever_at_smoke_size(real, tmp_path):
    _, _, advice = real
    smoke = rl.grpo_config("smoke", str(tmp_path))
    fixed, peft = rl.apply_best("smoke", smoke, advice)
    assert fixed.gradient_checkpointing and not peft   # the best change at real size: checkpointing on
    assert fixed.per_device_train_batch_size == smoke.per_device_train_batch_size


def test_smoke_run_measured_beside_its_estimate(tmp_path):
    """A measured smoke run (the twin, kit.train with exact CPU counts): step 1, the later steps and each
    generation phase within 2% of estimate_trainer's figures for the same Trainer."""
    from kit.scenarios import notebook

    notebook.quiet()
    trainer = rl.trainer("smoke", rl.grpo_config("smoke", str(tmp_path)))
    run = runs.measure("as written", trainer)
    runs.release(trainer)
    assert not run.report.oom and len(run.generation) == 2
    for phase, est, got in run.rows():
        assert got is not None and 0.98 <= got / est <= 1.02, (phase, est, got)
    assert "not taken" not in runs.table([run])


def test_check_of_a_grpo_trainer_gives_its_levers_in_its_grpo_config(tmp_path, capsys):
    """kit.check(grpo_trainer) on a device it does not fit: the GRPO answer (no refusal), whose best change is
    re-estimated from the Trainer's model config, prompt length and GRPOConfig."""
    import kit
    from kit.estimate import estimate_trainer
    from kit.scenarios import notebook

    notebook.quiet()
    trainer = rl.trainer("smoke", rl.grpo_config("smoke", str(tmp_path)))
    est = estimate_trainer(trainer, device="cpu")   # (check judges a GPU: its peak is a little higher)
    kit.check(trainer, device=int(est.peak_bytes * 0.9))
    out = capsys.readouterr().out
    runs.release(trainer)
    assert out.startswith("DOES NOT FIT") and "best change: GRPOConfig(" in out and "no advice" not in out


def test_verdict_says_each_outcome_measured_beside_estimated():
    from types import SimpleNamespace as Run

    oom = Run(report=Run(oom=True, step=1, phase_text="the backward pass"), est=Run(peak_bytes=5))
    done = Run(report=Run(oom=False, measured_peak_bytes=2**30), est=Run(peak_bytes=2**30))
    text = runs.verdict(oom, done, "gradient checkpointing")
    assert text.startswith("as written: ran out of memory at step 1 (the backward pass); with gradient checkpointing:")
    assert "MEASURED peak 1.00 GiB (ESTIMATED 1.00 GiB)" in text.replace("\n    ", " ")
