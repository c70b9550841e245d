"""Readings: live-tensor bytes move by exactly what we allocate and free, on the CPU."""
import builtins
import gc

import pytest
import torch

from kit import machine
from kit.measure import controls, device, tensor_peak
from kit.units import MiB, fmt_bytes


def test_live_tensor_bytes_track_allocation_and_free():
    gc.collect()
    before = device.live_tensor_bytes("cpu")
    x = torch.empty(16 * MiB, dtype=torch.uint8)
    y = torch.empty(2 * MiB, dtype=torch.float32)  # 8 MiB
    during = device.live_tensor_bytes("cpu")
    assert during - before == 16 * MiB + 8 * MiB
    del x, y
    gc.collect()
    assert device.live_tensor_bytes("cpu") == before


def test_views_count_once():
    gc.collect()
    before = device.live_tensor_bytes("cpu")
    x = torch.empty(4 * MiB, dtype=torch.uint8)
    views = [x[:100], x.view(2, -1), x[1::2]]
    assert device.live_tensor_bytes("cpu") - before == 4 * MiB
    del x, views


def test_meta_tensors_hold_nothing():
    before = device.live_tensor_bytes()
    m = torch.empty(10**9, device="meta")
    assert device.live_tensor_bytes() == before
    assert "meta" not in device.live_tensor_bytes()
    del m


def test_snapshot_fields_and_text_on_cpu():
    x = torch.ones(1 * MiB, dtype=torch.uint8)
    snap = device.snapshot()
    assert snap.rss_bytes > 0 and snap.ram_available_bytes > 0
    assert snap.live("cpu") >= MiB
    if not torch.cuda.is_available():
        assert snap.cuda_allocated_bytes is None and snap.nvml_used_bytes is None
        assert snap.best_bytes == snap.live("cpu")
        assert device.best_reading() == "live_tensor_bytes"
    text = snap.text()
    assert "RSS" in text and "live tensors" in text and fmt_bytes(snap.rss_bytes) in text
    assert device.Snapshot.from_dict(snap.to_dict()) == snap
    del x


def test_peak_rss_reset_and_rise():
    device.reset_peak()
    low = device.snapshot(live_tensors=False).rss_peak_bytes
    assert low is not None
    x = torch.ones(256 * MiB, dtype=torch.uint8)  # touched pages: RSS really grows
    high = device.snapshot(live_tensors=False).rss_peak_bytes
    assert high - low >= 200 * MiB
    del x


def test_reset_peak_is_safe_without_cuda():
    device.reset_peak()  # torch.cuda.reset_peak_memory_stats raises on a CPU build; we must not
    device.empty_cache()
    if not torch.cuda.is_available():
        assert device.peak_allocated_bytes() is None


