"""TRL's KTOTrainer (the behaviour of TRL 1.16, issue 47): estimate_trainer within 2% of the profiler meter of
``benchmarks/real_clients.py`` at step 1, the steady step and ``evaluate()``, as its quick start builds it (a model
path; rows of a 20-token prompt and a 30- or 20-token completion by turns, labels by turns, B2: every batch and its
KL rows padded to 51), with LoRA (the adapter-disabled reference) and without (a reference copy TRL loads), and
with KL rows longer than the rows (prompts of 40 and 5 tokens, completions of 5 and 40: the reference's no-grad
forward on the 81-token KL rows is the step's peak); every KTOConfig field modeled, listed as having no memory
effect, or refused by name; ``kit.check`` answers first."""
import contextlib
import functools
import io
import warnings

import pytest

trl = pytest.importorskip("trl")
from peft import LoraConfig  # noqa: E402
from trl import KTOConfig  # noqa: E402

from kind_checks import assert_fields_in_one_table, assert_within_2_percent, cpu_config, step_ratios  # noqa: E402

import clients_kto  # noqa: E402
import real_clients as rc  # noqa: E402

import kit  # noqa: E402
from kit import inputs  # noqa: E402
from kit.estimate import estimate_from, estimate_trainer  # noqa: E402
from kit.estimate import kto  # noqa: E402

warnings.filterwarnings("ignore")

_config = functools.partial(cpu_config, KTOConfig)


@pytest.mark.parametrize("kind,bf16", [*((k, False) for k in clients_kto.KINDS), ("skew", True)])
def test_i47_kto_trainer_within_2_percent(tmp_path, kind, bf16):
    """Refused before ("not KTOTrainer, whose own forward passes, generation and losses ..."). bf16: KTOConfig's
    default (accelerate's autocast around each model's forward: the policy's half copies are gone when the
    reference runs)."""
    _, setup, est, peaks = rc.run_trainer_client(clients_kto.client_kto(str(tmp_path), kind, bf16=bf16),
                                                 rc.ProfilerMeter)
    if kind == "precompute":   # no reference in training at all
        assert est.setup["reference"] == "precomputed" and est.setup["reference_weights_bytes"] == 0
    else:
        skew, lora = kind.startswith("skew"), kind.endswith("lora")
        shape = (2, 46, 81) if skew else (2, 51, 51)   # skew: 40 + 5 and 5 + 40 tokens, KL rows 40 + 40
        assert (est.setup["batch_size"], est.setup["seq_len"], est.setup["kl_seq_len"]) == shape
        assert est.setup["reference"] == ("adapter-disabled" if lora else "model")
        assert (est.setup["reference_weights_bytes"] > 0) is not lora
        assert est.peak_moment.startswith("reference on the KL rows") is (skew and not bf16), est.peak_moment
    assert_within_2_percent(setup, step_ratios(est, peaks, evaluate=True), peaks, peaks.evaluate)


def test_every_kto_config_field_is_modeled_listed_or_refused():
    assert_fields_in_one_table(KTOConfig, kto)


@pytest.mark.parametrize("kw,field", [(dict(activation_offloading=True), "activation_offloading"),
                                      (dict(use_liger_kernel=True), "use_liger_kernel")])
def test_a_refused_field_gets_one_sentence_naming_it(kw, field):
    with pytest.raises(inputs.InputError) as e:
        estimate_from("tiny-llama", kto_config=_config(**kw))
    msg = str(e.value)
    assert f"KTOConfig.{field}" in msg and e.value.name == field and msg.count(". ") == 0, msg


def test_estimate_from_with_precomputed_log_probs_has_its_own_phase():
    est = estimate_from("tiny-llama", kto_config=_config(max_length=51, precompute_ref_log_probs=True), device="cpu")
    assert est.setup["reference"] == "precomputed" and est.setup["precompute_peak_bytes"] > 0
    assert inputs.has_note(est.notes, "kto-precompute")


