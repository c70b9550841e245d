"""Gemma 3 multimodal: ``transformers.models.gemma3.modeling_gemma3.Gemma3ForConditionalGeneration`` (config
model_type ``gemma3``, a ``text_config`` of model_type ``gemma3_text`` and a SigLIP ``vision_config``), as
transformers 5.25 runs it.

Three parts, in forward order:

- the vision tower (``SiglipVisionModel``): a ``Conv2d`` patch embedding on ``pixel_values.to(weight dtype)`` (the
  batch's own tensor where the dtypes agree: it keeps no new one, except the half copies autocast makes), a learned
  position embedding looked up at the ``position_ids`` buffer (it keeps the buffer, no tensor of its own), then
  ``SiglipEncoderLayer``s, op for op SmolVLM's (:func:`kit.estimate.replay.smolvlm.vision_block`: pre-LayerNorm,
  q/k/v with biases, bidirectional sdpa without a mask, ``out_proj``, ``fc1``, ``gelu_pytorch_tanh``, ``fc2``), and
  ``post_layernorm``. Every image is one row of ``(image_size / patch_size)^2`` patches: Gemma 3's processor resizes
  each image to the tower's ``image_size``;
- the projector (``Gemma3MultiModalProjector``): transpose and reshape to ``(images, H, side, side)`` (a copy),
  ``AvgPool2d`` down to ``mm_tokens_per_image`` tokens (it keeps that copy), the ``mm_soft_emb_norm`` (Gemma's
  RMSNorm, ``1 + weight`` in fp32) and a ``matmul`` with the Parameter ``mm_input_projection_weight`` (no Linear:
  no LoRA reaches it);
- the merge: the text embeddings (scaled by sqrt(hidden) inside ``Gemma3TextScaledWordEmbedding``, as the text
  model's), ``masked_scatter`` of the image features at the image tokens (it keeps the ``(B, S, 1)`` bool mask);
  the ``token_type_ids`` the processor returns make the image tokens attend to each other both ways, so both
  attention masks (full and sliding) are built as ``(B, 1, S, S)`` bool tensors, as a padded batch's; then the text
  model, Gemma 3's blocks (:mod:`kit.estimate.replay.gemma3`), and ``lm_head``.

A training step: the vision part's saved tensors are held through the text model's backward, then the tower's own
backward runs (:func:`kit.estimate.replay.smolvlm.walk`, the same walk). The images are declared once in
:class:`kit.training_setup.TrainingSetup` (images a row; their size is the tower's, fixed by the processor);
:func:`tower_rows` counts them, :func:`row_bytes` what the collator adds, :func:`from_batch` reads them back from a
trainer's batch. What the replay does not follow is refused as SmolVLM's is (:func:`kit.estimate.replay.smolvlm.
refuse`). :func:`forward_saved` gives the forward's saved bytes by part, checked against
``torch.autograd.graph.saved_tensors_hooks`` on ``tiny-gemma3-vision``.
"""
from __future__ import annotations

from dataclasses import replace

from kit.estimate.replay import core as replay_core   # (a module: the registry imports this one as core loads)
from kit.estimate.replay import gemma2, gemma3, smolvlm
from kit.estimate.replay.families import ImageModel, register_family
from kit.estimate.replay.setup import BOOL, F32, Covers, Setup, around
from kit.estimate.replay.tape import Tape

_TOWER = Covers(blocks=("SiglipEncoderLayer",), attention=("SiglipAttention",), mlp=("SiglipMLP",))
_TEXT = gemma3.block.covers
PROJECTION = "multi_modal_projector.mm_input_projection_weight"   # the projector's Parameter, by its name


@around(covers=Covers(blocks=_TEXT.blocks + _TOWER.blocks, attention=_TEXT.attention + _TOWER.attention,
                      mlp=_TEXT.mlp + _TOWER.mlp, norms=_TEXT.norms),
        final_norm="rms_norm_offset", embed_scale=True)
def block(tp: Tape, x):
    """A text block: Gemma 3's decoder layer (the text model is ``Gemma3TextModel``)."""
    return gemma2.layer(tp, x, qk_norm=True)


