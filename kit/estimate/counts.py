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


# What the plan says (its fields and the options it reads from its setup) that the walk never reads, and that the
# advisor's candidates vary most: it stays out of the key.
NOT_COUNTED = frozenset({"setup", "batch_size", "seq_len", "grad_accum", "evaluation", "padded", "attn_implementation",
                         "gradient_checkpointing", "checkpoint_reentrant", "lora_dropout", "input_require_grads",
                         "offload", "task"})


def count_key(info: Info, plan) -> tuple:
    """Everything ``plan`` says but :data:`NOT_COUNTED` (its fields and ``Plan.setup_options``), with ``info``'s
    identity: equal keys, equal counts. (Built from what the plan declares, so that a field or setup option added
    to the plan is in the key without a second edit here.)"""
    def hashable(value):
        if isinstance(value, (set, frozenset)):
            return frozenset(value)
        return repr(sorted(value.items())) if isinstance(value, dict) else value

    said = [f.name for f in fields(plan)] + list(plan.setup_options())
    return (id(info),) + tuple(hashable(getattr(plan, name)) for name in said if name not in NOT_COUNTED)


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
    counts, other = Counts(), plan.trained_bytes
    # A leaf's count depends on its shape, kind and place, not its name: a 70B model's 720 block leaves are 9
    # distinct counts, each made once here (the advisor counts many plans of one model)
    made, times = {}, {}
    for leaf in info.leaves:
        named = _named(info, plan, leaf.name)
        key = (leaf.kind, leaf.fin, leaf.fout, leaf.weight, leaf.bias, leaf.trainable, leaf.quantizable, leaf.part,
               leaf.shape, leaf.frozen_param) + named
        one = made.get(key)
        if one is None:
            one = made[key] = _leaf_count(leaf, named, plan)
        times[key] = times.get(key, 0) + 1
        counts.trained.extend(one.trained)    # (in module order: Trainer's weight-decay groups, the allocator's layout)
        counts.tensors.append((leaf.part, one.weights, one.own))
        counts.offenders.append((leaf.name, leaf.weight + leaf.bias, one.trained_bytes))
    for key, repeats in times.items():
        _add(counts, made[key], repeats)
    counts.moved = sum(leaf.fin * leaf.fout * other for leaf in info.leaves
                       if leaf.tied and leaf.trainable and not plan.lora_r)
    counts.grads["embed"] -= counts.moved   # lm_head makes the tied weight's grad first ...
    counts.grads["head"] += counts.moved
    if counts.moved:  # ... and a tied weight's new grad comes first in the head's backward
        counts.wnew["head"] = max(counts.wnew["head"], counts.wnew["embed"])
        # lm_head casts the tie
        counts.halves += counts.moved // other * plan.half if plan.half and other == replay.FP32 else 0
    counts.top_offenders = top_offenders(counts.offenders)
    return counts


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


