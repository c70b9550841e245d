"""The panel's Run, stage by stage: each named stage measured as it ends and drawn beside its own estimate.

A run is planned first (:class:`PlannedStage`: a name, the estimate's figure for it, and whether its peak or what
it leaves is read), then run through a :class:`~kit.measure.track.Tracker`; :class:`StageChart` draws the plan with
every finished stage's measurement, and :class:`kit.plot.live.LivePlot` redraws it at each stage's end (inline
backend, inside the panel's ``ipywidgets.Output``). A Trainer run (:func:`staged_run`) has the stages load, step 1
(no optimizer state yet), the later steps, evaluation and cleanup; scenario 2's story plans its folds instead.

Measured bytes are above what was alive before the run (the best reading here: CUDA allocated, or on a CPU the
tensor bytes counted op by op). Under ``cap_bytes`` (:func:`kit.measure.controls.memory_cap`: a CUDA memory fraction,
or on a CPU a live-tensor cap) an out-of-memory error is caught: its stage is marked, the rest stay planned, and
the memory is freed.

>>> from kit.estimate import estimate
>>> plan = trainer_plan(estimate("tiny-gpt2", batch_size=1, seq_len=16), steps=3)
>>> [stage.name for stage in plan]
['load', 'step 1', 'later steps', 'evaluation', 'cleanup']
"""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass

from transformers import TrainerCallback

from kit import machine, plot
from kit.inputs import whole_number
from kit.measure import cleanup, leaks, oom
from kit.measure import device as kdevice
from kit.measure.controls import memory_cap
from kit.measure.track import Tracker
from kit.widgets import runs as panel_runs
from kit.widgets import views

STAGE = dict(collect=False, live_tensors=False, reset_peak=True, tensor_peak=True)   # exact peaks, no gc walk


@dataclass(frozen=True)
class PlannedStage:
    """One stage of a run: its ``name`` (the tracker's stage), the ESTIMATED bytes for it, and what is read of it:
    ``"peak"`` (the most alive while it ran) or ``"end"`` (what it leaves alive, as a cleanup or a release)."""

    name: str
    estimate_bytes: int | None
    reads: str = "peak"


def trainer_plan(est, steps: int) -> list[PlannedStage]:
    """A Trainer run's stages and each one's figure of ``est``: the weights once loaded, step 1's peak (no optimizer
    state during its backward), the later steps' peak, the evaluation's peak, and nothing left after cleanup."""
    plan = [PlannedStage("load", est.weights_bytes), PlannedStage("step 1", est.first_step_peak_bytes)]
    if steps > 1:
        plan.append(PlannedStage("later steps", est.peak_bytes))
    return plan + [PlannedStage("evaluation", est.eval_peak_bytes), PlannedStage("cleanup", 0, "end")]


class StageChart:
    """Draws ``plan`` from a tracker: ``chart(tracker)`` is a Figure (a LivePlot's ``draw``). ``drawn`` keeps, for
    each drawing, the finished stages as ``(name, estimate_bytes, measured_bytes)``, in the plan's order."""

    def __init__(self, plan: list[PlannedStage], *, title: str, limit_bytes: int | None = None,
                 limit_label: str = "limit", measured_label: str = "measured"):
        self.plan, self.title = plan, title
        self.limit_bytes, self.limit_label, self.measured_label = limit_bytes, limit_label, measured_label
        self.base_bytes = 0     # what was alive before the run: set when it starts
        self.drawn: list[list[tuple]] = []

    def rows(self, tracker: Tracker) -> list[dict]:
        done = {r.name: r for r in tracker.records if r.end is not None}
        rows = []
        for stage in self.plan:
            rec = done.get(stage.name)
            value = None if rec is None else rec.peak_bytes if stage.reads == "peak" else rec.end_bytes
            failed = rec is not None and rec.error is not None
            rows.append({"name": stage.name, "estimate_bytes": stage.estimate_bytes, "ran": rec is not None,
                         "oom": failed and "memory" in rec.error.lower(),
                         "measured_bytes": None if value is None or failed else max(0, value - self.base_bytes)})
        return rows

    def __call__(self, tracker: Tracker):
        rows = self.rows(tracker)
        self.drawn.append([(r["name"], r["estimate_bytes"], r["measured_bytes"]) for r in rows if r["ran"]])
        return plot.stages_beside_estimates(rows, self.limit_bytes, self.limit_label, self.title,
                                            self.measured_label)


class StepStages(TrainerCallback):
    """Opens the tracker's stage ``"step 1"`` when the first optimizer step begins and ``"later steps"`` at the
    second; :meth:`close` ends the open one (with the error that stopped the run, so its stage records it)."""

    def __init__(self, tracker: Tracker):
        self.tracker, self.open, self.name = tracker, contextlib.ExitStack(), None

    def on_step_begin(self, args, state, control, **kwargs):
        name = "step 1" if state.global_step == 0 else "later steps"
        if name != self.name:
            self.close()
            self.name = name
            self.open.enter_context(self.tracker.stage(name, **STAGE))

    def close(self, exc: BaseException | None = None) -> None:
        self.name = None
        if exc is None:
            self.open.close()
        else:
            self.open.__exit__(type(exc), exc, exc.__traceback__)
        self.open = contextlib.ExitStack()


