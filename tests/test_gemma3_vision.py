"""Gemma 3 multimodal (``tiny-gemma3-vision``: a 2-layer SigLIP tower of 64-pixel images in 8-pixel patches, pooled to
16 image tokens, beside tiny-gemma3's 2-layer text model; ``google/gemma-3-4b-it``'s config) on the CPU: the forward's
replay (vision tower, projector, merge and Gemma 3's text blocks under the image tokens' masks) against what
``torch.autograd.graph.saved_tensors_hooks`` counts; a whole TRL SFTTrainer step on image + text messages against
the profiler meter (full fine-tuning, LoRA on the text model, LoRA on every linear layer, with and without gradient
checkpointing); the image options read from the trainer; the real config; ``kit fit`` on gemma-3-4b-it; what stays
refused.
"""
import json
import pathlib
import sys

import pytest
import torch

from kit.estimate import estimate
from kit.estimate.replay import BF16, FP32, Setup, gemma3_vision, lookup
from kit.inputs import InputError
from kit.measure.tensor_peak import saved_tensor_bytes
from kit.model_configs import CONFIG_DIR, get_config

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import clients_gemma3_vision  # noqa: E402
import real_clients as rc  # noqa: E402
from fit_answer import fit_answer  # noqa: E402

BAND = rc.BAND

TWIN, REAL = "tiny-gemma3-vision", "google/gemma-3-4b-it"
QV = {"self_attn.q_proj": 8, "self_attn.v_proj": 8}
TEXT_QV, EVERY_QV = r".*language_model.*\.(q_proj|v_proj)", ["q_proj", "v_proj"]
# label -> (images a row, weights' dtype, peft's target_modules or None, gradient checkpointing on, bf16 autocast on)
CASES = {
    "full FT, 1 image a row": (1, torch.float32, None, False, False),
    "full FT, 2 images a row": (2, torch.float32, None, False, False),
    "full FT, bf16 weights": (1, torch.bfloat16, None, False, False),
    "LoRA r8 on the text model's q/v": (1, torch.float32, TEXT_QV, False, False),
    "LoRA r8 on every q/v (text and tower)": (2, torch.float32, EVERY_QV, False, False),
    "full FT, checkpointing": (2, torch.float32, None, True, False),
    "LoRA r8 on the text model's q/v, checkpointing": (1, torch.float32, TEXT_QV, True, False),
    "LoRA r8 on every q/v, checkpointing": (2, torch.float32, EVERY_QV, True, False),
    # (autocast: the one kv head's key, expanded by repeat_kv to every head under the mask, is cast whole)
    "full FT, bf16 autocast": (1, torch.float32, None, False, True),
    "LoRA r8 on every q/v, bf16 autocast": (2, torch.float32, EVERY_QV, False, True),
    "full FT, bf16 autocast, checkpointing": (1, torch.float32, None, True, True),
}
B, S = 2, 64


def _batch(cfg, per_row: int) -> dict:
    """A batch as Gemma 3's processor makes it: ``per_row`` images a row, each its begin-of-image token, 16 image
    tokens (``token_type_ids`` 1) and its end-of-image token; pixel values ``(images, 3, 64, 64)``."""
    torch.manual_seed(0)
    ids, types = torch.randint(2, 4000, (B, S)), torch.zeros(B, S, dtype=torch.long)
    tokens = cfg.mm_tokens_per_image
    for i in range(per_row):
        at = 4 + i * (tokens + 4)
        ids[:, at], ids[:, at + 1 + tokens] = cfg.boi_token_index, cfg.eoi_token_index
        ids[:, at + 1:at + 1 + tokens], types[:, at + 1:at + 1 + tokens] = cfg.image_token_index, 1
    side = cfg.vision_config.image_size
    return {"input_ids": ids, "attention_mask": torch.ones(B, S, dtype=torch.long), "token_type_ids": types,
            "pixel_values": torch.randn(B * per_row, 3, side, side), "labels": ids}


