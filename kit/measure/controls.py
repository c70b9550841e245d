"""The CUDA allocator's controls, and a memory cap for one run or one process.

Beside :mod:`kit.measure.device`'s readings, the only module that sets ``torch.cuda``'s allocator: a memory
fraction for one block (:func:`cuda_memory_fraction`), the allocation history for https://pytorch.org/memory_viz
(:func:`cuda_memory_history`), and a cap, a smaller GPU on any machine (``kit.train(trainer, cap_bytes=N)`` uses it):

- **On CUDA**, ``torch.cuda.set_per_process_memory_fraction(N / total)`` for the run, restored after
  (in a ``finally``): the caching allocator then raises its own ``torch.OutOfMemoryError`` past N bytes
  *reserved* (allocated plus cached blocks), as a device of that size would. The cache is emptied first.
- **On a CPU**, no allocator can be told a size, so :class:`kit.measure.tensor_peak.TensorPeak` counts the
  live tensor bytes op by op and raises ``torch.OutOfMemoryError`` ("kit memory cap: ...") the moment
  an op's outputs pass N. A simulated cap, and what it proves is limited: it raises where the CPU
  kernels' live tensors pass N. A GPU of N bytes caps *reserved* memory (the cache and fragmentation
  count), runs other kernels (their saved tensors and temporaries differ: for tiny-gpt2 the kit's own
  CPU estimate is 0.887x its CUDA one) and keeps a CUDA context, so it can fail earlier, or at another op.
  It shows the OOM path (the error, the report, the cleanup) on any machine; it does not show that a GPU
  of N bytes fails at that point. Its counter is the run's exact CPU peak too.

Both count every tensor of the process (as CUDA's allocated does), not only the run's.

**For a whole process**, ``KIT_GPU_CAP_BYTES=N`` in its environment caps CUDA at N bytes from the moment
``kit.measure`` is imported (:func:`apply_env_cap`), so a script, the demo or a notebook kernel runs as on
a smaller GPU: ``KIT_GPU_CAP_BYTES=15633680957 python -m kit demo --out report/`` is a Colab T4's
14.56 GiB. A run's own cap inside it never lifts it.

>>> with memory_cap(None) as cap:
...     cap.how
'no cap'
>>> import torch
>>> with memory_cap(2**40) as cap:                    # doctest: +SKIP
...     cap.how
'CPU live-tensor counter: a simulated cap'
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from kit import machine
from kit.machine import CAP_ENV, env_cap_bytes  # one reading of KIT_GPU_CAP_BYTES, with "this GPU"'s
from kit.measure import device
from kit.measure.tensor_peak import TensorPeak
from kit.units import fmt_bytes


@dataclass
class Cap:
    """What :func:`memory_cap` set: ``cap_bytes`` (None: no cap), ``how`` in words, and on a CPU the
    ``counter`` (a TensorPeak: its ``peak_bytes`` is the run's exact live-tensor peak)."""

    cap_bytes: int | None
    how: str
    counter: TensorPeak | None = None


def check_cap(cap_bytes) -> int | None:
    """``cap_bytes`` as an int, or None; anything else is one clear ValueError.

    >>> check_cap(1.5e9), check_cap(None)
    (1500000000, None)
    """
    if cap_bytes is None:
        return None
    ok = not isinstance(cap_bytes, bool) and isinstance(cap_bytes, (int, float)) and cap_bytes >= 1 \
        and float(cap_bytes) == int(cap_bytes)
    if not ok:
        raise ValueError(f"cap_bytes must be a positive whole number of bytes (or None: no cap), not {cap_bytes!r}.")
    return int(cap_bytes)


@contextlib.contextmanager
def memory_cap(cap_bytes):
    """Cap the memory of what runs inside (see the module doc); yields a :class:`Cap`.

    A cap at or above the GPU's total memory sets nothing (there is nothing to cap) and says so.
    """
    n = check_cap(cap_bytes)
    if n is None:
        yield Cap(None, "no cap")
        return
    if not machine.has_cuda():
        with TensorPeak(limit_bytes=n) as counter:
            yield Cap(n, "CPU live-tensor counter: a simulated cap", counter)
        return
    with cuda_memory_fraction(n) as how:
        yield Cap(n if how.startswith("CUDA") else None, how)




def apply_env_cap() -> str | None:
    """Cap this process's CUDA allocator at ``KIT_GPU_CAP_BYTES`` for the rest of its life; ``kit.measure``
    calls it once, on import. Says what it set on stderr and returns it, in words; None when the variable
    is unset or there is no GPU (a CPU process runs uncapped: use :func:`memory_cap` there).

    >>> apply_env_cap() is None                       # unset here
    True
    """
    import torch

    n = env_cap_bytes()
    if n is None or not torch.cuda.is_available():
        return None

    dev = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(dev).total_memory
    if n >= total:
        how = f"no cap: {n:,} bytes is not below this GPU's {total:,}"
    else:
        torch.cuda.set_per_process_memory_fraction(n / total, dev)
        how = (f"CUDA capped at {n:,} bytes, fraction {n / total:.4f} of this GPU's {total:,} "
               "(torch.cuda.set_per_process_memory_fraction; reserved memory counts)")
    print(f"{CAP_ENV}={n}: {how}", file=sys.stderr, flush=True)
    return how


@contextlib.contextmanager
def cuda_memory_fraction(cap_bytes: int):
    """Let the caching allocator hand out at most ``cap_bytes`` (reserved) inside the block, as a GPU of that
    size would (``torch.cuda.set_per_process_memory_fraction``; the old fraction is restored in a finally).
    Yields what was set, in words; a cap at or above the GPU's memory sets nothing and says so."""

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

    if not machine.has_cuda():
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


# KIT_GPU_CAP_BYTES=N: this process's CUDA allocator is capped at N bytes from here on (read as kit.measure.ENV_CAP).
ENV_CAP = apply_env_cap()
