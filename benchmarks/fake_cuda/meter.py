"""Live fake CUDA storages, metered as the CUDA caching allocator rounds them, and the peak.

The method is MemTracker's (torch.distributed._tools.mem_tracker): a TorchDispatchMode sees every op's outputs;
each new CUDA storage is counted once, rounded up to 512 B (the caching allocator's kMinBlockSize), and a weak
reference takes it off when the storage dies. The peak is read after each op, so an op's outputs and its inputs
count together, as on a GPU. What no meter of this kind sees: an op's internal scratch (cuBLAS workspaces, flash
attention's backward accumulators, kernels' temporaries), and the caching allocator's reserved memory beyond the
live blocks.
"""
from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

CACHING_ALLOCATOR_ROUNDING = 512


def allocator_bytes(nbytes: int) -> int:
    """What the caching allocator hands out for a request of ``nbytes`` (0 for an empty storage)."""
    return math.ceil(nbytes / CACHING_ALLOCATOR_ROUNDING) * CACHING_ALLOCATOR_ROUNDING


class CudaStorageMeter(TorchDispatchMode):
    """``live`` and ``peak`` bytes of CUDA storages created while it is active (or handed to :meth:`track`).

    Enter it inside FakeTensorMode (as the innermost mode) so that it sees the ops before FakeTensorMode does.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes = WeakIdKeyDictionary()  # storage -> [bytes counted]

    def track(self, tensors) -> None:
        """Count the storages of ``tensors`` (any pytree) that are not counted yet."""
        for leaf in tree_flatten(tensors)[0]:
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda":
                self._count(leaf.untyped_storage())
        self.peak = max(self.peak, self.live)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _count(self, storage) -> None:
        size = allocator_bytes(storage.nbytes())
        counted = self._sizes.get(storage)
        if counted is None:  # a new storage: a finalizer takes it off when it dies
            counted = self._sizes[storage] = [0]
            weakref.finalize(storage, self._release, counted)
        self.live += size - counted[0]  # a resized storage (resize_, set_) counts its new size
        counted[0] = size

    def _release(self, counted: list) -> None:
        self.live -= counted[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.track(out)
        return out


class ScalarReadsAsZero(TorchDispatchMode):
    """A fake tensor has no values: reading one (``.item()``, ``bool(t)``) answers 0.

    Only control flow reads them in a training step: GradScaler's "was an inf found" (0: the step is taken, as on a
    healthy run), Trainer's NaN filter and logged loss. No shape depends on them.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return False if dtype == torch.bool else (0.0 if dtype.is_floating_point else 0)
        return func(*args, **(kwargs or {}))
