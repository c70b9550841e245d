"""Gemma-3 (text): ``transformers.models.gemma3.modeling_gemma3.Gemma3DecoderLayer`` (and
``Gemma3TextModel``, ``Gemma3ForCausalLM``).

The Gemma-2 block (:func:`kit.estimate.replay.gemma2.layer`) with ``q_norm``/``k_norm`` (Gemma
RMSNorms over each head's hd, before the rotary embeddings) and without attention
soft-capping (so sdpa runs). Sliding and full layers each get their own rotary cos/sin
(``Setup.rope_sets``) and mask; final-logit soft-capping when the config sets it.
"""
from __future__ import annotations

from kit.estimate.replay import gemma2
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("Gemma3DecoderLayer",), attention=("Gemma3Attention",), mlp=("Gemma3MLP",),
                      norms=("Gemma3RMSNorm",)),
        final_norm="rms_norm_offset", embed_scale=True)
def block(tp: Tape, x):
    return gemma2.layer(tp, x, qk_norm=True)


def config_fields(cfg) -> dict:
    """Rotary cos/sin per layer type (sliding and full); final-logit soft-capping."""
    types = getattr(cfg, "layer_types", None)
    return ({"rope_sets": len(set(types))} if types else {}) | \
        {"logit_cap": bool(getattr(cfg, "final_logit_softcapping", None))}


# gemma3_text: the text model's config (Gemma-3 1B's, and a multimodal one's text_config); the multimodal model's
# own model type, gemma3, is kit.estimate.replay.gemma3_vision's
register_family("gemma3_text", block=block, config_fields=config_fields)
