"""ModernBERT (``answerdotai/ModernBERT-base``): the replay against what autograd saves on the CPU twin, a real
Trainer's steps and ``evaluate()`` against ``benchmarks/real_clients.py``'s independent meter, and the shipped model
by name, offline (API and CLI)."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import clients_modernbert as cm  # noqa: E402
import real_clients as rc  # noqa: E402

from kit.estimate import estimate  # noqa: E402
from kit.measure.tensor_peak import saved_tensor_bytes  # noqa: E402
from kit.models import as_dtype, build_model, get_config  # noqa: E402

BAND = (0.98, 1.02)


@pytest.mark.parametrize("task,S,padded,attn,dtype,pooling", [
    ("seq-cls", 64, False, "sdpa", "fp32", "mean"),   # S 64 >= the twin's half window 16: the local layers' mask
    ("seq-cls", 12, True, "sdpa", "fp32", "cls"),     # S 12 < 16: only the padding's mask
    ("token-cls", 64, True, "eager", "fp32", "mean"), ("seq-cls", 64, True, "sdpa", "bf16", "mean")])
def test_saved_bytes_match_autograd(task, S, padded, attn, dtype, pooling):
    """What one training forward saves for backward (saved_tensors_hooks, weights excluded), per setup: layer 0
    without its attention norm, the fused Wqkv's storage kept by sdpa, GeGLU, both rotary sets, both masks, the
    pooling and the prediction head. The hooks also see the batch's own mask and labels, which the estimate counts
    with the inputs (B x S int64 at most)."""
    cfg = get_config("tiny-modernbert")
    cfg.classifier_pooling = pooling
    torch.manual_seed(0)
    model = build_model(cfg, dtype=as_dtype(dtype), task=task, num_labels=3)
    model.config._attn_implementation = attn
    model.train()
    B = 2
    ids = torch.randint(2, cfg.vocab_size, (B, S))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, -3:] = 0
    labels = torch.zeros(B, dtype=torch.long) if task == "seq-cls" else torch.zeros(B, S, dtype=torch.long)
    got = saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    est = estimate(cfg, batch_size=B, seq_len=S, task=task, num_labels=3, load_dtype=dtype, attn_implementation=attn,
                   padded=padded, device="cpu")
    assert 0 <= got - est.saved_bytes <= B * S * 8 + 64, (est.saved_bytes, got)


@pytest.mark.parametrize("task", ["seq-cls", "token-cls"])
def test_trainer_steps_and_evaluate_within_2_percent(work, task):
    """transformers' task guide on the twin (full fine-tuning, 3 labels, B4 x 64, eval B8): step 1, the steady step
    and evaluate() against the profiler's meter."""
    _, _, est, peaks = rc.run_trainer_client(cm.client_modernbert(work, task), rc.ProfilerMeter)
    assert not isinstance(est, Exception), est
    ratios = (est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:]),
              est.eval_peak_bytes / peaks.evaluate)
    for what, r in zip(("step 1", "steady", "evaluate"), ratios):
        assert BAND[0] <= r <= BAND[1], (what, r, est.peak_moment, est.eval_moment)
    assert est.setup["task"] == task and est.eval_moment == "forward (a block's MLP)"


def test_modernbert_base_by_name_offline(capsys):
    """The shipped config (ModernBertForSequenceClassification, 2 labels: 149,606,402 parameters), by its Hub id,
    through the API and the CLI; as a causal LM it is refused in one sentence."""
    from kit.cli import main

    est = estimate("answerdotai/ModernBERT-base", task="seq-cls", num_labels=2, batch_size=8, seq_len=512)
    assert est.params == build_model("answerdotai/ModernBERT-base", device="meta", task="seq-cls").num_parameters() \
        == 149_606_402
    main(["estimate", "--model", "answerdotai/ModernBERT-base", "--task", "seq-cls", "--num-labels", "2",
          "--batch-size", "8", "--seq-len", "512", "--json"])
    assert json.loads(capsys.readouterr().out)["peak_bytes"] == est.peak_bytes
    with pytest.raises(ValueError, match="is an encoder.*task='seq-cls'"):
        estimate("tiny-modernbert", batch_size=1, seq_len=8)


def test_lora_on_the_fused_projection_saves_what_autograd_saves():
    """peft's SEQ_CLS LoRA on Wqkv (the kit's default target for ModernBERT, which peft has none for): the saved bytes
    and the trainable parameters (the adapters and the classifier's modules_to_save copy)."""
    from peft import LoraConfig, get_peft_model

    cfg = get_config("tiny-modernbert")
    torch.manual_seed(0)
    model = get_peft_model(build_model(cfg, task="seq-cls", num_labels=3),
                           LoraConfig(task_type="SEQ_CLS", r=8, target_modules=["Wqkv"], lora_dropout=0.0))
    model.train()
    B, S = 2, 64
    ids = torch.randint(2, cfg.vocab_size, (B, S))
    got = saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                     "labels": torch.zeros(B, dtype=torch.long)})
    est = estimate(cfg, batch_size=B, seq_len=S, task="seq-cls", num_labels=3, lora_r=8, lora_dropout=0.0,
                   padded=False, device="cpu")
    assert 0 <= got - est.saved_bytes <= B * S * 8 + 64, (est.saved_bytes, got)
    assert est.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
