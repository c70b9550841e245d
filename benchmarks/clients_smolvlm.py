"""SmolVLM (Idefics3) fine-tuned with TRL's ``SFTTrainer`` on image + text messages (issue 48), as TRL's VLM SFT
docs write it: a dataset of ``images`` and ``messages`` (a user turn of an image and a question, an assistant turn of
text), ``SFTConfig(max_length=None)``, the model's processor as ``processing_class`` (TRL collates with its
``DataCollatorForVisionLanguageModeling``: the processor's chat template, the images split into crops); full
fine-tuning, LoRA on the text model's q/v alone, or LoRA on every linear layer (both towers). The twin is
``kit/configs/tiny-smolvlm.json`` with the tokenizer's four image tokens added (its vocabulary grown to hold them),
its processor built offline as SmolVLM-Instruct's is (``Idefics3Processor``, which needs no ``num2words``): its image
processor (``size`` / ``max_image_size`` longest edges, image splitting)
and a chat template in SmolVLM's form. fp32 on the CPU, as the tests run it."""
from __future__ import annotations

import os

import torch

# SmolVLM-Instruct's chat template's form: "User:<image>question<end_of_utterance>\nAssistant: answer<end_of_utterance>"
CHAT_TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
                 "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
                 "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
                 "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
                 "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
ROWS, SIDE, CROP = 16, 128, 64     # rows of the dataset; each image's side in pixels; the tower's crop (its image_size)
KINDS = ("full", "lora-text", "lora-all", "qlora-text", "qlora-all")
# the rows of benchmarks/real_clients.py: (kind, images a row, their side, gradient checkpointing (SFTConfig's
# default) on); the 256-pixel ones let the vision tower weigh more: a 256-pixel image a row (17 rows), all saved
ROWS_RUN = (("full", 1, SIDE, True), ("lora-text", 1, SIDE, True), ("lora-all", 1, SIDE, True),
            ("full", 1, 256, False), ("lora-all", 1, 256, False),
            ("qlora-text", 1, SIDE, True), ("qlora-all", 1, SIDE, True), ("qlora-all", 1, 256, False))
HOW = {"full": "full FT", "lora-text": "LoRA r8 on the text model's q/v",
       "lora-all": "LoRA r8 all-linear (both towers)", "qlora-text": "4-bit NF4 QLoRA r8 on the text model's q/v",
       "qlora-all": "4-bit NF4 QLoRA r8 all-linear (both towers)"}


def processor(side=SIDE):
    """The twin's processor: the kit's tokenizer with SmolVLM's image tokens, SmolVLM's image processor (images
    resized to ``side`` on their longest edge, split into ``CROP``-pixel crops plus a global view)."""
    from kit import data
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok = data.shipped_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    images = Idefics3ImageProcessorPil(size={"longest_edge": side}, max_image_size={"longest_edge": CROP})
    return Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=(CROP // 8) ** 2 // 4,
                             chat_template=CHAT_TEMPLATE)


def dataset(n=ROWS, per_row=1, side=SIDE):
    """Rows of ``per_row`` RGB images (``side`` x ``side``, random pixels) and one exchange of messages, as TRL's
    VLM docs write them; every row the same length in tokens (one question, one answer), so every batch has one
    shape, unpadded."""
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


def trainer_of(work, kind, per_row=1, side=SIDE, ckpt=True, *, batch=2, steps=3):
    """An SFTTrainer on the twin: ``kind`` "full", "lora-text" (peft's LoRA on the text model's q/v, as a regex of
    module names) or "lora-all" (``target_modules="all-linear"``: the vision tower's too); "qlora-text" and
    "qlora-all" load the model in 4 bits first (bitsandbytes' NF4, double quantization, bf16 compute: every Linear
    of both towers and the connector becomes a Linear4bit), as TRL's VLM docs do for a GPU of Colab's size."""
    from peft import LoraConfig
    from real_clients import _bnb4, twin_dir
    from transformers import AutoModelForImageTextToText
    from trl import SFTConfig, SFTTrainer

    proc = processor(side)
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    path = twin_dir("tiny-smolvlm", work, image_token_id=image_id)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(
        path, **({"quantization_config": _bnb4()} if kind.startswith("qlora") else {}))
    model.resize_token_embeddings(len(proc.tokenizer))
    peft = None if kind == "full" else LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=r".*text_model.*\.(q_proj|v_proj)"
        if kind.endswith("-text") else "all-linear")
    args = SFTConfig(output_dir=os.path.join(work, f"smolvlm-{kind}"), use_cpu=True, max_steps=steps,
                     per_device_train_batch_size=batch, max_length=None, gradient_checkpointing=ckpt,
                     report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    return SFTTrainer(model=model, args=args, train_dataset=dataset(per_row=per_row, side=side), processing_class=proc,
                      peft_config=peft)


def client_smolvlm(work, kind, per_row=1, side=SIDE, ckpt=True):
    from kit.estimate import estimate_trainer

    trainer = trainer_of(work, kind, per_row, side, ckpt)
    setup = (f"tiny-smolvlm, {HOW[kind]}, SFTConfig defaults (bf16 autocast, fused LM head{', ckpt' if ckpt else ''}"
             f"{'' if ckpt else '; ckpt off'}), B2, {per_row} image(s) a row of {side} px split into {CROP} px crops "
             "and a global view")
    label = f"SmolVLM SFTTrainer {kind} {per_row}x{side}px{'' if ckpt else ' no-ckpt'}"
    yield label, setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
