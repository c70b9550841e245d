"""Release, the leak check and OOM-safe runs, on real tiny Trainer runs (CPU) and on CUDA when present."""
import functools
import sys

import pytest
import torch

from kit import machine, plot
from kit.measure import cleanup, leaks, oom
from kit.measure.track import Tracker
from kit.units import MiB

KEEP = {}   # a module global a leak can hide in


@functools.lru_cache(maxsize=None)
def _data():
    from kit import data

    tok = data.load_tokenizer("tiny-gpt2")
    return tok, data.tokenize(data.load_text_dataset()["train"].select(range(200)), tok, max_length=32)


def _trainer(model, out_dir, steps=3, callbacks=()):
    from transformers import Trainer, TrainingArguments

    from kit import data

    tok, ds = _data()
    args = TrainingArguments(output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=4,
                             use_cpu=not machine.has_cuda(), report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=ds, data_collator=data.collator(tok),
                   callbacks=list(callbacks))


def _model():
    from kit.models import build_model

    return build_model("tiny-gpt2", device=machine.device_name())


def _weights(model) -> int:
    return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())


def test_release_frees_a_real_training_run(tmp_path):
    _data()                                   # the dataset is cached on purpose: it holds no tensors
    base = leaks.take_baseline()
    ns = {}                                   # stands for a notebook's globals()
    ns["model"] = _model()
    ns["trainer"] = _trainer(ns["model"], tmp_path)
    ns["trainer"].train()
    weights = _weights(ns["model"])
    before = leaks.check_returned(base, raise_on_leak=False, top=3)
    assert not before.ok                      # the check can fail: weights + AdamW state are alive
    assert before.excess_bytes >= 3 * weights - MiB
    held = [h for t in before.tensors for h in t.holders]
    here = " (a local variable of test_release_frees_a_real_training_run())"
    assert "ns['model'].lm_head.weight" + here in held, held
    assert any(h.startswith("ns['trainer'].optimizer.optimizer.state[<Parameter 4096x128>]") for h in held), held

    # 1. release the Trainer, keep the model: only the weights stay (no gradients, optimizer, Trainer)
    trainer = cleanup.release(ns["trainer"], namespace=ns)    # rebinding works in functions too
    assert list(ns) == ["model"] and trainer is None          # the name bound to the Trainer is gone
    kept = leaks.check_returned(base, raise_on_leak=False)
    assert abs(kept.excess_bytes - weights) <= MiB, kept.text()
    assert all(p.grad is None for p in ns["model"].parameters())

    # 2. free the model too; a name kept elsewhere holds an empty shell on the meta device
    shell = ns["model"]
    cleanup.release(model=ns["model"], free_model=True, namespace=ns)
    assert ns == {} and next(shell.parameters()).is_meta
    report = leaks.check_returned(base)     # raises if not
    assert report.ok and "Memory returned" in report.text()


def test_leak_check_fails_and_names_the_holders():
    base = leaks.take_baseline()

    class Holder:
        pass

    holder = Holder()
    holder.big = torch.ones(8 * MiB, dtype=torch.uint8)
    KEEP["x"] = torch.ones(16 * MiB, dtype=torch.uint8)
    try:
        with pytest.raises(leaks.MemoryNotReturnedError) as err:
            leaks.check_returned(base)
        report = err.value.report
        assert not report.ok and report.excess_bytes == 24 * MiB
        first, second = report.tensors[:2]
        assert (first.nbytes, first.desc) == (16 * MiB, "uint8[16777216]")
        assert any(h.endswith("KEEP['x']") for h in first.holders), first.holders
        assert "holder.big (a local variable of test_leak_check_fails_and_names_the_holders())" in second.holders
        text = str(err.value)
        assert "Memory NOT returned" in text and "16.00 MiB" in text and "KEEP['x']" in text
    finally:
        KEEP.clear()
    del holder
    assert leaks.check_returned(base).ok


def test_stored_tracebacks_are_dropped():
    base = leaks.take_baseline()

    def fails():
        big = torch.ones(32 * MiB, dtype=torch.uint8)  # noqa: F841 - kept alive by the traceback
        raise torch.OutOfMemoryError("CUDA out of memory.")

    try:
        fails()
    except torch.OutOfMemoryError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()   # what a notebook does
    assert not leaks.check_returned(base, raise_on_leak=False).ok
    assert cleanup.forget_exceptions() >= 3
    assert not hasattr(sys, "last_traceback")
    assert leaks.check_returned(base).ok


