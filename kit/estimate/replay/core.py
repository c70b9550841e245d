"""One training forward replayed: embeddings, L blocks, head and loss; and its backward peak.

:func:`replay` takes the block function (and an encoder's head) of ``Setup.family``'s declaration
(:func:`kit.estimate.replay.registry.family`) and runs it once on a :class:`~kit.estimate.replay.tape.Tape` per
kind of block (the blocks are alike, but for whether their attention gets a mask: see ``Setup.layer_kinds``); the
embeddings,
the final norm, the head and the loss around it are the same for every family, save for
what the block's :func:`~kit.estimate.replay.setup.around` mark says and the final logits' soft-capping.
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.estimate.replay import offload
from kit.estimate.replay import trl_offload
from kit.estimate.replay.fused_head import chunked_head
from kit.estimate.replay.liger import LigerTape, flce_head
from kit.estimate.replay.registry import family
from kit.estimate.replay.setup import F32, I64, Setup
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.task_heads import classifier_head


@dataclass(kw_only=True)
class Replay:
    """Bytes saved by each part of one training forward, and the temporaries around it."""

    L: int
    ckpt: bool
    embed: int          # saved by the embeddings
    block: int          # saved by one block without checkpointing
    block_in: int       # one block's input: all checkpointing keeps of a block
    shared: int         # saved once for all blocks (rotary cos/sin)
    head: int           # final norm + lm_head: saved inputs
    head_in: int        # scenario 1: custom_layer's saved input (the base's logits)
    loss: int           # the loss's log-softmax output and targets
    logits_live: int    # logits alive at the loss but not saved (model outputs, fp32 copy)
    cache: int          # autocast's cached weight copies alive in the forward, not saved
    block_bwd: int      # peak of one block's backward: saved (freed as it goes) + activation grads
    block_bwd_grads: int  # ... and the block's weight grads made by then
    hidden: int         # one (B, S, H) hidden-state tensor
    copies_block: int   # saved autocast weight copies, per block (part of block)
    copies_head: int    # ... in the final norm + lm_head (part of head)
    copies_head_in: int  # ... in scenario 1's head (part of head_in)
    last_logits: int    # the last (B, S, V) logits in their dtype (its grad has this size)
    ls: int             # the log-softmax output alone
    block_sum: int = 0  # saved by all L blocks without checkpointing, when they differ (0: L * block)
    capped: int = 0     # the final logits' soft-capping: tanh's saved (B, S, V) output (Gemma-2)
    held: int = 0       # per block: 8-bit layers' inputs, kept as ctx attributes till backward ends
    #                     (kit.estimate.quantization)
    held_dup: int = 0   # ... of which also saved by another op (one storage, but for a checkpoint's recompute)
    reentrant: bool = False  # reentrant checkpointing (Setup.reentrant): see peak_moment
    head_grad: int | None = None  # the last linear's input grad (None: one hidden state, lm_head's)
    block_in_sum: int = 0  # all L blocks' inputs, when block 1's differs from the others' (0: L * block_in)
    copies_sum: int = 0    # saved autocast weight copies of all L blocks (0: L * copies_block)
    block_order: tuple = ()  # the biggest block's saved tensors' bytes, in saving order (kit.estimate.reserved)
    embed_order: tuple = ()  # the embeddings' saved tensors' bytes, in saving order (kit.estimate.reserved)
    head_order: tuple = ()   # the head's (final norm, lm_head, scenario 1's head), in saving order (the same)
    layers: tuple = ()     # per block (offload.Layer), with partial or offloaded checkpointing; () otherwise
    trl: object = None     # TRL's activation offloading outside the blocks (trl_offload.Offloaded), or None
    transient: int = 0     # alive at the last block's end in the forward, saved by nothing (Tape.transient)
    shared_grad: int = 0   # the grad of an input every block takes, alive below the last block (Tape.shared_grad)
    frozen: int = 0        # blocks below these L, frozen and run with no graph (Setup.frozen_below): none saved
    parts: tuple = ()      # a model replayed whole (Family.whole: an encoder-decoder), its parts in forward order
    enc_grad: int = 0      # ... the encoder output's grad, alive through the decoder's backward
    forward_held: int = 0  # what a forward holds at its loss beside the logits and the last hidden state, saved or
    #                        not (an encoder-decoder's encoder output and its decoder's KV cache): evaluate() has it
    walk: object = None    # ... its moments (what moments() returns for it), else None
    vision: object = None  # a vision-language model's vision part, as its family replays it (its walk reads it)

    @property
    def copies_saved(self) -> int:
        """Saved autocast weight copies (part of :meth:`saved_bytes`)."""
        return self.copies_blocks() + self.copies_head + self.copies_head_in

    def copies_blocks(self) -> int:
        """The blocks' saved autocast weight copies (the non-checkpointed blocks')."""
        if self.layers:
            return sum(l.copies for l in self.layers if not l.ckpt)
        return 0 if self.ckpt else self.copies_sum or self.L * self.copies_block

    @property
    def logits_saved(self) -> int:
        """Saved bytes that are logits or loss: scenario 1's head input, soft-capping, log-softmax, targets."""
        return self.head_in + self.loss + self.capped

    def blocks(self) -> int:
        """What the blocks hold on the device when the forward ends."""
        if self.layers:
            return sum(l.device for l in self.layers) + self.kept()
        saved = (self.block_in_sum or self.L * self.block_in) if self.ckpt else (self.block_sum or self.L * self.block)
        return saved + self.kept()

    def kept(self) -> int:
        """The 8-bit layers' inputs of all blocks: alive from the forward till backward ends, through
        non-reentrant checkpointing (a reentrant one runs the forward without a graph: none kept)."""
        if self.layers:
            return self.held * sum(not (l.ckpt and self.reentrant) for l in self.layers)
        return 0 if self.ckpt and self.reentrant else self.L * self.held

    def activation_bytes(self) -> int:
        """Saved bytes that are neither logits/loss nor autocast weight copies."""
        return self.saved_bytes() - self.logits_saved - self.copies_saved + self.copies_head_in

    def logits_bytes(self) -> int:
        """Logits and loss at the loss: saved (log-softmax, scenario 1's head input) and alive."""
        return self.logits_saved - self.copies_head_in + self.logits_live

    def saved_bytes(self) -> int:
        """All bytes saved for backward when the forward ends (what the hooks count)."""
        return self.embed + self.blocks() + self.shared + self.head + self.logits_saved


