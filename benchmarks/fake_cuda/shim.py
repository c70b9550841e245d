"""The smallest shims that let a CPU-only torch run training steps on fake "cuda" tensors, each explained.

1. A native library (fake_cuda_shim.cpp, compiled with g++ against torch's own headers, cached under
   build/fake_cuda/torch-<version>/) registers c10's FakeGuardImpl for CUDA and CUDA hooks that report "built".
   ATen reads its CUDA hooks once, during ``import torch``: :func:`load` must run before torch is imported.
2. :func:`patch_cuda_queries` answers torch.cuda's Python queries (available, one device, the emulated GPU's
   properties) so that autocast("cuda") and GradScaler("cuda") stay enabled and Trainer picks cuda:0.
3. :func:`register_placeholder_cuda_kernels`: ops that a CUDA build runs as one CUDA kernel but a CPU build only has
   as a CompositeImplicitAutograd decomposition would otherwise be decomposed above FakeTensorMode into temporaries
   a GPU never makes (silu_backward: 3-13% over on SiLU models).
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import json
import pathlib
import shutil
import subprocess
import sys
import types

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "fake_cuda_shim.cpp"
BUILD = HERE.parents[1] / "build" / "fake_cuda"  # /build/ is ignored by git


_loaded = False


class ShimUnavailable(RuntimeError):
    """The native shim cannot be built or loaded here (no g++, or torch imported too early)."""


def library_path() -> pathlib.Path:
    return BUILD / f"torch-{importlib.metadata.version('torch')}" / "libfake_cuda_shim.so"


def _torch_build_flags() -> dict:
    """torch.utils.cpp_extension's include paths, torch's lib folder and its C++ ABI, read in a child process so
    that this process has not imported torch yet."""
    code = ("import json, os, torch, torch.utils.cpp_extension as ext; print(json.dumps({"
            "'include': ext.include_paths(), 'lib': os.path.join(os.path.dirname(torch.__file__), 'lib'), "
            "'abi': int(torch._C._GLIBCXX_USE_CXX11_ABI)}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def build() -> pathlib.Path:
    """The compiled shim for this torch version, compiling it (a few seconds) when it is not cached."""
    target = library_path()
    if target.exists() and target.stat().st_mtime >= SOURCE.stat().st_mtime:
        return target
    compiler = shutil.which("g++")
    if compiler is None:
        raise ShimUnavailable("g++ is not installed: the fake-CUDA shim cannot be compiled")
    flags = _torch_build_flags()
    target.parent.mkdir(parents=True, exist_ok=True)
    command = [compiler, "-O1", "-shared", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={flags['abi']}",
               *[f"-I{path}" for path in flags["include"]], str(SOURCE), f"-L{flags['lib']}", "-lc10",
               "-ltorch_cpu", f"-Wl,-rpath,{flags['lib']}", "-o", str(target) + ".tmp"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ShimUnavailable(f"g++ failed to compile {SOURCE.name}:\n{result.stderr[-2000:]}")
    pathlib.Path(str(target) + ".tmp").replace(target)
    return target


def load() -> None:
    """Build (if need be) and load the shim into this process, before torch is imported (once)."""
    global _loaded
    if _loaded:
        return
    if "torch" in sys.modules:
        raise ShimUnavailable("torch was imported before the fake-CUDA shim: ATen has read its CUDA hooks already; "
                              "load the shim first (run the meter in a fresh process)")
    ctypes.CDLL(str(build()), mode=ctypes.RTLD_GLOBAL)
    _loaded = True


def patch_cuda_queries(gpu: dict) -> None:
    """torch.cuda's Python queries answered for one emulated GPU (``gpu``: name, major, minor, total_memory).

    A CPU build's torch.cuda asks torch._C for a device count it does not have. Trainer (through accelerate),
    autocast("cuda") and GradScaler("cuda") all start from ``torch.cuda.is_available()``; autocast in bf16 also asks
    ``is_bf16_supported()``, true on every GPU here (a T4 emulates bf16, as torch reports there).
    """
    import torch

    properties = types.SimpleNamespace(name=gpu["name"], major=gpu["major"], minor=gpu["minor"],
                                       total_memory=gpu["total_memory"], multi_processor_count=gpu["sm_count"],
                                       is_integrated=False, uuid="fake")
    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "is_initialized": lambda: True,
        "_lazy_init": lambda: None,
        "is_bf16_supported": lambda including_emulation=True: True,
        "get_device_capability": lambda device=None: (gpu["major"], gpu["minor"]),
        "get_device_properties": lambda device=None: properties,
        "get_device_name": lambda device=None: gpu["name"],
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None,
    }
    for name, answer in answers.items():
        setattr(torch.cuda, name, answer)


# Ops whose CUDA build runs one CUDA kernel where a CPU build has only a CompositeImplicitAutograd decomposition.
# Found from torchgen's packaged native_functions.yaml for torch 2.13: entries with a CompositeImplicitAutograd
# kernel and a CUDA kernel (or a structured delegate, which generates one). tests/test_fake_cuda.py checks the list.
CUDA_ONLY_KERNELS = ("silu_backward", "mish_backward", "_fused_rms_norm")


def _placeholder(*args, **kwargs):
    raise RuntimeError("a placeholder CUDA kernel ran: it exists only so that FakeTensorMode sees the op whole")


_placeholder_library = None


def register_placeholder_cuda_kernels() -> object:
    """Register a CUDA kernel for each of CUDA_ONLY_KERNELS. With one present the autograd layer no longer takes
    the CompositeImplicitAutograd decomposition: the op reaches FakeTensorMode whole, which gives it its one output
    (its meta kernel, or its decomposition run inside FakeTensorMode, where no meter above it sees the temporaries,
    as none sees a CUDA kernel's registers). The kernel body never runs on fake tensors. Once per process: the
    library holding the registrations is kept for the process's life."""
    global _placeholder_library
    import torch

    if _placeholder_library is None:
        _placeholder_library = torch.library.Library("aten", "IMPL")
        for name in CUDA_ONLY_KERNELS:
            _placeholder_library.impl(name, _placeholder, "CUDA")
    return _placeholder_library


def fake_cuda_mode():
    """FakeTensorMode for "cuda" tensors. It decides whether ``torch.tensor(data, device="cuda")`` may initialise the
    device from ``torch.cuda.is_available()``, which :func:`patch_cuda_queries` makes true: it must not (there is no
    CUDA allocator here), so the tensor is made on the CPU and moved, as FakeTensorMode does without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class FakeCudaTensorMode(FakeTensorMode):
        avoid_device_init = True

    return FakeCudaTensorMode(allow_non_fake_inputs=True)
