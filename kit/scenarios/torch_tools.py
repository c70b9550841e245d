"""PyTorch's own memory tools, as the notebooks teach them: the three counters of the CUDA caching allocator, and
one step's allocator history for https://pytorch.org/memory_viz.

The notebook cells call torch themselves (that is the skill to carry away: ``torch.cuda.memory_allocated()``,
``max_memory_allocated()``, ``memory_reserved()``, ``torch.cuda.memory._record_memory_history`` and
``_dump_snapshot``). This module only sets torch's readings beside the kit's estimate of the same setup, and says
in words what a CPU cannot show.

>>> print(counters_beside(None, 3 * 2**30, 5 * 2**30, 6 * 2**30))
torch.cuda.memory_allocated()       3.00 GiB  held by tensors now
torch.cuda.max_memory_allocated()   5.00 GiB  the most held at once since the last reset (MEASURED)
torch.cuda.memory_reserved()        6.00 GiB  held by the caching allocator: the tensors' blocks + its cache
"""
from __future__ import annotations

from kit.units import fmt_bytes, wrapped

VIZ = "https://pytorch.org/memory_viz"


@wrapped
def counters_beside(est, allocated: int, max_allocated: int, reserved: int) -> str:
    """torch's three counters, read by the notebook's own cell, beside ``est`` (an Estimate of the same setup,
    or None): its predicted peak is a prediction of ``max_memory_allocated()``, never of ``memory_reserved()``."""
    lines = [f"torch.cuda.memory_allocated()      {fmt_bytes(allocated):>9}  held by tensors now",
             f"torch.cuda.max_memory_allocated()  {fmt_bytes(max_allocated):>9}  the most held at once since the last "
             "reset (MEASURED)",
             f"torch.cuda.memory_reserved()       {fmt_bytes(reserved):>9}  held by the caching allocator: the "
             "tensors' blocks + its cache"]
    if est is not None:
        lines.append(f"the kit's ESTIMATED peak of the same setup: {fmt_bytes(est.peak_bytes)} "
                     f"(max allocated / estimate = {max_allocated / est.peak_bytes:.3f}); reserved - allocated "
                     f"= {fmt_bytes(reserved - allocated)} is cache that torch.cuda.empty_cache() could hand back")
    return "\n".join(lines)


@wrapped
def cpu_text() -> str:
    """What the counters and the history would show, said where there is no GPU (nothing is read or made up).

    >>> "not on a CPU" in cpu_text()
    True
    """
    return ("No GPU here, so torch's CUDA counters read nothing (not on a CPU: there is no caching allocator). On a "
            "GPU, memory_allocated() is what tensors hold now, max_memory_allocated() the peak the kit's estimate "
            "predicts, and memory_reserved() that plus the allocator's cache (what nvidia-smi shows, less the CUDA "
            "context). The history would record every allocation and free of the step, with its Python stack, for "
            f"{VIZ}.")


def snapshot_text(path) -> str:
    """How to open a dumped allocator history.

    >>> snapshot_text("one_step.pickle").startswith("Saved one_step.pickle")
    True
    """
    return (f"Saved {path}: download it (Colab: the Files pane, right-click, Download), open {VIZ} and drag the file "
            "onto the page. 'Active Memory Timeline' draws every tensor alive over the step; click a band to see the "
            "line of Python that allocated it.")
