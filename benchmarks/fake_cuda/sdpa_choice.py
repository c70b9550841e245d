"""SDPA's backend choice on a CUDA GPU, emulated per architecture, and scaled_dot_product_attention routed to it.

A CPU build of torch has no CUDA choice (``_fused_sdp_choice_stub`` is not registered for CUDA), so on fake "cuda"
tensors SDPA always takes the math path. The rules below are PyTorch's ``select_sdp_backend``
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), read from PyTorch's source at commit 001f694a (main, newer
than 2.13) and held to what torch 2.13 ships:
  - the filters in torch 2.13's own header (torch/include/ATen/native/transformers/sdp_utils_cpp.h): masks,
    shapes, grouped-query heads (``check_batch_size_and_num_heads_dense<supports_gqa, requires_same_num_heads>``,
    without main's MQA parameter);
  - memory-efficient attention without grouped-query support: torch 2.13's meta kernel for its backward assumes
    equal query and key/value head counts (a GQA call fails), where main admits GQA in that kernel. Whether a GPU
    running torch 2.13 takes the efficient kernel or math for fp32 + GQA is a question only a GPU settles.
Which kernel a GPU picks is read from source here; what each kernel saves comes from PyTorch's meta kernels.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

GPUS = {  # compute capability, memory torch sees, SM count
    "T4": dict(name="Tesla T4", major=7, minor=5, total_memory=15_828_320_256, sm_count=40),
    "L4": dict(name="NVIDIA L4", major=8, minor=9, total_memory=23_580_639_232, sm_count=58),
    "A100": dict(name="NVIDIA A100-SXM4-80GB", major=8, minor=0, total_memory=85_097_971_712, sm_count=108),
    "H100": dict(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=85_021_163_520, sm_count=132),
    "H200": dict(name="NVIDIA H200", major=9, minor=0, total_memory=150_110_011_392, sm_count=132),
}

# The cuDNN runtime version assumed (9.19): sdp_utils.cpp puts cuDNN attention first on sm90/sm10x when the runtime
# cuDNN is newer than 9.15. Not checked on a GPU with torch 2.13.
CUDNN_VERSION = 91900
EFFICIENT_SUPPORTS_GQA = False  # torch 2.13 (see the module docstring)


def _sm(gpu) -> tuple:
    return gpu["major"], gpu["minor"]


def priority_order(gpu) -> list:
    prefers_cudnn = CUDNN_VERSION > 91500 and gpu["major"] in (9, 10)
    default = ["flash", "efficient", "math", "cudnn"]
    return ["cudnn", "flash", "efficient", "math"] if prefers_cudnn else default


def _heads_ok(q, k, v, enable_gqa: bool, supports_gqa: bool) -> bool:
    """check_batch_size_and_num_heads_dense (torch 2.13's header)."""
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if enable_gqa and supports_gqa:
        return hk == hv and hq % hk == 0
    return hq == hk == hv


def _dense_ok(q, k, v) -> bool:
    """check_tensor_shapes, check_nonzero_sequence_lengths_dense, the last dimension's stride 1."""
    return (q.dim() == k.dim() == v.dim() == 4 and min(q.shape[-2], k.shape[-2]) > 0
            and all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (q, k, v)))


def _mask_shape_ok(q, k, mask) -> bool:
    """check_attn_mask_shape."""
    if mask is None:
        return True
    if mask.requires_grad:
        return False

    def fits(mask_dim, dim):
        return mask_dim in (dim, 1)

    if not (fits(mask.shape[-2], q.shape[2]) and fits(mask.shape[-1], k.shape[2])):
        return False
    return mask.dim() == 2 or (mask.dim() == 4 and fits(mask.shape[0], q.shape[0]) and fits(mask.shape[1], q.shape[1]))


def can_use_flash(gpu, q, k, v, mask, dropout_p, is_causal, enable_gqa, requires_grad) -> bool:
    head = q.shape[-1]
    if mask is not None or not _dense_ok(q, k, v) or not (head == k.shape[-1] == v.shape[-1] <= 256):
        return False
    if not (8, 0) <= _sm(gpu) <= (12, 1):
        return False
    if requires_grad and ((8, 6) <= _sm(gpu) <= (8, 9) or (12, 0) <= _sm(gpu) <= (12, 1)):
        if not (head <= 192 or (dropout_p == 0 and head > 224)):
            return False
    if is_causal and q.shape[-2] != k.shape[-2]:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False
    return _heads_ok(q, k, v, enable_gqa, supports_gqa=True)


