"""Scenario 2's fold logic on the tiny Llama twin (4-bit NF4 through bitsandbytes' CPU backend)."""
import json
import math

import pytest
import torch
import transformers
from peft import get_peft_model
from peft.tuners.lora import LoraLayer

from kit import models
from kit.measure import leaks
from kit.measure.track import Tracker
from kit.scenarios.cross_validation import fixed_loop as cv
from kit.scenarios.cross_validation.folds import (
    ResultsFileError,
    append_result,
    k_fold_indices,
    read_results,
    repair_results,
    run_key,
)
from kit.scenarios.cross_validation.lora_reset import (
    ADVICE_RESET_CODE,
    adapter_state,
    advice_reset,
    lora_config,
    restore_adapter,
    save_adapter_init,
    states_equal,
    verify_adapter_reset,
)
from kit.units import MiB

# Small and fast: 20 rows of at most 32 tokens, one step of batch 4 per fold.
SMALL = dict(batch_size=4, seq_len=32, steps_per_fold=1, max_samples=20)


def _count_train_calls(monkeypatch, fail_at: int | None = None) -> list:
    """Count Trainer.train calls; with fail_at, the fail_at-th call raises a (faked) CUDA OOM."""
    calls, real = [], transformers.Trainer.train

    def train(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (faked by the test)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "train", train)
    return calls


def test_k_fold_indices_cover_every_row_once():
    folds = k_fold_indices(11, 4)
    tests = [t for _, t in folds]
    assert sorted(i for t in tests for i in t) == list(range(11))
    assert [len(t) for t in tests] == [3, 3, 3, 2]
    for train, test in folds:
        assert not set(train) & set(test) and len(train) + len(test) == 11
    for bad in [(5, 1), (3, 4)]:
        with pytest.raises(ValueError, match="k-fold needs"):
            k_fold_indices(*bad)


def test_free_gpu_cache_frees_nothing_of_the_callers():
    """The advice's helper: measured, the caller's trainer keeps its memory, and the leak check names it."""
    base = leaks.take_baseline()
    trainer = torch.ones(8 * MiB, dtype=torch.uint8)   # the caller's name, as in the user's loop
    cv.free_gpu_cache()        # its `del trainer` hits its own (unbound) local and is swallowed
    report = leaks.check_returned(base, raise_on_leak=False)
    assert not report.ok and report.excess_bytes >= 8 * MiB
    assert any("trainer" in h for t in report.tensors for h in t.holders), report.text()
    del trainer                # what frees it: the caller's own del
    assert leaks.check_returned(base).ok


def test_reset_check_catches_a_reset_that_does_nothing():
    assert "if 'lora' in model.named_modules():" in ADVICE_RESET_CODE
    model = get_peft_model(models.load_model("tiny-llama", quantization="4bit"), lora_config(4))
    init = save_adapter_init(model)
    assert verify_adapter_reset(model, init).ok  # freshly wrapped: B = 0, A = init
    with torch.no_grad():                        # stand-in for a fold of training
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.01)
    trained = adapter_state(model)
    assert not states_equal(trained, init)       # the saved init was cloned, not shared

    advice_reset(model)                          # the advice: never enters its `if`
    assert states_equal(adapter_state(model), trained)
    check = verify_adapter_reset(model, init)
    assert not check.ok and not check.lora_b_all_zero and not check.equals_init

    for m in model.modules():                    # peft's reset with False: silently nothing
        if isinstance(m, LoraLayer):
            m.reset_lora_parameters("default", False)
    assert not verify_adapter_reset(model, init).ok

    params = {n: p for n, p in model.named_parameters() if "lora_" in n}
    restore_adapter(model, init)                 # the kit's reset
    check = verify_adapter_reset(model, init)
    assert check.ok and check.lora_b_all_zero and check.equals_init, check.text()
    assert all(p is dict(model.named_parameters())[n] for n, p in params.items())  # in place

    for m in model.modules():                    # peft's real reset re-draws A: B is 0, A is new
        if isinstance(m, LoraLayer):
            m.reset_lora_parameters("default", True)
    check = verify_adapter_reset(model, init)
    assert check.lora_b_all_zero and not check.equals_init and not check.ok