@pytest.mark.parametrize(
    "exc, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_is_oom(exc, expected):
    assert device.is_oom(exc) is expected


def test_hardware_has_ram():
    hw = machine.hardware()
    assert hw["ram_total_bytes"] >= hw["ram_available_bytes"] > 0


@pytest.mark.gpu
def test_cuda_readings_move_with_allocation():
    torch.cuda.synchronize()
    device.reset_peak()
    before = device.snapshot()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    after = device.snapshot()
    assert after.cuda_allocated_bytes - before.cuda_allocated_bytes == 256 * MiB
    assert after.cuda_reserved_bytes >= after.cuda_allocated_bytes
    assert after.cuda_peak_allocated_bytes >= after.cuda_allocated_bytes
    assert after.live("cuda:0") - before.live("cuda:0") == 256 * MiB
    assert after.nvml_used_bytes is None or after.nvml_used_bytes >= after.cuda_reserved_bytes
    print(after.text())
    del x
    device.empty_cache()
    assert device.snapshot().cuda_allocated_bytes == before.cuda_allocated_bytes


def test_explain_reads_every_number():
    x = torch.ones(3 * MiB, dtype=torch.uint8)
    snap = device.snapshot()
    text = device.explain(snap)
    assert fmt_bytes(snap.rss_bytes) in text
    assert fmt_bytes(snap.ram_available_bytes) in text
    assert fmt_bytes(snap.live("cpu")) in text
    assert len(text.splitlines()) >= 3
    del x


def test_tensor_peak_sees_what_a_gc_walk_cannot():
    """A training step's activations live in autograd's graph: only the dispatch-mode peak sees them."""
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(512, 256)
    with tensor_peak.TensorPeak() as p:
        h = lin(x).relu()          # 512 KiB activations, saved for backward
        h2 = (h * h).sum()
        walk_during = device.live_tensor_bytes("cpu")
        h2.backward()
    assert p.start_bytes <= walk_during
    # the peak is at least the input, weights, two 512 KiB activations and the grads
    assert p.peak_bytes - p.start_bytes >= 2 * 512 * 256 * 4
    del h, h2


def test_tensor_peak_counts_frees():
    with tensor_peak.TensorPeak() as p:
        for _ in range(5):
            y = torch.ones(MiB, dtype=torch.uint8)
            del y
    assert p.peak_bytes - p.start_bytes == MiB   # never more than one alive at a time
    assert p.current_bytes == p.start_bytes


def test_tensor_peak_counts_a_storage_that_grows_in_place():
    c = torch.empty(0)
    with tensor_peak.TensorPeak() as p:
        torch.ones(1000, out=c)               # the empty storage grows to 4000 bytes in place
    assert p.peak_bytes - p.start_bytes == 4000
    del c


def test_tensor_peak_agrees_with_the_gc_walk_when_nothing_hides_in_a_graph():
    keep = [torch.ones(MiB, dtype=torch.uint8)]
    with tensor_peak.TensorPeak() as p:
        keep.append(torch.zeros(3 * MiB, dtype=torch.uint8))
        keep.append(keep[0][: MiB // 2])       # a view: its storage counts once
        gc.collect()
        walk = device.live_tensor_bytes("cpu")
    assert p.current_bytes == walk
    del keep


def test_reset_peak_says_whether_the_rss_reset_took(monkeypatch):
    assert device.reset_peak()["rss"] is True               # Linux: /proc/self/clear_refs is writable here

    def no_write(path, *a, **k):    # /proc/self/clear_refs unwritable (a sandbox); reads still work
        if str(path).endswith("clear_refs"):
            raise PermissionError(13, "Permission denied", path)
        return builtins.open(path, *a, **k)

    monkeypatch.setattr(device, "open", no_write, raising=False)
    assert device.reset_peak()["rss"] is False


def test_cuda_memory_history_records_nothing_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "has_cuda", lambda: False)
    with controls.cuda_memory_history(tmp_path / "h.pickle") as path:
        x = torch.ones(1000)
    assert path is None and not (tmp_path / "h.pickle").exists()
    del x


@pytest.mark.gpu
def test_cuda_memory_history_saves_a_snapshot_even_after_an_error(tmp_path):
    import pickle

    with pytest.raises(RuntimeError, match="boom"):
        with controls.cuda_memory_history(tmp_path / "h.pickle"):
            x = torch.ones(1024, 1024, device="cuda")
            raise RuntimeError("boom")
    snap = pickle.loads((tmp_path / "h.pickle").read_bytes())
    sizes = [e.get("size") for seg in snap["device_traces"] for e in seg if e.get("action") == "alloc"]
    assert 1024 * 1024 * 4 in sizes      # the tensor above, recorded
    del x


# ---- CUDA faked where the arithmetic is the kit's own (issue 26) ---------------------------------------------

def _fake_gpus(monkeypatch, allocated: dict, total=80 * 10**9, free=70 * 10**9, fraction=1.0, current=0):
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(allocated))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: allocated[current if d is None else d])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 2 * allocated[current if d is None else d])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 3 * allocated[current if d is None else d])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (free, total))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: type("P", (), {"total_memory": total}))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d=None: fraction)
    monkeypatch.setattr(device, "_nvml_used_bytes", lambda d=None: None)


def test_item8_the_nvml_index_follows_cuda_visible_devices():
    assert device.nvml_index(1, "2,3") == 3 and device.nvml_index(0, "2,3") == 2
    assert device.nvml_index(1, "") == 1
    with pytest.raises(ValueError, match="not among CUDA_VISIBLE_DEVICES"):
        device.nvml_index(2, "2,3")


def test_item8_each_gpu_gets_its_own_nvml_handle(monkeypatch):
    import sys
    import types

    got = []
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: got.append(i) or i,
                                 nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=1000 + h))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    monkeypatch.setattr(device, "_nvml_handles", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert device._nvml_used_bytes() == 1003                # torch's 1 is NVML's 3
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert device._nvml_used_bytes() == 1002                # not the handle cached for the first device
    assert got == [3, 2]


def test_item9_this_gpu_is_what_the_memory_fraction_lets_torch_have(monkeypatch):
    from kit.presets import resolve_device

    _fake_gpus(monkeypatch, {0: 0}, total=80 * 10**9, free=70 * 10**9, fraction=0.2)
    monkeypatch.setattr(machine, "hardware", lambda: {"gpu_name": "Fake", "gpu_total_bytes": 80 * 10**9,
                                                      "ram_total_bytes": 10**11})
    monkeypatch.setattr(machine, "compute_capability", lambda: (9, 0))
    assert machine.gpu_bytes_for_torch() == 16 * 10**9      # 0.2 x 80 GB, not the 70 GB free
    assert resolve_device("this")[0].gpu_bytes == 16 * 10**9
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d=None: 1.0)
    assert machine.gpu_bytes_for_torch() == 70 * 10**9      # uncapped: free + reserved (0)


def test_item10_readings_sum_every_visible_gpu(monkeypatch):
    _fake_gpus(monkeypatch, {0: 5 * MiB, 1: 7 * MiB})
    snap = device.snapshot(live_tensors=False)
    assert snap.cuda_allocated_bytes == 12 * MiB and snap.cuda_reserved_bytes == 24 * MiB
    assert snap.cuda_peak_allocated_bytes == 36 * MiB and snap.cuda_per_device == {0: 5 * MiB, 1: 7 * MiB}
    assert device.peak_allocated_bytes() == 36 * MiB


def test_item10_a_models_devices_come_from_its_device_map():
    m = torch.nn.Linear(2, 2)
    m.hf_device_map = {"model.layers.0": 0, "model.layers.1": 1, "lm_head": "cuda:1", "model.norm": "cpu"}
    assert device.model_devices(m) == [0, 1]
