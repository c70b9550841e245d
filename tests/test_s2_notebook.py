"""Scenario 2's notebook helpers (kit/scenarios/s2_notebook.py): the texts read the right numbers,
the chart draws, a simulated crash leaves a file the fixed loop resumes from, and the measured
cost of the fp32 upcast agrees with the estimate."""
import json

import pytest

from kit.estimate import estimate
from kit.scenarios import s2_notebook as nb
from kit.scenarios.s2_folds import append_result, read_results

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


def test_two_models_do_not_fit_a_t4_where_one_does(est8b):
    lines = nb.two_models_text(est8b, "colab-t4").splitlines()
    assert lines[1].endswith("fits")                # one fold
    assert "DOES NOT FIT" in lines[4]               # fold 2 training beside fold 1's model


def test_recipe_estimates_differ_by_the_upcast(est8b):
    e = nb.recipe_estimates(LLAMA8B, **SETUP)
    assert e["standard"].weights_bytes - e["lean"].weights_bytes == 2 * est8b.unquantized_params
    assert "ESTIMATED" in nb.recipe_table(e)


def test_texts_and_table_read_the_records():
    broken = {"folds": [{"fold": 1, "start_bytes": 100, "peak_bytes": 150, "end_bytes": 120, "models_alive_at_start": 1},
                        {"fold": 2, "start_bytes": 210, "peak_bytes": 0, "end_bytes": 0, "models_alive_at_start": 2,
                         "oom": True}], "oom_at_fold": 2}
    text = nb.broken_text(broken)
    assert "2 models alive" in text and "2.10x" in text and "fold 2" in text.splitlines()[1]
    assert "OUT OF MEMORY" in nb.fold_table(broken["folds"]).splitlines()[-1]
    fixed = {"folds": [{"fold": i, "start_bytes": 100, "peak_bytes": 150, "end_bytes": 100, "adapter_reset_ok": True,
                        "back_at_baseline": i != 2, "eval_loss": 1.0} for i in (1, 2)],
             "baseline_bytes": 100, "oom_at_fold": None}
    text = nb.fixed_text(fixed)
    assert "every fold start: True" in text and "baseline (100 B): False" in text


def test_simulate_crash_keeps_the_first_folds(tmp_path):
    path = tmp_path / "cv_results.jsonl"
    for fold in (1, 2, 3):
        append_result(path, {"fold": fold, "run_key": "k"})
    assert nb.simulate_crash(path, 2) == [1, 2]
    assert sorted(read_results(path, "k")) == [1, 2]
    assert [json.loads(line)["fold"] for line in path.read_text().splitlines()] == [1, 2]
    with pytest.raises(ValueError, match="does not exist"):
        nb.simulate_crash(tmp_path / "missing.jsonl", 1)


def test_fold_chart_draws_each_update(tmp_path):
    chart = nb.FoldChart("folds", folder=tmp_path)
    recs = [{"fold": 1, "start_bytes": 2**20, "peak_bytes": 2**21, "end_bytes": 2**20, "models_alive_at_start": 1}]
    chart(recs)
    chart(recs + [{"fold": 2, "start_bytes": 2**21, "peak_bytes": 2**21, "end_bytes": 2**20,
                   "models_alive_at_start": 2}])
    assert len(list(tmp_path.glob("*.png"))) == 2
    labels = [t.get_text() for t in chart.figure().axes[0].get_xticklabels()]
    assert "1 model alive" in labels[0] and "2 models alive" in labels[1]


def test_measured_upcast_matches_the_estimate():
    settings = dict(batch_size=2, seq_len=16, steps_per_fold=1, max_samples=8)
    measured = {r["recipe"]: r for r in nb.measure_kbit_recipes("tiny-llama", **settings)}
    est = nb.recipe_estimates("tiny-llama", batch_size=2, seq_len=16, quantization="4bit", lora_r=8,
                              lora_targets=["q_proj", "v_proj"])
    assert all(r["loss_finite"] for r in measured.values())
    upcast_measured = measured["standard"]["weights_bytes"] - measured["lean"]["weights_bytes"]
    upcast_estimated = est["standard"].weights_bytes - est["lean"].weights_bytes
    assert upcast_measured == pytest.approx(upcast_estimated, rel=0.05)
    assert measured["lean"]["weights_bytes"] == pytest.approx(est["lean"].weights_bytes, rel=0.05)
