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

A training step (:func:`whole`, :func:`walk`): the vision part's saved tensors are held through the text model's
backward (counted with the embeddings'), then the tower's own backward runs (the connector's, then each layer's, its
saved tensors recomputed under checkpointing) beside the grads made. The images are declared once in
:class:`kit.training_setup.TrainingSetup` (images a row, their size, splitting), counted by :func:`tower_rows` as the
Idefics3/SmolVLM image processor cuts them; the batch's pixel values and masks are :func:`row_bytes`. What the replay
does not follow yet is refused in one sentence (:func:`refuse`). :func:`forward_saved` gives the forward's saved bytes
by part, checked against ``torch.autograd.graph.saved_tensors_hooks`` on ``tiny-smolvlm``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from kit.estimate.replay import llama
from kit.estimate.replay import core as replay_core   # (a module: the registry imports this one as core loads)
from kit.estimate.replay.families import ImageModel, register_family
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


class Vision(NamedTuple):
    """What the replay reads of the vision tower (:attr:`Setup.vision`): ``rows`` images of ``side`` x ``side``
    pixels a batch (each crop of a split image and its global view a row; padding images dropped), the tower's
    widths and depth from ``cfg.vision_config``, the connector's ``scale`` factor and the text model's width
    ``text``."""

    rows: int
    side: int
    patch: int
    H: int
    F: int
    heads: int
    L: int
    p_attn: float
    scale: int
    text: int
    lora: tuple = ()                 # the tower's and connector's LoRA targets, (name, rank) each
    trains: bool = True              # the tower's base weights train (a full fine-tune)
    connector_trains: bool = True    # the connector's Linear trains


def vision_of(cfg, images: Images) -> Vision:
    """The :class:`Vision` of a config and a batch's images."""
    vc = cfg.vision_config
    return Vision(rows=images.images, side=images.side, patch=vc.patch_size, H=vc.hidden_size,
                  F=vc.intermediate_size, heads=vc.num_attention_heads, L=vc.num_hidden_layers,
                  p_attn=vc.attention_dropout, scale=cfg.scale_factor, text=cfg.text_config.hidden_size)


def vision_setup(cfg, text: Setup, images: Images, *, trains: bool, lora: dict) -> Setup:
    """The vision tower's Setup (:func:`tower_setup` of ``cfg`` and ``images``)."""
    return tower_setup(vision_of(cfg, images), text, trains=trains, lora=lora)


def tower_setup(vis: Vision, text: Setup, *, trains: bool, lora: dict) -> Setup:
    """The vision tower's Setup: ``vis.rows`` rows of ``(side / patch)^2`` patches; its weights in the text's dtype
    (one model), ``trains``: its base weights train (a full fine-tune), ``lora``: its adapted linears
    (``self_attn.q_proj``, ..., ``mlp.fc1``) -> rank; checkpointing and ``input_grad`` as the text's."""
    patches = (vis.side // vis.patch) ** 2
    return replace(text, B=vis.rows, S=patches, H=vis.H, F=vis.F, nh=vis.heads, kvh=vis.heads, hd=vis.H // vis.heads,
                   L=vis.L, V=0, padded=False, p_attn=vis.p_attn, base_trainable=trains,
                   lora=lora, embed_trains=False, lm_head_trains=False, head=(), rotary=0,
                   window=0, sliding=0, fused_head=False, liger=(), kernels=set(), vision=())


def image_features(cfg, vst: Setup, connector_trains: bool) -> tuple:
    """Replay ``get_image_features`` on a tape of the vision Setup ``vst``: (the tape, the image features)."""
    side = round(vst.S ** 0.5) * cfg.vision_config.patch_size
    parts = tower_parts(vision_of(cfg, Images(vst.B, side)), vst, connector_trains)
    return parts.tape, parts.features


@dataclass
class TowerParts:
    """The vision tower and connector replayed (:func:`tower_parts`): the tape of the whole forward (``tape``; with
    checkpointing, a layer's input alone on it), the image ``features``; for the backward walk: the patch
    embedding's saved bytes (``bottom``), one layer's saved bytes as the forward keeps them (``layer_kept``) and as
    its backward holds them (``layer``: recomputed under checkpointing), its backward peak and the weight grads made
    by then (``layer_bwd``, ``layer_bwd_grads``), its weight grads (``layer_grads``), the post-LayerNorm's and the
    connector's saved bytes, backward peak, grads made by then and grads (``top``, ``top_bwd``, ``top_bwd_grads``,
    ``top_grads``), and the grads of the patch and position embeddings and the norms (``other_grads``);
    ``batch_pixels``: of ``bottom``, the batch's own ``pixel_values`` the patch embedding keeps, which the batch
    already counts (0 where it keeps a copy of its own)."""

    tape: Tape
    features: object
    bottom: int
    layer_kept: int
    layer: int
    layer_bwd: int
    layer_bwd_grads: int
    layer_grads: int
    top: int
    top_bwd: int
    top_bwd_grads: int
    top_grads: int
    other_grads: int
    batch_pixels: int = 0


def tower_parts(vis: Vision, vst: Setup, connector_trains: bool) -> TowerParts:
    """Replay ``get_image_features``: the patch embedding's ``Conv2d`` keeps its input (the pixels, in the weights'
    dtype) for its weight's grad, the position embedding its ids; each encoder layer is :func:`vision_block` (under
    gradient checkpointing, which TRL's SFTConfig turns on by default, a layer keeps only its input); then
    ``post_layernorm`` and the connector (the pixel shuffle's copy, kept by ``proj`` where ``proj`` trains)."""
    tp = Tape(vst)
    trains = vst.base_trainable
    # (under autocast the Conv2d runs in the half dtype: it keeps the half copies of the pixels and of its weight)
    tp.save(tp.new(vst.B * 3 * vst.S * vis.patch ** 2, vst.ac or vst.w_other, False), when=trains)
    tp.save(tp.new(3 * vis.patch ** 2 * vst.H, vst.ac, False), when=trains and vst.ac is not None)
    tp.save(tp.new(vst.B * vst.S, I64, False), when=trains)
    bottom = tp.total()
    # patch embeds + position embeds; enable_input_require_grads hooks every input embedding of the model, the
    # tower's too (Setup.input_grad)
    x = tp.new(vst.T * vst.H, vst.w_other, trains or vst.input_grad)
    one = Tape(vst)
    y = vision_block(one, x)
    flowing = vst.T * vst.H * y.dt
    layer_bwd, layer_bwd_grads = one.backward_peak(flowing) if y.rg else (0, 0)
    kept = x.n * x.dt if vst.ckpt and x.rg else one.total()
    for _ in range(vst.L):
        if vst.ckpt:   # a checkpointed layer keeps only its input; backward recomputes what it saves
            tp.save(x, when=x.rg)
            x = vision_block(Tape(vst), x)
        else:
            x = vision_block(tp, x)
    top = Tape(vst)
    x = top.layer_norm(x, trains)
    shuffled = top.new(x.n, x.dt, x.rg)   # the pixel shuffle's reshape of a permuted view: a copy
    feats = top.linear(shuffled, vst.H * vis.scale ** 2, vis.text, "connector.modality_projection.proj",
                       trainable=connector_trains, w=vst.w_other)
    tp.saved.update(top.saved)
    top_bwd, top_bwd_grads = top.backward_peak(feats.n * feats.dt) if feats.rg else (0, 0)
    norm = 2 * vst.H * vst.w_other if trains else 0
    other = (3 * vis.patch ** 2 * vst.H + vst.H + vst.S * vst.H) * vst.w_other + 2 * vst.L * norm if trains else 0
    return TowerParts(tape=tp, features=feats, bottom=bottom, layer_kept=kept, layer=one.total(),
                      layer_bwd=layer_bwd, layer_bwd_grads=layer_bwd_grads,
                      layer_grads=sum(o.weight_grad for o in one.outs) + 2 * norm, top=top.total(),
                      top_bwd=top_bwd, top_bwd_grads=top_bwd_grads,
                      top_grads=sum(o.weight_grad for o in top.outs) + norm, other_grads=other)


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
    return {"vision": tp.total(), "merge": merge,
            "text": replay_core.replay(replace(text, family="llama")).saved_bytes()}


CONNECTOR = "connector.modality_projection.proj"   # the connector's one Linear, by its name in the model


@dataclass
class VisionReplay:
    """The vision part of a training step, for :func:`walk`: the tower's :class:`TowerParts`, the merge's saved mask
    (``merge``), what the forward holds at the loss besides (``at_loss``: the model output's ``image_outputs``, the
    tower's last hidden state and the image features), the image features' grad that enters the connector's
    backward (``features_grad``), and the tower's layers and checkpointing."""

    parts: TowerParts
    merge: int
    at_loss: int
    features_grad: int
    L: int
    ckpt: bool


def whole(st: Setup):
    """One training forward of the whole model (``st.vision``: the tower's :class:`Vision`): the vision tower and
    connector (:func:`tower_parts`), the merge, then the text model replayed as Llama's blocks; what the vision part
    saves is held (with the embeddings' saved tensors) through the text model's backward, and :func:`walk` adds the
    tower's own backward after it."""
    refuse(st)
    vis = st.vision   # (a Vision: images_shape made it)
    vst = tower_setup(vis, st, trains=vis.trains, lora=dict(vis.lora))
    parts = tower_parts(vis, vst, vis.connector_trains)
    feats = parts.features
    embeds_trains = (st.base_trainable and not st.embed_frozen) or st.embed_trains
    merge = st.T * BOOL if feats.rg or embeds_trains or st.input_grad else 0
    text = replace(st, family="llama", vision=(), input_grad=st.input_grad or feats.rg)
    rp = replay_core.replay(text)
    hidden = vst.T * vst.H * vst.w_other
    leaf = text_leaf(st, embeds_trains)
    parts = replace(parts, bottom=parts.bottom + 2 * leaf)   # (the leaf's grad made by the tower's backward)
    vision = VisionReplay(parts=parts, merge=merge, at_loss=hidden + feats.n * feats.dt,
                          features_grad=feats.n * feats.dt if feats.rg else 0, L=vis.L, ckpt=vst.ckpt)
    return replace(rp, embed=rp.embed + parts.tape.total() + merge + leaf, vision=vision, walk=walk)


def text_leaf(st: Setup, embeds_trains: bool) -> int:
    """The text embeddings' output where ``enable_input_require_grads`` (peft's, with checkpointing:
    :attr:`Setup.input_grad`) makes a frozen embedding's output require grad: a leaf, which autograd's graph holds
    (its ``AccumulateGrad``) till the backward ends, and which no op saves (the merge scatters the image features
    into a new tensor); 0 where the embeddings train or nothing hooks them. (The tower's hooked output is the first
    layer's input, which that layer keeps: counted with it.)"""
    return st.T * st.H * st.w_other if st.input_grad and not embeds_trains else 0


def walk(rp, *, grads_embed: int, grads_block: int, grads_head: int, wtemp_block: int, wtemp_head: int,
         grads_before: int = 0, head_half: int = 0, tied: int = 0) -> list:
    """The moments of a vision-language step (:func:`kit.estimate.replay.core.moments`' arguments): the text model's,
    with the vision part's saved tensors held under them (counted among the embeddings') and the tower's outputs at
    the loss; then the vision part's backward: the connector's, the tower's top layer's and its first layer's (each
    layer's recomputed saved tensors under checkpointing), beside the grads made so far."""
    from kit.estimate.replay.core import Moment, moments

    vr = rp.vision
    kw = dict(grads_embed=grads_embed, grads_block=grads_block, grads_head=grads_head, wtemp_block=wtemp_block,
              wtemp_head=wtemp_head, grads_before=grads_before, head_half=head_half, tied=tied)
    text = moments(replace(rp, walk=None, vision=None), **kw)
    text = [replace(m, temporaries=m.temporaries + vr.at_loss) if m.where == "forward (at the loss)" else m
            for m in text]
    acc, p = bool(grads_before), vr.parts
    done = grads_before + (0 if acc else grads_head + rp.L * grads_block + grads_embed)
    below = p.bottom + vr.L * p.layer_kept   # the patch embedding's and the layers' saved tensors
    out = [Moment(where="backward (vision connector)", activations=below, logits=0, copies=0,
                  gradients=done + (0 if acc else p.top_bwd_grads), temporaries=p.top_bwd + vr.features_grad)]
    done += 0 if acc else p.top_grads
    for i in (vr.L, 1):
        held = p.bottom + (i - 1) * p.layer_kept + (p.layer_kept if vr.ckpt else 0)
        out.append(Moment(where=f"backward (vision layer {i})", activations=held, logits=0, copies=0,
                          gradients=done + (0 if acc else (vr.L - i) * p.layer_grads + p.layer_bwd_grads),
                          temporaries=p.layer_bwd))
    return text + out


def images_shape(cfg, rows: int, side: int, *, lora: dict, trains: bool, connector_trains: bool) -> tuple:
    """The :attr:`Setup.vision` of a config: :class:`Vision`'s fields, then the tower's LoRA targets (name, rank),
    whether its base weights train and whether the connector's does."""
    lora = {CONNECTOR if name.endswith(CONNECTOR) else name: r for name, r in lora.items()}
    return vision_of(cfg, Images(rows, side))._replace(lora=tuple(sorted(lora.items())), trains=trains,
                                                        connector_trains=connector_trains)


def tower_rows(cfg, per_row: int, size: int | None, splitting: bool) -> tuple:
    """(the vision tower's rows for a batch row, their side, the image size taken, the ``<image>`` tokens they take
    in the row) for ``per_row`` square images of
    ``size`` pixels a side after the processor's resize (its ``size["longest_edge"]``; None: 4 crops a side,
    SmolVLM-Instruct's 1536 for its 384-pixel crops), as transformers 5.25's Idefics3/SmolVLM image processor cuts
    them: with ``do_image_splitting``, an image larger than the tower's ``image_size`` (the processor's
    ``max_image_size``) is resized up to a multiple of it and cut into crops, plus one global view of the whole;
    otherwise it is resized to one row."""
    crop = cfg.vision_config.image_size
    size = 4 * crop if size is None else size
    per_side = -(-size // crop) if splitting and size > crop else 0
    rows = per_row * (per_side * per_side + 1) if splitting else per_row
    return rows, crop, size, rows * (crop // cfg.vision_config.patch_size) ** 2 // cfg.scale_factor ** 2


def row_bytes(cfg, rows: int, side: int, tokens: int = 0) -> int:
    """What the collator's batch holds for a row's ``rows`` images: ``pixel_values`` (fp32, 3 channels) and
    ``pixel_attention_mask`` (int64), ``side`` x ``side`` each (nothing a token: ``tokens`` is not read)."""
    return rows * side * side * (3 * 4 + 8)


def from_batch(cfg, image_processor, batch) -> tuple:
    """(the image options, what they were read from) of a collated batch: its ``pixel_values`` (batch, images, 3,
    side, side) hold the vision tower's rows for a batch row (each crop and global view of a split image), which the
    processor's ``size["longest_edge"]`` and ``do_image_splitting`` turn back into images a row."""
    from kit.inputs import InputError

    pixels = batch["pixel_values"]
    size = (image_processor.size or {}).get("longest_edge")
    splitting = bool(image_processor.do_image_splitting)
    per_image = tower_rows(cfg, 1, size, splitting)[0]
    per_row = pixels.shape[1] // per_image
    if per_row * per_image != pixels.shape[1] or pixels.shape[-1] != tower_rows(cfg, 1, size, False)[1]:
        raise InputError("images_per_row", f"the collated batch holds {pixels.shape[1]} images of "
                         f"{pixels.shape[-1]} px a row, which square images of the processor's {size} px do not "
                         "make: pass images_per_row and image_size.")
    return dict(images_per_row=per_row, image_size=size, image_splitting=splitting), \
        (f"pixel_values {tuple(pixels.shape)}; the image processor's size longest_edge {size}, do_image_splitting "
         f"{splitting}")


# What the whole replay does not follow yet: the Setup field, and its name in the refusal (and 8-bit layers: 4-bit
# ones, the tower's and the connector's too, are replayed by the tape's Linear4bit)
NOT_REPLAYED = (("liger", "Liger's kernels"),
                ("trl_offload", "activation offloading"), ("ckpt_offload", "checkpoint offloading"),
                ("frozen_below", "frozen bottom blocks"), ("own", "a head of one's own"), ("dora", "DoRA"))


def refuse(st: Setup) -> None:
    """Refuse, in one sentence, what this replay does not follow (:data:`NOT_REPLAYED`, partial checkpointing)."""
    from kit.inputs import InputError

    found = next((name for field, name in NOT_REPLAYED if getattr(st, field) not in (False, 0, (), "none", None)),
                 "partial checkpointing" if st.ckpt_every > 1 else "8-bit layers" if st.quant == "8bit" else None)
    if found:
        raise InputError("model", f"a vision-language model is replayed (vision tower, connector and text model) with "
                         f"full fine-tuning, LoRA or 4-bit QLoRA, not yet with {found}: estimate it "
                         "without, or measure the run with kit.watch(trainer).", code="vision-language-not-replayed")


register_family("smolvlm", block=block, model_types=("smolvlm", "idefics3"), whole=whole,
                images=ImageModel(modules=("vision_model", "connector"), text=lambda cfg: cfg.text_config,
                                  rows=tower_rows, shape=images_shape, row_bytes=row_bytes,
                                  from_batch=from_batch))
