"""Figures from models no GPU has measured yet say so where the user reads them (issue 35 item 19): a verdict that
only the allocator model's reserved figure turns, and Liger's RMSNorm buffer taken at one device's SM count."""
import pathlib
import re

import pytest

from kit.estimate import estimate
from kit.presets import LAYOUT_GAP_CHECK, LAYOUT_GAP_FILE, verdict

ROOT = pathlib.Path(__file__).resolve().parent.parent
SETUP = dict(batch_size=14, seq_len=512)   # Qwen2.5-0.5B on an A100 40 GB: allocated 36.31 GiB, reserved 41.30


def _gap_rows():
    """(real gap MiB, layout gap MiB) of each column pair of the allocator model's results file."""
    rows = [r.split("|")[1:-1] for r in (ROOT / LAYOUT_GAP_FILE).read_text().splitlines() if r.startswith("| ")]
    num = (lambda x: float(x.replace(",", "")))
    return [(num(r[k]), num(r[k + 1])) for r in rows[1:] for k in (2, 6) if re.match(r"\s*[\d,.]+\s*$", r[k])]


def test_the_quoted_error_is_the_results_files():
    pairs = _gap_rows()
    worst = sorted(pairs, key=lambda p: p[1] / p[0], reverse=True)[:2]
    assert f"up to {worst[0][1] / worst[0][0]:.1f}x" in LAYOUT_GAP_CHECK
    for real, layout in worst:
        assert f"{layout:.0f} vs {real:.0f} MiB" in LAYOUT_GAP_CHECK


def test_a_verdict_only_the_reserved_figure_turns_says_it_rests_on_the_unmeasured_model():
    est = estimate("Qwen/Qwen2.5-0.5B", **SETUP)
    assert est.notes == [n for n in est.notes if getattr(n, "code", "") != "allocator-model"]
    v = verdict(est, "a100-40")
    assert not v.fits and est.peak_bytes <= v.preset.gpu_bytes < est.reserved_bytes
    (note,) = [n for n in est.notes if getattr(n, "code", "") == "allocator-model"]
    assert LAYOUT_GAP_CHECK in note and LAYOUT_GAP_FILE in note and "not measured on a GPU" in note
    verdict(est, "a100-40")
    assert sum(getattr(n, "code", "") == "allocator-model" for n in est.notes) == 1   # once, however often judged
    assert "not measured on a GPU" in estimate("Qwen/Qwen2.5-0.5B", **SETUP).table("a100-40")


@pytest.mark.parametrize("preset", ["colab-t4", "a100-80"])   # the allocated peak fails too / the reserved fits
def test_a_verdict_the_allocated_peak_decides_has_no_such_note(preset):
    est = estimate("Qwen/Qwen2.5-0.5B", **SETUP)
    verdict(est, preset)
    assert not [n for n in est.notes if getattr(n, "code", "") == "allocator-model"]


def test_ligers_sm_count_is_labelled_as_one_devices():
    from kit.estimate.replay.liger import SM_COUNT

    est = estimate("tiny-llama", batch_size=2, seq_len=64, liger_kernel=True)
    (note,) = [n for n in est.notes if getattr(n, "code", "") == "liger-from-source"]
    assert f"sm_count {SM_COUNT}, an H100's, whatever the device" in note
    off = estimate("tiny-llama", batch_size=2, seq_len=64, liger_kernel=True, liger_kernel_config={"rms_norm": False})
    assert "sm_count" not in [n for n in off.notes if getattr(n, "code", "") == "liger-from-source"][0]
