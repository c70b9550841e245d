"""Scenario 1's notebook helpers: the real-size tables (meta device, no weights) and the read-aloud texts."""
import pytest

from kit import machine
from kit.measure import device as kdevice
from kit.presets import PRESETS
from kit.scenarios.custom_head import notebook as nb
from kit.scenarios.custom_head import runs as s1_runs
from kit.scenarios.custom_head import scenario as s1
from kit.units import fmt_bytes


def test_fixes_at_real_size_gives_each_setup_its_verdict_against_a_t4():
    text = nb.fixes_at_real_size("colab-t4")
    rows = {line.split("  ")[1].strip()[:3]: line for line in text.splitlines()[2:6]}
    assert "DOES NOT FIT" in rows["the"] and "2,525,916,822" in rows["the"]
    assert rows["(a)"].rstrip().endswith("fits") and rows["(b)"].rstrip().endswith("fits")
    assert "DOES NOT FIT" in rows["(c)"]                     # the VxV head stays too big for a T4
    assert "8-bit refused" in rows["(c)"] and "over 2**31 - 1" in text
    assert fmt_bytes(s1.estimate_fix("b", "real").peak_bytes) in rows["(b)"]


def test_record_text_reads_estimate_and_measurement_and_ratio():
    rec = {"name": "(a) x", "estimate_peak_bytes": 2**30, "measured_peak_bytes": 2**29,
           "reading": "cuda_allocated", "returned": True, "note": ""}
    text = nb.record_text(rec)
    assert "ESTIMATED peak, as run here: 1.00 GiB" in text
    assert "MEASURED peak (cuda_allocated): 512.00 MiB, 0.50x the estimate" in text
    assert "lower bound" not in text and "baseline after cleanup: yes" in text
    refused = nb.record_text({**rec, "measured_peak_bytes": None, "refused": "Not run: no RAM."})
    assert "not run. Not run: no RAM." in refused


def test_summary_table_marks_an_oom_and_ratios():
    original = {"estimate_peak_bytes": 2**30, "measured_peak_bytes": None, "oom": True, "reading": "cuda_allocated"}
    fix = {"name": "(b) low-rank", "estimate_peak_bytes": 2**20, "measured_peak_bytes": 2**19}
    lines = nb.summary_table(original, [fix]).splitlines()
    assert "out of memory" in lines[1] and lines[2].rstrip().endswith("0.50")


@pytest.mark.skipif(machine.has_cuda(), reason="the CPU's RAM check")
def test_original_at_real_size_refuses_on_a_cpu_without_the_ram_or_says_why_not_started(monkeypatch):
    real_snapshot = kdevice.snapshot

    def with_free_ram(free_bytes):
        def snapshot(live_tensors=True):
            snap = real_snapshot(live_tensors)
            snap.ram_available_bytes = free_bytes
            return snap
        monkeypatch.setattr(kdevice, "snapshot", snapshot)

    with_free_ram(12 * 2**30)                          # a Colab machine's RAM: the 10 GB head cannot be built
    assert nb.original_at_real_size("smoke").startswith("Refused at real size on this machine. Not run: it needs")
    with_free_ram(2**50)                               # plenty: then only smoke mode keeps it from starting
    assert nb.original_at_real_size("smoke").startswith("Not started at real size in smoke mode")
    assert nb.original_at_real_size("real").startswith("The run above")


def test_breakdown_figure_states_the_t4_verdict_and_is_an_estimate_only():
    pred = s1.predict_original("real")
    fig = nb.breakdown_figure(pred, "colab-t4")
    ax = fig.axes[0]
    words = [t.get_text() for t in ax.texts] \
        + [t.get_text() for t in (ax.get_legend().get_texts() if ax.get_legend() else [])]
    assert any(f"{PRESETS['colab-t4'].gpu_bytes / 2**30:.2f} GiB" in w for w in words)
    assert not any("not run" in w or "measured" in w.lower()
                   for w in words + [t.get_text() for t in ax.get_xticklabels()])


def test_live_fix_catches_an_out_of_memory_error_and_goes_on(monkeypatch):
    def oom(*args, **kwargs):
        raise MemoryError("fake: the device ran out")   # what oom_safe catches on a CPU

    monkeypatch.setattr(s1_runs, "_measured_run", oom)  # run_fix itself is OOM-safe
    record, _ = nb.live_fix("c", "smoke")
    assert record["oom"] and record["measured_peak_bytes"] is None and "fake" in record["error"]
    assert record["estimate_peak_bytes"] == s1.estimate_fix("c", "smoke", as_run=True,
                                                                grad_accum=record["grad_accum"]).peak_bytes
    assert "OUT OF MEMORY, caught" in nb.record_text(record)


