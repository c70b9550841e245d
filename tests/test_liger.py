"""Liger's kernels (``use_liger_kernel=True``), counted from Liger-Kernel 0.8.2's source (kit.estimate.replay.liger).

The arithmetic is checked at named shapes against the source's formulas written out here by hand
(``ops/fused_linear_cross_entropy.py``: ``inc_factor = cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT,
inc_factor))``; the logits chunk in the autocast dtype; ``grad_input = zeros_like(_input)``; ``grad_weight =
zeros_like(weight)`` when the head trains), and the readers of TrainingArguments and SFTConfig against
``estimate()``. Liger's kernels are Triton (CUDA only): ``tests/test_gpu_liger.py`` measures them on a GPU.
"""
import importlib
import warnings

import pytest
import torch

from kit import inputs
from kit.estimate import estimate, estimate_from
from kit.estimate.replay.liger import chunk_rows, flce_head
from kit.estimate.replay.setup import BF16, FP32
from kit.training_setup import KEYWORDS, flag_of

warnings.filterwarnings("ignore")
LLAMA3 = "meta-llama/Meta-Llama-3-8B"   # H 4096, F 14336, V 128256, 32 layers, 32 heads, 8 kv heads
V, H, F, L = 128256, 4096, 14336, 32


def _cdiv(a, b):
    return (a + b - 1) // b


def _pow2(n):   # triton.next_power_of_2
    p = 1
    while p < n:
        p *= 2
    return p


@pytest.mark.parametrize("B,S,V_,H_,rows", [
    (4, 1024, V, H, 128),           # Llama-3-8B: inc_factor cdiv(128256, 4096) = 32, cdiv(4096, 32) = 128
    (1, 2048, V, H, 64),            # ... one row of 2048: cdiv(2048, 32) = 64
    (2, 512, 151936, 4096, 32),     # Qwen3-8B: inc_factor 38, cdiv(1024, 38) = 27 -> 32
    (1, 8, 1000, 2048, 8),          # V < H: inc_factor 1, one chunk of every row
])
def test_chunk_size_is_the_sources_formula(B, S, V_, H_, rows):
    BT = B * S
    assert min(_pow2(_cdiv(BT, _cdiv(V_, H_))), BT) == rows
    assert chunk_rows(BT, V_, H_) == rows


def test_llama3_8b_fused_linear_cross_entropy_bytes_by_hand():
    """B 4 x S 1024 under bf16 autocast: the chunk [128, V] in bf16, grad_input [BT, H] in the hidden states'
    dtype, grad_weight [V, H] in the weight's dtype only when the head trains."""
    B, S = 4, 1024
    BT, rows = B * S, 128
    chunk = rows * V * 2                        # 32,833,536 bytes
    assert chunk == 32_833_536
    labels = B * (S + 1) * 8 + BT * 8           # pad(labels, (0, 1)) and shift_labels, int64
    rowwise = BT * 4 + BT * 1                   # loss_1d fp32, target_mask bool
    # LoRA on bf16 weights: hidden states bf16, frozen bf16 head (no cast, no grad_weight)
    lora = flce_head(B=B, S=S, H=H, V=V, hidden_dt=BF16, weight_dt=BF16, ac=BF16, head_trainable=False,
                     hidden_grad=True, liger_norm=True)
    grad_input = BT * H * 2                     # 33,554,432 bytes
    assert lora["rows"] == rows and lora["saved"] == grad_input == 33_554_432 and lora["cache"] == 0
    # alive at its largest moment: the hidden states, labels, per-row buffers, the chunk and grad_input's
    # [rows, H] product (grad_logits_chunk @ weight)
    assert lora["forward"] == BT * H * 2 + labels + rowwise + chunk + rows * H * 2
    # full FT, fp32 weights: fp32 hidden states, grad_weight fp32 through addmm(out_dtype=fp32), whose only
    # temporary is the input chunk's bf16 cast; autocast caches the weight's bf16 copy
    full = flce_head(B=B, S=S, H=H, V=V, hidden_dt=FP32, weight_dt=FP32, ac=BF16, head_trainable=True,
                     hidden_grad=True, liger_norm=True)
    assert full["saved"] == BT * H * 4 and full["cache"] == V * H * 2
    assert full["forward"] == BT * H * 4 + labels + rowwise + V * H * 4 + chunk + rows * H * 2
    # full FT, bf16 weights: grad_weight bf16, so torch.mm(...).float(): a [V, H] bf16 product and its fp32 copy
    bf16 = flce_head(B=B, S=S, H=H, V=V, hidden_dt=BF16, weight_dt=BF16, ac=BF16, head_trainable=True,
                     hidden_grad=True, liger_norm=True)
    assert bf16["forward"] == BT * H * 2 + labels + rowwise + V * H * 2 + chunk + V * H * (2 + 4)


