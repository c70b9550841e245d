"""SmolVLM and Idefics3: ``transformers.models.smolvlm.modeling_smolvlm.SmolVLMForConditionalGeneration`` (and
``Idefics3ForConditionalGeneration``, the same code op for op: SmolVLM's is generated from Idefics3's), as
transformers 5.25 runs it.

Three parts, in forward order:

- the vision tower (``SmolVLMVisionTransformer``, SigLIP's): a ``Conv2d`` patch embedding (it keeps the pixels, as
  ``pixel_values[real_images].contiguous()`` made them: a new tensor, the padding images dropped), a learned
  position embedding (it keeps the ``(images, patches)`` int64 position ids), then pre-LayerNorm encoder layers
  (``SmolVLMEncoderLayer``: ``layer_norm1``, q/k/v projections with biases, bidirectional sdpa over the patches,
  ``out_proj``, the residual add, ``layer_norm2``, ``fc1``, ``gelu_pytorch_tanh``, ``fc2``, the residual add) and
  ``post_layernorm``. Every image (each crop of a split image, and its global view) is a row of
  ``(image_size / patch_size)^2`` patches; a full crop has no padded patch, so no attention mask is built;
- the connector (``SmolVLMConnector``): the pixel shuffle (views, then ``reshape`` of a permuted tensor: a copy of
  the tower's output) and one bias-free ``modality_projection.proj`` to the text width: ``patches / scale_factor^2``
  image tokens per image;
- the merge: the text embeddings' ``masked_scatter`` of the image features at the ``<image>`` tokens (it keeps the
  ``(B, S, 1)`` bool mask), then the text model: Llama's blocks (``LlamaModel``), replayed by
  :mod:`kit.estimate.replay.llama`'s layer, and ``lm_head``.

What a whole training step holds besides (the prefetched batch's pixel values, the vision tower's backward) is not
modeled yet: an estimate of these models is refused by :func:`refusal`, and :func:`forward_saved` gives the
forward's saved bytes, checked against ``torch.autograd.graph.saved_tensors_hooks`` on ``tiny-smolvlm``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kit.estimate.replay import llama
from kit.estimate.replay import core as replay_core   # (a module: the registry imports this one as core loads)
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import BOOL, I64, Covers, Setup, around
from kit.estimate.replay.tape import Tape

# the classes of the text model's blocks (Llama's) and of the vision tower's, by the two model types' names
_VISION = ("SmolVLMEncoderLayer", "Idefics3EncoderLayer")
_VISION_PARTS = ("SmolVLMVisionAttention", "Idefics3VisionAttention", "SmolVLMVisionMLP", "Idefics3VisionMLP")


@around(covers=Covers(blocks=llama.block.covers.blocks + _VISION,
                      attention=llama.block.covers.attention + _VISION_PARTS[:2],
                      mlp=llama.block.covers.mlp + _VISION_PARTS[2:], norms=llama.block.covers.norms),
        final_norm="rms_norm")
def block(tp: Tape, x):
    """A text block: Llama's decoder layer (the text model is ``LlamaModel``)."""
    return llama.layer(tp, x)


def vision_block(tp: Tape, x):
    """One ``SmolVLMEncoderLayer`` (SigLIP's), on a tape whose Setup holds the vision tower's shapes
    (:func:`vision_setup`): pre-LayerNorm attention without rotary embeddings or grouped heads, then the GELU MLP."""
    st, H = tp.st, tp.st.H
    h = tp.layer_norm(x, st.base_trainable)
    q = tp.linear(h, H, H, "self_attn.q_proj")
    k = tp.linear(h, H, H, "self_attn.k_proj")
    v = tp.linear(h, H, H, "self_attn.v_proj")
    o = tp.attention(q, k, v, H, softmax_fp32=True)
    x = tp.binary(x, tp.linear(o, H, H, "self_attn.out_proj"))
    h = tp.layer_norm(x, st.base_trainable)
    f = tp.gelu(tp.linear(h, H, st.F, "mlp.fc1"))
    return tp.binary(x, tp.linear(f, st.F, H, "mlp.fc2"))


@dataclass(frozen=True)
class Images:
    """The images of one batch as the model runs them: ``images`` rows of the vision tower (the real images, each
    crop of a split image counted, padding images dropped) of ``side`` x ``side`` pixels, each row giving
    ``(side / patch)^2 / scale_factor^2`` image tokens (81 for SmolVLM-Instruct's 384-pixel crops)."""

    images: int
    side: int