def test_advice_reset_changes_nothing_after_real_training(tmp_path):
    out = cv.show_advice_reset("tiny-llama", output_dir=tmp_path, **SMALL)
    assert out["fold1_changed_adapter"]          # training moved the adapter ...
    assert out["changed_nothing"]                # ... and the advice's reset left it there
    assert not out["check"]["ok"] and out["tensors_compared"] == 8  # 2 layers x (q, v) x (A, B)


def test_broken_loop_has_two_models_alive_while_fold_two_loads_and_survives_oom(tmp_path, monkeypatch):
    _count_train_calls(monkeypatch, fail_at=2)  # fold 2 loads its model, then training "runs out"
    before = cv.count_live_models()
    tracker = Tracker()
    seen = []
    out = cv.run_broken_loop("tiny-llama", folds=2, output_dir=tmp_path, tracker=tracker,
                             on_fold_end=seen.append, **SMALL)
    f1, f2 = out["folds"]
    model_bytes = f1["loaded_bytes"] - f1["start_bytes"]
    assert model_bytes > 1_000_000
    assert f1["models_alive_after_load"] == 1 and f2["models_alive_after_load"] == 2
    assert f1["models_alive_in_training"] == 1          # the faked OOM stops fold 2 before train() begins:
    assert f2.get("models_alive_in_training") is None    # not counted, and not shown as 0
    assert f2["loaded_bytes"] >= f2["start_bytes"] + model_bytes
    # The (faked) OOM in fold 2's training is caught, recorded, and everything is freed.
    assert out["oom_at_fold"] == 2 and f2["oom"] and f2["oom_during"] == "train" and not f1.get("oom")
    assert cv.count_live_models() == before
    assert [len(s) for s in seen] == [1, 2]      # the chart callback saw every fold, the OOM too


def test_an_oom_while_loading_is_recorded_as_such(tmp_path, monkeypatch):
    from kit.scenarios.cross_validation import user_loop as s2_user_loop

    real, calls = s2_user_loop.AutoModelForCausalLM.from_pretrained, []

    def load(*args, **kwargs):  # the user's own from_pretrained line, the second time it runs
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (faked by the test)")
        return real(*args, **kwargs)

    monkeypatch.setattr(s2_user_loop.AutoModelForCausalLM, "from_pretrained", load)
    out = cv.run_broken_loop("tiny-llama", folds=3, output_dir=tmp_path, **SMALL)
    assert out["oom_at_fold"] == 2 and len(out["folds"]) == 2
    f2 = out["folds"][1]
    assert f2["oom"] and f2["oom_during"] == "load" and "train_peak_bytes" not in f2


def test_fixed_loop_is_flat_and_resets_the_adapter(tmp_path):
    out = cv.run_fixed_loop("tiny-llama", folds=5, output_dir=tmp_path, **SMALL)
    folds = out["folds"]
    assert [f["fold"] for f in folds] == out["trained_folds"] == [1, 2, 3, 4, 5]
    first_end = folds[0]["end_bytes"]
    for f in folds:
        assert abs(f["end_bytes"] - first_end) <= 0.01 * first_end, f
        assert f["adapter_reset_ok"] and f["back_at_baseline"]
        assert f["start_bytes"] <= f["peak_bytes"] and math.isfinite(f["eval_loss"])
    lines = (tmp_path / "cv_results.jsonl").read_text().splitlines()
    assert [json.loads(line)["fold"] for line in lines] == [1, 2, 3, 4, 5]
    assert out["oom_at_fold"] is None