def test_the_estimate_with_liger_has_no_logits_and_saves_less():
    kw = dict(batch_size=4, seq_len=1024, precision="bf16", load_dtype="bf16", lora_r=16)
    plain, lig = estimate(LLAMA3, **kw), estimate(LLAMA3, liger_kernel=True, **kw)
    B, S = 4, 1024
    T = B * S
    rp, rl = plain.context.rp, lig.context.rp
    assert rp.ls == T * V * 4 and rp.last_logits == T * V * 2        # log-softmax fp32, logits bf16
    assert rl.ls == 0 and rl.loss == 0                               # no (B, S, V) tensor anywhere
    hand = T * H * 2 + B * (S + 1) * 8 + T * 8 + T * 5 + 128 * V * 2 + 128 * H * 2
    assert lig.logits_bytes == rl.logits_live == hand < T * V        # the fused loss's figure, by hand
    # per block: each of the two RMSNorms saves its bf16 input, not transformers' fp32 copy (block 1's first
    # norm saves nothing either way: its input needs no grad under LoRA), and SwiGLU keeps gate and up, not
    # SiLU's output too
    assert plain.activations_bytes - lig.activations_bytes == (2 * L - 1) * T * H * 2 + L * T * F * 2
    assert lig.peak_bytes < plain.peak_bytes
    note = next(n for n in lig.notes if getattr(n, "code", None) == "liger-from-source")
    assert "0.8.2" in note and "not yet measured" in note and note.field == "liger_kernel"
    assert lig.setup["liger_kernel"] is True and "liger_kernel" not in plain.setup


def test_liger_kernel_config_turns_kernels_off():
    kw = dict(batch_size=2, seq_len=512, precision="bf16", load_dtype="bf16", lora_r=8)
    off = estimate(LLAMA3, liger_kernel=True, liger_kernel_config={"rope": False, "rms_norm": False,
                                                                   "swiglu": False,
                                                                   "fused_linear_cross_entropy": False}, **kw)
    assert off.peak_bytes == estimate(LLAMA3, **kw).peak_bytes
    head_only = estimate(LLAMA3, liger_kernel=True, liger_kernel_config={"swiglu": False, "geglu": True}, **kw)
    assert head_only.context.rp.ls == 0 and head_only.setup["liger_kernel_config"] == {"swiglu": False,
                                                                                       "geglu": True}


def test_training_arguments_use_liger_kernel_is_read():
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="unused", report_to="none", use_liger_kernel=True,
                             liger_kernel_config={"rope": False})
    est = estimate_from("tiny-llama", args, seq_len=64)
    assert est.sources["liger_kernel"] == (True, "TrainingArguments.use_liger_kernel")
    assert est.sources["liger_kernel_config"][0] == {"rope": False}
    assert inputs.has_note(est.notes, "liger-from-source")
    same = estimate("tiny-llama", batch_size=8, seq_len=64, liger_kernel=True, liger_kernel_config={"rope": False})
    assert est.peak_bytes == same.peak_bytes and est.context.rp.ls == 0


def test_sft_config_use_liger_kernel_keeps_trls_fused_head():
    from trl import SFTConfig

    cfg = SFTConfig(output_dir="unused", report_to="none", bf16=False, max_length=64, use_liger_kernel=True)
    est = estimate_from("tiny-llama", sft_config=cfg)
    assert est.setup["fused_lm_head"] is True and est.setup["liger_kernel"] is True
    setup = {k: v for k, v in est.setup.items() if k in KEYWORDS}   # what was read, as estimate() keywords
    same = estimate("tiny-llama", **setup)
    plain = estimate("tiny-llama", **dict(setup, liger_kernel=False))
    assert setup["gradient_checkpointing"] is True and setup["loss_type"] == "nll"   # SFTConfig's defaults
    assert est.peak_bytes == same.peak_bytes and est.context.rp.head != plain.context.rp.head
    assert est.context.rp.logits_live == plain.context.rp.logits_live   # TRL's tiles, not Liger's chunks
    flce = SFTConfig(output_dir="unused", report_to="none", bf16=False, max_length=64, use_liger_kernel=True,
                     liger_kernel_config={"fused_linear_cross_entropy": True})
    with pytest.raises(inputs.InputError) as e:
        estimate_from("tiny-llama", sft_config=flce)
    assert e.value.name == "liger_kernel_config" and str(e.value).count(". ") == 0


