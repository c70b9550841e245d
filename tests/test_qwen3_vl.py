"""Qwen3-VL (``tiny-qwen3-vl``: a 3-layer tower of 16-pixel patches, merged 2 x 2, deepstack mergers after its
layers 0 and 1, beside a 3-layer Qwen3 text model with interleaved M-RoPE; ``Qwen/Qwen3-VL-2B-Instruct``'s config)
on the CPU: the forward's replay (tower, mergers, merge, deepstack and the text blocks) against
``torch.autograd.graph.saved_tensors_hooks``; a whole training step against the profiler meter, in two ways: a plain
``Trainer`` on batches made by hand as the processor makes them (here, in the project's venv), and TRL's SFTTrainer on
image + text messages with the real processor, which needs torchvision and so runs in the benchmark-only environment
``benchmarks/vl_env.sh`` builds (skipped loudly elsewhere); the image options, the real config, ``kit fit``, and what
stays refused.
"""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

from kit.estimate import estimate
from kit.estimate.replay import BF16, FP32, Setup, lookup, qwen3_vl
from kit.inputs import InputError
from kit.measure.tensor_peak import saved_tensor_bytes
from kit.model_configs import get_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import clients_qwen3_vl as clients  # noqa: E402
import real_clients as rc  # noqa: E402

BAND = rc.BAND
TWIN, REAL = "tiny-qwen3-vl", "Qwen/Qwen3-VL-2B-Instruct"
QV = {"self_attn.q_proj": 8, "self_attn.v_proj": 8}
TEXT_QV, EVERY_QV = clients.TEXT_QV, ["q_proj", "v_proj", "qkv"]
# label -> (images a sample, their side, weights' dtype, peft's target_modules or None, gradient checkpointing on)
CASES = {
    "full FT, one 256-px image a sample": (1, 256, torch.float32, None, False),
    "full FT, two 256-px images a sample": (2, 256, torch.float32, None, False),
    "full FT, a 320-px image": (1, 320, torch.float32, None, False),
    "full FT, bf16 weights": (1, 256, torch.bfloat16, None, False),
    "full FT, bf16 autocast (fp32 weights)": (1, 256, "autocast", None, False),
    "LoRA r8 on q/v and the tower's qkv, bf16 autocast": (1, 256, "autocast", EVERY_QV, False),
    "LoRA r8 on the text model's q/v": (1, 256, torch.float32, TEXT_QV, False),
    "LoRA r8 on q/v and the tower's qkv": (1, 256, torch.float32, EVERY_QV, False),
    "full FT, checkpointing": (1, 256, torch.float32, None, True),
    "LoRA r8 on the text model's q/v, checkpointing": (1, 256, torch.float32, TEXT_QV, True),
    "LoRA r8 on q/v and the tower's qkv, checkpointing": (1, 256, torch.float32, EVERY_QV, True),
}
B = 2


def _batch(cfg, per_sample: int, side: int) -> dict:
    """A batch as Qwen3VLProcessor makes it (benchmarks/clients_qwen3_vl.Batches' rows, collated)."""
    rows = clients.Batches(cfg, n=B, per_row=per_sample, side=side)
    return clients.collate([rows[i] for i in range(B)])


