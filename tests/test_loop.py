"""kit.watch_loop / kit.step on real plain PyTorch loops of a tiny CPU twin: each step's exact peak (TensorPeak), step 1
apart from the later ones, beside the estimate of what the loop holds (its outputs kept through backward, its
gradients kept by zero_grad(set_to_none=False)); an out-of-memory error inside a step gives kit.train's report,
not an exception, and the model and optimizer train on."""
import re
import warnings

import pytest
import torch

import kit
from kit import machine, models
from kit.estimate import estimate
from kit.inputs import InputError
from kit.watching import loop
from kit.watching.report import PHASES

warnings.filterwarnings("ignore", category=FutureWarning)
pytestmark = pytest.mark.skipif(machine.has_cuda(), reason="CPU readings (TensorPeak); the GPU path is in gpu-check")
B, S = 4, 40


def _batches(n=3):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 4000, (B, S), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def _setup():
    torch.manual_seed(0)
    model = models.build_model("tiny-llama")
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _ratios(w):
    est = w.estimate
    first = w.steps[0].peak_bytes / est.first_step_peak_bytes
    later = max(s.peak_bytes for s in w.steps[1:]) / est.peak_bytes
    print(f"step 1 {first:.4f}, later steps {later:.4f}")
    return first, later


def test_a_loop_that_keeps_its_outputs_through_backward(tmp_path):
    model, opt = _setup()
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    for batch in w.batches(_batches()):
        with w.step(batch):
            outputs = model(**batch)         # held through backward, and into the next step's forward
            loss = outputs.loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert [s.first for s in w.steps] == [True, False, False]
    assert w.assumed["outputs_kept"][0] is True and w.assumed["grads_kept"][0] is False
    first, later = _ratios(w)
    assert 0.98 <= first <= 1.02 and 0.98 <= later <= 1.02     # measured 0.993, 0.995
    # without the option the estimate misses the kept logits (and KV cache): more than 2% under
    plain = estimate("tiny-llama", batch_size=B, seq_len=S, optimizer="adamw", device="cpu", padded=False)
    assert w.steps[1].peak_bytes / plain.peak_bytes > 1.05
    r = w.report
    flat = " ".join(str(r).split())
    assert flat.startswith("Watched 3 steps of your loop, no out-of-memory error")
    assert f"ratio {r.first_step_ratio:.3f}" in flat and f"ratio {r.later_steps_ratio:.3f}" in flat
    assert "the estimate took outputs_kept=True: detected" not in flat and "details: report.text(details=True)" in flat
    flat = " ".join(r.text(details=True).split())      # the notes: in the details
    assert "the estimate took outputs_kept=True: detected" in flat and "Evaluation" not in flat
    w.close()


def test_a_loop_with_zero_grad_set_to_none_false(tmp_path):
    model, opt = _setup()
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    for batch in _batches():
        with kit.step(model, opt, batch):    # the same watch, found by the model and optimizer
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # the gradients stay allocated (zeros) into the next step
    assert kit.watch_loop(model, opt) is w and len(w.steps) == 3
    assert w.assumed["grads_kept"][0] is True and w.assumed["outputs_kept"][0] is False
    first, later = _ratios(w)
    assert 0.98 <= first <= 1.02 and 0.98 <= later <= 1.02     # measured 0.992, 1.000
    w.close()


