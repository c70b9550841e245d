"""kit.watch / kit.train on real tiny Trainer runs (CPU): out-of-memory errors injected at a chosen step and
phase give a report, not an exception; memory comes back; a completed run's peak sits beside the estimate.
And `%load_ext kit` in a real IPython shell."""
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

import kit
from kit import data, machine, models
from kit.measure import leaks
from kit.units import MiB, fmt_bytes
from kit.watching.report import PHASES

warnings.filterwarnings("ignore", category=FutureWarning)
pytestmark = pytest.mark.skipif(machine.has_cuda(), reason="CPU readings (live tensors); the GPU path is in gpu-check")
B, S = 4, 40          # every row 40 tokens: the logits of a batch are B x S x vocab


@pytest.fixture(scope="module")
def tok():
    return data.shipped_tokenizer()


@pytest.fixture(scope="module")
def ds():
    ids = [[5 + (i * 7 + j) % 4000 for j in range(S)] for i in range(64)]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * S for _ in ids]})


def _trainer(model, ds, tok, tmp_path, callbacks=(), bs=B, **kw):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=3,
                             per_device_train_batch_size=bs, per_device_eval_batch_size=bs, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, **kw)
    return Trainer(model=model, args=args, train_dataset=ds, eval_dataset=ds.select(range(8)),
                   data_collator=data.collator(tok), callbacks=list(callbacks))


class Inject(TrainerCallback):
    """Raise ``exc`` at ``event`` of optimizer step ``step`` (1 = the first)."""

    def __init__(self, event, step, exc):
        self.event, self.step, self.exc = event, step, exc

    def _at(self, event, step):
        if (event, step) == (self.event, self.step):
            raise self.exc

    def on_step_begin(self, args, state, control, **kw):
        self._at("on_step_begin", state.global_step + 1)

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self._at("on_pre_optimizer_step", state.global_step + 1)

    def on_prediction_step(self, args, state, control, **kw):   # inside Trainer.evaluate, after a batch
        self._at("on_prediction_step", state.global_step)


def _oom():
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. (injected)")


@pytest.mark.parametrize("event,step,phase,extra", [
    ("on_step_begin", 2, "forward_backward", {}),
    ("on_pre_optimizer_step", 1, "first_optimizer_step", {}),
    ("on_prediction_step", 1, "evaluation", {"eval_strategy": "steps", "eval_steps": 1}),
])
def test_an_oom_gives_a_report_with_its_step_and_phase(ds, tok, tmp_path, event, step, phase, extra):
    model = models.build_model("tiny-llama")
    base = leaks.take_baseline()                   # the weights, alone
    tr = _trainer(model, ds, tok, tmp_path, [Inject(event, step, _oom())], **extra)
    report = kit.train(tr)                         # does not raise
    assert report.oom and (report.step, report.phase) == (step, phase)
    assert str(report).startswith(f"OUT OF MEMORY at step {step}, during {PHASES[phase]}.")
    assert "OutOfMemoryError: CUDA out of memory" in str(report)
    est, m = tr._kit_watch.estimate, report.measured
    # what was alive, measured, against the estimate's full sizes (exact: both count the same storages)
    assert m["weights"] / est.weights_bytes == 1.0
    if phase == "first_optimizer_step":            # every gradient made, the optimizer state not yet
        assert (m["gradients"] / est.gradients_bytes, m["optimizer state"]) == (1.0, 0)
        assert report.estimate_field == "first_step_peak_bytes"
    else:                                          # grads zeroed after step 1, AdamW's moments alive
        # AdamW's per-parameter `step` counters (a few bytes each) are in the state, not in the estimate
        assert m["gradients"] == 0 and 1.0 <= m["optimizer state"] / est.optimizer_bytes <= 1.0001
        assert report.estimate_field == {"evaluation": "eval_peak_bytes"}.get(phase, "peak_bytes")
    assert report.estimated["total"] == getattr(est, report.estimate_field)
    # the failed frames, the gradients and the optimizer state are gone, though `tr` is still held here
    assert leaks.check_returned(base).ok
    assert tr.optimizer is None and report.freed
    again = kit.train(_trainer(model, ds, tok, tmp_path))
    assert not again.oom and again.step == 3 and str(again).startswith("Completed: 3 optimizer steps")


