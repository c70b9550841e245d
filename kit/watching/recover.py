"""After a watched run stops early (an out-of-memory error, or Ctrl-C; :mod:`kit.watching.core` decides what runs
when): release what the dead run held, so that memory comes back and the Trainer can train again from step 1.

The failed call's frames go with :func:`kit.measure.cleanup.scrub`; :func:`release` drops the gradients and the
optimizer state (a Trainer-made optimizer and scheduler too, so a retry makes fresh ones and never carries on
from a half-done step's state); :func:`tidy` forgets stored exceptions and returns the allocator's cache.
"""
from __future__ import annotations

import gc

from kit import machine
from kit.measure import device
from kit.measure.cleanup import forget_exceptions, malloc_trim


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


def tidy() -> None:
    """Forget stored exceptions (their frames), collect, return the allocator's cache."""
    forget_exceptions()
    gc.collect()
    device.empty_cache()
    malloc_trim()


def alive_bytes() -> int:
    """What is allocated now: CUDA allocated with a GPU, else every live CPU tensor (a gc walk)."""
    if machine.has_cuda():
        import torch

        return torch.cuda.memory_allocated()
    gc.collect()
    return int(sum(device.live_tensor_bytes().values()))
