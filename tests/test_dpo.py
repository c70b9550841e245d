"""TRL's DPOTrainer (the behaviour of TRL 1.16): estimate_trainer against the exact tensor peak of real DPOTrainer
steps on a tiny CPU twin (TensorPeak on top of the policy's and the reference's weights and the optimizer state held
when each step begins), the reference forward's own moment, the precomputation's phase, and each DPOConfig setting
modeled or refused in one sentence.

Every pair is a 20-token prompt, a 30-token chosen and a 20-token rejected completion (+ EOS): each step is one
batch of 2 x 2 rows padded to 51 tokens, so the steps compare like with like.
"""
import types
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

from kind_checks import assert_within_2_percent, cpu_config, step_ratios  # noqa: E402

import estimate_vs_measured as bench  # noqa: E402

from kit import data, inputs, models  # noqa: E402
from kit.estimate import estimate_from, estimate_trainer  # noqa: E402
from kit.measure.tensor_peak import TensorPeak  # noqa: E402

warnings.filterwarnings("ignore")


def _pairs(n=16, P=20, C=30, R=20):
    w = lambda k: " the" * k  # noqa: E731  (one token per word with the shipped tokenizer)
    return Dataset.from_dict({"prompt": ["the" + w(P - 1)] * n, "chosen": [w(C)] * n, "rejected": [w(R)] * n})


def _dpo(tmp_path, ref=False, peft_config=None, measure_init=False, **kw):
    torch.manual_seed(0)
    args = cpu_config(DPOConfig, str(tmp_path), max_steps=3, per_device_train_batch_size=2, save_strategy="no",
                      logging_strategy="no", disable_tqdm=True, **kw)
    model = models.build_model("tiny-llama")
    ref_model = models.build_model("tiny-llama") if ref else None   # (offline: TRL cannot load a copy by id)
    base = bench._held_bytes(model.parameters(), model.buffers())
    with TensorPeak() as p:
        tr = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=_pairs(),
                        processing_class=data.shipped_tokenizer(), peft_config=peft_config)
    init = base + (bench._held_bytes(ref_model.parameters(), ref_model.buffers()) if ref else 0) + \
        p.peak_bytes - p.start_bytes
    return (tr, init) if measure_init else tr


def _measure(tr):
    """Each step's peak, and the peak while the reference forward runs (the 2nd forward of a step on a PEFT
    policy, whose reference is itself with the adapter off; else ref_model's forward)."""
    refs, calls = [], []
    target = tr.ref_model if tr.ref_model is not None else tr.model
    forward = target.forward

    def watched(*a, **k):
        calls.append(1)
        m = getattr(meter, "m", None)
        if m is None or (tr.ref_model is None and len(calls) % 2):
            return forward(*a, **k)
        before, m.peak_bytes = m.peak_bytes, m.current_bytes
        try:
            return forward(*a, **k)
        finally:
            refs.append(meter.base + m.peak_bytes - m.start_bytes)
            m.peak_bytes = max(before, m.peak_bytes)

    class Meter(bench.StepPeaks):   # each step's peak, the reference's weights held too
        def on_step_begin(self, *a, **kw):
            calls.clear()
            super().on_step_begin(*a, **kw)

    meter = Meter(also=[tr.ref_model])
    target.forward = watched
    tr.add_callback(meter)
    tr.train()
    return meter.peaks, refs


