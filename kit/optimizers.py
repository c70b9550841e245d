"""Every optimizer the kit models, in one place: its names (the kit's, ``TrainingArguments.optim``'s, the torch,
bitsandbytes or transformers class's), its state bytes from each parameter's shape and dtype, the temporaries its
step makes, whether its state is paged and whether a tensor over 2^31 elements kills it, and its notes.

Adding an optimizer is one :class:`Optimizer` in :data:`ROOM` (and its rules beside it); the estimate, the CLI, the
panel, the advisor's objects and ``kit.watch_loop`` read it from here.

>>> state_bytes("adafactor", (4096, 1024), 4)     # factored: one fp32 row and one fp32 column, and its RMS
(20484, 0)
>>> kit_name("adamw_bnb_8bit"), trainer_optim("paged-adamw")
('adamw-8bit', 'paged_adamw_32bit')
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kit.inputs import InputError

PAGED_FROM = 100_000   # bitsandbytes pages a state of at least this many elements (F.get_paged, get_state_buffer)
FP32 = 4


def _adamw(shape, dtype_bytes, embedding):
    """exp_avg + exp_avg_sq, ``zeros_like(param)``."""
    return 2 * math.prod(shape) * dtype_bytes, 0


def _momentum(shape, dtype_bytes, embedding):
    """SGD's momentum_buffer, ``clone(grad)``."""
    return math.prod(shape) * dtype_bytes, 0


def _paged_adamw(shape, dtype_bytes, embedding):
    """PagedAdamW32bit: two fp32 states whatever the weight's dtype (``Optimizer2State.init_state``), paged from
    :data:`PAGED_FROM` elements (``get_state_buffer``)."""
    n = math.prod(shape)
    return (0, 8 * n) if n >= PAGED_FROM else (8 * n, 0)


def _adamw_8bit(shape, dtype_bytes, embedding, paged=False):
    """Two uint8 states + one fp32 absmax per 256 elements for each; tensors under ``min_8bit_size=4096`` elements,
    and ``nn.Embedding`` weights (Trainer's ``register_module_override``), keep two fp32 states."""
    n = math.prod(shape)
    paged = paged and n >= PAGED_FROM
    if n < 4096 or embedding:
        return (0, 8 * n) if paged else (8 * n, 0)
    absmax = 2 * FP32 * -(-n // 256)
    return (absmax, 2 * n) if paged else (2 * n + absmax, 0)


def _paged_adamw_8bit(shape, dtype_bytes, embedding):
    return _adamw_8bit(shape, dtype_bytes, embedding, paged=True)


def _no_state(shape, dtype_bytes, embedding):
    """SGD without momentum: ``param.add_(grad, alpha=-lr)``, no state kept (``self.state`` stays empty)."""
    return 0, 0


def _adafactor(shape, dtype_bytes, embedding):
    """transformers' Adafactor, as Trainer builds it (``beta1=None``: no first moment), from its ``step``: the grad is
    made fp32 first and every state follows it (``.to(grad)``). A tensor of 2 or more dimensions keeps factored
    second moments, ``exp_avg_sq_row`` (``shape[:-1]``) and ``exp_avg_sq_col`` (``shape[:-2] + shape[-1:]``);
    a 1-D one the full ``exp_avg_sq``. Each keeps its ``RMS``, a 0-d fp32 tensor."""
    if len(shape) >= 2:
        kept = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        kept = math.prod(shape)
    return FP32 * (kept + 1), 0


def _muon(shape, dtype_bytes, embedding):
    """torch.optim.Muon: one ``momentum_buffer`` (``zeros_like(grad)``) for each 2-D parameter; it refuses any
    other, so a tensor of another shape (left to no optimizer) keeps none."""
    return (math.prod(shape) * dtype_bytes, 0) if len(shape) == 2 else (0, 0)


def _foreach_adamw_temporaries(tensors, device):
    """AdamW's sqrt(exp_avg_sq) / bias_correction, per (weight-decay group, dtype) as Trainer groups them. CUDA:
    the foreach step makes one for every tensor of a group at once; the CPU: one tensor at a time, and the
    last tensor's denominator is still alive."""
    groups = {}
    for shape, dtype_bytes, decays in tensors:
        groups.setdefault((decays, dtype_bytes), []).append(math.prod(shape) * dtype_bytes)
    return max((sum(gr) if device == "cuda" else max(2 * b + (gr[i - 1] if i else 0) for i, b in enumerate(gr))
                for gr in groups.values()), default=0)


def _paged_adamw_temporaries(tensors, device):
    """bitsandbytes 0.50's CPU Adam (backends/cpu/ops.py, _optimizer_update_32bit_cpu), one tensor at a time in
    torch ops: g * scale, sqrt(v) + eps, m / that: 3 fp32 copies of an fp32 tensor alive at once; of a 16-bit one
    also g.float() and p.float(): 4. (On CUDA one fused kernel makes none.)"""
    if device != "cpu":
        return 0
    return max(((12 if dt == FP32 else 16) * math.prod(shape) for shape, dt, _ in tensors), default=0)


def _adafactor_temporaries(tensors, device):
    """One tensor at a time (``Adafactor.step``), in Trainer's group order (weight decay first): ``grad**2`` and
    ``+ eps`` while the last tensor's ``update`` is still bound, then the factored estimate ``r_factor * c_factor``
    (rows and columns) beside the update, then ``-update``: two fp32 tensors of the parameter's size and the larger
    of those; a 16-bit grad and weight add their fp32 copies (``grad.float()``, ``p.float()``)."""
    peak, last = 0, 0
    for shape, dtype_bytes, _ in sorted(tensors, key=lambda tensor: not tensor[2]):
        n = math.prod(shape)
        factors = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1] if len(shape) >= 2 else 0
        peak = max(peak, FP32 * (2 * n + max(last, factors)) + (2 * FP32 * n if dtype_bytes != FP32 else 0))
        last = n
    return peak


