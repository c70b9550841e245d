"""Mixture-of-experts blocks on tiny twins: ``tiny-qwen3-moe`` (2 layers, 8 experts, top-2, norm_topk_prob),
``tiny-mixtral``, ``tiny-olmoe`` and ``tiny-gpt-oss`` (2 layers, 8 experts, top-2; gpt-oss: a sliding and a full
layer, attention sinks, biased experts): the replay against what autograd saves, the
estimate against real Trainer steps read by ``benchmarks/real_clients.py``'s profiler meter (step 1 and the
steady step), the fused 3-D experts in the parameter count, and the refusals of what the replay does not follow.

The routed rows are fixed (tokens x top-k), and every tensor the experts save spans all of them, so these
figures do not depend on which experts the random router picks (kit.estimate.replay.moe).
"""
import functools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit.estimate import estimate  # noqa: E402
from kit.estimate.inventory import UnsupportedModel, family_of, info_of  # noqa: E402
from kit.model_configs import get_config  # noqa: E402
from kit.models import build_model  # noqa: E402

TWIN = "tiny-qwen3-moe"
# the blocks, not the logits, set the peak: a small vocabulary, wide experts, top-4 (Mixtral and OLMoE name one
# expert's width intermediate_size, Qwen3-MoE moe_intermediate_size)
WIDE = dict(vocab_size=256, moe_intermediate_size=384, num_experts_per_tok=4)
WIDE_DENSE_NAMED = dict(vocab_size=256, intermediate_size=384, num_experts_per_tok=4)
ATTENTION = ["q_proj", "v_proj"]
CASES = {  # label -> (twin, estimate options, config overrides)
    "full FT": (TWIN, dict(batch_size=4, seq_len=128), None),
    "LoRA r8 (q_proj, v_proj)": (TWIN, dict(batch_size=4, seq_len=128, lora_r=8), None),
    "full FT, checkpointing": (TWIN, dict(batch_size=4, seq_len=128, gradient_checkpointing=True), None),
    "wide experts, full FT, unpadded": (TWIN, dict(batch_size=4, seq_len=128, padded=False), WIDE),
    "wide experts, LoRA r8, unpadded": (TWIN, dict(batch_size=4, seq_len=128, padded=False, lora_r=8), WIDE),
}
for twin in ("tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss"):
    CASES |= {f"{twin}, full FT": (twin, dict(batch_size=4, seq_len=128), None),
              f"{twin}, LoRA r8 (q_proj, v_proj)": (twin, dict(batch_size=4, seq_len=128, lora_r=8,
                                                                lora_targets=ATTENTION), None),
              f"{twin}, wide experts, full FT, unpadded": (twin, dict(batch_size=4, seq_len=128, padded=False),
                                                           WIDE_DENSE_NAMED)}


@functools.lru_cache(maxsize=None)
def _measured(label):
    twin, kw, over = CASES[label]
    torch.manual_seed(0)
    return bench.run_row(label, twin, kw, False, over)


def test_the_experts_fused_3d_parameters_are_counted():
    model = build_model(TWIN, device="meta")
    info = info_of(TWIN)
    experts = [l for l in info.leaves if l.kind == "experts"]
    assert [l.short for l in experts[:2]] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    assert experts[0].shape == (8, 2 * 64, 128) and experts[1].shape == (8, 128, 64)
    assert family_of(get_config(TWIN)) == info.family == "qwen3_moe"
    # embeddings 4096 x 128 (tied) + final norm 128 + 2 x (attention 49,216 with q/k norms, experts 8 x 3 x 128 x 64,
    # router 8 x 128, two norms 256)
    assert estimate(TWIN, batch_size=1, seq_len=8).params == model.num_parameters() == 1_018_624
    # LoRA on the attention: the experts and the router stay frozen, only the adapters train
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert estimate(TWIN, batch_size=1, seq_len=8, lora_r=8).trainable_params == trainable


@pytest.mark.parametrize("label", list(CASES))
def test_replay_matches_autograd_saved_tensors(label):
    r = _measured(label)
    _, kw, _ = CASES[label]
    # checkpointing keeps the rotary cos/sin and the padded batch's bool mask for the recompute, unsaved
    kept = 2 * 128 * 32 * 4 + 4 * 128 * 128 if kw.get("gradient_checkpointing") else 0
    assert r["est"].saved_bytes - kept == pytest.approx(r["saved"], rel=1e-6)


