"""The RAM verdict counts the runtime's own RAM (Python, torch, transformers, CUDA's libraries; Colab's VM): a
preset's cited figure, or this session's, measured, where the session runs on the machine judged."""
import gc
import sys

import torch

from kit import presets
from kit.advise.core import limit_for
from kit.measure import device as kdevice
from kit.measure.session import session_preset
from kit.presets import PRESETS, verdict
from kit.scenarios.custom_head import scenario as s1

GiB = 2**30


def test_the_colab_preset_holds_the_runtime_beside_the_model():
    colab = PRESETS["colab-t4"]
    assert colab.runtime_ram_bytes == (presets.COLAB_VM_RAM_BYTES + presets.TORCH_CUDA_RAM_BYTES
                                       + presets.TRANSFORMERS_RAM_BYTES)
    assert colab.ram_for_model_bytes == colab.ram_bytes - colab.runtime_ram_bytes


def test_scenario_1_tells_the_ram_crash_on_a_gpu_runtime():
    pred = s1.predict_original("real")
    v = verdict(pred.estimate, "colab-t4")
    # the build alone (9.71 GiB) fits Colab's 12.70 GiB; with the runtime's own it does not
    assert pred.cpu_build_bytes < PRESETS["colab-t4"].ram_bytes
    assert v.ram_margin_bytes == PRESETS["colab-t4"].ram_for_model_bytes - pred.cpu_build_bytes < 0
    assert not pred.fits_ram
    assert "runtime > 12.70 GiB RAM" in " ".join(v.text.split())
    said = " ".join(pred.text().split())   # (the text wraps at the page's width)
    assert "does NOT fit: the session dies of RAM while the model is built, on a GPU runtime" in said


def test_a_near_miss_in_ram_is_tight_and_said():
    est = s1.predict_original("real").estimate
    colab = PRESETS["colab-t4"]
    roomy = presets.Preset("roomy", "Roomy (RAM)", 200 * GiB, est.cpu_build_bytes + colab.runtime_ram_bytes + GiB // 4,
                           (9, 0), colab.runtime_ram_bytes)
    v = verdict(est, roomy)
    assert v.ram_margin_bytes == GiB // 4 and v.tight and not v.fits
    assert "a near miss (256.00 MiB to spare)" in " ".join(v.text.split())
    assert "RAM" in s1.ram_said(est.cpu_build_bytes, roomy) and "a near miss" in s1.ram_said(est.cpu_build_bytes, roomy)


def test_the_measured_runtime_is_the_process_not_the_model():
    gc.collect()   # (garbage an earlier test left in this worker, freed between the two readings, moves the RSS)
    before = kdevice.runtime_ram_bytes()
    # the measured footprint against the cpu preset's figure (torch and transformers measured on the kit's machine)
    assert 0.5 < before / presets.CPU_RUNTIME_RAM_BYTES < 4
    model = torch.ones(256 * 2**20 // 4)   # 256 MiB of live CPU tensors: the model's, not the runtime's
    gc.collect()
    after = kdevice.runtime_ram_bytes()
    assert abs(after - before) < 32 * 2**20, (before, after)
    del model


def test_a_session_judges_its_own_machine_with_the_runtime_it_measured(monkeypatch):
    assert session_preset("l4") == "l4"                   # another machine: the preset's figure stands
    assert session_preset("colab-t4") == "colab-t4"       # not inside Colab
    here = session_preset("cpu", measured_bytes=3 * GiB)
    assert (here.runtime_ram_bytes, here.runtime_said) == (3 * GiB, "measured in this session")
    assert limit_for(here).ram_for_model_bytes == here.ram_bytes - 3 * GiB
    monkeypatch.setitem(sys.modules, "google.colab", object())
    colab = session_preset("colab-t4", measured_bytes=2 * GiB)
    assert colab.runtime_ram_bytes == 2 * GiB + presets.COLAB_VM_RAM_BYTES
    assert colab.ram_bytes == PRESETS["colab-t4"].ram_bytes


def test_the_advisor_counts_the_runtime_in_ram():
    from kit.advise import advise

    a = advise({"model": "distilgpt2+vocab-head", "batch_size": 1, "seq_len": 128, "precision": "fp16"}, "colab-t4")
    out = a.to_json()
    assert out["runtime_ram_bytes"] == PRESETS["colab-t4"].runtime_ram_bytes and not out["ram_fits"]
    assert "runtime >" in " ".join(a.text().split())
