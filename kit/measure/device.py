"""Memory readings: with :mod:`kit.machine` (what the hardware is), the only module that touches
``torch.cuda``, NVML or psutil.

One call, :func:`snapshot`, returns every counter the kit reads, each named after
the counter it comes from:

- ``cuda_allocated_bytes`` / ``cuda_reserved_bytes`` / ``cuda_peak_allocated_bytes``:
  PyTorch's caching allocator (``torch.cuda.memory_allocated`` and friends);
- ``nvml_used_bytes``: what nvidia-smi shows for the GPU, CUDA context included;
- ``rss_bytes`` / ``rss_peak_bytes`` / ``ram_available_bytes``: the process and the
  machine, from psutil and ``/proc``;
- ``live_tensor_bytes``: bytes held by live torch tensors per device, found by
  walking the garbage collector. It works on a CPU too, so leaks can be shown
  without a GPU.

>>> snap = snapshot()
>>> print(snap.text())            # doctest: +SKIP
cpu tensors 1.20 GiB | RSS 2.31 GiB (peak 2.40 GiB) | RAM free 19.8 GiB
"""
from __future__ import annotations

import ctypes
import functools
import gc
import os
import time
from dataclasses import asdict, dataclass

import psutil
import torch

from kit import machine
from kit.units import fmt_bytes, wrapped


def runtime_ram_bytes() -> int:
    """What the runtime itself holds in RAM: this process's RSS once torch, transformers' Trainer and, with a GPU,
    CUDA's libraries and context are loaded (loaded here first, as training would), less the bytes live CPU
    tensors hold (a model already built is the model's, not the runtime's).

    >>> runtime_ram_bytes() > 100 * 2**20
    True
    """
    from transformers import Trainer  # noqa: F401 (loads the training stack, as the user's notebook does)

    if machine.has_cuda():
        torch.empty(1, device="cuda")   # CUDA's context and libraries
    return_freed_heap()
    rss = psutil.Process(os.getpid()).memory_info().rss
    return max(rss - live_tensor_bytes("cpu"), 0)


