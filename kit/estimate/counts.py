"""Stage 1 of an estimate (:mod:`kit.estimate.assembly` has the three): one walk over the model's layers, counting
weights as loaded and as trained (4-bit, 8-bit, LoRA adapters, the k-bit recipe's fp32 upcast), gradients,
optimizer state and the CPU RAM to build it, summed and per part (``"embed"``, ``"block"``, ``"head"``), and the
per-leaf tensors :mod:`kit.estimate.reserved` lays out.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from math import prod

from kit import optimizers
from kit.estimate import quantization
from kit.estimate import replay
from kit.estimate.inventory import Info, in_module
from kit.presets import int8_bytes, nf4_bytes

PARTS = ("embed", "block", "head")


@dataclass
class Counts:
    """Stage 1: what the layers hold, summed over the model and per part."""

    params: int = 0
    trainable: int = 0
    weights: int = 0            # on the device, as trained
    loaded: int = 0             # as from_pretrained leaves them, before the k-bit recipe
    quantized: int = 0          # parameters in 4-bit/8-bit layers
    unquantized: int = 0
    build: int = 0              # CPU RAM for what is built in RAM
    streamed: int = 0           # ... and the largest tensor a k-bit load streams through it
    optimizer: int = 0
    paged: int = 0              # optimizer state outside the allocator (paged 8-bit AdamW)
    halves: int = 0             # autocast's half copies of trainable Linear weights
    moved: int = 0              # a tied weight's grad, made first by the head
    grads: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    wtemp: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))      # backward temporaries
    wnew: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))       # ... plus a new grad (accumulating)
    part_weights: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    part_optimizer: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    part_trainable: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    trained: list = field(default_factory=list)  # (shape, dtype bytes, decays) of each trainable tensor, in order
    offenders: list = field(default_factory=list)  # (module, params, training bytes)
    # per leaf, in module order: (part, weight bytes, [(grad bytes, optimizer state bytes in the allocator)] per
    # trainable tensor): the tensors kit.estimate.reserved lays out
    tensors: list = field(default_factory=list)

    @property
    def gradients(self) -> int:
        return sum(self.grads.values())


COUNTED: dict = {}   # count_key -> (the Info, its Counts): the walk does not depend on batch or sequence
COUNTED_KEPT = 256


# The plan's fields the walk never reads, and that the advisor's candidates vary most: they stay out of the key.
NOT_COUNTED = frozenset({"batch_size", "seq_len", "grad_accum", "evaluation", "padded", "attn_implementation",
                         "gradient_checkpointing", "checkpoint_reentrant", "lora_dropout", "input_require_grads",
                         "offload", "task"})


def count_key(info: Info, plan) -> tuple:
    """Every field of ``plan`` but :data:`NOT_COUNTED`, with ``info``'s identity: equal keys, equal counts. (Built
    from the plan's fields, so that a field added to the plan is in the key without a second edit here.)"""
    def hashable(value):
        if isinstance(value, (set, frozenset)):
            return frozenset(value)
        return repr(sorted(value.items())) if isinstance(value, dict) else value

    return (id(info),) + tuple(hashable(getattr(plan, f.name)) for f in fields(plan) if f.name not in NOT_COUNTED)


def count_parameters(info: Info, plan) -> Counts:
    """Stage 1: one pass over the layers, as ``plan`` (a :class:`kit.estimate.assembly.Plan`) says; made once per
    model and the options it reads (:func:`count_key`), and shared: read it, never change it. The fit advisor's
    and the panel's many estimates of one model differ mostly in batch and sequence, which it does not read."""
    key = count_key(info, plan)
    kept = COUNTED.get(key)
    if kept is not None and kept[0] is info:   # (the Info is kept too, so its id is not reused meanwhile)
        return kept[1]
    if len(COUNTED) >= COUNTED_KEPT:
        del COUNTED[next(iter(COUNTED))]   # the oldest
    COUNTED[key] = (info, _count(info, plan))
    return COUNTED[key][1]


