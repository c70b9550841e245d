"""Qwen2.5-VL: ``transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLForConditionalGeneration``, as
transformers 5.25 runs it on images (videos are refused).

Three parts, in forward order:

- the vision tower (``Qwen2_5_VisionTransformerPretrainedModel``): the processor's ``pixel_values`` are the images'
  patches flattened, ``(patches, channels x temporal_patch_size x patch_size^2)`` (1176 floats a patch), and
  ``image_grid_thw`` each image's (1, rows, columns) of 14-pixel patches. ``Qwen2_5_VisionPatchEmbed``'s ``Conv3d``
  keeps its input (the batch's own ``pixel_values`` in fp32; a half copy under autocast or half weights); the
  patches are permuted into windows (an index that keeps the ``window_index``); the 2-D rotary cos/sin, (patches,
  head_dim) fp32 each, are made once and kept by every layer's muls. Each ``Qwen2_5_VLVisionBlock``: RMSNorm, one
  fused ``attn.qkv`` (q, k and v are views of its output, so the value sdpa keeps is the whole of it), q and k
  rotated in fp32 (new tensors, back in the qkv's dtype), sdpa run once per window (layers not in
  ``fullatt_block_indexes``) or once per image (those in it): either way the chunks' outputs and logsumexps add up
  to one whole call's, then ``torch.cat`` of the chunks (a new tensor ``attn.proj`` keeps), the residual add,
  RMSNorm, ``Qwen2_5_VLMLP`` (gate/up/down with biases, SiLU) and the residual add;
- the merger (``Qwen2_5_VLPatchMerger``): ``ln_q`` (RMSNorm), a view of 2 x 2 patches as one row, ``mlp.0`` (4H to
  4H), GELU, ``mlp.2`` (4H to the text width), then the windows put back in order (an index that keeps its
  ``reverse_indices``): ``patches / spatial_merge_size^2`` image tokens;
- the merge (``masked_scatter`` of the image features at the image tokens: it keeps the ``(B, S, 1)`` bool mask) and
  the text model (``Qwen2_5_VLTextModel``): its ``Qwen2_5_VLDecoderLayer`` is Qwen2's (and so Llama's) op for op
  (q/k/v biases, o_proj without, RMSNorm, SiLU MLP), replayed by :mod:`kit.estimate.replay.llama`'s layer; M-RoPE
  only changes the cos/sin: built from (3, B, S) position ids, they are (B, S, head_dim) in the embeddings' dtype,
  one pair per batch row (``Setup.rope_sets``).

A training step (:func:`whole`) is walked as SmolVLM's (:func:`kit.estimate.replay.smolvlm.walk`): the vision part's
saved tensors are held through the text model's backward, then the merger's and the tower's own backward run. The
images are declared once in :class:`kit.training_setup.TrainingSetup` (images a row, their side); the image tokens are
computed from the image processor's arithmetic (:func:`tower_rows`: ``smart_resize`` to multiples of 28 pixels within
its min/max pixels, as ``Qwen2VLImageProcessorPil`` does), not from a processor, which needs torchvision.
:func:`forward_saved` gives the forward's saved bytes by part, checked against
``torch.autograd.graph.saved_tensors_hooks`` on ``tiny-qwen2-5-vl``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from kit.estimate.replay import core as replay_core   # (a module: the registry imports this one as core loads)
from kit.estimate.replay import llama, smolvlm
from kit.estimate.replay.families import ImageModel, register_family
from kit.estimate.replay.setup import BOOL, F32, I64, Covers, Setup, around
from kit.estimate.replay.tape import Tape

MERGER = ("merger.mlp.0", "merger.mlp.2")   # the merger's two Linears, by their names in the tower
DEFAULT_SIDE = 448   # the images' side assumed where none is given (256 image tokens an image)
PATCH, MERGE = 14, 2   # Qwen2VLImageProcessorPil's patch_size and merge_size (the vision config's, too)


# the text model's classes: Qwen2's (Llama's) op for op; its MLP is transformers' Qwen2MLP, Llama's already
_LLAMA = llama.block.covers


@around(covers=Covers(blocks=_LLAMA.blocks + ("Qwen2_5_VLDecoderLayer",),
                      attention=_LLAMA.attention + ("Qwen2_5_VLAttention",), mlp=_LLAMA.mlp,
                      norms=_LLAMA.norms + ("Qwen2_5_VLRMSNorm",)),
        final_norm="rms_norm")
def block(tp: Tape, x):
    """A text block: ``Qwen2_5_VLDecoderLayer``, Llama's decoder layer op for op."""
    return llama.layer(tp, x)