def test_oom_safe_recovers_from_a_simulated_oom_inside_trainer(tmp_path):
    from transformers import TrainerCallback

    class BlowUp(TrainerCallback):          # a real torch.OutOfMemoryError in the middle of train()
        def on_step_end(self, args, state, control, **kwargs):
            ballast = torch.ones(64 * MiB, dtype=torch.uint8)  # noqa: F841 - in the failing frame
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    def run(blow_up: bool):
        trainer = _trainer(_model(), tmp_path, steps=2, callbacks=[BlowUp()] if blow_up else [])
        return trainer.train().training_loss

    base = leaks.take_baseline()
    tracker = Tracker()
    failed = oom.oom_safe(run, True, setup={"batch_size": 4}, tracker=tracker, stage="fold")
    assert not failed and failed.oom and failed.setup == {"batch_size": 4}
    assert failed.error.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB")
    assert "OUT OF MEMORY (batch_size=4)" in failed.text()
    assert tracker.records[0].error.startswith("OutOfMemoryError")
    assert leaks.check_returned(base).ok          # the failed run's model, optimizer and ballast are gone
    second = oom.oom_safe(run, False, setup={"batch_size": 4})
    assert second.ok and second.value > 0           # the kernel is still usable
    with pytest.raises(ValueError):                 # other errors are not swallowed
        oom.oom_safe(lambda: int("x"))


def test_largest_batch_size_finds_the_limit_and_frees_each_failure():
    limit = 12

    def train(batch_size):
        ballast = torch.ones(batch_size * MiB, dtype=torch.uint8)
        if batch_size > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch_size} MiB")
        return int(ballast[0])

    base = leaks.take_baseline()
    search = oom.largest_batch_size(train, start=16, precision=2)
    assert search.best == limit
    sizes = {p.size: p.oom for p in search.points}
    assert sizes == {16: True, 8: False, 12: False, 14: True}      # halve, then bisect
    assert all((p.peak_bytes is None) == p.oom for p in search.points)
    assert [p.size for p in search.points] == sorted(sizes)
    assert search.text() == "largest batch size that fits: 12 (tried 8, 12, 14 OOM, 16 OOM)"
    assert leaks.check_returned(base).ok
    fig = plot.sweep(search.points, "batch size")
    assert len(fig.axes[0].get_lines()) == 2
    assert oom.largest_batch_size(lambda bs: train(bs * 100), start=1).best is None
    with pytest.raises(ValueError, match="start"):
        oom.largest_batch_size(train, start=0)


def test_a_real_cpu_allocation_failure_is_an_oom_and_the_search_finds_the_limit():
    # The CPU allocator raises a RuntimeError (not MemoryError) when an allocation fails: a real one here.
    def train(batch_size):
        n = 2**62 if batch_size > 5 else batch_size * MiB     # 4 EiB: the allocator refuses at once
        return int(torch.empty(n, dtype=torch.uint8).numel() > 0)

    r = oom.oom_safe(train, 8, setup={"batch_size": 8})
    assert r.oom and "can't allocate memory" in r.error
    search = oom.largest_batch_size(train, start=8, precision=1)
    assert search.best == 5                       # before the fix, accelerate swallowed the error: 4
    assert {p.size: p.oom for p in search.points} == {8: True, 4: False, 6: True, 5: False}