def _text_setup(cfg, dtype, lora: bool, ckpt: bool, autocast: bool = False) -> Setup:
    """The text model's Setup (its sliding window and two rotary sets, as the config reads them); with checkpointing
    and LoRA, peft has called ``enable_input_require_grads``."""
    t, w = cfg.text_config, FP32 if dtype == torch.float32 else BF16
    return Setup(family="gemma3", B=B, S=S, H=t.hidden_size, F=t.intermediate_size, nh=t.num_attention_heads,
                 kvh=t.num_key_value_heads, hd=t.head_dim, V=t.vocab_size, L=t.num_hidden_layers, w=w, w_other=w,
                 device="cpu", padded=False, base_trainable=not lora, lora=QV if lora else {}, ckpt=ckpt,
                 input_grad=lora and ckpt, window=t.sliding_window, sliding=1, first_sliding=True, rope_sets=2,
                 ac=BF16 if autocast else None)


@pytest.mark.parametrize("label", list(CASES))
def test_the_forward_replay_matches_autograd_saved_tensors(label):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    per_row, dtype, targets, ckpt, autocast = CASES[label]
    cfg = get_config(TWIN)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="sdpa", dtype=dtype).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if targets:   # (peft, on a checkpointed model, hooks every input embedding: the tower's patch embedding too)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, lora_dropout=0.0))
    batch = _batch(cfg, per_row)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        measured = saved_tensor_bytes(model, batch)
    parts = gemma3_vision.forward_saved(cfg, _text_setup(cfg, dtype, bool(targets), ckpt, autocast), B * per_row,
                                        vision_trains=not targets, vision_lora=QV if targets == EVERY_QV else {},
                                        projector_trains=not targets)
    t = cfg.text_config
    # checkpointing keeps, for the recompute, what no op saves: the rotary cos/sin ((S, hd) fp32, a pair for each
    # of the two layer types) and the two (B, 1, S, S) bool masks; the replay counts them, the hooks cannot
    kept = (2 * 2 * S * t.head_dim * 4 + 2 * B * S * S) if ckpt else 0
    # what the hooks count and the step counts elsewhere: the batch's own pixel values where the trained patch
    # embedding's Conv2d keeps them (fp32 weights, no autocast: no copy), the position_ids buffer its position
    # embedding keeps, the embedding scale buffer (0-d, in the weights' dtype) and the loss's 0-d token count
    trains = not targets
    pixels = batch["pixel_values"].nbytes if trains and dtype == torch.float32 and not autocast else 0
    buffers = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2 * 8 if trains else 0
    scale = (4 if dtype == torch.float32 else 2) if trains else 0
    assert sum(parts.values()) - kept + pixels + buffers + scale == measured - 4, (parts, measured)
    assert (parts["vision"] > 0) == (trains or targets == EVERY_QV or ckpt)


