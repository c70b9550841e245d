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

PARTS = ("embed", "block", "head", "vision")


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
    top_offenders: list = field(default_factory=list)  # the 10 costliest to train, then up to 5 largest besides
    # per leaf, in module order: (part, weight bytes, ((grad bytes, optimizer state bytes in the allocator), ...)
    # per trainable tensor): the tensors kit.estimate.reserved lays out
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
    # A leaf's count depends on its shape, kind and place, not its name: a 70B model's 720 block leaves are 9
    # distinct counts, each made once here (the advisor counts many plans of one model)
    made, times = {}, {}
    for l in info.leaves:
        named = _named(info, plan, l.name)
        key = (l.kind, l.fin, l.fout, l.weight, l.bias, l.trainable, l.quantizable, l.part, l.shape,
               l.frozen_param) + named
        one = made.get(key)
        if one is None:
            one = made[key] = _leaf_count(l, named, plan)
        times[key] = times.get(key, 0) + 1
        c.trained.extend(one.trained)    # (in module order: Trainer's weight-decay groups, the allocator's layout)
        c.tensors.append((l.part, one.weights, one.own))
        c.offenders.append((l.name, l.weight + l.bias, one.trained_bytes))
    for key, n in times.items():
        _add(c, made[key], n)
    c.moved = sum(l.fin * l.fout * other for l in info.leaves if l.tied and l.trainable and not plan.lora_r)
    c.grads["embed"] -= c.moved   # lm_head makes the tied weight's grad first ...
    c.grads["head"] += c.moved
    if c.moved:  # ... and a tied weight's new grad comes first in the head's backward
        c.wnew["head"] = max(c.wnew["head"], c.wnew["embed"])
        c.halves += c.moved // other * plan.half if plan.half and other == replay.FP32 else 0  # lm_head casts the tie
    c.top_offenders = top_offenders(c.offenders)
    return c


def _named(info: Info, plan, name: str) -> tuple:
    """What a leaf's count reads from its name: built by the user's own __init__ (a head on the logits), LoRA's,
    a trained classifier, a saved copy (peft's modules_to_save), the output head."""
    return (name in info.head_layers, name in plan.lora_modules,
            bool(plan.train_head) and in_module(name, info.classifier), name in plan.saved_copies,
            name == info.output_head)


@dataclass(frozen=True, kw_only=True)
class LeafCount:
    """One leaf's share of :class:`Counts` (:func:`_leaf_count`)."""

    params: int
    build: int
    streamed: int
    loaded: int
    quantized: int
    unquantized: int
    weights: int
    trained_bytes: int          # the leaf's weights, grads and optimizer state
    part: str
    pieces: tuple               # per trainable tensor: (elements, grad bytes, optimizer state, paged state)
    own: tuple                  # ... (grad bytes, optimizer state bytes in the allocator)
    trained: tuple              # ... (shape, dtype bytes, decays): Counts.trained's
    wtemp: int
    wnew: int
    halves: int