def _text_setup(cfg, S, dtype, lora: bool, ckpt: bool) -> Setup:
    """The text model's Setup ("autocast": fp32 weights under CPU bf16 autocast); with checkpointing and LoRA, peft
    has called ``enable_input_require_grads`` (which hooks the text embeddings alone: the tower has no
    ``get_input_embeddings``)."""
    t = cfg.text_config
    w = BF16 if dtype == torch.bfloat16 else FP32
    return Setup(family="qwen3_vl", B=B, S=S, H=t.hidden_size, F=t.intermediate_size, nh=t.num_attention_heads,
                 kvh=t.num_key_value_heads, hd=t.head_dim, V=t.vocab_size, L=t.num_hidden_layers, w=w, w_other=w,
                 device="cpu", padded=False, base_trainable=not lora, lora=QV if lora else {}, ckpt=ckpt,
                 input_grad=lora and ckpt, ac=BF16 if dtype == "autocast" else None)


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
    if targets:
        model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, lora_dropout=0.0))
    batch = _batch(cfg, per_sample, side)
    S = batch["input_ids"].shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "autocast"):
        measured = saved_tensor_bytes(model, batch)
    parts = qwen3_vl.forward_saved(cfg, _text_setup(cfg, S, dtype, bool(targets), ckpt), B * per_sample, side,
                                   vision_trains=not targets,
                                   vision_lora={"attn.qkv": 8} if targets == EVERY_QV else {},
                                   connector_trains=not targets)
    vc, t = cfg.vision_config, cfg.text_config
    patches = B * per_sample * (side // 16) ** 2
    tower_grad = targets != TEXT_QV
    # checkpointing keeps the rotary cos/sin alive for the recompute, saved by no op: the tower's ((patches, hd)
    # fp32 each, where its blocks need a grad) and the text's ((B, S, hd) each, in the embeddings' dtype); and a
    # frozen tower's checkpointed blocks hand their inputs to the saved-tensor hooks (torch.utils.checkpoint's
    # frame.save_inputs) though no graph keeps them
    kept = (2 * patches * (vc.hidden_size // vc.num_heads) * 4 * tower_grad + 2 * B * S * t.head_dim * 4
            - (not tower_grad) * vc.depth * patches * vc.hidden_size * 4) if ckpt else 0
    # and 4 bytes apart: the loss's 0-d count of the tokens it averages, which the replay leaves out (as Llama's)
    assert sum(parts.values()) - kept == measured - 4, (parts, measured)
    assert (parts["vision"] > 0) == tower_grad


@pytest.mark.parametrize("kind,per_row,side,ckpt", clients.PLAIN)
def test_a_training_step_without_a_processor_within_2_percent(tmp_path, kind, per_row, side, ckpt):
    """The model's whole step (a transformers Trainer on the processor's batches made by hand: pixel_values,
    image_grid_thw, mm_token_type_ids), estimated by estimate_trainer from the collated batch, against the profiler
    meter at step 1 and the steady step."""
    _, _, est, peaks = rc.run_trainer_client(clients.client_qwen3_vl(str(tmp_path), kind, per_row, side, ckpt),
                                             rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    assert est.setup["images"] == (per_row, side) and est.sources["image_size"][0] == side
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{kind} {per_row}x{side}px ckpt {ckpt}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert all(BAND[0] <= r <= BAND[1] for r in (first, steady)), (first, steady, peaks)


def _skip_loudly(why: str):
    line = f"WARNING: Qwen3-VL's SFTTrainer rows did NOT run here: {why}"
    print(line, file=sys.stderr, flush=True)
    warnings.warn(line)
    pytest.skip(line)


@pytest.mark.parametrize("kind,per_row,side,ckpt", clients.ROWS_RUN)
def test_i48_qwen3_vl_sft_trainer_on_image_messages_within_2_percent(tmp_path, kind, per_row, side, ckpt):
    """TRL's SFTTrainer on image + text messages with Qwen3-VL's processor (its VLM collator), full fine-tuning, LoRA
    on the text model's q/v alone and LoRA all-linear, with and without checkpointing: step 1 and the steady step
    against the profiler meter, at the batch the collator really drew (read by estimate_trainer). The processor needs
    torchvision: this runs in the benchmark-only environment (benchmarks/vl_env.sh)."""
    if importlib.util.find_spec("torchvision") is None:
        _skip_loudly("Qwen3VLProcessor needs torchvision, which the project's venv leaves out; "
                     "benchmarks/vl_env.sh runs them in a side venv")
    _, setup, est, peaks = rc.run_trainer_client(clients.client_sft_qwen3_vl(str(tmp_path), kind, per_row, side, ckpt),
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
    assert lookup("qwen3_vl").name == "qwen3_vl" and lookup("qwen3_vl").images is not None
    cfg = get_config(REAL)
    vc, t = cfg.vision_config, cfg.text_config
    # Qwen3-VL-2B's config as transformers 5.1.0 prints it, in https://github.com/xorbitsai/inference/issues/4592
    assert (cfg.model_type, vc.depth, vc.hidden_size, vc.intermediate_size, vc.num_heads, vc.out_hidden_size,
            list(vc.deepstack_visual_indexes), vc.patch_size, vc.num_position_embeddings) == (
        "qwen3_vl", 24, 1024, 4096, 16, 2048, [5, 11, 17], 16, 2304)
    assert (t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
            t.head_dim, t.vocab_size, cfg.tie_word_embeddings) == (2048, 6144, 28, 16, 8, 128, 151936, True)
    assert t.rope_parameters["mrope_section"] == [24, 20, 20] and t.rope_parameters["mrope_interleaved"]
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == 2_127_532_032   # the Hub's "2B params" (2.13B)


def test_the_image_tokens_come_from_the_image_processors_arithmetic():
    """images_per_row and image_size are TrainingSetup's: a square image is resized as Qwen3-VL's image processor
    does (smart_resize to multiples of 32 pixels within its size bounds, 65,536 to 16,777,216 pixels as
    https://github.com/QwenLM/Qwen3-VL/issues/1836 quotes its preprocessor_config.json) and takes (side / 32)^2
    tokens; image_splitting=False is refused; a collated batch gives its images, a side the processor would not
    make is refused."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    cfg = get_config(REAL)
    assert qwen3_vl.PIXELS == (65_536, 16_777_216)
    for size in (100, 448, 500, 5000):
        side = smart_resize(size, size, factor=32, min_pixels=65_536, max_pixels=16_777_216)[0]
        assert qwen3_vl.tower_rows(cfg, 2, size, True) == (2, side, size, 2 * (side // 32) ** 2)
    assert qwen3_vl.resized(cfg, 100) == 256   # under min_pixels: grown
    est = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, images_per_row=2, image_size=500)
    assert est.setup["images"] == (2, 512)
    assumed = estimate(REAL, batch_size=1, seq_len=2048, lora_r=16)
    assert assumed.setup["images"] == (1, qwen3_vl.DEFAULT_SIDE)
    said = " / ".join(assumed.notes)
    assert "1 image a row assumed" in said and "16 px patches merged 2 x 2" in said and "65,536" in said
    with pytest.raises(InputError, match="splits no image"):
        estimate(REAL, batch_size=1, seq_len=2048, lora_r=16, image_splitting=False)
    twin, images = get_config(TWIN), lookup("qwen3_vl").images
    options, _ = images.from_batch(twin, clients.image_processor(), _batch(twin, 2, 256))
    assert options == dict(images_per_row=2, image_size=256)
    with pytest.raises(InputError, match="pass images_per_row and image_size") as refused:
        images.from_batch(twin, clients.image_processor(), _batch(twin, 1, 224))   # (the processor makes 256)
    assert "\n" not in str(refused.value)


def test_the_vision_tower_is_its_own_part_of_weights_grads_and_optimizer_state():
    """The tower and mergers are the "vision" part: trained in a full fine-tune, frozen under LoRA on the text model
    alone, adapted under all-linear."""
    from transformers import AutoModelForImageTextToText

    cfg = get_config(TWIN)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in n)
    kw = dict(batch_size=2, seq_len=128, device="cpu", image_size=256, optimizer="adamw")
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
        lookup("qwen3_vl").images.from_batch(get_config(TWIN), clients.image_processor(),
                                             {"pixel_values_videos": torch.zeros(1), "input_ids": torch.zeros(1, 4)})
    assert "\n" not in str(refused.value)


def test_qwen3_vl_moe_is_refused_in_one_sentence():
    """The mixture-of-experts Qwen3-VL (model_type qwen3_vl_moe) is not this family: refused, saying the way on."""
    from transformers import Qwen3VLMoeConfig

    from kit.estimate.inventory import UnsupportedModel

    given = json.loads((ROOT / "kit" / "configs" / "tiny-qwen3-vl.json").read_text())
    given.pop("model_type")
    given["text_config"].update(model_type="qwen3_vl_moe_text", num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=64)
    given["vision_config"]["model_type"] = "qwen3_vl_moe"
    with pytest.raises(UnsupportedModel) as refused:
        estimate(Qwen3VLMoeConfig(**given), batch_size=1, seq_len=256, lora_r=8, device="cpu")
    said = str(refused.value)
    assert "qwen3_vl_moe" in said and "measure" in said and "\n" not in said


def test_fit_answers_qwen3_vl_2b_in_five_lines_with_the_image_token_note(capsys):
    """`python -m kit fit --model Qwen/Qwen3-VL-2B-Instruct --lora-r 16 --batch-size 2 --seq-len 1024
    --device colab-t4`: a verdict, its cause and the best change in at most 5 lines (a wrapped line counted with its
    own); --details says where the image tokens come from."""
    from kit.cli import main

    given = ["fit", "--model", REAL, "--lora-r", "16", "--batch-size", "2", "--seq-len", "1024", "--device",
             "colab-t4"]
    main(given)
    out = capsys.readouterr().out.strip().splitlines()
    said = [line for line in out if not line.startswith(" ")]   # (a long line wraps, indented)
    ends = ("largest batch", "details:", "the next closest", "other changes", "no change needed")
    answer = said[:next(i for i, line in enumerate(said) if line.startswith(ends)) + 1]
    assert said[0].startswith(("fits Colab T4", "DOES NOT FIT Colab T4")) and len(answer) <= 5, said
    assert said[-1].startswith("details: --details")
    main(given + ["--details"])
    details = capsys.readouterr().out
    assert "image tokens computed from the image processor's config" in details, details
