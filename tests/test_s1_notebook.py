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
    words = [t.get_text() for t in ax.texts] + [t.get_text() for t in (ax.get_legend().get_texts() if ax.get_legend() else [])]
    assert any(f"{PRESETS['colab-t4'].gpu_bytes / 2**30:.2f} GiB" in w for w in words)
    assert not any("not run" in w or "measured" in w.lower() for w in words + [t.get_text() for t in ax.get_xticklabels()])


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
    shown = next(i for i, c in enumerate(cells) if "inspect.getsource(user_code.Custom_GPT2_Model)" in "".join(c["source"]))
    printed = "".join("".join(o.get("text", "")) for o in cells[shown]["outputs"])
    assert "class Custom_GPT2_Model(nn.Module):" in printed and "def tokenize_func(examples):" in printed
    assert "# ADAPTED: transformers 5 refuses logging_dir" in printed
    assert not any("VocabHeadModel" in c for c in code)            # the kit's class is not shown as the user's
    assert any("kit.check(trainer)" in c for c in code)
    assert any("nb.live_original(SIZE" in c and "trainer=trainer" in c for c in code)