@pytest.mark.parametrize("model,kw,field,words", [
    ("tiny-gpt2", {}, "liger_kernel", "gpt2"),
    ("tiny-gpt-neox", {}, "liger_kernel", "gpt_neox"),
    ("tiny-gemma2", {}, "liger_kernel", "gemma2"),
    ("tiny-gemma3", {}, "liger_kernel", "gemma3_text"),
    ("tiny-llama", dict(device="cpu"), "liger_kernel", "CUDA"),
    ("tiny-llama", dict(liger_kernel_config={"cross_entropy": True, "fused_linear_cross_entropy": False}),
     "liger_kernel_config", "cross_entropy"),
    ("tiny-llama", dict(lora_r=8, lora_targets=("q_proj", "lm_head")), "lora_targets", "lm_head"),
])
def test_what_is_not_modeled_is_refused_in_one_sentence(model, kw, field, words):
    with pytest.raises(inputs.InputError) as e:
        estimate(model, batch_size=1, seq_len=32, liger_kernel=True, **kw)
    text = str(e.value)
    assert e.value.name == field and words in text and text.count(". ") == 0 and text.endswith(".")


def test_the_option_is_declared_with_its_flag():
    assert flag_of("liger_kernel") == "--liger-kernel" and flag_of("liger_kernel_config") is None


# peak_bytes recorded before Liger was modeled: without liger_kernel the estimate is byte for byte the same
BEFORE = [
    (LLAMA3, dict(batch_size=4, seq_len=1024, precision="bf16", load_dtype="bf16", lora_r=16), 44766732800),
    (LLAMA3, dict(batch_size=4, seq_len=1024, precision="bf16", load_dtype="fp32"), 151417750016),
    (LLAMA3, dict(batch_size=1, seq_len=2048, quantization="4bit", lora_r=16, gradient_checkpointing=True),
     12151889280),
    ("Qwen/Qwen3-8B", dict(batch_size=2, seq_len=512, precision="bf16", lora_r=8, fused_lm_head=True), 53842358752),
    ("tiny-llama", dict(batch_size=2, seq_len=64, device="cpu"), 27626624),
    ("tiny-phi3", dict(batch_size=2, seq_len=64, device="cpu", precision="bf16"), 27020416),
    ("tiny-olmo2", dict(batch_size=2, seq_len=64), 26748544),
    ("tiny-gemma2", dict(batch_size=2, seq_len=64, precision="bf16"), 22933124),
    ("gpt2", dict(batch_size=2, seq_len=256), 2350226432),
]


@pytest.mark.parametrize("model,kw,peak", BEFORE)
def test_without_liger_the_estimate_is_unchanged(model, kw, peak):
    assert estimate(model, **kw).peak_bytes == peak == estimate(model, liger_kernel=False, **kw).peak_bytes


class _RMSNorm(torch.autograd.Function):     # LigerRMSNormFunction's saves: X as given, W, RSTD [rows] fp32
    @staticmethod
    def forward(ctx, X, W, eps):
        rstd = torch.rsqrt(X.float().pow(2).mean(-1) + eps)
        ctx.save_for_backward(X, W, rstd)
        return ((X.float() * rstd[..., None]).to(X.dtype) * W).to(X.dtype)


class _SiLUMul(torch.autograd.Function):     # LigerSiLUMulFunction: ensure_contiguous, saves a and b
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return (torch.nn.functional.silu(a.float()).to(b.dtype) * b).to(a.dtype)


class _Rope(torch.autograd.Function):        # LigerRopeFunction: in place on q.transpose(1, 2).contiguous()
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        out = []
        for t in (q, k):
            p = t.transpose(1, 2).contiguous()  # the projection's own storage, or a copy of a fused one's slice
            half = p.shape[-1] // 2
            p.copy_(p * cos.unsqueeze(2) + torch.cat((-p[..., half:], p[..., :half]), -1) * sin.unsqueeze(2))
            out.append(p.transpose(1, 2))
        ctx.save_for_backward(cos, sin)
        return tuple(out)


def _liger_patched(model, model_type):
    """What _apply_liger_kernel_to_instance patches (rope, rms_norm, swiglu), with the Functions above."""
    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    bind = (lambda m, f: m.__dict__.__setitem__("forward", f.__get__(m, type(m))))
    norm = (lambda self, x: _RMSNorm.apply(x, self.weight, getattr(self, "variance_epsilon", 1e-6)))
    mlp = (lambda self, x: self.down_proj(_SiLUMul.apply(*self.gate_up_proj(x).chunk(2, -1)) if hasattr(
        self, "gate_up_proj") else _SiLUMul.apply(self.gate_proj(x), self.up_proj(x))))
    bind(model.model.norm, norm)
    for layer in model.model.layers:
        bind(layer.mlp, mlp)
        for n in (("post_attention_layernorm", "post_feedforward_layernorm") if model_type == "olmo2" else
                  ("input_layernorm", "post_attention_layernorm")):
            bind(getattr(layer, n), norm)
    return mod


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-phi3",
                                  "tiny-olmo2"])