CASES = {
    "full FT, separate reference model": dict(ref=True, gradient_checkpointing=False),
    # mixed precision: the autocast casts of both forwards, the reference's under no_grad
    "full FT bf16, separate reference model": dict(ref=True, gradient_checkpointing=False, bf16=True),
    "LoRA r8, checkpointing (reference: the adapter-disabled policy)":
        dict(peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"])),
    "full FT, precomputed reference log-probs": dict(precompute_ref_log_probs=True, gradient_checkpointing=False),
    "full FT, separate reference model, precomputed log-probs": dict(ref=True, precompute_ref_log_probs=True,
                                                                     gradient_checkpointing=False),
}


@pytest.mark.parametrize("label", list(CASES))
def test_estimate_matches_a_cpu_dpo_trainer_step(tmp_path, label):
    tr, init = _dpo(tmp_path, measure_init=True, **CASES[label])
    est = estimate_trainer(tr, device="cpu")
    s = est.sources
    assert s["fused_lm_head"][0] is True and s["batch_size"][0] == 4 and s["seq_len"][0] == 51 and s["padded"][0]
    got, refs = _measure(tr)
    assert_within_2_percent(label, step_ratios(est, got), est.peak_moment, got)
    if "precompute_ref_log_probs" in CASES[label]:   # no reference forward in a step; the reference's weights held
        assert not refs and (est.setup["reference_weights_bytes"] > 0) == ("ref" in CASES[label])
        assert "reference_forward_peak_bytes" not in est.setup
        pre = est.setup["precompute_peak_bytes"] / init
        print(f"{label}: precompute phase estimate/measured {pre:.4f}")
        assert 0.98 <= pre <= 1.02, (est.setup["precompute_peak_bytes"], init)
    else:
        ref = est.setup["reference_forward_peak_bytes"] / max(refs[2:])   # (a steady step's reference forward)
        print(f"{label}: reference forward estimate/measured {ref:.4f}")
        assert 0.98 <= ref <= 1.02, (est.setup["reference_forward_peak_bytes"], refs)
        held = est.setup["reference_weights_bytes"]
        assert (held > 0) == (est.setup["reference"] == "model")


def test_estimate_from_a_dpo_config():
    """Before anything is built: max_length bounds the 2B rows; a LoRA policy is its own reference."""
    cfg = cpu_config(DPOConfig, "unused", max_length=51, per_device_train_batch_size=2, gradient_checkpointing=False)
    est = estimate_from("tiny-llama", dpo_config=cfg, device="cpu")
    assert est.sources["batch_size"][0] == 4 and est.sources["seq_len"][0] == 51
    assert est.setup["reference"] == "model" and est.setup["reference_weights_bytes"] == est.loaded_weights_bytes
    lora = estimate_from("tiny-llama", dpo_config=cfg, peft_config=LoraConfig(r=8, target_modules=["q_proj"]),
                         device="cpu")
    assert lora.setup["reference"] == "adapter-disabled" and lora.setup["reference_weights_bytes"] == 0
    pre = estimate_from("tiny-llama", dpo_config=DPOConfig(output_dir="unused", use_cpu=True, report_to="none",
                                                           max_length=51, precompute_ref_log_probs=True), device="cpu")
    assert pre.setup["reference"] == "precomputed" and inputs.has_note(pre.notes, "dpo-precompute")


@pytest.mark.parametrize("kw,field", [
    (dict(activation_offloading=True), "activation_offloading"),
    (dict(use_liger_kernel=True), "use_liger_kernel"),
    (dict(router_aux_loss_coef=0.01), "router_aux_loss_coef"),
])
def test_unmodeled_dpo_settings_are_refused_by_name(kw, field):
    try:
        cfg = DPOConfig(output_dir="unused", use_cpu=True, report_to="none", **kw)
    except Exception as exc:  # (a setting TRL itself refuses without its extra installed)
        pytest.skip(f"DPOConfig({kw}) does not build here: {exc}")
    with pytest.raises(inputs.InputError) as e:
        estimate_from("tiny-llama", dpo_config=cfg)
    assert e.value.name == field and field in str(e.value) and str(e.value).count(". ") == 0


def test_other_trl_trainers_are_refused_in_one_sentence():
    for name in ("ORPOTrainer", "CPOTrainer", "PPOTrainer"):
        fake = type(name, (), {"__module__": f"trl.trainer.{name.lower()}"})()
        fake.args, fake.model = types.SimpleNamespace(), None
        with pytest.raises(inputs.InputError) as e:
            estimate_trainer(fake)
        assert name in str(e.value) and "DPOTrainer" in str(e.value) and str(e.value).count(". ") == 0


def test_check_prints_a_dpo_trainers_estimate_and_says_the_advisor_does_not_search_it(tmp_path, capsys):
    """kit.check(dpo_trainer): the table, the reference model's bytes in the estimate, and, where it does not fit,
    one sentence instead of advice that would drop the reference model."""
    import kit

    tr = _dpo(tmp_path, ref=True, gradient_checkpointing=False)
    est = kit.check(tr, device=int(estimate_trainer(tr).peak_bytes * 0.5))
    out = " ".join(capsys.readouterr().out.split())
    assert est.setup["reference"] == "model" and est.setup["reference_weights_bytes"] > 0
    assert "DOES NOT FIT" in out and ("(no advice: the fit advisor searches Trainer, SFTTrainer, RewardTrainer and "
                                      "Seq2SeqTrainer setups") in out
