"""Notebook-facing helpers of scenario 2 (``notebooks/02_llama3_qlora_cross_validation.ipynb``).

The fold logic is in :mod:`kit.scenarios.s2_cross_validation`; this module only turns its
results and the estimator's into what a notebook cell shows, so that each cell stays short:


- :func:`weights_split` / :func:`four_gb_text`: the 4-bit model as loaded, its 16-bit parts
  named, against the advice's "about 4 GB".
- :func:`two_models_text`: one fold, then fold 2 with fold 1's model still alive, against a GPU.
- :func:`advisor_text`: the fit advisor on one fold, and on fold 2 beside fold 1's leftovers.
- :class:`FoldChart`: the fold chart, redrawn live between folds (``on_fold_end``).
- :func:`fold_table`, :func:`broken_text`, :func:`fixed_text`: the loops' records read aloud;
  :func:`simulate_crash`: a crash to resume from.
- :func:`recipe_estimates` / :func:`measure_kbit_recipes`: what ``prepare_model_for_kbit_training``'s
  fp32 upcast costs, estimated and measured.

>>> print(four_gb_text(estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512,
...                             quantization="4bit", lora_r=8)))          # doctest: +SKIP
"""
from __future__ import annotations

import gc
import math
import shutil
import tempfile
from pathlib import Path

from .. import cleanup, leaks
from .. import device as kdevice
from .. import inputs as kin
from .. import models as kmodels
from .. import plot, runtime
from ..estimate import estimate
from ..live import LivePlot
from ..presets import PRESETS, Preset
from ..track import Tracker
from ..units import fmt_bytes, wrapped
from .s2_folds import fold_data, read_results
from .s2_training import _params, _trainer, load_for_training


def weights_split(model_name: str) -> list[tuple[str, int]]:
    """The parameters that 4-bit/8-bit loading leaves in 16 bits, grouped: ``[(part, params)]``.

    bitsandbytes replaces the ``nn.Linear`` layers of the blocks; the embedding, ``lm_head``
    (transformers keeps the output layer out) and the norms stay in the load dtype. Counted
    on the meta device (no memory); a tied ``lm_head`` counts once, at the embedding.

    >>> dict(weights_split("meta-llama/Meta-Llama-3-8B"))["lm_head"]
    525336576
    """
    from torch import nn

    model = kmodels.build_model(model_name, device="meta")
    norms = sum(1 for n, _ in model.named_modules() if "norm" in n.split(".")[-1])
    seen, parts = set(), {}
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(mod, nn.Linear) and name != "lm_head":
                continue  # quantized
            part = f"{norms} norms" if "norm" in name.split(".")[-1] else name
            parts[part] = parts.get(part, 0) + p.numel()
    return sorted(parts.items(), key=lambda kv: -kv[1])


@wrapped
def four_gb_text(est, model_name: str | None = None) -> str:
    """The advice's "about 4 GB" against the kit's arithmetic, for a 4-bit estimate.

    ``est`` is a :func:`kit.estimate.estimate` with ``quantization="4bit"``. The "4 GB" is
    every parameter at half a byte; as loaded, the NF4 layers also keep their block
    scales, and the parts in :func:`weights_split` stay in 16 bits.

    >>> "16 bits" in four_gb_text(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8))
    True
    """
    if est.setup.get("quantization") != "4bit":
        raise ValueError("four_gb_text needs a 4-bit estimate: estimate(..., quantization='4bit').")
    name = model_name or est.setup["model"]
    base_params = est.quantized_params + est.unquantized_params
    naive_bytes = base_params // 2
    sixteen_bytes = 2 * est.unquantized_params if est.setup.get("load_dtype") in ("bf16", "fp16") \
        else 4 * est.unquantized_params
    nf4_bytes = est.loaded_weights_bytes - sixteen_bytes
    parts = ", ".join(f"{p} ({n:,})" for p, n in weights_split(name))
    return "\n".join([
        f"{name}, loaded in 4 bits (ESTIMATED, on the meta device; no weights needed):",
        f"  every one of {base_params:,} parameters at 4 bits (the 'about 4 GB'): {fmt_bytes(naive_bytes)}",
        f"  NF4 layers, {est.quantized_params:,} params with their double-quantized block scales: "
        f"{fmt_bytes(nf4_bytes)}",
        f"  kept in 16 bits, {est.unquantized_params:,} params: {fmt_bytes(sixteen_bytes)} — {parts}",
        f"  the model as loaded: {fmt_bytes(est.loaded_weights_bytes)} = {est.loaded_weights_bytes:,} bytes, "
        f"{est.loaded_weights_bytes / naive_bytes:.2f}x the 'about 4 GB' figure",
        f"  after prepare_model_for_kbit_training (16-bit parts upcast to fp32, LoRA added): "
        f"{fmt_bytes(est.weights_bytes)}"])


