"""Scenario 1's logic: the culprit, the advice put to numbers, the fixes measured, the original run safely."""
import pytest
import torch
import transformers

from kit import machine, models
from kit.scenarios.custom_head import runs as s1_runs
from kit.scenarios.custom_head import scenario as ch


def test_the_original_names_custom_layer_and_misses_a_t4():
    for size in ("smoke", "real"):
        assert ch.predict_original(size).offender == "custom_layer"
    real = ch.predict_original("real")
    assert real.offender_params == 50258 * 50258 + 50258
    assert not real.fits_t4 and real.peak_bytes > 4 * real.offender_params * 4   # AdamW: 16 bytes a param
    assert "custom_layer" in real.text() and "DOES NOT FIT" in real.text()


def test_each_fix_is_far_below_the_original_at_real_size():
    original = ch.predict_original("real").peak_bytes
    a, b, c = (ch.estimate_fix(w, "real").peak_bytes for w in "abc")
    assert a < original / 10 and b < original / 10
    assert a < ch.T4_BYTES and b < ch.T4_BYTES
    # (c) keeps the VxV head: it shrinks (bf16, no fp32 state) but honestly still misses a T4.
    assert c < original / 2 and c > ch.T4_BYTES


def test_the_advice_changes_the_peak_by_little_and_the_head_by_a_lot():
    adv = ch.advice_table("smoke")
    rows = {r["advice"].split(" (")[0].split(":")[0]: r for r in adv.rows}
    pad = [r for r in adv.rows if r["advice"].startswith("pad to longest")]
    assert pad and all(r["modelled"] and r["change_bytes"] <= 0 for r in pad)
    assert all(abs(r["change_bytes"]) < 0.05 * adv.base_peak_bytes for r in pad)
    assert rows["call torch.cuda.empty_cache()"]["change_bytes"] == 0
    assert not rows["call torch.cuda.empty_cache()"]["modelled"]
    head = [r for r in adv.rows if r["advice"].startswith("(for scale)")][0]
    assert -head["change_bytes"] > 10 * max(abs(r["change_bytes"]) for r in pad)
    assert adv.data["max_length_bytes"] > adv.data["dynamic_bytes"] > 0
    assert adv.data["max_len"] <= 128 and "empty_cache" in adv.text()


def test_the_8bit_guard_refuses_the_real_head_and_allows_the_tiny_one():
    real = models.build_model("distilgpt2+vocab-head", device="meta")
    assert "custom_layer.weight" in ch.bnb_8bit_problem(real)
    assert ch.bnb_8bit_problem(models.build_model("tiny-gpt2+vocab-head", device="meta")) is None
    assert ch.fix_setup("c", "real")["optimizer"] == "adamw-fused"          # never 8-bit on the big head
    assert ch.fix_setup("c", "smoke")["optimizer"] == "adamw-8bit"


def test_low_rank_head_keeps_the_models_interface():
    model = ch.LowRankHeadModel(models.build_model("tiny-gpt2"), rank=4)
    ids = torch.randint(2, 4000, (1, 8))
    out = model(input_ids=ids, labels=ids)
    assert out["logits"].shape == (1, 8, 4097) and out["loss"].requires_grad
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "custom_layer.down.weight", "custom_layer.up.weight", "custom_layer.up.bias"}
    with pytest.raises(ValueError, match="rank"):
        ch.LowRankHead(10, 10)


def test_a_fix_run_measures_its_estimate_and_returns_memory():
    record, tracker = s1_runs.run_fix("b", "smoke", steps=2, grad_accum=2)
    # the estimate of the same setup (as run here), at the same step: from the second, AdamW's state is alive
    assert 0.9 <= record["measured_peak_bytes"] / record["estimate_peak_bytes"] <= 1.1, record
    assert (record["steps"], record["grad_accum"]) == (2, 2)
    assert record["returned"] is True
    assert [r.name for r in tracker.records] == ["tokenize", "build", "Trainer init", "train", "cleanup"]
    assert tracker.records[-1].end_bytes <= tracker.records[0].start_bytes + 2**20


def test_the_original_recovers_from_an_oom(monkeypatch):
    def boom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.41 GiB")

    monkeypatch.setattr(transformers.Trainer, "training_step", boom)
    record, tracker = s1_runs.run_original_safely("smoke", grad_accum=2)
    assert record["oom"] is True and record["measured_peak_bytes"] is None
    assert "OutOfMemoryError" in record["error"]
    assert record["returned"] is True
    train = [r for r in tracker.records if r.name == "train"][0]
    assert "OutOfMemoryError" in train.error and tracker.records[-1].name == "cleanup"


def test_the_original_at_real_size_is_refused_where_ram_is_short():
    est = ch.estimate_fix("a", "real")  # warm the estimator's cache
    record, _ = s1_runs.run_original_safely("real")
    if machine.has_cuda():
        pytest.skip("on a GPU the original runs (or its OOM is caught)")
    assert est.peak_bytes > 0 and record["refused"] and record["measured_peak_bytes"] is None
    assert not record["oom"]


def test_find_culprit_ranks_the_head_first():
    text = ch.find_culprit("tiny-gpt2+vocab-head")
    by_params, by_bytes = text.split("By estimated training bytes")
    assert by_params.splitlines()[1].split()[0] == "custom_layer"
    assert by_bytes.splitlines()[1].split()[0] == "custom_layer"


@pytest.mark.gpu
def test_on_a_gpu_the_real_size_runs_measure_close_to_their_estimates():
    # Tolerance not yet checked on a GPU: a failure here is a finding about the estimator or the run.
    record, _ = s1_runs.run_original_safely("real", grad_accum=2)
    assert record["returned"] and record["refused"] is None
    if not record["oom"]:
        assert 0.75 < record["measured_peak_bytes"] / record["estimate_peak_bytes"] < 1.25
    for which in "ab":
        rec, _ = s1_runs.run_fix(which, "real", grad_accum=2)
        assert rec["returned"] and 0.75 < rec["measured_peak_bytes"] / rec["estimate_peak_bytes"] < 1.25


def test_the_advice_tables_data_bytes_are_those_of_the_users_rows():
    small, big = ch.advice_table("smoke", rows=20), ch.advice_table("smoke", rows=60)
    assert small.data["rows"] < big.data["rows"]
    per_row = [a.data["max_length_bytes"] / a.data["rows"] for a in (small, big)]
    assert per_row[0] == pytest.approx(per_row[1], rel=0.02)    # every row padded to 128 tokens
    assert f"the user's {small.data['rows']} non-empty rows" in small.text()


def test_one_accumulation_rule_for_the_notebook_and_the_demo(monkeypatch):
    monkeypatch.setattr(s1_runs.machine, "has_cuda", lambda: False)
    assert [s1_runs.grad_accum_for(w) for w in (None, "a", "b", "c")] == [2, 2, 2, 1]
    monkeypatch.setattr(s1_runs.machine, "has_cuda", lambda: True)
    assert s1_runs.grad_accum_for("c") == ch.USER["grad_accum"] == 16
    assert s1_runs.grad_accum_for("c", 3) == 3
    with pytest.raises(ValueError, match="grad_accum"):
        s1_runs.grad_accum_for("a", 0)



@pytest.mark.parametrize("bad", [0, -1, "one"])
def test_steps_below_one_are_refused_not_run(bad):
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        s1_runs.run_fix("a", "smoke", steps=bad)
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        s1_runs.run_original_safely("smoke", steps=bad)
