"""TRL's activation offloading (``SFTConfig.activation_offloading``, TRL 1.16) over checkpointed blocks: what
``OffloadActivations`` copies to pinned host memory, what stays on the GPU, and when.

Where it runs: ``SFTTrainer.__init__`` builds ``get_act_offloading_ctx_manager(model=self.model)`` with its defaults
(``use_pin_memory=True``, ``use_streams=True``, ``min_offload_size=1024``, ``max_fwd_stash_size=5``) and
``SFTTrainer.training_step`` runs Trainer's step, forward and backward, under it (trl/trainer/sft_trainer.py). Its
``pack_tensor`` (trl/models/activation_offloading.py) numbers every tensor autograd saves while it is the innermost
saved-tensors hook, and:

- keeps on the GPU (a reference in ``tracker``) a tensor whose storage is tracked already (``use_streams``:
  ``storage_to_tensor_id``, where a storage stays while its first copy is in the forward stash, and for good once
  a second save of it was kept), one under ``min_offload_size`` bytes, and a parameter;
- copies any other into a new pinned host tensor (``torch.empty_like(..., pin_memory=True)``: its ``nelement``
  bytes) and keeps the GPU tensor in ``fwd_stash`` until a later offloaded one is numbered 5 past it
  (``max_fwd_stash_size``): the last ones offloaded stay on the GPU beside their host copies;
- in backward (``unpack_tensor_with_streams``) brings a copy back, a new GPU tensor, unless it is still in the
  forward stash, which the first node unpacking an offloaded tensor clears (its hook); what a node brought back is
  freed once the next such node has run (``bwd_tensor_stash``, ``prev_node_ids``); the host copy goes at unpack.

Under non-reentrant checkpointing the blocks' insides are saved through checkpoint's own hooks, innermost there
(``_checkpoint_hook``, ``_recomputation_hook``): ``OffloadActivations`` sees each block's positional arguments
(``_CheckpointFrame.save_inputs``) and what the model saves outside the blocks, in this order (:func:`packs`): the
embedding's ids (the batch still holds them), the final norm's tensors (rms_norm: ``pow`` keeps x.float(),
``rsqrt`` its output, the ``mul`` both again, the weight's ``mul`` the normed input and the weight), the fused LM
head's (``ChunkedLogProbFunction.forward``: ``save_for_backward(hidden, weight, bias, targets, log_z, entropy)``;
on CUDA ``hidden_states[mask]`` saves the label mask first) and the loss's masks (``masked_fill(~mask)`` per
output, ``masked_scatter(mask)`` on CUDA; the entropy's never runs backward). ``NoOpManager`` exempts ``lm_head``'s
forward, which the fused head never calls. Without checkpointing it would see every tensor the blocks save, in
torch's per-op order, which the replay does not track: that, reentrant checkpointing (whose recompute saves in
backward under this hook) and unchecked blocks (``every_n_layers``) are refused where the options are read.

TRL's offloading does not run without an accelerator: ``OffloadActivations.__init__`` reads
``torch.accelerator.current_accelerator().type``, and there is none on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit.estimate.replay.offload import mask_bytes
from kit.estimate.replay.setup import BOOL, F32, I64

MIN_BYTES, STASH = 1024, 5   # min_offload_size, max_fwd_stash_size (get_act_offloading_ctx_manager's defaults)


@dataclass(frozen=True)
class Pack:
    """One tensor autograd saves under the offloader, in forward order."""

    key: object           # its storage: two saves of one storage share it
    nbytes: int           # element_size * nelement (what the host copy and a copy brought back take)
    node: str             # the backward node that unpacks it ("never": outside the loss's graph)
    part: str             # the last of the replay's moments that counts its storage (see :data:`Offloaded.order`)
    counted: int = 0      # its storage's bytes as the replay counts them (0: not counted)
    freeable: bool = True  # nothing else holds it once the forward has returned (False: the batch's ids)
    param: bool = False
    since: str = "fwd"    # the first moment counting it (a block's input: its own, only inside its saves)


def packs(st, block_fn, layers, x, y, h, leaf: int = 0) -> list:
    """What ``OffloadActivations`` is given in one forward of checkpointed blocks (see the module doc); ``leaf``: block
    1's input is a leaf the device keeps (``kit.estimate.replay.offload.leaf_input``), counted with the blocks."""
    T, H, N = st.T, st.H, st.B * (st.S - 1)
    out = []
    if st.base_trainable:  # EmbeddingBackward keeps the indices (and GPT-2's position embedding the positions)
        out.append(Pack("ids", T * I64, "embed", "embed", T * I64, freeable=False))
        if block_fn.positions:
            out.append(Pack("pos", st.S * I64, "embed_pos", "embed", st.S * I64))
    if block_fn.embed_scale and x.rg:  # embeds * scale keeps the 0-d scale
        out.append(Pack("scale", 4, "scale", "embed"))
    if block_fn.embd_dropout and st.p_embd > 0 and x.rg:
        mask = T * H * (BOOL if st.device == "cuda" else x.dt)
        out.append(Pack("drop", mask, "drop", "embed", mask))
    for j, l in enumerate(layers, 1):
        if not st.ckpt_offload:  # (save_on_cpu, innermost there, takes them otherwise)
            stays = bool(l.stays)
            out.append(Pack(("in", j), l.inp, f"in{j}", f"in{j}", 0 if stays or not l.in_saved else l.kept,
                            freeable=not stays, since=f"in{j}"))
            if l.kept and mask_bytes(st, x.dt):  # GPT-2 passes its mask positionally
                out.append(Pack("mask", mask_bytes(st, x.dt), f"in{j}", "in1", mask_bytes(st, x.dt)))
    out += _final_norm(st, block_fn.final_norm, y)
    return out + _head(st, h, N)