def upcast_moment_bytes(model_name: str) -> int:
    """The bytes a 4-bit load holds for a moment beyond the loaded model, ESTIMATED: the 16-bit copy of the
    last 16-bit parameter, alive beside its fp32 upcast (``prepare_model_for_kbit_training`` upcasts one
    parameter at a time, in order, so the last one comes when all the others are fp32 already).

    >>> upcast_moment_bytes("meta-llama/Meta-Llama-3-8B") == 2 * 525336576   # lm_head, last, in bf16
    True
    """
    from torch import nn

    last = 0
    for name, mod in kmodels.build_model(model_name, device="meta").named_modules():
        if isinstance(mod, nn.Linear) and name != "lm_head":
            continue  # quantized: never upcast
        for p in mod.parameters(recurse=False):
            last = 2 * p.numel()
    return last


def fold1_leftovers(est) -> int:
    """What fold 1's Trainer still holds when fold 2 starts: its model (after the k-bit recipe) and its
    optimizer state, in bytes, ESTIMATED."""
    return est.weights_bytes + est.optimizer_bytes


def fold2_prediction(est) -> dict:
    """Where the user's loop doubles, ESTIMATED from one fold's estimate: bytes at three moments.

    - ``leftover_bytes``: what fold 1's Trainer still holds when fold 2 starts loading;
    - ``loaded_bytes``: fold 2's model loaded beside them (two models alive), and
      ``load_peak_bytes``: that, plus the moment of the last fp32 upcast (:func:`upcast_moment_bytes`);
    - ``train_peak_bytes``: fold 2 training, after ``trainer = ...`` let the old Trainer go:
      one fold's peak, as in fold 1.

    >>> p = fold2_prediction(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8))
    >>> p["loaded_bytes"] > p["leftover_bytes"]
    True
    """
    old = fold1_leftovers(est)
    loaded = old + est.weights_bytes
    return {"leftover_bytes": old, "loaded_bytes": loaded,
            "load_peak_bytes": loaded + upcast_moment_bytes(est.setup["model"]), "train_peak_bytes": est.peak_bytes}


def _verdict(n: int, limit: int) -> str:
    return "fits" if n <= limit else f"DOES NOT FIT ({fmt_bytes(n - limit)} over)"


def two_models_text(est, preset: str = "colab-t4") -> str:
    """One fold's predicted peak, then the moment fold 2 loads beside fold 1's leftovers, then fold 2 training.

    The user's loop loads fold 2's model while fold 1's Trainer still holds fold 1's model
    (after the k-bit recipe) and its optimizer state; ``trainer = ...`` lets them go only
    after. ESTIMATED (allocated memory), against ``preset``.

    >>> print(two_models_text(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8)))  # doctest: +SKIP
    """
    gpu, f2 = PRESETS[preset].gpu_bytes, fold2_prediction(est)
    rows = [("fold 1, peak of a training step", est.peak_bytes),
            ("fold 2 loads: fold 1's model + optimizer state", f2["leftover_bytes"]),
            ("  + fold 2's freshly loaded model (2 models)", f2["loaded_bytes"]),
            ("  + the moment of its last fp32 upcast: peak of the load", f2["load_peak_bytes"]),
            ("fold 2 trains, the old Trainer let go (1 model)", f2["train_peak_bytes"])]
    return "\n".join([f"ESTIMATED, allocated memory, against {PRESETS[preset].label}:"]
                     + [f"  {what:<56}{fmt_bytes(n):>11}  " + ("" if what.startswith("fold 2 loads") else
                                                               _verdict(n, gpu)) for what, n in rows])


