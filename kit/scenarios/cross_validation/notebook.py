"""Notebook-facing helpers of scenario 2 (``notebooks/02_llama3_qlora_cross_validation.ipynb``).

The fold logic is in :mod:`kit.scenarios.cross_validation.fixed_loop` and :mod:`.user_loop`, the
predictions in :mod:`.predict` (imported here too, so that the notebook reads every helper as
``nb.*``); this module turns the loops' records into what a notebook cell shows, so that each cell
stays short:

- :class:`FoldChart`: the fold chart, redrawn live between folds (``on_fold_end``).
- :func:`fold_table`, :func:`broken_text`, :func:`fixed_text`: the loops' records read aloud;
  :func:`simulate_crash`: a crash to resume from.
- :func:`measure_kbit_recipes` / :func:`recipe_table`: what ``prepare_model_for_kbit_training``'s
  fp32 upcast costs (the TRL of the user's post ran it; today's does not), measured beside its estimate.
- :func:`download_ahead` and :func:`workshop_plan` (from :mod:`.workshop`): the model's files fetched in a
  background thread while the teacher talks; the workshop's minutes per section, as a PLAN at real size.
- :func:`fixed_fold_source`: the fixed loop's fold body, to print.

>>> print(fold_table([{"fold": 1, "start_bytes": 1, "peak_bytes": 2, "end_bytes": 1}]))  # doctest: +SKIP
"""
from __future__ import annotations

import gc
import inspect
import math
import shutil
import tempfile
from pathlib import Path

from kit import machine, plot, runtime
from kit.measure import cleanup, leaks
from kit.measure import device as kdevice
from kit.measure.track import Tracker
from kit.plot.live import LivePlot
from kit.scenarios.cross_validation.cap import run_estimate, scaled_cap  # noqa: F401 (the notebook reads nb.*)
from kit.scenarios.cross_validation.fixed_loop import fixed_fold
from kit.scenarios.cross_validation.folds import fold_texts, read_results
from kit.scenarios.cross_validation.predict import (
    advisor_text,
    crash_setting,
    crash_setting_text,
    fold1_leftovers,
    fold2_prediction,
    four_gb_text,
    installed_trl_text,
    options_of,
    recipe_estimates,
    two_models_text,
    upcast_moment_bytes,
    user_estimate,
    weights_split,
)
from kit.scenarios.cross_validation.training import fold_trainer, load_for_training, loop_params
from kit.scenarios.cross_validation.workshop import (  # noqa: F401 (the notebook reads them as nb.*)
    DEFAULT_MODEL,
    DOWNLOAD_PATTERNS,
    DOWNLOADS,
    SLOT_MINUTES,
    TEACHING,
    WORKSHOP_RUN,
    download_ahead,
    workshop_plan,
    workshop_work,
)
from kit.units import fmt_bytes, wrapped


class FoldChart:
    """The fold chart (``kit.plot.folds``), redrawn live: pass it as ``on_fold_end``.

    In a notebook it draws into an ``ipywidgets.Output`` (:class:`kit.plot.live.LivePlot`);
    elsewhere it saves PNGs into ``folder``. Folds with ``models_alive_at_start`` are
    labelled with that count. ``limit_bytes`` defaults to this GPU's memory (none on a CPU).

    >>> chart = FoldChart("broken loop", folder="plots")        # doctest: +SKIP
    >>> run_broken_loop("tiny-llama", folds=3, on_fold_end=chart)   # doctest: +SKIP
    """

    def __init__(self, title: str, *, limit_bytes: int | None = None, folder=None):
        self.title, self.records = title, []
        self.limit_bytes = limit_bytes if limit_bytes is not None else machine.hardware()["gpu_total_bytes"]
        self.live = LivePlot(None, draw=lambda _tracker: self.figure(), folder=folder, min_interval_s=0)

    def __call__(self, fold_records: list) -> None:
        self.records = list(fold_records)
        self.live.update()

    def figure(self):
        """The chart of the folds seen so far (a Figure)."""
        recs = [dict(r, label=f"fold {r['fold']}" + (_alive(r["models_alive_after_load"])
                                                     if r.get("models_alive_after_load") is not None else ""))
                for r in self.records]
        base = self.records[0].get("baseline_bytes") if self.records else None
        return plot.folds(recs, baseline_bytes=base, limit_bytes=self.limit_bytes,
                          title=f"{self.title} ({kdevice.best_reading()})")


def _alive(count: int) -> str:
    return f"\n{count} model{'' if count == 1 else 's'} after load"


