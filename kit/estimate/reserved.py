"""Reserved beside allocated: what the CUDA caching allocator holds at a training step's peak, modelled.

The estimate predicts ``max_memory_allocated()``. The allocator reserves more (``max_memory_reserved()``): it
rounds every request, carves blocks out of 2 MiB, 20 MiB or request-sized segments, and keeps freed blocks
cached for reuse, where a later request of another size may not fit them. How much more depends on the order
and sizes of the step's tensors, so the kit lays the step out as tensors (:func:`step_trace`) and runs them
through its model of the allocator (:class:`kit.estimate.allocator.Replayer`, as it is laid out), with and without
``expandable_segments``:

- the model's weights, one tensor per layer, in module order (loaded first, kept);
- per micro-batch: the inputs; the embeddings' saved tensors; each block's saved tensors in saving order (with
  checkpointing, each block's input, and the block's saved tensors again in its backward's recompute); the head's;
  the logits, their fp32 copy and the log-softmax; the backward in reverse, freeing what each part saved and
  making its weight grads (kept through accumulation) and its temporaries;
- the optimizer step: its state on the first step (two tensors per trainable tensor, kept), its temporaries, and
  ``zero_grad(set_to_none=True)``.

Two optimizer steps are laid out (with accumulation, two micro-batches each): the allocator's cache settles by
the second (a third changed no gap, by the byte, over the setups of tests/test_reserved.py). The gap the
allocator adds over this trace's own allocated peak is added to the estimate's peak.
Transient tensors that nothing saves (an attention output before its projection) are not laid out, so the trace's
allocated peak is a little under the estimate's; ``Reserved.trace_peak_bytes`` keeps it beside the gap.

The CUDA context and the cuBLAS workspaces are outside this figure: the context is outside the allocator, and
the workspaces (one per thread, 32 MiB on sm90) are allocated once for the process.
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.estimate.allocator import Replayer, no_collector

HOW_TO = ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch initialises CUDA: in a notebook, "
          "`import os; os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'` in the first cell, before "
          "anything touches the GPU (restart the runtime if it already has); for a script, "
          "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py`")


@dataclass(frozen=True)
class Reserved:
    """The predicted ``max_memory_reserved()`` of a step, and how it was found."""

    reserved_bytes: int     # the estimate's allocated peak + gap_bytes
    gap_bytes: int          # what the allocator holds beyond the allocated peak, on the laid-out step
    expandable: bool        # expandable_segments on
    trace_peak_bytes: int   # the laid-out step's own allocated peak (the allocator's view: rounded blocks)

    def how(self) -> str:
        return (f"{'expandable segments' if self.expandable else 'the default caching allocator'} on the step laid "
                f"out as tensors (kit.estimate.reserved): +{self.gap_bytes:,} B over the allocated peak")


# what step_trace reads of the Replay (kit.estimate.replay.Replay)
TRACE_FIELDS = ("L", "hidden", "ckpt", "embed", "embed_order", "block", "block_order", "block_in", "block_bwd",
                "shared", "head", "head_in", "head_order", "last_logits", "logits_live", "ls")
RUNS: dict = {}      # layout_key -> (the allocator's gap, the laid-out step's allocated peak)
RUNS_KEPT = 512


class _Trace:
    def __init__(self):
        self.events, self.live = [], set()
        self.groups = {}   # a group's name -> how many tensors it was made of

    def alloc(self, key, nbytes):
        if nbytes > 0 and key not in self.live:
            self.events.append(("alloc", key, nbytes))
            self.live.add(key)

    def free(self, key):
        if key in self.live:
            self.events.append(("free", key))
            self.live.discard(key)

    def alloc_group(self, name: tuple, sizes):   # keys name + (0,), name + (1,), ...
        self.groups.setdefault(name, len(sizes))
        for k, nbytes in enumerate(sizes):
            self.alloc(name + (k,), nbytes)

    def free_group(self, name: tuple):   # the last made first
        for k in reversed(range(self.groups.pop(name, 0))):
            self.free(name + (k,))

    def passing(self, key, nbytes):   # a temporary: made and freed at once
        if nbytes > 0 and key not in self.live:
            self.alloc(key, nbytes)
            self.free(key)


def _chunks(total: int, size: int) -> list:
    """``total`` bytes as tensors of ``size`` (the last one the rest)."""
    if total <= 0:
        return []
    size = size if size > 0 else total
    return [size] * (total // size) + ([total % size] if total % size else [])


def _tensors(total: int, listed: tuple, size: int) -> tuple:
    """A part's saved tensors: as the replay listed them, where they add up to its bytes; else ``total`` cut into
    tensors of ``size``.

    >>> _tensors(10, (4, 6), 3), _tensors(10, (), 3)
    ((4, 6), (3, 3, 3, 1))
    """
    return tuple(listed) if listed and sum(listed) == total else tuple(_chunks(total, size))


def step_trace(tensors, replay, *, inputs: int, step_temp: int, accum: int = 1, steps: int = 2, into=None) -> list:
    """The step's tensors as ``("alloc", key, bytes)`` / ``("free", key)`` events (the module doc says which).

    ``tensors``: per leaf, ``(part, weight bytes, [(grad bytes, optimizer state bytes)])`` in module order;
    ``replay``: the forward's :class:`~kit.estimate.replay.Replay`; ``inputs``: the micro-batch's input tensors' bytes.
    Each saved tensor is one event, at the size the replay gave it (scenario 1's head: its fp16 weight copy is one
    tensor of V x V, not thousands of hidden-state-sized pieces), so the events grow with the layers only.
    ``into``: where the events go as they are made, instead (a :class:`kit.estimate.allocator.Replayer`, which
    passes over the same events the list leaves out); then nothing is returned.
    """
    t = _Trace() if into is None else into
    L, hid = max(1, replay.L), replay.hidden
    t.alloc_group(("w",), tuple(w for _, w, _ in tensors))
    blocks = [i for i, x in enumerate(tensors) if x[0] == "block"]
    per = max(1, len(blocks) // (L + replay.frozen))
    blocks = blocks[replay.frozen * per:]   # a frozen prefix: no grads, nothing saved (Replay.frozen)
    layers = [blocks[j * per:(j + 1) * per] for j in range(L)]
    layers[-1] += blocks[L * per:]
    parts = {"embed": [i for i, x in enumerate(tensors) if x[0] == "embed"],
             "head": [i for i, x in enumerate(tensors) if x[0] not in ("embed", "block")]}
    order = replay.block_order or tuple(_chunks(replay.block, hid))
    embed = _tensors(replay.embed, replay.embed_order, hid)             # what the embeddings save
    head = _tensors(replay.head + replay.head_in, replay.head_order, hid)   # the final norm's, lm_head's, a custom
    a = min(max(1, accum), 2)
    first_state = True

    grads_of = {part: tuple(g for i in ids for g, _ in tensors[i][2])   # each part's weight grads' bytes
                for part, ids in [("head", parts["head"]), ("embed", parts["embed"]), *enumerate(layers)]}

    def grads(part, start):   # a part's weight grads: made at a window's start and kept; later, added in place
        if start:
            t.alloc_group(("g", part), grads_of[part])
            return
        for k, g in enumerate(grads_of[part]):
            t.passing(("gt", part, k), g)

    for s in range(steps * a):
        start = s % a == 0
        for k in range(3):
            t.alloc(("in", k), inputs // 3)
        for k, b in enumerate(embed):
            t.alloc(("e", k), b)
        t.alloc("shared", replay.shared)
        for j in range(L):   # the forward: what each block saves (with checkpointing: its input)
            if replay.ckpt:
                t.alloc(("x", j), replay.block_in)
            else:
                t.alloc_group(("s", j), order)
        for k, b in enumerate(head):
            t.alloc(("h", k), b)
        t.alloc("logits", replay.last_logits)
        t.alloc("f32", replay.logits_live - replay.last_logits)   # the fp32 copy the loss reads
        t.alloc("ls", replay.ls)
        t.free("f32")
        t.free("logits")                # Trainer lets the model's outputs go at the loss
        t.alloc("gls", replay.ls)           # the backward of the loss: the log-softmax's grad and its input's
        t.alloc("glog", replay.ls)
        t.free("ls")
        t.free("gls")
        if replay.last_logits != replay.ls:
            t.alloc("gl", replay.last_logits)
            t.free("glog")
        grads("head", start)
        t.alloc(("gh", L), hid)
        t.free("gl")
        t.free("glog")
        for k in range(len(head)):
            t.free(("h", k))
        for j in reversed(range(L)):   # each block's backward: recompute, grads, free what it saved
            if replay.ckpt:
                t.alloc_group(("s", j), order)
            t.alloc(("gh", j), hid)
            t.free(("gh", j + 1))
            grads(j, start)
            t.passing("bt", replay.block_bwd - replay.block - hid)
            t.free_group(("s", j))
            t.free(("x", j))
        grads("embed", start)
        for k in range(len(embed)):
            t.free(("e", k))
        t.free(("gh", 0))
        t.free("shared")
        for k in range(3):
            t.free(("in", k))
        if (s + 1) % a == 0:   # the optimizer step, then zero_grad(set_to_none=True)
            if first_state:   # two tensors per trainable tensor (exp_avg, exp_avg_sq), kept
                t.alloc_group(("st",), tuple(half for _, _, own in tensors for _, state in own
                                             for half in (state // 2, state - state // 2)))
            first_state = False
            t.passing("steptemp", step_temp)
            for part in grads_of:
                t.free_group(("g", part))
    return t.events if into is None else None


def layout_key(tensors, replay, *, inputs: int, step_temp: int, accum: int = 1, expandable: bool = False) -> tuple:
    """Everything :func:`step_trace` and the replay read, as one hashable key: equal keys, equal events."""
    return (tuple((part, w, tuple(own)) for part, w, own in tensors), tuple(getattr(replay, f) for f in TRACE_FIELDS),
            inputs // 3, step_temp, min(max(1, accum), 2), expandable)


def reserved(tensors, replay, peak_bytes: int, *, inputs: int, step_temp: int, accum: int = 1,
             expandable: bool = False) -> Reserved:
    """The predicted ``max_memory_reserved()``: ``peak_bytes`` plus the allocator's gap on :func:`step_trace`.

    The replay's result is kept per laid-out step (:data:`RUNS`, the last :data:`RUNS_KEPT`): the fit advisor and
    the panel estimate the same setup many times over, and each then replays it once."""
    key = layout_key(tensors, replay, inputs=inputs, step_temp=step_temp, accum=accum, expandable=expandable)
    if key not in RUNS:
        replayer = Replayer(expandable)
        with no_collector():
            step_trace(tensors, replay, inputs=inputs, step_temp=step_temp, accum=accum, into=replayer)
        run = replayer.run()
        if len(RUNS) >= RUNS_KEPT:
            del RUNS[next(iter(RUNS))]   # the oldest
        RUNS[key] = (max(0, run.peak_reserved_bytes - run.peak_allocated_bytes), run.peak_allocated_bytes)
    gap, trace_peak = RUNS[key]
    return Reserved(peak_bytes + gap, gap, expandable, trace_peak)
