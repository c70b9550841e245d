"""Liger's kernels (``use_liger_kernel=True``), read from the source of Liger-Kernel 0.8.2 (release commit
000be60929938fd1358e03524c6ab398b6d421bd; the files below are unchanged at ead96b618e5c, 2026-08-21). They are
Triton kernels, CUDA-only, so these rules are computed from the source and not measured here.

What ``Trainer(use_liger_kernel=True)`` runs (transformers 5.24 ``integrations/liger.py``: ``apply_liger_kernel``
calls ``liger_kernel.transformers._apply_liger_kernel_to_instance(model=base_model, **liger_kernel_config)``
in ``train()``): for llama, mistral, qwen2, qwen3, phi3 and olmo2 (``transformers/monkey_patch.py``,
``apply_liger_kernel_to_<type>``) rope, rms_norm, swiglu and fused_linear_cross_entropy are on by default,
cross_entropy off. On an instance it patches ``base_model.norm`` and each layer's ``input_layernorm`` /
``post_attention_layernorm`` (OLMo-2: ``post_attention_layernorm`` / ``post_feedforward_layernorm``, with
``in_place=False``) through ``_patch_rms_norm_module`` (casting "llama"), each layer's ``mlp.forward``, the
module's ``apply_rotary_pos_emb``, and ``model.forward`` (``transformers/model/<type>.py``, ``lce_forward``);
the q/k norms (Qwen-3, OLMo-2) keep transformers' code. TRL 1.16's SFTTrainer forces
``fused_linear_cross_entropy=False`` (``sft_trainer.py``: its own fused LM head stays). The rules:

- RMSNorm (``ops/rms_norm.py``, ``LigerRMSNormFunction``): saves ``X`` as given and ``RSTD``, ``[rows]`` fp32
  (casting "llama"); ``Y`` in X's dtype. Backward: ``dX`` is ``dY`` itself (``in_place=True``) or
  ``zeros_like(dY)``, and ``_dW``, ``[sm_count, H]`` fp32 (:data:`SM_COUNT`), summed to ``[H]``;
- SwiGLU (``ops/swiglu.py``, ``LigerSiLUMulFunction``; ``transformers/swiglu.py``, ``LigerSwiGLUMLP`` /
  ``LigerPhi3SwiGLUMLP``): saves the gate and up projections (Phi-3: ``ensure_contiguous``'s copies of the two
  chunks), recomputes SiLU in backward and writes ``da``, ``db`` into them: no activation output is kept;
- RoPE (``ops/rope.py``, ``LigerRopeFunction``): rotates q and k in place in their ``(B, S, heads, hd)`` layout
  (a slice of Phi-3's fused qkv is copied first, ``.contiguous()``), saves only cos and sin (the model's own),
  and its backward rotates ``dq``, ``dk`` in place;
- fused linear cross-entropy (``ops/fused_linear_cross_entropy.py``, ``fused_linear_cross_entropy_forward``,
  through ``transformers/model/loss_utils.py``, ``LigerForCausalLMLoss``, in training with labels): no
  ``(B, S, V)`` logits; see :func:`flce_head`.
"""
from __future__ import annotations

from dataclasses import replace

from kit.estimate.replay.registry import lookup
from kit.estimate.replay.setup import BOOL, F32, I64, promote
from kit.estimate.replay.tape import Output, Tape

VERSION = "0.8.2"
SM_COUNT = 132   # rms_norm_backward's _dW rows: multi_processor_count (an H100/H200 SXM; an A100 has 108)


