"""After ``kit.train``'s run stops early (an out-of-memory error, or Ctrl-C): release what the dead run held, so
that memory comes back and the Trainer can train again from step 1, and say what came back.

The failed call's frames go with :func:`kit.measure.cleanup.scrub`; :func:`release` drops the gradients and the
optimizer state (a Trainer-made optimizer and scheduler too, so a retry makes fresh ones and never carries on
from a half-done step's state); :func:`tidy` forgets stored exceptions and returns the allocator's cache.
"""
from __future__ import annotations

import gc

from kit import machine
from kit.measure import device
from kit.measure.cleanup import forget_exceptions, malloc_trim, scrub
from kit.units import fmt_bytes


def release(trainer, watch, measured: dict | None = None) -> dict:
    """Drop the dead run's gradients and optimizer state; returns what was freed, by name (from ``measured``)."""
    model = getattr(trainer, "model", None)
    if model is not None:
        model.zero_grad(set_to_none=True)
    opt = getattr(trainer, "optimizer", None)
    for o in (opt, getattr(opt, "optimizer", None)):
        if hasattr(o, "state") and hasattr(o.state, "clear"):
            o.state.clear()
    if watch.made_optimizer:
        trainer.optimizer = None
    if watch.made_scheduler:
        trainer.lr_scheduler = None
    acc = getattr(trainer, "accelerator", None)
    if acc is not None and hasattr(acc, "free_memory"):
        acc.free_memory()       # its lists of prepared models, optimizers and loaders (train() empties them too)
    measured = measured or {}
    return {k: measured[k] for k in ("gradients", "optimizer state") if measured.get(k)}


def tidy(trainer, watch) -> None:
    """Forget stored exceptions (their frames), collect, return the allocator's cache; redraw the live plot."""
    forget_exceptions()
    gc.collect()
    device.empty_cache()
    malloc_trim()
    if watch.live is not None:
        watch.live.update()


def alive_bytes() -> int:
    """What is allocated now: CUDA allocated with a GPU, else every live CPU tensor (a gc walk)."""
    if machine.has_cuda():
        import torch

        return torch.cuda.memory_allocated()
    gc.collect()
    return int(sum(device.live_tensor_bytes().values()))


def interrupted(trainer, watch, exc: BaseException) -> str:
    """Clean up after Ctrl-C (a ``KeyboardInterrupt``) inside ``trainer.train()`` as after an out-of-memory error,
    and return the line that says so. The caller re-raises the interrupt."""
    step, phase = watch.phases.step, watch.phases.phase
    before = alive_bytes()                         # the failed frames still alive
    scrub(exc)
    release(trainer, watch)
    tidy(trainer, watch)
    now = alive_bytes()
    when = "before the first step" if phase == "setup" else f"at step {step}"
    return (f"kit.train: interrupted {when} ({phase}). Released the interrupted call's frames, the gradients and "
            f"the optimizer state: {fmt_bytes(max(before - now, 0))} back, {fmt_bytes(now)} still allocated "
            f"(the model's weights, and anything else you hold). The kernel is usable, and the Trainer trains "
            "again from step 1 (a fresh optimizer), never from the interrupted step's state.")
