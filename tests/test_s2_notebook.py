"""Scenario 2's notebook helpers (kit/scenarios/s2_notebook.py): the texts read the right numbers,
the chart draws, a simulated crash leaves a file the fixed loop resumes from, and the measured
cost of the fp32 upcast agrees with the estimate."""
import json
import re

import pytest

from kit.estimate import estimate
from kit.presets import PRESETS
from kit.scenarios.cross_validation import notebook as nb
from kit.scenarios.cross_validation.folds import append_result, read_results

LLAMA8B = "meta-llama/Meta-Llama-3-8B"
SETUP = dict(batch_size=4, seq_len=256, precision="fp16", quantization="4bit", lora_r=8,
             lora_targets=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def est8b():
    return estimate(LLAMA8B, **SETUP)


def test_weights_split_names_the_16_bit_parts_and_sums_to_the_estimate(est8b):
    parts = dict(nb.weights_split(LLAMA8B))
    assert parts["model.embed_tokens"] == parts["lm_head"] == 128256 * 4096
    assert parts["65 norms"] == 65 * 4096  # 2 per block x 32 + the final norm
    assert sum(parts.values()) == est8b.unquantized_params


def test_four_gb_text_corrects_the_advice(est8b):
    text = nb.four_gb_text(est8b)
    naive = (est8b.quantized_params + est8b.unquantized_params) // 2
    assert f"{est8b.loaded_weights_bytes:,} bytes" in text
    assert f"{est8b.loaded_weights_bytes / naive:.2f}x" in text
    assert est8b.loaded_weights_bytes / naive > 1.3  # the 16-bit embedding and lm_head are not "4 GB"
    with pytest.raises(ValueError, match="4-bit"):
        nb.four_gb_text(estimate("tiny-llama", batch_size=1, seq_len=8, lora_r=8))


@pytest.fixture(scope="module")
def user_today():
    return nb.user_estimate(LLAMA8B, batch_size=4, seq_len=30)


def test_the_users_objects_are_read_as_todays_trl_trains_them(user_today):
    s = user_today.setup
    assert (s["kbit_recipe"], s["adapter_dtype"], s["precision"], s["load_dtype"]) == ("lean", "bf16", "fp16", "bf16")
    assert (s["batch_size"], s["seq_len"]) == (1, 4 * 30)   # packing: 4 rows of 30 tokens flattened into one
    then = nb.user_estimate(LLAMA8B, then=True, batch_size=4, seq_len=30)
    assert then.setup["kbit_recipe"] == "standard" and then.setup.get("adapter_dtype", "fp32") == "fp32"
    assert then.weights_bytes - user_today.weights_bytes > 2 * user_today.unquantized_params  # the fp32 upcast


def test_two_models_fit_a_t4_with_todays_trl_and_did_not_with_the_posts(user_today):
    t4 = PRESETS["colab-t4"].gpu_bytes
    today = nb.fold2_prediction(user_today)
    then = nb.fold2_prediction(nb.user_estimate(LLAMA8B, then=True, batch_size=4, seq_len=30))
    assert today["load_peak_bytes"] == today["loaded_bytes"] <= t4        # no upcast moment today
    assert then["train_peak_bytes"] <= t4 < then["loaded_bytes"] < then["load_peak_bytes"]
    lines = nb.two_models_text(nb.user_estimate(LLAMA8B, then=True, batch_size=4, seq_len=30), "colab-t4").splitlines()
    assert lines[1].endswith("fits") and "DOES NOT FIT" in lines[3] and "DOES NOT FIT" in lines[4]
    assert lines[5].endswith("fits")                # fold 2 training: the old trainer was let go
    assert len(nb.two_models_text(user_today, "colab-t4").splitlines()) == 5   # no upcast row


def test_recipe_estimates_differ_by_the_upcast(est8b):
    e = nb.recipe_estimates(est8b)
    assert e["standard"].weights_bytes - e["lean"].weights_bytes == 2 * est8b.unquantized_params
    assert "ESTIMATED" in nb.recipe_table(e)


def test_texts_and_table_read_the_records():
    broken = {"folds": [{"fold": 1, "start_bytes": 100, "load_peak_bytes": 150, "loaded_bytes": 140,
                         "models_alive_after_load": 1, "train_peak_bytes": 300, "models_alive_in_training": 1,
                         "peak_bytes": 300, "end_bytes": 120},
                        {"fold": 2, "start_bytes": 120, "load_peak_bytes": 250, "loaded_bytes": 240,
                         "models_alive_after_load": 2, "train_peak_bytes": 303, "models_alive_in_training": 1,
                         "peak_bytes": 303, "end_bytes": 303, "oom": True, "oom_during": "train"}], "oom_at_fold": 2}
    text = nb.broken_text(broken, {"load_peak_bytes": 125})
    assert "2 models in memory, peak 250 B" in text and "1.010x fold 1's" in text
    assert "150 B MEASURED, 125 B ESTIMATED (1.200x)" in text
    assert "out of memory at fold 2, while training" in text
    table = nb.fold_table(broken["folds"])
    assert "OUT OF MEMORY while training" in table.splitlines()[-1]
    header = re.split(r" {2,}", table.splitlines()[1].strip())
    assert header == ["fold", "start", "load peak", "models", "train peak", "models", "end"]
    fixed = {"folds": [{"fold": i, "start_bytes": 100, "peak_bytes": 150, "end_bytes": 100, "adapter_reset_ok": True,
                        "back_at_baseline": i != 2, "eval_loss": 1.0} for i in (1, 2)],
             "baseline_bytes": 100, "oom_at_fold": None}
    text = nb.fixed_text(fixed)
    assert "every fold start: True" in text and "baseline (100 B): False" in text


def test_simulate_crash_keeps_the_first_folds(tmp_path):
    path = tmp_path / "cv_results.jsonl"
    for fold in (1, 2, 3):
        append_result(path, {"fold": fold, "run_key": "k", "start_bytes": 1, "peak_bytes": 2, "end_bytes": 1,
                             "eval_loss": 2.5})   # a finished fold's record
    assert nb.simulate_crash(path, 2) == [1, 2]
    assert sorted(read_results(path, "k")) == [1, 2]
    assert [json.loads(line)["fold"] for line in path.read_text().splitlines()] == [1, 2]
    with pytest.raises(ValueError, match="does not exist"):
        nb.simulate_crash(tmp_path / "missing.jsonl", 1)


def test_fold_chart_draws_each_update(tmp_path):
    chart = nb.FoldChart("folds", folder=tmp_path)
    recs = [{"fold": 1, "start_bytes": 2**20, "load_peak_bytes": 2**21, "train_peak_bytes": 2**21, "peak_bytes": 2**21,
             "end_bytes": 2**20, "models_alive_after_load": 1}]
    chart(recs)
    chart(recs + [{"fold": 2, "start_bytes": 2**21, "load_peak_bytes": 2**22, "train_peak_bytes": 2**21,
                   "peak_bytes": 2**22, "end_bytes": 2**20, "models_alive_after_load": 2}])
    assert len(list(tmp_path.glob("*.png"))) == 2
    labels = [t.get_text() for t in chart.figure().axes[0].get_xticklabels()]
    assert "1 model after load" in labels[0] and "2 models after load" in labels[1]
    legend = [t.get_text() for t in chart.figure().axes[0].get_legend().get_texts()]
    assert "peak while loading" in legend and "peak while training" in legend


def test_measured_upcast_matches_the_estimate():
    settings = dict(batch_size=2, seq_len=16, steps_per_fold=1, max_samples=8)
    measured = {r["recipe"]: r for r in nb.measure_kbit_recipes("tiny-llama", **settings)}
    est = nb.recipe_estimates(nb.user_estimate("tiny-llama", here=True, **settings))
    assert all(r["loss_finite"] for r in measured.values())
    upcast_measured = measured["standard"]["weights_bytes"] - measured["lean"]["weights_bytes"]
    upcast_estimated = est["standard"].weights_bytes - est["lean"].weights_bytes
    assert upcast_measured == pytest.approx(upcast_estimated, rel=0.05)
    assert measured["lean"]["weights_bytes"] == pytest.approx(est["lean"].weights_bytes, rel=0.05)


def test_the_predicted_moment_is_the_measured_one_on_the_tiny_twin(tmp_path):
    """Where the user's loop doubles: fold 2's load, two models alive, at the bytes the estimate predicts;
    then fold 2 trains with one model, at fold 1's peak."""
    from kit.scenarios.cross_validation import fixed_loop as cv

    settings = dict(batch_size=4, seq_len=32, steps_per_fold=2, max_samples=24)
    broken = cv.run_broken_loop("tiny-llama", folds=3, output_dir=tmp_path, **settings)
    pred = nb.fold2_prediction(nb.user_estimate("tiny-llama", here=True, **settings))
    f1, f2, f3 = broken["folds"]
    assert (f1["models_alive_after_load"], f2["models_alive_after_load"], f3["models_alive_after_load"]) == (1, 2, 2)
    assert f2["models_alive_in_training"] == 1
    base = f1["start_bytes"]
    assert (f2["start_bytes"] - base) / pred["leftover_bytes"] == pytest.approx(1, abs=0.01)
    assert (f2["loaded_bytes"] - base) / pred["loaded_bytes"] == pytest.approx(1, abs=0.01)
    assert (f2["load_peak_bytes"] - base) / pred["load_peak_bytes"] == pytest.approx(1, abs=0.02)
    # packing fills each fold's rows from other text, so the peaks are alike, not equal
    assert f2["train_peak_bytes"] / f1["train_peak_bytes"] == pytest.approx(1, abs=0.02)
