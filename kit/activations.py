"""Activations, logits and the backward timeline, replayed op by op from the real forward.

What autograd keeps for backward depends on what each op saves. :func:`replay` walks the
training forward of a GPT-2 or Llama block, of the head and of the loss, op by op, in the
order and with the dtypes of transformers' code (``GPT2Block``, ``LlamaDecoderLayer``,
``ForCausalLMLoss``) and of torch's kernels, and adds up the tensors each op saves, as
``torch.autograd.graph.saved_tensors_hooks`` counts them: unique storages, parameters
excluded, and only what the grads that are needed use. Autocast follows the CUDA op lists
(``linear``/``matmul``/sdpa in half; ``layer_norm``/``softmax``/``pow``/``rsqrt``/
``cross_entropy`` in fp32). ``device="cpu"`` switches the two kernel choices that differ
on a CPU (dropout keeps a float mask, not a bool one; sdpa with dropout takes the math
path), so the tests can check the replay against autograd on tiny CPU twins.
Korthikanti et al. 2022 count the same way for GELU MLPs without GQA; here GQA, SwiGLU,
the vocab and the dtypes all come from the config.

>>> s = Setup(family="llama", B=1, S=8, H=64, F=176, nh=4, kvh=2, hd=16, V=1000, L=2)
>>> replay(s).saved_bytes() > 0
True
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

F32, HALF, BOOL, I64 = 4, 2, 1, 8


@dataclass
class Setup:
    """What the replay needs: shapes, dtypes (bytes per element) and flags."""

    family: str                  # "gpt2" or "llama"
    B: int
    S: int
    H: int
    F: int                       # MLP width
    nh: int
    kvh: int
    hd: int
    V: int
    L: int
    w: int = F32                 # float block weights
    w_other: int = F32           # embeddings, norms, lm_head
    ac: int | None = None        # autocast dtype (HALF) under Trainer fp16/bf16, else None
    base_trainable: bool = True  # full fine-tuning; False: frozen base (LoRA, scenario 1)
    quant: str = "none"          # block linears: "none", "8bit", "4bit"
    lora: dict = field(default_factory=dict)  # block linear name ("self_attn.q_proj") -> rank
    lora_dropout: float = 0.0
    input_grad: bool = False     # the embeddings' output requires grad (enable_input_require_grads)
    attn: str = "sdpa"           # "sdpa" or "eager"
    padded: bool = True          # the batch has padding, so an attention mask is built
    ckpt: bool = False           # gradient checkpointing of the blocks
    device: str = "cuda"         # whose kernels: "cuda" (the prediction) or "cpu" (tests)
    p_attn: float = 0.0
    p_resid: float = 0.0
    p_embd: float = 0.0
    head_out: int = 0            # scenario 1: a trainable Linear(V, head_out) on the logits
    head_w: int = F32
    head_trainable: bool = True

    @property
    def T(self) -> int:
        return self.B * self.S

    @property
    def math_attn(self) -> bool:
        """Eager attention, or sdpa's math path (a CPU with attention dropout)."""
        return self.attn == "eager" or (self.device == "cpu" and self.p_attn > 0)


@dataclass
class _T:
    uid: int
    n: int       # elements of this tensor
    dt: int      # bytes per element
    rg: bool     # requires grad
    sn: int = 0  # elements of its storage, when it is a view of a bigger one


