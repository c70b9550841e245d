"""The registry of families: which block replay each config's ``model_type`` takes, the LoRA targets of the
families peft has no default for, and what besides the shapes a family's config decides. Adding a family is
one module beside this one, its block marked with the classes it covers, and one line in :data:`FAMILIES`."""
from __future__ import annotations

from kit.estimate.replay import bert, gemma2, gemma3, gpt2, gpt_neox, llama, modernbert, olmo2, phi3, qwen3, roberta
from kit.estimate.replay import deberta, distilbert, gpt_oss, mixtral, olmoe, qwen3_moe

# Setup.family (a config's model_type, see kit.estimate.inventory.family_of) -> block replay, marked with the
# transformers classes it covers (its @around(covers=...)). Mistral and Qwen2 run the Llama block op for op (Llama's
# module registers their classes beside its own); no other model_type is taken for a family it does not name here.
FAMILIES = {"gpt2": gpt2.block, "llama": llama.block, "mistral": llama.block, "qwen2": llama.block,
            "qwen3": qwen3.block, "olmo2": olmo2.block, "phi3": phi3.block, "gemma2": gemma2.block,
            "gemma3": gemma3.block, "gpt_neox": gpt_neox.block,
            "bert": bert.block, "roberta": roberta.block}   # encoders (a classifier head: .task_heads)
FAMILIES["modernbert"] = modernbert.block
FAMILIES |= {"distilbert": distilbert.block, "deberta-v2": deberta.block}
FAMILIES |= {"qwen3_moe": qwen3_moe.block, "mixtral": mixtral.block, "olmoe": olmoe.block}   # MoE blocks (.moe)
FAMILIES["gpt_oss"] = gpt_oss.block   # sinks, eager attention, biased experts with their own gate
# LoRA targets for the families peft has no default for (LoraConfig needs target_modules there):
# the fused qkv projection (Phi-3, ModernBERT), q and v (OLMo-2, as peft's default for Llama; DistilBERT's q_lin
# and v_lin).
LORA_TARGETS = {"phi3": ("qkv_proj",), "olmo2": ("q_proj", "v_proj"), "distilbert": ("q_lin", "v_lin"),
                "modernbert": ("Wqkv",)}


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
        out["first_sliding"] = types[0] == "sliding_attention" if types else True
        if types and 0 < out["sliding"] < len(types):
            out["sliding_at"] = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if family == "gemma3" and types:
        out["rope_sets"] = len(set(types))
    if family == "gemma2":
        out["attn_cap"] = bool(getattr(cfg, "attn_logit_softcapping", None))
    if family in ("gemma2", "gemma3"):
        out["logit_cap"] = bool(getattr(cfg, "final_logit_softcapping", None))
    if family == "phi3":
        out["p_resid"] = getattr(cfg, "resid_pdrop", 0.0)
    if family in ("bert", "roberta"):
        out["p_attn"] = getattr(cfg, "attention_probs_dropout_prob", 0.0)
        out["p_resid"] = out["p_embd"] = getattr(cfg, "hidden_dropout_prob", 0.0)
    if family == "modernbert":   # cos/sin per layer type (global, local); dropouts: attention, MLP, embeddings
        out["rope_sets"] = len(set(types))
        out["p_attn"], out["p_resid"] = cfg.attention_dropout, cfg.mlp_dropout
        out["p_embd"], out["pooling"] = cfg.embedding_dropout, cfg.classifier_pooling
    if family == "distilbert":   # DistilBertConfig's own names
        out.update(F=cfg.hidden_dim, p_resid=cfg.dropout, p_embd=cfg.dropout)
    if family == "deberta-v2":   # the relative attention's span: DisentangledSelfAttention.pos_ebd_size
        out.update(p_attn=cfg.attention_probs_dropout_prob, p_resid=cfg.hidden_dropout_prob,
                   p_embd=cfg.hidden_dropout_prob)
        if cfg.relative_attention:
            span = cfg.max_relative_positions if cfg.max_relative_positions >= 1 else cfg.max_position_embeddings
            out.update(rel_span=cfg.position_buckets if getattr(cfg, "position_buckets", -1) > 0 else span,
                       rel_att=tuple(cfg.pos_att_type or ()), rel_share=bool(getattr(cfg, "share_att_key", False)))
    if family == "gpt_neox":
        out["p_resid"] = out["p_embd"] = getattr(cfg, "hidden_dropout", 0.0)
        out["parallel"] = bool(getattr(cfg, "use_parallel_residual", True))
    return out
