"""The tracker: exact stage deltas, peaks, the Trainer callback, export and read-back."""
import builtins
import functools
import json

import pytest
import torch

from kit import machine
from kit.measure import device
from kit.measure.records import stage_peak
from kit.measure.track import Tracker
from kit.units import MiB


def test_stage_records_exact_live_delta_of_a_known_allocation():
    t = Tracker()
    with t.stage("alloc") as rec:
        x = torch.ones(64 * MiB, dtype=torch.uint8)
    assert rec.end.live("cpu") - rec.start.live("cpu") == 64 * MiB
    with t.stage("free") as rec2:
        del x
    assert rec2.end.live("cpu") - rec2.start.live("cpu") == -64 * MiB
    if not machine.has_cuda():       # the best reading is CPU live tensors there
        assert (rec.delta_bytes, rec2.delta_bytes) == (64 * MiB, -64 * MiB)


@pytest.mark.skipif(machine.has_cuda(), reason="CPU peak counters")
def test_cpu_stage_peak_sees_a_temporary_allocation():
    t = Tracker()
    with t.stage("temporary") as rec:
        y = torch.ones(96 * MiB, dtype=torch.uint8)    # pages touched: RSS really rises
        del y
    assert rec.reset_peak and rec.rss_peak_exact
    assert rec.rss_peak_bytes - rec.start.rss_bytes >= 90 * MiB
    assert rec.end.live("cpu") == rec.start.live("cpu")
    # the live-tensor peak is a lower bound: the tensor came and went between readings
    assert rec.peak_bytes == rec.start.live("cpu") and not rec.peak_exact


@pytest.mark.skipif(machine.has_cuda(), reason="CPU peak counters")
def test_tensor_peak_makes_the_cpu_peak_exact(tmp_path):
    t = Tracker()
    with t.stage("temporary", collect=False, tensor_peak=True) as rec:
        y = torch.ones(32 * MiB, dtype=torch.uint8)
        z = y + 1                                      # a second 32 MiB while the first is alive
        del y, z
    assert rec.peak_exact and rec.peak_bytes - rec.start_bytes == 64 * MiB
    assert rec.end_bytes == rec.start_bytes and "exact" in rec.peak_note
    t.to_csv(tmp_path / "t.csv")
    assert Tracker.load(tmp_path / "t.csv").records[0].peak_exact


def test_repeated_stages_are_indexed_and_errors_kept():
    t = Tracker()
    for _ in range(3):
        with t.stage("fold", collect=False):       # no gc.collect: nothing to collect, and it is slow
            pass
    with pytest.raises(torch.OutOfMemoryError):
        with t.stage("fold", collect=False):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert [r.index for r in t.records] == [0, 1, 2, 3]
    assert t.records[-1].error.startswith("OutOfMemoryError: CUDA out of memory")
    folds = t.folds("fold")
    assert len(folds) == 4 and folds[-1]["oom"] and not folds[0]["oom"]
    assert set(folds[0]) >= {"start_bytes", "peak_bytes", "end_bytes"}
    text = t.summary()
    assert "fold #1" in text and "fold #4" in text and "OutOfMemoryError" in text


def test_peak_rule_without_resetting_the_global_counter():
    # the peak rose during the stage: its end value is the stage's peak, exactly
    assert stage_peak(False, 100, 150, [120]) == (150, True, "the process peak rose during the stage")
    # stayed under an earlier peak: the highest reading seen, not exact
    peak, exact, _ = stage_peak(False, 200, 200, [120, 130])
    assert (peak, exact) == (130, False)
    # someone (Trainer's memory metrics) reset it inside the stage
    peak, exact, note = stage_peak(False, 200, 90, [120])
    assert (peak, exact) == (120, False) and "another tool" in note
    assert stage_peak(True, 100, 110, [105])[:2] == (110, True)


def test_export_json_and_csv_read_back(tmp_path):
    t = Tracker()
    with t.stage("load", collect=False):
        x = torch.ones(MiB, dtype=torch.uint8)
        t.sample(step=1)
        t.sample(step=2, live_tensors=False)
    with t.stage("fold", collect=False):
        with t.stage("inner", collect=False, live_tensors=False):
            del x
    for name in ("t.json", "t.csv"):
        path = tmp_path / name
        t.to_json(path) if name.endswith("json") else t.to_csv(path)
        back = Tracker.load(path)
        assert [r.to_dict() for r in back.records] == [r.to_dict() for r in t.records], name
        assert [s.to_dict() for s in back.samples] == [s.to_dict() for s in t.samples], name
        assert back.summary() == t.summary()
    assert json.loads(t.to_json())["reading"] == device.best_reading()
    (tmp_path / "x.txt").write_text("{}")
    with pytest.raises(ValueError, match="json or .csv"):
        Tracker.load(tmp_path / "x.txt")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a kit tracker"):
        Tracker.load(tmp_path / "other.json")


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="reset_peak"):
        Tracker(reset_peak="sometimes")
    t = Tracker()
    with pytest.raises(ValueError, match="non-empty name"):
        with t.stage(""):
            pass
    with pytest.raises(ValueError, match="every_n_steps"):
        t.callback(every_n_steps=0)
    with pytest.raises(ValueError, match="overhead"):
        t.callback(overhead=5)


# -- inside a real Trainer on the tiny twin ------------------------------------------
@functools.lru_cache(maxsize=None)
def _data():
    from kit import data

    tok = data.load_tokenizer("tiny-gpt2")
    return tok, data.tokenize(data.load_text_dataset()["train"].select(range(200)), tok, max_length=32)