def _leaf_count(l, named: tuple, plan) -> LeafCount:
    own_init, lora, classifier, saved_copy, output_head = named
    other = plan.trained_bytes
    n = l.weight + l.bias
    q = plan.quantization if l.quantizable else "none"
    packed = nf4_bytes(l.weight, double_quant=plan.bnb.double_quant) if q == "4bit" else \
        int8_bytes(l.fin, l.fout) if q == "8bit" else None      # a k-bit layer's weight, as loaded
    w_bytes = n * other if packed is None else quantization.weight_bytes(l, q, plan.bnb, other)
    params = n
    # CPU RAM to build: a k-bit model loads straight onto the GPU (bitsandbytes needs a device map, which
    # transformers sets to the current GPU), one tensor at a time through RAM; a plain from_pretrained, and
    # a layer the user's own __init__ makes (a head on the logits), build it all in RAM
    in_ram = plan.quantization == "none" or own_init
    pieces = []   # (trainable elements, bytes per element, shape)
    if lora:  # peft keeps adapters in fp32 (autocast_adapter_dtype=True); TRL: bf16 on k-bit
        pieces = [(plan.lora_r * l.fin, plan.adapter_dtype, (plan.lora_r, l.fin)),      # lora_A: [r, in]
                  (plan.lora_r * l.fout, plan.adapter_dtype, (l.fout, plan.lora_r))]    # lora_B: [out, r]
        w_bytes += plan.adapter_dtype * plan.lora_r * (l.fin + l.fout)
        params += plan.lora_r * (l.fin + l.fout)
        if plan.dora:   # DoRA's lora_magnitude_vector: [out]
            pieces.append((l.fout, plan.adapter_dtype, (l.fout,)))
            w_bytes += plan.adapter_dtype * l.fout
            params += l.fout
    elif classifier:  # peft's modules_to_save: a trained copy beside it
        shape = l.shape if l.shape and prod(l.shape) == l.weight else (l.weight,)
        pieces = [(l.weight, other, shape), (l.bias, other, (l.bias,))]
        w_bytes += n * other
        params += n
    elif saved_copy:  # peft's modules_to_save copy of an embedding / the head (even a tied one)
        k = l.weight or l.fin * l.fout
        pieces = [(k, other, l.shape if l.weight else (l.fout, l.fin)), (l.bias, other, (l.bias,))]
        w_bytes += (k + l.bias) * other
        params += k + l.bias
    elif l.trainable and not plan.lora_r and packed is None:  # a tied weight counts at its owner
        shape = l.shape if l.shape and prod(l.shape) == l.weight else (l.weight,)
        bias = 0 if l.frozen_param == "bias" else l.bias   # a frozen bias: no grad, no optimizer state
        pieces = [(l.weight, other, shape), (bias, other, (bias,))]
    trained, wtemp, wnew, halves, train_bytes = [], 0, 0, 0, w_bytes
    for k, dt, shape in pieces:
        if not k:
            continue
        state, paged = optimizers.state_bytes(plan.optimizer, shape, dt, embedding=l.kind == "embedding")
        if plan.device == "cpu":   # bitsandbytes' paged optimizers fall back to plain tensors on a CPU
            state, paged = state + paged, 0
        fused = (plan.fused_lm_head or "flce" in plan.liger_kernels) and output_head
        half = plan.half * k if plan.half and dt != plan.half and not fused else 0
        # (autocast: the grad of the half copy, then cast to the weight's dtype, fp32 or bf16 under fp16;
        # TRL's fused head makes an fp32 grad directly, Liger's one in the weight's dtype)
        wtemp, wnew = max(wtemp, half), max(wnew, half + k * dt)
        # autocast caches a half copy of each fp32 one (a bf16 one under fp16 is cast anew at each use:
        # torch's at::autocast::cached_cast caches kFloat leaves only)
        halves += half if l.kind == "linear" and dt == replay.FP32 else 0
        trained.append((k, k * dt, state, paged, (shape, dt, l.kind != "norm" and k != l.bias)))
        train_bytes += k * dt + state + paged
    return LeafCount(params=params, build=n * plan.load_bytes if in_ram else 0,
                     streamed=0 if in_ram else l.weight * plan.load_bytes,
                     loaded=n * plan.load_bytes if packed is None else packed + l.bias * plan.load_bytes,
                     quantized=l.weight if packed is not None else 0, unquantized=n if packed is None else 0,
                     weights=w_bytes, trained_bytes=train_bytes, part=l.part,
                     pieces=tuple(piece[:4] for piece in trained), own=tuple(piece[1:3] for piece in trained),
                     trained=tuple(piece[4] for piece in trained), wtemp=wtemp, wnew=wnew, halves=halves)


def _add(c: Counts, one: LeafCount, times: int) -> None:
    """Adds ``times`` leaves counted as ``one`` to ``c``'s sums and highs."""
    part = one.part
    c.params += times * one.params
    c.build += times * one.build
    c.streamed = max(c.streamed, one.streamed)
    c.loaded += times * one.loaded
    c.quantized += times * one.quantized
    c.unquantized += times * one.unquantized
    for k, grad, state, paged in one.pieces:
        c.grads[part] += times * grad
        c.trainable += times * k
        c.optimizer, c.paged = c.optimizer + times * state, c.paged + times * paged
        c.part_optimizer[part] += times * (state + paged)
        c.part_trainable[part] += times * k
    c.wtemp[part], c.wnew[part] = max(c.wtemp[part], one.wtemp), max(c.wnew[part], one.wnew)
    c.halves += times * one.halves
    c.weights += times * one.weights
    c.part_weights[part] += times * one.weights


def top_offenders(offenders: list) -> list:
    """The 10 leaves costliest to train, then up to 5 of the largest not among them. (Sorted here, once per
    count: every estimate the advisor makes of one model shares its counts, and a 70B has over 700 leaves.)"""
    by_bytes = sorted(offenders, key=lambda offender: (offender[2], offender[1]), reverse=True)
    largest = sorted(by_bytes, key=lambda offender: offender[1], reverse=True)[:5]
    return by_bytes[:10] + [o for o in largest if o not in by_bytes[:10]]