def chunk_rows(BT: int, V: int, H: int) -> int:
    """Rows of one logits chunk: ``inc_factor = cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT,
    inc_factor))`` (``fused_linear_cross_entropy_forward``), at most the ``BT`` rows there are.

    >>> chunk_rows(4 * 1024, 128256, 4096)   # Llama-3-8B, B 4 x S 1024: inc_factor 32
    128
    """
    inc = -(-V // H)
    n = -(-BT // inc)
    return min(1 << (n - 1).bit_length(), BT)


def flce_head(*, B: int, S: int, H: int, V: int, hidden_dt, weight_dt, ac, head_trainable: bool,
              hidden_grad: bool, liger_norm: bool, norm_dt=F32) -> dict:
    """Bytes of Liger's fused linear cross-entropy at batch ``B`` x length ``S``: ``saved`` (kept for
    backward), ``forward`` (alive at its largest moment beyond what is saved), ``backward`` (the final norm's
    backward beside what was saved and the grads) and ``cache`` (autocast's cached half copy of the weight).

    ``fused_linear_cross_entropy_forward`` on ``_input`` = the final norm's output viewed ``[BT, H]``, BT = B*S:
    ``grad_input = zeros_like(_input)`` (always), ``grad_weight = zeros_like(weight)`` (the weight's dtype,
    ``accum_dtype`` None) when the weight and the input need grads, ``loss_1d`` ``[BT]`` fp32 and ``target_mask``
    ``[BT]`` bool; then per chunk of :func:`chunk_rows` rows ``logits_chunk = _input_chunk @ weight.t()``
    (``[rows, V]``, autocast's dtype, else the operands'), which the CE kernel overwrites with its grad;
    ``grad_input[rows] = grad_logits_chunk @ weight`` (a ``[rows, H]`` product); ``grad_weight`` through
    ``torch.addmm(..., out_dtype=float32)`` when it is fp32 and the chunk half (CUDA capability 8.0+, torch 2.8+:
    only the input chunk's cast), else ``torch.mm(...).float()`` (a ``[V, H]`` product and its fp32 copy). The
    gradients are computed in this forward; ``ctx.save_for_backward(grad_input, grad_weight)``; backward scales
    them in place (``element_mul_kernel``). ``grad_weight`` becomes the weight's grad: it counts as the head's
    grads, here in ``forward`` only.

    >>> f = flce_head(B=1, S=8, H=4, V=16, hidden_dt=F32, weight_dt=F32, ac=None, head_trainable=False,
    ...               hidden_grad=True, liger_norm=True)
    >>> f["saved"] == 8 * 4 * 4 and f["forward"] == 8 * 4 * 4 + 9 * 8 + 8 * 8 + 8 * (4 + 1) + 2 * 16 * 4 + 2 * 4 * 4
    True
    """
    BT = B * S
    rows = chunk_rows(BT, V, H)
    c = ac or promote(hidden_dt, weight_dt)                     # the logits chunk's dtype
    grad_input = BT * H * hidden_dt                             # [BT, H], _input's dtype
    trained = head_trainable and hidden_grad                    # grad_weight is made only with input_requires_grad
    grad_weight = V * H * weight_dt if trained else 0           # [V, H], the weight's dtype
    hidden = BT * H * hidden_dt                                 # hidden_states (lce_forward's local), not saved
    labels = B * (S + 1) * I64 + BT * I64                       # pad(labels, (0, 1)) [B, S+1]; shift_labels [B, S]
    rowwise = BT * (F32 + BOOL)                                 # loss_1d [BT] fp32, target_mask [BT] bool
    tile = rows * V * c                                         # logits_chunk [rows, V]
    h_cast = rows * H * c if hidden_dt != c else 0              # _input_chunk's cast, [rows, H]: a matmul temporary
    cached = bool(ac) and weight_dt == F32 and head_trainable   # autocast caches an fp32 leaf that requires grad
    w_cast = V * H * c if ac and weight_dt != ac and not cached else 0   # else [V, H] cast at each matmul
    moments = [h_cast + w_cast]                                 # logits_chunk = _input_chunk @ weight.t()
    if hidden_grad:
        moments.append(rows * H * c + w_cast)                   # grad_logits_chunk @ weight: [rows, H] in c
    if grad_weight and weight_dt == F32 and c != F32:           # addmm(out_dtype=fp32): input_chunk.to(c)
        moments.append(h_cast)
    elif grad_weight:                                           # mm: [V, H] in c (its cast input), then .float()
        moments.append(max(h_cast + V * H * c, V * H * c + (V * H * F32 if c != F32 else 0)))
    forward = hidden + labels + rowwise + grad_weight + tile + max(moments)
    # backward: element_mul_kernel in place; then the final norm's: Liger's writes dX into dY (in_place) beside
    # _dW [sm_count, H] fp32, its sum [H] and that sum's cast to the weight's dtype; transformers' makes dX
    norm = SM_COUNT * H * F32 + H * F32 + (H * norm_dt if norm_dt != F32 else 0) if liger_norm else BT * H * hidden_dt
    saved = grad_input if hidden_grad or head_trainable else 0
    return dict(saved=saved, forward=forward, backward=norm, cache=V * H * c if cached else 0, rows=rows)


class LigerTape(Tape):
    """A :class:`Tape` whose RMSNorm, gated MLP and rotary rules are Liger's where ``Setup.liger`` names them."""

    def _on(self, kernel: str) -> bool:
        return kernel in self.st.liger

    def rms_norm(self, x, trainable, dim=None, kind="cast"):
        """``LigerRMSNormFunction`` (casting "llama") for the norms over the hidden size Liger patches;
        a q/k norm (``dim`` given) keeps transformers' rule (:meth:`Tape.rms_norm`)."""
        if not self._on("rms_norm") or dim is not None:
            return super().rms_norm(x, trainable, dim, kind)
        H = self.st.H
        self.save(x, self.new(x.n // H, F32, False), when=x.rg or trainable)  # X as given; RSTD [rows] fp32
        in_place = kind != "fp32"      # OLMo-2's post norms: in_place=False, dX = zeros_like(dY)
        y = self.new(x.n, x.dt, x.rg or trainable, gin=0 if in_place else x.n * x.dt)   # Y: X's dtype
        if y.rg:                       # _dW [sm_count, H] fp32, its sum [H] and the cast to the weight's dtype
            w = self.st.w_other
            self.outs[-1].temporaries = SM_COUNT * H * F32 + H * F32 + (H * w if w != F32 else 0)
        return y

    def gated_mlp(self, h, fused=False):
        """``LigerSwiGLUMLP.forward``: ``down_proj(LigerSiLUMulFunction.apply(gate_proj(x), up_proj(x)))``;
        Phi-3's ``LigerPhi3SwiGLUMLP``: ``gate_up_proj(x).chunk(2, -1)``, which ``ensure_contiguous`` copies."""
        if not self._on("swiglu"):
            return super().gated_mlp(h, fused)
        st = self.st
        if fused:
            gu = self.linear(h, st.H, 2 * st.F, "mlp.gate_up_proj")
            gate, up = (self.new(gu.n // 2, gu.dt, False) for _ in range(2))   # [T, F] copies, inside forward
            rg = gu.rg
            gin = gate.n * gate.dt     # chunk's backward cats da, db into one [T, 2F] grad: dc + gin
        else:
            gate = self.linear(h, st.H, st.F, "mlp.gate_proj")
            up = self.linear(h, st.H, st.F, "mlp.up_proj")
            rg, gin = gate.rg or up.rg, 0   # da, db are written into a and b's storage
        self.save(gate, up, when=rg)       # ctx.save_for_backward(a, b)
        c = self.new(gate.n, gate.dt, rg, gin=gin)   # c = empty_like(a)
        return self.linear(c, st.F, st.H, "mlp.down_proj")

    def rope(self, q, k, x, cat=False, fp32=False):
        """``liger_rotary_pos_emb``: q and k rotated in place (a fused projection's slice copied first), in their
        dtype; cos/sin are the model's own (fp32 for OLMo-2), saved once for all blocks."""
        if not self._on("rope"):
            return super().rope(q, k, x, cat, fp32)
        st = self.st
        cs = F32 if fp32 else st.w_other
        rg = q.rg or k.rg
        self.shared = 2 * st.S * (st.rotary or st.hd) * cs if rg else 0
        self.heads_first = False   # the kernel keeps the (B, S, heads, hd) layout: sdpa's output needs no copy
        # rope_backward rotates dq, dk in place after ``.transpose(1, 2).contiguous()``: a copy where the grad comes
        # heads-first, from eager's matmuls, or for k from repeat_kv's backward (the rule of Tape.attention)
        math = st.math_path(self.masked, q.dt)
        repeated = (math or (self.masked and st.kvh > 1)) and st.kvh != st.nh
        out = []
        for t, copied in ((q, math), (k, math or repeated)):
            r = replace(self.new(t.n, t.dt, False), rg=rg) if t.sn else replace(t, rg=rg)   # copy, or in place
            if rg:                 # its grad, rotated in place (or in that copy)
                self.outs.append(Output(len(self.order), t.n * t.dt, input_grad=t.n * t.dt if copied else 0))
            out.append(r)
        return tuple(out)


# Copied from Liger-Kernel 0.8.2's monkey_patch.py (the keys of MODEL_TYPE_TO_APPLY_LIGER_FN): the model types
# Liger patches. The kit models the patches of the families declared with liger=True (kit.estimate.replay.families).
PATCHED = ("llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "deepseek_v4", "gemma", "gemma2", "gemma3_text",
           "gemma3", "gemma4_text", "gemma4", "glm4", "glm4v", "glm4v_moe", "gpt_oss", "internvl", "llama4_text",
           "llama4", "llava", "granite", "mllama", "mllama_text_model", "ministral", "mixtral", "nemotron", "pixtral",
           "olmo3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_next",
           "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text",
           "qwen3_vl_moe", "qwen3_vl_moe_text", "smollm3", "paligemma", "falcon_h1", "smolvlm",
           "hunyuan_v1_dense", "hunyuan_v1_moe", "exaone4")
# apply_liger_kernel_to_<type>'s keywords and their defaults, the same for every modeled type
DEFAULTS = {"rope": True, "cross_entropy": False, "fused_linear_cross_entropy": True, "rms_norm": True,
            "swiglu": True}
SHORT = {"rope": "rope", "rms_norm": "rms_norm", "swiglu": "swiglu", "fused_linear_cross_entropy": "flce"}


def modeled_types() -> tuple:
    """The model types whose Liger patches the kit models (those of the families declared with ``liger=True``), in
    Liger's order."""
    return tuple(t for t in PATCHED if lookup(t) is not None and lookup(t).liger and t in lookup(t).model_types)


def kernels(cfg, config, *, fused_head: bool, device: str, vocab_head: bool) -> tuple:
    """The Liger kernels that run (:attr:`Setup.liger <kit.estimate.replay.setup.Setup.liger>` names) for
    ``use_liger_kernel=True`` on a model of config ``cfg`` with ``liger_kernel_config`` ``config`` (None: Liger's
    defaults); a setup the kit does not model is refused in one sentence (``kit.inputs.InputError``).

    Keys the apply function does not take are dropped, as ``_apply_liger_kernel_to_instance`` drops them.
    ``fused_head``: TRL's SFTTrainer, which sets ``fused_linear_cross_entropy=False`` and raises where it is True.

    >>> from kit.model_configs import get_config
    >>> kernels(get_config("tiny-llama"), None, fused_head=False, device="cuda", vocab_head=False)
    ('rope', 'rms_norm', 'swiglu', 'flce')
    >>> kernels(get_config("tiny-qwen3"), {"rope": False}, fused_head=True, device="cuda", vocab_head=False)
    ('rms_norm', 'swiglu')
    """
    from kit.inputs import InputError

    model_type = getattr(cfg, "model_type", None) or "?"
    rope = getattr(cfg, "rope_parameters", None) or {}
    partial = (rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0) < 1

    def refuse(field, text, code):
        raise InputError(field, text, code=code)

    if config is not None and not isinstance(config, dict):
        refuse("liger_kernel_config", f"liger_kernel_config must be a dict of kernel names to True/False (as "
               f"TrainingArguments takes it), not {type(config).__name__}.", "liger-config")
    if device != "cuda":
        refuse("liger_kernel", "Liger's kernels are Triton kernels that run on a CUDA GPU only: estimate with "
               "device='cuda', or without liger_kernel.", "liger-device")
    if model_type not in PATCHED:
        refuse("liger_kernel", f"Liger has no kernels for {model_type} (_apply_liger_kernel_to_instance leaves the "
               "model as it is): estimate without liger_kernel, which changes nothing there.", "liger-family")
    modeled = modeled_types()
    if model_type not in modeled:
        refuse("liger_kernel", f"Liger's kernels for {model_type} are not modeled (the kit models its patches of "
               f"{', '.join(modeled)}): estimate without liger_kernel.", "liger-family")
    if vocab_head:
        refuse("liger_kernel", "Liger's fused loss replaces the model's forward, which a head on the logits needs: "
               "estimate this model without liger_kernel.", "liger-head")
    given = {k: v for k, v in (config or {}).items() if k in DEFAULTS}
    bad = sorted(k for k, v in given.items() if not isinstance(v, bool))
    if bad:
        refuse("liger_kernel_config", f"liger_kernel_config[{bad[0]!r}] must be True or False.", "liger-config")
    on = {**DEFAULTS, **given}
    if on["cross_entropy"]:
        refuse("liger_kernel_config", "liger_kernel_config cross_entropy=True (Liger's unfused cross-entropy over "
               "the full logits) is not modeled: estimate with its default, fused_linear_cross_entropy.",
               "liger-cross-entropy")
    if fused_head and given.get("fused_linear_cross_entropy"):
        refuse("liger_kernel_config", "liger_kernel_config fused_linear_cross_entropy=True is refused by TRL's "
               "supervised fine-tuning trainer (it keeps its own fused LM head): leave it out.", "liger-trl-flce")
    if fused_head:
        on["fused_linear_cross_entropy"] = False
    if partial and on["rope"]:
        refuse("liger_kernel_config", "Liger's rope kernel on a partial rotary embedding (partial_rotary_factor < 1) "
               "is not modeled: estimate with liger_kernel_config={'rope': False}.", "liger-partial-rotary")
    return tuple(SHORT[k] for k in ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy") if on[k])


def notes(liger: tuple, eval_gather: str = "loss") -> list:
    """The estimate's notes: which Liger kernels are counted, and that their terms come from the source; with the
    fused loss, what ``eval_peak_bytes`` counts of Trainer.evaluate() (``lce_forward`` builds no logits there only
    with ``skip_logits``, which Trainer sets for ``prediction_loss_only``)."""
    from kit.inputs import Note

    if not liger:
        return []
    names = {"rope": "RoPE", "rms_norm": "RMSNorm", "swiglu": "SwiGLU", "flce": "fused linear cross-entropy"}
    out = [Note(f"Liger kernels ({', '.join(names[k] for k in liger)}): their terms are computed from "
                f"Liger-Kernel {VERSION}'s source (kit.estimate.replay.liger), not yet measured on a GPU"
                + (f"; RMSNorm's backward buffer [sm_count, H] is taken at sm_count {SM_COUNT}, an H100's, whatever "
                   "the device (an A100 has 108, a T4 40)" if "rms_norm" in liger else ""),
                field="liger_kernel", code="liger-from-source")]
    if "flce" in liger and eval_gather != "loss":
        out.append(Note("with compute_metrics, Liger's forward in evaluation builds the full logits (Trainer sets "
                        "skip_logits only for prediction_loss_only), which eval_peak_bytes does not count",
                        field="eval_gather", code="liger-eval"))
    elif "flce" in liger:
        out.append(Note("eval_peak_bytes counts the training forward's fused loss (with a trained head, its "
                        "grad_weight too, which the no-grad evaluation does not make): an upper bound",
                        field="eval_gather", code="liger-eval"))
    return out
