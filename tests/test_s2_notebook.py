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
    ax = chart.figure().axes[0]
    assert ax.get_ylabel() == "memory (MiB)"            # MiB bars on a MiB axis, not 0.004 GiB
    assert all(t.get_text().endswith("MiB") for t in ax.texts if t.get_text() not in ("OOM", "not read"))
    assert ax.get_legend().get_bbox_to_anchor().y0 < ax.get_window_extent().y0   # below the axes, not the title


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


# -- issue items: the ungated default, the download ahead, today's TRL and its crash setting, the plan ----------
NOTEBOOK = __import__("pathlib").Path(__file__).parent.parent / "notebooks" / "02_llama3_qlora_cross_validation.ipynb"


def _cells():
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(NOTEBOOK.read_text())["cells"]]


def test_the_default_model_is_an_ungated_alias_of_the_shipped_llama_config():
    from kit import models
    from kit.model_configs import REGISTRY, gated, get_config

    assert REGISTRY["unsloth/Llama-3.2-1B"] == REGISTRY["meta-llama/Llama-3.2-1B"]
    assert not gated("unsloth/Llama-3.2-1B") and gated("meta-llama/Llama-3.2-1B")
    assert get_config("unsloth/Llama-3.2-1B").to_dict() | {"kit_name": 0} == \
        get_config("meta-llama/Llama-3.2-1B").to_dict() | {"kit_name": 0}
    assert models.smoke_twin("unsloth/Llama-3.2-1B") == "tiny-llama"
    assert nb.DEFAULT_MODEL == "unsloth/Llama-3.2-1B"
    assert any(k == "code" and 'MODEL_ID = "unsloth/Llama-3.2-1B"' in s for k, s in _cells())


def test_download_ahead_fetches_in_a_daemon_thread_only_where_it_can(monkeypatch):
    import threading

    import huggingface_hub

    from kit import runtime

    calls, go = [], threading.Event()

    def fake_snapshot(repo_id, **kw):
        go.wait(5)
        calls.append((repo_id, kw))
        if repo_id == "meta-llama/Llama-3.2-1B":
            raise OSError("gated: 401\nmore")

    from kit.scenarios.cross_validation import workshop

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setattr(workshop, "DOWNLOADS", {})
    assert "nothing is downloaded" in nb.download_ahead("unsloth/Llama-3.2-1B").lower()  # smoke (conftest)
    monkeypatch.setattr(runtime, "is_smoke", lambda: False)
    monkeypatch.setattr(runtime, "hub_reachable", lambda timeout_s=2.0: False)
    assert "not reachable" in nb.download_ahead("unsloth/Llama-3.2-1B")
    monkeypatch.setattr(runtime, "hub_reachable", lambda timeout_s=2.0: True)
    line = nb.download_ahead("unsloth/Llama-3.2-1B")
    thread = workshop.DOWNLOADS["unsloth/Llama-3.2-1B"]
    assert line.startswith("Downloading unsloth/Llama-3.2-1B") and "\n" not in line
    assert thread.daemon and thread.is_alive()         # the call returned while the download runs
    assert "already downloading" in nb.download_ahead("unsloth/Llama-3.2-1B")
    nb.download_ahead("meta-llama/Llama-3.2-1B")
    go.set()
    for t in workshop.DOWNLOADS.values():
        t.join(5)
    assert calls[0][1]["allow_patterns"] == nb.DOWNLOAD_PATTERNS and "*.safetensors" in nb.DOWNLOAD_PATTERNS
    assert thread.error is None and workshop.DOWNLOADS["meta-llama/Llama-3.2-1B"].error == "OSError: gated: 401"
    assert "nothing is downloaded" in nb.download_ahead("tiny-llama").lower()


def test_installed_trl_text_reads_trls_own_source():
    text = nb.installed_trl_text()
    import trl

    assert trl.__version__ in text
    assert "prepare_model_for_kbit_training (the fp32 upcast of every 16-bit part): no" in text
    assert "to bf16 (QLoRA's recommendation): yes" in text


def test_the_crash_setting_fits_one_fold_and_not_fold_2s_load_today():
    """The smallest change of the user's LoRA knobs under which the user's bug crashes a T4 with today's TRL:
    the verdicts come from the kit's own estimates, and every smaller setting tried does not crash."""
    t4 = PRESETS["colab-t4"].gpu_bytes
    base = dict(batch_size=4, seq_len=30, lora_r=8, lora_targets=["q_proj", "v_proj"])
    assert nb.fold2_prediction(nb.user_estimate(LLAMA8B, **base))["load_peak_bytes"] <= t4   # the user's: fits
    found = nb.crash_setting(LLAMA8B, "colab-t4", **base)
    est, f2 = found["estimate"], found["fold2"]
    assert est.setup["kbit_recipe"] == "lean"                                  # today's TRL
    assert est.peak_bytes <= t4 < f2["load_peak_bytes"]                        # one fold fits, fold 2's load not
    again = nb.user_estimate(LLAMA8B, **{**base, "lora_r": found["lora_r"], "lora_targets": found["lora_targets"]})
    assert nb.fold2_prediction(again)["load_peak_bytes"] == f2["load_peak_bytes"]
    for r, tg, peak, load in found["tried"][:-1]:                              # nothing smaller crashes
        assert not (peak <= t4 < load), (r, tg)
    assert found["tried"][0][:2] == (8, ("q_proj", "v_proj"))                  # the user's targets first
    # batch and sequence move the step's activations, not fold 2's load
    longer = nb.fold2_prediction(nb.user_estimate(LLAMA8B, **{**base, "seq_len": 300}))
    assert longer["leftover_bytes"] == nb.fold2_prediction(nb.user_estimate(LLAMA8B, **base))["leftover_bytes"]
    text = nb.crash_setting_text(LLAMA8B, "colab-t4", **base)
    assert f"LORA_R = {found['lora_r']}" in text and "DOES NOT FIT" in text and text.count("fits") == 1
    qwen = nb.crash_setting("Qwen/Qwen3-8B", "colab-t4", **base)               # ungated: the room's demo
    assert qwen["estimate"].peak_bytes <= t4 < qwen["fold2"]["load_peak_bytes"]
    assert nb.crash_setting("tiny-llama", "colab-t4", **base) is None


