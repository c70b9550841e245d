"""SmolVLM / Idefics3 (``tiny-smolvlm``: a 2-layer SigLIP-style tower of 64-pixel images in 8-pixel patches, scale
factor 2, so 16 image tokens an image, beside tiny-llama's 2-layer text model; ``HuggingFaceTB/SmolVLM-Instruct``'s
config) on the CPU: the forward's replay (vision tower, connector, merge and Llama's text blocks) against what
``torch.autograd.graph.saved_tensors_hooks`` counts, and the estimate's refusal of a whole training step, which the
kit does not model yet (the vision tower's backward, the prefetched batch's pixel values).
"""
import pytest
import torch

from kit.estimate import estimate
from kit.estimate.inventory import UnsupportedModel
from kit.estimate.replay import BF16, FP32, Setup, lookup, smolvlm
from kit.measure.tensor_peak import saved_tensor_bytes
from kit.model_configs import get_config

TWIN, REAL = "tiny-smolvlm", "HuggingFaceTB/SmolVLM-Instruct"
QV = {"self_attn.q_proj": 8, "self_attn.v_proj": 8}
TEXT_QV, EVERY_QV = r".*text_model.*\.(q_proj|v_proj)", ["q_proj", "v_proj"]
# label -> (images a sample, a padding image in the second sample, weights' dtype, peft's target_modules or None,
# gradient checkpointing (TRL's SFTConfig's default) on)
CASES = {
    "full FT, 1 image a sample": (1, False, torch.float32, None, False),
    "full FT, 2 images a sample": (2, False, torch.float32, None, False),
    "full FT, 2 and 1 images (a padding image)": (2, True, torch.float32, None, False),
    "full FT, bf16 weights": (1, False, torch.bfloat16, None, False),
    "LoRA r8 on the text model's q/v": (1, False, torch.float32, TEXT_QV, False),
    "LoRA r8 on every q/v (both towers)": (2, False, torch.float32, EVERY_QV, False),
    "full FT, checkpointing": (2, True, torch.float32, None, True),
    "LoRA r8 on the text model's q/v, checkpointing": (1, False, torch.float32, TEXT_QV, True),
    "LoRA r8 on every q/v, checkpointing": (1, False, torch.float32, EVERY_QV, True),
}
B, S, SIDE = 2, 48, 64


def _batch(cfg, per_sample: int, padding_image: bool) -> tuple:
    """(the batch, the real images in it): ``per_sample`` images a row, 16 ``<image>`` tokens each; with
    ``padding_image`` the second row's last image is all zeros (the collator's padding) and its tokens are text."""
    torch.manual_seed(0)
    pixels = torch.randn(B, per_sample, 3, SIDE, SIDE)
    ids = torch.randint(2, 4000, (B, S))
    ids[:, 4:4 + 16 * per_sample] = cfg.image_token_id
    images = B * per_sample
    if padding_image:
        pixels[1, -1] = 0
        ids[1, 4 + 16 * (per_sample - 1):4 + 16 * per_sample] = 5
        images -= 1
    batch = {"input_ids": ids, "attention_mask": torch.ones(B, S, dtype=torch.long), "pixel_values": pixels,
             "labels": ids}
    return batch, images


def _text_setup(cfg, dtype, lora: bool, ckpt: bool) -> Setup:
    """The text model's Setup; with checkpointing and LoRA, peft has called ``enable_input_require_grads``."""
    t = cfg.text_config
    w = FP32 if dtype == torch.float32 else BF16
    return Setup(family="smolvlm", B=B, S=S, H=t.hidden_size, F=t.intermediate_size, nh=t.num_attention_heads,
                 kvh=t.num_key_value_heads, hd=t.hidden_size // t.num_attention_heads, V=t.vocab_size,
                 L=t.num_hidden_layers, w=w, w_other=w, device="cpu", padded=False, base_trainable=not lora,
                 lora=QV if lora else {}, ckpt=ckpt, input_grad=lora and ckpt)


@pytest.mark.parametrize("label", list(CASES))
def test_the_forward_replay_matches_autograd_saved_tensors(label):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    per_sample, padding_image, dtype, targets, ckpt = CASES[label]
    cfg = get_config(TWIN)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="sdpa", dtype=dtype).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if targets:   # (peft, on a checkpointed model, hooks every input embedding: the tower's too)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, lora_dropout=0.0))
    batch, images = _batch(cfg, per_sample, padding_image)
    measured = saved_tensor_bytes(model, batch)
    parts = smolvlm.forward_saved(cfg, _text_setup(cfg, dtype, bool(targets), ckpt), smolvlm.Images(images, SIDE),
                                  vision_trains=not targets, vision_lora=QV if targets == EVERY_QV else {},
                                  connector_trains=not targets)
    # checkpointing keeps the rotary cos/sin ((S, hd) fp32 each) for the recompute, alive but saved by no op
    kept = 2 * S * (cfg.text_config.hidden_size // cfg.text_config.num_attention_heads) * 4 if ckpt else 0
    # and 4 bytes apart: the loss's 0-d count of the tokens it averages, which the replay leaves out (as Llama's)
    assert sum(parts.values()) - kept == measured - 4, (parts, measured)
    assert (parts["vision"] > 0) == (not targets or targets == EVERY_QV or ckpt)


def test_the_vision_tower_and_connector_alone_match_autograd():
    """The vision part by itself: ``get_image_features`` (tower, post-LayerNorm, pixel shuffle, projection) run
    alone saves what the replay's vision part says, 3 images of 64 x 64 pixels."""
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

    measured = saved_tensor_bytes(Features(), {"pixel_values": torch.randn(1, 3, 3, SIDE, SIDE)})
    parts = smolvlm.forward_saved(cfg, _text_setup(cfg, torch.float32, False, False), smolvlm.Images(3, SIDE),
                                  vision_trains=True, vision_lora={}, connector_trains=True)
    assert parts["vision"] == measured


def test_the_families_and_the_real_config_build_to_their_parameter_counts():
    # SmolVLM's code is generated from Idefics3's: one family declares both model types
    assert lookup("smolvlm") is lookup("idefics3") and lookup("smolvlm").name == "smolvlm"
    cfg = get_config(REAL)
    assert (cfg.model_type, cfg.text_config.model_type, cfg.scale_factor) == ("idefics3", "llama", 3)
    vision = cfg.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2 // cfg.scale_factor ** 2
    assert tokens == 81   # the model card's image_seq_len: 384-pixel crops in 14-pixel patches, shuffled by 3
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 2.25   # the model card's 2.25B


@pytest.mark.parametrize("name", [TWIN, REAL])
def test_a_training_step_is_refused_in_one_sentence(name):
    with pytest.raises(UnsupportedModel) as refused:
        estimate(name, batch_size=2, seq_len=512, lora_r=16)
    said = str(refused.value)
    assert "vision-language model" in said and "vision tower's backward" in said and "kit.measure" in said
    assert "\n" not in said


def test_a_built_model_is_refused_the_same_way():
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(get_config(TWIN))
    with pytest.raises(UnsupportedModel, match="vision-language model"):
        estimate(model, batch_size=2, seq_len=64)


def test_fit_answers_smolvlm_instruct_with_the_refusal_in_at_most_three_lines(capsys):
    from kit.cli import main

    code = main(["fit", "--model", REAL, "--lora-r", "16", "--batch-size", "2", "--seq-len", "2048",
                 "--device", "colab-t4"])
    captured = capsys.readouterr()
    said = (captured.out + captured.err).strip().splitlines()
    assert code != 0 and 1 <= len(said) <= 3 and "vision-language model" in said[0], said