def _train_in_stages(setup: dict, steps: int, tracker: Tracker) -> None:
    tok, ds = panel_runs.tokenized(setup["model"], setup["seq_len"], setup["batch_size"] * (steps + 1))
    trainer = model = None
    steps_seen = StepStages(tracker)
    try:
        with tracker.stage("load", **{**STAGE, "live_tensors": True}):   # a loaded file's tensors: walked
            model = panel_runs.build(setup)
        trainer = panel_runs.trainer_for(model, tok, ds.select(range(setup["batch_size"] * steps)), setup, steps,
                                         [steps_seen], eval_dataset=ds.select(range(setup["batch_size"])))
        try:
            trainer.train()
        except BaseException as exc:
            steps_seen.close(exc)
            raise
        steps_seen.close()
        with tracker.stage("evaluation", **STAGE):
            trainer.evaluate()
    finally:
        out = getattr(getattr(trainer, "args", None), "output_dir", None)
        trainer = model = cleanup.release(trainer, model, free_model=model is not None)
        if out:
            shutil.rmtree(out, ignore_errors=True)


def staged_run(setup: dict, *, steps: int, tracker: Tracker, chart: StageChart | None = None,
               cap_bytes: int | None = None) -> dict:
    """Train ``setup`` for ``steps`` optimizer steps, then evaluate one batch, each stage of :func:`trainer_plan`
    measured; under ``cap_bytes`` above what is alive now. Returns the run's record: the setup, ``status`` ("ok",
    "OOM", "refused"), ``oom_stage``, ``stages`` ({name: measured bytes}), ``predicted_peak_bytes`` and
    ``measured_peak_bytes`` (the later steps', or step 1's), ``error``, ``returned`` and ``cap_bytes``."""
    setup, steps = panel_runs.check_setup(setup), whole_number("steps", steps)
    est = panel_runs.estimate_as_run(setup)
    record = dict(setup, status="refused", predicted_peak_bytes=est.peak_bytes, measured_peak_bytes=None,
                  oom_stage=None, stages={}, returned=None, error=panel_runs.refusal(setup, est), cap_bytes=cap_bytes)
    if record["error"]:
        return record
    chart = chart or StageChart(trainer_plan(est, steps), title="")
    panel_runs.files_ready(setup["model"], setup["quantization"])
    base = leaks.take_baseline()
    chart.base_bytes = base.snapshot.best_bytes or 0
    cap = None if cap_bytes is None else chart.base_bytes + cap_bytes
    with memory_cap(cap):
        result = oom.oom_safe(_train_in_stages, setup, steps, tracker, setup=setup)
    return finish(record, chart, tracker, result, base)


def finish(record: dict, chart: StageChart, tracker: Tracker, result, base) -> dict:
    """The record of a staged run, once its stage "cleanup" has measured what is left (the failed frames of an OOM
    are gone by then): each stage's measurement, where an OOM stopped it, and whether memory came back."""
    with tracker.stage("cleanup"):   # collected, and what is left walked
        cleanup.release()
    rows = chart.rows(tracker)
    record["stages"] = {r["name"]: r["measured_bytes"] for r in rows if r["ran"]}
    record["oom_stage"] = next((r["name"] for r in rows if r["oom"]), None)
    steps = [record["stages"].get(name) for name in ("later steps", "step 1")]
    record["measured_peak_bytes"] = next((b for b in steps if b is not None), None)
    record["status"] = "ok" if result.ok else "OOM"
    record["error"] = None if result.ok else f"at {record['oom_stage'] or 'a stage'}: {result.error}"[:300]
    record["returned"] = leaks.check_returned(base, raise_on_leak=False).ok
    return record


def scaled_cap(run_est, real_est, preset, twin: bool) -> int | None:
    """The cap a Run goes under: for a ``twin``, ``preset``'s GPU scaled by the twin's peak over the real model's
    (both ESTIMATED allocated peaks), so that the twin runs out where the real model would; the preset's own bytes
    where the model runs itself on a GPU; None on a CPU preset, or for a real model on a CPU (no GPU to stand in
    for)."""
    if preset.gpu_bytes is None or real_est is None:
        return None
    if twin:
        return preset.gpu_bytes * run_est.peak_bytes // real_est.peak_bytes
    return preset.gpu_bytes if machine.has_cuda() else None


def trainer_run(setup: dict, steps: int, preset, real_est):
    """The panel's Run of a Trainer setup: ``(chart, go)``, where ``go(tracker)`` runs :func:`staged_run` under
    :func:`scaled_cap` and returns its record, and ``chart`` (a :class:`StageChart`) draws it."""
    est = panel_runs.estimate_as_run(setup)
    cap = scaled_cap(est, real_est, preset, twin=setup.get("twin_of") is not None)
    who = views.run_label(setup)
    title = f"{who}: each stage beside its estimate (as run here)"
    label = "memory cap" if cap is None or setup.get("twin_of") is None else \
        f"cap: {preset.label.split(' (')[0]} scaled to the twin"
    chart = StageChart(trainer_plan(est, steps), title=title, limit_bytes=cap, limit_label=label,
                       measured_label=f"measured ({kdevice.best_reading()})")
    return chart, lambda tracker: staged_run(setup, steps=steps, tracker=tracker, chart=chart, cap_bytes=cap)