def vision_of(cfg, rows: int) -> smolvlm.Vision:
    """The tower's :class:`~kit.estimate.replay.smolvlm.Vision` for ``rows`` images: their side is the tower's
    ``image_size``; ``scale`` is the projector's pooling kernel (patches a side / tokens a side), so that
    ``patches / scale^2`` is ``mm_tokens_per_image``."""
    vc = cfg.vision_config
    side = vc.image_size // vc.patch_size
    kernel = side // round(cfg.mm_tokens_per_image ** 0.5)
    return smolvlm.Vision(rows=rows, side=vc.image_size, patch=vc.patch_size, H=vc.hidden_size,
                          F=vc.intermediate_size, heads=vc.num_attention_heads, L=vc.num_hidden_layers,
                          p_attn=vc.attention_dropout, scale=kernel, text=cfg.text_config.hidden_size)


def tower_parts(vis: smolvlm.Vision, vst: Setup, projector_trains: bool) -> smolvlm.TowerParts:
    """Replay ``get_image_features``: the patch embedding's ``Conv2d`` keeps its input for its weight's grad (a new
    tensor only where ``pixel_values.to(weight dtype)`` or autocast copies the pixels: the batch's own otherwise,
    counted with the batch); the position embedding keeps its ``position_ids`` buffer (counted with the buffers);
    the encoder layers are SmolVLM's (checkpointed: a layer keeps its input), then ``post_layernorm`` and the
    projector: the pooled copy ``AvgPool2d`` keeps, Gemma's RMSNorm and the matmul with
    ``mm_input_projection_weight`` (its fp32 result cast back, ``type_as``, by the projector)."""
    tp = Tape(vst)
    trains = vst.base_trainable
    pixels = vst.B * 3 * vst.S * vis.patch ** 2
    half = vst.ac or (vst.w_other if vst.w_other != F32 else None)   # the dtype of a new copy of the pixels
    tp.save(tp.new(pixels, half, False), when=trains and half is not None)
    tp.save(tp.new(3 * vis.patch ** 2 * vst.H, vst.ac, False), when=trains and vst.ac is not None)
    bottom = tp.total()
    x = tp.new(vst.T * vst.H, vst.w_other, trains or vst.input_grad)
    one = Tape(vst)
    y = smolvlm.vision_block(one, x)
    layer_bwd, layer_bwd_grads = one.backward_peak(vst.T * vst.H * y.dt) if y.rg else (0, 0)
    kept = x.n * x.dt if vst.ckpt and x.rg else one.total()
    for _ in range(vst.L):
        if vst.ckpt:   # a checkpointed layer keeps only its input; backward recomputes what it saves
            tp.save(x, when=x.rg)
            x = smolvlm.vision_block(Tape(vst), x)
        else:
            x = smolvlm.vision_block(tp, x)
    top = Tape(vst)
    x = top.layer_norm(x, trains)
    grid = top.new(x.n, x.dt, x.rg)   # transpose + reshape: a copy, which AvgPool2d keeps
    top.save(grid, when=x.rg)
    tokens = vst.B * (vst.S // vis.scale ** 2)
    pooled = top.new(tokens * vst.H, x.dt, x.rg)
    normed = top.rms_norm_offset(pooled, trains)
    feats = top.linear(normed, vst.H, vis.text, PROJECTION, trainable=projector_trains, w=vst.w_other,
                       quant="none")
    feats = top.cast(feats, x.dt)
    tp.saved.update(top.saved)
    top_bwd, top_bwd_grads = top.backward_peak(feats.n * feats.dt) if feats.rg else (0, 0)
    norm = 2 * vst.H * vst.w_other if trains else 0
    other = (3 * vis.patch ** 2 * vst.H + vst.H + vst.S * vst.H) * vst.w_other + 2 * vst.L * norm if trains else 0
    return smolvlm.TowerParts(tape=tp, features=feats, bottom=bottom, layer_kept=kept, layer=one.total(),
                              layer_bwd=layer_bwd, layer_bwd_grads=layer_bwd_grads,
                              layer_grads=sum(o.weight_grad for o in one.outs) + 2 * norm, top=top.total(),
                              top_bwd=top_bwd, top_bwd_grads=top_bwd_grads,
                              top_grads=sum(o.weight_grad for o in top.outs) + norm
                              + (vst.H * vst.w_other if projector_trains else 0),
                              other_grads=other)


def text_of(st: Setup, features_grad: bool) -> Setup:
    """The text model's Setup: Gemma 3's blocks, both attention masks built (the image tokens' bidirectional
    overlay), its input needing a grad where the image features do."""
    return replace(st, family=_TEXT_KEY, vision=(), padded=True, input_grad=st.input_grad or features_grad)


def forward_saved(cfg, text: Setup, rows: int, *, vision_trains: bool, vision_lora: dict,
                  projector_trains: bool) -> dict:
    """The bytes one training forward of the whole model saves for backward, by part: ``vision`` (the tower and
    the projector), ``merge`` (``masked_scatter``'s mask) and ``text`` (the text model and head, replayed as
    Gemma 3's with ``text``)."""
    vis = vision_of(cfg, rows)
    vst = smolvlm.tower_setup(vis, text, trains=vision_trains, lora=vision_lora)
    feats = tower_parts(vis, vst, projector_trains)
    merged_grad = feats.features.rg or (text.base_trainable and not text.embed_frozen) or text.input_grad
    return {"vision": feats.tape.total(), "merge": text.T * BOOL if merged_grad else 0,
            "text": replay_core.replay(text_of(text, feats.features.rg)).saved_bytes()}


def whole(st: Setup):
    """One training forward of the whole model (``st.vision``: the tower's Vision, :func:`images_shape`): the
    tower and projector (:func:`tower_parts`), the merge, then the text model replayed as Gemma 3's blocks; the
    vision part's saved tensors are held through the text model's backward and its own backward is walked after
    (SmolVLM's :func:`~kit.estimate.replay.smolvlm.walk`)."""
    smolvlm.refuse(st)
    vis = st.vision
    vst = smolvlm.tower_setup(vis, st, trains=vis.trains, lora=dict(vis.lora))
    parts = tower_parts(vis, vst, vis.connector_trains)
    feats = parts.features
    embeds_trains = (st.base_trainable and not st.embed_frozen) or st.embed_trains
    merge = st.T * BOOL if feats.rg or embeds_trains or st.input_grad else 0
    rp = replay_core.replay(text_of(st, feats.rg))
    hidden = vst.T * vst.H * vst.w_other
    text_leaf, tower_leaf = smolvlm.text_leaf(st, embeds_trains), tower_hooked_leaf(vst)
    parts = replace(parts, bottom=parts.bottom + tower_leaf + 2 * text_leaf)   # (the text leaf's grad made by then)
    vision = smolvlm.VisionReplay(parts=parts, merge=merge, at_loss=hidden + feats.n * feats.dt,
                                  features_grad=feats.n * feats.dt if feats.rg else 0, L=vis.L, ckpt=vst.ckpt)
    return replace(rp, embed=rp.embed + parts.tape.total() + merge + text_leaf + tower_leaf, vision=vision,
                   walk=smolvlm.walk)


def tower_hooked_leaf(vst: Setup) -> int:
    """The patch embedding's output where ``enable_input_require_grads`` (peft's, with checkpointing) makes the
    frozen tower's ``Conv2d`` output require grad: a leaf autograd's graph holds till the backward ends, which no op
    saves (it is added to the position embeddings before any layer keeps it); 0 where the tower trains or nothing
    hooks it. The text embeddings' leaf is :func:`kit.estimate.replay.smolvlm.text_leaf`."""
    return vst.T * vst.H * (vst.ac or vst.w_other) if vst.input_grad and not vst.base_trainable else 0


def images_shape(cfg, rows: int, side: int, *, lora: dict, trains: bool, connector_trains: bool) -> tuple:
    """The :attr:`Setup.vision` of a config: the tower's Vision, its LoRA targets (name, rank), whether its base
    weights train and whether the projector's weight does."""
    return vision_of(cfg, rows)._replace(lora=tuple(sorted(lora.items())), trains=trains,
                                         connector_trains=connector_trains)


def tower_rows(cfg, per_row: int, size: int | None, splitting) -> tuple:
    """(the vision tower's rows for a batch row, their side, the image size taken, the image tokens they take in the
    row) for ``per_row`` square images: Gemma 3's image processor resizes every image to the tower's
    ``image_size`` (``size`` must be that, or None), each a row of ``mm_tokens_per_image`` image tokens between its
    begin- and end-of-image tokens. ``splitting`` (pan-and-scan, ``do_pan_and_scan``) changes nothing here: it
    crops only an image whose sides differ by ``pan_and_scan_min_ratio_to_activate`` (1.2) or more, never a square
    one; a batch whose images it cropped counts each crop as an image (:func:`from_batch`)."""
    from kit.inputs import InputError

    side = cfg.vision_config.image_size
    if size is not None and size != side:
        raise InputError("image_size", f"Gemma 3's processor resizes every image to its vision tower's {side} px, "
                         f"so image_size {size} cannot be: leave image_size out (or pass {side}).",
                         code="image-size-fixed")
    return per_row, side, side, per_row * (cfg.mm_tokens_per_image + 2)


def row_bytes(cfg, rows: int, side: int, tokens: int = 0) -> int:
    """What the collator's batch holds for a row's ``rows`` images beside the text's tensors: ``pixel_values``
    (fp32, 3 channels, ``side`` x ``side``) and the processor's ``token_type_ids`` (int64, one a token of the row's
    ``tokens``)."""
    return rows * 3 * side * side * 4 + tokens * 8


def from_batch(cfg, image_processor, batch) -> tuple:
    """(the image options, what they were read from) of a collated batch: its ``pixel_values`` (images, 3, side,
    side) hold the batch's images (each pan-and-scan crop counted as one) at the tower's ``image_size``, an equal
    number a row."""
    from kit.inputs import InputError

    pixels, rows = batch["pixel_values"], len(batch["input_ids"])
    side = cfg.vision_config.image_size
    pan = bool(getattr(image_processor, "do_pan_and_scan", None))
    if pixels.ndim != 4 or pixels.shape[0] % rows or pixels.shape[-1] != side:
        raise InputError("images_per_row", f"the collated batch holds pixel_values {tuple(pixels.shape)} for "
                         f"{rows} rows, which an equal number of {side}-px images a row does not make: pass "
                         "images_per_row.")
    return dict(images_per_row=pixels.shape[0] // rows, image_size=side, image_splitting=pan), \
        f"pixel_values {tuple(pixels.shape)} for {rows} rows; the image processor's do_pan_and_scan {pan}"


def refusal(cfg) -> str | None:
    """A config whose vision part this replay does not have: a SigLIP tower with its pooling head
    (``vision_use_head``, which ``SiglipVisionModel`` runs and Gemma 3 then drops), or patches a side that
    ``mm_tokens_per_image`` does not pool evenly (transformers' own default config: 14 patches a side, 16 tokens)."""
    vc = getattr(cfg, "vision_config", None)
    if vc is None:
        return None
    if getattr(vc, "vision_use_head", False):
        return "has a vision tower with its pooling head (vision_config.vision_use_head), which the replay lacks"
    side, tokens = vc.image_size // vc.patch_size, round(cfg.mm_tokens_per_image ** 0.5)
    if tokens < 1 or side % tokens:
        return (f"pools {side} patches a side into {tokens} image tokens a side (mm_tokens_per_image "
                f"{cfg.mm_tokens_per_image}), which the projector's average pooling does not do evenly")
    return None


_TEXT_KEY = "gemma3_text"   # the text model's Setup.family key (kit.estimate.replay.gemma3's declaration)

register_family("gemma3", block=block, config_fields=gemma3.config_fields, whole=whole, refusal=refusal,
                images=ImageModel(modules=("vision_tower", "multi_modal_projector"),
                                  text=lambda cfg: cfg.text_config, rows=tower_rows, shape=images_shape,
                                  row_bytes=row_bytes, from_batch=from_batch,
                                  fixed_size=lambda cfg: cfg.vision_config.image_size))
