"""Qwen3-VL: ``transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLForConditionalGeneration`` (model_type
``qwen3_vl``, dense), as transformers 5.25 runs it on images (videos are refused; ``qwen3_vl_moe`` is another family).

Three parts, in forward order:

- the vision tower (``Qwen3VLVisionModel``): ``pixel_values`` are the images' patches flattened, ``(patches, channels
  x temporal_patch_size x patch_size^2)`` (1536 floats a 16-pixel patch), ``image_grid_thw`` each image's (1, rows,
  columns). ``Qwen3VLVisionPatchEmbed``'s ``Conv3d`` keeps its input (the batch's own fp32 ``pixel_values``, or their
  half copy under autocast or half weights); the learned position grid (``pos_embed``) is interpolated per image
  (``fast_pos_embed_interpolate``: the embedding keeps its (patches, 4) int64 indices, the mul its (patches, 4, 1)
  fp32 bilinear weights, where its weight trains); the 2-D rotary cos/sin, (patches, head_dim) fp32 each, are made
  once and kept by every layer's muls. Each ``Qwen3VLVisionBlock``: LayerNorm, one fused ``attn.qkv`` (v a view of
  its output), q and k rotated in fp32, sdpa once per image (``cu_seqlens``: the chunks add up to one call's), the
  chunks' ``torch.cat``, ``attn.proj``, the residual add, LayerNorm, ``Qwen3VLVisionMLP`` (``linear_fc1``, GELU
  (tanh), ``linear_fc2``, with biases) and the residual add;
- the mergers (``Qwen3VLVisionPatchMerger``): after each layer of ``deepstack_visual_indexes`` one of
  ``deepstack_merger_list`` (its LayerNorm over a view of 2 x 2 patches as one row, ``linear_fc1``, GELU,
  ``linear_fc2`` to the text width), and after the last layer ``merger`` (its LayerNorm over each patch, then the
  same): ``patches / spatial_merge_size^2`` image tokens each;
- the merge (``masked_scatter`` of the image features at the image tokens: it keeps the ``(B, S, 1)`` bool mask) and
  the text model (``Qwen3VLTextModel``): its ``Qwen3VLTextDecoderLayer`` is Qwen3's op for op (q_norm/k_norm),
  replayed by :mod:`kit.estimate.replay.qwen3`'s layer, its interleaved M-RoPE cos/sin (B, S, head_dim) in the
  embeddings' dtype, one pair per batch row (``Setup.rope_sets``); after each of its first layers
  ``_deepstack_process`` adds a deepstack feature at the image tokens (its index and index_put keep the (B, S) bool
  mask each).

A training step (:func:`whole`) is walked as SmolVLM's (:func:`kit.estimate.replay.smolvlm.walk`): the vision part's
saved tensors (the deepstack mergers' among them) are held through the text model's backward, then the mergers' and
the tower's own backward run. The image tokens come from the image processor's arithmetic, as Qwen2.5-VL's
(:func:`tower_rows`: ``smart_resize`` to multiples of ``patch_size x merge_size``, 32 pixels here, within the
processor's :data:`PIXELS`). :func:`forward_saved` gives the forward's saved bytes by part, checked against
``torch.autograd.graph.saved_tensors_hooks`` on ``tiny-qwen3-vl``.
"""
from __future__ import annotations

from dataclasses import replace

from kit.estimate.replay import core as replay_core   # (a module: the registry imports this one as core loads)
from kit.estimate.replay import qwen2_5_vl, qwen3, smolvlm
from kit.estimate.replay.families import ImageModel, register_family
from kit.estimate.replay.setup import BOOL, F32, I64, Covers, Setup, around
from kit.estimate.replay.tape import Tape

DEFAULT_SIDE = 448   # the images' side assumed where none is given (196 image tokens an image)
PATCH, MERGE = 16, 2   # Qwen3-VL's vision config's patch_size and spatial_merge_size (its image processor's too)
# the image processor's size bounds, in pixels (its preprocessor_config.json's "size": shortest_edge, longest_edge),
# as Qwen3-VL-8B-Instruct's is quoted in https://github.com/QwenLM/Qwen3-VL/issues/1836 (the 2B's the same)
PIXELS = (65_536, 16_777_216)
MERGERS = ("linear_fc1", "linear_fc2")   # a merger's two Linears


