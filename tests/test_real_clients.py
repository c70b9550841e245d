"""benchmarks/real_clients.py's meter (PyTorch profiler memory events), checked on a case whose peak is known to the
byte, and two of its cheapest clients (TRL's SFTTrainer with packing at vocab 4096, a plain PyTorch loop), whose
estimate must stay within 2% of that meter at step 1 and at the steady step."""
import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import real_clients as rc

warnings.filterwarnings("ignore")
N = 256
A = N * N * 4  # bytes of one N x N fp32 matrix


def test_meter_counts_a_matmul_chain_to_the_byte():
    """held x, w, old (3A). Step 1: y = x@w (+A), del old (-A: allocated inside the profile, before the step), z = y@w
    (+A), del y, del z: the peak is 3A + A. Step 2 (held x, w): y = x@w, z = y@w (2A alive at once), del y, u = z@w,
    del z, u: 2A + 2A.
    A profile opened only at the step would miss old's free and read 5A for step 1."""
    x, w = torch.randn(N, N), torch.randn(N, N)
    m = rc.ProfilerMeter()
    m.start()
    old = torch.empty(N, N)
    m.begin(rc.storage_bytes([x, w, old]))
    y = x @ w
    del old
    z = y @ w
    del y, z
    m.end()
    m.begin(rc.storage_bytes([x, w]))
    y = x @ w
    z = y @ w
    del y
    u = z @ w
    del z, u
    m.end()
    assert m.stop() == [4 * A, 4 * A]


def test_storage_bytes_counts_a_storage_once():
    t = torch.zeros(100)
    assert rc.storage_bytes([t, t[10:], t.view(10, 10)]) == 400


def _check(est, peaks, what):
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{what}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert 0.98 <= first <= 1.02, (what, est.first_step_peak_bytes, peaks)
    assert 0.98 <= steady <= 1.02, (what, est.peak_bytes, peaks)


def test_sft_trainer_packing_vocab_4k(tmp_path):
    pytest.importorskip("trl")
    _, setup, est, peaks = rc.run_trainer_client(rc.client_s2(str(tmp_path), 4096, True, False), rc.ProfilerMeter)
    assert len(peaks) == 3
    _check(est, peaks, setup)


def test_plain_loop(tmp_path):
    """The loop keeps ``outputs`` through backward (and into the next forward): the estimate's ``outputs_kept``,
    where kit/training_setup.py declares it. Until the estimate models it (the option changes nothing), an
    estimate outside 2% is an expected failure that says its ratios."""
    opt = rc.loop_option()
    _, setup, est, peaks = rc.client_loop(str(tmp_path), rc.ProfilerMeter, use_cache=False, with_option=True)
    ratios = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    if not all(0.98 <= r <= 1.02 for r in ratios):
        plain = rc.client_loop(str(tmp_path), rc.ProfilerMeter, use_cache=False)[2]
        same = (plain.peak_bytes, plain.first_step_peak_bytes) == (est.peak_bytes, est.first_step_peak_bytes)
        if opt is None or same:
            pytest.xfail(f"the estimate does not model the loop's kept outputs yet (option {opt!r}): "
                         f"step 1 {ratios[0]:.4f}, steady {ratios[1]:.4f}")
    _check(est, peaks, setup)


def test_i47_3_the_amp_recipe_watched_with_no_option_given(tmp_path):
    """PyTorch's AMP recipe (bf16 autocast, GradScaler, 4 micro-batches per optimizer step) under kit.watch_loop with
    no option: the watch reads the autocast dtype and counts the micro-batches, and its own estimate is within 2% of
    the profiler's meter at step 1 and the steady step (judged as fp32 with one micro-batch: 1.13-1.15x)."""
    box = []
    _, setup, est, peaks = rc.client_loop_watched(str(tmp_path), rc.ProfilerMeter, autocast=torch.bfloat16, accum=4,
                                                  watch_box=box)
    assert (est.setup["precision"], est.setup["grad_accum"]) == ("bf16", 4)
    assert [(s.step, s.first) for s in box[0].steps] == [(1, True), (2, False), (3, False)]
    _check(est, peaks, setup)


def test_i47_3_plain_sgd_watched(tmp_path):
    """torch.optim.SGD without momentum (no optimizer state at all): modelled, within 2% of the meter."""
    _, setup, est, peaks = rc.client_loop_watched(str(tmp_path), rc.ProfilerMeter, optimizer="sgd")
    assert est.setup["optimizer"] == "sgd-plain"
    _check(est, peaks, setup)
