"""Qwen2.5-VL fine-tuned with TRL's ``SFTTrainer`` on image + text messages (issue 48), as TRL's VLM SFT docs write it:
a dataset of ``images`` and ``messages``, ``SFTConfig(max_length=None)``, the model's processor as
``processing_class`` (TRL collates with its ``DataCollatorForVisionLanguageModeling``: the processor's chat template,
each image resized to multiples of 28 pixels and cut into 14-pixel patches); full fine-tuning, LoRA on the text
model's q/v alone, or LoRA on every linear layer (the vision tower's and merger's too). The twin is
``kit/configs/tiny-qwen2-5-vl.json`` with the tokenizer's vision tokens added (its vocabulary grown to hold them), its
processor built offline as Qwen2.5-VL-3B-Instruct's is (``Qwen2_5_VLProcessor``: ``Qwen2VLImageProcessorPil``, the
kit's tokenizer with Qwen's vision tokens, a chat template in Qwen's form). fp32 weights on the CPU.

Qwen2.5-VL's processor needs torchvision (its video processor), which the project's install leaves out: these rows
run in the benchmark-only environment ``benchmarks/vl_env.sh`` builds. :func:`plain_trainer_of` is the same step
without a processor (a plain ``Trainer`` on batches made by hand as the processor makes them), which runs anywhere.
"""
from __future__ import annotations

import os

import torch

# Qwen2.5-VL-Instruct's chat template's form: "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>question
# <|im_end|>\n<|im_start|>assistant\nanswer<|im_end|>\n"
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
                 "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                 "{% for line in message['content'] %}{% if line['type'] == 'image' %}"
                 "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% elif line['type'] == 'text' %}"
                 "{{ line['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
VISION_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
ROWS, SIDE = 16, 224   # rows of the dataset; each image's side in pixels (16 x 16 patches, 64 image tokens)
KINDS = ("full", "lora-text", "lora-all")
TEXT_QV = r".*language_model.*\.(q_proj|v_proj)"
# the rows of benchmarks/vl_env.sh: (kind, images a row, their side, gradient checkpointing (SFTConfig's default)
# on); the last ones let the vision tower weigh more: a 448-pixel image a row (1024 patches), all saved
ROWS_RUN = (("full", 1, SIDE, True), ("lora-text", 1, SIDE, True), ("lora-all", 1, SIDE, True),
            ("full", 1, 448, False), ("lora-text", 1, 448, False), ("lora-all", 2, SIDE, False))


def image_processor(cls=None):
    """Qwen2.5-VL-3B-Instruct's image processor (14-pixel patches of 2 frames, merged 2 x 2; transformers' min/max
    pixels): ``cls`` (default ``Qwen2VLImageProcessorPil``, which needs no torchvision)."""
    if cls is None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as cls
    return cls(patch_size=14, temporal_patch_size=2, merge_size=2)


def processor():
    """The twin's processor (needs torchvision): the kit's tokenizer with Qwen's vision tokens, Qwen2.5-VL's image
    processor and its video processor, a chat template in Qwen's form."""
    from kit import data
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tok = data.shipped_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    return Qwen2_5_VLProcessor(image_processor=image_processor(), tokenizer=tok,
                               video_processor=Qwen2VLVideoProcessor(), chat_template=CHAT_TEMPLATE)


def dataset(n=ROWS, per_row=1, side=SIDE):
    """Rows of ``per_row`` RGB images (``side`` x ``side``, random pixels) and one exchange of messages, as TRL's
    VLM docs write them; every row the same length in tokens, so every batch has one shape, unpadded."""
    from datasets import Dataset
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        pics = [Image.fromarray(torch.randint(0, 256, (side, side, 3), generator=gen, dtype=torch.uint8).numpy())
                for _ in range(per_row)]
        content = [{"type": "image"} for _ in pics] + [{"type": "text", "text": "What is in this picture?"}]
        rows.append({"images": pics, "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [{"type": "text", "text": "A picture of noise."}]}]})
    return Dataset.from_list(rows)


def peft_config(kind):
    from peft import LoraConfig

    return None if kind == "full" else LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                  target_modules=TEXT_QV if kind.endswith("-text") else "all-linear")


def twin(work, tok):
    """The twin saved with its vision tokens' ids set to the tokenizer's, its vocabulary grown to hold them."""
    from real_clients import twin_dir
    from transformers import AutoModelForImageTextToText

    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image_pad|>"),
                                                         ("video_token_id", "<|video_pad|>"),
                                                         ("vision_start_token_id", "<|vision_start|>"),
                                                         ("vision_end_token_id", "<|vision_end|>"))}
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(twin_dir("tiny-qwen2-5-vl", work, **ids))
    model.resize_token_embeddings(len(tok))
    return model