def test_an_oom_at_step_2_gives_the_report_and_the_model_trains_on(tmp_path):
    model, opt = _setup()
    armed = {"on": False}

    def hook(mod, inp, out):                 # where a real OOM happens: in the forward
        if armed["on"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. (injected)")

    h = model.lm_head.register_forward_hook(hook)
    w = kit.watch_loop(model, opt, plot=tmp_path / "frames")
    ran = []
    for i, batch in enumerate(w.batches(_batches(4)), 1):
        armed["on"] = i == 2
        with w.step(batch):                  # the OOM does not leave the with block
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        ran.append(i)
    h.remove()
    assert ran == [1, 2]                     # the loop ended after the failed step
    r = w.report
    assert r.oom and (r.step, r.phase) == (2, "forward_backward")
    assert str(r).startswith(f"OUT OF MEMORY at step 2, during {PHASES['forward_backward']}.")
    assert "kit.watch_loop stopped the loop and did not raise" in str(r)
    est = w.estimate
    assert r.measured["weights"] / est.weights_bytes == 1.0
    assert 1.0 <= r.measured["optimizer state"] / est.optimizer_bytes <= 1.0001   # (+ AdamW's step counters)
    assert r.estimate_field == "peak_bytes" and r.estimated["total"] == est.peak_bytes
    # released: the gradients and the optimizer state; the model and the optimizer still train
    assert all(p.grad is None for p in model.parameters()) and len(opt.state) == 0
    batch = _batches(1)[0]
    model(**batch).loss.backward()
    opt.step()
    assert len(opt.state) > 0
    with pytest.raises(RuntimeError, match="stopped at step 2 with an out-of-memory error"):
        with w.step(batch):
            pass
    assert w.live.paths and w.live.paths[-1].read_bytes()[:4] == b"\x89PNG"   # drawn to the folder
    assert kit.watch_loop(model, opt) is not w                              # a stopped watch is not reused


def test_other_errors_propagate():
    model, opt = _setup()
    w = kit.watch_loop(model, opt, plot=False)
    with pytest.raises(ValueError, match="not about memory"):
        with w.step():
            raise ValueError("not about memory")
    assert not w.stopped
    w.close()


def test_the_plot_draws_each_steps_peak_to_a_folder(tmp_path):
    model, opt = _setup()
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=tmp_path / "frames")
    for batch in _batches(2):
        with w.step(batch):
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
    assert len(w.live.paths) == 2 and w.live.paths[-1].read_bytes()[:4] == b"\x89PNG"
    labels = [t.get_text() for t in w.draw().axes[0].get_legend().get_texts()]
    assert "step 1 peak (measured)" in labels and "later steps' peak (measured)" in labels
    w.close()


def test_bad_input_is_one_clear_line():
    model, opt = _setup()
    with pytest.raises(InputError, match="takes the torch.nn.Module you train, not a str"):
        kit.watch_loop("model", opt)
    with pytest.raises(InputError, match="takes the torch.optim.Optimizer"):
        kit.watch_loop(model, None)
    with pytest.raises(InputError, match="does not know batch"):
        kit.watch_loop(model, opt, batch=4)


def test_an_optimizer_built_before_the_move_changes_nothing():
    kw = dict(batch_size=2, seq_len=32, device="cpu")
    a, b = estimate("tiny-llama", **kw), estimate("tiny-llama", optimizer_before_move=True, **kw)
    assert (a.peak_bytes, a.first_step_peak_bytes, a.eval_peak_bytes) == \
        (b.peak_bytes, b.first_step_peak_bytes, b.eval_peak_bytes)
    # why: .to() moves each Parameter in place, so an optimizer built before holds the moved ones
    model, opt = _setup()
    model.to(torch.bfloat16)
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]


# -- issue 35 --------------------------------------------------------------------------------------------------------
def _full_step(w, model, opt, batch):
    with w.step(batch):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()


