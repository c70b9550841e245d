"""Qwen2.5-VL (``tiny-qwen2-5-vl``: a 2-layer tower of 14-pixel patches, one windowed-attention layer and one full,
merged 2 x 2, beside tiny-qwen2's 2-layer text model; ``Qwen/Qwen2.5-VL-3B-Instruct``'s config) on the CPU: the
forward's replay (tower, merger, merge and the text blocks) against ``torch.autograd.graph.saved_tensors_hooks``; a
whole training step against the profiler meter, in two ways: a plain ``Trainer`` on batches made by hand as the
processor makes them (here, in the project's venv), and TRL's SFTTrainer on image + text messages with the real
processor, which needs torchvision and so runs in the benchmark-only environment ``benchmarks/vl_env.sh`` builds
(skipped loudly elsewhere); the image options, the real config, ``kit fit``, and what stays refused.
"""
import importlib.util
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

from kit.estimate import estimate
from kit.estimate.replay import BF16, FP32, Setup, lookup, qwen2_5_vl
from kit.inputs import InputError
from kit.measure.tensor_peak import saved_tensor_bytes
from kit.model_configs import get_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import clients_qwen2_5_vl as clients  # noqa: E402
import real_clients as rc  # noqa: E402
from fit_answer import fit_answer  # noqa: E402

BAND = rc.BAND
TWIN, REAL = "tiny-qwen2-5-vl", "Qwen/Qwen2.5-VL-3B-Instruct"
QV = {"self_attn.q_proj": 8, "self_attn.v_proj": 8}
TEXT_QV, EVERY_QV = clients.TEXT_QV, ["q_proj", "v_proj", "qkv"]
# label -> (images a sample, their side, weights' dtype, peft's target_modules or None, gradient checkpointing on)
CASES = {
    "full FT, one 112-px image a sample": (1, 112, torch.float32, None, False),
    "full FT, two 224-px images a sample (4 windows each)": (2, 224, torch.float32, None, False),
    "full FT, bf16 weights": (1, 224, torch.bfloat16, None, False),
    "full FT, bf16 autocast (fp32 weights)": (1, 224, "autocast", None, False),
    "LoRA r8 on q/v and the tower's qkv, bf16 autocast": (1, 224, "autocast", EVERY_QV, False),
    "LoRA r8 on the text model's q/v": (1, 224, torch.float32, TEXT_QV, False),
    "LoRA r8 on q/v and the tower's qkv": (1, 224, torch.float32, EVERY_QV, False),
    "full FT, checkpointing": (1, 224, torch.float32, None, True),
    "LoRA r8 on the text model's q/v, checkpointing": (1, 224, torch.float32, TEXT_QV, True),
    "LoRA r8 on q/v and the tower's qkv, checkpointing": (1, 224, torch.float32, EVERY_QV, True),
}
B = 2


def _batch(cfg, per_sample: int, side: int) -> dict:
    """A batch as Qwen2_5_VLProcessor makes it (benchmarks/clients_qwen2_5_vl.Batches' rows, collated)."""
    rows = clients.Batches(cfg, n=B, per_row=per_sample, side=side)
    return clients.collate([rows[i] for i in range(B)])


def _text_setup(cfg, S, dtype, lora: bool, ckpt: bool) -> Setup:
    """The text model's Setup ("autocast": fp32 weights under CPU bf16 autocast); with checkpointing and LoRA, peft
    has called ``enable_input_require_grads``."""
    t = cfg.text_config
    w = BF16 if dtype == torch.bfloat16 else FP32
    return Setup(family="qwen2_5_vl", B=B, S=S, H=t.hidden_size, F=t.intermediate_size, nh=t.num_attention_heads,
                 kvh=t.num_key_value_heads, hd=t.hidden_size // t.num_attention_heads, V=t.vocab_size,
                 L=t.num_hidden_layers, w=w, w_other=w, device="cpu", padded=False, base_trainable=not lora,
                 lora=QV if lora else {}, ckpt=ckpt, input_grad=lora and ckpt,
                 ac=BF16 if dtype == "autocast" else None)