class _Tape:
    """A forward replay: makes symbolic tensors and records what each op saves."""

    _ids = itertools.count()

    def __init__(self, st: Setup):
        self.st, self.saved = st, {}
        self.order, self.outs = [], []  # saved bytes in saving order; one entry per op output
        self.cache = 0       # autocast copies of trainable weights that nothing saves
        self.copies = 0      # all autocast copies of trainable weights (the cache holds them)
        self.wsaved = set()  # uids of saved weight copies

    def new(self, n, dt, rg, gin=None):
        if rg:  # an op output in the graph: backward makes a grad this size for it
            # [saves so far, bytes, its weight's grad, its inputs' grads (None: like the last output)]
            self.outs.append([len(self.order), n * dt, 0, gin])
        return _T(next(self._ids), n, dt, rg)

    def save(self, *ts, when=True):
        for t in ts:
            if when and t.uid not in self.saved:
                self.saved[t.uid] = (t.sn or t.n) * t.dt
                self.order.append(self.saved[t.uid])

    def backward_peak(self, flowing: int) -> tuple[int, int]:
        """Peak of walking this tape backward: an op's saved tensors are freed once it has run.

        At the op that made output k, the tensors saved up to it are held, plus the grad
        of its output, the grad of its input (about the previous output's size), the
        residual stream's grad ``flowing`` and the weight grads made so far (ops >= k).
        """
        prefix, grads = [0], sum(o[2] for o in self.outs)
        for b in self.order:
            prefix.append(prefix[-1] + b)
        best = (prefix[-1] + flowing, 0)  # (saved + grads of activations, weight grads)
        for k, (pos, b, pg, gin) in enumerate(self.outs):
            gin = gin if gin is not None else self.outs[k - 1][1] if k else flowing
            here = (prefix[pos] + b + gin + flowing, grads)
            best = max(best, here, key=sum)
            grads -= pg
        return best

    def cast(self, t, dt):
        return t if t.dt == dt else self.new(t.n, dt, t.rg)

    def total(self) -> int:
        return sum(self.saved.values())

    def copies_saved(self) -> int:
        return sum(b for u, b in self.saved.items() if u in self.wsaved)

    def binary(self, a, b, save_a=False, save_b=False):
        """add (saves nothing) or mul (keeps each operand the other's grad needs)."""
        self.save(a, when=save_a and b.rg)
        self.save(b, when=save_b and a.rg)
        mul, dt = save_a or save_b, max(a.dt, b.dt)  # add passes its grad through; mul makes new ones
        gin = sum(t.n * t.dt for t in (a, b) if t.rg and (mul or t.dt != dt))
        return self.new(max(a.n, b.n), dt, a.rg or b.rg, gin)

    def dropout(self, x, p):
        if p <= 0:
            return x
        # CUDA: native_dropout keeps a bool mask; CPU: x * noise keeps the float noise.
        self.save(self.new(x.n, BOOL if self.st.device == "cuda" else x.dt, False), when=x.rg)
        return self.new(x.n, x.dt, x.rg)

    def linear(self, x, fin, fout, name="", trainable=None, w=None, quant=None):
        st = self.st
        trainable = st.base_trainable if trainable is None else trainable
        w, quant = (st.w if w is None else w), (st.quant if quant is None else quant)
        rows = x.n // fin
        if quant == "4bit":  # Linear4bit: x.to(bf16); MatMul4Bit keeps no activation
            out = self.cast(self.new(rows * fout, HALF, x.rg), x.dt)
        elif quant == "8bit":  # MatMul8bitLt keeps its input A for A's grad
            self.save(x, when=x.rg)
            out = self.new(rows * fout, x.dt, x.rg)
        else:
            xin, dt = x, max(x.dt, w)
            if st.ac:  # autocast: half copies of the input and of the weight
                xin, dt = self.cast(x, st.ac), st.ac
                if w != st.ac:
                    wc = self.new(fin * fout, st.ac, False)
                    self.save(wc, when=x.rg)  # kept for the input's grad
                    if x.rg:
                        self.wsaved.add(wc.uid)
                    if trainable:  # a leaf's copy sits in autocast's cache till forward ends
                        self.copies += wc.n * wc.dt
                        self.cache += 0 if x.rg else wc.n * wc.dt
            self.save(xin, when=trainable)
            out = self.new(rows * fout, dt, x.rg or trainable)
            if out.rg:  # only an output in the graph has an entry in outs to carry its weight's grad
                self.outs[-1][2] = fin * fout * w if trainable else 0
        r = st.lora.get(name, 0)
        if r:  # peft: result + lora_B(lora_A(dropout(x.to(fp32)))) * scaling
            xl = self.dropout(self.cast(x, F32), st.lora_dropout)
            a = self.linear(xl, fin, r, trainable=True, w=F32, quant="none")
            lo = self.linear(a, r, fout, trainable=True, w=F32, quant="none")
            out = self.cast(self.binary(out, lo), out.dt)  # result.to(torch_result_dtype)
        return out

    def layer_norm(self, x, trainable):
        x = self.cast(x, F32) if self.st.ac else x  # layer_norm: autocast's fp32 list
        stats = F32 if self.st.device == "cuda" else x.dt  # mean, rstd
        self.save(x, self.new(x.n // self.st.H * 2, stats, False), when=x.rg or trainable)
        return self.new(x.n, x.dt, x.rg or trainable)

    def rms_norm(self, x, trainable):
        # LlamaRMSNorm: h = x.float(); h * rsqrt(h.pow(2).mean(-1) + eps); weight * h.to(x.dtype)
        xf = self.cast(x, F32)
        self.save(xf, self.new(x.n // self.st.H, F32, False), when=x.rg)  # pow/mul; rsqrt's out
        normed = self.cast(self.new(x.n, F32, x.rg), x.dt)
        self.save(normed, when=trainable)
        return self.new(x.n, max(x.dt, self.st.w_other), x.rg or trainable)

    def gelu_new(self, x):
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
        xp = self.cast(x, F32) if self.st.ac else x  # pow: fp32 list
        self.save(xp, when=x.rg)
        self.save(self.new(x.n, xp.dt, x.rg), when=x.rg)  # tanh keeps its output
        half_x, one_plus = self.new(x.n, x.dt, x.rg), self.new(x.n, xp.dt, x.rg)
        return self.binary(half_x, one_plus, True, True)

    def attention(self, q, k, v, width):
        """Attention as sdpa's kernels or the eager code run it; returns o_proj's input."""
        st = self.st
        B, S, nh = st.B, st.S, st.nh
        rg = q.rg or k.rg or v.rg
        if st.family == "llama" and (st.math_attn or st.padded) and st.kvh != nh:
            k, v = self.new(q.n, k.dt, k.rg), self.new(q.n, v.dt, v.rg)  # repeat_kv copies
        if not st.math_attn:  # flash (no mask) / memory-efficient (mask) / CPU flash
            if st.ac:
                q, k, v = (self.cast(t, st.ac) for t in (q, k, v))
            self.save(q, k, v, self.new(B * nh * S, F32, False), when=rg)  # + logsumexp
            if st.padded:  # the bool mask, made float in q's dtype, on every call
                cols = -(-S // 16) * 16 if st.device == "cuda" else S
                self.save(self.new(B * S * cols, q.dt, False), when=rg)
            out = self.new(q.n, q.dt, rg)  # laid out (B, S, nh, hd): o_proj reads it as is
            self.save(out, when=rg)
            return out
        c = st.ac or max(q.dt, k.dt)
        out_dt = c
        if st.attn == "sdpa":  # sdpa's math path on a CPU computes half inputs in fp32
            c = F32
        qc, kc, vc = (self.new(q.n, c, t.rg) for t in (q, k, v))  # bmm's contiguous copies
        self.save(qc, when=k.rg)
        self.save(kc, when=q.rg)
        probs = self.new(B * nh * S * S, F32 if (st.ac or st.family == "llama") else c, rg)
        self.save(probs, when=rg)  # softmax keeps its output
        p = self.cast(probs, c if st.family == "gpt2" else q.dt)
        p = self.cast(self.dropout(p, st.p_attn), c)
        self.save(p, when=v.rg)
        self.save(vc, when=rg)
        return self.new(B * S * width, out_dt, rg)  # transpose(1, 2).contiguous()


def _gpt2_block(tp: _Tape, x):
    st, H = tp.st, tp.st.H
    qkv = tp.linear(tp.layer_norm(x, st.base_trainable), H, 3 * H, "attn.c_attn")
    q, k, v = (_T(qkv.uid, qkv.n // 3, qkv.dt, qkv.rg, qkv.n) for _ in range(3))  # split views
    a = tp.dropout(tp.linear(tp.attention(q, k, v, H), H, H, "attn.c_proj"), st.p_resid)
    x = tp.binary(a, x)
    f = tp.gelu_new(tp.linear(tp.layer_norm(x, st.base_trainable), H, st.F, "mlp.c_fc"))
    return tp.binary(tp.dropout(tp.linear(f, st.F, H, "mlp.c_proj"), st.p_resid), x)


def _llama_block(tp: _Tape, x):
    st, H = tp.st, tp.st.H
    h = tp.rms_norm(x, st.base_trainable)
    q = tp.linear(h, H, st.nh * st.hd, "self_attn.q_proj")
    k = tp.linear(h, H, st.kvh * st.hd, "self_attn.k_proj")
    v = tp.linear(h, H, st.kvh * st.hd, "self_attn.v_proj")
    # RoPE: q * cos + rotate_half(q) * sin, cos/sin in the embeddings' dtype (fp32 under autocast)
    q, k = (tp.new(t.n, max(t.dt, x.dt), t.rg) for t in (q, k))
    x = tp.binary(tp.linear(tp.attention(q, k, v, st.nh * st.hd), st.nh * st.hd, H,
                            "self_attn.o_proj"), x)
    h = tp.rms_norm(x, st.base_trainable)
    g = tp.linear(h, H, st.F, "mlp.gate_proj")
    tp.save(g, when=g.rg)  # SiLU keeps its input
    p = tp.binary(tp.new(g.n, g.dt, g.rg), tp.linear(h, H, st.F, "mlp.up_proj"), True, True)
    return tp.binary(tp.linear(p, st.F, H, "mlp.down_proj"), x)


@dataclass
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

    @property
    def copies_saved(self) -> int:
        """Saved autocast weight copies (part of :meth:`saved_bytes`)."""
        return (0 if self.ckpt else self.L * self.copies_block) + self.copies_head + self.copies_head_in

    @property
    def logits_saved(self) -> int:
        """Saved bytes that are logits or loss: scenario 1's head input, log-softmax, targets."""
        return self.head_in + self.loss

    def blocks(self) -> int:
        return self.L * (self.block_in if self.ckpt else self.block)

    def activation_bytes(self) -> int:
        """Saved bytes that are neither logits/loss nor autocast weight copies."""
        return self.saved_bytes() - self.logits_saved - self.copies_saved + self.copies_head_in

    def logits_bytes(self) -> int:
        """Logits and loss at the loss: saved (log-softmax, scenario 1's head input) and alive."""
        return self.logits_saved - self.copies_head_in + self.logits_live

    def saved_bytes(self) -> int:
        """All bytes saved for backward when the forward ends (what the hooks count)."""
        return self.embed + self.blocks() + self.shared + self.head + self.logits_saved


def replay(st: Setup) -> Replay:
    """Replay one training forward of ``st`` and count what it saves (see the module doc)."""
    T, H, V = st.T, st.H, st.V
    tp = _Tape(st)
    rg = st.base_trainable or st.input_grad or bool(st.lora)  # (LoRA: as from layer 1 on)
    if st.base_trainable:
        tp.save(tp.new(T, I64, False))  # the embedding keeps the ids
        if st.family == "gpt2":
            tp.save(tp.new(st.S, I64, False))  # ... and wpe the positions
    x = tp.new(T * H, st.w_other, rg)
    x = tp.dropout(x, st.p_embd) if st.family == "gpt2" else x
    embed = tp.total()
    tp.saved, tp.order, tp.outs = {}, [], []
    y = (_gpt2_block if st.family == "gpt2" else _llama_block)(tp, x)
    block, copies_block = tp.total(), tp.copies_saved()
    bwd, bwd_grads = tp.backward_peak(T * H * y.dt) if y.rg else (0, 0)
    cache = st.L * (tp.copies if st.ckpt else tp.cache)
    shared = 2 * st.S * st.hd * x.dt if st.family == "llama" and y.rg else 0  # cos, sin
    if st.ckpt and y.rg:  # checkpointing also keeps the attention mask for the recompute
        shared += st.B * st.S * st.S * (x.dt if st.attn == "eager" else BOOL if st.padded else 0)
    tp.saved, tp.cache, tp.copies, tp.wsaved = {}, 0, 0, set()
    h = (tp.layer_norm if st.family == "gpt2" else tp.rms_norm)(y, st.base_trainable)
    logits = tp.linear(h, H, V, "lm_head", trainable=st.base_trainable, w=st.w_other, quant="none")
    head, head_in, live = tp.total(), 0, logits.n * logits.dt
    copies_head, copies_head_in = tp.copies_saved(), 0
    if st.head_out:  # scenario 1: custom_layer(logits); the user's CrossEntropyLoss
        tp.saved, tp.wsaved = {}, set()
        logits = tp.linear(logits, V, st.head_out, "custom_layer", trainable=st.head_trainable,
                           w=st.head_w, quant="none")
        head_in, live = tp.total(), logits.n * logits.dt
        copies_head_in = tp.copies_saved()
    cache += tp.cache
    # ForCausalLMLoss upcasts (logits.float()); the user's loss gets fp32 only from autocast.
    ls_dt = F32 if (st.ac or not st.head_out) else logits.dt
    ls = logits.n * ls_dt
    live += logits.n * F32 if ls_dt != logits.dt else 0  # the fp32 copy (or accelerate's)
    if not (y.rg or st.lora):  # nothing in the base needs a grad (scenario 1's frozen GPT-2)
        embed = block = shared = 0
    return Replay(st.L, st.ckpt, embed, block, T * H * y.dt if y.rg else 0, shared, head, head_in,
                  ls + T * I64, live, cache, bwd, bwd_grads, T * H * y.dt, copies_block, copies_head, copies_head_in,
                  logits.n * logits.dt, ls)


@dataclass
class Moment:
    """Memory at one moment of forward/backward, beyond weights and optimizer state."""

    where: str
    activations: int
    logits: int
    copies: int         # autocast's half copies of weights (saved or cached)
    gradients: int
    temporaries: int

    @property
    def total(self) -> int:
        return self.activations + self.logits + self.copies + self.gradients + self.temporaries


def peak_moment(rp: Replay, *, grads_embed: int, grads_block: int, grads_head: int,
                wtemp_block: int, wtemp_head: int, grads_before: int = 0) -> Moment:
    """The largest moment of forward + backward.

    Backward walks the parts in reverse: the loss and head first, then block L ... 1, then
    the embeddings. At each part, what the earlier parts saved is still held, the later
    parts' grads are built, and the part holds its own saved tensors (recomputed, with
    checkpointing), its new grads and its temporaries. ``wtemp_*`` are a part's largest
    per-weight backward temporaries (autocast half grads, accumulation, dequantization).
    ``grads_before`` are grads alive from earlier micro-batches (gradient accumulation).
    """
    cb = 0 if rp.ckpt else rp.L * rp.copies_block
    copies = cb + rp.copies_head + rp.copies_head_in
    acts = rp.embed + rp.blocks() + rp.shared + rp.head - cb - rp.copies_head
    kept = rp.head_in - rp.copies_head_in + rp.loss  # logits and loss saved for backward
    moments = [
        Moment("forward (at the loss)", acts, kept + rp.logits_live, copies + rp.cache, grads_before, 0),
        # the loss: log-softmax's output, its grad and its input's grad, all (B, S, V)
        Moment("backward (loss)", acts, kept + 2 * rp.ls, copies, grads_before, 0),
        # the last linear: its saved input, the logits' grad, its weight grads and temporaries
        Moment("backward (head)", acts, kept - rp.loss + rp.last_logits, copies, grads_before + grads_head,
               wtemp_head + rp.hidden),
    ]
    each = rp.block_in if rp.ckpt else rp.block
    for i in (rp.L, 1):
        c = rp.copies_block * (1 if rp.ckpt else i)
        held = rp.embed + rp.shared + (i - 1) * each + rp.block - c
        grads = grads_before + grads_head + (rp.L - i) * grads_block + rp.block_bwd_grads
        moments.append(Moment(f"backward (block {i})", held, 0, c, grads,
                              rp.block_bwd - rp.block + wtemp_block))
    moments.append(Moment("backward (embeddings)", rp.embed, 0, 0,
                          grads_before + grads_head + rp.L * grads_block + grads_embed, rp.hidden))
    return max(moments, key=lambda m: m.total)