def test_estimate_from_a_kto_config():
    """Before anything is built: max_length bounds the rows and the KL rows; a LoRA policy is its own reference;
    apo_zero_unpaired has no KL rows."""
    cfg = _config(max_length=51, per_device_train_batch_size=2)
    est = estimate_from("tiny-llama", kto_config=cfg, device="cpu")
    assert est.sources["batch_size"][0] == 2 and est.sources["seq_len"][0] == 51 and est.setup["kl_seq_len"] == 51
    assert est.setup["reference"] == "model" and est.setup["reference_weights_bytes"] == est.loaded_weights_bytes
    lora = estimate_from("tiny-llama", kto_config=cfg, peft_config=LoraConfig(r=8, target_modules=["q_proj"]),
                         device="cpu")
    assert lora.setup["reference"] == "adapter-disabled" and lora.setup["reference_weights_bytes"] == 0
    apo = estimate_from("tiny-llama", kto_config=_config(max_length=51, loss_type="apo_zero_unpaired"), device="cpu")
    assert apo.setup["kl_seq_len"] == 0 and not any("KL" in k for k in apo.setup["no_grad_moments_bytes"])


def test_check_prints_a_kto_trainers_answer_and_says_the_advisor_does_not_search_it(tmp_path):
    trainer = next(clients_kto.client_kto(str(tmp_path), "full"))[2]
    est = estimate_trainer(trainer, device="cpu")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        judged = kit.check(trainer, device=int(est.peak_bytes * 0.5))
    text = " ".join(out.getvalue().split())
    assert judged.setup["reference"] == "model" and "DOES NOT FIT" in text, text
    assert "KTOTrainer's reference model and phases are estimated but not searched" in text, text
    assert "change the KTOConfig (per_device_train_batch_size, max_length, a peft_config)" in text, text


def test_kit_train_judges_each_kto_step_against_its_estimate(tmp_path):
    """kit.train on a KTOTrainer with its reference copy (every op watched on the CPU): step 1 and the later steps
    within 2% of the estimate read from the same Trainer (measured 1.000 for both)."""
    trainer = next(clients_kto.client_kto(str(tmp_path), "full"))[2]
    r = kit.train(trainer, plot=False, tensor_peak=True)
    print(f"KTOTrainer under kit.train: step 1 {r.first_step_ratio:.4f}, later {r.later_steps_ratio:.4f}")
    assert not r.oom and r.step == 3 and r.peak_exact
    assert 0.98 <= r.first_step_ratio <= 1.02 and 0.98 <= r.later_steps_ratio <= 1.02


@pytest.mark.parametrize("bf16", [False, True])
def test_the_precomputed_reference_phase_within_2_percent(tmp_path, bf16):
    """precompute_ref_log_probs=True: KTOTrainer.__init__'s no-grad pass over the rows and the KL rows (the policy,
    one autocast around both forwards), metered from the policy's weights alive before the trainer is built; then
    the training steps, with no reference at all."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(rc.twin_dir("tiny-llama", str(tmp_path)))
    meter = rc.ProfilerMeter()
    meter.start()
    meter.begin(rc.held_bytes(model, None))
    gen = clients_kto.client_kto(str(tmp_path), "precompute", model=model, bf16=bf16)
    _, _, trainer, _ = next(gen)
    meter.end()
    init = meter.stop()[0]
    est = estimate_trainer(trainer, device="cpu")
    assert est.setup["reference"] == "precomputed" and est.setup["reference_weights_bytes"] == 0
    assert inputs.has_note(est.notes, "kto-precompute") and not any(
        k.startswith("reference") for k in est.setup["no_grad_moments_bytes"])
    phase = est.setup["precompute_peak_bytes"] / init
    print(f"precompute phase (bf16 {bf16}): estimate/measured {phase:.4f}")
    assert 0.98 <= phase <= 1.02, (est.setup["precompute_peak_bytes"], init)
