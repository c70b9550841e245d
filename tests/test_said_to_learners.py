"""Issue 49's smaller items a learner meets: each text says what the kit computed, in the learner's words."""
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kit.advise.said import largest_said
from kit.measure.tensor_peak import TensorPeak, op_said
from kit.presets import PRESETS
from kit.watching.report import TrainReport

ROOT = Path(__file__).resolve().parents[1]


def test_where_nothing_fits_it_says_no_batch_fits_never_a_zero():
    for batch, seq in ((0, 0), (0, 512), (4, 0)):
        said = largest_said(SimpleNamespace(max_batch_size=batch, max_seq_len=seq))
        assert not re.search(r"\b0\b", said), said
    assert largest_said(SimpleNamespace(max_batch_size=0, max_seq_len=0)).startswith("no batch fits")


def test_the_teachers_guide_gives_the_whole_crash_setting_the_notebook_prints():
    from kit.scenarios.cross_validation.predict import crash_setting

    found = crash_setting("Qwen/Qwen3-8B", "colab-t4", batch_size=4, seq_len=30, lora_r=8,
                          lora_targets=["q_proj", "v_proj"])   # notebook 02's PREDICT at its defaults
    guide = " ".join((ROOT / "docs" / "teachers-guide.md").read_text().split())
    assert f"`LORA_R = {found['lora_r']}`" in guide
    assert f"`LORA_TARGETS = {found['lora_targets']!r}`" in guide


def test_readme_promises_fold_2s_crash_only_where_the_default_shows_it():
    from kit.scenarios.cross_validation.predict import fold2_prediction, user_estimate
    from kit.scenarios.cross_validation.workshop import DEFAULT_MODEL

    load = fold2_prediction(user_estimate(DEFAULT_MODEL, batch_size=4, seq_len=30))["load_peak_bytes"]
    assert load < PRESETS["colab-t4"].gpu_bytes   # the default model's fold 2 fits a T4: its crash needs a cap
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if "02 · " in line)
    assert "run out of GPU memory" not in row and "under a cap" in row


def test_the_users_cleanup_helper_reads_as_the_user_wrote_it():
    from kit.scenarios.cross_validation.user_loop import free_gpu_cache

    shown = inspect.getsource(free_gpu_cache)
    assert "noqa" not in shown and "kdevice" not in shown
    assert "torch.cuda.empty_cache()" in shown
    free_gpu_cache()   # still a no-op that raises nothing, on a CPU too


def test_a_capped_runs_error_names_what_the_code_did_not_an_aten_op():
    x = torch.ones(1024)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with TensorPeak(limit_bytes=x.nbytes + 1024):
            x.to(torch.float64)
    said = str(caught.value)
    assert "a copy to another dtype or device (.to()" in said and "aten" not in said
    assert op_said(torch.ops.aten.addmm.default) == "a matrix multiply (a Linear layer)"


def test_what_learners_read_of_the_cpu_meter_names_no_class():
    from kit.measure.controls import memory_cap
    from kit.scenarios.custom_head.notebook import reading_text

    assert "TensorPeak" not in reading_text("live_tensor_bytes")
    with memory_cap(2**40) as cap:
        assert "TensorPeak" not in cap.how


def test_an_out_of_memory_answer_gives_one_estimated_figure_named():
    report = TrainReport(oom=True, error="OutOfMemoryError: kit memory cap", step=1, phase="first_forward_backward",
                         reading="live_tensor_bytes", measured={"weights": 3 * 2**20, "the rest": 210 * 2**20,
                                                                "total": 216 * 2**20},
                         estimated={"weights": 3 * 2**20, "gradients": 0, "the rest": 593 * 2**20,
                                    "total": 600 * 2**20}, estimate_field="first_step_peak_bytes")
    answer = " ".join(report.text().split())
    assert "this phase's estimated peak: 600.00 MiB (its step 1)" in answer
    assert "593" not in answer
