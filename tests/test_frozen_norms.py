"""Frozen norms in trained blocks (issue 47's "a Muon run with embeddings, head and norms frozen").

``torch.optim.Muon`` takes only 2-D parameters, so Muon recipes freeze (or route to another optimizer) the norms,
the embeddings and the LM head. A block whose RMSNorm weights are frozen while its Linear weights train saves less
than a trained one: ``weight * h.to(input_dtype)`` keeps the normalized ``h`` only for the weight's grad, so with
the weight frozen autograd keeps just the weight (a parameter: no new memory) beside the norm's fp32 input and
rsqrt's output (checked below with ``saved_tensors_hooks``). The estimate reads each leaf's ``requires_grad``; the
frozen norms' missing grads and optimizer state follow from it. Measured by real CPU Trainer steps with the
profiler's memory events (``benchmarks/real_clients.py``'s ProfilerMeter, not the kit's own meter).
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402
import real_clients as rc  # noqa: E402

from kit.estimate import estimate  # noqa: E402
from kit.inputs import InputError  # noqa: E402
from kit.measure.tensor_peak import saved_tensor_bytes  # noqa: E402
from kit.models import build_model  # noqa: E402

B, S, LAYERS = 4, 64, 4


def _model(name, freeze):
    """A twin of ``name`` with LAYERS blocks, every parameter whose name ``freeze(name, param)`` picks frozen."""
    over = {"num_hidden_layers": LAYERS} | ({"layer_types": ["full_attention"] * LAYERS} if "qwen" in name else {})
    cfg = bench._config(name, over)
    torch.manual_seed(0)
    model = build_model(cfg)
    for pname, param in model.named_parameters():
        param.requires_grad = not freeze(pname, param)
    return model, cfg


def muon_routed(name, param):
    """What Muon does not take (every parameter not 2-D: the norms), and the embeddings and head."""
    return param.ndim != 2 or "embed_tokens" in name or "lm_head" in name


def every_norm(name, param):
    return "norm" in name


def _saved(model, cfg, autocast=False):
    ids = torch.randint(2, cfg.vocab_size, (B, S))
    mask = torch.ones_like(ids)
    mask[::2, -S // 4:] = 0
    model.train()
    model.config.use_cache = False
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return saved_tensor_bytes(model, {"input_ids": ids, "attention_mask": mask, "labels": ids})


def test_a_frozen_norm_keeps_no_normalized_input():
    """transformers' RMSNorm, its input requiring grad: with the weight frozen, the normalized input (cast back to
    the input's dtype) is no longer saved; the fp32 input and rsqrt's output are, and the weight itself."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for dtype in (torch.float32, torch.bfloat16):
        kept = {}
        for frozen in (False, True):
            norm = LlamaRMSNorm(32).to(dtype).requires_grad_(not frozen)
            x = torch.randn(2, 8, 32, dtype=dtype, requires_grad=True)
            seen = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
                norm(x)
            kept[frozen] = [(tuple(t.shape), t.dtype) for t in seen if t is not norm.weight]
            assert any(t is norm.weight for t in seen)   # kept for the input's grad: a parameter, no new bytes
        assert kept[False] == kept[True] + [((2, 8, 32), dtype)], kept


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"])
@pytest.mark.parametrize("freeze", [muon_routed, every_norm])
@pytest.mark.parametrize("autocast", [False, True])
def test_saved_bytes_with_frozen_norms_are_what_autograd_saves(name, freeze, autocast):
    """Byte for byte (a 0-d scalar apart), and each frozen block norm saves one (B, S, H) tensor less in the
    input's dtype (Qwen-3's q/k norms one q or k less) than the same model with its block norms trained."""
    model, cfg = _model(name, freeze)
    kw = dict(batch_size=B, seq_len=S, device="cpu", precision="bf16" if autocast else "fp32")
    est = estimate(model, **kw)
    assert est.saved_bytes == pytest.approx(_saved(model, cfg, autocast), abs=16)
    trained_norms, _ = _model(name, lambda n, p: freeze(n, p) and not n.startswith("model.layers."))
    assert estimate(trained_norms, **kw).saved_bytes - est.saved_bytes == \
        _saved(trained_norms, cfg, autocast) - _saved(model, cfg, autocast)
    assert est.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_frozen_norms_are_within_2_percent_of_real_trainer_steps(tmp_path, family, optimizer):
    """Muon with the embeddings, head (Qwen2's tied to them) and norms frozen, and Trainer's AdamW with every norm
    frozen: step 1 and the steady step against the profiler's meter (before, refused as a partly frozen block)."""
    _, setup, est, peaks = rc.run_trainer_client(rc.client_frozen_norms(str(tmp_path), family, optimizer),
                                                 rc.ProfilerMeter)
    first, steady = est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:])
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f} ({est.peak_moment})")
    assert 0.98 <= first <= 1.02 and 0.98 <= steady <= 1.02, (first, steady, peaks)
    assert est.setup["optimizer"].startswith(optimizer)   # (Trainer's AdamW: "adamw-fused" as it runs here)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_muons_state_and_grads_are_the_trained_matrices_only(name):
    """Qwen2's q/k/v biases are 1-D: frozen with the norms, beside their trained weights, they make no grad."""
    model, _ = _model(name, muon_routed)
    est = estimate(model, batch_size=B, seq_len=S, device="cpu", optimizer="muon")
    trained = [p for p in model.parameters() if p.requires_grad]
    assert all(p.ndim == 2 for p in trained)
    assert est.optimizer_bytes == est.gradients_bytes == sum(4 * p.numel() for p in trained)