def test_a_memory_error_inside_the_forward_names_what_held_the_logits(ds, tok, tmp_path):
    model = models.build_model("tiny-llama")
    base = leaks.take_baseline()

    class Arm(TrainerCallback):
        on = False

        def on_step_begin(self, args, state, control, **kw):
            Arm.on = state.global_step + 1 == 2

    def hook(mod, inp, out):                       # where a real OOM happens: in the forward
        if Arm.on:
            raise MemoryError("injected after the lm_head")

    h = model.lm_head.register_forward_hook(hook)
    try:
        report = kit.train(_trainer(model, ds, tok, tmp_path, [Arm()], bs=8))
    finally:
        h.remove()
    assert report.oom and (report.step, report.phase) == (2, "forward_backward")
    assert str(report).startswith("OUT OF MEMORY at step 2, during a later step's forward/backward")
    logits = 8 * S * model.config.vocab_size * 4
    assert report.tensors[0].split("  local")[0].strip() == f"{fmt_bytes(logits)}  float32[8, {S}, 4096]"
    assert "in lm_head's call" in report.tensors[0], report.tensors
    assert report.measured["the rest"] >= logits   # the gc sees what the frames held; autograd's saves it cannot
    assert leaks.check_returned(base).ok


KEEP = {}   # a module global, where a notebook's old model would hide


def test_a_tensor_left_from_an_earlier_run_is_named_with_its_holder(ds, tok, tmp_path):
    KEEP["old_model_weight"] = torch.ones(16 * MiB, dtype=torch.uint8)   # scenario 2: the old fold's model
    try:
        report = kit.train(_trainer(models.build_model("tiny-llama"), ds, tok, tmp_path,
                                    [Inject("on_step_begin", 1, _oom())]))
        assert report.oom and (report.step, report.phase) == (1, "first_forward_backward")
        assert report.estimate_field == "first_step_peak_bytes"
        first = report.tensors[0]
        assert first.startswith(f"{fmt_bytes(16 * MiB):>11}  uint8[16777216]  held by: ") and \
            "KEEP['old_model_weight']" in first, report.tensors
        assert report.measured["the rest"] >= 16 * MiB     # not weights, gradients or optimizer state
    finally:
        KEEP.clear()


def test_other_errors_propagate_after_cleanup(ds, tok, tmp_path):
    model = models.build_model("tiny-llama")
    tr = _trainer(model, ds, tok, tmp_path, [Inject("on_step_begin", 2, ValueError("not about memory"))])
    with pytest.raises(ValueError, match="not about memory"):
        kit.train(tr)
    w = tr._kit_watch
    rec = w.tracker.records[-1]
    assert rec.name == "train" and rec.end is not None and rec.error == "ValueError: not about memory"
    assert kit.watch(tr) is w                      # still attached, once
    assert sum(cb is w.callback for cb in tr.callback_handler.callbacks) == 1


