"""Partial and offloaded checkpointing: which blocks keep what, on the device and in pinned host memory, from the
forward to their backward (transformers 5.24, torch 2.13; TRL's offloading is :mod:`.trl_offload`).

The rules, and where each is read:

- ``every_n_layers`` (transformers ``modeling_utils.py``, ``PreTrainedModel._set_gradient_checkpointing``): the
  ``GradientCheckpointingLayer`` modules are counted in order, and layer ``i`` (from 0) is checkpointed iff
  ``i % every_n_layers == 0``: layers 0, n, 2n, ... (``ceil(L / n)`` of them, the first always). The others run as
  without checkpointing and keep all they save (:func:`checkpointed`). Trainer passes it from
  ``activation_checkpointing_kwargs`` (``Trainer.train``: ``gc_kwargs.pop("every_n_layers", 1)``).
- ``offload=True`` (``PreTrainedModel._activation_checkpointing_enable``: ``checkpoint_func`` runs each checkpoint
  under ``torch.autograd.graph.save_on_cpu(pin_memory=True)``). Non-reentrant ``checkpoint`` saves the block's
  positional arguments (``_CheckpointFrame.save_inputs``: ``_make_saved_tensor``) while save_on_cpu is the innermost
  saved-tensors hook, so ``pack_to_cpu`` copies them into pinned host tensors (``torch.empty(..., pin_memory=True)
  .copy_``) and the GPU tensor goes once the next block has read it. What the block saves inside goes through
  checkpoint's own hook (``_checkpoint_hook``: a holder, nothing kept), and its keyword arguments (the mask, cos/sin:
  ``GradientCheckpointingLayer`` binds them in a ``functools.partial``) stay on the GPU as without offload. The
  positional arguments are the hidden states, and for GPT-2 its mask too (``GPT2Model.forward`` passes
  ``causal_mask`` positionally; a family declared with ``positional_mask``): one host copy per checkpointed block.
  In backward the recompute runs under checkpoint's ``_recomputation_hook``, on the GPU; ``unpack_from_cpu`` copies
  the input back (``tensor.to(device)``) for the recompute, and the host copy lives until the block's graph goes,
  after its backward. Reentrant checkpointing (``CheckpointFunction.forward``:
  ``ctx.save_for_backward(*tensor_inputs)``) saves the same tensors through the same hook.
- Without an accelerator the copy cannot be made: ``pack_to_cpu`` pins when ``torch.cpu.is_available()`` (True), and
  torch 2.13 refuses ``pin_memory=True`` with no pinned allocator ("requires a CUDA or other accelerator backend").
  Where its pinning is off (``is_pinnable`` False), the same code copies into plain host tensors; unpacking then
  returns that host tensor itself (``.to("cpu")``), so on a CPU the copy brought back IS the host copy
  (:attr:`Moment.restored`).

- A leaf stays: with frozen embeddings, ``enable_input_require_grads``'s hook makes their output a leaf that requires
  grad (``output.requires_grad_(True)``), and autograd keeps a saved leaf alive whatever a pack hook returns
  (``SavedVariable`` holds a leaf itself; its ``AccumulateGrad`` node holds it too). Where that output is block 1's
  input (no scale, position embedding or dropout after it), offloading it frees nothing on the device: the copy is
  made, the tensor stays till block 1's backward (:func:`leaf_input`).

A block's own input, at its backward, is counted as the replay counts it without offload: inside what it saves when
its first op saves it (``Layer.in_saved``), else not.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kit.estimate.replay.families import family
from kit.estimate.replay.setup import BOOL



@dataclass(frozen=True)
class Layer:
    """One block of a partially checkpointed or offloaded forward, as the moments need it."""

    ckpt: bool       # checkpointed
    saved: int       # what it saves without checkpointing (its recompute's, when checkpointed)
    copies: int      # saved autocast weight copies among ``saved``
    bwd: int         # its backward's peak (Tape.backward_peak) ...
    bwd_grads: int   # ... and the weight grads made by then
    kept: int        # checkpointed: its input, all checkpointing keeps of it (0 when the input needs no grad)
    in_saved: bool   # its input is one of the tensors it saves (its recompute holds the input brought back)
    inp: int         # its input's bytes (what checkpoint's save_inputs saves)
    stays: int       # of it, offloaded, what the device keeps all the same (a leaf: block 1's, see leaf_input)
    device: int      # bytes it holds on the device from its forward to its backward
    host: int        # ... and in pinned host memory


def checkpointed(L: int, every: int = 1) -> tuple:
    """Which of ``L`` blocks are checkpointed with ``every_n_layers=every`` (index % every == 0).

    >>> checkpointed(5, 2)
    (True, False, True, False, True)
    """
    return tuple(i % every == 0 for i in range(L))


def leaf_input(st, block_fn) -> int:
    """Bytes of block 1's input when it is the embeddings' output made a leaf by ``enable_input_require_grads``
    (frozen embeddings, no scale, position embedding or dropout after them), else 0."""
    if st.base_trainable or not st.input_grad:
        return 0
    if block_fn.embed_scale or block_fn.positions or (block_fn.embd_dropout and st.p_embd > 0):
        return 0
    return st.T * st.H * st.w_other


def layered(st) -> bool:
    """Whether the replay needs per-block records: partial or offloaded checkpointing, or TRL's offloading."""
    return st.ckpt and (st.ckpt_every > 1 or st.ckpt_offload or st.trl_offload)


