"""A trainer kind is one registration (kit.trainer_kinds): a kind registered here, with nothing else changed, is read
through every face (estimate_trainer, kit.check, kit.watch), found by the trainer's class MRO; and an Estimate is
never changed once built (DPO's and GRPO's parts are composed before it exists)."""
import dataclasses
import warnings

import pytest
from datasets import Dataset
from transformers import Trainer, TrainingArguments

import kit
from kit import data, machine, models, trainer_kinds
from kit.estimate import estimate_from, estimate_trainer
from kit.estimate.trainer_reader import TrainerReader
from kit.watching.core import StageHook

warnings.filterwarnings("ignore", category=FutureWarning)
KEY, STAGE = "half-loss", "half_loss"
WHY = "the model's loss halved: a scalar, no memory of its own"


class HalfLossTrainer(Trainer):
    """A user's Trainer with a compute_loss of its own: the model's loss, halved."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = outputs.loss * 0.5
        return (loss, outputs) if return_outputs else loss


class HalfLossReader(TrainerReader):
    """The kind's reader: Trainer's reading, and where its loss comes from."""

    trainer_name = "HalfLossTrainer"

    def after_model(self, trainer, reading, seq_len) -> None:
        reading.src["compute_loss"] = (f"{type(trainer).__name__}.compute_loss", WHY)


def _attach(trainer, phases, tracker) -> bool:
    """The kind's stage in kit.watch: each compute_loss, a stage of its own."""
    inner = type(trainer).compute_loss

    def staged(*args, **kwargs):
        with tracker.stage(STAGE, reset_peak=False, collect=False, live_tensors=False):
            return inner(trainer, *args, **kwargs)

    trainer.compute_loss = staged
    return True


def _detach(trainer) -> None:
    trainer.__dict__.pop("compute_loss", None)


@pytest.fixture
def half_loss_kind():
    trainer_kinds.register_kind(KEY, lambda: (HalfLossTrainer,))
    trainer_kinds.register_part(KEY, "estimate", HalfLossReader)
    trainer_kinds.register_part(KEY, "watch", StageHook(_attach, _detach))
    yield
    trainer_kinds.forget_kind(KEY)


def _trainer(cls, tmp_path, **kw):
    ids = [[5 + (i * 7 + j) % 4000 for j in range(24)] for i in range(16)]
    rows = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 24 for _ in ids]})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=2,
                             per_device_train_batch_size=4, save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, **kw)
    return cls(model=models.build_model("tiny-llama"), args=args, train_dataset=rows,
               data_collator=data.collator(data.shipped_tokenizer()))


def test_a_registered_kind_is_estimated_by_its_own_reader(half_loss_kind, tmp_path):
    est = estimate_trainer(_trainer(HalfLossTrainer, tmp_path), device="cpu")
    plain = estimate_trainer(_trainer(Trainer, tmp_path), device="cpu")
    assert est.kind == KEY and plain.kind == "trainer"
    assert est.sources["compute_loss"] == ("HalfLossTrainer.compute_loss", WHY)
    assert "compute_loss" not in plain.sources
    assert (est.peak_bytes, est.first_step_peak_bytes) == (plain.peak_bytes, plain.first_step_peak_bytes)


def test_kit_check_reads_a_registered_kind(half_loss_kind, tmp_path, capsys):
    est = kit.check(_trainer(HalfLossTrainer, tmp_path), device="colab-t4", details=True)
    out = capsys.readouterr().out
    assert est.kind == KEY and WHY in out and "compute_loss" in out


@pytest.mark.skipif(machine.has_cuda(), reason="CPU run; the stage is the same on a GPU")
def test_kit_watch_marks_the_kinds_own_stage(half_loss_kind, tmp_path):
    tr = _trainer(HalfLossTrainer, tmp_path)
    w = kit.watch(tr, plot=False)
    assert w.estimate.kind == KEY and "compute_loss" in tr.__dict__
    tr.train()
    assert [r.name for r in w.tracker.records].count(STAGE) == 2   # one per step (max_steps=2)
    w.close()
    assert "compute_loss" not in tr.__dict__


def test_without_its_registration_the_subclass_is_a_plain_trainer(tmp_path):
    tr = _trainer(HalfLossTrainer, tmp_path)
    assert trainer_kinds.kind_of(tr) == "trainer" and estimate_trainer(tr, device="cpu").kind == "trainer"


def test_a_users_subclass_is_its_registered_parents_kind(half_loss_kind):
    from trl import DPOConfig, GRPOTrainer, SFTTrainer

    class MySFT(SFTTrainer):
        pass

    class MyHalfLoss(HalfLossTrainer):
        pass

    class MyDPOConfig(DPOConfig):
        pass

    kinds = [trainer_kinds.kind_of(cls.__new__(cls)) for cls in (MySFT, MyHalfLoss, MyDPOConfig, GRPOTrainer)]
    assert kinds == ["sft", KEY, "dpo", "grpo"]


def test_a_kind_registers_once():
    with pytest.raises(ValueError, match="registered already"):
        trainer_kinds.register_kind("sft", lambda: ())


@pytest.mark.parametrize("setup", ["dpo", "grpo", "plain"])
def test_an_estimate_cannot_be_changed_once_built(setup):
    """DPO and GRPO compose their reference and phases before the Estimate exists: any assignment to a built one
    fails, whatever made it."""
    from trl import DPOConfig, GRPOConfig

    common = dict(output_dir="unused", use_cpu=True, report_to="none", bf16=False)
    est = {"dpo": lambda: estimate_from("tiny-llama", dpo_config=DPOConfig(**common, max_length=32), device="cpu"),
           "grpo": lambda: estimate_from("tiny-qwen2", grpo_config=GRPOConfig(
               **common, per_device_train_batch_size=4, num_generations=4, max_completion_length=8), seq_len=8,
               device="cpu"),
           "plain": lambda: kit.estimate.estimate("tiny-llama", batch_size=1, seq_len=16, device="cpu")}[setup]()
    assert est.kind == {"dpo": "dpo", "grpo": "grpo", "plain": None}[setup]
    for f in dataclasses.fields(est):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(est, f.name, getattr(est, f.name))
