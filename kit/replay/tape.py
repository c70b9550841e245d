"""The tape: symbolic tensors, and what each op saves for backward.

:class:`Setup` holds the shapes, dtypes and flags of one training forward; a :class:`Tape`
replays it op by op (a family's block calls the op rules here) and records the bytes each
op saves, the gradients backward will make, and autocast's weight copies.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

F32, HALF, BOOL, I64 = 4, 2, 1, 8


@dataclass
class Setup:
    """What the replay needs: shapes, dtypes (bytes per element) and flags."""

    family: str                  # a key of kit.replay.FAMILIES: "gpt2", "llama"
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
    head: tuple = ()             # scenario 1: linears on the logits, ((name, out_features), ...) in order:
                                 # (("custom_layer", V),) for the user's Linear(V, V); two for a V->r->V head
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


def around(*, final_norm: str, positions: bool = False, embd_dropout: bool = False):
    """Mark a family's block function with what its model does outside the blocks.

    ``final_norm``: the :class:`Tape` rule of the norm before the head ("layer_norm",
    "rms_norm"); ``positions``: a learned position embedding (it keeps the position ids);
    ``embd_dropout``: dropout (``Setup.p_embd``) on the embeddings' output.
    """
    def mark(block):
        block.final_norm, block.positions, block.embd_dropout = final_norm, positions, embd_dropout
        return block
    return mark


class Tape:
    """A forward replay: makes symbolic tensors and records what each op saves."""

    _ids = itertools.count()

    def __init__(self, st: Setup):
        self.st, self.saved = st, {}
        self.order, self.outs = [], []  # saved bytes in saving order; one entry per op output
        self.cache = 0       # autocast copies of trainable weights that nothing saves
        self.copies = 0      # all autocast copies of trainable weights (the cache holds them)
        self.wsaved = set()  # uids of saved weight copies
        self.shared = 0      # saved once for all blocks (rotary cos/sin)

    def new(self, n, dt, rg, gin=None):
        if rg:  # an op output in the graph: backward makes a grad this size for it
            # [saves so far, bytes, its weight's grad, its inputs' grads (None: like the last output)]
            self.outs.append([len(self.order), n * dt, 0, gin])
        return _T(next(self._ids), n, dt, rg)

    def split(self, t, parts):
        """Views of ``parts`` equal slices of ``t`` (torch.split): they share its storage."""
        return [_T(t.uid, t.n // parts, t.dt, t.rg, t.n) for _ in range(parts)]

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

    def rope(self, q, k, x):
        """Rotary embeddings: q * cos + rotate_half(q) * sin, cos/sin in ``x``'s dtype.

        cos and sin are made once per forward and shared by every block: they count once,
        in :attr:`shared` (when q or k needs a grad, so the muls keep them).
        """
        self.shared = 2 * self.st.S * self.st.hd * x.dt if (q.rg or k.rg) else 0
        return tuple(self.new(t.n, max(t.dt, x.dt), t.rg) for t in (q, k))

    def attention(self, q, k, v, width, repeat_kv=False, softmax_fp32=False):
        """Attention as sdpa's kernels or the eager code run it; returns o_proj's input.

        ``repeat_kv``: grouped-query attention copies k and v up to q's heads (``repeat_kv``)
        where eager or sdpa with a mask needs it; ``softmax_fp32``: the eager softmax runs
        in fp32 (``dtype=torch.float32``) and goes back to q's dtype.
        """
        st = self.st
        B, S, nh = st.B, st.S, st.nh
        rg = q.rg or k.rg or v.rg
        if repeat_kv and (st.math_attn or st.padded) and st.kvh != nh:
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
        probs = self.new(B * nh * S * S, F32 if (st.ac or softmax_fp32) else c, rg)
        self.save(probs, when=rg)  # softmax keeps its output
        p = self.cast(probs, q.dt if softmax_fp32 else c)
        p = self.cast(self.dropout(p, st.p_attn), c)
        self.save(p, when=v.rg)
        self.save(vc, when=rg)
        return self.new(B * S * width, out_dt, rg)  # transpose(1, 2).contiguous()