def sliding(st, j: int) -> bool:
    """Whether block ``j`` (from 0) uses a sliding window (``Setup.sliding_at``, or all or none of them)."""
    return j in st.sliding_at if st.sliding_at else bool(st.sliding)


def masked(st, j: int) -> bool:
    """Whether block ``j``'s attention gets a mask (the rule of ``Setup.layer_kinds``)."""
    return st.padded or (sliding(st, j) and 0 < st.window <= st.S)


def mask_bytes(st, dt: int) -> int:
    """The mask a GPT-2 block takes positionally: what ``Setup.kept_masks`` keeps of its one layer type."""
    return st.kept_masks(dt) if family(st.family).positional_mask else 0


def kept_masks(st, dt: int) -> int:
    """``Setup.kept_masks`` for the layer types that have a checkpointed block (a GPT-2 mask offloaded with its
    blocks stays on the device no more)."""
    if st.ckpt_offload and family(st.family).positional_mask:
        return 0
    flags = checkpointed(st.L, st.ckpt_every)
    full = any(f and not sliding(st, j) for j, f in enumerate(flags))
    slid = any(f and sliding(st, j) for j, f in enumerate(flags))
    one = st.B * st.S * st.S
    if st.eager:
        return one * dt * (full + slid)
    return one * BOOL * ((full and st.padded) + (slid and (st.padded or 0 < st.window <= st.S)))


def per_layer(st, entries, kinds, more, dt_mask: int, leaf: int = 0) -> tuple:
    """(the :class:`Layer` of each block, the autocast cache of the forward) from the replay's entries ((masked,
    layers, input, token mixer) per replay: block 1 alone first where its input differs), what each replay saved
    (``kinds``: saved, layers, copies, backward peak, its weight grads, input kept) and ``more`` (its input is among
    its saves, the autocast copies it made, those of them nothing saved, its input's bytes). A checkpointed block's
    copies are all cached, none saved; the others' cached copies are those nothing saves (as the replay counts
    them). ``leaf``: block 1's input is a leaf of these bytes (:func:`leaf_input`)."""
    split = len(entries) > 1 and entries[0][2] is not entries[-1][2]
    out, cache = [], 0
    for j, ck in enumerate(checkpointed(st.L, st.ckpt_every)):
        mixer = "" if not st.linear_at else "linear_attention" if j in st.linear_at else "full_attention"
        e = 0 if split and j == 0 else next(k for k in range(int(split), len(entries))
                                            if entries[k][0] == masked(st, j) and entries[k][3] == mixer)
        saved, _, copies, bwd, grads, kept = kinds[e]
        in_saved, made, unsaved, inp = more[e]
        # save_on_cpu copies the input (and GPT-2's mask) of a block whose graph holds anything
        host = inp + (mask_bytes(st, dt_mask) if kept else 0) if ck and st.ckpt_offload and saved else 0
        offloaded = ck and (st.ckpt_offload or st.trl_offload)
        stays = leaf if offloaded and j == 0 else 0
        device = saved if not ck else stays if offloaded else kept
        out.append(Layer(ckpt=ck, saved=saved, copies=copies, bwd=bwd, bwd_grads=grads, kept=kept, in_saved=in_saved,
                         inp=inp, stays=stays, device=device, host=host))
        cache += made if ck else unsaved
    return tuple(out), cache