@around(covers=Covers(blocks=("Qwen3VLTextDecoderLayer",), attention=("Qwen3VLTextAttention",),
                      mlp=("Qwen3VLTextMLP",), norms=("Qwen3VLTextRMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    """A text block: ``Qwen3VLTextDecoderLayer``, Qwen3's decoder layer op for op (q_norm and k_norm)."""
    return qwen3.block(tp, x)


def layer_norm(tp: Tape, x, trainable: bool, width: int = 0):
    """``nn.LayerNorm`` over the last ``width`` elements (the Setup's H by default): it keeps its input and its mean
    and rstd (fp32 under autocast). Autocast runs it in fp32 on CUDA, in the input's dtype on the CPU (measured with
    ``saved_tensors_hooks`` on ``tiny-qwen3-vl``: a bf16 input and fp32 mean and rstd)."""
    cuda = tp.st.device == "cuda"
    xn = tp.cast(x, F32) if tp.st.ac and cuda else x
    stats = F32 if cuda or tp.st.ac else xn.dt
    tp.save(xn, tp.new(x.n // (width or tp.st.H) * 2, stats, False), when=x.rg or trainable)
    return tp.new(x.n, xn.dt, x.rg or trainable)


def vision_block(tp: Tape, x):
    """One ``Qwen3VLVisionBlock`` on a tape whose Setup holds the tower's shapes (one row of every patch of the
    batch): LayerNorm, the fused qkv, q and k rotated in fp32, sdpa per image (the chunks' saved tensors add up to one
    call's), the chunks' ``torch.cat``, ``attn.proj``; LayerNorm, ``linear_fc1``, GELU, ``linear_fc2``."""
    st, H = tp.st, tp.st.H
    h = layer_norm(tp, x, st.base_trainable)
    q, k, v = tp.split(tp.linear(h, H, 3 * H, "attn.qkv"), 3)
    q, k = tp.rope(q, k, x, fp32=True)   # apply_rotary_pos_emb_vision: cos/sin fp32, shared by every layer
    o = tp.attention(q, k, v, H, softmax_fp32=True)
    o = tp.new(o.n, o.dt, o.rg)   # torch.cat of the chunks' outputs
    x = tp.binary(x, tp.linear(o, H, H, "attn.proj"))
    h = tp.gelu(tp.linear(layer_norm(tp, x, st.base_trainable), H, st.F, "mlp.linear_fc1"))
    return tp.binary(x, tp.linear(h, st.F, H, "mlp.linear_fc2"))


def merger(tp: Tape, x, vis, name: str, postshuffle: bool, trains: bool):
    """A ``Qwen3VLVisionPatchMerger`` (``name``: "merger" or "deepstack"): its LayerNorm (over 2 x 2 patches viewed
    as one row where ``postshuffle``, else over each patch; it keeps its input and its mean and rstd), then
    ``linear_fc1``, GELU and ``linear_fc2`` to the text width."""
    wide = vis.H * vis.merge ** 2
    h = layer_norm(tp, x, trains, wide if postshuffle else vis.H)
    h = tp.gelu(tp.linear(h, wide, wide, f"{name}.{MERGERS[0]}", trainable=trains))
    return tp.linear(h, wide, vis.text, f"{name}.{MERGERS[1]}", trainable=trains)


def vision_of(cfg, rows: int, side: int) -> qwen2_5_vl.Vision:
    """The tower's :class:`kit.estimate.replay.qwen2_5_vl.Vision` of a config and a batch's ``rows`` images of
    ``side`` pixels, with its learned position grid and the layers after which a deepstack merger runs."""
    vc = cfg.vision_config
    return qwen2_5_vl.vision_of(cfg, rows, side)._replace(positions=vc.num_position_embeddings,
                                                         deepstack=tuple(vc.deepstack_visual_indexes))


def tower_parts(vis: qwen2_5_vl.Vision, vst: Setup, connector_trains: bool) -> tuple:
    """(the :class:`kit.estimate.replay.smolvlm.TowerParts`, the deepstack features) of ``get_image_features``:
    the ``Conv3d`` keeps its input where its weight trains; the position grid's embedding its indices and the mul
    its bilinear weights where that weight trains; each block is
    :func:`vision_block` (under gradient checkpointing a block keeps only its input), a deepstack merger after the
    layers named; then the final merger. The deepstack mergers' saved tensors are counted with the patch
    embedding's (``bottom``: held through the tower's whole backward)."""
    tp = Tape(vst)
    trains = vst.base_trainable
    pixels = vis.patches * vis.patch_dim
    half = vst.ac or (vst.w if vst.w != F32 else None)   # the Conv3d's input dtype where it is not fp32
    tp.save(tp.new(pixels, half or F32, False), when=trains)
    tp.save(tp.new(vis.patch_dim * vst.H, vst.ac, False), when=trains and vst.ac is not None)   # its weight's copy
    batch_pixels = pixels * F32 if trains and half is None else 0
    tp.save(tp.new(vst.T * 4, I64, False), tp.new(vst.T * 4, F32, False), when=trains)   # pos_embed's interpolation
    # (enable_input_require_grads hooks no module of the tower: Qwen3VLVisionModel has no get_input_embeddings)
    x = tp.new(vst.T * vst.H, vst.ac or vst.w, trains)          # the patch embeddings plus the positions
    below = tp.total()
    one = Tape(vst)
    y = vision_block(one, tp.new(x.n, x.dt, x.rg))
    rotary = one.shared   # the cos/sin every block's muls keep (0 where q and k need no grad)
    layer_bwd, layer_bwd_grads = one.backward_peak(vst.T * vst.H * y.dt) if y.rg else (0, 0)
    adapted = x.rg or bool(vst.lora)   # the block's output needs a grad: checkpointing keeps its input
    kept = x.n * x.dt if vst.ckpt and adapted else one.total()
    deep, deep_feats = Tape(vst), []
    for i in range(vst.L):
        if vst.ckpt:   # a checkpointed block keeps only its input; backward recomputes what it saves
            tp.save(x, when=adapted)
            x = vision_block(Tape(vst), x)
        else:
            x = vision_block(tp, x)
        if i in vis.deepstack:
            deep_feats.append(merger(deep, x, vis, "deepstack", True, connector_trains))
    top = Tape(vst)
    feats = merger(top, x, vis, "merger", False, connector_trains)
    tp.saved.update(top.saved)
    tp.saved.update(deep.saved)
    tp.save(tp.new(rotary // 4, F32, False), when=rotary > 0)
    top_bwd, top_bwd_grads = top.backward_peak(feats.n * feats.dt) if feats.rg else (0, 0)
    norm = 2 * vst.H * vst.w_other if trains else 0   # a LayerNorm's weight and bias
    merger_norm = (2 * vis.H * vis.merge ** 2 * vst.w_other) if connector_trains else 0
    deep_grads = sum(o.weight_grad for o in deep.outs) + len(vis.deepstack) * merger_norm
    other = (vis.patch_dim + 1 + vis.positions) * vst.H * vst.w_other if trains else 0   # Conv3d, pos_embed
    return smolvlm.TowerParts(
        tape=tp, features=feats, bottom=below + rotary + deep.total(), batch_pixels=batch_pixels, layer_kept=kept,
        layer=one.total(), layer_bwd=layer_bwd, layer_bwd_grads=layer_bwd_grads,
        layer_grads=sum(o.weight_grad for o in one.outs) + 2 * norm, top=top.total(), top_bwd=top_bwd,
        top_bwd_grads=top_bwd_grads, top_grads=sum(o.weight_grad for o in top.outs) + deep_grads
        + (2 * vis.H * vst.w_other if connector_trains else 0), other_grads=other), deep_feats


def text_setup(st: Setup, feats_grad: bool) -> Setup:
    """The text model's Setup: Qwen3's blocks (``family`` "qwen3"), one rotary cos/sin pair per batch row (M-RoPE's
    position ids), its input needing a grad where the image features do."""
    return replace(st, family="qwen3", vision=(), rope_sets=st.B, input_grad=st.input_grad or feats_grad)


def masks(st: Setup, vis: qwen2_5_vl.Vision, merged_grad: bool) -> int:
    """The image tokens' (B, S) bool mask, one storage that ``masked_scatter`` keeps (where the merged embeddings
    need a grad) and ``_deepstack_process``'s ``hidden_states[mask, :]`` and index_put keep after each of the first
    ``len(deepstack_visual_indexes)`` text layers (a view of it: counted once), where the hidden states need a grad
    (any training of the text model or of the features)."""
    return st.T * BOOL if merged_grad or (vis.deepstack and (st.base_trainable or st.lora)) else 0


def forward_saved(cfg, text: Setup, rows: int, side: int, *, vision_trains: bool, vision_lora: dict,
                  connector_trains: bool) -> dict:
    """The bytes one training forward of the whole model saves for backward, by part: ``vision`` (the tower and the
    mergers), ``merge`` (``masked_scatter``'s mask and the deepstack's masks) and ``text`` (the text model and head,
    replayed as Qwen3's with ``text``, its cos/sin one pair per batch row)."""
    vis = vision_of(cfg, rows, side)
    vst = qwen2_5_vl.tower_setup(vis, text, trains=vision_trains, lora=vision_lora)
    parts, _ = tower_parts(vis, vst, connector_trains)
    feats = parts.features
    embeds_trains = text.base_trainable and not text.embed_frozen
    merge = masks(text, vis, feats.rg or embeds_trains or text.input_grad)
    return {"vision": parts.tape.total(), "merge": merge,
            "text": replay_core.replay(text_setup(text, feats.rg)).saved_bytes()}


def whole(st: Setup):
    """One training forward of the whole model (``st.vision``: the tower's
    :class:`kit.estimate.replay.qwen2_5_vl.Vision`): the tower and mergers (:func:`tower_parts`), the merge and the
    deepstack's masks, then the text model replayed as Qwen3's blocks; the
    batch's own pixels that the ``Conv3d`` keeps are counted once, with the batch;
    :func:`kit.estimate.replay.smolvlm.walk` walks the step."""
    smolvlm.refuse(st)
    vis = st.vision   # (a Vision: images_shape made it)
    vst = qwen2_5_vl.tower_setup(vis, st, trains=vis.trains, lora=dict(vis.lora))
    parts, deep_feats = tower_parts(vis, vst, vis.connector_trains)
    parts = replace(parts, bottom=parts.bottom - parts.batch_pixels)
    feats = parts.features
    embeds_trains = (st.base_trainable and not st.embed_frozen) or st.embed_trains
    merge = masks(st, vis, feats.rg or embeds_trains or st.input_grad)
    rp = replay_core.replay(text_setup(st, feats.rg))
    hidden = vst.T * vst.H * (vst.ac or vst.w)   # the model output's image_outputs.last_hidden_state
    deep = sum(f.n * f.dt for f in deep_feats)   # and its deepstack_features
    vision = smolvlm.VisionReplay(parts=parts, merge=merge, at_loss=hidden + feats.n * feats.dt + deep,
                                  features_grad=(feats.n * feats.dt + deep) if feats.rg else 0, L=vis.L,
                                  ckpt=vst.ckpt)
    # enable_input_require_grads (Setup.input_grad) makes a frozen embedding's output a leaf that requires grad (the
    # text embeddings'): the graph's AccumulateGrad node holds it till backward ends
    hooked = smolvlm.text_leaf(st, embeds_trains)   # (the tower's: none hooked)
    return replace(rp, embed=rp.embed + parts.tape.total() - parts.batch_pixels + merge + hooked, vision=vision,
                   walk=smolvlm.walk)


def images_shape(cfg, rows: int, side: int, *, lora: dict, trains: bool, connector_trains: bool) -> tuple:
    """The :attr:`Setup.vision` of a config: :func:`vision_of`'s fields, then the tower's LoRA targets (name, rank),
    whether its base weights train and whether the mergers' do."""
    def short(name):   # model.visual.deepstack_merger_list.0.linear_fc1 -> deepstack.linear_fc1, merger.* alike
        kind = "deepstack" if "deepstack_merger_list." in name else "merger" if "merger." in name else ""
        return f"{kind}.{name.rsplit('.', 1)[-1]}" if kind else name
    lora = {short(name): r for name, r in lora.items()}
    return vision_of(cfg, rows, side)._replace(lora=tuple(sorted(lora.items())), trains=trains,
                                               connector_trains=connector_trains)


def resized(cfg, size: int) -> int:
    """The side of a ``size`` x ``size`` image after the image processor's ``smart_resize``: a multiple of
    ``patch_size x merge_size`` (32 pixels) nearest it, scaled into :data:`PIXELS` (an image under 256 x 256 pixels
    grows)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    vc = cfg.vision_config
    return smart_resize(size, size, factor=vc.patch_size * vc.spatial_merge_size, min_pixels=PIXELS[0],
                        max_pixels=PIXELS[1])[0]


def tower_rows(cfg, per_row: int, size: int | None, splitting: bool) -> tuple:
    """(the images a batch row, their side after the resize, the image size taken, the image tokens they take in the
    row) for ``per_row`` square images of ``size`` pixels a side (None: :data:`DEFAULT_SIDE`), resized as Qwen3-VL's
    image processor does (:func:`resized`), each ``(side / patch_size)^2 / spatial_merge_size^2`` tokens. Its
    processor splits no image: ``image_splitting=False`` is refused."""
    from kit.inputs import InputError

    if not splitting:
        raise InputError("image_splitting", "Qwen3-VL's processor splits no image (it resizes each to multiples of "
                         "32 pixels within its min/max pixels): leave image_splitting out.",
                         code="no-image-splitting")
    size = DEFAULT_SIDE if size is None else size
    side = resized(cfg, size)
    vc = cfg.vision_config
    return per_row, side, size, per_row * (side // vc.patch_size) ** 2 // vc.spatial_merge_size ** 2


def row_bytes(cfg, rows: int, side: int, tokens: int = 0) -> int:
    """What the collator's batch holds for a row's ``rows`` images: ``pixel_values`` (fp32, 1536 a patch) and
    ``image_grid_thw`` (3 int64 an image). (The processor's ``mm_token_type_ids``, 8 bytes a token of the row's
    ``tokens``, is not counted yet, as Qwen2.5-VL's.)"""
    vis = vision_of(cfg, rows, side)
    return vis.patches * vis.patch_dim * 4 + rows * 3 * 8


def from_batch(cfg, image_processor, batch) -> tuple:
    """(the image options, what they were read from) of a collated batch: Qwen2.5-VL's reading of its
    ``image_grid_thw`` (:func:`kit.estimate.replay.qwen2_5_vl.from_batch`), with this family's resize."""
    return qwen2_5_vl.from_batch(cfg, image_processor, batch, resize=resized)


def notes(cfg) -> list:
    """Where the image tokens come from: the image processor's arithmetic, not a processor (which needs
    torchvision)."""
    from kit.inputs import Note

    low, high = PIXELS
    return [Note(f"image tokens computed from the image processor's config, not by its processor (which needs "
                 f"torchvision): {PATCH} px patches merged {MERGE} x {MERGE}, images resized to multiples of "
                 f"{PATCH * MERGE} px within {low:,} to {high:,} pixels; a {DEFAULT_SIDE} px image is "
                 f"{(DEFAULT_SIDE // (PATCH * MERGE)) ** 2} tokens", field="image_size", code="image-tokens-assumed")]


register_family("qwen3_vl", block=block, whole=whole, notes=notes,
                images=ImageModel(modules=("visual",), text=lambda cfg: cfg.text_config, rows=tower_rows,
                                  shape=images_shape, row_bytes=row_bytes, from_batch=from_batch))