def _leaf_count(leaf, named: tuple, plan) -> LeafCount:
    own_init, lora, classifier, saved_copy, output_head = named
    other = plan.trained_bytes
    leaf_elements = leaf.weight + leaf.bias
    quantized_as = plan.quantization if leaf.quantizable else "none"
    packed = nf4_bytes(leaf.weight, double_quant=plan.bnb.double_quant) if quantized_as == "4bit" else \
        int8_bytes(leaf.fin, leaf.fout) if quantized_as == "8bit" else None      # a k-bit layer's weight, as loaded
    w_bytes = leaf_elements * other if packed is None else \
        quantization.weight_bytes(leaf, quantized_as, plan.bnb, other)
    params = leaf_elements
    # CPU RAM to build: a k-bit model loads straight onto the GPU (bitsandbytes needs a device map, which
    # transformers sets to the current GPU), one tensor at a time through RAM; a plain from_pretrained, and
    # a layer the user's own __init__ makes (a head on the logits), build it all in RAM
    in_ram = plan.quantization == "none" or own_init
    pieces = []   # (trainable elements, bytes per element, shape)
    if lora:  # peft keeps adapters in fp32 (autocast_adapter_dtype=True); TRL: bf16 on k-bit
        pieces = [(plan.lora_r * leaf.fin, plan.adapter_dtype, (plan.lora_r, leaf.fin)),      # lora_A: [r, in]
                  (plan.lora_r * leaf.fout, plan.adapter_dtype, (leaf.fout, plan.lora_r))]    # lora_B: [out, r]
        w_bytes += plan.adapter_dtype * plan.lora_r * (leaf.fin + leaf.fout)
        params += plan.lora_r * (leaf.fin + leaf.fout)
        if plan.dora:   # DoRA's lora_magnitude_vector: [out]
            pieces.append((leaf.fout, plan.adapter_dtype, (leaf.fout,)))
            w_bytes += plan.adapter_dtype * leaf.fout
            params += leaf.fout
    elif classifier:  # peft's modules_to_save: a trained copy beside it
        shape = leaf.shape if leaf.shape and prod(leaf.shape) == leaf.weight else (leaf.weight,)
        pieces = [(leaf.weight, other, shape), (leaf.bias, other, (leaf.bias,))]
        w_bytes += leaf_elements * other
        params += leaf_elements
    elif saved_copy:  # peft's modules_to_save copy of an embedding / the head (even a tied one)
        copied = leaf.weight or leaf.fin * leaf.fout
        pieces = [(copied, other, leaf.shape if leaf.weight else (leaf.fout, leaf.fin)),
                  (leaf.bias, other, (leaf.bias,))]
        w_bytes += (copied + leaf.bias) * other
        params += copied + leaf.bias
    elif leaf.trainable and not plan.lora_r and packed is None:  # a tied weight counts at its owner
        shape = leaf.shape if leaf.shape and prod(leaf.shape) == leaf.weight else (leaf.weight,)
        bias = 0 if leaf.frozen_param == "bias" else leaf.bias   # a frozen bias: no grad, no optimizer state
        pieces = [(leaf.weight, other, shape), (bias, other, (bias,))]
    trained, wtemp, wnew, halves, train_bytes = [], 0, 0, 0, w_bytes
    for elements, item_bytes, shape in pieces:
        if not elements:
            continue
        state, paged = optimizers.state_bytes(plan.optimizer, shape, item_bytes, embedding=leaf.kind == "embedding")
        if plan.device == "cpu":   # bitsandbytes' paged optimizers fall back to plain tensors on a CPU
            state, paged = state + paged, 0
        fused = (plan.fused_lm_head or "flce" in plan.liger_kernels) and output_head
        half = plan.half * elements if plan.half and item_bytes != plan.half and not fused else 0
        # (autocast: the grad of the half copy, then cast to the weight's dtype, fp32 or bf16 under fp16;
        # TRL's fused head makes an fp32 grad directly, Liger's one in the weight's dtype)
        wtemp, wnew = max(wtemp, half), max(wnew, half + elements * item_bytes)
        # autocast caches a half copy of each fp32 one (a bf16 one under fp16 is cast anew at each use:
        # torch's at::autocast::cached_cast caches kFloat leaves only)
        halves += half if leaf.kind == "linear" and item_bytes == replay.FP32 else 0
        decays = leaf.kind != "norm" and elements != leaf.bias
        trained.append((elements, elements * item_bytes, state, paged, (shape, item_bytes, decays)))
        train_bytes += elements * item_bytes + state + paged
    return LeafCount(params=params, build=leaf_elements * plan.load_bytes if in_ram else 0,
                     streamed=0 if in_ram else leaf.weight * plan.load_bytes,
                     loaded=leaf_elements * plan.load_bytes if packed is None else packed + leaf.bias * plan.load_bytes,
                     quantized=leaf.weight if packed is not None else 0,
                     unquantized=leaf_elements if packed is None else 0,
                     weights=w_bytes, trained_bytes=train_bytes, part=leaf.part,
                     pieces=tuple(piece[:4] for piece in trained), own=tuple(piece[1:3] for piece in trained),
                     trained=tuple(piece[4] for piece in trained), wtemp=wtemp, wnew=wnew, halves=halves)


def _add(counts: Counts, one: LeafCount, times: int) -> None:
    """Adds ``times`` leaves counted as ``one`` to ``counts``'s sums and highs."""
    part = one.part
    counts.params += times * one.params
    counts.build += times * one.build
    counts.streamed = max(counts.streamed, one.streamed)
    counts.loaded += times * one.loaded
    counts.quantized += times * one.quantized
    counts.unquantized += times * one.unquantized
    for elements, grad, state, paged in one.pieces:
        counts.grads[part] += times * grad
        counts.trainable += times * elements
        counts.optimizer, counts.paged = counts.optimizer + times * state, counts.paged + times * paged
        counts.part_optimizer[part] += times * (state + paged)
        counts.part_trainable[part] += times * elements
    counts.wtemp[part], counts.wnew[part] = max(counts.wtemp[part], one.wtemp), max(counts.wnew[part], one.wnew)
    counts.halves += times * one.halves
    counts.weights += times * one.weights
    counts.part_weights[part] += times * one.weights


def top_offenders(offenders: list) -> list:
    """The 10 leaves costliest to train, then up to 5 of the largest not among them. (Sorted here, once per
    count: every estimate the advisor makes of one model shares its counts, and a 70B has over 700 leaves.)"""
    by_bytes = sorted(offenders, key=lambda offender: (offender[2], offender[1]), reverse=True)
    largest = sorted(by_bytes, key=lambda offender: offender[1], reverse=True)[:5]
    return by_bytes[:10] + [offender for offender in largest if offender not in by_bytes[:10]]
