"""SmolVLM / Idefics3 (``tiny-smolvlm``: a 2-layer SigLIP-style tower of 64-pixel images in 8-pixel patches, scale
factor 2, so 16 image tokens an image, beside tiny-llama's 2-layer text model; ``HuggingFaceTB/SmolVLM-Instruct``'s
config) on the CPU: the forward's replay (vision tower, connector, merge and Llama's text blocks) against what
``torch.autograd.graph.saved_tensors_hooks`` counts; a whole TRL SFTTrainer step on image + text messages against
the profiler meter (full fine-tuning, LoRA on the text model, LoRA on both towers); the image options, the vision
part, ``kit fit`` on SmolVLM-Instruct, and what stays refused.
"""
import pathlib
import sys

import pytest
import torch

from kit.estimate import estimate
from kit.inputs import InputError
from kit.estimate.replay import BF16, FP32, Setup, lookup, smolvlm
from kit.measure.tensor_peak import saved_tensor_bytes
from kit.model_configs import get_config

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import clients_smolvlm  # noqa: E402
import real_clients as rc  # noqa: E402
from fit_answer import fit_answer  # noqa: E402

BAND = rc.BAND

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


@pytest.mark.parametrize("kind", clients_smolvlm.KINDS)
def test_i48_smolvlm_sft_trainer_on_image_messages_within_2_percent(tmp_path, kind):
    """Refused before ("a vision-language model: ... not yet the vision tower's backward nor the pixel values of the
    batch the data loader fetches ahead"). TRL's SFTTrainer on image + text messages (its VLM collator, the
    processor splitting each 128-pixel image into 4 crops and a global view), full fine-tuning, LoRA on the text
    model's q/v alone and LoRA on every linear layer of both towers, each LoRA also as 4-bit QLoRA: step 1 and the
    steady step against the profiler meter, at the batch the collator really drew (read by estimate_trainer)."""
    _, setup, est, peaks = rc.run_trainer_client(clients_smolvlm.client_smolvlm(str(tmp_path), kind), rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    rows, crop = est.setup["images"]
    assert (rows, crop) == ((clients_smolvlm.SIDE // clients_smolvlm.CROP) ** 2 + 1, clients_smolvlm.CROP)
    assert est.sources["image_size"][0] == clients_smolvlm.SIDE and est.kind == "sft"
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert all(BAND[0] <= r <= BAND[1] for r in (first, steady)), (first, steady, peaks)


def test_the_images_are_declared_once_and_counted_from_the_processors_arithmetic():
    """images_per_row, image_size and image_splitting are TrainingSetup's: 1536-pixel images on SmolVLM-Instruct's
    384-pixel crops are 16 crops and a global view (17 rows of 81 image tokens each); unsplit, one row; the
    defaults are said in notes; a seq_len that cannot hold the image tokens is refused, naming them."""
    from kit.training_setup import FIELDS

    assert {"images_per_row", "image_size", "image_splitting"} <= set(FIELDS)
    est = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, images_per_row=1, image_size=1536)
    assert est.setup["images"] == (17, 384)
    assert estimate(REAL, batch_size=1, seq_len=256, lora_r=16, image_splitting=False).setup["images"] == (1, 384)
    assumed = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16)
    assert assumed.setup["images"] == (17, 384)
    assert {n.code for n in assumed.notes} >= {"images-assumed"}
    with pytest.raises(InputError, match="cannot hold the row's 1377 image tokens") as refused:
        estimate(REAL, batch_size=1, seq_len=512, lora_r=16, image_size=1536)
    assert "\n" not in str(refused.value)
    with pytest.raises(InputError, match="has no vision tower"):
        estimate("tiny-llama", batch_size=1, seq_len=64, images_per_row=2)


def test_the_vision_tower_is_its_own_part_of_weights_grads_and_optimizer_state():
    """The tower and connector are the "vision" part: trained in a full fine-tune (their grads and AdamW's two
    states counted with the rest), frozen under LoRA on the text model alone, adapted under all-linear."""
    from transformers import AutoModelForImageTextToText

    cfg = get_config(TWIN)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    vision = sum(p.numel() for n, p in model.named_parameters() if ".vision_model." in n or ".connector." in n)
    kw = dict(batch_size=2, seq_len=128, device="cpu", image_size=128, optimizer="adamw")
    full = estimate(TWIN, **kw)
    text = estimate(TWIN, lora_r=8, lora_targets=TEXT_QV, **kw)
    both = estimate(TWIN, lora_r=8, lora_targets="all-linear", **kw)
    assert full.gradients_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert full.optimizer_bytes == 2 * full.gradients_bytes
    assert text.trainable_params < both.trainable_params < full.trainable_params - vision
    assert full.params == text.params - text.trainable_params


def test_what_stays_unmodelled_is_refused_in_one_sentence():
    with pytest.raises(InputError) as refused:
        estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, quantization="8bit")
    said = str(refused.value)
    assert "vision-language model" in said and "8-bit layers" in said and "kit.watch" in said and "\n" not in said
    # 4-bit QLoRA is estimated: every Linear of both towers and the connector is bitsandbytes' Linear4bit
    qlora = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, quantization="4bit")
    assert qlora.weights_bytes < estimate(REAL, batch_size=1, seq_len=2048, lora_r=16).weights_bytes / 3


def test_fit_answers_smolvlm_instruct_in_five_lines(capsys):
    """`python -m kit fit --model HuggingFaceTB/SmolVLM-Instruct --lora-r 16 --batch-size 2 --device colab-t4`,
    with the image options the training setup declares (one 1536-pixel image a row, in 2048 tokens): a verdict, its
    cause and the best change in at most 5 lines (a wrapped line counted with its own)."""
    from kit.cli import main

    main(["fit", "--model", REAL, "--lora-r", "16", "--batch-size", "2", "--seq-len", "2048", "--images-per-row", "1",
          "--image-size", "1536", "--device", "colab-t4"])
    said, answer = fit_answer(capsys.readouterr().out)
    assert said[0].startswith(("fits Colab T4", "DOES NOT FIT Colab T4")) and len(answer) <= 5, said
    assert said[-1].startswith("details: --details")


def test_the_images_the_figures_assumed_are_said_beside_the_setup(capsys):
    """Without the image options, the figures rest on one image a row at the processor's size: `estimate` says so
    under its setup line, and `fit --details` among its notes (the answer stays within its 5 lines)."""
    from kit.cli import main

    given = ["--model", REAL, "--lora-r", "16", "--batch-size", "2", "--seq-len", "2048"]
    main(["estimate", *given, "--preset", "colab-t4"])
    brief = capsys.readouterr().out
    main(["fit", *given, "--device", "colab-t4", "--details"])
    details = capsys.readouterr().out
    for said in (brief, details):
        assert "1 image a row assumed" in said and "images of 1536 px a side assumed" in said, said
    main(["fit", *given, "--images-per-row", "1", "--image-size", "1536", "--device", "colab-t4", "--details"])
    assert "assumed" not in capsys.readouterr().out