def test_the_vision_tower_and_projector_alone_match_autograd():
    """The vision part by itself: ``get_image_features`` (tower, post-LayerNorm, pooling, soft-embedding norm,
    projection) run alone saves what the replay's vision part says, 3 images (with the pixels the Conv2d keeps and
    the position_ids buffer)."""
    from transformers import AutoModelForImageTextToText

    cfg = get_config(TWIN)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="sdpa").train()

    class Features(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, pixel_values):
            return self.inner.model.get_image_features(pixel_values).pooler_output

    side = cfg.vision_config.image_size
    pixels = torch.randn(3, 3, side, side)
    measured = saved_tensor_bytes(Features(), {"pixel_values": pixels})
    parts = gemma3_vision.forward_saved(cfg, _text_setup(cfg, torch.float32, False, False), 3, vision_trains=True,
                                        vision_lora={}, projector_trains=True)
    assert parts["vision"] + pixels.nbytes + (side // cfg.vision_config.patch_size) ** 2 * 8 == measured


def test_the_real_config_is_gemma_3_4b_its_and_the_families_are_told_apart():
    """google/gemma-3-4b-it's config.json as published (https://huggingface.co/google/gemma-3-4b-it): its fields
    pinned here, built to the model card's 4.3B parameters; model type gemma3 is the multimodal family, gemma3_text
    (Gemma-3 1B, and this model's text_config) the text family."""
    from transformers import AutoModelForImageTextToText

    shipped = json.loads((CONFIG_DIR / "gemma-3-4b-it.json").read_text())
    assert shipped["text_config"] == {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                      "sliding_window": 1024}
    assert shipped["vision_config"] == {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                                        "model_type": "siglip_vision_model", "num_attention_heads": 16,
                                        "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}
    assert {k: shipped[k] for k in ("boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image",
                                    "model_type")} == {"boi_token_index": 255999, "eoi_token_index": 256000,
                                                       "image_token_index": 262144, "mm_tokens_per_image": 256,
                                                       "model_type": "gemma3"}
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(get_config(REAL))
    assert sum(p.numel() for p in model.parameters()) == 4_300_079_472   # the model card's 4.3B
    assert lookup("gemma3").images is not None and lookup("gemma3_text").images is None
    assert lookup("gemma3_text") is not lookup("gemma3")
    text_only = estimate("google/gemma-3-1b-it", batch_size=1, seq_len=64)   # Gemma-3 1B reads as the text family
    assert "images" not in text_only.setup


@pytest.mark.parametrize("kind,per_row,ckpt,tower", clients_gemma3_vision.ROWS_RUN)
def test_i48_gemma3_sft_trainer_on_image_messages_within_2_percent(tmp_path, kind, per_row, ckpt, tower):
    """TRL's SFTTrainer on image + text messages (its VLM collator: Gemma 3's processor resizing each 128-pixel image
    to the tower's 64, 16 image tokens each between begin- and end-of-image tokens, token_type_ids), full
    fine-tuning, LoRA on the text model's q/v alone and LoRA on every linear layer (the tower's too), with and
    without gradient checkpointing, two images a row, and a tower of 256-pixel images (1024 patches an image) that
    weighs more: step 1 and the steady step against the profiler meter, at the batch the collator really drew (read
    by estimate_trainer)."""
    _, setup, est, peaks = rc.run_trainer_client(
        clients_gemma3_vision.client_gemma3_vision(str(tmp_path), kind, per_row, ckpt, tower), rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    assert est.setup["images"] == (per_row, tower or 64) and est.kind == "sft"
    assert est.sources["images_per_row"][0] == per_row and est.sources["image_splitting"][0] is False
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert all(BAND[0] <= r <= BAND[1] for r in (first, steady)), (first, steady, peaks)


def test_the_image_options_fit_gemma_3s_processor():
    """Every image is the tower's 896 pixels (the processor resizes it): images_per_row counts rows of 256 image
    tokens; another image_size is refused, naming the fixed one; pan-and-scan (image_splitting) crops no square
    image, so it changes nothing; a seq_len that cannot hold the image tokens is refused."""
    one = estimate(REAL, batch_size=1, seq_len=1024, lora_r=16, images_per_row=1)
    two = estimate(REAL, batch_size=1, seq_len=1024, lora_r=16, images_per_row=2, image_size=896)
    assert one.setup["images"] == (1, 896) and two.setup["images"] == (2, 896)
    assert two.peak_bytes > one.peak_bytes
    same = estimate(REAL, batch_size=1, seq_len=1024, lora_r=16, images_per_row=1, image_splitting=False)
    assert same.peak_bytes == one.peak_bytes
    with pytest.raises(InputError, match="resizes every image to its vision tower's 896 px") as refused:
        estimate(REAL, batch_size=1, seq_len=1024, lora_r=16, image_size=1536)
    assert refused.value.code == "image-size-fixed" and "\n" not in str(refused.value)
    with pytest.raises(InputError, match="cannot hold the row's 516 image tokens"):
        estimate(REAL, batch_size=1, seq_len=512, lora_r=16, images_per_row=2)


def test_the_vision_tower_is_its_own_part_of_weights_grads_and_optimizer_state():
    """The tower and projector are the "vision" part: trained in a full fine-tune, frozen under LoRA on the text
    model alone, adapted under all-linear (the projector's weight is a Parameter, no Linear: never adapted)."""
    from transformers import AutoModelForImageTextToText

    cfg = get_config(TWIN)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    vision = sum(p.numel() for n, p in model.named_parameters() if ".vision_tower." in n or "multi_modal" in n)
    kw = dict(batch_size=2, seq_len=128, device="cpu", optimizer="adamw")
    full = estimate(TWIN, **kw)
    text = estimate(TWIN, lora_r=8, lora_targets=TEXT_QV, **kw)
    both = estimate(TWIN, lora_r=8, lora_targets="all-linear", **kw)
    assert full.gradients_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert full.optimizer_bytes == 2 * full.gradients_bytes
    assert text.trainable_params < both.trainable_params < full.trainable_params - vision
    assert full.params == text.params - text.trainable_params


@pytest.mark.parametrize("option,said", [(dict(quantization="8bit"), "not yet with 8-bit layers"),
                                         (dict(use_dora=True), "not yet with DoRA"),
                                         (dict(gradient_checkpointing=True, ckpt_every_n_layers=2),
                                          "not yet with partial checkpointing"),
                                         (dict(liger_kernel=True), "Liger's kernels for gemma3_text are not modeled")])
def test_what_stays_unmodelled_is_refused_in_one_sentence(option, said):
    """8-bit layers, DoRA, partial checkpointing: the vision-language replay's refusal (the way forward:
    kit.watch); Liger: its module's own, before (no Liger patch of Gemma 3 is modelled)."""
    with pytest.raises(InputError) as refused:
        estimate(REAL, batch_size=1, seq_len=1024, lora_r=16, **option)
    text = str(refused.value)
    assert said in text and "\n" not in text
    assert "kit.watch" in text or "liger_kernel" in option


def test_fit_answers_gemma_3_4b_it_in_five_lines(capsys):
    """`python -m kit fit --model google/gemma-3-4b-it --lora-r 16 --batch-size 2 --seq-len 1024 --device
    colab-t4` (fit needs a seq_len): a verdict, its cause and the best change in at most 5 lines (a wrapped line
    counted with its own)."""
    from kit.cli import main

    main(["fit", "--model", REAL, "--lora-r", "16", "--batch-size", "2", "--seq-len", "1024", "--images-per-row",
          "1", "--device", "colab-t4"])
    said, answer = fit_answer(capsys.readouterr().out)
    assert said[0].startswith(("fits Colab T4", "DOES NOT FIT Colab T4")) and len(answer) <= 5, said
    assert said[-1].startswith("details: --details")


def test_a_config_whose_vision_part_the_replay_lacks_is_refused():
    """transformers' own default Gemma3Config: a SigLIP tower with its pooling head, and 14 patches a side that 256
    image tokens cannot pool evenly; each refused in one sentence, before any figure."""
    from transformers import Gemma3Config

    from kit.estimate.inventory import UnsupportedModel

    with pytest.raises(UnsupportedModel, match=r"pooling head \(vision_config.vision_use_head\)"):
        estimate(Gemma3Config(), batch_size=1, seq_len=512)
    headless = Gemma3Config()
    headless.vision_config.vision_use_head = False
    with pytest.raises(UnsupportedModel, match="pools 14 patches a side into 16 image tokens a side"):
        estimate(headless, batch_size=1, seq_len=512)


@pytest.mark.parametrize("autocast", [False, True])
def test_gemma_3_text_alone_with_a_padding_mask_matches_autograd_under_autocast(autocast):
    """The tape's rule the multimodal replay found, on the text family alone (tiny-gemma3, one kv head): with a mask,
    transformers' sdpa repeats the key and value to every head (an expand: a view, for one kv head), and autocast's
    cast of the fp32 key after its rotary embedding copies it whole; the replay says so, to the byte."""
    from transformers import AutoModelForCausalLM

    from kit.estimate.replay import replay

    cfg = get_config("tiny-gemma3")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()
    ids, mask = torch.randint(2, 4000, (B, S)), torch.ones(B, S, dtype=torch.long)
    mask[1, -5:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        measured = saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": mask, "labels": ids})
    setup = Setup(family="gemma3_text", B=B, S=S, H=cfg.hidden_size, F=cfg.intermediate_size,
                  nh=cfg.num_attention_heads, kvh=cfg.num_key_value_heads, hd=cfg.head_dim, V=cfg.vocab_size,
                  L=cfg.num_hidden_layers, w=FP32, w_other=FP32, device="cpu", padded=True, window=cfg.sliding_window,
                  sliding=1, first_sliding=True, rope_sets=2, ac=BF16 if autocast else None)
    # (less the embedding scale buffer and the loss's token count, 4 bytes each)
    assert replay(setup).saved_bytes() == measured - 8
