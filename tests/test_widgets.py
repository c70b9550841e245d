"""The widget panel, driven headless: set control values, click buttons, read the estimate.

Runs under whichever ipywidgets is importable: 8.x in the dev venv, 7.7.1 with
``tests/ipywidgets7.sh`` (Colab's version).
"""
import ipywidgets
import pytest
import torch

from kit import panel_runs
from kit.widgets import panel

pytestmark = pytest.mark.filterwarnings("ignore")


def test_contract_controls_and_estimate():
    p = panel(scenario=1)
    for key in ("batch_size", "seq_len", "quantization"):
        assert isinstance(p.controls[key], ipywidgets.ValueWidget)
    assert [v for _, v in p.controls["quantization"].options] == ["none", "8bit", "4bit"]
    assert p.controls["model"].value == "tiny-gpt2+vocab-head"   # smoke mode (conftest sets KIT_SMOKE=1)
    for field in ("params", "trainable_params", "weights_bytes", "gradients_bytes", "optimizer_bytes",
                  "activations_bytes", "peak_bytes", "cpu_build_bytes"):
        assert isinstance(getattr(p.estimate, field), int)
    assert "FITS" in p.estimate_html.value and "kit-bar" in p.estimate_html.value
    assert isinstance(p.widget, ipywidgets.VBox)