def test_the_notebook_prints_the_users_code_and_checks_their_trainer():
    import json
    from pathlib import Path

    path = Path(__file__).parent.parent / "notebooks" / "01_distilgpt2_custom_head.ipynb"
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    shown = next(i for i, c in enumerate(cells)
                 if "inspect.getsource(user_code.Custom_GPT2_Model)" in "".join(c["source"]))
    printed = "".join("".join(o.get("text", "")) for o in cells[shown]["outputs"])
    assert "class Custom_GPT2_Model(nn.Module):" in printed and "def tokenize_func(examples):" in printed
    assert "# ADAPTED: transformers 5 refuses logging_dir" in printed
    assert not any("VocabHeadModel" in c for c in code)            # the kit's class is not shown as the user's
    assert any("kit.check(trainer)" in c for c in code)
    assert any("nb.live_original(SIZE" in c and "trainer=trainer" in c for c in code)


# -- the teacher's review: what the outputs show agrees with the prose -------------------------------------------
def _notebook():
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent.parent / "notebooks" / "01_distilgpt2_custom_head.ipynb").read_text())


def _src(cell):
    return "".join(cell["source"])


def _outputs(cell):
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.get("outputs", []))


def test_the_recaps_claims_match_the_verdicts_the_fixes_cell_prints():
    import re

    cells = _notebook()["cells"]
    recap = next(_src(c) for c in cells if c["cell_type"] == "markdown" and _src(c).startswith("## Recap"))
    said = {w: v == "fits" for w, v in re.findall(r"fix \((\w)\): (fits|DOES NOT FIT)", recap)}
    assert said == nb.fix_verdicts("colab-t4") == {"a": True, "b": True, "c": False}
    table = nb.fixes_at_real_size("colab-t4")
    for which, fits in said.items():
        row = next(line for line in table.splitlines() if line.strip().startswith(f"({which})"))
        assert row.rstrip().endswith("fits" if fits else "DOES NOT FIT")
    assert "each fit" not in recap


def test_fix_c_prose_names_the_dtype_and_optimizer_the_t4_table_prints():
    cells = _notebook()["cells"]
    intro = next(_src(c) for c in cells if _src(c).startswith("## 3 · Fixes that work"))
    row = next(line for line in nb.fixes_at_real_size("colab-t4").splitlines() if line.strip().startswith("(c)"))
    assert "fp16 weights" in row and "AdamW (8-bit refused)" in row
    assert "fp16 on a T4" in intro and "plain AdamW" in intro and "bf16 weights and an 8-bit AdamW" not in intro


def test_the_temporaries_are_explained_from_the_estimates_own_parts():
    pred = s1.predict_original("real")
    parts, ctx = pred.estimate.components(), pred.estimate.context
    text = nb.temporaries_text(pred)
    assert fmt_bytes(parts["temporaries"]) in text and f"{parts['temporaries'] / pred.peak_bytes:.0%}" in text
    assert fmt_bytes(ctx.wtemp["head"]) in text and fmt_bytes(ctx.grads["head"]) in text   # half grad, its fp32 cast
    assert fmt_bytes(parts["autocast weight copies"]) in text
    assert 0 <= parts["temporaries"] - ctx.wtemp["head"] - ctx.grads["head"] < 2**25    # the rest: small tensors
    cells = _notebook()["cells"]
    shown = next(i for i, c in enumerate(cells) if "nb.temporaries_text(pred)" in _src(c))
    assert "nb.breakdown_figure(pred" in _src(cells[shown - 2]) and "temporaries" in _src(cells[shown - 1])


def test_no_output_cites_a_missing_design_file_and_the_cpu_caveat_is_printed_once():
    cells = _notebook()["cells"]
    outputs = "".join(_outputs(c) for c in cells)
    assert "DESIGN" not in outputs and not any("DESIGN" in _src(c) for c in cells)
    assert outputs.count("the CPU's stand-in") <= 1
    assert "the CPU's stand-in" not in nb.record_text({"name": "x", "estimate_peak_bytes": 2**20,
                                                       "measured_peak_bytes": 2**20, "reading": "live_tensor_bytes"})