def test_fixed_loop_resumes_after_a_crash(tmp_path, monkeypatch):
    calls = _count_train_calls(monkeypatch)
    results = tmp_path / "cv.jsonl"

    def crash_after_fold_2(folds):
        if len(folds) == 2:
            raise RuntimeError("the runtime died")

    with pytest.raises(RuntimeError, match="runtime died"):
        cv.run_fixed_loop("tiny-llama", folds=3, output_dir=tmp_path, results_path=results,
                          on_fold_end=crash_after_fold_2, **SMALL)
    assert sorted(read_results(results)) == [1, 2] and len(calls) == 2
    out = cv.run_fixed_loop("tiny-llama", folds=3, output_dir=tmp_path, results_path=results, **SMALL)
    assert len(calls) == 3 and out["trained_folds"] == [3]   # folds 1-2 were not retrained
    assert [f.get("resumed", False) for f in out["folds"]] == [True, True, False]
    with pytest.raises(ValueError, match="other settings"):  # never mix two runs' folds
        cv.run_fixed_loop("tiny-llama", folds=3, output_dir=tmp_path, results_path=results,
                          **{**SMALL, "lora_r": 16})


def test_scenario2_summary_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(cv, "run_broken_loop", lambda *a, **k: {
        "folds": [{"fold": 1, "start_bytes": 1, "peak_bytes": 2, "end_bytes": 1, "train_loss": 0.1}],
        "oom_at_fold": None, "cap_bytes": None, "cap": "no cap"})
    monkeypatch.setattr(cv, "show_advice_reset", lambda *a, **k: {"changed_nothing": True,
                                                                  "fold1_changed_adapter": True})
    monkeypatch.setattr(cv, "run_fixed_loop", lambda *a, **k: {"folds": [
        {"fold": 1, "start_bytes": 1, "peak_bytes": 2, "end_bytes": 1, "adapter_reset_ok": True, "eval_loss": 1.0,
         "models_alive": 1}], "oom_at_fold": None, "cap_bytes": None, "cap": "no cap"})
    s2 = cv.run_scenario2(output_dir=tmp_path)
    assert s2 == {"broken": {"folds": [{"start_bytes": 1, "peak_bytes": 2, "end_bytes": 1}], "oom_at_fold": None},
                  "fixed": {"folds": [{"start_bytes": 1, "peak_bytes": 2, "end_bytes": 1, "models_alive": 1,
                                       "adapter_reset_ok": True}], "oom_at_fold": None},
                  "cap_bytes": None, "cap": "no cap", "recipe": "today's TRL", "advice_reset_changed_nothing": True}


# ---- the results file: never lose a finished fold ---------------------------------------------
def _lines(path):
    return path.read_text().splitlines()


def _rec(fold, key="k", **kw):
    """A finished fold's record, as the fixed loop writes it (the figures the table and the plot read)."""
    return {"fold": fold, "run_key": key, "start_bytes": 100, "peak_bytes": 300, "end_bytes": 100,
            "eval_loss": 2.0, **kw}


def _line(fold, key="k", **kw):
    return json.dumps(_rec(fold, key, **kw))


def test_a_torn_last_line_does_not_swallow_the_next_fold(tmp_path):
    path = tmp_path / "r.jsonl"
    append_result(path, _rec(1, eval_loss=2.0))
    with open(path, "a") as f:
        f.write('{"fold": 2, "run_k')          # the crash hit mid-write
    assert list(read_results(path, "k")) == [1]
    append_result(path, _rec(2, eval_loss=1.9))   # the rerun's fold 2
    append_result(path, _rec(3, eval_loss=1.8))
    assert sorted(read_results(path, "k", folds=3)) == [1, 2, 3]
    assert [json.loads(line)["fold"] for line in _lines(path)] == [1, 2, 3]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(_line(1))                    # e.g. saved by an editor without the final newline
    append_result(path, _rec(2))
    assert sorted(read_results(path, "k")) == [1, 2]


@pytest.mark.parametrize("bad,problem", [
    ("{not json", "not valid JSON"), ("[1, 2]", "JSON list, not a fold record"),
    ("null", "JSON NoneType, not a fold record"), ('{"eval_loss": 2.0}', '"fold" is None'),
    ('{"fold": "two"}', "\"fold\" is 'two'"), ('{"fold": 0}', "fold 0 is below 1"),
])
def test_an_unreadable_middle_line_is_refused_by_number(tmp_path, bad, problem):
    path = tmp_path / "r.jsonl"
    path.write_text(_line(1) + "\n" + bad + "\n" + _line(2) + "\n")
    with pytest.raises(ResultsFileError) as exc:
        read_results(path, "k")
    msg = str(exc.value)
    assert msg.startswith(f"{path}, line 2: ") and problem in msg and "repair_results(" in msg, msg
    assert "\n" not in msg
    out = repair_results(path)                   # the remedy keeps both finished folds
    assert (out["kept"], out["set_aside"]) == (2, 1)
    assert sorted(read_results(path, "k")) == [1, 2]
    assert (tmp_path / "r.jsonl.unreadable").read_text() == bad + "\n"   # set aside, not deleted