def return_freed_heap() -> None:
    """Hand the C heap's freed pages back to the system where glibc keeps them (``malloc_trim``). Memory freed by
    earlier work stays in the process's RSS otherwise, and a later tensor that reuses it adds nothing to the RSS, so a
    reading taken beside it would count the garbage as runtime and then lose it again. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc_trim(0)


def best_reading() -> str:
    """Name of the counter the kit trusts most here: ``cuda_allocated`` or ``live_tensor_bytes``."""
    return "cuda_allocated" if machine.has_cuda() else "live_tensor_bytes"


def live_tensor_bytes(device: str | None = None) -> dict[str, int] | int:
    """Bytes held by live tensors, per device, by walking ``gc.get_objects()``.

    Views count once: tensors are grouped by the storage they share. Tensors on
    the ``meta`` device hold no memory and are skipped. With ``device`` given
    (``"cpu"``, ``"cuda:0"``), returns that device's count alone.

    >>> x = torch.zeros(1024, dtype=torch.uint8)
    >>> live_tensor_bytes("cpu") >= 1024
    True
    """
    seen: set[tuple[str, int]] = set()
    totals: dict[str, int] = {}
    for obj in gc.get_objects():
        # issubclass(type(...)) rather than isinstance: isinstance on every gc object trips
        # torch.distributed's deprecated `reduce_op` proxy, which warns, and is slower.
        if not issubclass(type(obj), torch.Tensor):
            continue
        try:
            if obj.is_meta or obj.is_sparse:
                continue
            storage = obj.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except Exception:  # odd tensor subclasses (fake, functional) have no real storage
            continue
        dev = str(obj.device)
        if nbytes == 0 or (dev, ptr) in seen:
            continue
        seen.add((dev, ptr))
        totals[dev] = totals.get(dev, 0) + nbytes
    if device is not None:
        return totals.get(device, 0)
    return totals


def _rss_peak_bytes() -> int | None:
    """Peak RSS of this process since start or the last :func:`reset_peak` (Linux VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


_nvml_handles: dict = {}        # NVML index -> handle: one per GPU, never one for the whole process


def nvml_index(torch_index: int, visible: str | None = None) -> int:
    """The NVML (nvidia-smi) index of torch's CUDA device ``torch_index``. Under ``CUDA_VISIBLE_DEVICES=2,3``
    torch's device 1 is NVML's 3: torch numbers the visible GPUs from 0, NVML numbers them all. UUIDs in the
    variable are mapped by torch (``torch.cuda._get_nvml_device_index``).

    >>> nvml_index(1, "2,3"), nvml_index(0, None), nvml_index(0, "")
    (3, 0, 0)
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if not visible or not visible.strip():
        return torch_index
    parts = [x.strip() for x in visible.split(",")]
    if all(x.lstrip("+").isdigit() for x in parts):
        if torch_index >= len(parts):
            raise ValueError(f"CUDA device {torch_index} is not among CUDA_VISIBLE_DEVICES={visible!r}: "
                             "pick a device below the number listed there.")
        return int(parts[torch_index])
    return torch.cuda._get_nvml_device_index(torch_index)   # UUIDs: torch asks NVML for them


def cuda_devices() -> list[int]:
    """torch's indices of every visible CUDA GPU (``[]`` without one). With more than one, Trainer wraps a
    model that is not quantized in DataParallel, so every visible GPU holds a copy: the readings sum them."""
    return list(range(torch.cuda.device_count())) if machine.has_cuda() else []


def model_devices(model) -> list[int]:
    """The CUDA indices a model was placed on by ``device_map`` (its ``hf_device_map``), else those its
    parameters are on.

    >>> model_devices(torch.nn.Linear(2, 2))
    []
    """
    placed = getattr(model, "hf_device_map", None) or {}
    found = {d for d in placed.values() if isinstance(d, int)}
    found |= {int(str(d).split(":")[1]) for d in placed.values() if str(d).startswith("cuda:")}
    if not placed:
        found = {p.device.index for p in model.parameters() if p.device.type == "cuda" and p.device.index is not None}
    return sorted(found)


def _nvml_used_bytes(dev: int | None = None) -> int | None:
    """GPU memory used as NVML (nvidia-smi) sees it on torch's device ``dev`` (default: the current one),
    or None without NVML."""
    if not machine.has_cuda():
        return None
    try:
        import pynvml  # from nvidia-ml-py

        index = nvml_index(torch.cuda.current_device() if dev is None else dev)
        if index not in _nvml_handles:
            pynvml.nvmlInit()
            _nvml_handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(_nvml_handles[index]).used)
    except Exception:  # no driver library, or a sandbox without NVML
        return None


@dataclass
class Snapshot:
    """One reading of every memory counter. Bytes are ints; None means "not on this runtime", or for
    ``live_tensor_bytes`` "not read" (``snapshot(live_tensors=False)`` skips the walk): never 0."""

    time: float
    rss_bytes: int
    rss_peak_bytes: int | None
    ram_available_bytes: int
    live_tensor_bytes: dict[str, int] | None = None
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    cuda_peak_allocated_bytes: int | None = None
    nvml_used_bytes: int | None = None
    cuda_per_device: dict | None = None    # with more than one visible GPU: torch index -> allocated bytes

    def live(self, device: str = "cpu") -> int | None:
        """Live-tensor bytes on one device (``"cpu"``, ``"cuda:0"``); None when the walk was not taken."""
        return None if self.live_tensor_bytes is None else self.live_tensor_bytes.get(device, 0)

    @property
    def best_bytes(self) -> int | None:
        """The figure of :func:`best_reading`: CUDA allocated on a GPU, else CPU live tensors (None: not read)."""
        if self.cuda_allocated_bytes is not None:
            return self.cuda_allocated_bytes
        return self.live("cpu")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Snapshot":
        return cls(**data)

    @wrapped
    def text(self) -> str:
        """One line for printing, each number labelled with its counter."""
        parts = []
        if self.cuda_allocated_bytes is not None:
            parts.append(
                f"CUDA allocated {fmt_bytes(self.cuda_allocated_bytes)}"
                f", reserved {fmt_bytes(self.cuda_reserved_bytes)}"
                f", peak allocated {fmt_bytes(self.cuda_peak_allocated_bytes)}"
            )
        if self.nvml_used_bytes is not None:
            parts.append(f"NVML used {fmt_bytes(self.nvml_used_bytes)}")
        if self.live_tensor_bytes is None:
            parts.append("live tensors: not read")
        else:
            tensors = ", ".join(f"{dev} {fmt_bytes(n)}" for dev, n in sorted(self.live_tensor_bytes.items()))
            parts.append(f"live tensors: {tensors or 'none'}")
        parts.append(f"RSS {fmt_bytes(self.rss_bytes)} (peak {fmt_bytes(self.rss_peak_bytes)})")
        parts.append(f"RAM available {fmt_bytes(self.ram_available_bytes)}")
        return " | ".join(parts)


def snapshot(live_tensors: bool = True) -> Snapshot:
    """Read every counter now. ``live_tensors=False`` skips the gc walk (it costs ~ms per 10k objects).

    >>> s = snapshot()
    >>> s.rss_bytes > 0
    True
    """
    snap = Snapshot(
        time=time.time(),
        rss_bytes=psutil.Process(os.getpid()).memory_info().rss,
        rss_peak_bytes=_rss_peak_bytes(),
        ram_available_bytes=psutil.virtual_memory().available,
        live_tensor_bytes=live_tensor_bytes() if live_tensors else None,
    )
    devs = cuda_devices()
    if devs:   # summed over every visible GPU: one GPU is that GPU; DataParallel's copies all count
        snap.cuda_allocated_bytes = sum(torch.cuda.memory_allocated(d) for d in devs)
        snap.cuda_reserved_bytes = sum(torch.cuda.memory_reserved(d) for d in devs)
        snap.cuda_peak_allocated_bytes = sum(torch.cuda.max_memory_allocated(d) for d in devs)
        used = [_nvml_used_bytes(d) for d in devs]
        snap.nvml_used_bytes = None if None in used else sum(used)
        if len(devs) > 1:
            snap.cuda_per_device = {d: torch.cuda.memory_allocated(d) for d in devs}
    return snap


# How many times each peak counter was reset in this process. A stage whose counter was reset
# inside it (by a nested stage, Trainer's memory metrics or any other tool) cannot call its peak exact.
_RESETS = {"cuda": 0, "rss": 0}


def peak_resets() -> dict:
    """How many times the CUDA and RSS peak counters were reset so far: ``{"cuda": n, "rss": n}``."""
    return dict(_RESETS)


def _count_cuda_resets() -> None:
    # torch keeps no count of resets of its peak, and Trainer (TrainerMemoryTracker) and other tools
    # reset it for the whole process. So the reset function is wrapped, once, to count every call.
    orig = torch.cuda.memory.reset_peak_memory_stats
    if getattr(orig, "_kit_counts", False):
        return

    @functools.wraps(orig)
    def reset_peak_memory_stats(*args, **kwargs):
        _RESETS["cuda"] += 1
        return orig(*args, **kwargs)

    reset_peak_memory_stats._kit_counts = True
    torch.cuda.reset_peak_memory_stats = torch.cuda.memory.reset_peak_memory_stats = reset_peak_memory_stats


if torch.cuda.is_available():
    _count_cuda_resets()


def reset_peak() -> dict:
    """Reset the peak counters: CUDA's max allocated (when CUDA is there) and the peak RSS.

    Returns whether each reset took: ``{"cuda": True|None (no GPU), "rss": True|False}``.
    Guarded: on a CPU build ``torch.cuda.reset_peak_memory_stats`` raises, so it is
    called only with a GPU. The RSS peak is reset through ``/proc/self/clear_refs``
    on Linux; where that file cannot be written, ``"rss"`` is False and the RSS peak
    still counts from an earlier moment.

    >>> reset_peak()["cuda"] in (True, None)
    True
    """
    done = {"cuda": None, "rss": False}
    if machine.has_cuda():
        for d in cuda_devices():
            torch.cuda.reset_peak_memory_stats(d)   # counted by the wrapper above
        done["cuda"] = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        done["rss"] = True
        _RESETS["rss"] += 1
    except OSError:
        pass
    return done


def peak_allocated_bytes() -> int | None:
    """CUDA's max allocated since the last reset (summed over the visible GPUs), or None without CUDA."""
    return sum(torch.cuda.max_memory_allocated(d) for d in cuda_devices()) if machine.has_cuda() else None


def empty_cache() -> None:
    """Return cached, unused CUDA blocks to the driver (a no-op without CUDA)."""
    if machine.has_cuda():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error: ``torch.OutOfMemoryError``, ``MemoryError``, CUDA's OOM text,
    or the CPU allocator's (a RuntimeError, not a MemoryError).

    >>> is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory"))
    True
    """
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@wrapped
def explain(snap: Snapshot) -> str:
    """The snapshot read aloud: one sentence per number, saying what each counter means.

    >>> print(explain(snapshot()))              # doctest: +SKIP
    Live tensors on cpu hold 12.0 MiB: ...
    """
    lines = []
    if snap.cuda_allocated_bytes is not None:
        lines += [
            f"CUDA allocated is {fmt_bytes(snap.cuda_allocated_bytes)}: "
            "the bytes PyTorch's tensors occupy on the GPU now.",
            f"CUDA reserved is {fmt_bytes(snap.cuda_reserved_bytes)}: allocated plus the blocks PyTorch's caching "
            "allocator keeps for reuse; empty_cache() hands the unused part back.",
            f"CUDA peak allocated is {fmt_bytes(snap.cuda_peak_allocated_bytes)}: the most that was allocated at once "
            "since the last reset. This is the number that decides an out-of-memory error.",
        ]
    if snap.nvml_used_bytes is not None:
        lines.append(
            f"NVML used is {fmt_bytes(snap.nvml_used_bytes)}: what nvidia-smi shows for the whole GPU, reserved memory "
            "plus the CUDA context (a few hundred MiB) plus any other process."
        )
    for dev, n in sorted(snap.live_tensor_bytes.items()):
        lines.append(
            f"Live tensors on {dev} hold {fmt_bytes(n)}: found by walking Python's garbage collector, so it works on "
            "a CPU too and shows leaks as tensors someone still references."
        )
    if not snap.live_tensor_bytes:
        lines.append("No live tensors were found: nothing is loaded yet.")
    lines += [
        f"The process RSS is {fmt_bytes(snap.rss_bytes)}: the RAM this Python process occupies, libraries included"
        + (f" (its peak so far is {fmt_bytes(snap.rss_peak_bytes)})." if snap.rss_peak_bytes else "."),
        f"The machine has {fmt_bytes(snap.ram_available_bytes)} of RAM available: when that reaches zero, "
        "Colab restarts the session.",
    ]
    return "\n".join(lines)
