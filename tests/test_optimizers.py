"""The optimizers' room (kit.optimizers): its names are transformers' own and live in one place; each state's bytes
equal the real optimizer's state after a step, byte for byte, and each step's temporaries the rise a step makes
(TensorPeak); Muon is read from a Trainer's ``optimizers=`` and from a plain loop's optimizer; an optimizer the kit
does not model is refused in one sentence that names its class, never estimated as AdamW."""
import pathlib
import re
import warnings

import pytest
import torch
from torch import nn

import kit
from kit import machine, models, optimizers
from kit.estimate import estimate, estimate_trainer
from kit.inputs import InputError
from kit.measure.tensor_peak import TensorPeak

warnings.filterwarnings("ignore", category=FutureWarning)
KIT = pathlib.Path(kit.__file__).resolve().parent
cpu_only = pytest.mark.skipif(machine.has_cuda(), reason="CPU readings (TensorPeak)")


def test_the_trainer_names_are_transformers_own():
    from transformers.training_args import OptimizerNames

    assert set(optimizers.BY_OPTIM) <= {o.value for o in OptimizerNames}
    assert all(optimizers.kit_name(optimizers.trainer_optim(k)) == k for k in optimizers.TRAINER_OPTIM)


def test_bitsandbytes_trainer_names_live_in_at_most_three_modules():
    names = [n for n in optimizers.BY_OPTIM if "8bit" in n or "paged" in n]
    where = {str(p.relative_to(KIT)) for p in KIT.rglob("*.py")
             if any(re.search(rf"\b{n}\b", p.read_text()) for n in names)}
    assert "optimizers.py" in where and len(where) <= 3, where


class Shapes(nn.Module):
    """Parameters of 3, 2 and 1 dimensions (Adafactor factors the first two; Muon takes the 2-D ones)."""

    def __init__(self, dtype):
        super().__init__()
        self.cube = nn.Parameter(torch.randn(6, 40, 24, dtype=dtype))
        self.wide = nn.Parameter(torch.randn(96, 160, dtype=dtype))
        self.tall = nn.Parameter(torch.randn(200, 32, dtype=dtype))
        self.bias = nn.Parameter(torch.randn(96, dtype=dtype))

    def forward(self):
        return self.cube.float().sum() + self.wide.float().square().sum() + self.tall.float().sum() \
            + self.bias.float().sum()


def _make(name, params):
    from transformers import Adafactor

    if name == "adafactor":   # as Trainer builds it for optim="adafactor"
        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False)
    return torch.optim.Muon([p for p in params if p.ndim == 2], lr=0.02)


def _state_bytes(opt):
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)}
    return sum(seen.values())


@cpu_only
@pytest.mark.parametrize("name", ["adafactor", "muon"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_and_step_temporaries_match_the_real_optimizer(name, dtype):
    torch.manual_seed(0)
    module = Shapes(dtype)
    params = list(module.parameters())
    opt = _make(name, params)
    width = torch.finfo(dtype).bits // 8
    for step in range(2):
        module().backward()
        with TensorPeak() as peak:
            opt.step()
        rise = peak.peak_bytes - peak.start_bytes
        if step == 0:   # the first step makes the state: the state's bytes, then the step's own rise
            assert _state_bytes(opt) == sum(optimizers.state_bytes(name, p.shape, width)[0] for p in params)
    tensors = [(tuple(p.shape), width, True) for p in params]
    predicted = optimizers.step_temporaries(name, tensors, "cpu")
    print(name, dtype, f"step 2 rose {rise:,} B, predicted {predicted:,} B")
    assert predicted <= rise <= 1.02 * predicted


def test_adafactor_factors_two_dimensions_and_more():
    assert optimizers.state_bytes("adafactor", (4096, 1024), 2) == (4 * (4096 + 1024 + 1), 0)
    assert optimizers.state_bytes("adafactor", (6, 40, 24), 4) == (4 * (6 * 40 + 6 * 24 + 1), 0)
    assert optimizers.state_bytes("adafactor", (96,), 2) == (4 * (96 + 1), 0)
    assert optimizers.state_bytes("muon", (96, 160), 2) == (2 * 96 * 160, 0)
    assert optimizers.state_bytes("muon", (96,), 4) == (0, 0)


def _rows(n=16, length=24):
    from datasets import Dataset

    ids = [[5 + (i * 7 + j) % 4000 for j in range(length)] for i in range(n)]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length] * n})


def _trainer(model, optimizer):
    from transformers import Trainer, TrainingArguments

    from kit import data

    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", per_device_train_batch_size=4)
    return Trainer(model=model, args=args, train_dataset=_rows(), optimizers=(optimizer, None),
                   data_collator=data.collator(data.shipped_tokenizer()))