# -- on a GPU -------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_real_oom_is_recovered_and_memory_returns(tmp_path):
    base = leaks.take_baseline()
    free_bytes, _ = torch.cuda.mem_get_info()

    def grab(n_bytes):
        keep = [torch.empty(n_bytes // 4, dtype=torch.uint8, device="cuda") for _ in range(4)]
        keep.append(torch.empty(n_bytes, dtype=torch.uint8, device="cuda"))   # more than is free
        return len(keep)

    r = oom.oom_safe(grab, free_bytes, setup={"bytes": free_bytes})
    assert r.oom and "out of memory" in r.error.lower()
    report = leaks.check_returned(base, tolerance_frac=0.01)
    assert report.ok, report.text()
    print(f"CUDA OOM recovered: {report.text()}")             # the figures, for the note
    again = oom.oom_safe(lambda: float(torch.ones(MiB, device="cuda").sum()))
    assert again.ok and again.value == MiB                   # the process can still use the GPU


@pytest.mark.gpu
def test_cuda_release_after_training_returns_to_baseline(tmp_path):
    base = leaks.take_baseline()
    ns = {"model": _model()}
    ns["trainer"] = _trainer(ns["model"], tmp_path)
    ns["trainer"].train()
    cleanup.release(ns["trainer"], free_model=True, namespace=ns)
    report = leaks.check_returned(base, tolerance_frac=0.01)
    assert report.ok, report.text()
    print(f"CUDA release after training: {report.text()}")


# -- the cuBLAS workspaces (issue 26, item 2) -------------------------------------------------------------
def test_item2_the_leak_check_clears_the_cublas_workspaces_before_it_compares(monkeypatch):
    """CUDA faked: the allocator's count holds two workspaces (a real first run's) until they are cleared."""
    from kit.measure import device

    workspaces = {"bytes": 0}
    clears = []
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda d=None: workspaces["bytes"])
    monkeypatch.setattr(device, "_nvml_used_bytes", lambda d=None: None)
    monkeypatch.setattr(device, "empty_cache", lambda: None)

    def clear():
        clears.append(workspaces["bytes"])
        workspaces["bytes"] = 0

    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", clear, raising=False)
    base = leaks.take_baseline()
    workspaces["bytes"] = 2 * 8_519_680            # a T4's: the forward thread's and autograd's
    report = leaks.check_returned(base, tolerance_bytes=0, tolerance_frac=0)
    assert report.ok and report.now_bytes == report.baseline_bytes == 0, report.text()
    assert clears[-1] == 2 * 8_519_680


@pytest.mark.gpu
def test_item2_gpu_a_training_step_leaves_exactly_two_cublas_workspaces():
    import os

    if os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        pytest.skip("CUBLAS_WORKSPACE_CONFIG sets another workspace size")
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    x = torch.randn(256, 256, device="cuda")
    (x @ w).sum().backward()                      # a matmul on this thread and one on autograd's
    del w, x
    size = 8_519_680 if torch.cuda.get_device_capability() < (9, 0) else 32 * MiB
    assert torch.cuda.memory_allocated() - before == 2 * size
    torch._C._cuda_clearCublasWorkspaces()
    assert torch.cuda.memory_allocated() == before


# -- issue 35: kit.free given something else than a namespace, or a function's locals() -------------
@pytest.mark.parametrize("bad", [None, [torch.zeros(4)], "globals()"])
def test_i35_1_free_refuses_what_is_not_a_namespace_in_one_sentence(bad):
    import kit
    from kit.inputs import InputError

    with pytest.raises(InputError) as e:
        kit.free(bad)
    given = "not None" if bad is None else f"not a {type(bad).__name__}"
    assert "kit.free(globals())" in str(e.value) and given in str(e.value), str(e.value)


def test_i35_1_free_of_an_empty_namespace_says_that_nothing_held_memory():
    import kit

    text = kit.free({})
    assert text.startswith("freed 0 names (none held memory)"), text


def test_i35_18_free_of_locals_inside_a_function_says_what_did_not_come_back():
    import kit

    def run():
        big = torch.zeros(12_500_000, requires_grad=True)   # 50,000,000 bytes, held by this frame's local variable
        return kit.free(locals()), big

    text, big = run()
    size = big.untyped_storage().nbytes()
    assert text.startswith("freed 0 names"), text
    assert f"still held elsewhere: big ({size:,} bytes)" in text, text
    assert "big = None" in text, text


def test_i35_18_free_says_which_names_came_back_and_which_did_not():
    import kit

    kept = torch.zeros(1_000_000, requires_grad=True)   # tensors of a run (a weight): CPU data is kept
    ns = {"gone": torch.zeros(2_000_000, requires_grad=True), "kept": kept}
    text = kit.free(ns)
    assert text.startswith("freed 1 name (gone)"), text
    assert f"still held elsewhere: kept ({kept.untyped_storage().nbytes():,} bytes)" in text, text
    assert ns == {}
