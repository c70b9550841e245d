"""Exact tensor bytes on the CPU: the peak of a run (:class:`TensorPeak`) and what autograd saves.

A CPU has no ``torch.cuda.max_memory_allocated``; these are its stand-ins, so that a CPU run
can be compared with the estimate. They read no device counter (``kit.measure.device`` does that).
"""
from __future__ import annotations

import gc
import weakref

import torch

from kit.units import fmt_bytes


# What the user's code did, for torch's operations an out-of-memory error meets most, by the op's name
OPS_SAID = {
    "_to_copy": "a copy to another dtype or device (.to(), .float(), .half())", "copy_": "a copy into a tensor",
    "clone": "a copy of a tensor (.clone())", "empty": "a new tensor", "empty_strided": "a new tensor",
    "zeros": "a new tensor of zeros", "ones": "a new tensor of ones", "full": "a new filled tensor",
    "zeros_like": "a new tensor of zeros", "ones_like": "a new tensor of ones", "empty_like": "a new tensor",
    "mm": "a matrix multiply", "addmm": "a matrix multiply (a Linear layer)", "bmm": "a batched matrix multiply",
    "matmul": "a matrix multiply", "add": "an addition (+)", "mul": "a multiplication (*)", "sub": "a subtraction (-)",
    "div": "a division (/)", "cat": "a concatenation (torch.cat)", "embedding": "an embedding lookup",
    "_log_softmax": "a log-softmax (the loss)", "_softmax": "a softmax", "nll_loss_forward": "the loss",
    "native_layer_norm": "a layer norm", "gelu": "a GELU activation", "silu": "a SiLU activation",
    "_scaled_dot_product_flash_attention_for_cpu": "attention", "_scaled_dot_product_efficient_attention": "attention",
    "_fused_adamw_": "the AdamW step", "_foreach_mul": "the optimizer step", "_foreach_add": "the optimizer step",
    "_foreach_sqrt": "the optimizer step", "_foreach_div": "the optimizer step",
}


def op_said(func) -> str:
    """What the user's code did at ``func`` (one of torch's operations), in words: "a matrix multiply", or for an op
    not in :data:`OPS_SAID` "a tensor operation" with torch's own name for it, last.

    >>> op_said(torch.ops.aten._to_copy.default), op_said(torch.ops.aten.tanh.default)
    ('a copy to another dtype or device (.to(), .float(), .half())', "a tensor operation (torch's tanh)")
    """
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", str(func))
    return OPS_SAID.get(name, OPS_SAID.get(name.rstrip("_"), f"a tensor operation (torch's {name})"))