def test_i35_4_accelerates_optimizer_is_watched_through_the_one_it_wraps():
    """accelerate's AcceleratedOptimizer passes isinstance(torch.optim.Optimizer) but never ran Optimizer.__init__:
    its step hooks are the wrapped optimizer's."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    model, opt = _setup()
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, opt)
    assert isinstance(opt, AcceleratedOptimizer)
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    for batch in _batches(3):
        with w.step(batch):
            acc.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
    assert [s.first for s in w.steps] == [True, False, False] and w.estimate is not None
    assert w.estimate.setup["optimizer"] == "adamw"
    first, later = _ratios(w)
    assert 0.98 <= first <= 1.02 and 0.98 <= later <= 1.02
    assert kit.watch_loop(model, opt) is w                   # found again by the optimizer the loop holds
    w.close()


def test_i35_12_an_oom_on_a_cpu_names_no_caching_allocator_and_no_fits_verdict():
    model, opt = _setup()
    armed = {"on": False}

    def hook(mod, inp, out):
        if armed["on"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. (injected)")

    h = model.lm_head.register_forward_hook(hook)
    w = kit.watch_loop(model, opt, plot=False)
    for i, batch in enumerate(w.batches(_batches(3)), 1):
        armed["on"] = i == 2
        _full_step(w, model, opt, batch)
    h.remove()
    text = " ".join(w.report.text(details=True).split())   # the answer and the details
    assert w.report.oom and "caching allocator" not in text and "reserved" not in text, text
    assert "largest batch that fits" not in text and "fits this machine's CPU and RAM:" not in text, text
    assert ("The fit advisor: the estimate fits this machine's RAM, yet this step ran out of memory, so the "
            "advisor's changes are not the fix:") in text, text


def test_i35_a_watch_never_keeps_the_model_alive():
    """The watch is _WATCHES' value for the model, its key: it must hold the model weakly (the estimate's options held
    it, so no watched model was ever freed)."""
    import gc

    from kit.measure import leaks

    base = leaks.take_baseline()
    model, opt = _setup()
    w = kit.watch_loop(model, opt, plot=False)
    for batch in _batches(2):
        _full_step(w, model, opt, batch)
    assert w.report.estimate_peak_bytes
    del model, opt, w
    gc.collect()
    assert leaks.check_returned(base).ok


def test_i35_13_gradient_accumulation_in_a_plain_loop_is_counted_and_estimated():
    """Four micro-batches per optimizer step: micro-batches 2-4 hold accumulated gradients before any optimizer
    state exists. watch_loop counts the forwards between optimizer steps and estimates with grad_accum=4. At 8 x 128
    the activations outweigh the first optimizer step, so step 1's peak is micro-batch 2's backward."""
    model, opt = _setup()
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(5, 4000, (8, 128), generator=g) for _ in range(8)]
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    for i, x in enumerate(ids, 1):
        batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x.clone()}
        with w.step(batch):
            (model(**batch).loss / 4).backward()
            if i % 4 == 0:
                opt.step()
                opt.zero_grad()
    assert w.assumed["grad_accum"][0] == 4 and w.estimate.setup["grad_accum"] == 4
    assert w.assumed["grads_kept"][0] is False, w.assumed      # accumulating is not zero_grad(set_to_none=False)
    r = w.report                           # step 1 is micro-batches 1-4: no optimizer state until the 4th's step
    print([(s.step, s.first, s.peak_bytes, s.estimate_bytes) for s in w.steps], r.first_step_ratio,
          r.later_steps_ratio)
    assert [(s.step, s.first) for s in w.steps] == [(1, True), (2, False)]    # one judgement per optimizer step
    assert 0.98 <= r.first_step_ratio <= 1.02 and 0.98 <= r.later_steps_ratio <= 1.02    # measured 1.0005, 1.0004
    # each step judged with its micro-batches counted: the figure it was set beside is the grad_accum=4 estimate's
    assert [s.estimate_bytes for s in w.steps] == [w.estimate.first_step_peak_bytes, w.estimate.peak_bytes]
    plain = estimate("tiny-llama", batch_size=8, seq_len=128, optimizer="adamw", device="cpu", padded=False)
    assert w.steps[0].peak_bytes / plain.first_step_peak_bytes > 1.05      # without it, step 1 is under
    assert "the estimate took grad_accum=4: detected: 4 forward passes per optimizer step" in " ".join(
        w.report.text(details=True).split())
    w.close()


def test_i35_16_plots_never_overwrite_files_in_the_folder(tmp_path):
    mine = tmp_path / "loop-0001.png"
    mine.write_bytes(b"the user's own plot")
    runs = []
    for _ in range(2):
        model, opt = _setup()
        w = kit.watch_loop(model, opt, plot=tmp_path)
        for batch in _batches(2):
            _full_step(w, model, opt, batch)
        runs.append([p.name for p in w.live.paths])
        w.close()
    assert mine.read_bytes() == b"the user's own plot"
    assert runs[0][:2] == ["loop-0002.png", "loop-0003.png"] and runs[1][0] > runs[0][-1], runs
    assert len({n for r in runs for n in r}) == sum(len(r) for r in runs)      # no name written twice
    with pytest.raises(InputError, match="plot must be a folder"):
        kit.watch_loop(*_setup(), plot=mine)


def test_i35_17_ctrl_c_after_backward_frees_the_gradients_and_says_so(capsys):
    from kit.measure import leaks

    model, opt = _setup()
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    first, second = _batches(2)
    _full_step(w, model, opt, first)
    base = leaks.take_baseline()                               # the weights and AdamW's state
    with pytest.raises(KeyboardInterrupt):
        with w.step(second):
            model(**second).loss.backward()
            raise KeyboardInterrupt
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kit.watch_loop: interrupted")]
    assert len(said) == 1 and said[0].startswith("kit.watch_loop: interrupted at step 2 (forward_backward). "
                                                 "Released the interrupted step's frames and the gradients"), said
    assert "the optimizer's state is kept" in said[0]
    assert all(p.grad is None for p in model.parameters()) and len(opt.state) > 0
    assert leaks.check_returned(base).ok
    _full_step(w, model, opt, second)                          # the watch goes on
    assert len(w.steps) == 2
    w.close()


def test_i50_11_a_second_watch_with_new_options_replaces_the_first(capsys):
    model, opt = _setup()
    first = kit.watch_loop(model, opt, plot=False)
    assert kit.watch_loop(model, opt) is first and kit.watch_loop(model, opt, plot=False) is first   # nothing new
    second = kit.watch_loop(model, opt, precision="bf16", grad_accum=4)
    said = capsys.readouterr().out
    assert second is not first and second.given == {"precision": "bf16", "grad_accum": 4}
    assert "kit.watch_loop: a new watch of this model replaces the one made before, for precision='bf16', " \
           "grad_accum=4 (the old watch's 0 steps stay in its own report)." in said
    assert first._hooks == [] and second._hooks      # the first's hooks came off: one watch counts the forwards
    assert kit.watch_loop(model, opt) is second      # kit.step's call, with no option, finds the new one
    with kit.step(model, opt, _batches(1)[0]):
        model(**_batches(1)[0]).loss.backward()
    assert second._forwards == 1 and first._forwards == 0
    second.close()


@pytest.mark.parametrize("option,value,says", [
    ("advise_device", "t4", "advise_device: device must be a preset"),
    ("limit_bytes", "16GiB", "limit_bytes must be a positive whole number of bytes"),
    ("top", 0, "top must be a whole number >= 1, not 0"),
    ("tensor_peak", "sometimes", "tensor_peak must be True or False"),
    ("grad_accum", 0, "grad_accum must be a whole number >= 1, not 0"),
    ("precision", "bf17", "precision"),
])
def test_i50_11_every_option_is_checked_before_the_loop_runs(option, value, says):
    model, opt = _setup()
    with pytest.raises(InputError, match=re.escape(says)) as e:
        kit.watch_loop(model, opt, plot=False, **{option: value})
    assert e.value.name == option
    assert loop._WATCHES.get(model) is None      # nothing attached


def test_i50_5_a_loop_plot_that_cannot_be_saved_is_a_note_not_an_error(tmp_path):
    folder = tmp_path / "plots"
    model, opt = _setup()
    w = kit.watch_loop(model, opt, plot=folder)
    first, second = _batches(2)
    _full_step(w, model, opt, first)
    for png in folder.glob("*"):
        png.unlink()
    folder.rmdir()
    folder.write_text("a file now")
    _full_step(w, model, opt, second)        # step 2 is always drawn: it cannot be saved, and the loop goes on
    assert len(w.steps) == 2
    assert any(n.startswith("the live plot could not be saved") for n in w.report.notes), w.report.notes
    w.close()


def test_i47_3_an_autocast_loop_is_judged_at_the_dtype_its_forward_ran_in():
    """No precision given: the watch reads torch.autocast around the model's forward and estimates at bf16, and its
    report's answer says so."""
    model, opt = _setup()
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    for batch in _batches(3):
        with w.step(batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert w.assumed["precision"] == ("bf16", "detected: the model's forward ran under torch.autocast "
                                              "(torch.bfloat16)")
    assert w.estimate.setup["precision"] == "bf16"
    first, later = _ratios(w)
    assert 0.98 <= first <= 1.02 and 0.98 <= later <= 1.02
    fp32 = estimate("tiny-llama", batch_size=B, seq_len=S, optimizer="adamw", device="cpu", padded=False)
    assert abs(later - 1) < abs(max(s.peak_bytes for s in w.steps[1:]) / fp32.peak_bytes - 1)   # fp32: 1.020
    assert "judged at bf16 autocast (detected)" in " ".join(str(w.report).split()).split("\n")[0]
    w.close()


def test_i47_3_plain_sgd_is_modelled_and_each_step_after_the_first_is_a_later_one():
    model, _ = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = kit.watch_loop(model, opt, tensor_peak=True, plot=False)
    for batch in _batches(3):
        _full_step(w, model, opt, batch)
    assert len(opt.state) == 0 and w.estimate.setup["optimizer"] == "sgd-plain"
    assert [s.first for s in w.steps] == [True, False, False]       # was: every step "first" (no state ever)
    assert w.estimate.optimizer_bytes == 0
    first, later = _ratios(w)
    assert 0.98 <= first <= 1.02 and 0.98 <= later <= 1.02
    w.close()
