"""Issue 49 item 2: the panel's Run draws each named stage as it ends, beside its own estimate, and catches an
out-of-memory error under the cap where it happened; the panel stays usable (a second Run works). Driven headless,
in smoke mode (conftest): each Run trains the scenario's tiny twin under the cap scaled from the chosen GPU."""
import pytest

from kit import panel
from kit.widgets import runs as panel_runs
from kit.widgets.stages import trainer_plan

pytestmark = pytest.mark.filterwarnings("ignore")


def drawn_in_order(chart) -> list[tuple]:
    """The last drawing, after checking that every drawing before it was a beginning of it: stages drawn as they
    ended, in the plan's order, and never redrawn with other figures."""
    last = chart.drawn[-1]
    assert len(chart.drawn) >= len(last) - 1, "a drawing per stage's end at least"
    for before, after in zip(chart.drawn, chart.drawn[1:]):
        assert after[:len(before)] == before and len(after) >= len(before), (before, after)
    return last


def ratio(measured, estimated) -> float:
    return measured / estimated


def test_scenario_1_runs_stage_by_stage_oom_at_step_1_under_the_cap_then_fits_without_the_head():
    p = panel(scenario=1, steps=2)                       # the user's V x V head, judged at real size: DOES NOT FIT
    assert p.run_setup()["model"] == "tiny-gpt2+vocab-head" and not p.verdict.fits
    p.run_button.click()
    r, chart = p.history[-1], p.last_chart
    assert "tiny twin tiny-gpt2+vocab-head (for distilgpt2+vocab-head)" in chart.title
    est = panel_runs.estimate_as_run(p.run_setup())
    # the cap is the T4 scaled by the twin's peak over the real model's: the twin runs out where the real one would
    assert r["cap_bytes"] == p.preset().gpu_bytes * est.peak_bytes // p.estimate.peak_bytes
    assert est.weights_bytes < r["cap_bytes"] < est.first_step_peak_bytes
    assert r["status"] == "OOM" and r["oom_stage"] == "step 1" and "<b>OOM</b>: at step 1" in p.status.value
    last = drawn_in_order(chart)
    assert [(name, figure) for name, figure, _ in last] == [("load", est.weights_bytes),
                                                            ("step 1", est.first_step_peak_bytes), ("cleanup", 0)]
    assert 0.95 <= ratio(last[0][2], est.weights_bytes) <= 1.05 and last[1][2] is None   # step 1: drawn as OOM
    assert last[2][2] < 2**20 and r["returned"] is True, "the memory came back after the OOM"
    assert "OOM" in [t.get_text() for t in p.last_figure.axes[0].texts]
    assert not p.run_button.disabled and not p.controls["head"].disabled, "the panel stays usable"

    p.controls["head"].value = "none"                    # fix (a): the LM fine-tuned itself, no head
    assert p.verdict.fits and p.run_setup()["model"] == "tiny-gpt2"
    p.run_button.click()
    r, est = p.history[-1], panel_runs.estimate_as_run(p.run_setup())
    assert r["status"] == "ok" and r["oom_stage"] is None and r["returned"] is True, r
    last = drawn_in_order(p.last_chart)
    assert [(name, figure) for name, figure, _ in last] == [(s.name, s.estimate_bytes) for s in trainer_plan(est, 2)]
    assert [name for name, _, _ in last] == ["load", "step 1", "later steps", "evaluation", "cleanup"]
    for name, figure, measured in last[:-1]:
        assert 0.95 <= ratio(measured, figure) <= 1.05, (name, measured, figure)
    assert last[-1][2] < 2**20


def test_scenario_2_runs_the_folds_the_users_loop_dies_at_fold_2s_load_the_fixed_one_fits():
    from kit.scenarios.cross_validation.cap import run_estimate
    from kit.scenarios.cross_validation.predict import fold1_leftovers, fold2_prediction

    p = panel(scenario=2, folds=2, steps=2)              # the user's loop: loaded each fold, the old Trainer kept
    p.run_button.click()
    r, chart = p.history[-1], p.last_chart
    est = run_estimate("tiny-llama", "standard", batch_size=1, seq_len=8, lora_r=8, quantization="4bit")
    f2 = fold2_prediction(est)
    assert "tiny twin tiny-llama (for meta-llama/Meta-Llama-3-8B), batch 1 x 8" in chart.title
    assert est.peak_bytes < r["cap_bytes"] < f2["load_peak_bytes"], "the cap holds one fold, not fold 2's load"
    assert r["status"] == "OOM" and r["oom_stage"] == "fold 2: load", r
    last = drawn_in_order(chart)
    assert [(name, figure) for name, figure, _ in last] == [
        ("fold 1: load", f2["load_peak_bytes"] - f2["leftover_bytes"]), ("fold 1: training", est.peak_bytes),
        ("fold 1: release", fold1_leftovers(est)), ("fold 2: load", f2["load_peak_bytes"]), ("cleanup", 0)]
    for name, figure, measured in last[:3]:
        assert 0.95 <= ratio(measured, figure) <= 1.05, (name, measured, figure)
    assert last[3][2] is None and r["returned"] is True

    p.controls["load"].value = "once"                    # the fixed loop: loaded once, each fold's Trainer released
    p.run_button.click()
    r = p.history[-1]
    assert r["status"] == "ok", r
    last = drawn_in_order(p.last_chart)
    assert [name for name, _, _ in last] == ["fold 1: load", "fold 1: training", "fold 1: release",
                                             "fold 2: training", "fold 2: release", "cleanup"]
    for name, figure, measured in last[1:-1]:
        assert 0.95 <= ratio(measured, figure) <= 1.05, (name, measured, figure)