def test_a_fold_beyond_folds_is_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    for fold in (1, 7):
        append_result(path, _rec(fold))
    assert sorted(read_results(path, "k")) == [1, 7]
    with pytest.raises(ResultsFileError, match=r"line 2: fold 7 is outside this run's folds 1..3.*folds=3"):
        read_results(path, "k", folds=3)
    assert repair_results(path, folds=3)["kept"] == 1 and sorted(read_results(path, "k", folds=3)) == [1]


class _Stop(Exception):
    pass


def _stop_before_training(monkeypatch):
    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(cv, "fold_texts", stop)


@pytest.mark.parametrize("bad", ["[1, 2]", "null", _line(9, "KEY"), _line(1, "KEY"), _line(2, "KEY", eval_loss="nan?"),
                                 json.dumps({"fold": 2, "run_key": "KEY", "eval_loss": 1.5})])
def test_fixed_loop_refuses_a_bad_results_file_before_training(tmp_path, monkeypatch, bad):
    _stop_before_training(monkeypatch)
    key = run_key("tiny-llama", {"folds": 3, **cv.loop_params(**SMALL)})
    path = tmp_path / "cv.jsonl"
    path.write_text(_line(1, key) + "\n" + bad.replace("KEY", key) + "\n")
    with pytest.raises(ResultsFileError, match="line 2: .*repair_results"):
        cv.run_fixed_loop("tiny-llama", folds=3, results_path=path, **SMALL)


def test_other_settings_keep_the_file_and_resume_false_moves_it_aside(tmp_path, monkeypatch):
    _stop_before_training(monkeypatch)
    path = tmp_path / "cv.jsonl"
    key = run_key("tiny-llama", {"folds": 3, **cv.loop_params(**SMALL)})
    append_result(path, _rec(1, key))
    before = path.read_text()
    with pytest.raises(ResultsFileError, match="other settings.*left as it is.*another output_dir"):
        cv.run_fixed_loop("tiny-llama", folds=3, results_path=path, **{**SMALL, "lora_r": 16})
    assert path.read_text() == before
    with pytest.raises(_Stop):                   # resume=False: the old folds move aside, never deleted
        cv.run_fixed_loop("tiny-llama", folds=3, results_path=path, resume=False, **SMALL)
    assert not path.exists() and (tmp_path / "cv.before-1.jsonl").read_text() == before


# ---- the loops' settings read the way users mean them ------------------------------------------
def test_settings_are_read_not_guessed():
    import numpy as np

    p = cv.loop_params(lora_targets="q_proj,v_proj", batch_size=np.int64(2), steps_per_fold="3")
    assert p["lora_targets"] == ["q_proj", "v_proj"] and p["batch_size"] == 2 and p["steps_per_fold"] == 3
    assert cv.loop_params(lora_targets="all-linear")["lora_targets"] == "all-linear"
    assert cv.loop_params()["lora_targets"] == ["q_proj", "v_proj"]     # the run key of old files stays the same
    for steps in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="^steps_per_fold must be a whole number >= 1"):
            cv.loop_params(steps_per_fold=steps)
    with pytest.raises(ValueError, match="^lora_targets must be module names"):
        cv.loop_params(lora_targets=[1, 2])
    with pytest.raises(ValueError, match="^folds must be a whole number >= 2"):
        cv.run_fixed_loop("tiny-llama", folds=0, **SMALL)
    with pytest.raises(ValueError, match="^resume must be True or False"):
        cv.run_fixed_loop("tiny-llama", folds=3, resume="sometimes", **SMALL)
    assert lora_config(8, "all-linear").target_modules == "all-linear"


