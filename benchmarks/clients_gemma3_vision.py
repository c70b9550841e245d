"""Gemma 3 multimodal (``Gemma3ForConditionalGeneration``) fine-tuned with TRL's ``SFTTrainer`` on image + text
messages (issue 48), as TRL's VLM SFT docs write it: a dataset of ``images`` and ``messages`` (a user turn of an image
and a question, an assistant turn of text), ``SFTConfig(max_length=None)``, the model's processor as
``processing_class`` (TRL collates with its ``DataCollatorForVisionLanguageModeling``: the processor's chat template,
each image resized to the tower's side, ``token_type_ids`` marking the image tokens); full fine-tuning, LoRA on the
text model's q/v alone, or LoRA on every linear layer (the vision tower's too), with and without gradient
checkpointing. The twin is ``kit/configs/tiny-gemma3-vision.json``; its processor is built offline as
google/gemma-3-4b-it's is: ``Gemma3Processor`` with the PIL image processor (``Gemma3ImageProcessorPil``: the fast
one needs torchvision), the kit's shipped tokenizer with Gemma's three image tokens (begin of image, image soft token,
end of image: ids 4096-4098, as the twin's config says) and a chat template of Gemma's form. fp32 on the CPU, as the
tests run it."""
from __future__ import annotations

import os

import torch

# Gemma 3's chat template's form: "<bos><start_of_turn>user\n<start_of_image>question<end_of_turn>\n<start_of_turn>model
# \nanswer<end_of_turn>\n" (the processor expands each <start_of_image> into its image tokens)
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == "
                 "'assistant' else message['role']) + '\n' }}{% for item in message['content'] %}"
                 "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}{% elif item['type'] == 'text' %}"
                 "{{ item['text'] | trim }}{% endif %}{% endfor %}{{ '<end_of_turn>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
ROWS, SIDE = 16, 128   # rows of the dataset; each image's side in pixels before the processor's resize
TWIN = "tiny-gemma3-vision"
KINDS = ("full", "lora-text", "lora-all", "qlora-text", "qlora-all")
# the rows of benchmarks/real_clients.py: (kind, images a row, gradient checkpointing (SFTConfig's default) on, the
# tower's image size where another than the twin's); the last ones let the vision tower weigh more: 256-pixel images
# (1024 patches an image), all saved
ROWS_RUN = (("full", 1, True, None), ("lora-text", 1, True, None), ("lora-all", 1, True, None),
            ("full", 1, False, None), ("lora-text", 1, False, None), ("lora-all", 1, False, None),
            ("full", 2, False, None), ("full", 1, False, 256), ("lora-all", 1, False, 256),
            ("qlora-text", 1, True, None), ("qlora-all", 1, False, None))


def processor(tower=None):
    """The twin's processor: the kit's shipped tokenizer with Gemma's image tokens (named as Gemma's tokenizer
    names them: ``boi_token``, ``eoi_token``, ``image_token``), Gemma 3's PIL image processor resizing to the
    tower's ``image_size`` (``tower``: another side for the twin's tower; pan-and-scan off, its default),
    ``mm_tokens_per_image`` image tokens an image."""
    from kit import data
    from kit.model_configs import get_config
    from transformers import Gemma3Processor, PreTrainedTokenizerFast
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    cfg = get_config(TWIN)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(data.TOKENIZER_FILE), bos_token=data.EOS_TOKEN,
                                  eos_token=data.EOS_TOKEN, unk_token=data.EOS_TOKEN, pad_token=data.PAD_TOKEN,
                                  model_max_length=1024, extra_special_tokens=IMAGE_TOKENS)
    tok.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS.values())})
    assert (tok.boi_token_id, tok.eoi_token_id, tok.image_token_id) == (
        cfg.boi_token_index, cfg.eoi_token_index, cfg.image_token_index), "the twin's image token ids"
    side = tower or cfg.vision_config.image_size
    images = Gemma3ImageProcessorPil(size={"height": side, "width": side})
    return Gemma3Processor(image_processor=images, tokenizer=tok, image_seq_length=cfg.mm_tokens_per_image,
                           chat_template=CHAT_TEMPLATE)


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


def twin_path(work, tower=None) -> str:
    """The twin saved with save_pretrained (``tower``: its vision tower's ``image_size`` in pixels, where another
    than the twin's 64: more patches an image, pooled to the same 16 image tokens)."""
    from kit.models import build_model, get_config
    from real_clients import twin_dir

    if tower is None:
        return twin_dir(TWIN, work)
    path = os.path.join(work, f"{TWIN}-tower{tower}")
    if not os.path.isdir(path):
        cfg = get_config(TWIN)
        cfg.vision_config.image_size = tower
        torch.manual_seed(0)
        build_model(cfg).save_pretrained(path)
    return path


def trainer_of(work, kind, per_row=1, ckpt=True, *, tower=None, batch=2, steps=3, **config):
    """An SFTTrainer on the twin: ``kind`` "full", "lora-text" (peft's LoRA on the text model's q/v, as a regex of
    module names) or "lora-all" (``target_modules="all-linear"``: the vision tower's too); "qlora-text" and
    "qlora-all" load the twin in 4 bits first (bitsandbytes' NF4: every Linear of the tower and the text model a
    Linear4bit; the projector's Parameter stays a float); ``tower``: the tower's image size where another than the
    twin's (:func:`twin_path`); ``config``: more SFTConfig fields."""
    from peft import LoraConfig
    from real_clients import _bnb4
    from transformers import AutoModelForImageTextToText
    from trl import SFTConfig, SFTTrainer

    proc = processor(tower)
    path = twin_path(work, tower)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(
        path, **({"quantization_config": _bnb4()} if kind.startswith("qlora") else {}))
    peft = None if kind == "full" else LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=r".*language_model.*\.(q_proj|v_proj)"
        if kind.endswith("-text") else "all-linear")
    args = SFTConfig(output_dir=os.path.join(work, f"gemma3-{kind}"), use_cpu=True, max_steps=steps,
                     per_device_train_batch_size=batch, max_length=None, gradient_checkpointing=ckpt,
                     report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, **config)
    return SFTTrainer(model=model, args=args, train_dataset=dataset(per_row=per_row), processing_class=proc,
                      peft_config=peft)


def client_gemma3_vision(work, kind, per_row=1, ckpt=True, tower=None):
    from kit.estimate import estimate_trainer

    trainer = trainer_of(work, kind, per_row, ckpt, tower=tower)
    how = {"full": "full FT", "lora-text": "LoRA r8 on the text model's q/v",
           "lora-all": "LoRA r8 all-linear (text and vision tower)",
           "qlora-text": "4-bit NF4 QLoRA r8 on the text model's q/v",
           "qlora-all": "4-bit NF4 QLoRA r8 all-linear (text and vision tower)"}[kind]
    setup = (f"{TWIN}, {how}, SFTConfig defaults (bf16 autocast, fused LM head{', ckpt' if ckpt else ''}"
             f"{'' if ckpt else '; ckpt off'}), B2, {per_row} image(s) a row of {SIDE} px resized to {tower or 64} px"
             f"{' (the tower made for them)' if tower else ''}, 16 image tokens each")
    label = (f"Gemma3 SFTTrainer {kind} {per_row} image{'s' if per_row > 1 else ''}{'' if ckpt else ' no-ckpt'}"
             f"{f' tower {tower}px' if tower else ''}")
    yield label, setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