def test_a_trainer_given_muon_is_estimated_as_muon():
    torch.manual_seed(0)
    model = models.build_model("tiny-llama")
    muon = torch.optim.Muon([p for p in model.parameters() if p.ndim == 2])
    est = estimate_trainer(_trainer(model, muon), device="cpu")
    assert est.sources["optimizer"] == ("muon", "trainer.optimizer (Muon)")
    assert est.optimizer_bytes == sum(4 * p.numel() for p in model.parameters() if p.ndim == 2)
    adamw = estimate(model, batch_size=4, seq_len=24, device="cpu", padded=False)
    assert est.optimizer_bytes < adamw.optimizer_bytes / 2 < adamw.optimizer_bytes


def test_adafactor_by_name_on_the_command_line_and_refused_on_several_gpus():
    est = estimate("tiny-llama", batch_size=2, seq_len=32, optimizer="adafactor")
    assert est.setup["optim"] == "adafactor"
    assert est.optimizer_bytes < estimate("tiny-llama", batch_size=2, seq_len=32).optimizer_bytes / 10
    with pytest.raises(InputError, match="strategy='single'") as exc:
        estimate("tiny-llama", batch_size=2, seq_len=32, optimizer="muon", strategy="ddp", num_gpus=2)
    assert exc.value.name == "optimizer"


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adagrad(p),
    lambda p: torch.optim.RMSprop(p),
])
def test_an_optimizer_the_kit_does_not_model_is_refused_by_its_class(make):
    model = models.build_model("tiny-llama")
    optimizer = make(model.parameters())
    with pytest.raises(InputError) as exc:
        estimate_trainer(_trainer(model, optimizer), device="cpu")
    msg = str(exc.value)
    assert type(optimizer).__name__ in msg and "\n" not in msg and msg.endswith(".")
    assert exc.value.code == "optimizer-not-modeled" and "as if it were AdamW" in msg


def test_sgd_without_momentum_is_modelled_with_no_state():
    """Issue 47: torch.optim.SGD without momentum keeps no state (it was refused); with a momentum it keeps one
    buffer a parameter, as before."""
    model = models.build_model("tiny-llama")
    plain = estimate_trainer(_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1)), device="cpu")
    assert plain.setup["optimizer"] == "sgd-plain" and plain.optimizer_bytes == 0
    assert plain.first_step_peak_bytes == plain.peak_bytes          # no state: step 1 holds what the later steps do
    momentum = estimate_trainer(_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)),
                                device="cpu")
    assert momentum.setup["optimizer"] == "sgd" and momentum.optimizer_bytes == 4 * plain.trainable_params


@cpu_only
def test_a_plain_loop_with_muon_is_watched_and_estimated_as_muon():
    torch.manual_seed(0)
    model = models.build_model("tiny-llama")
    model.train()
    muon = torch.optim.Muon([p for p in model.parameters() if p.ndim == 2], lr=0.02)
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": (ids := torch.randint(5, 4000, (4, 40), generator=g)),
                "attention_mask": torch.ones_like(ids), "labels": ids.clone()} for _ in range(3)]
    w = kit.watch_loop(model, muon, tensor_peak=True, plot=False)
    for batch in batches:
        with w.step(batch):
            model(**batch).loss.backward()
            muon.step()
            model.zero_grad()   # the norms' grads too: they are in no optimizer (Muon refuses 1-D tensors)
    assert w.estimate is not None, w.estimate_error
    assert w.estimate.setup["optimizer"] == "muon"
    first = w.steps[0].peak_bytes / w.estimate.first_step_peak_bytes
    later = max(s.peak_bytes for s in w.steps[1:]) / w.estimate.peak_bytes
    print(f"step 1 {first:.4f}, later steps {later:.4f}")
    assert 0.98 <= first <= 1.02 and 0.98 <= later <= 1.02
    w.close()
    adagrad = torch.optim.Adagrad(model.parameters())   # (the watch holds its optimizer by a weak reference)
    refused = kit.watch_loop(model, adagrad, plot=False)
    with refused.step(batches[0]):
        model(**batches[0]).loss.backward()
    assert refused.estimate is None and "Adagrad" in refused.estimate_error
    refused.close()


def test_every_optimizer_has_its_names_and_rules():
    for name, o in optimizers.ROOM.items():
        assert o.name == name and (o.optim or o.classes), name
        held, paged = optimizers.state_bytes(name, (64, 32), 4)
        assert held + paged >= 0 and (paged == 0 or o.paged)
        assert optimizers.step_temporaries(name, [((64, 32), 4, True)], "cuda") >= 0