def vision_block(tp: Tape, x):
    """One ``Qwen2_5_VLVisionBlock`` on a tape whose Setup holds the tower's shapes (:func:`tower_setup`: one row of
    every patch of the batch): RMSNorm, the fused qkv, q and k rotated in fp32, sdpa per window or per image (the
    chunks' saved tensors add up to one call's), the chunks' ``torch.cat``, ``attn.proj``; RMSNorm, the gated MLP."""
    st, H = tp.st, tp.st.H
    h = tp.rms_norm(x, st.base_trainable)
    q, k, v = tp.split(tp.linear(h, H, 3 * H, "attn.qkv"), 3)
    q, k = tp.rope(q, k, x, fp32=True)   # apply_rotary_pos_emb_vision: cos/sin fp32, shared by every layer
    o = tp.attention(q, k, v, H, softmax_fp32=True)
    o = tp.new(o.n, o.dt, o.rg)   # torch.cat of the chunks' outputs
    x = tp.binary(x, tp.linear(o, H, H, "attn.proj"))
    return tp.binary(x, tp.gated_mlp(tp.rms_norm(x, st.base_trainable)))


class Vision(NamedTuple):
    """What the replay reads of the vision tower (:attr:`Setup.vision`): ``rows`` images a batch of ``side`` x
    ``side`` pixels (after the processor's resize), in ``patch``-pixel patches of ``temporal`` frames and
    ``channels`` channels, merged ``merge`` x ``merge`` into image tokens; the tower's widths and depth from
    ``cfg.vision_config``, the text model's width ``text``."""

    rows: int
    side: int
    patch: int
    temporal: int
    channels: int
    merge: int
    H: int
    F: int
    heads: int
    L: int
    text: int
    lora: tuple = ()                 # the tower's and merger's LoRA targets, (name, rank) each
    trains: bool = True              # the tower's base weights train (a full fine-tune)
    connector_trains: bool = True    # the merger's Linears train
    positions: int = 0               # a learned position grid's embeddings (0: none, the 2-D rotary alone)
    deepstack: tuple = ()            # the layers after which a deepstack merger runs (): none)

    @property
    def patches(self) -> int:
        """The tower's sequence: every patch of every image of the batch."""
        return self.rows * (self.side // self.patch) ** 2

    @property
    def patch_dim(self) -> int:
        """One patch's pixels as ``pixel_values`` holds it (1176: 3 channels x 2 frames x 14 x 14)."""
        return self.channels * self.temporal * self.patch ** 2


def vision_of(cfg, rows: int, side: int) -> Vision:
    """The :class:`Vision` of a config and a batch's ``rows`` images of ``side`` pixels."""
    vc = cfg.vision_config
    return Vision(rows=rows, side=side, patch=vc.patch_size, temporal=vc.temporal_patch_size,
                  channels=vc.in_channels, merge=vc.spatial_merge_size, H=vc.hidden_size, F=vc.intermediate_size,
                  heads=vc.num_heads, L=vc.depth, text=cfg.text_config.hidden_size)


def tower_setup(vis: Vision, text: Setup, *, trains: bool, lora: dict) -> Setup:
    """The vision tower's Setup: one row of all ``vis.patches`` patches (the tower runs the batch's patches as one
    sequence, attention split per window or image), its weights in the text's dtype (one model); ``trains``: its
    base weights train, ``lora``: its adapted linears (``attn.qkv``, ..., ``merger.mlp.0``) -> rank; checkpointing
    and ``input_grad`` as the text's."""
    return replace(text, B=1, S=vis.patches, H=vis.H, F=vis.F, nh=vis.heads, kvh=vis.heads, hd=vis.H // vis.heads,
                   L=vis.L, V=0, padded=False, p_attn=0.0, base_trainable=trains, block_norms_frozen=False,
                   lora=lora, embed_trains=False, lm_head_trains=False, head=(), rotary=0, rope_sets=1,
                   window=0, sliding=0, fused_head=False, liger=(), kernels=set(), vision=())


def tower_parts(vis: Vision, vst: Setup, connector_trains: bool) -> smolvlm.TowerParts:
    """Replay ``get_image_features``: the ``Conv3d`` keeps its input where its weight trains (the batch's fp32
    ``pixel_values`` themselves, or their half copy under autocast or half weights; under autocast, the half copy of
    its weight too); enable_input_require_grads hooks the tower's input embedding (``patch_embed``) too
    (``Setup.input_grad``); the window permutation keeps its index; each block is :func:`vision_block` (under
    gradient checkpointing a block keeps only its input); then the merger and the reverse permutation's index. The
    parts' ``bottom`` holds the patch embedding's, the window permutation's and the rotary cos/sin's saved bytes."""
    tp = Tape(vst)
    trains = vst.base_trainable
    pixels = vis.patches * vis.patch_dim
    half = vst.ac or (vst.w if vst.w != F32 else None)   # the Conv3d's input dtype where it is not fp32
    tp.save(tp.new(pixels, half or F32, False), when=trains)
    tp.save(tp.new(vis.patch_dim * vst.H, vst.ac, False), when=trains and vst.ac is not None)   # its weight's copy
    batch_pixels = pixels * F32 if trains and half is None else 0
    rg = trains or vst.input_grad
    x = tp.new(vst.T * vst.H, vst.ac or vst.w, rg)          # the patch embeddings (the Conv3d's output)
    tp.save(tp.new(vst.T // vis.merge ** 2, I64, False), when=rg)   # permute_input_for_window_attn's window_index
    below = tp.total()
    x = tp.new(x.n, x.dt, x.rg)
    one = Tape(vst)
    y = vision_block(one, x)
    rotary = one.shared   # the cos/sin every block's muls keep (0 where q and k need no grad)
    layer_bwd, layer_bwd_grads = one.backward_peak(vst.T * vst.H * y.dt) if y.rg else (0, 0)
    kept = x.n * x.dt if vst.ckpt and x.rg else one.total()
    for _ in range(vst.L):
        if vst.ckpt:   # a checkpointed block keeps only its input; backward recomputes what it saves
            tp.save(x, when=x.rg)
            x = vision_block(Tape(vst), x)
        else:
            x = vision_block(tp, x)
    top = Tape(vst)
    x = top.rms_norm(x, trains)   # ln_q, then a view of merge x merge patches as one row
    wide = vst.H * vis.merge ** 2
    h = top.gelu(top.linear(x, wide, wide, MERGER[0], trainable=connector_trains))
    feats = top.linear(h, wide, vis.text, MERGER[1], trainable=connector_trains)
    top.save(top.new(feats.n // vis.text, I64, False), when=feats.rg)   # merged[reverse_indices]: keeps the index
    feats = top.new(feats.n, feats.dt, feats.rg)
    tp.saved.update(top.saved)
    tp.save(tp.new(rotary // 4, F32, False), when=rotary > 0)
    top_bwd, top_bwd_grads = top.backward_peak(feats.n * feats.dt) if feats.rg else (0, 0)
    norm = vst.H * vst.w_other if trains else 0
    return smolvlm.TowerParts(tape=tp, features=feats, bottom=below + rotary, batch_pixels=batch_pixels,
                              layer_kept=kept, layer=one.total(), layer_bwd=layer_bwd,
                              layer_bwd_grads=layer_bwd_grads,
                              layer_grads=sum(o.weight_grad for o in one.outs) + 2 * norm, top=top.total(),
                              top_bwd=top_bwd, top_bwd_grads=top_bwd_grads,
                              top_grads=sum(o.weight_grad for o in top.outs) + norm,
                              other_grads=vis.patch_dim * vst.H * vst.w_other if trains else 0)


def text_setup(st: Setup, feats_grad: bool) -> Setup:
    """The text model's Setup: Llama's blocks (``family`` "llama"), one rotary cos/sin pair per batch row (M-RoPE's
    (3, B, S) position ids), its input needing a grad where the image features do."""
    return replace(st, family="llama", vision=(), rope_sets=st.B, input_grad=st.input_grad or feats_grad)


def forward_saved(cfg, text: Setup, rows: int, side: int, *, vision_trains: bool, vision_lora: dict,
                  connector_trains: bool) -> dict:
    """The bytes one training forward of the whole model saves for backward, by part: ``vision`` (the tower and
    the merger), ``merge`` (``masked_scatter``'s mask) and ``text`` (the text model and head, replayed as Llama's
    with ``text``, its cos/sin one pair per batch row)."""
    vis = vision_of(cfg, rows, side)
    vst = tower_setup(vis, text, trains=vision_trains, lora=vision_lora)
    parts = tower_parts(vis, vst, connector_trains)
    feats = parts.features
    embeds_trains = text.base_trainable and not text.embed_frozen
    merge = text.T * BOOL if feats.rg or embeds_trains or text.input_grad else 0
    return {"vision": parts.tape.total(), "merge": merge,
            "text": replay_core.replay(text_setup(text, feats.rg)).saved_bytes()}


def whole(st: Setup):
    """One training forward of the whole model (``st.vision``: the tower's :class:`Vision`): the tower and merger
    (:func:`tower_parts`), the merge, then the text model replayed as Llama's blocks; the batch's own pixels that the
    ``Conv3d`` keeps are counted once, with the batch; :func:`kit.estimate.replay.smolvlm.walk` walks the step."""
    smolvlm.refuse(st)
    vis = st.vision   # (a Vision: images_shape made it)
    vst = tower_setup(vis, st, trains=vis.trains, lora=dict(vis.lora))
    parts = tower_parts(vis, vst, vis.connector_trains)
    parts = replace(parts, bottom=parts.bottom - parts.batch_pixels)
    feats = parts.features
    embeds_trains = (st.base_trainable and not st.embed_frozen) or st.embed_trains
    merge = st.T * BOOL if feats.rg or embeds_trains or st.input_grad else 0
    rp = replay_core.replay(text_setup(st, feats.rg))
    hidden = vst.T * vst.H * (vst.ac or vst.w)   # the model output's image_outputs.last_hidden_state
    vision = smolvlm.VisionReplay(parts=parts, merge=merge, at_loss=hidden + feats.n * feats.dt,
                                  features_grad=feats.n * feats.dt if feats.rg else 0, L=vis.L, ckpt=vst.ckpt)
    # enable_input_require_grads (Setup.input_grad) makes a frozen embedding's output a leaf that requires grad (the
    # text embeddings' (smolvlm.text_leaf), the patch embedding's): the graph's AccumulateGrad node holds it till
    # backward ends
    tower_leaf = vst.T * vst.H * (vst.ac or vst.w) if st.input_grad and not vis.trains else 0
    hooked = smolvlm.text_leaf(st, embeds_trains) + tower_leaf
    return replace(rp, embed=rp.embed + parts.tape.total() - parts.batch_pixels + merge + hooked, vision=vision,
                   walk=smolvlm.walk)


def images_shape(cfg, rows: int, side: int, *, lora: dict, trains: bool, connector_trains: bool) -> tuple:
    """The :attr:`Setup.vision` of a config: :class:`Vision`'s fields, then the tower's LoRA targets (name, rank),
    whether its base weights train and whether the merger's do."""
    lora = {next((m for m in MERGER if name.endswith(m)), name): r for name, r in lora.items()}
    return vision_of(cfg, rows, side)._replace(lora=tuple(sorted(lora.items())), trains=trains,
                                               connector_trains=connector_trains)


def processor_pixels() -> tuple:
    """(min_pixels, max_pixels) of transformers' ``Qwen2VLImageProcessorPil`` (its ``size`` shortest and longest
    edge, in pixels): the resize's bounds where no processor is read."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    size = Qwen2VLImageProcessorPil.size
    return size["shortest_edge"], size["longest_edge"]


def resized(cfg, size: int) -> int:
    """The side of a ``size`` x ``size`` image after the image processor's ``smart_resize``: a multiple of
    ``patch_size x merge_size`` (28 pixels) nearest it, scaled into its min/max pixels."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    vc = cfg.vision_config
    low, high = processor_pixels()
    return smart_resize(size, size, factor=vc.patch_size * vc.spatial_merge_size, min_pixels=low,
                        max_pixels=high)[0]


def tower_rows(cfg, per_row: int, size: int | None, splitting: bool) -> tuple:
    """(the images a batch row, their side after the resize, the image size taken, the image tokens they take in
    the row) for ``per_row`` square images of ``size`` pixels a side (None: :data:`DEFAULT_SIDE`), resized as
    transformers 5.25's ``Qwen2VLImageProcessorPil`` does (:func:`resized`), each ``(side / patch_size)^2 /
    spatial_merge_size^2`` tokens. Its processor splits no image: ``image_splitting=False`` is refused."""
    from kit.inputs import InputError

    if not splitting:
        raise InputError("image_splitting", "Qwen2.5-VL's processor splits no image (it resizes each to multiples "
                         "of 28 pixels within its min/max pixels): leave image_splitting out.",
                         code="no-image-splitting")
    size = DEFAULT_SIDE if size is None else size
    side = resized(cfg, size)
    vc = cfg.vision_config
    return per_row, side, size, per_row * (side // vc.patch_size) ** 2 // vc.spatial_merge_size ** 2


def row_bytes(cfg, rows: int, side: int, tokens: int = 0) -> int:
    """What the collator's batch holds for a row's ``rows`` images: ``pixel_values`` (fp32, 1176 a patch) and
    ``image_grid_thw`` (3 int64 an image). (The processor's ``mm_token_type_ids``, 8 bytes a token of the row's
    ``tokens``, is not counted yet.)"""
    vis = vision_of(cfg, rows, side)
    return vis.patches * vis.patch_dim * 4 + rows * 3 * 8


def from_batch(cfg, image_processor, batch, *, resize=None) -> tuple:
    """(the image options, what they were read from) of a collated batch: its ``image_grid_thw`` gives each image's
    patches; refused where the rows hold different images, non-square ones, videos, or a side the kit's resize
    (``resize``, by default :func:`resized`) would not keep."""
    from kit.inputs import InputError

    if batch.get("pixel_values_videos") is not None:
        raise InputError("model", "a vision-language model is replayed on images, not yet on videos "
                         "(pixel_values_videos in the batch): measure the run with kit.watch(trainer).",
                         code="vision-language-not-replayed")
    grid = batch["image_grid_thw"].tolist()
    rows = len(batch["input_ids"])
    per_row = len(grid) // rows
    patch = cfg.vision_config.patch_size
    side = grid[0][1] * patch
    if per_row * rows != len(grid) or any(g != [1, side // patch, side // patch] for g in grid) \
            or (resize or resized)(cfg, side) != side:
        raise InputError("images_per_row", f"the collated batch holds {len(grid)} images of grids {grid[:4]} for "
                         f"{rows} rows, which square images of one size, the same count a row, do not make: pass "
                         "images_per_row and image_size.")
    return dict(images_per_row=per_row, image_size=side), \
        (f"image_grid_thw {grid[0]} x {len(grid)}; the image processor's patch_size {image_processor.patch_size}, "
         f"merge_size {image_processor.merge_size}")


def notes(cfg) -> list:
    """Where the image tokens come from: the image processor's arithmetic, not a processor (which needs
    torchvision)."""
    from kit.inputs import Note

    low, high = processor_pixels()
    return [Note(f"image tokens computed from the image processor's config, not by its processor (which needs "
                 f"torchvision): {PATCH} px patches merged {MERGE} x {MERGE}, images resized to multiples of "
                 f"{PATCH * MERGE} px within {low:,} to {high:,} pixels; a {DEFAULT_SIDE} px image is "
                 f"{(DEFAULT_SIDE // (PATCH * MERGE)) ** 2} tokens", field="image_size", code="image-tokens-assumed")]


register_family("qwen2_5_vl", block=block, whole=whole, notes=notes,
                images=ImageModel(modules=("visual",), text=lambda cfg: cfg.text_config, rows=tower_rows,
                                  shape=images_shape, row_bytes=row_bytes, from_batch=from_batch))