def test_a_completed_run_sets_the_measured_peak_beside_the_estimate(ds, tok, tmp_path):
    # Both readings count every tensor in the process (as CUDA's max allocated would): one model at a time.
    # Between steps (a live-tensor reading after each optimizer step, before zero_grad): the gc walk sees
    # the weights, the gradients and AdamW's moments, and the batch and loss of the step (a few KiB).
    r = kit.train(_trainer(models.build_model("tiny-llama"), ds, tok, tmp_path), every_n_steps=1, live_tensors=True)
    assert not r.oom and r.step == 3 and not r.peak_exact
    assert 1.0 <= r.between_steps_bytes / r.estimate_between_bytes <= 1.005     # measured 1.0003
    # a reading between steps is not the peak's moment: the peak is shown as not taken, with no ratio to its estimate
    assert r.measured_peak_bytes is None and r.ratio is None
    assert ("details: report.text(details=True)" in str(r)) == bool(r.notes)   # the notes, where any, apart
    flat = " ".join(r.text(details=True).split())     # (the report folds long lines)
    peak, between = flat.split("Training peak: not taken")[1].split("Between steps")
    assert f"estimated {fmt_bytes(r.estimate_peak_bytes)} (its step 2 on)" in peak and "ratio" not in peak
    assert f"ratio {r.between_steps_bytes / r.estimate_between_bytes:.3f}" in between
    # tensor_peak: every op watched, so the CPU peak is exact, activations included
    r = kit.train(_trainer(models.build_model("tiny-llama"), ds, tok, tmp_path), tensor_peak=True)
    assert r.peak_exact and 0.995 <= r.ratio <= 1.005                         # measured 1.00005
    flat = " ".join(str(r).split())                   # (the report folds long lines)
    peak = flat[flat.index("Training peak: measured"):].split("Between steps")[0]
    assert f"estimated {fmt_bytes(r.estimate_peak_bytes)} (its step 2 on): ratio {r.ratio:.3f}" in peak
    # no evaluate() ran: said so, never a 0 beside its estimate
    assert not r.eval_ran and r.eval_peak_bytes is None and r.eval_ratio is None
    assert f"Evaluation peak: not run (no evaluate() in this train()); estimated {fmt_bytes(r.estimate_eval_bytes)}" \
        in flat


def test_a_run_that_evaluates_reports_the_training_and_evaluation_peaks_apart(ds, tok, tmp_path):
    # Trainer.evaluate() after each step: its peak (the eval batch's logits, with the optimizer state alive) is not
    # the training peak; each is set beside its own estimate (TensorPeak on the CPU: every op watched)
    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path, eval_strategy="steps", eval_steps=1)
    r = kit.train(tr, tensor_peak=True, plot=False)
    assert not r.oom and r.step == 3 and r.peak_exact and r.eval_ran
    print(f"training {r.ratio:.4f}, step 1 {r.first_step_ratio:.4f}, later {r.later_steps_ratio:.4f}, "
          f"evaluation {r.eval_ratio:.4f}")
    assert 0.98 <= r.ratio <= 1.02                 # measured 1.000 (training / peak_bytes)
    assert 0.98 <= r.first_step_ratio <= 1.02      # measured 1.000 (step 1 / first_step_peak_bytes)
    assert 0.98 <= r.later_steps_ratio <= 1.02     # measured 1.000 (steps 2-3 / peak_bytes)
    assert 0.98 <= r.eval_ratio <= 1.02            # measured 1.000 (evaluate() / eval_peak_bytes)
    assert r.eval_peak_bytes != r.measured_peak_bytes
    flat = " ".join(str(r).split())
    assert f"Evaluation peak: measured {fmt_bytes(r.eval_peak_bytes)}" in flat
    assert f"estimated {fmt_bytes(r.estimate_eval_bytes)} (its evaluation): ratio {r.eval_ratio:.3f}" in flat
    assert f"step 1 (no optimizer state yet): measured {fmt_bytes(r.first_step_peak_bytes)}" in flat


def test_watch_attaches_once_and_draws_the_estimate_lines(ds, tok, tmp_path):
    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path)
    w = kit.watch(tr, plot=tmp_path / "frames")
    assert kit.watch(tr) is w and repr(w).startswith("<kit.watch: 0 readings")
    cbs = tr.callback_handler.callbacks
    assert cbs[0] is w.phases and sum(cb is w.callback for cb in cbs) == 1
    tr.train()                                     # the user's own call, unchanged
    assert [s.event for s in w.tracker.samples][::len(w.tracker.samples) - 1] == ["train_begin", "train_end"]
    assert w.live.paths and w.live.paths[-1].read_bytes()[:4] == b"\x89PNG"   # redrawn at the end of train()
    fig = kit.watching.trainer.draw_watch(w.tracker, w.estimate, w.limit_bytes, w.limit_label)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert f"predicted peak {fmt_bytes(w.estimate.peak_bytes)}" in labels and "+ gradients" in " ".join(labels)
    assert "this machine's RAM: fits" in fig.axes[0].texts[-1].get_text()    # far above: said, not drawn
    w.close()
    assert w.phases not in cbs and w.callback not in cbs and "evaluate" not in tr.__dict__