class TensorPeak:
    """Exact peak of tensor bytes on the CPU, where PyTorch keeps no allocator statistics.

    ``torch.cuda.max_memory_allocated`` has no CPU twin, and a gc walk cannot see the
    activations autograd saves. Inside ``with TensorPeak() as p:`` a
    ``TorchDispatchMode`` sees every tensor an op creates, forward, backward and
    optimizer step alike; a ``weakref.finalize`` on each storage sees it freed. Tensors
    alive at entry are counted too (one gc walk), so ``p.peak_bytes`` is the most tensor
    memory that was alive at once, comparable to CUDA's peak allocated. It costs some
    Python per op: fine for the kit's short, measured runs, not for long training.

    ``limit_bytes``: a memory cap. The moment an op's outputs take the live tensor bytes over it,
    the op raises ``torch.OutOfMemoryError`` ("kit memory cap: live tensors would reach X, over the
    cap of Y"), as CUDA's allocator would on a device of that size: the CPU's simulated small GPU.
    The failed op's outputs are dropped, so ``peak_bytes`` stays under the cap, as CUDA's max
    allocated never counts a failed allocation. Tensors alive at entry count towards it; ``hits``
    counts the errors raised.

    >>> with TensorPeak() as p:
    ...     x = torch.ones(1024, dtype=torch.uint8); y = x + 1; del y
    >>> p.peak_bytes - p.start_bytes
    2048
    >>> with TensorPeak(limit_bytes=p.current_bytes + 1536) as p:   # doctest: +ELLIPSIS
    ...     y = x + 1; z = x + 2
    Traceback (most recent call last):
    torch.OutOfMemoryError: kit memory cap: live tensors would reach ..., over the cap of ..., at an addition (+)
    >>> p.hits, p.peak_bytes - p.start_bytes       # y was counted; z, over the cap, never was
    (1, 1024)
    """

    def __init__(self, device: str = "cpu", limit_bytes: int | None = None):
        if limit_bytes is not None and (isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int)
                                        or limit_bytes <= 0):
            raise ValueError(f"limit_bytes must be a positive whole number of bytes or None, not {limit_bytes!r}.")
        self.device, self.limit_bytes = device, limit_bytes
        self.start_bytes = self.current_bytes = self.peak_bytes = self.hits = 0
        self._sizes: dict[int, int] = {}     # id(storage) -> bytes counted for it
        self._mode = self._would = None
        self._armed = False                  # the cap holds from the first op on, not for what was alive at entry

    def _add(self, storage) -> None:
        # Seen again after an op: a storage can grow in place (``out=`` into an empty tensor, resize_).
        key, n = id(storage), storage.nbytes()
        old = self._sizes.get(key)
        if old is None:
            weakref.finalize(storage, self._free, key)
            old = 0
        if n != old:
            self._sizes[key] = n
            self.current_bytes += n - old
            if self._armed and self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
                self._would = self.current_bytes     # raised once the op's outputs are all counted
            else:
                self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _over(self, would: int, where) -> None:
        # No tensor in this frame: the traceback keeps its frames (and their locals) alive.

        self.hits += 1
        raise torch.OutOfMemoryError(f"kit memory cap: live tensors would reach {fmt_bytes(would)}, "
                                     f"over the cap of {fmt_bytes(self.limit_bytes)}, at {op_said(where)}")

    def _free(self, key: int) -> None:
        self.current_bytes -= self._sizes.pop(key, 0)

    def _track(self, tensor) -> None:
        inner = getattr(tensor, "__tensor_flatten__", None)
        if inner is not None and issubclass(type(tensor), torch.Tensor):
            # A wrapper subclass (DTensor: FSDP2's sharded parameters, their grads and optimizer state) has no
            # storage of its own (its storage() reports the global size with no data): count the tensors inside.
            for name in inner()[0]:
                self._track(getattr(tensor, name))
            return
        if issubclass(type(tensor), torch.Tensor) and str(tensor.device) == self.device and not tensor.is_sparse:
            try:
                storage = tensor.untyped_storage()
            except Exception:  # tensor subclasses without a plain storage (bnb's quantized state)
                return
            self._add(storage)

    def __enter__(self) -> "TensorPeak":
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_map

        for obj in gc.get_objects():
            if issubclass(type(obj), torch.Tensor) and not obj.is_meta:
                self._track(obj)
        self.start_bytes = self.current_bytes
        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tree_map(tracker._track, out)
                if tracker._would is not None:     # over the cap: the outputs are dropped, as never allocated
                    would, tracker._would = tracker._would, None
                    del out
                    tracker._over(would, func)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        # FSDP2 frees and re-allocates its unsharded parameters with ``untyped_storage().resize_``, which
        # runs outside the dispatcher: count a storage's new size when a tensor seen before is resized
        resize = self._resize = torch.UntypedStorage.resize_

        def counted_resize(storage, nbytes):
            out = resize(storage, nbytes)
            if tracker._mode is not None and id(storage) in tracker._sizes:
                tracker._add(storage)
            return out

        torch.UntypedStorage.resize_ = counted_resize
        self._armed = True
        return self

    def __exit__(self, *exc) -> None:
        self._armed = False
        torch.UntypedStorage.resize_ = self._resize
        self._mode.__exit__(*exc)
        self._mode = None


def saved_tensor_bytes(model, batch: dict) -> int:
    """Bytes autograd saves for backward in one forward of ``model(**batch)``: unique storages, weights excluded.

    Counted with ``torch.autograd.graph.saved_tensors_hooks``, so it is what the forward
    really keeps, for any architecture; the estimator's activation replay is checked
    against it.

    >>> saved_tensor_bytes(torch.nn.Linear(8, 8), {"input": torch.ones(4, 8)})   # its input, for the weight's grad
    128
    """
    params = {p.untyped_storage().data_ptr() for p in getattr(model, "parameters", lambda: [])()}
    seen, held = {}, []

    def pack(tensor):
        st = tensor.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        held.append(tensor)   # alive till the count ends, so that no freed storage's address is counted twice
        # The graph keeps nothing: a saved output kept by its own graph is a reference cycle through
        # C++, which Python's gc cannot see, so the graph, its activations and the model would leak.
        return None

    def unpack(_packed):
        raise RuntimeError("saved_tensor_bytes only counts what a forward saves; that forward cannot run backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = model(**batch)
    del out
    held.clear()
    return sum(seen.values())


