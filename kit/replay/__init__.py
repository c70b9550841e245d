"""Activations, logits and the backward timeline, replayed op by op from the real forward.

What autograd keeps for backward depends on what each op saves. :func:`replay` walks the
training forward of a decoder block (one module per family: GPT-2, Llama, Mistral, Qwen2,
Qwen3, OLMo-2, Phi-3, Gemma-2, Gemma-3, GPT-NeoX), of the head and of the loss, op by op, in
the order and with the dtypes of transformers' code (``GPT2Block``, ``LlamaDecoderLayer``,
..., ``ForCausalLMLoss``) and of torch's kernels, and adds up the tensors each op saves, as
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

Layout: :mod:`.tape` holds :class:`Setup`, the :class:`~.tape.Tape` and the op rules every
family shares (linear with quantization and LoRA, the norms (LayerNorm; RMSNorm as Llama,
OLMo-2 or Gemma apply the weight, over the hidden size or a head for q/k norms), the gated
and GELU MLPs, dropout, attention (sdpa or eager, soft-capped), rotary embeddings (partial
too), fused projections as views, autocast casts); :mod:`.core` runs embeddings, blocks
(one replay per kind: masked or not, with sliding windows), head (final-logit soft-capping)
and loss and finds the backward peak; one module per family describes its block, and
:func:`config_shapes` reads what besides the shapes a family's config decides.

Adding a family: write ``kit/replay/<family>.py`` with one function ``block(tp, x)`` that
replays one decoder layer with the tape's op rules, in the order of the transformers
class it follows (name that class in the module docstring), and mark it with
``@around(final_norm=..., positions=..., embd_dropout=..., embed_scale=...)`` for what the
model does outside its blocks; then add one line to :data:`FAMILIES` (keyed by the config's
``model_type``: ``kit.inventory.family_of`` picks ``Setup.family`` from it), and read any
config field the block needs in :func:`config_shapes`. Reuse the tape's rules; a new kind of
op goes into :mod:`.tape` (or :mod:`.core`, outside the blocks), not into the family module.
Check it against autograd and a real Trainer step on a tiny CPU twin
(``kit/configs/tiny-<family>.json``) as ``tests/test_families.py`` does for every family.
"""
from __future__ import annotations

from . import gemma2, gemma3, gpt2, gpt_neox, llama, olmo2, phi3, qwen3
from .core import Moment, Replay, moments, peak_moment, replay
from .setup import BOOL, F32, HALF, I64, Setup, around
from .tape import Tape

# Setup.family (a config's model_type, see kit.inventory.family_of) -> block replay.
# Mistral and Qwen2 run the Llama block op for op; "llama" also stands in for any other
# Llama-style architecture that has no replay of its own.
FAMILIES = {"gpt2": gpt2.block, "llama": llama.block, "mistral": llama.block, "qwen2": llama.block,
            "qwen3": qwen3.block, "olmo2": olmo2.block, "phi3": phi3.block, "gemma2": gemma2.block,
            "gemma3": gemma3.block, "gpt_neox": gpt_neox.block}
# LoRA targets for the families peft has no default for (LoraConfig needs target_modules there):
# the fused qkv projection (Phi-3), q and v (OLMo-2, as peft's default for Llama).
LORA_TARGETS = {"phi3": ("qkv_proj",), "olmo2": ("q_proj", "v_proj")}


def config_shapes(cfg, family: str, hd: int) -> dict:
    """The :class:`Setup` fields a config decides besides the shapes (all defaults for Llama).

    Partial rotary (``partial_rotary_factor``); sliding-window layers (``layer_types``, or a
    ``sliding_window`` on every layer as Mistral and Phi-3 use it); Gemma's soft-capping
    (attention scores: Gemma-2 only, Gemma-3 does not pass it; final logits: both) and
    Gemma-3's cos/sin per layer type; residual and embedding dropout (Phi-3, GPT-NeoX);
    GPT-NeoX's parallel residual.
    """
    out = {}
    rope = getattr(cfg, "rope_parameters", None) or {}
    factor = rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0
    if factor < 1:
        out["rotary"] = int(hd * factor)
    window, types = getattr(cfg, "sliding_window", None), getattr(cfg, "layer_types", None)
    if window:
        out["window"] = window
        out["sliding"] = sum(t == "sliding_attention" for t in types) if types else cfg.num_hidden_layers
    if family == "gemma3" and types:
        out["rope_sets"] = len(set(types))
    if family == "gemma2":
        out["attn_cap"] = bool(getattr(cfg, "attn_logit_softcapping", None))
    if family in ("gemma2", "gemma3"):
        out["logit_cap"] = bool(getattr(cfg, "final_logit_softcapping", None))
    if family == "phi3":
        out["p_resid"] = getattr(cfg, "resid_pdrop", 0.0)
    if family == "gpt_neox":
        out["p_resid"] = out["p_embd"] = getattr(cfg, "hidden_dropout", 0.0)
        out["parallel"] = bool(getattr(cfg, "use_parallel_residual", True))
    return out


__all__ = ["FAMILIES", "LORA_TARGETS", "Setup", "Tape", "around", "replay", "Replay", "Moment", "moments", "peak_moment",
           "config_shapes", "F32", "HALF", "BOOL", "I64"]