@pytest.mark.parametrize("label", list(CASES))
def test_peak_matches_a_cpu_trainer_step(label):
    r = _measured(label)
    assert 0.998 <= r["est"].peak_bytes / r["got"]["peak"] <= 1.002, (r["est"].peak_moment, r["got"])
    assert r["est"].weights_bytes == r["got"]["weights"]


def _grouped_mm_checked(client):
    """A real_clients client whose model is checked to run its experts with grouped_mm (what runs on this CPU,
    torch 2.13)."""
    row = next(client)
    assert row[2].model.config._experts_implementation == "grouped_mm"
    try:
        yield row
    finally:
        client.close()


@pytest.mark.parametrize("twin,lora", [(TWIN, False), (TWIN, True), ("tiny-mixtral", False), ("tiny-olmoe", True)],
                         ids=["qwen3-moe-full", "qwen3-moe-lora-attention", "mixtral-full", "olmoe-lora-attention"])
def test_trainer_steps_and_evaluate_within_2_percent_of_the_profiler_meter(twin, lora, tmp_path):
    """benchmarks/real_clients.py's MoE client (a real Trainer, 3 steps, AdamW fused, rows all full length, an eval
    set; LoRA r8 on q/k/v/o), read by its profiler meter: the estimate read off the Trainer is within 2% at step 1,
    at the steady step and at ``trainer.evaluate()``, whose no_grad forward peaks at the experts' gate here (wide
    experts: I > H; kit.estimate.replay.moe.no_grad_loop). Measured 0.9995 to 0.9999 here."""
    import real_clients as rc

    client = _grouped_mm_checked(rc.client_moe(str(tmp_path), twin, lora))
    _, _, est, peaks = rc.run_trainer_client(client, rc.ProfilerMeter)
    assert est.setup["attn_implementation"] == "sdpa" and len(peaks) == 3 and peaks.evaluate
    for what, ratio in zip(("step 1", "steady", "evaluate"), rc.step_ratios(est, peaks)):
        assert 0.98 <= ratio <= 1.02, (what, ratio, est.peak_moment, list(peaks), peaks.evaluate)


@pytest.mark.parametrize("twin,width", [(TWIN, "moe_intermediate_size"), ("tiny-mixtral", "intermediate_size")],
                         ids=["qwen3-moe", "mixtral"])
def test_evaluate_with_narrow_experts_peaks_at_the_restore_and_is_within_2_percent(twin, width, tmp_path,
                                                                                   monkeypatch):
    """Experts narrower than the hidden size (I = 64 < H = 128, as Qwen3-30B-A3B's 768 < 2048): the no_grad
    forward's largest moment is the experts' restore (``weighted_out[inv_perm]``: four (R, H) tensors), not the
    gate; LoRA r8 on q/k/v/o, bf16 weights with ``bf16=True``. ``evaluate()`` measured 0.9970 (Qwen3-MoE) and
    0.9976 (Mixtral) of its profiler meter here (only evaluate() is asserted: these twins' training steps are not
    the subject)."""
    import real_clients as rc

    monkeypatch.setitem(rc.MOE_WIDE, twin, {"vocab_size": 256, width: 64, "num_experts_per_tok": 4})
    _, _, est, peaks = rc.run_trainer_client(rc.client_moe(str(tmp_path), twin, lora=True, bf16=True),
                                             rc.ProfilerMeter)
    assert 0.98 <= est.eval_peak_bytes / peaks.evaluate <= 1.02, (est.eval_peak_bytes, peaks.evaluate)


@pytest.mark.parametrize("twin,lora,bf16", [("tiny-gpt-oss", True, True), ("tiny-gpt-oss", False, False)],
                         ids=["gpt-oss-lora-bf16", "gpt-oss-full"])
