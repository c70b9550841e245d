"""Which kernel CUDA's ``scaled_dot_product_attention`` runs, per GPU architecture, as torch 2.13 picks it.

Read from PyTorch's source (``select_sdp_backend`` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp and the
filters of torch 2.13's ``sdp_utils_cpp.h``), not yet measured on a GPU. The kit's own code: the fake-CUDA meter
in benchmarks/ reads the same source separately, so that the two can check each other.

- cuDNN attention comes first on sm90 (the runtime cuDNN newer than 9.15), then flash, memory-efficient, math;
  elsewhere flash, memory-efficient, math.
- Flash: fp16/bf16 only, sm80 and up, no mask, head dim up to 256 (sm86-sm89 with a backward: up to 192, or over
  224 without dropout); it takes grouped-query heads.
- Memory-efficient: sm50 and up; bf16 only from sm80; head dims aligned to the GEMM's alignment; torch 2.13's
  kernel does not take grouped-query heads (its meta kernel's backward assumes equal head counts).
- cuDNN: fp16/bf16, sm80 and up, head dim a multiple of 8 up to 128, dropout in sixteenths.
- Otherwise the math path: it saves the ``[B, heads, S, S]`` probabilities, and with grouped-query heads
  (transformers passes ``enable_gqa`` when there is no mask) it copies k and v up to the query's heads.

>>> sdpa_kernel((9, 0), "fp32", masked=False, gqa=True, head_dim=64), sdpa_kernel((7, 5), "bf16", True, False, 64)
('math', 'math')
>>> sdpa_kernel((8, 0), "bf16", False, True, 64), sdpa_kernel((9, 0), "fp16", True, False, 64)
('flash', 'cudnn')
>>> sdpa_kernel((7, 5), "fp16", True, False, 64), sdpa_kernel(None, "fp32", False, True, 64)
('efficient', None)
"""
from __future__ import annotations

TORCH_RULES = "2.13"
CUDNN_VERSION = 91900   # the runtime cuDNN assumed (torch 2.13's CUDA wheels); not read from a GPU
NAMES = {"flash": "flash attention", "efficient": "memory-efficient attention", "cudnn": "cuDNN attention",
         "math": "SDPA's math path"}


def _flash(sm, dtype, masked, head_dim, dropout) -> bool:
    if masked or dtype == "fp32" or not (8, 0) <= sm <= (12, 1) or head_dim > 256:
        return False
    if (8, 6) <= sm <= (8, 9) or (12, 0) <= sm <= (12, 1):   # a training call has a backward
        return head_dim <= 192 or (dropout == 0 and head_dim > 224)
    return True


def _gemm_alignment(sm, dtype) -> int:
    """minimum_gemm_alignment, in elements."""
    half = dtype != "fp32"
    tensor_cores = sm >= (8, 0) or (sm >= (7, 0) and half)
    alignment = 4 if sm >= (8, 0) else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def _efficient(sm, dtype, gqa, head_dim) -> bool:
    if not (5, 0) <= sm <= (12, 1) or gqa or head_dim % _gemm_alignment(sm, dtype):
        return False
    return dtype != "bf16" or sm >= (8, 0)


def _cudnn(sm, dtype, head_dim, dropout) -> bool:
    return (dtype != "fp32" and (8, 0) <= sm <= (12, 1) and head_dim <= 128 and head_dim % 8 == 0
            and (dropout * 16).is_integer())


def sdpa_kernel(sm, dtype: str, masked: bool, gqa: bool, head_dim: int, dropout: float = 0.0) -> str | None:
    """The kernel torch 2.13's CUDA SDPA picks on compute capability ``sm`` (a (major, minor) pair; None: not known,
    and so None): "cudnn", "flash", "efficient" or "math". ``dtype``: the inputs' ("fp32", "fp16", "bf16", after
    autocast); ``masked``: an attention mask is passed; ``gqa``: fewer key/value heads than query heads reach it
    (``enable_gqa``); ``dropout``: its dropout probability."""
    if sm is None:
        return None
    sm = tuple(sm)
    prefers_cudnn = CUDNN_VERSION > 91500 and sm[0] in (9, 10)
    if prefers_cudnn and _cudnn(sm, dtype, head_dim, dropout):
        return "cudnn"
    if _flash(sm, dtype, masked, head_dim, dropout):
        return "flash"
    if _efficient(sm, dtype, gqa, head_dim):
        return "efficient"
    return "math"