def mixer_of(st: Setup, layer: int) -> str:
    """Block ``layer``'s token mixer where the blocks differ in it (``Setup.linear_at``: Qwen3.5's Gated DeltaNet
    layers), else ""."""
    if not st.linear_at:
        return ""
    return "linear_attention" if layer in st.linear_at else "full_attention"


def by_mixer(st: Setup, entries: list, split: bool) -> list:
    """The replay's entries, (masked, layers, input) each (block 1 alone first where ``split``), split by token mixer
    where the blocks differ in it: (masked, layers, input, mixer). Such blocks all get a mask or none (no sliding
    window), so each entry is all the blocks of its input."""
    if not st.linear_at:
        return [(m, n, inp, "") for m, n, inp in entries]
    out = [(*entries[0], mixer_of(st, 0))] if split else []
    first = 1 if split else 0
    linear = sum(i >= first for i in st.linear_at)
    for m, n, inp in entries[first:]:
        out += [(m, k, inp, mixer) for k, mixer in ((linear, "linear_attention"), (n - linear, "full_attention")) if k]
    return out


def replay(st: Setup) -> Replay:
    """Replay one training forward of ``st`` and count what it saves (see :mod:`kit.estimate.replay`)."""

    declared = family(st.family)
    if declared.whole:   # not one stack of blocks (an encoder-decoder): the family replays its whole forward
        return declared.whole(st)
    block_fn = declared.block
    T, H, V = st.T, st.H, st.V
    tp = LigerTape(st) if st.liger else Tape(st)  # Liger's kernels: its own rules (kit.estimate.replay.liger)
    # The embeddings' output requires grad when the embeddings train, or when enable_input_require_grads'
    # hook makes it (Setup.input_grad); with LoRA on a frozen embedding and no hook, block 1's input needs
    # none (its first norm saves nothing), and only its adapters' outputs bring grads in. So too with the
    # embeddings frozen in a full fine-tune (Setup.embed_frozen).
    embed_trains = (st.base_trainable and not st.embed_frozen) or st.embed_trains
    rg = embed_trains or st.input_grad
    if embed_trains:
        tp.save(tp.new(T, I64, False))  # the embedding keeps the ids
        if block_fn.positions and st.base_trainable:
            tp.save(tp.new(st.S, I64, False))  # ... and the position embedding the positions
        for _ in range(block_fn.id_rows):  # (RoBERTa's position ids and token types, made from the ids)
            tp.save(tp.new(T, I64, False))
    x = tp.new(T * H, st.w_other, rg)
    x = tp.new(T * H, st.w_other, rg) if block_fn.embed_scale else x  # embeds * scale: keeps the 0-d scale
    x = tp.layer_norm(x, st.base_trainable and not st.embed_frozen) if block_fn.embed_norm else x  # BERT's, on the sum
    x = tp.binary(x, tp.new(T, x.dt, False), save_b=True) if block_fn.embed_mask else x   # * mask (DeBERTa's)
    x = tp.dropout(x, st.p_embd) if block_fn.embd_dropout else x
    embed = tp.total()
    embed_order = tuple(tp.order)

    def run(masked, inp, mixer=""):
        tp.saved, tp.order, tp.outs, tp.cache, tp.copies, tp.wsaved, tp.held = {}, [], [], 0, 0, set(), {}
        tp.masked, tp.first, tp.mixer = masked, block_fn.first_layer and inp is x, mixer
        return block_fn(tp, inp)

    # Block 1 reads the embeddings' output; the others read a block's output, which can differ from it: it
    # requires grad where the embeddings' does not (LoRA, above), or has another dtype (bf16 embeddings plus
    # a half linear's output promote to fp32 under fp16 autocast). Then block 1 is replayed alone.
    kinds_of = st.layer_kinds()
    y1 = run(st.first_masked(), x, mixer_of(st, 0))
    if st.frozen_below:  # the frozen blocks ran with no grad to record: the first trained block reads their output,
        x = tp.new(T * H, y1.dt, False)  # which needs none
        y1 = run(st.first_masked(), x, mixer_of(st, 0))
    entries = [(m, n, x) for m, n in kinds_of.items()]  # (masked, layers, input) per replay
    split = (y1.dt, y1.rg) != (x.dt, x.rg) or block_fn.first_layer
    if split:
        rest = tp.new(T * H, y1.dt, y1.rg)
        entries = [(st.first_masked(), 1, x)] + [(m, n - (m == st.first_masked()), rest)
                                                 for m, n in kinds_of.items() if n - (m == st.first_masked())]
    entries = by_mixer(st, entries, split)   # (masked, layers, input, token mixer) per replay
    kinds, orders = [], {}  # (saved, layers, weight copies saved, backward peak, its weight grads, input kept) per
    # replay; the saving order of each kind's saved bytes
    more = []   # (its input is saved, autocast copies made, of them cached unsaved, the input's bytes) per replay
    held = (0, 0)  # 8-bit layers' inputs kept as ctx attributes, and those of them also saved (Replay.held)
    cache = 0
    for masked, layers, inp, mixer in entries:
        y = run(masked, inp, mixer)
        kinds.append((tp.total(), layers, tp.copies_saved(), *(tp.backward_peak(T * H * y.dt) if y.rg else (0, 0)),
                      T * H * inp.dt if inp.rg else 0))
        orders[kinds[-1]] = tuple(tp.order)
        held = max(held, (sum(tp.held.values()), sum(b for u, b in tp.held.items() if u in tp.saved)))
        cache += layers * (tp.copies if st.ckpt else tp.cache)
        more.append((inp.uid in tp.saved, tp.copies, tp.cache, T * H * inp.dt))
    # BERT's forward ends in its last block with its locals alive, and BertModel's embedding_output (tp.block_locals)
    unsaved = sum(t.n * t.dt for t in {t.uid: t for t in tp.block_locals}.values() if t.uid not in tp.saved) \
        + (0 if more[0][0] or st.L == 1 else T * H * x.dt) if tp.block_locals else 0
    block, _, copies_block, bwd, bwd_grads, _ = biggest = max(kinds)  # the moments take the biggest block
    block_sum = sum(saved * layers for saved, layers, *_ in kinds) if len(kinds) > 1 else 0
    copies_sum = sum(c * layers for _, layers, c, *_ in kinds)
    # checkpointing keeps each block's input: the last block's output where every block reads one
    block_in = T * H * y.dt if y.rg else 0
    block_in_sum = sum(k[-1] * k[1] for k in kinds) if split else 0
    shared = tp.shared * st.rope_sets + sum(tp.once.values()) if y.rg else 0
    layers, trl = (), None
    if offload.layered(st):  # partial or offloaded checkpointing: per-block records, and the autocast cache they make
        layers, cache = offload.per_layer(st, entries, kinds, more, x.dt, offload.leaf_input(st, block_fn))
    if st.ckpt and y.rg:  # checkpointing also keeps the attention masks for the recompute
        shared += offload.kept_masks(st, x.dt) if layers else st.kept_masks(x.dt)
    tp.saved, tp.cache, tp.copies, tp.wsaved = {}, 0, 0, set()
    head_from = len(tp.order)   # the head's saved tensors follow in tp.order

    if not (y.rg or st.lora):  # nothing in the base needs a grad (scenario 1's frozen GPT-2): it saves nothing
        embed, embed_order, block, block_sum, shared = 0, (), 0, 0, 0

    def with_head(**head_part) -> Replay:
        """The replay: the embeddings' and blocks' part read above, beside the head's part given."""
        held_bytes, held_dup = held if y.rg else (0, 0)
        return Replay(L=st.L - st.frozen_below, frozen=st.frozen_below, ckpt=st.ckpt, embed=embed, block=block,
                      block_in=block_in, shared=shared,
                      block_bwd=bwd, block_bwd_grads=bwd_grads, hidden=T * H * y.dt, copies_block=copies_block,
                      block_sum=block_sum, held=held_bytes, held_dup=held_dup, reentrant=st.reentrant,
                      block_in_sum=block_in_sum, copies_sum=copies_sum,
                      block_order=orders[biggest] if block else (), layers=layers, embed_order=embed_order,
                      **head_part)

    h = getattr(tp, block_fn.final_norm)(y, st.base_trainable and not st.final_norm_frozen) \
        if block_fn.final_norm else y
    head_trains = (st.base_trainable and not st.lm_head_frozen) or st.lm_head_trains
    if st.task != "causal-lm":  # a classifier head (kit.estimate.replay.task_heads): no vocabulary logits
        ch = classifier_head(tp, h, declared.task_head)
        return with_head(head=tp.total(), head_in=0, loss=ch.loss, logits_live=ch.live, cache=cache + tp.cache,
                         copies_head=tp.copies_saved(), copies_head_in=0, last_logits=ch.last, ls=ch.ls,
                         head_order=tuple(tp.order[head_from:]), transient=tp.transient + unsaved,
                         shared_grad=tp.shared_grad if y.rg else 0)
    if st.fused_head or "flce" in st.liger:  # no logits: TRL's SFTTrainer's tiles (kit.estimate.replay.fused_head)
        fh = chunked_head(B=st.B, S=st.S, H=H, V=V, hidden_dt=h.dt, weight_dt=st.w_other, compute_dt=st.ac or h.dt,
                          head_trainable=head_trains, hidden_grad=h.rg, device=st.device) if st.fused_head \
            else flce_head(B=st.B, S=st.S, H=H, V=V, hidden_dt=h.dt, weight_dt=st.w_other, ac=st.ac,
                           head_trainable=head_trains, hidden_grad=h.rg, liger_norm="rms_norm" in st.liger,
                           norm_dt=st.w_other)   # ... or Liger's fused linear cross-entropy's chunks
        cache += fh.get("cache", 0)
        if st.trl_offload:  # TRL's OffloadActivations: what it moves to the host (kit.estimate.replay.trl_offload)
            trl = trl_offload.offloaded(st, block_fn, layers, x, y, h, leaf=offload.leaf_input(st, block_fn))
        return with_head(head=tp.total() + fh["saved"], head_in=0, loss=0, logits_live=fh["forward"], cache=cache,
                         copies_head=0, copies_head_in=0, last_logits=fh["backward"], ls=0, head_grad=0, trl=trl,
                         head_order=tuple(tp.order[head_from:]) + (fh["saved"],))
    logits = tp.linear(h, H, V, "lm_head", trainable=head_trains, w=st.w_other,
                       quant="none")
    capped = 0
    if st.logit_cap:  # logits / cap -> tanh, which keeps its output -> * cap: new logits
        capped = logits.n * logits.dt if logits.rg else 0
        logits = tp.new(logits.n, logits.dt, logits.rg)
    head, head_in, live = tp.total(), 0, logits.n * logits.dt
    copies_head, copies_head_in = tp.copies_saved(), 0
    if st.head:  # scenario 1: custom_layer(logits), one linear or a chain; the user's CrossEntropyLoss
        tp.saved, tp.wsaved = {}, set()
        fin = V
        for name, fout in st.head:
            ins = logits  # the last one's input: its grad is made in the head's backward where it requires one
            logits = tp.linear(logits, fin, fout, name, trainable=st.head_trainable, w=st.head_w, quant="none")
            fin = fout
        head_in, live = tp.total(), logits.n * logits.dt
        copies_head_in = tp.copies_saved()
    cache += tp.cache
    # ForCausalLMLoss upcasts (logits.float()); the user's loss gets fp32 only from autocast.
    ls_dt = F32 if (st.ac or not st.head) else logits.dt
    ls = logits.n * ls_dt
    live += logits.n * F32 if ls_dt != logits.dt else 0  # the fp32 copy (or accelerate's)
    return with_head(head=head, head_in=head_in, loss=ls + T * I64, logits_live=live, cache=cache,
                     copies_head=copies_head, copies_head_in=copies_head_in, last_logits=logits.n * logits.dt, ls=ls,
                     capped=capped, head_grad=(ins.n * ins.dt if ins.rg else 0) if st.head else None,
                     head_order=tuple(tp.order[head_from:]), transient=tp.transient)