@pytest.mark.parametrize("lora_r", [0, 8])
def test_the_block_rules_match_autograd_with_stand_ins_of_ligers_functions(name, lora_r, monkeypatch):
    """Liger's Functions written in torch with their ``save_for_backward`` calls and in-place writes (the stand-ins
    above, checked against Liger's own source by the next test), patched in
    as ``_apply_liger_kernel_to_instance`` patches them (its q/k norms untouched): the replay's saved bytes against
    ``saved_tensors_hooks`` on the tiny twin (fp32, no padding; the fused loss is off, it cannot run here)."""
    from peft import LoraConfig, get_peft_model

    from kit.estimate.inventory import default_targets, info_of
    from kit.measure.tensor_peak import saved_tensor_bytes
    from kit.models import build_model

    torch.manual_seed(0)
    model = build_model(name)
    model.config.use_cache = False
    mt = model.config.model_type
    if lora_r:
        model = get_peft_model(model, LoraConfig(r=lora_r, target_modules=list(default_targets(info_of(name)))))
    mod = _liger_patched(model.get_base_model() if lora_r else model, mt)
    monkeypatch.setattr(mod, "apply_rotary_pos_emb", lambda q, k, cos, sin, *a, **kw: _Rope.apply(q, k, cos, sin))
    model.train()
    ids = torch.randint(2, 4000, (2, 32))
    got = saved_tensor_bytes(model, {"input_ids": ids, "labels": ids})
    est = estimate(name, batch_size=2, seq_len=32, padded=False, lora_r=lora_r, liger_kernel=True,
                   liger_kernel_config={"fused_linear_cross_entropy": False})
    assert est.saved_bytes == pytest.approx(got, abs=8)   # (a 0-d scalar apart, as without Liger)


# The stand-in above for each of Liger's Functions: (its module under liger_kernel/ops, its class)
LIGER_FUNCTIONS = {_RMSNorm: ("rms_norm.py", "LigerRMSNormFunction"), _SiLUMul: ("swiglu.py", "LigerSiLUMulFunction"),
                   _Rope: ("rope.py", "LigerRopeFunction")}


def _saves(tree, cls_name):
    """Each ``ctx.save_for_backward(...)`` in ``cls_name.forward`` of ``tree``: a tuple of the names it saves (lower
    case, a ``_local`` suffix dropped: Liger's DTensor branch saves the local shards of the same a and b)."""
    import ast

    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    fwd = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    calls = [c for c in ast.walk(fwd) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "save_for_backward"]
    return {tuple(ast.unparse(a).lower().removesuffix("_local") for a in c.args) for c in calls}


def test_the_stand_ins_save_what_ligers_own_functions_save():
    """Liger's own code, read from its installed source: liger-kernel's modules import Triton at once, and Triton's
    kernels need a CUDA GPU, so nothing of it can run on a CPU; its ``forward`` methods' ``save_for_backward`` calls
    can be read. Each stand-in saves what one of Liger's branches saves."""
    import ast
    import importlib.util
    import inspect
    import pathlib
    import sys

    spec = importlib.util.find_spec("liger_kernel")   # (finds the package without importing it)
    if spec is None:
        pytest.skip("liger-kernel is not installed, so its source cannot be read: `pip install --no-deps "
                    "liger-kernel` (its Triton kernels need a CUDA GPU; this test only reads its code)")
    ops = pathlib.Path(spec.origin).parent / "ops"
    here = ast.parse(inspect.getsource(sys.modules[__name__]))
    for stand_in, (module, liger_cls) in LIGER_FUNCTIONS.items():
        theirs = _saves(ast.parse((ops / module).read_text()), liger_cls)
        ours = _saves(here, stand_in.__name__)
        assert len(ours) == 1 and ours <= theirs, (stand_in.__name__, ours, liger_cls, theirs)


@pytest.mark.parametrize("model", ["tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-phi3", "tiny-olmo2"])
def test_every_modeled_family_saves_less_with_liger(model):
    kw = dict(batch_size=2, seq_len=64, precision="bf16")
    plain, lig = estimate(model, **kw), estimate(model, liger_kernel=True, **kw)
    assert lig.activations_bytes < plain.activations_bytes and lig.context.rp.ls == 0