def test_a_trainer_the_estimator_cannot_read_is_watched_without_lines(tmp_path, capsys):
    class Regressor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).mean()}

    ds = Dataset.from_dict({"x": [[1.0, 2.0, 3.0, 4.0]] * 16, "labels": [1.0] * 16})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=2, per_device_train_batch_size=4,
                             report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no")
    tr = Trainer(model=Regressor(), args=args, train_dataset=ds)
    w = kit.watch(tr)
    kit.watch(tr)
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kit.watch: no estimate")]
    assert len(said) == 1 and "UnsupportedModel" in said[0] and w.estimate is None
    r = kit.train(tr)
    assert not r.oom and "no estimate to compare" in str(r)


def test_bad_input_is_one_clear_line():
    with pytest.raises(ValueError,
                       match=r"^kit.watch takes a transformers Trainer \(the one you built\), not a str\.$"):
        kit.watch("trainer")
    with pytest.raises(ValueError, match="not a NoneType"):
        kit.train(None)


# -- %load_ext kit -----------------------------------------------------------------------------------
@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kit")
    yield ip
    ip.run_line_magic("unload_ext", "kit")
    InteractiveShell.clear_instance()


def _line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("kit cell: ")]
    assert len(lines) == 1, out
    return lines[0]


def test_load_ext_prints_each_cells_memory(shell, capsys):
    from IPython.core.error import UsageError

    from kit.measure import cells as cell_memory

    cm = cell_memory.current(shell)
    shell.run_cell("import torch")
    capsys.readouterr()
    shell.run_cell("x = torch.ones(64 * 2**20, dtype=torch.uint8)")      # 64 MiB, every page touched
    r, line = cm.last, _line(capsys.readouterr().out)
    assert 64 * MiB <= r.rss_delta_bytes <= 68 * MiB, line                 # RSS: the tensor + the allocator's slack
    assert r.rss_peak_bytes - r.rss_start_bytes >= r.rss_delta_bytes
    assert line.startswith(f"kit cell: RSS +{fmt_bytes(r.rss_delta_bytes)} (now ") and r.live_end_bytes is None
    shell.run_line_magic("kit_cells", "live")
    shell.run_cell("y = torch.ones(64 * 2**20, dtype=torch.uint8)")
    r, line = cm.last, _line(capsys.readouterr().out)
    assert r.live_delta_bytes == 64 * MiB and "live tensors +64.00 MiB" in line       # exact
    shell.run_cell("del x, y")
    assert cm.last.live_delta_bytes == -128 * MiB
    assert re.search(r"\| \d+\.\d\d s$", _line(capsys.readouterr().out))
    with pytest.raises(UsageError, match="takes one of cheap, live, off, on"):
        shell.run_line_magic("kit_cells", "loud")
    shell.run_line_magic("kit_cells", "off")
    shell.run_cell("z = 1")
    assert "kit cell:" not in capsys.readouterr().out
    shell.run_line_magic("unload_ext", "kit")
    shell.run_line_magic("load_ext", "kit")
    shell.run_line_magic("unload_ext", "kit")
    shell.run_cell("z = 2")
    assert "kit cell:" not in capsys.readouterr().out and cell_memory.current(shell) is None
    shell.run_line_magic("load_ext", "kit")                               # for the fixture's unload