def test_the_workshop_plan_fits_45_minutes_and_counts_the_loads():
    from kit.scenarios import plan

    work = nb.workshop_work()
    loads = {name: sum(1 for item in w if item[0] == "load") for name, w in work.items()}
    assert loads["2 · The user's loop"] == nb.WORKSHOP_RUN["folds"] and loads["1 · Predict"] == 0
    assert loads["Exercise"] == 1 and loads["PyTorch's own tools"] == 0           # one trained fold, reused
    assert loads["5 · k-bit recipes"] == 2
    est = nb.user_estimate(nb.DEFAULT_MODEL, batch_size=4, seq_len=30)
    assert work["setup, download"] == [("load", 2 * (est.params - est.trainable_params))]   # at real size
    setup = [i for items in plan.setup_work({}).values() for i in items]      # the runtime's start, the install
    core = sum(t + plan.compute_minutes(work[n]) for n, (t, skip) in nb.TEACHING.items() if not skip)
    core += plan.compute_minutes(setup)
    assert core <= nb.SLOT_MINUTES == 45
    text = nb.workshop_plan()
    assert "PLAN" in text and "(fits," in text and f"{core:.1f} min of the 45-minute slot" in text
    assert max(len(line) for line in text.splitlines()) <= 120
    # the instructor notes' table lists the same teaching minutes, and marks the same sections skipped
    notes = next(s for k, s in _cells() if s.startswith("## Instructor notes"))
    rows = [line.split("|")[1:4] for line in notes.splitlines() if line.startswith("| ") and "---" not in line][1:]
    minutes = sum(int(m) for _, ms, skip in rows if "skip" not in skip for m in ms.split(","))
    assert minutes == sum(t for t, skip in nb.TEACHING.values() if not skip)
    plan_cell = next(i for i, (k, s) in enumerate(_cells()) if k == "code" and "nb.workshop_plan()" in s)
    assert plan_cell < 8 and "# NBVAL_CHECK_OUTPUT" in _cells()[plan_cell][1]


def test_no_answer_comes_before_its_question():
    from kit.scenarios.cross_validation import user_loop

    cells = _cells()
    first = {name: next(i for i, (k, s) in enumerate(cells) if f"{name} = None" in s)
             for name in ("my_models_loading", "my_models_training", "my_fold2_gib")}
    reveals = [i for i, (k, s) in enumerate(cells) if "two_models_text" in s or "crash_setting" in s
               or "run_broken_loop" in s or "doubling" in s]
    assert max(first.values()) < min(reveals)
    shown = inspect_source(user_loop.user_fold_loop) + inspect_source(user_loop.free_gpu_cache)
    for leak in ("still holds", "let go", "frees nothing", "the bug"):
        assert leak not in shown, leak
    assert not any("DESIGN" in s for _, s in cells)


def inspect_source(fn):
    import inspect

    return inspect.getsource(fn)


def test_the_fixed_fold_body_is_printed_and_is_what_the_loop_runs():
    from kit.scenarios.cross_validation import fixed_loop

    src = nb.fixed_fold_source()
    for line in ("restore_adapter(model, init)", "verify_adapter_reset(model, init)", "cleanup.release(trainer)"):
        assert line in src
    assert "= fixed_fold(model, " in inspect_source(fixed_loop)          # the loop runs the printed body
    assert any(k == "code" and "nb.fixed_fold_source()" in s for k, s in _cells())


def test_the_advisor_explains_the_lean_recipe_where_it_suggests_it(monkeypatch, est8b):
    from kit.scenarios.cross_validation import predict

    class Said:
        def __init__(self, text):
            self.said = text

        def text(self, top=None):
            return self.said

    monkeypatch.setattr(predict, "advise", lambda est, preset: Said("  1  5.00 GiB  +1.00 GiB  --kbit-recipe lean"))
    assert "(--kbit-recipe lean: prepare a 4-bit model without prepare_model_for_kbit_training" in \
        nb.advisor_text(est8b, "colab-t4")
    monkeypatch.setattr(predict, "advise", lambda est, preset: Said("fits"))
    assert "--kbit-recipe" not in nb.advisor_text(est8b, "colab-t4")


@pytest.mark.parametrize("bad", [None, "", 3])
def test_i35_15_download_ahead_refuses_what_is_not_a_model_name(bad):
    from kit.inputs import InputError
    from kit.scenarios.cross_validation.workshop import download_ahead

    with pytest.raises(InputError, match=r"^download_ahead takes a model name .*, not "):
        download_ahead(bad)