def test_a_comma_string_of_targets_trains(tmp_path):
    out = cv.show_advice_reset("tiny-llama", output_dir=tmp_path, **{**SMALL, "lora_targets": "q_proj, v_proj"})
    assert out["tensors_compared"] == 8          # 2 layers x (q, v) x (A, B), not one adapter per character


# ---- the results file's bad cases: one sentence each, nothing lost ------------------------------------
def _read_only(monkeypatch, path):
    """The OS refusing to write ``path`` (as a read-only file or mount does; chmod alone does not stop root)."""
    import builtins

    from kit.scenarios.cross_validation import folds

    def guarded(file, mode="r", *a, **kw):
        if str(file) == str(path) and any(c in mode for c in "aw+"):
            raise PermissionError(13, "Permission denied", str(file))
        return builtins.open(file, mode, *a, **kw)

    monkeypatch.setattr(folds, "open", guarded, raising=False)


def test_a_read_only_results_file_is_refused_before_any_fold_trains(tmp_path, monkeypatch):
    calls = _count_train_calls(monkeypatch)
    path = tmp_path / "cv.jsonl"
    path.write_text("")
    _read_only(monkeypatch, path)
    with pytest.raises(ResultsFileError, match=r"cannot write the results file .*cv.jsonl \(Permission denied\)"
                                               r".*nothing was trained") as e:
        cv.run_fixed_loop("tiny-llama", folds=3, results_path=path, output_dir=tmp_path, **SMALL)
    assert calls == [] and e.value.name == "results_path"


def test_a_fold_that_cannot_be_written_keeps_its_figures_in_the_message(tmp_path, monkeypatch):
    path = tmp_path / "cv.jsonl"
    _read_only(monkeypatch, path)
    with pytest.raises(ResultsFileError, match=r"cannot write fold 2's record") as e:
        append_result(path, _rec(2, eval_loss=1.25))
    assert json.loads(str(e.value).split("once it is writable: ", 1)[1]) == _rec(2, eval_loss=1.25)


@pytest.mark.parametrize("bad,problem", [
    (json.dumps({"fold": 2, "run_key": "k", "eval_loss": 1.9}), "fold 2 lacks start_bytes, peak_bytes, end_bytes"),
    (_line(2, eval_loss="1.9"), "fold 2's eval_loss is '1.9', not a number"),
    (_line(2, peak_bytes=-5), "fold 2's peak_bytes is -5, not a whole number of bytes"),
    (_line(1, eval_loss=1.7), "fold 1 is there a second time (first at line 1)"),
])
def test_an_incomplete_or_repeated_fold_is_refused_and_repair_keeps_the_good_ones(tmp_path, bad, problem):
    from kit.scenarios.cross_validation.notebook import fold_table

    path = tmp_path / "r.jsonl"
    path.write_text(_line(1) + "\n" + bad + "\n" + _line(3) + "\n")
    with pytest.raises(ResultsFileError) as e:
        read_results(path, "k")
    assert str(e.value).startswith(f"{path}, line 2: {problem}") and "repair_results(" in str(e.value)
    assert repair_results(path)["set_aside"] == 1 and (tmp_path / "r.jsonl.unreadable").read_text() == bad + "\n"
    done = read_results(path, "k")
    assert sorted(done) == [1, 3] and done[1]["eval_loss"] == 2.0          # the first fold 1 is the one kept
    assert "2.0000" in fold_table(list(done.values()))                     # what is accepted, the table can show


def test_a_folder_as_the_results_path_is_one_sentence(tmp_path):
    for call in (lambda: read_results(tmp_path, "k"), lambda: read_results(tmp_path),
                 lambda: repair_results(tmp_path)):
        with pytest.raises(ResultsFileError, match=r"is a folder, not a results file: pass the file's path"):
            call()
    with pytest.raises(ResultsFileError, match=r"cannot write fold 1's record .* is a folder") as e:
        append_result(tmp_path, _rec(1))
    assert '"eval_loss": 2.0' in str(e.value)
