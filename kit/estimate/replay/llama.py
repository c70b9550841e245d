"""Llama: ``transformers.models.llama.modeling_llama.LlamaDecoderLayer`` (and ``LlamaModel``).

Pre-RMSNorm; separate q/k/v projections with grouped-query attention; rotary embeddings
(cos/sin shared by all layers); SwiGLU MLP; the eager softmax in fp32; ``norm`` before the
head. ``MistralDecoderLayer`` and ``Qwen2DecoderLayer`` are this block op for op (Qwen2's
q/k/v biases save nothing more; their sliding windows only decide which layers get a mask,
``Setup.layer_kinds``): their classes are registered with this block's (``covers``), checked in transformers 5.25's
modeling code, and their model types with this family's. No other architecture is estimated this way.
"""
from __future__ import annotations

from kit.estimate.replay.families import NoGradLoop, register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


def layer(tp: Tape, x, qk_norm: bool = False, mlp=None, qk_norm_whole: bool = False):
    """One Llama-style decoder layer; ``qk_norm``: Qwen-3's RMSNorm of each head of q and k
    (``q_norm``/``k_norm`` over hd, before the rotary embeddings), or with ``qk_norm_whole`` OLMoE's, over
    the whole q and k projections (nh*hd and kvh*hd wide); ``mlp``: the MLP's replay on the
    post-attention norm's output (the gated MLP by default; a sparse MoE block: :mod:`.moe`)."""
    st, H = tp.st, tp.st.H
    h = tp.rms_norm(x, st.norms_train)
    q = tp.linear(h, H, st.nh * st.hd, "self_attn.q_proj")
    if qk_norm:
        q = tp.rms_norm(q, st.norms_train, st.nh * st.hd if qk_norm_whole else st.hd)
    k = tp.linear(h, H, st.kvh * st.hd, "self_attn.k_proj")
    if qk_norm:
        k = tp.rms_norm(k, st.norms_train, st.kvh * st.hd if qk_norm_whole else st.hd)
    v = tp.linear(h, H, st.kvh * st.hd, "self_attn.v_proj")
    q, k = tp.rope(q, k, x)  # cos/sin in the embeddings' dtype (fp32 under autocast)
    o = tp.attention(q, k, v, st.nh * st.hd, repeat_kv=True, softmax_fp32=True)
    x = tp.binary(tp.linear(o, st.nh * st.hd, H, "self_attn.o_proj"), x)
    h = tp.rms_norm(x, st.norms_train)
    return tp.binary(mlp(tp, h) if mlp else tp.gated_mlp(h), x)   # (the tape's own rule: Liger's tape has its own)


@around(covers=Covers(blocks=("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"),
                      attention=("LlamaAttention", "MistralAttention", "Qwen2Attention"),
                      mlp=("LlamaMLP", "MistralMLP", "Qwen2MLP"),
                      norms=("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")),
        final_norm="rms_norm")
def block(tp: Tape, x):
    return layer(tp, x)


def no_grad_loop(setup, tokens: int, hidden, mlp) -> int:
    """Llama's loop (LlamaModel.forward, LlamaDecoderLayer, LlamaMLP), at block 2's (or 1's) MLP:
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` holds the activation, the up projection and their product,
    three (B, S, F) tensors, beside four hidden states: ``inputs_embeds`` (a local of ``LlamaModel.forward`` till it
    returns), the block's input (the loop's ``hidden_states``), the residual after attention and the MLP's normed
    input (three where block 1 is the only one: its input is ``inputs_embeds``). The rotary cos/sin are the
    caller's (:class:`~kit.estimate.replay.families.NoGradLoop`)."""
    return tokens * ((4 if setup.L > 1 else 3) * setup.H * hidden + 3 * setup.F * mlp)


LOOP = NoGradLoop(no_grad_loop, rotary=True)


def notes(cfg) -> list:
    """Mistral's and Qwen2's estimate says whose blocks it counts."""
    mt = cfg.model_type
    return [f"{mt}: its activations are counted as Llama's blocks', which its blocks are op for op"] \
        if mt != "llama" else []


register_family("llama", block=block, model_types=("llama", "mistral", "qwen2"), no_grad_loop=LOOP, liger=True,
                notes=notes, frozen_norms=True)