def test_a_small_models_bar_gets_its_own_scale_beside_the_limit():
    import re

    p = panel(scenario=1, model="tiny-gpt2", batch_size=2, seq_len=64)      # ~10 MiB against a 14.56 GiB T4
    bar = p.estimate_html.value.split("class='kit-bar'")[1].split("class='kit-bar-limit'")[0]
    widths = [float(w) for w in re.findall(r"width:([0-9.]+)%", bar)]
    assert sum(widths) > 90, "the components fill their own bar"
    assert "% of it" in p.estimate_html.value and "dashed" not in bar
    big = panel(scenario=2, model="meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512)  # near the limit
    assert "kit-bar-limit" not in big.estimate_html.value and "dashed" in big.estimate_html.value


def test_estimate_follows_the_controls():
    p = panel(scenario=1)
    before = p.estimate
    p.controls["batch_size"].value = 8
    assert p.estimate.activations_bytes > before.activations_bytes
    assert p.estimate.weights_bytes == before.weights_bytes
    html_before = p.estimate_html.value
    p.controls["seq_len"].value = 256
    assert p.estimate.activations_bytes > 0 and p.estimate_html.value != html_before
    # seq_len is capped at the model's positions (tiny-gpt2: 256), and the reason says so
    assert p.controls["seq_len"].max == 256 and "256 positions" in p.reasons["seq_len"].value
    p.controls["preset"].value = "this"
    assert "this machine" in p.estimate_html.value


def test_quantization_shrinks_weights_in_scenario_2():
    p = panel(scenario=2)
    assert p.controls["model"].value == "tiny-llama" and p.controls["quantization"].value == "4bit"
    four = p.estimate.weights_bytes
    p.controls["quantization"].value = "none"
    assert p.estimate.weights_bytes > four
    p.controls["model"].value = "meta-llama/Meta-Llama-3-8B"
    p.controls["quantization"].value = "4bit"
    big4 = p.estimate
    p.controls["quantization"].value = "8bit"
    assert big4.weights_bytes < p.estimate.weights_bytes < 8e9 * 2
    assert p.controls["seq_len"].max == 8192


def test_invalid_combination_shows_its_reason():
    p = panel(scenario=2)
    p.controls["lora_r"].value = 0          # 4-bit weights with nothing trainable
    assert p.estimate is None and "lora_r > 0" in p.problem
    assert "lora_r &gt; 0" in p.reasons["quantization"].value
    assert p.run_button.disabled and p.sweep_button.disabled
    assert "No estimate" in p.estimate_html.value
    p.controls["lora_r"].value = 16
    assert p.estimate is not None and not p.run_button.disabled and p.reasons["quantization"].value == ""


def test_lora_disabled_on_the_custom_head_with_reason():
    p = panel(scenario=1)
    assert p.controls["lora_r"].disabled and "LoRA does not apply" in p.reasons["lora_r"].value
    p.controls["model"].value = "tiny-gpt2"
    assert not p.controls["lora_r"].disabled and p.reasons["lora_r"].value == ""


def test_quantization_disabled_where_bitsandbytes_cannot_run(monkeypatch):
    monkeypatch.setattr(panel_runs, "bnb_problem", lambda: "bitsandbytes is not usable here: pip install bitsandbytes")
    p = panel(scenario=2)
    assert p.controls["quantization"].disabled and p.controls["quantization"].value == "none"
    assert "pip install bitsandbytes" in p.reasons["quantization"].value


def test_8bit_adam_on_the_big_head_is_refused():
    p = panel(scenario=1, model="distilgpt2+vocab-head", optimizer="adamw-8bit")
    assert "Run refused" in p.reasons["optimizer"].value
    assert "DOES NOT FIT" in p.estimate_html.value
    record, _, _ = panel_runs.measured_run(p.setup())
    assert record["status"] == "refused" and "2^31" in record["error"]


def test_run_records_a_measurement_and_locks_the_controls(monkeypatch):
    p = panel(scenario=1, model="tiny-gpt2", steps=2, batch_size=2, seq_len=32)
    seen = []
    real = panel_runs.measured_run

    def spy(*args, **kw):
        seen.append({k: w.disabled for k, w in p.controls.items()} | {"run": p.run_button.disabled})
        return real(*args, **kw)

    monkeypatch.setattr(panel_runs, "measured_run", spy)
    p.run_button.click()
    assert seen and all(seen[0].values()), f"controls not all disabled during the run: {seen}"
    r = p.history[-1]
    assert r["status"] == "ok", r
    # The same setup at the same step (the second: AdamW's state alive), as the legend claims.
    assert 0.85 <= r["measured_peak_bytes"] / r["predicted_peak_bytes"] <= 1.15, r
    assert r["returned"] is True
    assert p.last_figure is not None and "measured" in p.last_figure.axes[0].get_xticklabels()[1].get_text()
    assert not p.controls["batch_size"].disabled and p.controls["lora_r"].disabled is False
    assert ">ok</td>" in p.history_html.value


def test_sweep_marks_the_oom(monkeypatch):
    p = panel(scenario=1, model="tiny-gpt2", batch_size=1, seq_len=32, sweep_sizes=(1, 2, 4, 8))
    tried = []

    def fake_point(model, tok, ds, setup, steps, tracker, name):
        # Training itself is covered by the Run test; here a fake OOM at 4, as accelerate's tests do.
        tried.append(setup["batch_size"])
        if setup["batch_size"] >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (faked)")
        return 1000 * setup["batch_size"]

    monkeypatch.setattr(panel_runs, "_point", fake_point)
    p.sweep_button.click()
    r = p.history[-1]
    assert tried == [1, 2, 4], "the sweep goes up and stops at the first OOM"
    assert r["status"] == "sweep" and "largest that ran: 2" in r["note"], r
    assert "largest that ran: 2" in p.status.value and r["measured_peak_bytes"] == 2000
    ax = p.last_figure.axes[0]
    assert "OOM" in [t.get_text() for t in ax.texts]
    assert "predicted peak" in [line.get_label() for line in ax.get_lines()]
    assert r["returned"] is True
    assert not p.controls["batch_size"].disabled


def test_a_real_sweep_measures_each_size_against_its_estimate(monkeypatch):
    setup = panel(scenario=1, model="tiny-gpt2", seq_len=32).setup()
    real_refusal = panel_runs.refusal
    monkeypatch.setattr(panel_runs, "refusal",   # size 4 "would exhaust RAM": refused, never run
                        lambda s, est: "needs about 99 GiB of RAM (faked)" if s["batch_size"] == 4 else real_refusal(s, est))
    res = panel_runs.sweep(setup, "batch_size", (1, 2, 4))
    assert [size for size, _, _ in res["points"]] == [1, 2] and res["refused"] == [4]
    assert not any(oom for _, _, oom in res["points"]), "a size that never ran is not an OOM"
    predicted = dict(res["predicted"])
    for size, measured, _ in res["points"]:
        assert 0.85 <= measured / predicted[size] <= 1.15, (size, measured, predicted[size])
    fig = panel_runs.sweep_figure(res, "tiny-gpt2")
    assert "OOM" not in [t.get_text() for t in fig.axes[0].texts]
    assert "not run" in fig.axes[0].get_title() and "4" in fig.axes[0].get_title()


def test_refused_run_says_why(monkeypatch):
    monkeypatch.setattr(panel_runs, "refusal", lambda setup, est: "needs about 99 GiB of RAM (faked)")
    p = panel(scenario=1, model="tiny-gpt2")
    p.run_button.click()
    assert p.history[-1]["status"] == "refused" and "99 GiB" in p.status.value
    assert p.last_figure is None


def test_bad_options_raise():
    with pytest.raises(ValueError, match="scenario"):
        panel(scenario=3)
    with pytest.raises(ValueError, match="unknown panel options"):
        panel(scenario=1, batchsize=4)


def test_runs_under_the_expected_ipywidgets():
    """tests/ipywidgets7.sh sets KIT_EXPECT_IPYWIDGETS=7.7.1: prove the side folder won."""
    import os

    expected = os.environ.get("KIT_EXPECT_IPYWIDGETS")
    if expected:
        assert ipywidgets.__version__ == expected
    else:
        assert ipywidgets.__version__.split(".")[0] in ("7", "8")


def test_steps_are_read_as_users_pass_them_and_refused_by_name():
    import numpy as np

    assert panel(scenario=1, model="tiny-gpt2", steps=np.int64(2)).steps == 2
    for bad in (0, -1, 1.5, "two"):
        with pytest.raises(ValueError, match="steps must be a whole number"):
            panel(scenario=1, model="tiny-gpt2", steps=bad)
        with pytest.raises(ValueError, match="steps must be a whole number"):
            panel_runs.measured_run(panel(scenario=1, model="tiny-gpt2").setup(), steps=bad)