def trainer_of(work, kind, per_row=1, side=SIDE, ckpt=True, *, batch=2, steps=3):
    """An SFTTrainer on the twin: ``kind`` "full", "lora-text" (peft's LoRA on the text model's q/v, as a regex of
    module names) or "lora-all" (``target_modules="all-linear"``: the vision tower's and merger's too)."""
    from trl import SFTConfig, SFTTrainer

    proc = processor()
    model = twin(work, proc.tokenizer)
    args = SFTConfig(output_dir=os.path.join(work, f"qwen2-5-vl-{kind}"), use_cpu=True, max_steps=steps,
                     per_device_train_batch_size=batch, max_length=None, gradient_checkpointing=ckpt,
                     report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    return SFTTrainer(model=model, args=args, train_dataset=dataset(per_row=per_row, side=side),
                      processing_class=proc, peft_config=peft_config(kind))


def label_of(kind, per_row, side, ckpt):
    return f"Qwen2.5-VL SFTTrainer {kind} {per_row}x{side}px{'' if ckpt else ' no-ckpt'}"


def client_qwen2_5_vl(work, kind, per_row=1, side=SIDE, ckpt=True):
    from kit.estimate import estimate_trainer

    trainer = trainer_of(work, kind, per_row, side, ckpt)
    how = {"full": "full FT", "lora-text": "LoRA r8 on the text model's q/v",
           "lora-all": "LoRA r8 all-linear (tower, merger, text)"}[kind]
    setup = (f"tiny-qwen2-5-vl, {how}, SFTConfig defaults (bf16 autocast, fused LM head{', ckpt' if ckpt else ''}"
             f"{'' if ckpt else '; ckpt off'}), B2, {per_row} image(s) a row of {side} px ({(side // 14) ** 2} "
             "patches, merged 2 x 2)")
    yield label_of(kind, per_row, side, ckpt), setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


# ---- the same step without a processor (no torchvision) --------------------------------------------------------
class Batches(torch.utils.data.Dataset):
    """Rows as ``Qwen2_5_VLProcessor`` makes them, by hand: ``pixel_values`` (patches, 1176) and ``image_grid_thw``
    (1, side / 14, side / 14) for each image, ``input_ids`` with ``(side / 28)^2`` image tokens an image between its
    vision start and end tokens, ``mm_token_type_ids`` 1 at the image tokens."""

    def __init__(self, cfg, n=ROWS, per_row=1, side=SIDE, text=40):
        grid = side // 14
        tokens = grid * grid // 4
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
                              "pixel_values": torch.randn(per_row * grid * grid, 1176, generator=gen),
                              "image_grid_thw": torch.tensor([[1, grid, grid]] * per_row)})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    """The processor's batch: ids stacked (every row one length), patches and grids concatenated."""
    ids = torch.stack([r["input_ids"] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(),
            "mm_token_type_ids": torch.stack([r["mm_token_type_ids"] for r in rows]),
            "pixel_values": torch.cat([r["pixel_values"] for r in rows]),
            "image_grid_thw": torch.cat([r["image_grid_thw"] for r in rows])}


class ImagesOnly:
    """A processing class that holds the image processor (what the kit reads of a processor), for a Trainer whose
    batches are made by hand."""

    def __init__(self):
        self.image_processor = image_processor()


def plain_trainer_of(work, kind, per_row=1, side=SIDE, ckpt=False, *, batch=2, steps=3):
    """A transformers ``Trainer`` on the twin (TrainingArguments' defaults: fp32, AdamW) over :class:`Batches`, with
    peft's LoRA as :func:`peft_config` says: the model's step without a processor. "qlora-text" and "qlora-all"
    load the twin in 4 bits (bitsandbytes' NF4, every Linear of the tower, merger and text model a Linear4bit),
    then peft's ``prepare_model_for_kbit_training`` and LoRA, under bf16 autocast, as peft's QLoRA recipe does."""
    from kit.models import build_model, get_config
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import Trainer, TrainingArguments

    cfg = get_config("tiny-qwen2-5-vl")
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
    args = TrainingArguments(output_dir=os.path.join(work, f"qwen2-5-vl-plain-{kind}"), use_cpu=True,
                             max_steps=steps, per_device_train_batch_size=batch, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False, bf16=quantized)
    return Trainer(model=model, args=args, train_dataset=Batches(cfg, per_row=per_row, side=side),
                   data_collator=collate, processing_class=ImagesOnly())


def four_bit(cfg, work):
    """The twin saved, then loaded in 4 bits (:func:`real_clients._bnb4`), as ``from_pretrained`` loads a QLoRA
    model."""
    from real_clients import _bnb4
    from transformers import AutoModelForImageTextToText

    folder = os.path.join(work, "tiny-qwen2-5-vl")
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(folder)
    return AutoModelForImageTextToText.from_pretrained(folder, quantization_config=_bnb4())
