"""The CUDA allocator's controls, beside :mod:`kit.device`'s readings (the two are the only modules that
touch ``torch.cuda``): a memory fraction for one block (a smaller GPU) and the allocation history for
https://pytorch.org/memory_viz. Both are read as ``kit.device.*``; ``kit.device`` also applies the process
cap of ``KIT_GPU_CAP_BYTES`` on import (:func:`kit.memory_cap.apply_env_cap`).

>>> with cuda_memory_history("train.pickle"):          # doctest: +SKIP
...     trainer.train()
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from .units import fmt_bytes


@contextlib.contextmanager
def cuda_memory_fraction(cap_bytes: int):
    """Let the caching allocator hand out at most ``cap_bytes`` (reserved) inside the block, as a GPU of that
    size would (``torch.cuda.set_per_process_memory_fraction``; the old fraction is restored in a finally).
    Yields what was set, in words; a cap at or above the GPU's memory sets nothing and says so."""
    from . import device  # at the call, not on import: kit.device imports this module
    from .memory_cap import env_cap_bytes  # KIT_GPU_CAP_BYTES, the process's cap: a run's never lifts it

    dev = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(dev).total_memory
    env = env_cap_bytes()
    cap_bytes = min(cap_bytes, env) if env is not None else cap_bytes
    if cap_bytes >= total:
        yield f"no cap: {fmt_bytes(cap_bytes)} is not below this GPU's {fmt_bytes(total)}"
        return
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)   # torch >= 2.9
    old = get(dev) if get is not None else min(1.0, env / total) if env is not None else 1.0
    device.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total, dev)
    try:
        yield (f"CUDA memory fraction {cap_bytes / total:.4f} of this GPU's {fmt_bytes(total)} "
               "(torch.cuda.set_per_process_memory_fraction; reserved memory counts)")
    finally:
        torch.cuda.set_per_process_memory_fraction(old, dev)


@contextlib.contextmanager
def cuda_memory_history(path: str | Path, *, max_entries: int = 100_000):
    """Record every CUDA allocation inside the block; save a pickle for https://pytorch.org/memory_viz.

    Drag the saved file onto that page to see each allocation with its Python stack.
    The pickle is written even when the block raises, so an OOM can be inspected. On a
    CPU it records nothing and yields None.

    >>> with tracker.stage("train"), cuda_memory_history("train.pickle"):   # doctest: +SKIP
    ...     trainer.train()
    """
    from . import device  # at the call, not on import: kit.device imports this module

    if not device.has_cuda():
        yield None
        return
    # torch's recorder is a private API (torch.cuda.memory._record_memory_history / _dump_snapshot),
    # the one PyTorch's own memory tutorial uses.
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        yield Path(path)
    finally:
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
