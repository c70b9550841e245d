"""``make gpu-check`` without a GPU: its one line, its verdicts on summary.json dicts, its stage runner, its
whole flow with the GPU stages replaced by tiny commands, and the ``KIT_GPU_CAP_BYTES`` hook with CUDA faked."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check as gc  # noqa: E402
import gpu_check_preflight as pf  # noqa: E402
import gpu_check_verdicts as gv  # noqa: E402

GiB = 1024 ** 3
CAP = gc.CAP_BYTES
MiB = 2 ** 20

# A summary.json as a real-size demo on a GPU writes it (fields as kit/cli/demo.py writes them).
PASSING = {
    "device": "NVIDIA H200", "size": "real", "reading": "cuda_allocated", "errors": [],
    "scenario1": {"offender": "custom_layer",
                  "original": {"estimate_peak_bytes": 52 * GiB, "measured_peak_bytes": None, "oom": True},
                  "fixes": [{"name": "(a) drop the head, fine-tune the LM itself", "estimate_peak_bytes": 2 * GiB,
                             "measured_peak_bytes": 2 * GiB + MiB, "returned": True, "oom": False},
                            {"name": "(b) low-rank head V->16->V", "estimate_peak_bytes": 3 * GiB,
                             "measured_peak_bytes": 3 * GiB - MiB, "returned": True, "oom": False},
                            {"name": "(c) VxV head, bf16 weights, AdamW", "estimate_peak_bytes": 40 * GiB,
                             "measured_peak_bytes": None, "returned": True, "oom": True}]},
    "scenario2": {"broken": {"folds": [
        {"start_bytes": 0, "peak_bytes": 3 * GiB, "end_bytes": 2 * GiB, "models_alive_after_load": 1},
        {"start_bytes": 2 * GiB, "peak_bytes": 4 * GiB, "end_bytes": 2 * GiB, "models_alive_after_load": 2,
         "models_alive_in_training": 1},
        {"start_bytes": 2 * GiB, "peak_bytes": 4 * GiB, "end_bytes": 2 * GiB, "models_alive_after_load": 2}],
        "oom_at_fold": None},
        "fixed": {"folds": [{"start_bytes": GiB, "peak_bytes": 3 * GiB + i * MiB, "end_bytes": GiB + i,
                             "adapter_reset_ok": True} for i in range(5)]},
        "advice_reset_changed_nothing": True,
        "estimate": {"model": "meta-llama/Llama-3.2-1B", "two_models_bytes": 4 * GiB,
                     "llama3_8b_nf4_training_weights_bytes": 7 * GiB}},
}
NOT_CHECKABLE = {"memory back at baseline: scenario 1's original", "memory back at baseline: the broken loop"}
# The crash stage's file (gpu_check_crash.py) where the prediction came true: out of memory at fold 2's load.
CRASH = {"model": "meta-llama/Meta-Llama-3-8B",
         "prediction": {"leftover_bytes": int(7.31 * GiB), "loaded_bytes": int(14.59 * GiB),
                        "load_peak_bytes": int(15.57 * GiB), "train_peak_bytes": int(10.27 * GiB)},
         "broken": {"folds": [{"fold": 1, "start_bytes": 0, "load_peak_bytes": 8 * GiB, "models_alive_after_load": 1,
                               "train_peak_bytes": 10 * GiB, "end_bytes": 7 * GiB, "peak_bytes": 10 * GiB},
                              {"fold": 2, "start_bytes": 7 * GiB, "load_peak_bytes": int(14.5 * GiB),
                               "loaded_bytes": int(14.4 * GiB), "models_alive_after_load": 2, "oom": True,
                               "oom_during": "load", "end_bytes": int(14.4 * GiB), "peak_bytes": int(14.5 * GiB)}],
                    "oom_at_fold": 2}}


def _by_check(summary) -> dict:
    return {v["check"]: v for v in gv.verdicts(summary, CAP)}


def _status(summary, fragment: str) -> dict:
    hits = [v for k, v in _by_check(summary).items() if fragment in k]
    assert len(hits) == 1, (fragment, list(_by_check(summary)))
    return hits[0]


# ---- without a GPU -------------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, make gpu-check runs for real")
def test_make_gpu_check_prints_one_line_and_exits_0_without_a_gpu():
    # -o: take the venv as built (never reinstall from a test); -s: make's own echo off
    p = subprocess.run(["make", "-s", "-o", ".venv/.installed", f"PY={sys.executable}", "gpu-check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [gc.NO_GPU]
    assert "nothing to check" in gc.NO_GPU


# ---- verdicts from summary.json ------------------------------------------------------------------------

def test_a_passing_summary_passes_every_checkable_verdict():
    got = _by_check(PASSING)
    assert {k for k, v in got.items() if v["status"] == gv.NOT_CHECKED} == NOT_CHECKABLE
    assert all(v["status"] == gv.PASSED for k, v in got.items() if k not in NOT_CHECKABLE), \
        [(k, v["status"], v["detail"]) for k, v in got.items() if v["status"] != gv.PASSED]
    broken = _status(PASSING, "broken loop runs out")
    assert "two models alive" in broken["detail"] and "Llama-3.2-1B" in broken["detail"]  # says which, and why
    assert _status(PASSING, "fix (a)")["figures"]["measured peak"] == {"bytes": 2 * GiB + MiB, "kind": "measured"}
    assert _status(PASSING, "fix (a)")["figures"]["estimated peak"]["kind"] == "estimated"


def test_fold_2_starting_with_one_model_fails():
    s = copy.deepcopy(PASSING)
    s["scenario2"]["broken"]["folds"][1]["models_alive_after_load"] = 1
    assert _status(s, "broken loop runs out")["status"] == gv.FAILED


def test_the_older_field_name_is_read_too():
    s = copy.deepcopy(PASSING)
    for f in s["scenario2"]["broken"]["folds"]:
        f["models_alive_at_start"] = f.pop("models_alive_after_load")
    assert _status(s, "broken loop runs out")["status"] == gv.PASSED


def test_missing_readings_show_not_taken():
    s = copy.deepcopy(PASSING)
    s["scenario2"]["broken"]["folds"][1].pop("models_alive_after_load")
    s["scenario2"]["fixed"]["folds"][3]["peak_bytes"] = None
    s["scenario1"]["fixes"][0]["measured_peak_bytes"] = None
    s["scenario1"]["fixes"][1]["returned"] = None
    assert _status(s, "broken loop runs out")["status"] == gv.NOT_TAKEN
    assert _status(s, "peaks stay within 1%")["status"] == gv.NOT_TAKEN
    assert _status(s, "fix (a) fits")["status"] == gv.NOT_TAKEN
    assert _status(s, "scenario 1's fixes")["status"] == gv.NOT_TAKEN
    assert gv.verdicts(None, CAP, "the demo timed out")[0]["status"] == gv.NOT_TAKEN


def test_out_of_memory_in_fold_2_passes_and_in_fold_1_fails():
    s = copy.deepcopy(PASSING)
    s["scenario2"]["broken"]["oom_at_fold"] = 2
    assert "fold 2" in _status(s, "broken loop runs out")["detail"]
    s["scenario2"]["broken"]["oom_at_fold"] = 1
    assert _status(s, "broken loop runs out")["status"] == gv.FAILED


def test_the_8b_crash_passes_only_where_the_prediction_came_true():
    assert gv.crash_verdict(CRASH, CAP)["status"] == gv.PASSED
    figures = gv.crash_verdict(CRASH, CAP)["figures"]
    assert figures["fold 2's load peak"]["kind"] == "measured" and figures["cap"]["kind"] == "set"
    during_training = copy.deepcopy(CRASH)
    during_training["broken"]["folds"][1]["oom_during"] = "train"   # predicted at the load: the moment is wrong
    assert gv.crash_verdict(during_training, CAP)["status"] == gv.FAILED
    no_oom = copy.deepcopy(CRASH)
    no_oom["broken"]["oom_at_fold"] = None
    no_oom["broken"]["folds"][1].update(oom=False, load_peak_bytes=14 * GiB)
    assert "no out-of-memory error" in gv.crash_verdict(no_oom, CAP)["detail"]
    assert gv.crash_verdict(no_oom, CAP)["status"] == gv.FAILED
    fold1 = copy.deepcopy(CRASH)
    fold1["broken"]["oom_at_fold"] = 1
    assert gv.crash_verdict(fold1, CAP)["status"] == gv.FAILED
    assert gv.crash_verdict(None, CAP, "timed out after 320 s")["status"] == gv.NOT_TAKEN


def test_the_original_fitting_under_the_cap_fails_and_a_refusal_passes():
    s = copy.deepcopy(PASSING)
    s["scenario1"]["original"].update(oom=False, measured_peak_bytes=10 * GiB)
    assert _status(s, "the original runs out")["status"] == gv.FAILED
    s["scenario1"]["original"]["refused"] = "needs 60 GiB of RAM"
    assert _status(s, "the original runs out")["status"] == gv.PASSED


def test_a_fix_that_runs_out_of_memory_fails():
    s = copy.deepcopy(PASSING)
    s["scenario1"]["fixes"][1].update(oom=True, measured_peak_bytes=None)
    assert _status(s, "fix (b) fits")["status"] == gv.FAILED


def test_fixed_loop_spread_adapter_reset_and_baseline_fail_when_wrong():
    s = copy.deepcopy(PASSING)
    s["scenario2"]["fixed"]["folds"][4]["peak_bytes"] = int(3 * GiB * 1.02)
    s["scenario2"]["fixed"]["folds"][2]["adapter_reset_ok"] = False
    s["scenario2"]["fixed"]["folds"][1]["end_bytes"] = int(GiB * 1.5)
    assert _status(s, "peaks stay within 1%")["status"] == gv.FAILED
    assert _status(s, "adapter reset")["status"] == gv.FAILED
    assert _status(s, "fixed fold's end")["status"] == gv.FAILED
    s = copy.deepcopy(PASSING)
    del s["scenario2"]["fixed"]["folds"][3:]
    assert "folds missing" in _status(s, "peaks stay within 1%")["detail"]


def test_a_smoke_or_failed_demo_is_not_a_real_size_proof():
    s = copy.deepcopy(PASSING)
    s.update(size="smoke", errors=["scenario 2: RuntimeError: boom"])
    del s["scenario2"]
    v = _status(s, "demo ran at real size")
    assert v["status"] == gv.FAILED and "smoke" in v["detail"] and "boom" in v["detail"]
    assert _by_check(s)["scenario 2"]["status"] == gv.NOT_TAKEN


# ---- the stage runner ----------------------------------------------------------------------------------

def _py(code: str) -> list:
    return [sys.executable, "-c", code]


def test_a_stage_past_its_budget_is_stopped_and_every_output_is_kept(tmp_path):
    child = tmp_path / "child.pid"
    slow = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f"open({str(child)!r}, 'w').write(str(p.pid)); print('partial', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    r = gc.run_stages([gc.Stage("one", _py("print('first output')"), 20),
                       gc.Stage("two", _py(slow), 1.5),
                       gc.Stage("three", _py("import sys; print('third'); sys.exit(3)"), 20)], tmp_path / "logs")
    assert time.monotonic() - t0 < 15
    assert [x.ok for x in r] == [True, False, False]
    assert r[0].output == "first output\n" and Path(r[0].log).read_text() == "first output\n"
    assert r[1].timed_out and r[1].rc is None and r[1].output.startswith("partial\n")
    assert "stopped at its budget" in r[1].output
    assert r[2].rc == 3 and r[2].output == "third\n"
    time.sleep(0.5)
    pid = int(child.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], \
        "the stage's own child outlived its stop"


def test_parallel_stages_each_keep_their_own_budget(tmp_path):
    t0 = time.monotonic()
    r = gc.run_stages([gc.Stage("slow", _py("import time; print('a', flush=True); time.sleep(60)"), 1.5),
                       gc.Stage("quick", _py("import time; time.sleep(1); print('b')"), 20)], tmp_path,
                      parallel=True)
    assert time.monotonic() - t0 < 12
    assert r[0].timed_out and r[0].output.startswith("a\n")
    assert r[1].ok and r[1].output == "b\n"


# ---- the whole flow, the GPU faked and every stage a tiny command --------------------------------------

def _fake_stages(demo_summary: dict | None, demo_budget: float = 20):
    def stages_for(work: Path, py: str):
        cap_log = work / "kernel-caps.jsonl"
        def demo(n: str) -> str:  # each demo run writes its own scenario only, as --scenario N does
            part = demo_summary and {k: v for k, v in demo_summary.items() if k != f"scenario{3 - int(n)}"}
            return (f"import json, pathlib; d = pathlib.Path({str(work / f'demo-s{n}')!r}); d.mkdir(parents=True);"
                    f"print('{gc.CAP_ENV}={gc.CAP_BYTES}: CUDA capped at {gc.CAP_BYTES:,} bytes, fraction 0.1');"
                    + (f"(d / 'summary.json').write_text({json.dumps(json.dumps(part))})" if part
                       else "import time; time.sleep(60)"))
        kernel = (f"import json; open({str(cap_log)!r}, 'a').write(json.dumps("
                  "{'pid': 1, 'cap': 'CUDA capped at 15,633,680,957 bytes'}) + '\\n')")
        def executed(n: str) -> str:  # the executed notebook, whose run note says which sizes ran
            path = work / "notebooks" / f"{n}.ipynb"
            return (f"; import pathlib; pathlib.Path({str(path)!r}).parent.mkdir(parents=True, exist_ok=True); "
                    f"pathlib.Path({str(path)!r})"
                    ".write_text('These outputs come from a run on a GPU. REAL sizes: ...')")
        grid = f"print('{'full FT fp32':40s} distilgpt2               predicted  1,000 measured  1,010 (-0.99%) [3 s]')"
        first = [gc.Stage("gpu tests", _py("print('3 passed')"), 20), gc.Stage("estimate grid", _py(grid), 20)]
        crash = (f"import pathlib; pathlib.Path({str(work / 'crash.json')!r})"
                 f".write_text({json.dumps(json.dumps(CRASH))})")
        side = [gc.Stage(f"demo s{n}", _py(demo(n)), demo_budget) for n in "12"] + \
            [gc.Stage("crash loop", _py(crash), 20)] + [gc.Stage(f"notebook {n[:2]}", _py(kernel + executed(n)), 20)
                                                        for n in gc.NOTEBOOKS]
        return first, side
    return stages_for


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 80GB")
    # the preflight's readings of a card whose free memory holds every capped stage at once
    monkeypatch.setattr(gc, "read_box", lambda t: {"python": sys.executable, "torch": "2.13.0", "cuda": "12.8",
                                                   "driver": "570.1", "gpu": "Fake GPU 80GB",
                                                   "free_bytes": 139 * GiB, "total_bytes": 140 * GiB})


def test_main_on_a_faked_gpu_writes_the_report_and_passes(fake_gpu, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gc, "stages_for", _fake_stages(PASSING))
    rc = gc.main(["--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")])
    md = list((tmp_path / "results").glob("gpu-check-*-fake-gpu-80gb.md"))
    assert rc == 0, capsys.readouterr().out + (md[0].read_text() if md else "")
    text = md[0].read_text()
    assert f"{gc.CAP_BYTES:,} bytes (14.56 GiB)" in text
    assert "| the T4 cap is in force in both demo runs | **passed**" in text
    assert "(measured)" in text and "(estimated)" in text and "**FAILED**" not in text
    js = json.loads(md[0].with_suffix(".json").read_text())
    assert js["cap_bytes"] == gc.CAP_BYTES and js["grid"][0]["measured_peak_bytes"] == 1010
    assert js["summary"] == PASSING and len(js["stages"]) == 2 + 2 + 1 + len(gc.NOTEBOOKS)
    crash = next(v for v in js["verdicts"] if v["check"].startswith("scenario 2 at Llama-3-8B size"))
    assert crash["status"] == gv.PASSED and "while loading" in crash["detail"]


def test_a_notebook_that_ran_in_smoke_mode_fails_its_real_size_verdict():
    assert gv.notebook_verdict("01", 0, "SMOKE mode: tiny twins", "exit 0")["status"] == gv.FAILED
    assert gv.notebook_verdict("01", 0, "REAL sizes: real-size architecture twins", "exit 0")["status"] == gv.PASSED
    assert gv.notebook_verdict("01", None, None, "timed out")["status"] == gv.NOT_TAKEN


def test_the_grid_fails_on_its_numbers_not_its_exit_code():
    row = {"label": "full FT", "model": "gpt2", "error_pct": 0.4}
    assert gv.grid_verdict(0, [row], "exit 0")["status"] == gv.PASSED
    assert gv.grid_verdict(0, [row, dict(row, error_pct=-2.5)], "exit 0")["status"] == gv.FAILED
    assert gv.grid_verdict(1, [row], "exit 1")["status"] == gv.FAILED


def test_the_broken_loop_fails_when_the_oom_comes_after_fold_two():
    est = {"two_models_bytes": 10 * GiB, "model": "m"}
    folds = [{"peak_bytes": 1, "models_alive_after_load": 1}, {"peak_bytes": 2, "models_alive_after_load": 2},
             {"peak_bytes": 3}]
    late = {"broken": {"folds": folds, "oom_at_fold": 3}, "estimate": est}
    assert gv._broken(late, CAP)["status"] == gv.FAILED and "fold 3" in gv._broken(late, CAP)["detail"]
    over = {"broken": {"folds": folds[:2], "oom_at_fold": None}, "estimate": dict(est, two_models_bytes=2 * CAP)}
    assert gv._broken(over, CAP)["status"] == gv.FAILED


def test_main_keeps_going_when_the_demo_times_out(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(gc, "stages_for", _fake_stages(None, demo_budget=1.5))
    rc = gc.main(["--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")])
    assert rc == 1
    js = json.loads(next((tmp_path / "results").glob("gpu-check-*.json")).read_text())
    by = {v["check"]: v for v in js["verdicts"]}
    assert by["the demo's summary.json"]["status"] == gv.NOT_TAKEN and "timed out" in \
        by["the demo's summary.json"]["detail"]
    assert by["the GPU-marked tests pass"]["status"] == gv.PASSED   # the earlier stages' results are kept
    demo = next(s for s in js["stages"] if s["name"] == "demo s2")
    assert demo["timed_out"] and "CUDA capped" in demo["output_tail"]


def test_the_budgets_fit_in_nine_minutes_setup_included():
    serial = gc.BUDGETS["gpu tests"] + gc.BUDGETS["estimate grid"]
    side = max(v for k, v in gc.BUDGETS.items() if k.startswith(("demo", "notebook", "crash")))
    assert set(gc.BUDGETS) == {"gpu tests", "estimate grid", *gc.DEMOS, "crash loop",
                               *(f"notebook {n[:2]}" for n in gc.NOTEBOOKS)}
    assert gc.SETUP_S + serial + side + 3 * 10 <= gc.TOTAL_S == 540   # + the stop grace (TERM, then KILL)
    first, side_stages = gc.stages_for(Path("/tmp/w"), sys.executable)
    p = pf.plan({s.name: s.budget_s for s in first}, {s.name: s.budget_s for s in side_stages}, pf.NEEDS, set(),
                free_bytes=139 * GiB, cap_bytes=CAP, total_s=gc.TOTAL_S, setup_s=gc.SETUP_S)
    assert p["skipped"] == {} and len(p["batches"]) == 1 and p["seconds"] <= 540


# ---- the preflight and the plan on a simulated box -----------------------------------------------------

def _plan_for(free_bytes, missing=()):
    first, side = gc.stages_for(Path("/tmp/w"), sys.executable)
    return pf.plan({s.name: s.budget_s for s in first}, {s.name: s.budget_s for s in side}, pf.NEEDS, set(missing),
                   free_bytes=free_bytes, cap_bytes=CAP, total_s=gc.TOTAL_S, setup_s=gc.SETUP_S)


def test_an_80_gb_card_runs_what_fits_side_by_side_and_skips_the_rest_with_its_reason():
    p = _plan_for(79 * GiB)                          # holds 5 capped stages (14.56 GiB + a 1 GiB context each)
    assert p["at_once"] == 5 and p["batches"] == [["demo s1", "demo s2", "crash loop", "notebook 00", "notebook 01"]]
    assert set(p["skipped"]) == {"notebook 02", "notebook 03"}
    assert all("holds 5 capped stage(s) at once" in why for why in p["skipped"].values())
    assert p["seconds"] <= gc.TOTAL_S


def test_a_t4_sized_card_runs_capped_stages_one_at_a_time():
    p = _plan_for(int(14.5 * GiB))
    assert p["at_once"] == 1 and p["batches"] == [["demo s1"]] and p["seconds"] <= gc.TOTAL_S
    assert "demo s2" in p["skipped"] and "crash loop" in p["skipped"]


def test_missing_packages_skip_only_the_stages_that_need_them():
    p = _plan_for(139 * GiB, missing=["bitsandbytes", "nbclient"])
    assert p["skipped"]["crash loop"] == "needs bitsandbytes, missing here"
    assert p["skipped"]["notebook 00"] == "needs nbclient, missing here"
    assert p["skipped"]["notebook 02"] == "needs bitsandbytes, nbclient, missing here"
    assert p["first"] == ["gpu tests", "estimate grid"] and p["batches"] == [["demo s1"]]


def test_the_preflight_prints_the_box_the_missing_packages_and_the_plan(fake_gpu, monkeypatch, tmp_path, capsys):
    real = pf.packages
    monkeypatch.setattr(pf, "packages", lambda names: {**real(names), "bitsandbytes": None, "trl": None})
    monkeypatch.setattr(pf, "install_missing", lambda missing: f"missing {', '.join(missing)}, and no wheels")
    monkeypatch.setattr(gc, "stages_for", _fake_stages(PASSING))
    gc.main(["--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert "torch 2.13.0 (CUDA 12.8), driver 570.1, Fake GPU 80GB: 139.00 GiB free of 140.00 GiB" in out
    assert "bitsandbytes MISSING" in out and "trl MISSING" in out and "missing bitsandbytes, trl" in out
    assert "skipped: crash loop: needs bitsandbytes, missing here" in out
    js = json.loads(next((tmp_path / "results").glob("gpu-check-*.json")).read_text())
    crash = next(v for v in js["verdicts"] if v["check"].startswith("scenario 2 at Llama-3-8B size"))
    assert crash["status"] == gv.NOT_TAKEN and "needs bitsandbytes" in crash["detail"]


def test_the_wheels_install_offline_into_their_own_folder(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pf.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or
                        types.SimpleNamespace(returncode=0, stderr=""))
    assert "no wheels in" in pf.install_missing(["trl"], tmp_path / "none", tmp_path / "site")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "trl-1.16.0-py3-none-any.whl").write_text("")
    assert pf.install_missing(["trl"], tmp_path / "w", tmp_path / "site").startswith("installed 1 wheels")
    cmd = calls[-1]
    assert {"--no-index", "--no-deps"} <= set(cmd) and cmd[cmd.index("--target") + 1] == str(tmp_path / "site")
    assert pf.install_missing([], tmp_path / "w") == "nothing missing"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no GPU")
def test_make_gpu_check_fails_loudly_when_nvidia_smi_sees_a_gpu_torch_cannot(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-0000)'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["make", "-s", "-o", ".venv/.installed", f"PY={sys.executable}", f"GPU_PY={sys.executable}",
                        "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0
    assert "nvidia-smi lists 1 GPU(s) (GPU 0: Tesla T4 (UUID: GPU-0000)), but torch" in p.stdout
    assert "this torch is a CPU build" in p.stdout


# ---- KIT_GPU_CAP_BYTES: the hook that caps a whole process ---------------------------------------------

def test_env_cap_bytes_reads_the_variable(monkeypatch):
    from kit.measure import controls as memory_cap

    monkeypatch.delenv(memory_cap.CAP_ENV, raising=False)
    assert memory_cap.env_cap_bytes() is None
    monkeypatch.setenv(memory_cap.CAP_ENV, str(gc.CAP_BYTES))
    assert memory_cap.env_cap_bytes() == gc.CAP_BYTES == 15633680957
    monkeypatch.setenv(memory_cap.CAP_ENV, "14.56GiB")
    with pytest.raises(ValueError, match="KIT_GPU_CAP_BYTES must be"):
        memory_cap.env_cap_bytes()


def _fake_cuda(monkeypatch, total: int) -> list:
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: types.SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, dev=None: calls.append(f))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda dev=None: 1.0)
    return calls


def test_apply_env_cap_sets_the_fraction_of_the_gpu(monkeypatch, capsys):
    from kit.measure import controls as memory_cap

    calls = _fake_cuda(monkeypatch, 80 * 10**9)
    monkeypatch.delenv(memory_cap.CAP_ENV, raising=False)
    assert memory_cap.apply_env_cap() is None and calls == []
    monkeypatch.setenv(memory_cap.CAP_ENV, str(gc.CAP_BYTES))
    how = memory_cap.apply_env_cap()
    assert calls == [gc.CAP_BYTES / (80 * 10**9)] and "capped" in how
    assert capsys.readouterr().err.startswith(f"{memory_cap.CAP_ENV}={gc.CAP_BYTES}: CUDA capped")
    calls.clear()
    monkeypatch.setenv(memory_cap.CAP_ENV, str(100 * 10**9))      # above the GPU: nothing to cap
    assert memory_cap.apply_env_cap().startswith("no cap") and calls == []


def test_a_runs_cap_never_lifts_the_process_cap(monkeypatch):
    from kit.measure import controls, device
    memory_cap = controls

    total = 80 * 10**9
    calls = _fake_cuda(monkeypatch, total)
    monkeypatch.setattr(device, "empty_cache", lambda: None)
    monkeypatch.setenv(memory_cap.CAP_ENV, str(gc.CAP_BYTES))
    with controls.cuda_memory_fraction(40 * 10**9) as how:             # asks for more than the process cap
        assert how.startswith("CUDA memory fraction")
    assert calls == [gc.CAP_BYTES / total, 1.0]                       # set to the process cap, then restored


def test_the_two_demo_runs_merge_into_one_summary(tmp_path):
    paths = []
    for n in "12":
        part = {k: v for k, v in PASSING.items() if k != f"scenario{3 - int(n)}"}
        paths.append(tmp_path / f"s{n}.json")
        paths[-1].write_text(json.dumps(part))
    assert gc.merged_summary(paths) == PASSING
    only_first = gc.merged_summary([paths[0], tmp_path / "missing.json"])
    assert _by_check(only_first)["scenario 2"]["status"] == gv.NOT_TAKEN
    paths[1].write_text(json.dumps({**json.loads(paths[1].read_text()), "size": "smoke"}))
    assert "size differs" in _status(gc.merged_summary(paths), "demo ran at real size")["detail"]


def test_the_benchmark_modules_doctests_pass():
    """``make test`` runs the doctests of kit/ only; these modules' examples are checked here."""
    import doctest

    import gpu_check_report
    import results_file

    for module in (gc, gv, gpu_check_report, pf, results_file):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__