def test_gpt_oss_trainer_steps_and_evaluate_within_2_percent(twin, lora, bf16, tmp_path):
    """benchmarks/real_clients.py's MoE client (Trainer, the twin widened, an eval set): gpt-oss loaded in bf16 with
    ``bf16=True`` and LoRA on the attention (as TRL's gpt-oss recipe trains it), and fp32 full FT; step 1, the
    steady step and ``trainer.evaluate()`` under its profiler meter (measured 1.0000, 1.0000 and 0.9994 here for
    both). Its forward's largest moment (the gate's last mul in the last block) sets the step's peak here."""
    import real_clients as rc

    _, _, est, peaks = rc.run_trainer_client(rc.client_moe(str(tmp_path), twin, lora, bf16), rc.ProfilerMeter)
    assert len(peaks) == 3 and peaks.evaluate
    assert est.setup["attn_implementation"] == "eager"   # gpt-oss has no sdpa in transformers 5.25
    for what, ratio in zip(("step 1", "steady", "evaluate"), rc.step_ratios(est, peaks)):
        assert 0.98 <= ratio <= 1.02, (what, ratio, est.peak_moment, list(peaks), peaks.evaluate)


def test_gpt_oss_20b_fits_an_a100_in_five_lines_and_says_mxfp4_was_dequantized(run_kit):
    """``python -m kit fit --model openai/gpt-oss-20b --lora-r 16`` on an A100 80 GB: the answer (the lines before
    the other changes and the details) in at most 5 lines, its verdict saying which weights it assumed."""
    code, out, _ = run_kit("fit", "--model", "openai/gpt-oss-20b", "--lora-r", "16", "--batch-size", "1",
                           "--seq-len", "1024", "--device", "a100-80", "--load-dtype", "bf16")
    lines = out.splitlines()
    ends = ("largest batch", "details:", "the next closest", "other changes", "no change needed")
    answer = lines[:next(i for i, ln in enumerate(lines) if ln.startswith(ends)) + 1]
    assert code == 0 and len(answer) <= 5 and lines[0].startswith("fits A100 80 GB: ")
    assert "MXFP4 experts dequantized to bf16" in " ".join(answer[:2])
    est = estimate("openai/gpt-oss-20b", batch_size=1, seq_len=1024, lora_r=16, load_dtype="bf16")
    assert any(getattr(n, "code", "") == "mxfp4-dequantized" for n in est.notes)