def _gemm_alignment(gpu, dtype) -> int:
    """minimum_gemm_alignment."""
    is_half = dtype in (torch.float16, torch.bfloat16)
    tensor_cores = gpu["major"] >= 8 or (gpu["major"] >= 7 and is_half)
    alignment = 4 if gpu["major"] >= 8 else 1
    return max(alignment, 128 // (16 if is_half else 32)) if tensor_cores else alignment


def can_use_efficient(gpu, q, k, v, mask, dropout_p, is_causal, enable_gqa, requires_grad) -> bool:
    if not (5, 0) <= _sm(gpu) <= (12, 1) or not _dense_ok(q, k, v):
        return False
    alignment = _gemm_alignment(gpu, q.dtype)
    dq, dv = q.shape[-1], v.shape[-1]
    if not (dq == k.shape[-1] and dq % alignment == 0 and dv % alignment == 0 and dq > 0 and dv > 0):
        return False
    if gpu["major"] >= 8:  # check_data_ptr_alignment_mem_efficient: storage offsets aligned
        alignment_bytes = alignment * q.element_size()
        if any(t.numel() and (t.storage_offset() * t.element_size()) % alignment_bytes for t in (q, k, v)):
            return False
    if not _heads_ok(q, k, v, enable_gqa, supports_gqa=EFFICIENT_SUPPORTS_GQA):
        return False
    dtypes = (torch.float16, torch.float32, torch.bfloat16) if gpu["major"] >= 8 else (torch.float16, torch.float32)
    return q.dtype in dtypes


def can_use_cudnn(gpu, q, k, v, mask, dropout_p, is_causal, enable_gqa, requires_grad) -> bool:
    if dropout_p > 0 and 91100 < CUDNN_VERSION < 91400:
        return False
    if not _dense_ok(q, k, v) or not _mask_shape_ok(q, k, mask) or not (8, 0) <= _sm(gpu) <= (12, 1):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or dropout_p * 16 != math.floor(dropout_p * 16):
        return False
    if q.shape[0] > 65535 or q.shape[1] > 65535 or k.shape[2] == 1 or (dropout_p and q.shape[2] == 1):
        return False
    d_qk, d_v = q.shape[-1], v.shape[-1]
    sm90_or_10x = (gpu["major"] == 9 and gpu["minor"] == 0) or gpu["major"] == 10
    limit = 256 if sm90_or_10x and CUDNN_VERSION > 92200 else 128
    if not (d_qk <= limit and d_v <= limit and d_qk % 8 == 0 and d_v % 8 == 0):
        return False
    if requires_grad and limit == 256 and not (max(d_qk, d_v) <= 128 or d_qk == d_v == 256):
        return False
    return _heads_ok(q, k, v, enable_gqa, supports_gqa=True)


CAN_USE = {"flash": can_use_flash, "efficient": can_use_efficient, "cudnn": can_use_cudnn}


def choose(gpu, q, k, v, mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False) -> str:
    """The backend select_sdp_backend picks: "flash", "efficient", "cudnn" or "math"."""
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    for backend in priority_order(gpu):
        if backend == "math" or CAN_USE[backend](gpu, q, k, v, mask, dropout_p, is_causal, enable_gqa,
                                                 requires_grad):
            return backend
    return "math"


def _additive_mask(mask, dtype):
    """convert_boolean_attn_mask: a boolean mask becomes a new additive one (0 / -inf) in the query's dtype."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), -math.inf, torch.zeros((), dtype=dtype, device=mask.device)).to(dtype)


def _pad_last_dim(t, alignment):
    extra = -t.shape[-1] % alignment
    return F.pad(t, (0, extra)) if extra else t


class RoutedSDPA:
    """scaled_dot_product_attention as attention.cpp runs it on CUDA, with the emulated choice. ``counts`` tallies
    the backends taken; ``choices`` holds, for each GPU in ``probes`` (name -> properties), the backend it would
    have picked at each call, in order: a GPU whose list equals the routed GPU's would have run the same kernels on
    the same tensors."""

    def __init__(self, gpu, original, probes=None):
        self.gpu = gpu
        self.original = original
        self.counts = {}
        self.probes = probes or {}
        self.choices = {name: [] for name in self.probes}

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        if query.device.type != "cuda":
            return self.original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                 scale=scale, enable_gqa=enable_gqa)
        if not torch.is_autocast_enabled("cuda"):
            return self._route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # Autocast lists scaled_dot_product_attention as a lower-precision op: its floating inputs are cast to the
        # autocast dtype (new tensors where they differ, e.g. Llama's fp32 q and k after RoPE), and the kernels
        # below it run with autocast off.
        dtype = torch.get_autocast_dtype("cuda")
        query, key, value = (t.to(dtype) for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
        with torch.autocast("cuda", enabled=False):
            return self._route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _route(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        backend = choose(self.gpu, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        self.counts[backend] = self.counts.get(backend, 0) + 1
        for name, probe in self.probes.items():
            self.choices[name].append(choose(probe, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa))
        aten = torch.ops.aten
        logsumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if backend == "cudnn":
            return aten._scaled_dot_product_cudnn_attention(query, key, value, _additive_mask(attn_mask, query.dtype),
                                                            logsumexp, dropout_p, is_causal, False, scale=scale)[0]
        if backend == "flash":
            head = query.shape[-1]
            scale = scale if scale is not None else 1 / math.sqrt(head)
            out = aten._scaled_dot_product_flash_attention(_pad_last_dim(query, 8), _pad_last_dim(key, 8),
                                                           _pad_last_dim(value, 8), dropout_p, is_causal, False,
                                                           scale=scale)[0]
            return out[..., :head] if out.shape[-1] != head else out
        if backend == "efficient":
            mask = _additive_mask(attn_mask, query.dtype)
            if mask is not None:  # preprocess_mask: padded to 8 along the last dim unless aligned, then expanded
                if any(s % 8 for s in mask.stride()[:-1]) or mask.stride(-1) != 1:
                    mask = F.pad(mask, (0, 8 - mask.shape[-1] % 8))[..., :mask.shape[-1]]
                mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            return aten._scaled_dot_product_efficient_attention(query, key, value, mask, logsumexp, dropout_p,
                                                                is_causal, scale=scale)[0]
        return aten._scaled_dot_product_attention_math(query, key, value, _additive_mask(attn_mask, query.dtype),
                                                       dropout_p, is_causal, None, scale=scale,
                                                       enable_gqa=enable_gqa)[0]


def route_sdpa(gpu, probes=None) -> RoutedSDPA:
    """Replace torch.nn.functional.scaled_dot_product_attention (what transformers calls) by the routed one."""
    original = F.scaled_dot_product_attention
    routed = RoutedSDPA(gpu, getattr(original, "original", original), probes)  # a second call replaces the first
    F.scaled_dot_product_attention = routed
    return routed