def crash_models(preset: str = "colab-t4", **setup) -> list[dict]:
    """Ungated 7B-class models in 4 bits: does one fold fit ``preset``, and does fold 2's load (ESTIMATED)?

    Each row: ``model``, ``fold_peak_bytes``, ``loaded_bytes`` (the peak of fold 2's load, two models),
    ``crashes`` (one fold fits and the load does not). Sorted, the surest crash first.

    >>> crash_models(batch_size=4, seq_len=256, lora_r=8)[0]["model"]          # doctest: +SKIP
    'Qwen/Qwen3-8B'
    """
    from ..model_configs import _REGISTRY, gated
    from ..estimate import estimate as est_fn

    gpu, rows = PRESETS[preset].gpu_bytes, []
    for name in _REGISTRY:
        if gated(name) or name.startswith("tiny-"):
            continue
        try:
            est = est_fn(name, **{**setup, "quantization": "4bit"})
        except kin.InputError:  # the settings name modules this family lacks (gpt2's c_attn ...)
            continue
        if est.params < 6e9:  # 7B-class only
            continue
        loaded = fold2_prediction(est)["load_peak_bytes"]
        rows.append({"model": name, "fold_peak_bytes": est.peak_bytes, "loaded_bytes": loaded,
                     "crashes": est.peak_bytes <= gpu < loaded})
    return sorted(rows, key=lambda r: (not r["crashes"], -(r["loaded_bytes"] - gpu)))


def crash_models_text(preset: str = "colab-t4", **setup) -> str:
    """:func:`crash_models` as a table, with the kit's pick named (ESTIMATED).

    >>> print(crash_models_text(batch_size=4, seq_len=256, lora_r=8))          # doctest: +SKIP
    """
    rows, gpu = crash_models(preset, **setup), PRESETS[preset].gpu_bytes
    lines = [f"ESTIMATED, ungated 7B-class models in 4 bits, against {PRESETS[preset].label}:",
             f"  {'model':<26}{'one fold':>11}  {'':<6}{'fold 2 loads':>13}  verdict"]
    for r in rows:
        lines.append(f"  {r['model']:<26}{fmt_bytes(r['fold_peak_bytes']):>11}  "
                     f"{'fits' if r['fold_peak_bytes'] <= gpu else 'NO':<6}{fmt_bytes(r['loaded_bytes']):>13}  "
                     f"{_verdict(r['loaded_bytes'], gpu)}")
    pick = next((r["model"] for r in rows if r["crashes"]), None)
    lines.append(f"The kit's pick: {pick}: one fold fits, and fold 2's load does not." if pick else
                 "None of them: no ungated model fits one fold and fails at fold 2's load with these settings.")
    return "\n".join(lines)


@wrapped
def advisor_text(est, preset: str = "colab-t4", top: int = 3) -> str:
    """The fit advisor (:mod:`kit.advise`) on one fold, then on fold 2 with fold 1's model and optimizer
    state still alive: the device less those bytes. ESTIMATED.

    >>> "fold 2" in advisor_text(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8))
    True
    """
    from ..advise import advise

    p = PRESETS[preset]
    old = fold1_leftovers(est)
    left = Preset(p.name, f"{p.label} less fold 1's {fmt_bytes(old)}", p.gpu_bytes - old, p.ram_bytes)
    return "\n".join(["ESTIMATED by the fit advisor (python -m kit fit), one fold:", advise(est, p).text(top=top), "",
                      "fold 2, with fold 1's model and optimizer state still alive:",
                      advise(est, left).text(top=top)])