@dataclass
class Moment:
    """Memory at one moment of forward/backward, beyond weights and optimizer state."""

    where: str
    activations: int
    logits: int
    copies: int         # autocast's half copies of weights (saved or cached)
    gradients: int
    temporaries: int
    host: int = 0       # pinned host memory held for saved activations (offload), beside the device's total
    restored: int = 0   # of the device's bytes, copies brought back from host copies (on a CPU: those tensors)
    held_copies: int = 0  # ... of them, copies whose host tensor is still held (counted in host too)

    @property
    def total(self) -> int:
        return self.activations + self.logits + self.copies + self.gradients + self.temporaries


def peak_moment(rp: Replay, **kw) -> Moment:
    """The largest moment of forward + backward: the largest of :func:`moments`."""
    return max(moments(rp, **kw), key=lambda m: m.total)


def moments(rp: Replay, *, grads_embed: int, grads_block: int, grads_head: int,
            wtemp_block: int, wtemp_head: int, grads_before: int = 0, head_half: int = 0,
            tied: int = 0) -> list:
    """Every moment of forward + backward that can be the largest, in time order.

    Backward walks the parts in reverse: the loss and head first, then block L ... 1, then
    the embeddings. At each part, what the earlier parts saved is still held, the later
    parts' grads are built, and the part holds its own saved tensors (recomputed, with
    checkpointing), its new grads and its temporaries. ``wtemp_*`` are a part's largest
    per-weight backward temporaries (autocast half grads, dequantization).

    ``grads_before``: the grads alive from earlier micro-batches (gradient accumulation).
    Then every grad already exists, and autograd's AccumulateGrad adds each new one in place
    (``grad += new``): a new grad lives only until it is added, so the ``grads_*`` of this
    backward are temporaries of one weight at a time (pass them in ``wtemp_*``), not a
    growing sum.

    ``head_half``: the autocast half copy of the head weight whose grad is being made. Its
    matmul's backward frees it before the half grad is cast up to the weight's dtype, so it
    is not alive beside the two grads (``wtemp_head``).

    ``tied``: a trainable weight shared by the embeddings and the head (GPT-2's wte). The head's grad
    of it waits in autograd's input buffer until the embedding's is made; the two are then summed out
    of place (the head's arrives as a transposed view, which the engine does not add into), so the
    embeddings' backward holds the new grad and the sum beside it.
    """
    if rp.walk is not None:   # a model replayed whole walks its own parts (Family.whole)
        return rp.walk(rp, grads_embed=grads_embed, grads_block=grads_block, grads_head=grads_head,
                       wtemp_block=wtemp_block, wtemp_head=wtemp_head, grads_before=grads_before,
                       head_half=head_half, tied=tied)
    acc = bool(grads_before)
    if acc:
        grads_block = grads_head = 0
    cb = rp.copies_blocks()
    copies = cb + rp.copies_head + rp.copies_head_in
    acts = rp.embed + rp.blocks() + rp.shared + rp.head - cb - rp.copies_head
    kept = rp.head_in - rp.copies_head_in + rp.loss + rp.capped  # logits and loss saved for backward
    moments = [Moment(where="forward (the last block)", activations=acts - rp.head + rp.copies_head, logits=0,
                      copies=cb + rp.cache, gradients=grads_before,
                      temporaries=rp.transient)] if rp.transient else []
    moments += [
        Moment(where="forward (at the loss)", activations=acts, logits=kept + rp.logits_live, copies=copies + rp.cache,
               gradients=grads_before, temporaries=0),
        # the loss: log-softmax's output, its grad and its input's grad, all (B, S, V)
        Moment(where="backward (loss)", activations=acts, logits=kept + 2 * rp.ls, copies=copies,
               gradients=grads_before, temporaries=0),
        # the last linear: its saved input, the logits' grad, its weight grads and temporaries
        Moment(where="backward (head)", activations=acts, logits=kept - rp.loss - rp.capped + rp.last_logits,
               copies=copies - min(copies, head_half),
               gradients=grads_before + grads_head,
               temporaries=wtemp_head + (rp.hidden if rp.head_grad is None else rp.head_grad)),
    ]
    keep = rp.kept()  # 8-bit inputs: no part of backward frees them (reentrant: a block's, in its own backward)
    # reentrant checkpointing runs each block's backward as its own: the recomputed output stays alive through
    # it (torch.utils.checkpoint.CheckpointFunction.backward's ``outputs``), as do its 8-bit inputs
    own = rp.held - rp.held_dup + rp.hidden if rp.ckpt and rp.reentrant else 0
    each = rp.block_in if rp.ckpt else rp.block
    if rp.layers:  # partial or offloaded checkpointing: every block (kit.estimate.replay.offload)
        moments += offload.block_moments(rp, Moment, keep=keep, grads_before=grads_before, grads_head=grads_head,
                                         grads_block=grads_block, acc=acc, wtemp_block=wtemp_block)
    for i in (rp.L, 1) if not rp.layers else ():
        c = rp.copies_block * (1 if rp.ckpt else i)
        before = (i - 1) * each if rp.ckpt or i == 1 else rp.blocks() - keep - rp.block  # the blocks below block i
        held = rp.embed + rp.shared + before + rp.block - c + keep + own
        grads = grads_before + grads_head + (rp.L - i) * grads_block + (0 if acc else rp.block_bwd_grads)
        moments.append(Moment(where=f"backward (block {rp.frozen + i})", activations=held, logits=0, copies=c,
                              gradients=grads,
                              temporaries=rp.block_bwd - rp.block + wtemp_block + (rp.shared_grad if i < rp.L else 0)))
    moments.append(Moment(where="backward (embeddings)", activations=rp.embed + keep, logits=0, copies=0,
                          gradients=grads_before + (0 if acc else grads_head + rp.L * grads_block + grads_embed),
                          temporaries=rp.hidden + (grads_embed + tied if acc else 2 * tied)))
    return offload.adjust(rp, moments) if rp.layers else moments