# -- kit.train(trainer, cap_bytes=N): a smaller device, on this CPU -------------------------------------------
def test_a_cap_between_step_1_and_step_2_runs_out_at_step_2_and_is_reported(ds, tok, tmp_path):
    from kit.estimate import estimate_trainer

    model = models.build_model("tiny-llama")
    base = leaks.take_baseline()
    tr = _trainer(model, ds, tok, tmp_path)
    est = estimate_trainer(tr, device="cpu")
    # step 1 peaks without optimizer state in its backward; from step 2 AdamW's moments are alive
    cap = (est.first_step_peak_bytes + est.peak_bytes) // 2
    report = kit.train(tr, cap_bytes=cap)                       # a real OOM inside Trainer.train(), not raised
    assert report.oom and (report.step, report.phase) == (2, "forward_backward")
    assert report.error.startswith("OutOfMemoryError: kit memory cap: live tensors would reach ")
    assert f"over the cap of {fmt_bytes(cap)}" in report.error and report.cap_bytes == cap
    assert str(report).startswith(f"OUT OF MEMORY at step 2, during {PHASES['forward_backward']}.")
    first = " ".join(str(report).split())             # the answer: the figure alive then, by name, and the cap
    assert f"Alive then: {fmt_bytes(report.measured['total'])} (CPU live tensors, measured) of the " \
           f"{fmt_bytes(cap)} cap." in first and len(str(report).splitlines()) <= 15
    assert f"The run had a memory cap of {fmt_bytes(cap)}: CPU live-tensor counter" in report.text(details=True)
    m = report.measured
    assert m["total"] <= cap                                   # the failing op's outputs were never counted
    assert m["weights"] / est.weights_bytes == 1.0 and 1.0 <= m["optimizer state"] / est.optimizer_bytes <= 1.0001
    assert "DOES NOT FIT a GPU with" in report.advice          # the advisor judged the cap
    assert leaks.check_returned(base).ok                       # the dead run's memory came back
    assert tr._kit_watch.limit_bytes == cap and tr._kit_watch.limit_label == "memory cap"


def test_a_cap_in_the_first_forward_is_reported_there(ds, tok, tmp_path):
    model = models.build_model("tiny-llama")
    tr = _trainer(model, ds, tok, tmp_path)
    report = kit.train(tr, cap_bytes=int(1.2 * sum(p.numel() * 4 for p in model.parameters())))
    assert report.oom and (report.step, report.phase) == (1, "first_forward_backward")
    assert report.measured["gradients"] == 0 and report.estimate_field == "first_step_peak_bytes"


def test_a_cap_above_the_estimate_lets_the_run_finish_with_an_exact_peak(ds, tok, tmp_path):
    model = models.build_model("tiny-llama")
    base = leaks.take_baseline()
    tr = _trainer(model, ds, tok, tmp_path)
    from kit.estimate import estimate_trainer

    cap = int(1.1 * estimate_trainer(tr, device="cpu").peak_bytes)
    r = kit.train(tr, cap_bytes=cap)
    assert not r.oom and r.step == 3 and r.peak_exact       # the cap's counter watched every op
    assert 0.995 <= r.ratio <= 1.005                           # measured 1.000, as with tensor_peak=True
    assert r.measured_peak_bytes <= cap and "not reached: the peak used 9" in " ".join(str(r).split())
    del tr
    assert leaks.check_returned(base).ok


def test_a_bad_cap_is_one_clear_line(ds, tok, tmp_path):
    from kit.measure.tensor_peak import TensorPeak

    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path)
    for bad in (-1, 0, 1.5, "1GiB", True):
        with pytest.raises(ValueError, match=r"^cap_bytes must be a positive whole number of bytes \(or None"):
            kit.train(tr, cap_bytes=bad)
    with pytest.raises(ValueError, match="limit_bytes must be a positive whole number of bytes or None"):
        TensorPeak(limit_bytes=0)