def _trainer(tmp_path, callbacks, steps):
    from transformers import Trainer, TrainingArguments

    from kit import data
    from kit.models import build_model

    tok, ds = _data()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, use_cpu=True,
                             report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    return Trainer(model=build_model("tiny-gpt2"), args=args, train_dataset=ds, data_collator=data.collator(tok),
                   callbacks=callbacks)


def _param_bytes(model) -> int:
    return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())


def test_callback_samples_inside_trainer_train(tmp_path):
    t = Tracker()
    cb = t.callback(every_n_steps=2, live_tensors=True)
    trainer = _trainer(tmp_path, [cb], steps=4)
    with t.stage("train"):
        trainer.train()
    events = [(s.event, s.step) for s in t.samples]
    assert events == [("train_begin", 0), ("step", 2), ("step", 4), ("train_end", 4)]
    assert all(s.stage == "train" and s.stage_index == 0 for s in t.samples)
    # read after the optimizer step: weights + gradients + AdamW's two moments are all alive
    weights = _param_bytes(trainer.model)
    step = [s for s in t.samples if s.event == "step"]
    assert all(s.snap.live("cpu") - t.records[0].start.live("cpu") >= 3 * weights for s in step)
    assert t.records[0].live_peak_bytes["cpu"] >= t.records[0].start.live("cpu") + 3 * weights
    assert cb.spent_s > 0


def test_callback_budget_keeps_sampling_cheap(tmp_path):
    t = Tracker()
    cb = t.callback(overhead=0.01, min_interval_s=0)   # adaptive: N chosen from the time budget
    trainer = _trainer(tmp_path, [cb], steps=12)
    trainer.train()
    steps = [s for s in t.samples if s.event == "step"]
    assert 1 <= len(steps) <= 12
    assert not any(s.has_live for s in t.samples[:1])   # no gc walk at train begin by default
    elapsed = t.samples[-1].snap.time - t.samples[0].snap.time
    one = max(s.cost_s for s in t.samples)
    assert cb.spent_s <= 0.01 * elapsed + 2 * one       # within budget, give or take a reading


@pytest.mark.gpu
def test_cuda_stage_deltas_and_peak_without_resetting():
    t = Tracker()
    with t.stage("alloc") as rec:
        x = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
    assert rec.delta_bytes == 64 * MiB                      # CUDA allocated: blocks of 2 MiB, exact here
    before = torch.cuda.max_memory_allocated()
    with t.stage("temporary") as rec:
        y = torch.ones(before + 256 * MiB, dtype=torch.uint8, device="cuda")   # a new process peak
        del y
    assert rec.cuda_peak_exact and not rec.reset_peak
    assert rec.cuda_peak_bytes >= rec.start_bytes + before + 256 * MiB
    assert torch.cuda.max_memory_allocated() >= before      # never reset behind anyone's back
    with t.stage("under the old peak") as rec:
        z = torch.ones(MiB, dtype=torch.uint8, device="cuda")
    assert rec.cuda_peak_exact is False and "earlier peak" in rec.peak_note
    del x, z


def test_a_stage_without_a_live_reading_says_not_read_never_zero():
    t = Tracker()
    x = torch.ones(MiB, dtype=torch.uint8)
    with t.stage("quick", live_tensors=False, collect=False) as rec:
        pass
    assert rec.start.live("cpu") is None and rec.end.live_tensor_bytes is None
    if not machine.has_cuda():
        assert rec.start_bytes is None and rec.delta_bytes is None and rec.peak_bytes is None
        assert "not read" in t.summary().splitlines()[-1]
    assert "live tensors: not read" in rec.start.text()
    if not machine.has_cuda():
        from kit import plot

        ax = plot.stage_bars(t).axes[0]
        assert "not read" in [txt.get_text() for txt in ax.texts]   # where the live-tensor bar would be
        assert len(ax.containers[0]) == 0                            # and no 0-high bar stands for it
    del x


@pytest.mark.skipif(machine.has_cuda(), reason="CPU peak counters")
def test_a_reset_inside_a_stage_means_its_peak_is_not_exact():
    t = Tracker(reset_peak=False)
    with t.stage("outer") as outer:
        with t.stage("inner", reset_peak=True):        # resets the process's RSS peak inside "outer"
            pass
        y = torch.ones(64 * MiB, dtype=torch.uint8)   # and the peak climbs back above outer's start
        del y
    assert outer.rss_peak_exact is False
    assert "reset inside the stage" in outer.peak_note


@pytest.mark.skipif(machine.has_cuda(), reason="CPU peak counters")
def test_a_failed_rss_reset_is_not_reported_as_exact(monkeypatch):
    big = torch.ones(256 * MiB, dtype=torch.uint8)    # an earlier, higher RSS peak
    del big

    def no_write(path, *a, **k):    # /proc/self/clear_refs unwritable (a sandbox); reads still work
        if str(path).endswith("clear_refs"):
            raise PermissionError(13, "Permission denied", path)
        return builtins.open(path, *a, **k)

    monkeypatch.setattr(device, "open", no_write, raising=False)
    t = Tracker()
    with t.stage("small", reset_peak=True) as rec:
        z = torch.ones(MiB, dtype=torch.uint8)
        del z
    assert rec.rss_peak_exact is False                  # the old code said "reset at stage start", exact
    assert rec.rss_peak_bytes < rec.start.rss_peak_bytes  # not the earlier 256 MiB peak
    assert "failed" in rec.peak_note