def _final_norm(st, kind: str, y) -> list:
    T, H, tr = st.T, st.H, st.base_trainable
    if kind == "layer_norm":  # native_layer_norm: weight, input, bias, mean, rstd
        if not (y.rg or tr):
            return []
        xin = "y" if y.dt == F32 or not st.ac else "x32"
        stats = T * (F32 if st.device == "cuda" else (F32 if st.ac else y.dt))
        xb = T * H * (F32 if st.ac else y.dt)
        return [Pack("w", 0, "fn", "head", param=True), Pack(xin, xb, "fn", "head", xb),
                Pack("b", 0, "fn", "head", param=True), Pack("mean", stats, "fn", "head", stats),
                Pack("rstd", stats, "fn", "head", stats)]
    if not y.rg:   # (a trained norm has a trained model before it: y requires grad)
        return []
    xf = "y" if y.dt == F32 else "xf"   # x.float(): x itself when it is fp32
    out = [Pack(xf, T * H * F32, "fn_pow", "head", T * H * F32), Pack("r", T * F32, "fn_rsqrt", "head", T * F32),
           Pack("r", T * F32, "fn_mul", "head", T * F32), Pack(xf, T * H * F32, "fn_mul", "head", T * H * F32)]
    if kind == "rms_norm_offset":  # output * (1 + weight.float()): keeps 1 + weight, and output for the weight
        out.append(Pack("1+w", H * F32, "fn_w", "head", H * F32))
        return out + ([Pack("hw", T * H * F32, "fn_w", "head", T * H * F32)] if tr else [])
    normed = T * H * (F32 if kind == "rms_norm_fp32" else y.dt)   # weight * h (OLMo-2: fp32 h), or h.to(x.dtype)
    return out + ([Pack("hw", normed, "fn_w", "head", normed)] if tr else []) + [
        Pack("w", 0, "fn_w", "head", param=True)]


def _head(st, h, N: int) -> list:
    """The fused LM head's saves and the loss's: on CUDA it scores ``hidden_states[mask]`` (Triton), elsewhere
    every position (``reshape(-1, H)``: a view of the norm's output for one row, a copy for several)."""
    H, cuda = st.H, st.device == "cuda"
    hidden = N * H * h.dt
    stored = hidden if st.B > 1 or cuda else st.T * H * h.dt
    lm = [Pack("lmask", st.B * (st.S - 1) * BOOL, "head_idx", "loss", freeable=False)] if cuda else []
    lm += [Pack("hv", hidden, "head", "head", stored), Pack("lmw", 0, "head", "head", param=True),
           Pack("tg", N * I64, "head", "head", N * I64), Pack("lz", N * F32, "head", "head", N * F32),
           Pack("en", N * F32, "head", "head", N * F32)]
    if cuda:   # x.new_zeros(mask.shape).masked_scatter(mask, x), for the log-probs and the entropy
        lm += [Pack("lmask", N * BOOL, "loss", "loss", freeable=False), Pack("lmask", N * BOOL, "never", "loss",
                                                                              freeable=False)]
    else:      # x.view(mask.shape).masked_fill(~mask, 0): a new ~mask each
        lm += [Pack("nm1", N * BOOL, "loss", "loss"), Pack("nm2", N * BOOL, "never", "loss")]
    return lm + [Pack("n", I64, "loss", "loss"), Pack("s", F32, "loss", "loss")]   # the loss's scalars