def test_load_ext_in_a_real_kernel_reads_a_known_tensor():
    # a real Jupyter kernel (ipykernel over jupyter_client, as a notebook runs), not an in-process shell
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(Path(__file__).resolve().parents[1]))
    try:
        def run(code):
            msg_id, out = kc.execute(code), []
            while True:
                msg = kc.get_iopub_msg(timeout=120)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])
                if msg["msg_type"] == "error":
                    raise AssertionError("\n".join(msg["content"]["traceback"]))
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    return "".join(out)

        run("%load_ext kit")
        run("import torch; _ = torch.ones(64 * 2**20, dtype=torch.uint8); del _")   # torch's first-use costs paid
        line = _line(run("x = torch.ones(64 * 2**20, dtype=torch.uint8)"))
        delta = float(re.match(r"kit cell: RSS \+(\d+\.\d\d) MiB", line)[1])
        assert 64 <= delta <= 68, line                       # the 64 MiB tensor, every page touched
        run("%unload_ext kit")
        assert "kit cell:" not in run("y = 1")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_i35_8_bytes_alive_before_train_that_are_not_this_trainers_are_said_apart(ds, tok, tmp_path):
    """An unrelated 50 MB tensor and a second model alive: the measured peak counts them (every tensor in the
    process, as CUDA's max allocated does), so the report says how many bytes were not this Trainer's, and the
    ratio without them."""
    unrelated = torch.zeros(12_500_000)                        # 50,000,000 bytes
    other = models.build_model("tiny-llama")
    other_bytes = sum(p.untyped_storage().nbytes() for p in other.parameters()) + \
        sum(b.untyped_storage().nbytes() for b in other.buffers())
    r = kit.train(_trainer(models.build_model("tiny-llama"), ds, tok, tmp_path), tensor_peak=True)
    expected = unrelated.untyped_storage().nbytes() + other_bytes
    assert abs(r.others_bytes - expected) <= 64 * 1024, (r.others_bytes, expected)
    flat = " ".join(str(r).split())
    own = (r.measured_peak_bytes - r.others_bytes) / r.estimate_peak_bytes
    assert 0.995 <= own <= 1.005, own
    assert (f"note: {fmt_bytes(r.others_bytes)} were alive before train() and are not this Trainer's (another "
            f"model, tensors you hold): the measured peaks count them; without them the training peak is "
            f"{fmt_bytes(r.measured_peak_bytes - r.others_bytes)}: ratio {own:.3f}") in flat, flat
    del unrelated, other


def test_i50_4_estimate_given_as_text_is_read_as_a_flag_or_refused(ds, tok, tmp_path):
    from kit.inputs import InputError

    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path)
    w = kit.watch(tr, estimate="no", plot=False)             # was: AttributeError when the plot read it
    assert w.estimate is None and w.estimate_error == "not asked for"
    w.close()
    with pytest.raises(InputError, match=r"^kit.watch's estimate must be True \(read it\), False \(none\) or an "
                                         r"Estimate .*not 'maybe'\.$") as e:
        kit.watch(tr, estimate="maybe")
    assert e.value.name == "estimate"


def test_i50_5_a_plot_folder_under_a_file_is_refused_before_training(ds, tok, tmp_path):
    from kit.inputs import InputError

    (tmp_path / "notes.txt").write_text("mine")
    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path / "out")
    with pytest.raises(InputError, match="lies under the file") as e:
        kit.train(tr, plot=tmp_path / "notes.txt" / "plots")    # was: trained to the end, then NotADirectoryError
    assert e.value.name == "plot" and tr.state.global_step == 0 and (tmp_path / "notes.txt").read_text() == "mine"


def test_i50_5_a_plot_that_cannot_be_saved_never_loses_the_finished_runs_report(ds, tok, tmp_path):
    """The folder is fine when the run starts, and a file by the end (as a disk or a folder taken away would be):
    the run finishes, its report comes back, and a note says the plot could not be saved."""
    folder = tmp_path / "plots"

    class TakeTheFolder(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                shutil.rmtree(folder, ignore_errors=True)      # the PNGs drawn so far, if any
                folder.write_text("a file now")

    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path / "out", [TakeTheFolder()])
    r = kit.train(tr, plot=folder)
    assert not r.oom and r.step == 3
    assert any(n.startswith("the live plot could not be saved (FileExistsError") for n in r.notes), r.notes


def test_i47_3_a_stateless_optimizer_has_one_first_step():
    """SGD without momentum keeps no state: only this train()'s first step is "first" (it was every step)."""
    from types import SimpleNamespace

    from kit.watching.trainer import PhaseCallback

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    phases, state = PhaseCallback(), SimpleNamespace(global_step=0)
    phases.on_train_begin(None, state, None)
    seen = []
    for n in range(3):
        state.global_step = n
        phases.on_step_begin(None, state, None, optimizer=opt)
        seen.append(phases.phase)
    assert seen == ["first_forward_backward", "forward_backward", "forward_backward"] and len(opt.state) == 0
