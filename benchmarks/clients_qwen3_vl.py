"""Qwen3-VL (``Qwen3VLForConditionalGeneration``) fine-tuned on image + text batches, on the CPU, in two ways: TRL's
``SFTTrainer`` on image + text messages with the processor built offline as Qwen3-VL-2B-Instruct's
(``Qwen3VLProcessor``: its image processor, the kit's tokenizer with Qwen's vision tokens, a chat template in Qwen's
form), which needs torchvision (its video processor) and so runs in the benchmark-only environment
``benchmarks/vl_env.sh`` builds; and a plain transformers ``Trainer`` on batches made by hand as the processor makes
them (``pixel_values`` of 16-pixel patches of 2
frames, 1536 floats a patch, ``image_grid_thw``, ``mm_token_type_ids``, ``(side / 32)^2`` image tokens an image), so
the step runs without torchvision (which the processor's video processor needs): full fine-tuning, LoRA on the text
model's q/v alone, or LoRA on every linear layer (the vision tower's, mergers' and text model's), and 4-bit QLoRA.
The twin is ``kit/configs/tiny-qwen3-vl.json``; fp32 weights and AdamW (TrainingArguments' defaults), bf16 autocast
under QLoRA.
"""
from __future__ import annotations

import os

import torch

from clients_qwen2_5_vl import CHAT_TEMPLATE, TEXT_QV, VISION_TOKENS, collate, dataset, peft_config  # noqa: F401

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


# ---- TRL's SFTTrainer with the processor (needs torchvision) ----------------------------------------------------
# the rows of benchmarks/vl_env.sh: (kind, images a row, their side, gradient checkpointing (SFTConfig's default) on)
ROWS_RUN = (("full", 1, SIDE, True), ("lora-text", 1, SIDE, True), ("lora-all", 1, SIDE, True),
            ("full", 1, 448, False), ("lora-text", 1, 448, False), ("lora-all", 2, SIDE, False))


def processor():
    """The twin's processor (needs torchvision): the kit's tokenizer with Qwen's vision tokens, Qwen3-VL's image
    processor (:func:`image_processor`) and its video processor, a chat template in Qwen's form."""
    from kit import data
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok = data.shipped_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    return Qwen3VLProcessor(image_processor=image_processor(), tokenizer=tok, video_processor=Qwen3VLVideoProcessor(),
                            chat_template=CHAT_TEMPLATE)


def twin(work, tok):
    """The twin saved with its vision tokens' ids set to the tokenizer's, its vocabulary grown to hold them."""
    from real_clients import twin_dir
    from transformers import AutoModelForImageTextToText

    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image_pad|>"),
                                                         ("video_token_id", "<|video_pad|>"),
                                                         ("vision_start_token_id", "<|vision_start|>"),
                                                         ("vision_end_token_id", "<|vision_end|>"))}
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(twin_dir(TWIN, work, **ids))
    model.resize_token_embeddings(len(tok))
    return model


def trainer_of(work, kind, per_row=1, side=SIDE, ckpt=True, *, batch=2, steps=3):
    """An SFTTrainer on the twin: ``kind`` "full", "lora-text" (peft's LoRA on the text model's q/v) or "lora-all"
    (``target_modules="all-linear"``: the tower's and mergers' too)."""
    from trl import SFTConfig, SFTTrainer

    proc = processor()
    model = twin(work, proc.tokenizer)
    args = SFTConfig(output_dir=os.path.join(work, f"qwen3-vl-{kind}"), use_cpu=True, max_steps=steps,
                     per_device_train_batch_size=batch, max_length=None, gradient_checkpointing=ckpt,
                     report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    return SFTTrainer(model=model, args=args, train_dataset=dataset(per_row=per_row, side=side),
                      processing_class=proc, peft_config=peft_config(kind))


def sft_label_of(kind, per_row, side, ckpt):
    return f"Qwen3-VL SFTTrainer {kind} {per_row}x{side}px{'' if ckpt else ' no-ckpt'}"


def client_sft_qwen3_vl(work, kind, per_row=1, side=SIDE, ckpt=True):
    from kit.estimate import estimate_trainer

    trainer = trainer_of(work, kind, per_row, side, ckpt)
    how = {"full": "full FT", "lora-text": "LoRA r8 on the text model's q/v",
           "lora-all": "LoRA r8 all-linear (tower, mergers, text)"}[kind]
    setup = (f"tiny-qwen3-vl, {how}, SFTConfig defaults (bf16 autocast, fused LM head{', ckpt' if ckpt else ''}"
             f"{'' if ckpt else '; ckpt off'}), B2, {per_row} image(s) a row of {side} px ({(side // PATCH) ** 2} "
             "patches, merged 2 x 2)")
    yield sft_label_of(kind, per_row, side, ckpt), setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
