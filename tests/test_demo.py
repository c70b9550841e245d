"""`python -m kit demo` in smoke mode, end to end: the summary.json contract and what it must show."""
import argparse
import json
import subprocess
import sys

import pytest

from kit import machine


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    run = subprocess.run([sys.executable, "-m", "kit", "demo", "--out", str(out), "--size", "smoke"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:]
    PRINTED[out] = run.stdout
    return out, json.loads((out / "summary.json").read_text())


PRINTED = {}    # what the demo printed (stdout and stderr together), by its folder


def test_summary_contract(demo):
    out, s = demo
    assert s["size"] == "smoke" and s["reading"] in ("live_tensor_bytes", "cuda_allocated") and s["errors"] == []
    original = s["scenario1"]["original"]
    assert isinstance(original["estimate_peak_bytes"], int) and isinstance(original["oom"], bool)
    for fold in s["scenario2"]["broken"]["folds"] + s["scenario2"]["fixed"]["folds"]:
        assert all(isinstance(fold[k], int) for k in ("start_bytes", "peak_bytes", "end_bytes"))
    for name in ("report.md", "report.html", "s1_breakdown.png", "s2_fixed_folds.png"):
        assert (out / name).stat().st_size > 0
    assert "data:image/png;base64" in (out / "report.html").read_text()


def test_scenario1_names_the_head_and_fixes_peak_far_below(demo):
    _, s = demo
    s1 = s["scenario1"]
    assert s1["offender"] == "custom_layer"
    fix_a = s1["fixes"][0]
    assert fix_a["measured_peak_bytes"] < s1["original"]["estimate_peak_bytes"] / 10
    assert all(f["returned"] for f in s1["fixes"])  # each fix's memory came back after cleanup
    real = s1["real_size_estimate"]                     # the user's real size, estimated even in smoke mode
    assert real["fits_t4"] is False and real["peak_bytes"] > 15 * 2**30 and real["cpu_build_bytes"] > 9 * 2**30


def test_scenario2_broken_shows_second_model_and_fixed_is_flat(demo):
    _, s = demo
    broken, fixed = s["scenario2"]["broken"]["folds"], s["scenario2"]["fixed"]["folds"]
    first_model_bytes = broken[0]["start_bytes"]
    assert broken[1]["start_bytes"] >= broken[0]["start_bytes"] + 0.9 * first_model_bytes
    assert all(abs(f["end_bytes"] - fixed[0]["end_bytes"]) <= 0.01 * fixed[0]["end_bytes"] for f in fixed)
    assert all(f["adapter_reset_ok"] for f in fixed)
    assert s["scenario2"]["advice_reset_changed_nothing"] is True


def test_first_figure_is_the_real_size_estimate(demo):
    out, s = demo
    md = (out / "report.md").read_text()
    images = [line for line in md.splitlines() if line.startswith("![")]
    assert images[0] == "![s1_breakdown](s1_breakdown.png)"                  # relative, beside report.md
    assert all("](" in i and "/" not in i.split("](")[1] for i in images)
    assert md.index("## At a glance") < md.index("![s1_breakdown]") < md.index("## Scenario 1")
    from kit.cli.demo import real_size_figure
    from kit.units import gib

    ax = real_size_figure().axes[0]
    stacked = sum(p.get_height() for p in ax.patches)
    assert stacked == pytest.approx(gib(s["scenario1"]["real_size_estimate"]["peak_bytes"]))   # the real model
    assert stacked > 15                                                    # not the tiny twin's 0.44 GiB
    assert "ESTIMATED" in ax.get_title()
    texts = [t.get_text() for t in ax.texts] + [t.get_text() for t in ax.get_xticklabels()]
    assert not any("not run" in t or "measured" in t.lower() for t in texts)


def test_original_compares_like_with_like(demo):
    """The original's estimate is the setup as it ran here (the run's record), not the Colab recipe."""
    from kit.scenarios.custom_head import scenario as s1

    _, s = demo
    original = s["scenario1"]["original"]
    as_run = s1.estimate_user(s1.NAMES["smoke"], precision=original["precision"], device=machine.device_name(),
                          grad_accum=original["grad_accum"])
    # the user's own Trainer, read as it ran: the registry's model but for its vocabulary (the shipped tokenizer's)
    assert original["estimate_peak_bytes"] == pytest.approx(as_run.peak_bytes, rel=0.001)
    assert original["recipe_estimate_peak_bytes"] == s1.predict_original("smoke").peak_bytes
    if not machine.has_cuda():                       # on a CPU the run is fp32 with 2 micro-batches
        assert original["estimate_peak_bytes"] != original["recipe_estimate_peak_bytes"]
    if original["oom"]:                              # under the scaled cap: stopped by it, so not measured
        assert original["measured_peak_bytes"] is None
    else:
        assert 0.9 <= original["measured_peak_bytes"] / original["estimate_peak_bytes"] <= 1.1
    for which, fix in zip("abc", s["scenario1"]["fixes"]):   # each ratio: the same setup, the same accumulation
        assert fix["estimate_peak_bytes"] == s1.estimate_fix(which, "smoke", as_run=True,
                                                             grad_accum=fix["grad_accum"]).peak_bytes


def test_the_demo_prints_at_most_40_lines_with_the_where_to_look_line_last(demo):
    out, _ = demo
    lines = PRINTED[out].splitlines()
    assert 0 < len(lines) <= 40, PRINTED[out]
    assert lines[-1].startswith("Wrote ") and str(out / "report.md") in lines[-1]
    for noise in ("Map:", "Filter", "Packing", "Warning", "warn(", "it/s]", "Traceback"):
        assert noise not in PRINTED[out], f"{noise!r} reached the terminal"
    assert (out / "demo.log").stat().st_size > 0      # they went to the log


def test_scenario1_runs_under_a_t4_scaled_to_the_twin_the_original_runs_out_and_each_fix_is_measured(demo):
    """Under the cap each change either ran and was measured (within 10% of its estimate), or ran out of memory
    as its estimate says it must (over the cap) and the report shows it not taken: never unmeasured unsaid."""
    from kit.presets import PRESETS
    from kit.scenarios.custom_head import scenario as s1

    out, s = demo
    cap, t4 = s["scenario1"]["cap"], PRESETS["colab-t4"].gpu_bytes
    twin, real = s1.predict_original("smoke"), s1.predict_original("real")
    assert cap["limit_bytes"] == t4 and cap["cap_bytes"] == t4 * twin.peak_bytes // real.peak_bytes
    assert cap["text"] in PRINTED[out] and cap["how"].startswith("CPU live-tensor counter")
    assert s["scenario1"]["original"]["oom"] is True
    assert s["scenario1"]["original"]["estimate_peak_bytes"] > cap["cap_bytes"]   # why: the estimate says so
    rows = _fix_rows((out / "report.md").read_text())
    assert len(s["scenario1"]["fixes"]) == len(s1.FIXES) == len(rows)
    for which, fix in zip(s1.FIXES, s["scenario1"]["fixes"]):
        row = rows[f"({which})"]
        if fix["measured_peak_bytes"] is not None:                     # ran: measured, beside its estimate
            assert fix["oom"] is False and fix["estimate_peak_bytes"] < cap["cap_bytes"], fix
            assert 0.9 <= fix["measured_peak_bytes"] / fix["estimate_peak_bytes"] <= 1.1, fix
            assert row["measured/estimated"] == f"{fix['measured_peak_bytes'] / fix['estimate_peak_bytes']:.2f}"
        else:                                                          # not taken: ran out, as its estimate says
            assert fix["oom"] is True and fix["estimate_peak_bytes"] > cap["cap_bytes"], fix
            assert row["measured/estimated"] == "out of memory (caught)", row
            assert row["note"].startswith("OUT OF MEMORY under the cap, caught, as its estimate says."), row
    measured = {which for which, fix in zip(s1.FIXES, s["scenario1"]["fixes"]) if fix["measured_peak_bytes"]}
    fixes = {which for which, fix in zip(s1.FIXES, s["scenario1"]["fixes"]) if fix["fits_t4_at_real_size"]}
    assert fixes == {"a", "b"} and measured == fixes          # each real fix was measured here


def _fix_rows(md: str) -> dict:
    """Scenario 1's table of changes in report.md, by "(a)", "(b)", ...: {column: cell}."""
    section = md[md.index("## Scenario 1: the fixes"):]
    lines = [line for line in section.splitlines() if line.startswith("| (")]
    head = [c.strip() for c in section[section.index("| change |"):].splitlines()[0].split("|")[1:-1]]
    rows = [dict(zip(head, (c.strip() for c in line.split("|")[1:-1]))) for line in lines]
    return {row["change"].split(" ")[0]: row for row in rows}


def test_the_head_kept_in_16_bit_is_not_called_a_fix_and_the_report_says_why(demo):
    """Change (c) keeps the VxV head: at real size on a T4 it still does not fit, as its estimate says, and the
    report, the summary and the terminal say so rather than calling it a fix."""
    from kit.cli.demo import on_a_t4_at_real_size
    from kit.scenarios.custom_head import scenario as s1

    out, s = demo
    md = (out / "report.md").read_text()
    kept = on_a_t4_at_real_size("c")
    assert kept["fits"] is False and "DOES NOT FIT Colab T4" in kept["verdict"]
    assert s["scenario1"]["fixes"][2]["fits_t4_at_real_size"] is False
    assert "## Scenario 1: the fixes, and (c), the VxV head kept, which still does not fit a T4" in md
    note = _fix_rows(md)["(c)"]["note"]
    params = s1.predict_original("real").offender_params
    assert f"Not a fix: the VxV head kept, its {params:,} parameters still trained." in note
    assert kept["verdict"] in note and kept["name"] in note
    assert "(c) keep the VxV head" in PRINTED[out] and "not a fix, it still does not fit a T4 at real size" in \
        PRINTED[out]
    assert "fix (c)" not in PRINTED[out] and "| fix (c)" not in md


def test_scenario2_broken_loop_runs_out_at_fold_2_and_the_fixed_loop_stays_flat_under_the_same_cap(demo):
    from kit.scenarios.cross_validation.cap import scaled_cap

    out, s = demo
    s2 = s["scenario2"]
    cap = s2["cap"]
    assert cap["cap_bytes"] == scaled_cap("tiny-llama", recipe="standard", batch_size=1, seq_len=8)["cap_bytes"]
    assert cap["text"] in PRINTED[out]
    assert s2["broken"]["oom_at_fold"] == 2
    fold2 = s2["broken"]["folds"][1]
    assert fold2["oom"] is True and fold2["oom_during"] in ("load", "prepare") and fold2["models_alive_after_load"] == 2
    fixed = s2["fixed"]["folds"]
    assert s2["fixed"]["oom_at_fold"] is None and len(fixed) == 5
    assert all(f["peak_bytes"] <= cap["cap_bytes"] and f["models_alive"] == 1 for f in fixed)
    assert max(f["peak_bytes"] for f in fixed) - min(f["peak_bytes"] for f in fixed) <= 0.02 * fixed[0]["peak_bytes"]
    assert (out / "s2_load_moment.png").stat().st_size > 0


def test_every_measured_estimated_pair_of_the_second_fold_is_matched(demo):
    """Fold 2's load, measured, beside the estimate of the same moment (right after from_pretrained): within 5%."""
    import re

    out, _ = demo
    md = (out / "report.md").read_text()
    ratios = [float(r) for r in re.findall(r"MEASURED [^,;]+, ESTIMATED [^(;]+\((\d+\.\d+)x\)", md)]
    assert len(ratios) == 2 and all(0.95 <= r <= 1.05 for r in ratios), ratios


def test_second_fold_text_counts_models(demo):
    out, s = demo
    broken = s["scenario2"]["broken"]["folds"]
    n = broken[1]["models_alive_after_load"]
    assert broken[0]["models_alive_after_load"] == 1 and n == 2
    assert f"second fold loads with {n} models alive" in (out / "report.md").read_text()


def test_second_fold_text_says_the_count_not_a_guess():
    from kit.cli.demo_folds import second_fold_text

    higher_but_one = [{"load_peak_bytes": 1, "models_alive_after_load": 1},
                      {"load_peak_bytes": 9, "models_alive_after_load": 1}]
    assert second_fold_text(higher_but_one).startswith("loads with 1 model alive")
    three = [{"load_peak_bytes": 1, "models_alive_after_load": 1}, {"load_peak_bytes": 1, "models_alive_after_load": 3}]
    assert "3 models alive" in second_fold_text(three) and "two" not in second_fold_text(three)


def test_unwritable_out_is_a_clear_error(tmp_path, run_kit):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_kit("demo", "--out", str(blocker / "sub"))
    assert code == 2
    assert "cannot write the report" in err and "Traceback" not in err


def test_bad_option_is_a_clear_error(run_kit):
    code, _, err = run_kit("demo", "--out", "x", "--size", "huge")
    assert code == 2 and "invalid choice" in err and "Traceback" not in err


# ---- --out never writes over, or loses, the user's files ------------------------------------------------
def _fake_scenarios(monkeypatch):
    """The two scenarios replaced by one plot and one summary field each: the folder rules, in a second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kit.cli import demo as demo_cli

    def fake(key):
        def run(size, out, summary, sections, step, glance):
            fig = plt.figure()
            summary[f"scenario{key}"] = {"ran": True}
            sections.append(demo_cli.Section(f"Scenario {key}", ["faked"],
                                             images=[demo_cli.save_png(fig, out, f"s{key}_plot")]))
        return run

    monkeypatch.setattr(demo_cli, "_scenario1", fake("1"))
    monkeypatch.setattr(demo_cli, "scenario2", fake("2"))
    return lambda out, scenario, size="smoke": demo_cli.run(argparse.Namespace(out=str(out), size=size,
                                                                             scenario=scenario))


def test_a_folder_of_the_users_files_is_refused_before_the_run_and_left_as_it_was(tmp_path, monkeypatch, capsys):
    run = _fake_scenarios(monkeypatch)
    mine = {"report.md": "my notes", "summary.json": "{}", "s1_plot.png": "my plot", "holiday.png": "x"}
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    assert run(tmp_path, "all") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} holds files the kit did not write (holiday.png, report.md, ")
    assert "never writes over them" in err and "Traceback" not in err
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == mine           # nothing written, nothing lost


def test_a_second_run_moves_the_earlier_one_aside_and_counts_only_its_own_plots(tmp_path, monkeypatch, capsys):
    run = _fake_scenarios(monkeypatch)
    out = tmp_path / "report"
    assert run(out, "1") == 0
    first = json.loads((out / "summary.json").read_text())
    assert "scenario1" in first and "and 1 PNG plots" in capsys.readouterr().out
    assert run(out, "2") == 0                       # --scenario 2 after --scenario 1
    said = capsys.readouterr().out
    assert f"{out} held an earlier demo run: moved it to {out / 'earlier-1'} (nothing deleted)" in said
    assert "and 1 PNG plots" in said                # its own plot, not the earlier run's
    assert json.loads((out / "earlier-1" / "summary.json").read_text()) == first          # scenario 1's, kept
    assert (out / "earlier-1" / "s1_plot.png").is_file() \
        and "s1_plot.png" in (out / "earlier-1" / "report.md").read_text()
    assert (out / "s2_plot.png").is_file() and not (out / "s1_plot.png").exists()
    assert run(out, "1") == 0 and (out / "earlier-2" / "s2_plot.png").is_file()    # and again: earlier-2


def test_a_file_as_out_is_refused(tmp_path, capsys):
    from kit.cli import demo as demo_cli

    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert demo_cli.run(argparse.Namespace(out=str(f), size="smoke", scenario="all")) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and f.read_text() == "mine"


@pytest.mark.parametrize("asked", ["real", "smoke", None])
def test_the_report_says_the_sizes_that_ran_and_why(tmp_path, monkeypatch, asked):
    """``--size real`` on a CPU says REAL, not the machine's SMOKE default, two lines above "Sizes: **real**"."""
    from kit import runtime

    monkeypatch.delenv("KIT_SMOKE", raising=False)    # this machine's own default, and its reason (wrapped)
    run = _fake_scenarios(monkeypatch)
    assert run(tmp_path, "1", asked) == 0
    this_run = (tmp_path / "report.md").read_text().split("## This run")[1].split("\n## ")[0]
    size = asked or runtime.mode()
    assert f"Sizes: **{size}**" in this_run
    other = {"smoke": "REAL", "real": "SMOKE"}[size]
    assert other not in this_run, this_run
    said = runtime.mode_reason() if asked is None else f"{size.upper()} sizes"
    assert said in " ".join(this_run.replace("  \n", " ").split())