def _muon_temporaries(tensors, device):
    """One 2-D tensor at a time (``_single_tensor_muon``; no foreach): the Nesterov update ``grad.lerp(buf)`` in the
    grad's dtype, alive through the Newton-Schulz iteration, which works in bf16 on ``X`` (m x n) and its s x s
    Gram matrices (s = min(m, n)): a new ``X`` beside the old and two Gram matrices, or three Gram matrices."""
    def one(shape, dtype_bytes):
        if len(shape) != 2:
            return 0
        mn, s = math.prod(shape), min(shape)
        return mn * dtype_bytes + 2 * max(2 * mn + 2 * s * s, mn + 3 * s * s)

    return max((one(shape, dt) for shape, dt, _ in tensors), default=0)


def _none(tensors, device):
    return 0


# bitsandbytes' 8-bit optimizer kernels index a tensor with a 32-bit int: on a tensor of more elements they print
# "Error invalid argument ... ops.cu" and kill the process, no exception raised (seen on an H200 with scenario 1's
# head, docs/known-failures.md)
INT32_MAX = 2**31 - 1


def over_int32(elements: int) -> bool:
    """True where a tensor of ``elements`` elements is past what bitsandbytes' 8-bit optimizers can index.

    >>> over_int32(2**31 - 1), over_int32(2**31)
    (False, True)
    """
    return elements > INT32_MAX


@dataclass(frozen=True)
class Optimizer:
    """One optimizer: its names, what it keeps and what its step makes.

    ``state(shape, dtype_bytes, embedding) -> (bytes the allocator holds, bytes paged outside it)`` for one
    trainable tensor; ``temporaries(tensors, device) -> bytes`` at the step's highest moment, over the trainable
    ``tensors`` as ``[(shape, dtype bytes, decays)]`` in the order Trainer hands them over."""

    name: str                    # the kit's
    optim: tuple = ()            # TrainingArguments.optim's names; the first is the one the kit writes
    classes: tuple = ()          # the class names it is read from
    state: object = _adamw
    temporaries: object = _none
    paged: bool = False          # state in CUDA managed memory, outside max_memory_allocated
    int32_limit: bool = False    # bitsandbytes' 8-bit kernels kill the process on a tensor of >= 2^31 elements
    note: str = ""               # said on every estimate that uses it
    flat: bool = True            # its state depends on the element count alone (sharded strategies model those)
    label: str = ""              # what the CLI's help says of it, beside its TrainingArguments.optim name


ROOM = {o.name: o for o in (
    # adamw-fused is Trainer's default in transformers 5 (TrainingArguments().optim): one fused kernel per step,
    # no full-size temporaries, on CUDA and on the CPU; adamw is adamw_torch's foreach step, which makes them.
    Optimizer(name="adamw-fused", optim=("adamw_torch_fused",), label="Trainer's default"),
    Optimizer(name="adamw", optim=("adamw_torch",), temporaries=_foreach_adamw_temporaries),
    Optimizer(name="adamw-8bit", optim=("adamw_bnb_8bit", "adamw_8bit"), classes=("AdamW8bit", "Adam8bit"),
              state=_adamw_8bit,
              int32_limit=True),
    Optimizer(name="paged-adamw-8bit", optim=("paged_adamw_8bit",), classes=("PagedAdamW8bit", "PagedAdam8bit"),
              state=_paged_adamw_8bit,
              paged=True, int32_limit=True),
    Optimizer(name="paged-adamw", optim=("paged_adamw_32bit",), classes=("PagedAdamW32bit", "PagedAdamW",
                                                                         "PagedAdam32bit"),
              state=_paged_adamw, temporaries=_paged_adamw_temporaries, paged=True,
              label="the state in CUDA managed memory, paged to RAM"),
    Optimizer(name="sgd", optim=("sgd",), classes=("SGD",), state=_momentum, label="with momentum",
              note="sgd counts a momentum buffer: TrainingArguments(optim='sgd', optim_args='momentum=0.9')"),
    # TrainingArguments(optim="sgd") without optim_args is this one too; kit.estimate.read_training asks for a momentum
    Optimizer(name="sgd-plain", optim=(), classes=("SGD",), state=_no_state, label="without momentum: no state",
              note="sgd-plain keeps no optimizer state (SGD without momentum): step 1 and the later steps hold the "
                   "same"),
        Optimizer(name="adafactor", optim=("adafactor",), classes=("Adafactor",), state=_adafactor,
                  temporaries=_adafactor_temporaries, flat=False,
              label="transformers' Adafactor: factored second moments"),
    # torch.optim.Muon has no TrainingArguments.optim name: it is read from the optimizer object
    # (Trainer(optimizers=(muon, None)), kit.watch_loop's optimizer) or named in estimate(optimizer="muon").
    Optimizer(name="muon", optim=(), classes=("Muon",), state=_muon, temporaries=_muon_temporaries, flat=False,
              note="Muon keeps a momentum buffer for each 2-D parameter only (torch.optim.Muon refuses others); "
                   "any other trainable tensor gets its gradient and no state"),
)}
# TrainingArguments.optim -> the kit's name (sgd: only with a momentum, as kit.estimate.read_training checks)
BY_OPTIM = {optim: o.name for o in ROOM.values() for optim in o.optim}
# the kit's name -> the TrainingArguments.optim it writes, for those that have one (the CLI's and panel's choices)
TRAINER_OPTIM = {o.name: o.optim[0] for o in ROOM.values() if o.optim}


