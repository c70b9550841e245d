"""What this machine is: its GPU (name, memory, compute capability), RAM and cores.

The identity of the hardware, not a reading over time (those are :mod:`kit.measure.device`'s). It sits
with the foundations so that the prediction can resolve ``device="this"`` and choose a 16-bit dtype
without importing the measuring side. torch and psutil are imported on first use.

>>> hardware()["ram_total_bytes"] > 0
True
"""
from __future__ import annotations

import math
import os

from kit.inputs import InputError


def has_cuda() -> bool:
    """True when a CUDA GPU is usable by torch in this process."""
    import torch

    return torch.cuda.is_available()


def device_name() -> str:
    """``"cuda"`` when a GPU is there, else ``"cpu"``: the kit's default device."""
    return "cuda" if has_cuda() else "cpu"


def compute_capability() -> tuple[int, int] | None:
    """This GPU's CUDA compute capability, e.g. ``(7, 5)`` on a T4; None without a GPU."""
    import torch

    return tuple(torch.cuda.get_device_capability()) if has_cuda() else None


def hardware() -> dict:
    """What this runtime has: GPU name and memory, RAM, CPU cores.

    >>> sorted(hardware())
    ['cpu_cores', 'gpu_name', 'gpu_total_bytes', 'ram_available_bytes', 'ram_total_bytes']
    """
    import psutil
    import torch

    info = {
        "gpu_name": None,
        "gpu_total_bytes": None,
        "ram_total_bytes": psutil.virtual_memory().total,
        "ram_available_bytes": psutil.virtual_memory().available,
        "cpu_cores": os.cpu_count(),
    }
    if has_cuda():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["gpu_name"] = props.name
        info["gpu_total_bytes"] = props.total_memory
    return info


CAP_ENV = "KIT_GPU_CAP_BYTES"   # the process cap kit.measure.controls applies


def env_cap_bytes() -> int | None:
    """``KIT_GPU_CAP_BYTES`` as a whole number of bytes, or None when it is unset or empty; an InputError
    (a ValueError) that names the variable when it is not a positive whole number.

    >>> os.environ[CAP_ENV] = "1.5e9"; env_cap_bytes()
    1500000000
    >>> del os.environ[CAP_ENV]; env_cap_bytes() is None
    True
    """
    raw = os.environ.get(CAP_ENV, "").strip()
    if not raw:
        return None
    try:
        n = float(raw) if any(c in raw for c in ".eE") else int(raw)
    except ValueError:
        n = None
    if n is None or not math.isfinite(n) or n < 1 or float(n) != int(n):
        raise InputError(CAP_ENV, f"{CAP_ENV} must be a positive whole number of bytes, such as 15633680957 (a "
                                  f"Colab T4's 14.56 GiB), not {raw!r}.")
    return int(n)


def memory_fraction(dev: int | None = None) -> float:
    """The caching allocator's per-process memory fraction on this GPU (1.0: no cap). Read from torch
    (``torch.cuda.get_per_process_memory_fraction``, torch >= 2.9); on an older torch, from
    ``KIT_GPU_CAP_BYTES`` when it is set. 1.0 without a GPU."""
    if not has_cuda():
        return 1.0
    import torch

    dev = torch.cuda.current_device() if dev is None else dev
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get is not None:
        return float(get(dev))
    cap = env_cap_bytes()
    total = torch.cuda.get_device_properties(dev).total_memory
    return min(1.0, cap / total) if cap else 1.0


def gpu_bytes_for_torch() -> int | None:
    """What torch can have of this GPU now: the driver's free memory plus what this torch already
    reserved (the CUDA context and other processes keep the rest), and never more than the allocator's
    memory fraction lets it reserve (``set_per_process_memory_fraction``, ``KIT_GPU_CAP_BYTES``). None
    without a GPU."""
    if not has_cuda():
        return None
    import torch

    dev = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(dev)
    capped = int(memory_fraction(dev) * torch.cuda.get_device_properties(dev).total_memory)
    return min(free + torch.cuda.memory_reserved(dev), capped)