def test_each_figure_reads_in_the_unit_of_its_own_bars():
    import matplotlib

    matplotlib.use("Agg")
    est = s1.estimate_fix("a", "smoke", as_run=True, grad_accum=2)
    record = {"which": "a", "size": "smoke", "grad_accum": 2, "measured_peak_bytes": est.peak_bytes,
              "name": "(a) drop the head", "reading": "live_tensor_bytes"}
    fig = nb.record_figure(record)
    fig.canvas.draw()
    ax, side = fig.axes
    assert ax.get_ylabel() == "memory (MiB)" and 1 < ax.get_ylim()[1] < 100   # a tiny twin's MiB, not 0.02 GiB
    assert side.get_title() == "" and "Colab T4" in side.get_xlabel()        # no second title beside the first
    assert nb.breakdown_figure(s1.predict_original("real")).axes[0].get_ylabel() == "memory (GiB)"


def test_the_instructor_notes_table_is_the_plan_and_fits_40_minutes():
    import re

    cells = _notebook()["cells"]
    notes = next(_src(c) for c in cells if _src(c).startswith("## Instructor notes"))
    rows = re.findall(r"^\| (.+?) \| (\d+) \| (.*?) ?\|$", notes, re.MULTILINE)
    assert [(n, int(m), s) for n, m, s in rows] == nb.WORKSHOP_SECTIONS
    plan = nb.workshop_plan()
    total = float(next(line for line in plan.splitlines() if line.startswith("all")).split()[-2])
    assert total <= nb.WORKSHOP_MINUTES == 40 and "A PLAN, not a measurement" in plan
    assert "within the 40 minutes" in plan and "OVER" not in plan
    shown = next(c for c in cells if "print(nb.workshop_plan())" in _src(c))
    assert "# NBVAL_CHECK_OUTPUT" in _src(shown) and _src(shown).startswith("# Instructor")
    assert _outputs(shown).rstrip("\n") == plan                 # computed at real size, whatever the run's mode


def test_the_plan_counts_the_loads_and_steps_the_notebook_runs_at_real_size():
    from kit.scenarios import plan

    work = nb.plan_work()
    fixes = dict(work["3 · Fixes, the rank task"])
    a = fixes["fix (a): load 312.47 MiB, 2 step(s)"]
    assert a[0] == ("load", s1.estimate_fix("a", "real").weights_bytes) and a[1][0] == "steps" and a[1][2] == 2
    runs = work["3 · Fixes, the rank task"] + work["4 · The original"]
    oom = [label for label, _ in runs if "out of memory" in label]
    assert len(oom) == 2 and any("fix (c), fp16" in label for label in oom)       # (c) and the original, on a T4
    assert all(plan.compute_minutes(items) > 0 for runs in work.values() for _, items in runs)


def test_the_notebook_reads_torchs_counters_and_frees_what_it_made():
    cells = _notebook()["cells"]
    code = [_src(c) for c in cells if c["cell_type"] == "code"]
    counters = next(s for s in code if "torch.cuda.max_memory_allocated()" in s)
    assert "torch.cuda.memory_allocated()" in counters and "torch.cuda.memory_reserved()" in counters
    assert "torch_tools.counters_beside(" in counters and "torch_tools.cpu_text()" in counters
    history = next(s for s in code if "_record_memory_history(max_entries=100_000)" in s)
    assert "_dump_snapshot(" in history and "_record_memory_history(enabled=None)" in history
    assert "torch_tools.snapshot_text(" in history
    assert all(s.startswith("# NBVAL_IGNORE_OUTPUT") for s in (counters, history))
    assert "print(kit.free(globals()))" in _src(cells[-2]) and cells[-3]["cell_type"] == "markdown"


def test_fix_trainer_builds_the_runs_trainer_with_the_estimate_of_its_run():
    trainer, est = nb.fix_trainer("a", "smoke", steps=1, grad_accum=2)
    try:
        assert trainer.args.max_steps == 1 and trainer.args.gradient_accumulation_steps == 2
        run_est = s1.estimate_fix("a", "smoke", as_run=True, grad_accum=2, seq_len=est.setup["seq_len"])
        assert est.peak_bytes == run_est.first_step_peak_bytes       # one step: the first step's peak
    finally:
        assert nb.release(trainer) is None