@dataclass
class Offloaded:
    """The offloader's forward (which packs went to the host, the stash at the head's forward and at the end) and,
    from it, the device and host bytes at each of the replay's moments, against what the replay counts there."""

    packs: list
    off: list = field(default_factory=list)        # per pack: copied to the host
    stash_fwd: set = field(default_factory=set)    # pack indices in the forward stash during the head's forward
    stash_end: set = field(default_factory=set)    # ... and when the forward ends
    order: list = field(default_factory=list)      # backward nodes in the order they run
    leftover: int = 0   # the last step's hooked embeddings output and its grad, kept into this step (see later)

    def __post_init__(self):
        first_head = self._first_head()
        tracked, key_of, stash = {}, {}, {}
        for i, p in enumerate(self.packs):
            if i == first_head:
                self.stash_fwd = set(stash)
            if p.key in tracked:                    # its storage is tracked: a reference kept, no copy
                tracked[p.key], key_of[i] = i, p.key
                self.off.append(False)
                continue
            if p.param or p.nbytes < MIN_BYTES:
                self.off.append(False)
                continue
            for s in [s for s in stash if s <= i - STASH]:  # (ids count from 1 in TRL: the same distances)
                del stash[s]
                k = key_of.pop(s, None)
                if k is not None and tracked.get(k) == s:
                    del tracked[k]
            stash[i], tracked[p.key], key_of[i] = p.key, i, p.key
            self.off.append(True)
        self.stash_end = set(stash)
        if first_head == len(self.packs):
            self.stash_fwd = set(stash)
        nodes = []
        for p in self.packs:
            if p.node not in nodes and p.node != "never":
                nodes.append(p.node)
        self.order = nodes[::-1]

    def _pos(self, node: str) -> int:
        """Where ``node`` runs in backward ("fwd": before it; a node that never runs: after every one)."""
        return -1 if node == "fwd" else self.order.index(node) if node in self.order else len(self.order)

    def _modified(self, node: str) -> bool:
        return any(o and p.node == node for p, o in zip(self.packs, self.off))

    def _cleared(self, pos: int) -> bool:
        """Whether a node before position ``pos`` unpacked an offloaded tensor: its hook cleared the stash."""
        return any(self._modified(n) for n in self.order[:max(pos, 0)])

    def state(self, m: str) -> tuple:
        """(device bytes for the storages the offloader was given, those of them the replay counts there, host bytes,
        device bytes brought back from the host) at moment ``m``: "fwd" (the head's forward), or a backward node
        ("loss", "head", "in<i>", "embed"; one that is not there, as "embed" with frozen embeddings: after all)."""
        pos, fwd = self._pos(m), m == "fwd"
        made = set(range(self._first_head())) if fwd else set(range(len(self.packs)))
        stash = self.stash_fwd if fwd else set() if self._cleared(pos) else self.stash_end
        by_key = {}
        for i, p in enumerate(self.packs):
            by_key.setdefault(p.key, []).append(i)
        base = device = 0
        for k, idx in by_key.items():
            p0 = self.packs[idx[0]]
            if not p0.counted:
                continue
            first, last = self._pos(p0.since), self._pos(p0.part)
            base += p0.counted if first <= pos <= last and (p0.since != p0.part or pos == last) else 0
            pending = fwd or any(self._pos(self.packs[i].node) >= pos for i in idx)
            kept = any(i not in made or (not self.off[i] and (fwd or self._pos(self.packs[i].node) >= pos))
                       for i in idx)
            if (pending and (kept or any(i in stash for i in idx))) or not p0.freeable:
                device += p0.counted
        # copies brought back by this node, and by the last node before it that brought any (freed once this runs)
        nodes = [] if fwd else [n for n in self.order[:pos] if self._modified(n)][-1:] + [m]
        brought = 0
        for n in nodes:
            served = not self._cleared(self._pos(n))
            brought += sum(p.nbytes for i, p in enumerate(self.packs)
                           if p.node == n and self.off[i] and not (served and i in self.stash_end))
        device += brought
        host = sum(p.nbytes for i, p in enumerate(self.packs) if self.off[i] and i in made
                   and (fwd or self._pos(p.node) > pos))
        return device, base, host, brought

    def later(self, where: str) -> int:
        """Bytes a later step holds beside a moment's: ``OffloadActivations`` keeps the last backward node that
        unpacked an offloaded tensor (``self.curr_autograd_node``) till the next backward's first one, and with frozen
        embeddings that node's graph reaches their output, a leaf whose ``AccumulateGrad`` holds it and its grad."""
        if where == "forward (at the loss)" or (where == "backward (loss)" and not self._modified("loss")):
            return self.leftover
        return 0

    def _first_head(self) -> int:
        return next((i for i, p in enumerate(self.packs) if p.node in ("head", "head_idx")), len(self.packs))

    def outside(self, where: str) -> tuple:
        """(device bytes beyond what the replay counts, host bytes, device bytes brought back from the host) at
        one of the replay's moments outside the blocks."""
        m = {"forward (at the loss)": "fwd", "backward (loss)": "loss", "backward (head)": "head",
             "backward (embeddings)": "embed"}[where]
        dev, base, host, brought = self.state(m)
        return dev - base, host, brought

    def block(self, i: int) -> tuple:
        """(device bytes beyond what the replay counts, host bytes, bytes brought back) at block ``i``'s backward."""
        dev, base, host, brought = self.state(f"in{i}")
        return dev - base, host, brought


def offloaded(st, block_fn, layers, x, y, h, leaf: int = 0) -> Offloaded:
    """The offloader's forward of ``st`` (its blocks in ``layers``), from the replay's tensors: the embeddings'
    output ``x``, the last block's ``y``, the final norm's ``h``; ``leaf``: see :func:`packs`."""
    hooked = st.T * st.H * st.w_other if not st.base_trainable and st.input_grad else 0   # a leaf and its grad
    return Offloaded(packs(st, block_fn, layers, x, y, h, leaf), leftover=2 * hooked)
