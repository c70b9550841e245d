"""Qwen3-VL (``Qwen3VLForConditionalGeneration``) fine-tuned on image + text batches, on the CPU: a plain transformers
``Trainer`` on batches made by hand as ``Qwen3VLProcessor`` makes them (``pixel_values`` of 16-pixel patches of 2
frames, 1536 floats a patch, ``image_grid_thw``, ``mm_token_type_ids``, ``(side / 32)^2`` image tokens an image), so
the step runs without torchvision (which the processor's video processor needs): full fine-tuning, LoRA on the text
model's q/v alone, or LoRA on every linear layer (the vision tower's, mergers' and text model's), and 4-bit QLoRA.
The twin is ``kit/configs/tiny-qwen3-vl.json``; fp32 weights and AdamW (TrainingArguments' defaults), bf16 autocast
under QLoRA.
"""
from __future__ import annotations

import os

import torch

from clients_qwen2_5_vl import TEXT_QV, collate, peft_config  # noqa: F401  (the same collation and LoRA targets)

TWIN = "tiny-qwen3-vl"
# rows of the dataset; each image's side in pixels (16 x 16 patches, 64 image tokens: the processor grows a smaller
# image to 256 x 256 pixels, its min_pixels)
ROWS, SIDE = 16, 256
PATCH, MERGE = 16, 2   # Qwen3-VL-2B-Instruct's image processor: 16-pixel patches of 2 frames, merged 2 x 2


def image_processor():
    """Qwen3-VL-2B-Instruct's image processor (16-pixel patches of 2 frames, merged 2 x 2, its size bounds
    :data:`kit.estimate.replay.qwen3_vl.PIXELS`), as ``Qwen2VLImageProcessorPil``, which needs no torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from kit.estimate.replay.qwen3_vl import PIXELS

    return Qwen2VLImageProcessorPil(patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE,
                                    size={"shortest_edge": PIXELS[0], "longest_edge": PIXELS[1]})


class Batches(torch.utils.data.Dataset):
    """Rows as ``Qwen3VLProcessor`` makes them, by hand: ``pixel_values`` (patches, 1536) and ``image_grid_thw``
    (1, side / 16, side / 16) for each image, ``input_ids`` with ``(side / 32)^2`` image tokens an image between its
    vision start and end tokens, ``mm_token_type_ids`` 1 at the image tokens."""

    def __init__(self, cfg, n=ROWS, per_row=1, side=SIDE, text=40):
        grid = side // PATCH
        tokens = grid * grid // MERGE ** 2
        gen = torch.Generator().manual_seed(0)
        self.rows = []
        for _ in range(n):
            ids = torch.randint(2, 4000, (text + per_row * (tokens + 2),), generator=gen)
            mm = torch.zeros_like(ids)
            for i in range(per_row):
                at = 4 + i * (tokens + 2)
                ids[at - 1], ids[at + tokens] = cfg.vision_start_token_id, cfg.vision_end_token_id
                ids[at:at + tokens], mm[at:at + tokens] = cfg.image_token_id, 1
            self.rows.append({"input_ids": ids, "mm_token_type_ids": mm,
                              "pixel_values": torch.randn(per_row * grid * grid, 3 * 2 * PATCH * PATCH, generator=gen),
                              "image_grid_thw": torch.tensor([[1, grid, grid]] * per_row)})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class ImagesOnly:
    """A processing class that holds the image processor (what the kit reads of a processor), for a Trainer whose
    batches are made by hand."""

    def __init__(self):
        self.image_processor = image_processor()


def four_bit(cfg, work):
    """The twin saved, then loaded in 4 bits (:func:`real_clients._bnb4`), as ``from_pretrained`` loads a QLoRA
    model."""
    from real_clients import _bnb4
    from transformers import AutoModelForImageTextToText

    folder = os.path.join(work, TWIN)
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(folder)
    return AutoModelForImageTextToText.from_pretrained(folder, quantization_config=_bnb4())


def plain_trainer_of(work, kind, per_row=1, side=SIDE, ckpt=False, *, batch=2, steps=3):
    """A transformers ``Trainer`` on the twin (TrainingArguments' defaults: fp32, AdamW) over :class:`Batches`:
    ``kind`` "full", "lora-text" (peft's LoRA on the text model's q/v), "lora-all" (``target_modules="all-linear"``)
    or "qlora-text"/"qlora-all" (the twin loaded in 4 bits, every Linear a Linear4bit, then peft's
    ``prepare_model_for_kbit_training`` and LoRA, under bf16 autocast, as peft's QLoRA recipe does)."""
    from kit.models import build_model, get_config
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import Trainer, TrainingArguments

    cfg = get_config(TWIN)
    torch.manual_seed(0)
    quantized = kind.startswith("qlora")
    model = four_bit(cfg, work) if quantized else build_model(cfg)
    if quantized:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=ckpt,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    elif ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = peft_config(kind)
    if lora is not None:
        if ckpt and not quantized:
            model.enable_input_require_grads()
        model = get_peft_model(model, lora)
    args = TrainingArguments(output_dir=os.path.join(work, f"qwen3-vl-plain-{kind}"), use_cpu=True,
                             max_steps=steps, per_device_train_batch_size=batch, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False, bf16=quantized)
    return Trainer(model=model, args=args, train_dataset=Batches(cfg, per_row=per_row, side=side),
                   data_collator=collate, processing_class=ImagesOnly())


# the rows of benchmarks/real_clients.py (--only Qwen3-VL): (kind, images a row, their side, checkpointing)
PLAIN = (("full", 1, SIDE, False), ("lora-text", 1, SIDE, False), ("lora-all", 2, SIDE, False),
         ("full", 2, SIDE, True), ("lora-text", 1, SIDE, True), ("lora-all", 1, SIDE, True),
         ("qlora-text", 1, SIDE, True))


def label_of(kind, per_row, side, ckpt):
    return f"Qwen3-VL Trainer {kind} {per_row}x{side}px{' ckpt' if ckpt else ''}"


def client_qwen3_vl(work, kind, per_row=1, side=SIDE, ckpt=False):
    from kit.estimate import estimate_trainer

    trainer = plain_trainer_of(work, kind, per_row, side, ckpt)
    how = {"full": "full FT", "lora-text": "LoRA r8 on the text model's q/v", "qlora-text": "QLoRA r8 on the text q/v",
           "lora-all": "LoRA r8 all-linear (tower, mergers, text)"}[kind]
    setup = (f"tiny-qwen3-vl, {how}, a plain Trainer ({'bf16 autocast, 4-bit' if kind.startswith('q') else 'fp32'}, "
             f"AdamW{', ckpt' if ckpt else ''}), B2, {per_row} image(s) a row of {side} px "
             f"({(side // PATCH) ** 2} patches, merged 2 x 2)")
    yield label_of(kind, per_row, side, ckpt), setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