def vision_setup(cfg, text: Setup, images: Images, *, trains: bool, lora: dict) -> Setup:
    """The vision tower's Setup: ``images`` rows of ``(side / patch)^2`` patches, its widths from
    ``cfg.vision_config``; its weights in the text's dtype (one model), ``trains``: its base weights train (a full
    fine-tune), ``lora``: its adapted linears (``self_attn.q_proj``, ..., ``mlp.fc1``) -> rank; checkpointing and
    ``input_grad`` as the text's."""
    vc = cfg.vision_config
    patches = (images.side // vc.patch_size) ** 2
    return replace(text, B=images.images, S=patches, H=vc.hidden_size, F=vc.intermediate_size,
                   nh=vc.num_attention_heads, kvh=vc.num_attention_heads, hd=vc.hidden_size // vc.num_attention_heads,
                   L=vc.num_hidden_layers, V=0, padded=False, p_attn=vc.attention_dropout, base_trainable=trains,
                   lora=lora, embed_trains=False, lm_head_trains=False, head=(), rotary=0,
                   window=0, sliding=0, fused_head=False, liger=(), kernels=set())


def image_features(cfg, vst: Setup, connector_trains: bool) -> tuple:
    """Replay ``get_image_features`` on a tape of the vision Setup ``vst``: (the tape, the image features).

    The patch embedding's ``Conv2d`` keeps its input (the pixels, in the weights' dtype) for its weight's grad,
    the position embedding its ids; each encoder layer is :func:`vision_block` (under gradient checkpointing, which
    TRL's SFTConfig turns on by default, a layer keeps only its input); then ``post_layernorm`` and the connector
    (the pixel shuffle's copy, kept by ``proj`` where ``proj`` trains)."""
    tp = Tape(vst)
    trains = vst.base_trainable
    tp.save(tp.new(vst.B * 3 * vst.S * cfg.vision_config.patch_size ** 2, vst.w_other, False), when=trains)
    tp.save(tp.new(vst.B * vst.S, I64, False), when=trains)
    # patch embeds + position embeds; enable_input_require_grads hooks every input embedding of the model, the
    # tower's too (Setup.input_grad)
    x = tp.new(vst.T * vst.H, vst.w_other, trains or vst.input_grad)
    for _ in range(vst.L):
        if vst.ckpt:   # a checkpointed layer keeps only its input; backward recomputes what it saves
            tp.save(x, when=x.rg)
            x = vision_block(Tape(vst), x)
        else:
            x = vision_block(tp, x)
    x = tp.layer_norm(x, trains)
    scale = cfg.scale_factor ** 2
    shuffled = tp.new(x.n, x.dt, x.rg)   # the pixel shuffle's reshape of a permuted view: a copy
    feats = tp.linear(shuffled, vst.H * scale, cfg.text_config.hidden_size, "connector.modality_projection.proj",
                      trainable=connector_trains, w=vst.w_other, quant="none")
    return tp, feats


def forward_saved(cfg, text: Setup, images: Images, *, vision_trains: bool, vision_lora: dict,
                  connector_trains: bool) -> dict:
    """The bytes one training forward of the whole model saves for backward, by part: ``vision`` (the tower and
    the connector), ``merge`` (``masked_scatter``'s mask) and ``text`` (the text model and head, replayed as Llama's
    with ``text``; its input, the merged embeddings, needs a grad where the image features do)."""
    vst = vision_setup(cfg, text, images, trains=vision_trains, lora=vision_lora)
    tp, feats = image_features(cfg, vst, connector_trains)
    embeds_trains = text.base_trainable and not text.embed_frozen
    merged_grad = feats.rg or embeds_trains or text.input_grad
    merge = text.T * BOOL if merged_grad else 0
    text = replace(text, input_grad=text.input_grad or feats.rg)
    return {"vision": tp.total(), "merge": merge, "text": replay_core.replay(text).saved_bytes()}


def refusal(cfg) -> str | None:
    """The whole training step is not modeled yet: the vision tower's backward and the prefetched batch's pixel
    values (accelerate's data loader holds the next batch), which a vision-language step holds besides the text."""
    return ("is a vision-language model: the kit replays its forward (the vision tower, the connector and the text "
            "model), but not yet the vision tower's backward nor the pixel values of the batch the data loader "
            "fetches ahead, so a training step's peak would be a guess")


register_family("smolvlm", block=block, model_types=("smolvlm", "idefics3"), refusal=refusal)