def choices_help() -> str:
    """The CLI's help for ``--optimizer``: each choice with its ``TrainingArguments.optim`` name."""
    def said(entry):
        inside = [text for text in (entry.optim[0] if entry.optim[0] != entry.name else "", entry.label) if text]
        return f"{entry.name} ({', '.join(inside)})" if inside else entry.name

    choices = ", ".join(said(o) for o in ROOM.values() if o.optim)
    return f"{choices}; the TrainingArguments.optim names in brackets work too"


def kit_name(optim: str) -> str | None:
    """The kit's name of a ``TrainingArguments.optim`` (None: not modeled)."""
    return BY_OPTIM.get(optim)


def trainer_optim(name: str) -> str | None:
    """The ``TrainingArguments.optim`` the kit writes for one of its optimizers (None: it has none)."""
    return TRAINER_OPTIM.get(name)


def state_bytes(name: str, shape, dtype_bytes: int, embedding: bool = False) -> tuple[int, int]:
    """(bytes the allocator holds, bytes paged outside it) of one trainable tensor's state.

    >>> state_bytes("adamw-8bit", (1024, 1024), 4)
    (2129920, 0)
    """
    return ROOM[name].state(tuple(shape), dtype_bytes, embedding)


def step_temporaries(name: str, tensors, device: str) -> int:
    """Bytes of the temporaries alive at the optimizer step's highest moment (see :class:`Optimizer`)."""
    return ROOM[name].temporaries(tensors, device)


def unwrap(optimizer):
    """The optimizer inside accelerate's ``AcceleratedOptimizer`` (which Trainer's ``train()`` makes), else itself."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if inner is not None and hasattr(inner, "param_groups") else optimizer


def name_of(optimizer) -> str:
    """The kit's name for an optimizer object (torch, bitsandbytes, transformers); one sentence that names its
    class where the kit does not model it. accelerate's ``AcceleratedOptimizer`` is read through ``.optimizer``.

    >>> import torch
    >>> name_of(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True))
    'adamw-fused'
    >>> name_of(torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))]))   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: The optimizer is a torch.optim.adagrad.Adagrad, which the kit does not model (...
    """
    optimizer = unwrap(optimizer)
    cls, defaults = type(optimizer), getattr(optimizer, "defaults", {})
    bits = getattr(getattr(optimizer, "args", None), "optim_bits", None)
    if cls.__module__.startswith("bitsandbytes") and bits and \
            cls.__name__.removeprefix("Paged").removesuffix("8bit").removesuffix("32bit") in ("AdamW", "Adam"):
        # Trainer makes bitsandbytes.optim.AdamW(optim_bits=, is_paged=) for all of its names: read those two
        found = {(8, False): "adamw-8bit", (8, True): "paged-adamw-8bit", (32, True): "paged-adamw"}.get(
            (bits, bool(getattr(optimizer, "is_paged", False))))
        if found:
            return found
    elif cls.__name__ in ("AdamW", "Adam"):   # torch's: the same two moments a parameter
        return "adamw-fused" if defaults.get("fused") else "adamw"
    found = next((o.name for o in ROOM.values() if cls.__name__ in o.classes and not cls.__module__.startswith(
        "bitsandbytes")), None)
    if found == "sgd" and not defaults.get("momentum"):
        found = "sgd-plain"          # no momentum buffer: no state at all
    why = {"adafactor": "Adafactor with beta1 (a first moment)" if defaults.get("beta1") is not None else "",
           "muon": "Muon with nesterov=False" if not defaults.get("nesterov", True) else ""}.get(found, "")
    if found and not why:
        return found
    known = ", ".join(dict.fromkeys(["AdamW", "Adam"] + [o.classes[0] for o in ROOM.values() if o.classes]))
    what = why or f"a {cls.__module__}.{cls.__qualname__}"
    raise InputError("optimizer", f"The optimizer is {what}, which the kit does not model (it models {known}), "
                                  "so it makes no estimate rather than one as if it were AdamW.",
                     code="optimizer-not-modeled")
