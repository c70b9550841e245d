"""The tape: symbolic tensors, and what each op saves for backward.

:class:`~kit.estimate.replay.setup.Setup` holds the shapes, dtypes and flags of one training forward; a
:class:`Tape` replays it op by op (a family's block calls the op rules here) and records the bytes each
op saves, the gradients backward will make, and autocast's weight copies.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from kit.estimate.replay.setup import BOOL, F32, Dt, Setup, promote


@dataclass
class _T:
    uid: int
    n: int       # elements of this tensor
    dt: Dt       # its dtype (an int: bytes per element)
    rg: bool     # requires grad
    sn: int = 0  # elements of its storage, when it is a view of a bigger one


@dataclass
class Output:
    """One op output in the graph, as the backward walk needs it."""

    saves_before: int             # how many tensors were saved before it (its position in Tape.order)
    nbytes: int                   # its bytes: backward makes a grad this size for it
    weight_grad: int = 0          # bytes of its weight's grad (0: none, or frozen)
    input_grad: int | None = None  # bytes of its inputs' grads (None: about the previous output's)
    temporaries: int = 0          # its backward's temporaries (a quantized weight, dequantized)


class Tape:
    """A forward replay: makes symbolic tensors and records what each op saves."""

    _ids = itertools.count()

    def __init__(self, st: Setup):
        self.st, self.saved = st, {}
        self.masked = st.padded  # this block's attention gets a mask (see Setup.layer_kinds)
        self.first = False       # this is block 1, replayed alone (the around mark's first_layer)
        self.heads_first = False  # rope's q comes out (B, nh, S, hd)-contiguous (its cat), see attention
        self.order, self.outs = [], []  # saved bytes in saving order; one entry per op output
        self.cache = 0       # autocast copies of trainable weights that nothing saves
        self.copies = 0      # all autocast copies of trainable weights (the cache holds them)
        self.wsaved = set()  # uids of saved weight copies
        self.shared = 0      # saved once for all blocks (rotary cos/sin)
        self.held = {}       # uid -> bytes of 8-bit layers' inputs, kept as ctx attributes (kit.estimate.quantization)
        self.transient = 0   # alive at the last block's end in the forward, saved by nothing (a block sets it)
        self.shared_grad = 0  # a grad of an input all blocks share, growing from the last block's backward on
        self.block_locals = ()  # an encoder block's tensors alive at its last op, saved or not (replay.bert)
        self.once = {}       # name -> bytes of a tensor saved by every block of a kind but stored once (the padding
        #                      mask a linear-attention layer multiplies by: kit.estimate.replay.linear_attention)
        self.mixer = ""      # this block's token mixer where the blocks differ in it (Setup.linear_at)

    def new(self, n, dt, rg, gin=None):
        if rg:  # an op output in the graph: backward makes a grad this size for it
            self.outs.append(Output(len(self.order), n * dt, input_grad=gin))
        return _T(next(self._ids), n, dt, rg)

    def split(self, t, parts):
        """Views of slices of ``t`` (torch.split/chunk, or slicing): they share its storage.

        ``parts``: how many equal slices, or the widths of the slices (summing to ``t``'s).
        """
        widths = [1] * parts if isinstance(parts, int) else list(parts)
        return [_T(t.uid, t.n * w // sum(widths), t.dt, t.rg, t.sn or t.n) for w in widths]

    def save(self, *ts, when=True):
        for t in ts:
            # (without checkpointing an 8-bit layer's input is one storage, kept longer by the layer: see linear)
            if when and t.uid not in self.saved and not (t.uid in self.held and not self.st.ckpt):
                self.saved[t.uid] = (t.sn or t.n) * t.dt
                self.order.append(self.saved[t.uid])

    def backward_peak(self, flowing: int) -> tuple[int, int]:
        """Peak of walking this tape backward: an op's saved tensors are freed once it has run.

        At the op that made output k, the tensors saved up to it are held, plus the grad
        of its output, the grad of its input (about the previous output's size), the
        residual stream's grad ``flowing`` and the weight grads made so far (ops >= k).
        """
        prefix, grads = [0], sum(o.weight_grad for o in self.outs)
        for b in self.order:
            prefix.append(prefix[-1] + b)
        best = (prefix[-1] + flowing, 0)  # (saved + grads of activations, weight grads)
        for k, o in enumerate(self.outs):
            gin = o.input_grad if o.input_grad is not None else self.outs[k - 1].nbytes if k else flowing
            here = (prefix[o.saves_before] + o.nbytes + gin + flowing + o.temporaries, grads)
            best = max(best, here, key=sum)
            grads -= o.weight_grad
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
        mul, dt = save_a or save_b, promote(a.dt, b.dt)  # add passes its grad through; mul makes new ones
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
        if quant == "4bit":  # Linear4bit: x.to(compute dtype); MatMul4Bit keeps no activation ...
            out = self.new(rows * fout, st.compute, x.rg)
            # ... and its backward dequantizes the weight for x's grad (kit.estimate.quantization.dequant_bytes)
            if x.rg:
                self.outs[-1].temporaries = fin * fout * st.dequant
            out = self.cast(out, x.dt)
        elif quant == "8bit":  # MatMul8bitLt keeps its input A for A's grad as a ctx attribute, not a saved
            # tensor: alive till the graph goes (kit.estimate.quantization)
            if x.rg and (st.ckpt or x.uid not in self.saved):
                self.held[x.uid] = (x.sn or x.n) * x.dt
            out = self.new(rows * fout, x.dt, x.rg)
            if x.rg:  # its backward copies the int8 weight into x's dtype, scaled by the row scales / 127
                self.outs[-1].temporaries = fin * fout * x.dt + 4 * fout
        else:
            xin, dt = x, promote(x.dt, w)
            if st.ac:  # autocast: half copies of the input and of the weight (a bf16 weight under fp16 too)
                xin, dt = self.cast(x, st.ac), st.ac
                if w != st.ac:
                    wc = self.new(fin * fout, st.ac, False)
                    self.save(wc, when=x.rg)  # kept for the input's grad
                    if x.rg:
                        self.wsaved.add(wc.uid)
                    # autocast's cast cache keeps the copy of a leaf that requires grad till forward ends, and
                    # only of an fp32 one (torch's at::autocast::cached_cast, can_try_cache: arg is kFloat): a
                    # bf16 weight under fp16 is cast anew at each use and freed once nothing saves it
                    if trainable and w == F32:
                        self.copies += wc.n * wc.dt
                        self.cache += 0 if x.rg else wc.n * wc.dt
            self.save(xin, when=trainable)
            out = self.new(rows * fout, dt, x.rg or trainable)
            if out.rg:  # only an output in the graph has an entry in outs to carry its weight's grad
                self.outs[-1].weight_grad = fin * fout * w if trainable else 0
        r = st.lora.get(name, 0)
        if r:  # peft: result + lora_B(lora_A(dropout(x.to(the adapters' dtype)))) * scaling
            xl = self.dropout(self.cast(x, st.adapter), st.lora_dropout)
            a = self.linear(xl, fin, r, trainable=True, w=st.adapter, quant="none")
            lo = self.linear(a, r, fout, trainable=True, w=st.adapter, quant="none")
            if st.dora:
                return self.dora(out, lo, xl, fout)
            out = self.cast(self.binary(out, lo), out.dt)  # result.to(torch_result_dtype)
        return out

    def dora(self, out, lo, xl, fout):
        """peft's DoRA on a Linear (``tuners/lora/dora.py``, ``DoraLinearLayer.forward``): the weight norm
        ``||W + scaling B A||`` per output row comes from ``lora_B(lora_A(eye))`` detached (its graph dies with the
        forward's locals: temporaries only), then ``mag_norm_scale = magnitude / norm`` (keeps the norm),
        ``(mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * scaling`` keeps the base result
        (the layer's output, or ``F.linear(dropout(x), W)`` anew under dropout) and the LoRA result, both
        ``[T, out]``, and the result is ``result + result_dora``."""
        rows = out.n // fout
        base = out if not self.st.lora_dropout else self.new(rows * fout, out.dt, xl.rg)
        self.save(self.new(fout, self.st.adapter, False))                # the detached weight norm
        scale = self.new(fout, self.st.adapter, True)                     # magnitude / norm
        less = self.new(fout, self.st.adapter, True)                      # ... - 1
        kept = self.binary(less, base, save_a=True, save_b=True)
        scaled = self.binary(scale, lo, save_a=True, save_b=True)        # mag_norm_scale * lora_result
        lora = self.new(scaled.n, scaled.dt, True)                        # ... * scaling
        return self.cast(self.binary(out, self.binary(kept, lora)), out.dt)

    def layer_norm(self, x, trainable):
        x = self.cast(x, F32) if self.st.ac else x  # layer_norm: autocast's fp32 list
        stats = F32 if self.st.device == "cuda" else x.dt  # mean, rstd
        self.save(x, self.new(x.n // self.st.H * 2, stats, False), when=x.rg or trainable)
        return self.new(x.n, x.dt, x.rg or trainable)

    def rms_norm(self, x, trainable, dim=None, kind="cast"):
        """RMSNorm over the last ``dim`` elements (H by default; a head's hd for q/k norms).

        All kinds compute ``h = x.float(); h * rsqrt(h.pow(2).mean(-1) + eps)`` (keeping the
        fp32 input and rsqrt's output), then apply the weight:

        - ``"cast"``: ``weight * h.to(x.dtype)`` (Llama, Mistral, Qwen2/3, Phi-3): keeps the
          cast h for the weight's grad; the output promotes to the weight's dtype;
        - ``"fp32"``: ``(weight * h).to(x.dtype)`` (OLMo-2): keeps the fp32 h;
        - ``"offset"``: ``(h * (1.0 + weight.float())).type_as(x)`` (Gemma-2/3): keeps the
          fp32 h and the ``dim``-sized ``1 + weight``.
        """
        dim = dim or self.st.H
        xf = self.cast(x, F32)
        self.save(xf, self.new(x.n // dim, F32, False), when=x.rg)  # pow/mul; rsqrt's out
        h = self.new(x.n, F32, x.rg)
        if kind == "cast":
            normed = self.cast(h, x.dt)
            self.save(normed, when=trainable)
            return self.new(x.n, promote(x.dt, self.st.w_other), x.rg or trainable)
        self.save(h, when=trainable)
        if kind == "offset":
            self.save(self.new(dim, F32, False), when=x.rg)
        return self.cast(self.new(x.n, F32, x.rg or trainable), x.dt)

    def rms_norm_fp32(self, x, trainable, dim=None):
        """OLMo-2's RMSNorm (:meth:`rms_norm` kind "fp32"): the weight multiplies in fp32."""
        return self.rms_norm(x, trainable, dim, "fp32")

    def rms_norm_offset(self, x, trainable, dim=None):
        """Gemma's RMSNorm (:meth:`rms_norm` kind "offset"): ``h * (1 + weight)`` in fp32."""
        return self.rms_norm(x, trainable, dim, "offset")

    def gated_mlp(self, h, fused=False):
        """``down_proj(act(gate_proj(h)) * up_proj(h))``: SwiGLU (SiLU) or GeGLU (GELU); both
        activations keep their input, the mul keeps both operands.

        ``fused``: Phi-3's one ``gate_up_proj``, chunked into gate and up (views of its output,
        so what they keep is its whole storage).
        """
        st = self.st
        if fused:
            gate, up = self.split(self.linear(h, st.H, 2 * st.F, "mlp.gate_up_proj"), 2)
        else:
            gate = self.linear(h, st.H, st.F, "mlp.gate_proj")
        self.save(gate, when=gate.rg)  # the activation keeps its input
        a = self.new(gate.n, gate.dt, gate.rg)  # ... and makes a new output
        if not fused:
            up = self.linear(h, st.H, st.F, "mlp.up_proj")
        return self.linear(self.binary(a, up, True, True), st.F, st.H, "mlp.down_proj")

    def sigmoid(self, x):
        """``torch.sigmoid``: keeps its output."""
        out = self.new(x.n, x.dt, x.rg)
        self.save(out, when=x.rg)
        return out

    def gelu(self, x):
        """``nn.functional.gelu`` (exact or tanh-approximated): keeps its input."""
        self.save(x, when=x.rg)
        return self.new(x.n, x.dt, x.rg)

    def gelu_new(self, x):
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
        xp = self.cast(x, F32) if self.st.ac else x  # pow: fp32 list
        self.save(xp, when=x.rg)
        self.save(self.new(x.n, xp.dt, x.rg), when=x.rg)  # tanh keeps its output
        half_x, one_plus = self.new(x.n, x.dt, x.rg), self.new(x.n, xp.dt, x.rg)
        return self.binary(half_x, one_plus, True, True)

    def rope(self, q, k, x, cat=False, fp32=False, rows=1):
        """Rotary embeddings: q * cos + rotate_half(q) * sin, cos/sin in the embeddings' dtype.

        cos and sin are made once per forward and shared by every block: they count once,
        in :attr:`shared` (when q or k needs a grad, so the muls keep them). With partial
        rotary (``Setup.rotary``) they span the rotary dims. Either way q and k are new
        tensors; ``cat``: the code ends in ``torch.cat([rotated, rest], -1)`` (Phi-3,
        GPT-NeoX), which lays q out (B, nh, S, hd)-contiguous, where the elementwise ops keep
        the (B, S, nh, hd) layout of the projection's output (see :meth:`attention`).
        ``fp32``: cos/sin stay fp32 and q, k go back to their dtype after (OLMo-2). ``rows``: cos/sin are made per
        batch row (Qwen3.5's multimodal rotary embedding expands the position ids to (3, B, S)), else once for all.

        The model makes cos/sin once from its embeddings' output (``LlamaRotaryEmbedding.forward``:
        ``cos.to(dtype=x.dtype)``, x the ``inputs_embeds``), whatever the block's input ``x`` has become
        since (fp32, where bf16 embeddings met fp16 linears); q, k times them promote (fp16 * bf16: fp32).
        """
        cs = F32 if fp32 else self.st.w_other
        self.shared = 2 * rows * self.st.S * (self.st.rotary or self.st.hd) * cs if (q.rg or k.rg) else 0
        self.heads_first = cat
        if fp32:
            return tuple(self.cast(self.new(t.n, F32, t.rg), t.dt) for t in (q, k))
        return tuple(self.new(t.n, promote(t.dt, cs), t.rg) for t in (q, k))

    def attention(self, q, k, v, width, repeat_kv=False, softmax_fp32=False):
        """Attention as sdpa's kernels or the eager code run it; returns o_proj's input.

        ``repeat_kv``: grouped-query attention copies k and v up to q's heads (``repeat_kv``)
        where eager or sdpa with a mask needs it; ``softmax_fp32``: the eager softmax runs
        in fp32 (``dtype=torch.float32``) and goes back to q's dtype. With ``Setup.attn_cap``
        the eager scores are soft-capped (``tanh(s / cap) * cap``): tanh keeps its output.

        A ``v`` that is a view of a fused projection's output (Phi-3, GPT-NeoX) makes sdpa
        keep that whole output, unless ``repeat_kv`` copied it (Trainer turns ``use_cache``
        off, so no DynamicCache copies k and v); for one kv head (MQA) ``repeat_kv``'s
        expand-reshape is a view, not a copy. sdpa lays its output out like q: after rope's
        ``cat`` it is (B, nh, S, hd)-contiguous and ``transpose(1, 2).contiguous()`` copies it
        for o_proj (CUDA's memory-efficient kernel, with a mask or without, always writes
        (B, S, nh, hd); cuDNN's follows q's layout, mask or not).
        """
        st = self.st
        B, S, nh = st.B, st.S, st.nh
        rg = q.rg or k.rg or v.rg
        kernel = st.sdpa_kernel(self.masked, q.dt)   # None: eager, a CPU or no GPU architecture known
        st.kernels.add(kernel)
        math = st.math_attn or kernel == "math"
        if repeat_kv and (math or (self.masked and st.kvh > 1)) and st.kvh != nh:
            k, v = self.new(q.n, k.dt, k.rg), self.new(q.n, v.dt, v.rg)  # repeat_kv copies (or the math path's)
        if not math:  # flash (no mask) / memory-efficient (mask) / cuDNN / CPU flash
            if st.ac:   # (one kv head: repeat_kv's expand is a view of nh heads, and autocast's cast of it is whole)
                view = repeat_kv and self.masked and st.kvh == 1 != nh
                q, k, v = (self.new(q.n, st.ac, t.rg) if view and t is not q and t.dt != st.ac else self.cast(t, st.ac)
                           for t in (q, k, v))
            self.save(q, k, v, self.new(B * nh * S, F32, False), when=rg)  # + logsumexp
            if self.masked:  # the bool mask, made float in q's dtype, on every call
                cols = -(-S // 16) * 16 if st.device == "cuda" else S
                self.save(self.new(B * S * cols, q.dt, False), when=rg)
            out = self.new(q.n, q.dt, rg)  # laid out (B, S, nh, hd): o_proj reads it as is ...
            self.save(out, when=rg)
            if self.heads_first and not (st.device == "cuda" and kernel == "efficient"):
                out = self.new(q.n, q.dt, rg)  # ... unless it follows q's (B, nh, S, hd): then a copy
            return out
        c = st.ac or promote(q.dt, k.dt)
        out_dt = c
        if not st.eager:  # sdpa's math path on a CPU computes half inputs in fp32
            c = F32
        qc, kc, vc = (self.new(q.n, c, t.rg) for t in (q, k, v))  # bmm's contiguous copies
        self.save(qc, when=k.rg)
        self.save(kc, when=q.rg)
        if st.attn_cap:  # scores / cap -> tanh -> * cap
            self.save(self.new(B * nh * S * S, c, rg), when=rg)
        probs = self.new(B * nh * S * S, F32 if (st.ac or softmax_fp32) else c, rg)
        self.save(probs, when=rg)  # softmax keeps its output
        p = self.cast(probs, q.dt if softmax_fp32 else c)
        p = self.cast(self.dropout(p, st.p_attn), c)
        self.save(p, when=v.rg)
        self.save(vc, when=rg)
        return self.new(B * S * width, out_dt, rg)  # transpose(1, 2).contiguous()