@pytest.mark.parametrize("label", list(CASES))
def test_the_forward_replay_matches_autograd_saved_tensors(label):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    per_sample, side, dtype, targets, ckpt = CASES[label]
    cfg = get_config(TWIN)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(
        cfg, attn_implementation="sdpa", dtype=torch.float32 if dtype == "autocast" else dtype).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if targets:   # (peft, on a checkpointed model, hooks every input embedding: the tower's patch_embed too)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, lora_dropout=0.0))
    batch = _batch(cfg, per_sample, side)
    S = batch["input_ids"].shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "autocast"):
        measured = saved_tensor_bytes(model, batch)
    parts = qwen2_5_vl.forward_saved(cfg, _text_setup(cfg, S, dtype, bool(targets), ckpt), B * per_sample, side,
                                     vision_trains=not targets,
                                     vision_lora={"attn.qkv": 8} if targets == EVERY_QV else {},
                                     connector_trains=not targets)
    # checkpointing keeps the rotary cos/sin alive for the recompute, saved by no op: the tower's ((patches, hd)
    # fp32 each) and the text's (M-RoPE: (B, S, hd) each, in the embeddings' dtype)
    vc, t = cfg.vision_config, cfg.text_config
    patches = B * per_sample * (side // 14) ** 2
    kept = (2 * patches * (vc.hidden_size // vc.num_heads) * 4
            + 2 * B * S * (t.hidden_size // t.num_attention_heads) * 4) if ckpt else 0
    # and 4 bytes apart: the loss's 0-d count of the tokens it averages, which the replay leaves out (as Llama's)
    assert sum(parts.values()) - kept == measured - 4, (parts, measured)
    assert (parts["vision"] > 0) == (not targets or targets == EVERY_QV or ckpt)


# (kind, images a row, their side, checkpointing): a plain Trainer (fp32, AdamW) on batches made by hand
PLAIN = (("full", 1, 224, False), ("lora-text", 1, 224, False), ("lora-all", 2, 224, False),
         ("full", 2, 224, True), ("lora-text", 1, 224, True),
         ("qlora-text", 1, 224, True), ("qlora-all", 1, 224, False))   # (4-bit, bf16 autocast)


@pytest.mark.parametrize("kind,per_row,side,ckpt", PLAIN)
def test_a_training_step_without_a_processor_within_2_percent(tmp_path, kind, per_row, side, ckpt):
    """The model's whole step (a transformers Trainer on the processor's batches made by hand: pixel_values,
    image_grid_thw, mm_token_type_ids), estimated by estimate_trainer from the collated batch, against the profiler
    meter at step 1 and the steady step."""
    from kit.estimate import estimate_trainer

    trainer = clients.plain_trainer_of(str(tmp_path), kind, per_row, side, ckpt)

    def client():
        yield "plain", kind, trainer, lambda: estimate_trainer(trainer, device="cpu")

    _, _, est, peaks = rc.run_trainer_client(client(), rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    assert est.setup["images"] == (per_row, side) and est.sources["image_size"][0] == side
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{kind} {per_row}x{side}px ckpt {ckpt}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert all(BAND[0] <= r <= BAND[1] for r in (first, steady)), (first, steady, peaks)


def _skip_loudly(why: str):
    line = f"WARNING: Qwen2.5-VL's SFTTrainer rows did NOT run here: {why}"
    print(line, file=sys.stderr, flush=True)
    warnings.warn(line)
    pytest.skip(line)


@pytest.mark.parametrize("kind,per_row,side,ckpt", clients.ROWS_RUN)
def test_i48_qwen2_5_vl_sft_trainer_on_image_messages_within_2_percent(tmp_path, kind, per_row, side, ckpt):
    """TRL's SFTTrainer on image + text messages with Qwen2.5-VL's processor (its VLM collator), full fine-tuning,
    LoRA on the text model's q/v alone and LoRA all-linear, with and without checkpointing: step 1 and the steady
    step against the profiler meter, at the batch the collator really drew (read by estimate_trainer). The processor
    needs torchvision: this runs in the benchmark-only environment (benchmarks/vl_env.sh)."""
    if importlib.util.find_spec("torchvision") is None:
        _skip_loudly("Qwen2_5_VLProcessor needs torchvision, which the project's venv leaves out; "
                     "benchmarks/vl_env.sh runs them in a side venv")
    _, setup, est, peaks = rc.run_trainer_client(clients.client_qwen2_5_vl(str(tmp_path), kind, per_row, side, ckpt),
                                                 rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    assert est.setup["images"] == (per_row, side) and est.kind == "sft"
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert all(BAND[0] <= r <= BAND[1] for r in (first, steady)), (first, steady, peaks)


def test_i48_the_benchmark_only_environment_runs_the_sft_trainer_rows():
    """Where the side venv is built (KIT_VL_VENV, default .venv-vl: benchmarks/vl_env.sh builds it), the SFTTrainer
    tests above run in it and pass; elsewhere this skips, saying why."""
    venv = pathlib.Path(os.environ.get("KIT_VL_VENV", ROOT / ".venv-vl"))
    python = venv / "bin" / "python"
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("this venv has torchvision: the SFTTrainer tests run here directly")
    if not python.exists():
        _skip_loudly(f"no benchmark-only venv at {venv} (build it and run the rows with benchmarks/vl_env.sh)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([str(python), "-m", "pytest", str(pathlib.Path(__file__)), "-k", "sft_trainer_on_image", "-q",
                          "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    tail = run.stdout[-2000:] + run.stderr[-1000:]
    assert run.returncode == 0 and f"{len(clients.ROWS_RUN)} passed" in run.stdout and "skipped" not in run.stdout, tail


def test_the_family_and_the_real_config_build_to_their_parameter_counts():
    assert lookup("qwen2_5_vl").name == "qwen2_5_vl" and lookup("qwen2_5_vl").images is not None
    cfg = get_config(REAL)
    vc = cfg.vision_config
    # the config.json as published (https://github.com/whaler404/Hf-Learn, commit
    # 52e20dfe9aaeeab0a40a976a63a36dd695d2b51e, transfomers_learn/api/models/multimodal_models/qwen2.5_vl/qwen2.5_vl.md)
    assert (cfg.model_type, vc.depth, vc.hidden_size, vc.intermediate_size, vc.num_heads, vc.out_hidden_size,
            list(vc.fullatt_block_indexes), vc.window_size) == ("qwen2_5_vl", 32, 1280, 3420, 16, 2048,
                                                                  [7, 15, 23, 31], 112)
    t = cfg.text_config
    assert (t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
            t.vocab_size, cfg.tie_word_embeddings) == (2048, 11008, 36, 16, 2, 151936, True)
    assert t.rope_parameters["mrope_section"] == [16, 24, 24]
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == 3_754_622_976   # the Hub's "3.75B params"


def test_the_image_tokens_come_from_the_image_processors_arithmetic():
    """images_per_row and image_size are TrainingSetup's: a square image is resized as Qwen2VLImageProcessorPil
    does (smart_resize to multiples of 28 pixels within its min/max pixels) and takes (side / 28)^2 tokens; the
    defaults and the arithmetic are said in notes; image_splitting=False and a seq_len that cannot hold the image
    tokens are refused."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

    cfg = get_config(REAL)
    low, high = Qwen2VLImageProcessorPil.size["shortest_edge"], Qwen2VLImageProcessorPil.size["longest_edge"]
    for size in (100, 448, 500, 2000):
        side = smart_resize(size, size, factor=28, min_pixels=low, max_pixels=high)[0]
        assert qwen2_5_vl.tower_rows(cfg, 2, size, True) == (2, side, size, 2 * (side // 28) ** 2)
    est = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, images_per_row=2, image_size=500)
    assert est.setup["images"] == (2, 504)
    assumed = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16)
    assert assumed.setup["images"] == (1, qwen2_5_vl.DEFAULT_SIDE)
    said = " / ".join(assumed.notes)
    assert "1 image a row assumed" in said and "image tokens computed from the image processor's config" in said
    with pytest.raises(InputError, match="splits no image"):
        estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, image_splitting=False)
    side = smart_resize(1000, 1000, factor=28, min_pixels=low, max_pixels=high)[0]   # 980: over max_pixels
    with pytest.raises(InputError, match=f"cannot hold the row's {(side // 28) ** 2} image tokens") as refused:
        estimate(REAL, batch_size=1, seq_len=1024, lora_r=16, image_size=1000)
    assert "\n" not in str(refused.value)


def test_the_vision_tower_is_its_own_part_of_weights_grads_and_optimizer_state():
    """The tower and merger are the "vision" part: trained in a full fine-tune, frozen under LoRA on the text model
    alone, adapted under all-linear."""
    from transformers import AutoModelForImageTextToText

    cfg = get_config(TWIN)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in n)
    kw = dict(batch_size=2, seq_len=128, device="cpu", image_size=224, optimizer="adamw")
    full = estimate(TWIN, **kw)
    text = estimate(TWIN, lora_r=8, lora_targets=TEXT_QV, **kw)
    both = estimate(TWIN, lora_r=8, lora_targets="all-linear", **kw)
    assert full.gradients_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert full.optimizer_bytes == 2 * full.gradients_bytes
    assert text.trainable_params < both.trainable_params < full.trainable_params - vision
    assert full.params == text.params - text.trainable_params


def test_what_stays_unmodelled_is_refused_in_one_sentence():
    for option in (dict(quantization="8bit"), dict(use_dora=True)):
        with pytest.raises(InputError) as refused:
            estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, **option)
        said = str(refused.value)
        assert "vision-language model" in said and "kit.watch" in said and "\n" not in said
    with pytest.raises(InputError, match="not yet on videos") as refused:
        qwen2_5_vl.from_batch(get_config(TWIN), clients.image_processor(),
                              {"pixel_values_videos": torch.zeros(1), "input_ids": torch.zeros(1, 4)})
    assert "\n" not in str(refused.value)


def test_fit_answers_qwen2_5_vl_3b_in_five_lines_with_the_image_token_note(capsys):
    """`python -m kit fit --model Qwen/Qwen2.5-VL-3B-Instruct --lora-r 16 --batch-size 2 --seq-len 1024
    --device colab-t4`: a verdict, its cause and the best change in at most 5 lines (a wrapped line counted with its
    own); --details says where the image tokens come from."""
    from kit.cli import main

    given = ["fit", "--model", REAL, "--lora-r", "16", "--batch-size", "2", "--seq-len", "1024", "--device",
             "colab-t4"]
    main(given)
    said, answer = fit_answer(capsys.readouterr().out)
    assert said[0].startswith(("fits Colab T4", "DOES NOT FIT Colab T4")) and len(answer) <= 5, said
    assert said[-1].startswith("details: --details")
    main(given + ["--details"])
    details = capsys.readouterr().out
    assert "image tokens computed from the image processor's config" in details, details