class FoldChart:
    """The fold chart (``kit.plot.folds``), redrawn live: pass it as ``on_fold_end``.

    In a notebook it draws into an ``ipywidgets.Output`` (:class:`kit.live.LivePlot`);
    elsewhere it saves PNGs into ``folder``. Folds with ``models_alive_at_start`` are
    labelled with that count. ``limit_bytes`` defaults to this GPU's memory (none on a CPU).

    >>> chart = FoldChart("broken loop", folder="plots")        # doctest: +SKIP
    >>> run_broken_loop("tiny-llama", folds=3, on_fold_end=chart)   # doctest: +SKIP
    """

    def __init__(self, title: str, *, limit_bytes: int | None = None, folder=None):
        self.title, self.records = title, []
        self.limit_bytes = limit_bytes if limit_bytes is not None else kdevice.hardware()["gpu_total_bytes"]
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


def _alive(n: int) -> str:
    return f"\n{n} model{'' if n == 1 else 's'} after load"


def _cell(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def fold_table(fold_records: list) -> str:
    """The fold records as a table (MEASURED): the user's loop by its load and its training, the fixed loop
    by start, peak and end with its checks.

    >>> print(fold_table([{"fold": 1, "start_bytes": 1, "peak_bytes": 2, "end_bytes": 1}]))  # doctest: +SKIP
    """
    b, txt = fmt_bytes, str
    cols = [("start_bytes", "start", b), ("load_peak_bytes", "load peak", b), ("models_alive_after_load", "models", txt),
            ("train_peak_bytes", "train peak", b), ("models_alive_in_training", "models", txt),
            ("peak_bytes", "peak", b), ("end_bytes", "end", b), ("adapter_reset_ok", "reset ok", txt),
            ("back_at_baseline", "at baseline", txt), ("eval_loss", "eval loss", lambda v: f"{v:.4f}"),
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


def recipe_estimates(model_name: str, **setup) -> dict:
    """Estimates of the standard recipe (``prepare_model_for_kbit_training``, which upcasts the
    16-bit parts to fp32) and the lean one (no upcast), gradient checkpointing on in both.

    >>> e = recipe_estimates("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8)
    >>> e["standard"].weights_bytes > e["lean"].weights_bytes
    True
    """
    return {r: estimate(model_name, kbit_recipe=r, gradient_checkpointing=True, **setup)
            for r in ("standard", "lean")}


def _measure_one(model_name: str, recipe: str, p: dict, collate, train_ds) -> dict:
    from transformers import set_seed

    baseline = leaks.take_baseline().snapshot.best_bytes
    set_seed(p["seed"])  # the same LoRA init and data order for both recipes
    model = load_for_training(model_name, p, recipe)
    gc.collect()
    weights_bytes = kdevice.snapshot().best_bytes - baseline
    tracker, out = Tracker(), tempfile.mkdtemp(prefix="kit-recipes-")
    trainer = _trainer(model, train_ds, None, collate, p, out, 1, tracker)
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
    ``settings`` as :func:`kit.scenarios.s2_cross_validation.run_fixed_loop`'s.

    >>> [r["recipe"] for r in measure_kbit_recipes("tiny-llama", steps_per_fold=1)]   # doctest: +SKIP
    ['standard', 'lean']
    """
    p = _params(**settings)
    _, collate, splits = fold_data(model_name, 2, p["seq_len"], p["max_samples"])
    return [_measure_one(model_name, r, p, collate, splits[0][0]) for r in ("standard", "lean")]


@wrapped
def recipe_table(estimates: dict, measured: list[dict] | None = None) -> str:
    """Standard against lean: estimated weights and peak, and measured ones when given.

    >>> print(recipe_table(recipe_estimates("tiny-llama", batch_size=1, seq_len=8, quantization="4bit",
    ...                                      lora_r=8)))        # doctest: +SKIP
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
    if measured and not kdevice.has_cuda():
        lines.append("(on a CPU the measured peak is the tensor bytes counted op by op by kit.tensor_peak.TensorPeak, "
                     "activations included)")
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
    lines.append(f"  out of memory at fold {oom}, while {'loading' if folds[-1].get('oom_during') == 'load' else 'training'}:"
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