def block_moments(rp, Moment, *, keep: int, grads_before: int, grads_head: int, grads_block: int, acc: bool,
                  wtemp_block: int) -> list:
    """``backward (block i)`` for every block, L down to 1, of a replay with per-block records (``rp.layers``): the
    blocks below block i hold what they kept from the forward, block i holds what it saves (recomputed when it is
    checkpointed) and makes its grads; ``host``: the host copies still alive (those of blocks 1..i)."""
    ls, L, out = rp.layers, rp.L, []
    below = [0]
    cbelow = [0]
    for l in ls:
        below.append(below[-1] + l.device)
        cbelow.append(cbelow[-1] + (0 if l.ckpt else l.copies))
    host = [0]
    for l in ls:
        host.append(host[-1] + l.host)
    trl = rp.trl
    for i in range(L, 0, -1):
        l = ls[i - 1]
        c = cbelow[i - 1] + l.copies
        own = rp.held - rp.held_dup + rp.hidden if l.ckpt and rp.reentrant else 0
        extra, host_out, brought = trl.block(i) if trl is not None else (0, 0, 0)
        held = rp.embed + rp.shared + below[i - 1] + l.saved - c + keep + own + extra + l.stays
        grads = grads_before + grads_head + (L - i) * grads_block + (0 if acc else l.bwd_grads)
        m = Moment(where=f"backward (block {i})", activations=held, logits=0, copies=c, gradients=grads,
                   temporaries=l.bwd - l.saved + wtemp_block)
        m.host = host[i] + host_out
        m.held_copies = l.inp if l.ckpt and l.in_saved and l.host else 0   # save_on_cpu's copy, among its saves
        m.restored = m.held_copies + brought
        out.append(m)
    return out


def adjust(rp, moments: list) -> list:
    """The host bytes of every moment of a layered replay, and TRL's changes outside the blocks
    (:mod:`.trl_offload`) to the forward, loss, head and embeddings moments."""
    total = sum(l.host for l in rp.layers)
    for m in moments:
        if m.where.startswith("backward (block"):
            continue
        if m.where != "backward (embeddings)":
            m.host = total
        if rp.trl is not None:
            delta, host, m.restored = rp.trl.outside(m.where)
            m.activations += delta
            m.host += host
    return moments


def step_moments(rp, moments: list, later: bool) -> list:
    """``moments`` as step 1 (``later`` False) or a later step meets them: with TRL's offloading a later step holds
    what the last one left (``trl_offload.Offloaded.later``)."""
    if not later or rp.trl is None or not rp.trl.leftover:
        return moments
    return [replace(m, activations=m.activations + rp.trl.later(m.where)) for m in moments]


def host_peak(moments: list) -> int:
    """The most pinned host memory that saved activations hold at once (the forward's end: every copy made)."""
    return max((m.host for m in moments), default=0)


def cpu_figures(moments: list) -> dict:
    """The peaks a CPU run of the same code with pinning off shows, where host and device are one memory and a copy
    brought back is the host tensor itself: of what is not a host copy (``device``), of the host copies (``host``),
    and of both (``total``)."""
    return dict(device=max(m.total - m.restored for m in moments),
                host=max(m.host + m.restored - m.held_copies for m in moments),
                total=max(m.total + m.host - m.held_copies for m in moments))