def test_a_frozen_weight_beside_a_trained_bias_is_refused():
    """BitFit's pattern: the layer's input would be saved for no weight grad, which the replay does not follow."""
    model, _ = _model("tiny-qwen2", lambda n, p: n.endswith("proj.weight"))
    with pytest.raises(InputError, match="have a frozen weight and a trained bias") as refused:
        estimate(model, batch_size=B, seq_len=S, device="cpu")
    assert refused.value.code == "frozen-weight-trained-bias"
    assert "model.layers.0.self_attn.q_proj" in str(refused.value)


def _norms_of(blocks):
    return lambda name, param: "norm" in name and any(name.startswith(f"model.layers.{i}.") for i in blocks)


@pytest.mark.parametrize("name,freeze,says", [
    ("tiny-llama", _norms_of((0, 1)), "the norms of blocks [0, 1] are frozen while those of blocks [2, 3] train"),
    ("tiny-llama", lambda n, p: n.endswith("input_layernorm.weight"),
     "block 0 is partly frozen (input_layernorm)"),
    ("tiny-llama", lambda n, p: "norm" in n or n.endswith("mlp.up_proj.weight"),
     "block 0 is partly frozen (mlp.up_proj, input_layernorm, post_attention_layernorm)"),
    ("tiny-olmo2", lambda n, p: "norm" in n, "the kit replays frozen norms only in the blocks of llama, mistral, "
     "qwen2, qwen3, not olmo2's"),
])
def test_other_frozen_norms_are_refused_naming_what_was_found(name, freeze, says):
    model, _ = _model(name, freeze)
    with pytest.raises(InputError) as refused:
        estimate(model, batch_size=B, seq_len=S, device="cpu")
    assert refused.value.code == "partly-frozen-block" and says in str(refused.value), str(refused.value)
    assert "kit.watch(trainer)" in str(refused.value)


def test_frozen_norms_under_ligers_rms_norm_are_refused():
    model, _ = _model("tiny-llama", every_norm)
    with pytest.raises(InputError, match="not Liger's kernel") as refused:
        estimate(model, batch_size=B, seq_len=S, liger_kernel=True)
    assert refused.value.code == "partly-frozen-block"


def test_frozen_norms_are_one_gpu():
    model, _ = _model("tiny-llama", every_norm)
    with pytest.raises(InputError, match="the blocks' norms are frozen") as refused:
        estimate(model, batch_size=B, seq_len=S, strategy="fsdp", num_gpus=2)
    assert refused.value.code == "frozen-blocks-one-gpu"