def _cell(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def fold_table(fold_records: list) -> str:
    """The fold records as a table (MEASURED): the user's loop by its load and its training, the fixed loop
    by start, peak and end with its checks.

    >>> print(fold_table([{"fold": 1, "start_bytes": 1, "peak_bytes": 2, "end_bytes": 1}]))  # doctest: +SKIP
    """
    b, txt = fmt_bytes, str
    cols = [("start_bytes", "start", b), ("load_peak_bytes", "load peak", b),
            ("models_alive_after_load", "models", txt),
            ("train_peak_bytes", "train peak", b), ("models_alive_in_training", "models", txt),
            ("peak_bytes", "peak", b), ("end_bytes", "end", b), ("adapter_reset_ok", "reset ok", txt),
            ("back_at_baseline", "at baseline", txt), ("eval_loss", "eval loss", lambda value: f"{value:.4f}"),
            ("resumed", "from file", txt)]
    user_loop = any("load_peak_bytes" in r for r in fold_records)
    cols = [c for c in cols if any(c[0] in r for r in fold_records) and not (user_loop and c[0] == "peak_bytes")]
    lines = [f"MEASURED, {kdevice.best_reading()}" + (" (models: loaded models in memory)" if user_loop else "") + ":",
             f"{'fold':>4}" + "".join(f" {t:>11}" for _, t, _ in cols)]
    for r in fold_records:
        lines.append(f"{r['fold']:>4}" + "".join(f" {_cell(r.get(k), f):>11}" for k, _, f in cols)
                     + (f"  OUT OF MEMORY while {'loading' if r.get('oom_during') == 'load' else 'training'}"
                        if r.get("oom") else ""))
    return "\n".join(lines)


def simulate_crash(results_path, keep_folds: int) -> list[int]:
    """Cut a results file back to its first ``keep_folds`` lines, as if the runtime had died
    during the next fold. Returns the folds left in the file.

    >>> simulate_crash("cv-runs/fixed/cv_results.jsonl", 2)      # doctest: +SKIP
    [1, 2]
    """
    path = Path(results_path)
    if not path.exists():
        raise ValueError(f"{path} does not exist: run run_fixed_loop first.")
    lines = path.read_text(encoding="utf-8").splitlines()[:keep_folds]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return sorted(int(k) for k in read_results(path))


def _measure_one(model_name: str, recipe: str, settings: dict, tok, train_ds) -> dict:
    from transformers import set_seed

    baseline = leaks.take_baseline().snapshot.best_bytes
    set_seed(settings["seed"])  # the same LoRA init and data order for both recipes
    model = load_for_training(model_name, settings, recipe)
    gc.collect()
    weights_bytes = kdevice.snapshot().best_bytes - baseline
    tracker, out = Tracker(), tempfile.mkdtemp(prefix="kit-recipes-")
    trainer = fold_trainer(model, train_ds, None, tok, settings, out, 1, tracker)
    with tracker.stage(f"{recipe} recipe", reset_peak=True, collect=False, tensor_peak=True) as stage:
        loss = trainer.train().training_loss
    trainer = cleanup.release(trainer)
    del model
    cleanup.release()
    shutil.rmtree(out, ignore_errors=True)
    return dict(recipe=recipe, weights_bytes=weights_bytes, peak_bytes=stage.peak_bytes, train_loss=loss,
                loss_finite=math.isfinite(loss))


@runtime.once_per_run()
def measure_kbit_recipes(model_name: str, **settings) -> list[dict]:
    """MEASURED: load, apply the standard or the lean recipe, wrap with LoRA and train a few steps.

    Each record: ``recipe``, ``weights_bytes`` (the best reading after load + recipe + peft,
    minus the baseline), ``peak_bytes`` over training, ``train_loss``, ``loss_finite``.
    ``settings`` as :func:`kit.scenarios.cross_validation.fixed_loop.run_fixed_loop`'s.

    >>> [r["recipe"] for r in measure_kbit_recipes("tiny-llama", steps_per_fold=1)]   # doctest: +SKIP
    ['standard', 'lean']
    """
    p = loop_params(**settings)
    tok, splits = fold_texts(model_name, 2, p["max_samples"])
    return [_measure_one(model_name, r, p, tok, splits[0][0]) for r in ("standard", "lean")]


@wrapped
def recipe_table(estimates: dict, measured: list[dict] | None = None) -> str:
    """Standard against lean: estimated weights and peak, and measured ones when given.

    >>> print(recipe_table(recipe_estimates(user_estimate("tiny-llama", batch_size=1, seq_len=30))))  # doctest: +SKIP
    """
    lines = [f"{'recipe':<10}{'weights (est.)':>16}{'peak (est.)':>14}"
             + (f"{'weights (meas.)':>17}{'peak (meas.)':>14}{'train loss':>12}" if measured else "")]
    m = {r["recipe"]: r for r in measured or []}
    for name, est in estimates.items():
        row = f"{name:<10}{fmt_bytes(est.weights_bytes):>16}{fmt_bytes(est.peak_bytes):>14}"
        if name in m:
            row += (f"{fmt_bytes(m[name]['weights_bytes']):>17}{fmt_bytes(m[name]['peak_bytes']):>14}"
                    f"{m[name]['train_loss']:>12.4f}")
        lines.append(row)
    saved = estimates["standard"].weights_bytes - estimates["lean"].weights_bytes
    lines.append(f"the fp32 upcast costs {fmt_bytes(saved)} of weights (ESTIMATED)"
                 + (f", {fmt_bytes(m['standard']['weights_bytes'] - m['lean']['weights_bytes'])} MEASURED ("
                    f"{kdevice.best_reading()})" if {"standard", "lean"} <= m.keys() else ""))
    if measured:
        lines.append("(the estimate is of the longest micro-batch the data can pack, as estimate_trainer reads it; "
                     "a run of a few steps may draw only shorter ones)")
    if measured and not machine.has_cuda():
        lines.append("(on a CPU the measured peak is the most tensor bytes alive at once, counted op by op by the "
                     "kit's live-tensor counter, activations included)")
    return "\n".join(lines)


@wrapped
def broken_text(broken: dict, prediction: dict | None = None) -> str:
    """The user's loop read aloud (MEASURED): where the second model came, and what the training saw.

    ``prediction``, :func:`fold2_prediction` for the model that ran, sets the ESTIMATED moment
    beside the measured one (both counted from the memory before fold 1's load).

    >>> print(broken_text({"folds": [], "oom_at_fold": None}))
    MEASURED: no fold finished.
    """
    folds, oom = broken["folds"], broken["oom_at_fold"]
    if not folds:
        return "MEASURED: no fold finished."
    lines = [f"MEASURED ({kdevice.best_reading()}):"]
    if len(folds) > 1:
        f1, f2 = folds[0], folds[1]
        lines.append(f"  fold 2's load: {f2.get('models_alive_after_load')} models in memory, peak "
                     f"{fmt_bytes(f2['load_peak_bytes'])}; fold 1's load peaked at {fmt_bytes(f1['load_peak_bytes'])}")
        if prediction is not None:
            measured = f2["load_peak_bytes"] - f1["start_bytes"]
            lines.append(f"    above the memory before fold 1: {fmt_bytes(measured)} MEASURED, "
                         f"{fmt_bytes(prediction['load_peak_bytes'])} ESTIMATED "
                         f"({measured / prediction['load_peak_bytes']:.3f}x)")
        if f2.get("train_peak_bytes") is not None:
            lines.append(f"  fold 2's training: {f2.get('models_alive_in_training')} model(s) in memory, peak "
                         f"{fmt_bytes(f2['train_peak_bytes'])}, {f2['train_peak_bytes'] / f1['train_peak_bytes']:.3f}x "
                         f"fold 1's: the old Trainer was let go at `trainer = ...`")
    lines.append(f"  out of memory at fold {oom}, while "
                 f"{'loading' if folds[-1].get('oom_during') == 'load' else 'training'}:"
                 f" caught, recorded, and the memory freed" if oom else
                 f"  no fold ran out of memory on this device: {len(folds)} folds finished")
    return "\n".join(lines)


@wrapped
def fixed_text(fixed: dict, tolerance: float = 0.01) -> str:
    """The fixed loop read aloud (MEASURED): resets verified, memory back at the baseline, flat folds.

    >>> print(fixed_text({"folds": [], "baseline_bytes": None, "oom_at_fold": None}))
    MEASURED: no fold finished.
    """
    folds = fixed["folds"]
    if not folds:
        return "MEASURED: no fold finished."
    ends = [f["end_bytes"] for f in folds]
    spread = max(ends) - min(ends)
    return "\n".join([
        f"MEASURED ({kdevice.best_reading()}), {len(folds)} folds:",
        f"  adapter reset verified at every fold start: {all(f['adapter_reset_ok'] for f in folds)}",
        f"  every fold ended within {tolerance:.0%} of the baseline ({fmt_bytes(fixed['baseline_bytes'])}): "
        f"{all(f['back_at_baseline'] for f in folds)}",
        f"  end memory across folds varies by {fmt_bytes(spread)} ({spread / ends[0]:.2%} of fold 1's end)",
        f"  out of memory: {'at fold ' + str(fixed['oom_at_fold']) if fixed['oom_at_fold'] else 'no'}"])


def crash_settings(settings: dict) -> dict:
    """The loops' settings for the crash under a scaled cap (:func:`scaled_cap`): as given at real size; in smoke
    mode one row of 8 tokens, so that the tiny twin, like the 8B, is mostly its weights (its activations and
    logits would otherwise outweigh them, and no cap could hold one fold but not two models).

    >>> crash_settings({"batch_size": 4, "seq_len": 30})["batch_size"] in (1, 4)
    True
    """
    return {**settings, "batch_size": 1, "seq_len": 8} if runtime.is_smoke() else dict(settings)


def load_moment_figure(broken: dict, fixed: dict, cap: dict | None = None):
    """The user's loop and the fixed one at each fold's load (:func:`kit.plot.load_moment`): the models alive and
    the memory, MEASURED, against the cap of :func:`scaled_cap` when given.

    >>> fig = load_moment_figure({"folds": []}, {"folds": [{"fold": 1, "peak_bytes": 2**20, "models_alive": 1}]})
    """
    return plot.load_moment(broken["folds"], fixed["folds"], cap["cap_bytes"] if cap else None,
                            title=f"At each fold's load, MEASURED ({kdevice.best_reading()})")


def fixed_fold_source() -> str:
    """The fixed loop's fold body (:func:`kit.scenarios.cross_validation.fixed_loop.fixed_fold`), to print."""
    return inspect.getsource(fixed_fold)