def test_lora_on_the_experts_is_refused_by_name_where_it_is_given(tmp_path):
    """peft 0.21's LoRA on the fused experts (``LoraConfig(target_parameters=...)``, its ``ParamWrapper``) makes a
    full copy of each layer's experts per forward: refused in one sentence, from the config and from a built
    Trainer (which before said to leave a Qwen3MoeExperts out of target_modules, where it never was)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    from kit.estimate import estimate_from, estimate_trainer
    from kit.inputs import Refusal

    lora = LoraConfig(r=8, target_modules=["q_proj"], target_parameters=["mlp.experts.gate_up_proj"])
    with pytest.raises(Refusal, match=r"target_parameters.*ParamWrapper.*full copy of the layer's experts"):
        estimate_from(TWIN, peft_config=lora, seq_len=16)
    trainer = Trainer(model=get_peft_model(build_model(TWIN), lora),
                      args=TrainingArguments(str(tmp_path), use_cpu=True, report_to=[]))
    with pytest.raises(Refusal, match=r"^model\.layers\.0\.mlp\.experts puts LoRA on fused parameters"):
        estimate_trainer(trainer, seq_len=16)


@pytest.mark.parametrize("change,said", [
    (dict(_experts_implementation="batched_mm"), "experts_implementation='batched_mm'"),
    (dict(_experts_implementation="eager"), "experts_implementation='eager'"),
    (dict(mlp_only_layers=[0]), "mixes dense and sparse layers"),
    (dict(output_router_logits=True), "output_router_logits=True"),
])
def test_what_the_replay_does_not_follow_is_refused_by_name(change, said):
    cfg = get_config(TWIN)
    for k, v in change.items():
        setattr(cfg, k, v)
    with pytest.raises(UnsupportedModel, match="^qwen3_moe") as err:
        estimate(cfg, batch_size=1, seq_len=8)
    assert said in str(err.value)


@pytest.mark.parametrize("twin,family,params", [("tiny-mixtral", "mixtral", 1_018_496),
                                                 ("tiny-olmoe", "olmoe", 1_018_880),
                                                 ("tiny-gpt-oss", "gpt_oss", 1_547_672)])
def test_mixtral_olmoe_and_gpt_oss_twins_are_their_own_families(twin, family, params):
    """Mixtral (no q/k norms, its routing weights left fp32) and OLMoE (q/k norms over the whole projections) run
    the same experts: each is replayed by name, and its parameters counted with the fused 3-D experts (Mixtral:
    embeddings 4096 x 128, tied, + final norm 128 + 2 x (attention 49,152, experts 8 x 3 x 128 x 64, router 8 x 128,
    two norms 256); OLMoE: + its q/k norms, 128 + 64 a layer; gpt-oss: embeddings and head 2 x 4096 x 128, untied, +
    final norm 128 + 2 x (attention with biases 49,536 and 4 sinks, router 8 x 128 + 8, experts with their biases
    8 x (128 x 128 + 128 + 64 x 128 + 128), two norms 256))."""
    assert family_of(get_config(twin)) == info_of(twin).family == family
    assert estimate(twin, batch_size=1, seq_len=8).params == build_model(twin, device="meta").num_parameters() == params


@pytest.mark.parametrize("twin,change,said", [("tiny-mixtral", dict(router_jitter_noise=0.1), "router_jitter_noise"),
                                              ("tiny-olmoe", dict(clip_qkv=8.0), "clip_qkv")])
def test_mixtral_jitter_and_olmoe_clip_are_refused(twin, change, said):
    cfg = get_config(twin)
    for k, v in change.items():
        setattr(cfg, k, v)
    with pytest.raises(UnsupportedModel, match=said):
        estimate(cfg, batch_size=1, seq_len=8)


def test_a_built_model_with_another_experts_implementation_is_refused():
    model = build_model(TWIN)
    model.set_experts_implementation("batched_mm")
    with pytest.raises(UnsupportedModel, match="batched_mm"):
        estimate(model, batch_size=1, seq_len=8)


@pytest.mark.skipif(os.environ.get("KIT_REAL_WIDTH") != "1", reason="about 8 GiB of RAM and 2 minutes: set "
                    "KIT_REAL_WIDTH=1 to run it")
def test_a_real_width_qwen3_30b_a3b_twin_is_exact():
    """Qwen/Qwen3-30B-A3B's real widths (hidden 2048, 128 experts of width 768, top-8, vocabulary 151,936) in 2
    layers, LoRA r8 on q_proj and v_proj, batch 1 x 64 tokens: the replay against autograd, and the estimate
    against Trainer steps under the kit's CPU meter (measured 1.00000 and 1.00000 here)."""
    kw = dict(batch_size=1, seq_len=64, padded=False, lora_r=8)
    r = bench.run_row("real width", "Qwen/Qwen3-30B-A3B", kw, False, dict(num_hidden_layers=2))
    assert r["est"].saved_bytes == pytest.approx(r["saved"], rel=1e-6)
    assert 0.998 <= r["est"].peak_bytes / r["got"]["peak"] <= 1.002
    assert r["est"].weights_bytes == r["got"]["weights"]


def test_qwen3_30b_a3b_in_4_bit_on_a_t4_answers_in_five_lines_naming_its_unquantized_experts(run_kit):
    """``python -m kit fit --model Qwen/Qwen3-30B-A3B --quantization 4bit --lora-r 16 ... --device colab-t4``: the
    answer (the lines before the other changes) in at most 5 lines, folded as printed; its cause says why 4-bit
    leaves 110 GiB of weights (bitsandbytes swaps nn.Linear only, and the k-bit recipe casts the experts to fp32)."""
    code, out, _ = run_kit("fit", "--model", "Qwen/Qwen3-30B-A3B", "--quantization", "4bit", "--lora-r", "16",
                           "--batch-size", "1", "--seq-len", "1024", "--device", "colab-t4")
    lines = out.splitlines()
    ends = ("the next closest", "other changes", "details:", "no batch fits", "largest batch")
    answer = lines[:next(i for i, line in enumerate(lines) if line.startswith(ends))]
    assert code == 0 and len(answer) <= 5 and lines[0].startswith("DOES NOT FIT Colab T4: "), out
    cause = next(line for line in answer if line.startswith("biggest cause: weights"))
    assert cause.endswith("the experts stay unquantized, in fp32"), cause
    assert any(line.startswith("closest change") for line in answer), answer