def _count(info: Info, plan) -> Counts:
    c, other = Counts(), plan.trained_bytes
    # the plan's derived dtypes, read once (a 70B model has over a thousand leaves, and the advisor counts often)
    loaded_as, half_as = plan.load_bytes, plan.half
    for l in info.leaves:
        n = l.weight + l.bias
        q = plan.quantization if l.quantizable else "none"
        packed = nf4_bytes(l.weight, double_quant=plan.bnb.double_quant) if q == "4bit" else \
            int8_bytes(l.fin, l.fout) if q == "8bit" else None      # a k-bit layer's weight, as loaded
        w_bytes = n * other if packed is None else quantization.weight_bytes(l, q, plan.bnb, other)
        c.params += n
        # CPU RAM to build: a k-bit model loads straight onto the GPU (bitsandbytes needs a device map, which
        # transformers sets to the current GPU), one tensor at a time through RAM; a plain from_pretrained, and
        # a layer the user's own __init__ makes (a head on the logits), build it all in RAM
        if plan.quantization == "none" or l.name in info.head_layers:
            c.build += n * loaded_as
        else:
            c.streamed = max(c.streamed, l.weight * loaded_as)
        c.loaded += n * loaded_as if packed is None else packed + l.bias * loaded_as
        if packed is not None:
            c.quantized += l.weight
        else:
            c.unquantized += n
        pieces = []   # (trainable elements, bytes per element, shape)
        if l.name in plan.lora_modules:  # peft keeps adapters in fp32 (autocast_adapter_dtype=True); TRL: bf16 on k-bit
            pieces = [(plan.lora_r * l.fin, plan.adapter_dtype, (plan.lora_r, l.fin)),      # lora_A: [r, in]
                      (plan.lora_r * l.fout, plan.adapter_dtype, (l.fout, plan.lora_r))]    # lora_B: [out, r]
            w_bytes += plan.adapter_dtype * plan.lora_r * (l.fin + l.fout)
            c.params += plan.lora_r * (l.fin + l.fout)
            if plan.dora:   # DoRA's lora_magnitude_vector: [out]
                pieces.append((l.fout, plan.adapter_dtype, (l.fout,)))
                w_bytes += plan.adapter_dtype * l.fout
                c.params += l.fout
        elif plan.train_head and in_module(l.name, info.classifier):  # peft's modules_to_save: a trained copy beside it
            shape = l.shape if l.shape and prod(l.shape) == l.weight else (l.weight,)
            pieces = [(l.weight, other, shape), (l.bias, other, (l.bias,))]
            w_bytes += n * other
            c.params += n
        elif l.name in plan.saved_copies:  # peft's modules_to_save copy of an embedding / the head (even a tied one)
            k = l.weight or l.fin * l.fout
            pieces = [(k, other, l.shape if l.weight else (l.fout, l.fin)), (l.bias, other, (l.bias,))]
            w_bytes += (k + l.bias) * other
            c.params += k + l.bias
        elif l.trainable and not plan.lora_r and packed is None:  # a tied weight counts at its owner
            shape = l.shape if l.shape and prod(l.shape) == l.weight else (l.weight,)
            bias = 0 if l.frozen_param == "bias" else l.bias   # a frozen bias: no grad, no optimizer state
            pieces = [(l.weight, other, shape), (bias, other, (bias,))]
        train_bytes, own = w_bytes, []
        for k, dt, shape in pieces:
            if not k:
                continue
            state, paged = optimizers.state_bytes(plan.optimizer, shape, dt, embedding=l.kind == "embedding")
            if plan.device == "cpu":   # bitsandbytes' paged optimizers fall back to plain tensors on a CPU
                state, paged = state + paged, 0
            own.append((k * dt, state))
            c.grads[l.part] += k * dt
            c.trainable += k
            c.optimizer, c.paged = c.optimizer + state, c.paged + paged
            c.part_optimizer[l.part] += state + paged
            c.part_trainable[l.part] += k
            c.trained.append((shape, dt, l.kind != "norm" and k != l.bias))  # Trainer's weight-decay groups
            fused = (plan.fused_lm_head or "flce" in plan.liger_kernels) and l.name == info.output_head
            half = half_as * k if half_as and dt != half_as and not fused else 0
            # (autocast: the grad of the half copy, then cast to the weight's dtype, fp32 or bf16 under fp16;
            # TRL's fused head makes an fp32 grad directly, Liger's one in the weight's dtype)
            c.wtemp[l.part], c.wnew[l.part] = max(c.wtemp[l.part], half), max(c.wnew[l.part], half + k * dt)
            # autocast caches a half copy of each fp32 one (a bf16 one under fp16 is cast anew at each use:
            # torch's at::autocast::cached_cast caches kFloat leaves only)
            c.halves += half if l.kind == "linear" and dt == replay.FP32 else 0
            train_bytes += k * dt + state + paged
        c.weights += w_bytes
        c.part_weights[l.part] += w_bytes
        c.tensors.append((l.part, w_bytes, own))
        c.offenders.append((l.name, n, train_bytes))
    c.moved = sum(l.fin * l.fout * other for l in info.leaves if l.tied and l.trainable and not plan.lora_r)
    c.grads["embed"] -= c.moved   # lm_head makes the tied weight's grad first ...
    c.grads["head"] += c.moved
    if c.moved:  # ... and a tied weight's new grad comes first in the head's backward
        c.wnew["head"] = max(c.wnew["head"], c.wnew["embed"])
        c.halves += c.moved // other * plan.half if plan.half and other == replay.FP32 else 0  # lm_head casts the tie
    return c
