"""Scenario 2's fold loop on the widget panel: the loop is the subject, one fold's step is the estimate.

Its controls: the number of folds; the model loaded each fold (the user's loop) or once (the fixed loop); the old
Trainer kept until ``trainer = ...`` replaces it (the user's) or released first; the recipe: 2024's
``prepare_model_for_kbit_training`` (the 16-bit parts upcast to fp32, fp32 adapters: what SFTTrainer ran in the
user's post, :data:`~kit.scenarios.cross_validation.predict.THEN`) or the lean one (no upcast, as today's TRL). Run
(:meth:`FoldLoop.staged_run`) runs that loop here, fold by fold (:mod:`kit.scenarios.cross_validation.panel_run`).
The panel's ``.estimate`` stays one fold's training step; the fold chart (:func:`folds_html`) shows each fold's load
and training peak, the models alive at each load, and fold 2's load against the device's line, ESTIMATED (allocated
memory) with :func:`~kit.scenarios.cross_validation.predict.fold_timeline`.

>>> from kit.presets import PRESETS
>>> loop = FoldLoop(lambda kind, label, value, **kw: kind(value=value, description=label, **kw))
>>> sorted(loop.controls), loop.options({}, PRESETS["colab-t4"])["kbit_recipe"]
(['folds', 'load', 'recipe', 'trainer'], 'standard')
"""
from __future__ import annotations

import html

from kit.inputs import InputError

from kit import inputs
from kit.presets import MODELLED_MARGIN, margin_kept
from kit.scenarios.cross_validation.predict import THEN, fold_timeline
from kit.units import fmt_bytes

LOADS = [("each fold (the user's loop)", "each"), ("once, adapter reset each fold", "once")]
TRAINERS = [("kept until replaced (the user's)", "kept"), ("released before the next load", "released")]
RECIPES = [("2024: prepare_model_for_kbit_training (fp32 upcast)", "2024"), ("lean: no upcast (today's TRL)", "lean")]
RECIPE_OPTIONS = {"2024": THEN, "lean": {"kbit_recipe": "lean"}}
FOLDS = dict(min=2, max=10)
COLOURS = {"load": "#D55E00", "train": "#0072B2"}


class FoldLoop:
    """The fold loop's controls (``folds``, ``load``, ``trainer``, ``recipe``), made with the panel's ``control``
    factory; :meth:`options` adds the recipe to one fold's estimate, :meth:`timeline` and :meth:`html` give the
    folds."""

    def __init__(self, control, folds: int = 5, load: str = "each", trainer: str = "kept", recipe: str = "2024"):
        import ipywidgets as W

        folds = inputs.whole_number("folds", folds, minimum=FOLDS["min"])
        if folds > FOLDS["max"]:
            raise InputError("folds", f"folds {folds} is beyond the panel's slider ({FOLDS['max']}): pass at most "
                                          f"{FOLDS['max']}, or call kit.scenarios.cross_validation.predict."
                                          "fold_timeline.")
        load, trainer, recipe = (inputs.choice(name, value, [v for _, v in pairs]) for name, value, pairs in (
            ("load", load, LOADS), ("trainer", trainer, TRAINERS), ("recipe", recipe, RECIPES)))
        self.controls = {"folds": control(W.IntSlider, "folds", folds, **FOLDS),
                         "load": control(W.Dropdown, "model loaded", load, options=LOADS),
                         "trainer": control(W.Dropdown, "old Trainer", trainer, options=TRAINERS),
                         "recipe": control(W.Dropdown, "k-bit recipe", recipe, options=RECIPES)}
        self._lora_r = 8     # the panel's LoRA rank, read at each adjust()

    def options(self, setup: dict, preset) -> dict:
        """The recipe's estimate options (a 4-bit or 8-bit model only: the recipe prepares a quantized one)."""
        if setup.get("quantization", "4bit") == "none":
            return {}
        return dict(RECIPE_OPTIONS[self.controls["recipe"].value])

    def run_model(self, model: str) -> str:
        return model

    def run_problem(self, model: str) -> str | None:
        """Why Run cannot run this fold loop, or None."""
        return None if self._lora_r else "the fold loop trains a LoRA adapter: pick a LoRA rank"

    def staged_run(self, setup: dict, steps: int, preset, real_est):
        """Run's ``(chart, go)``: the fold loop of these controls, run fold by fold
        (:func:`kit.scenarios.cross_validation.panel_run.fold_run`; imported on the first Run, with TRL)."""
        from kit.scenarios.cross_validation.panel_run import fold_run

        loop = {k: w.value for k, w in self.controls.items()}
        return fold_run(setup, loop, steps, preset, real_est)

    def adjust(self, controls: dict, why: dict, preset, model: str) -> None:
        self._lora_r = controls["lora_r"].value
        controls["trainer"].disabled = controls["load"].value == "once"
        controls["recipe"].disabled = controls["quantization"].value == "none"
        if controls["trainer"].disabled:
            why["trainer"] = "loaded once, the fold loads no model beside the old Trainer's"
        if controls["recipe"].disabled:
            why["recipe"] = "the recipe prepares a quantized model: none here"
        elif controls["recipe"].value == "2024":
            why["recipe"] = "the embedding, lm_head and norms upcast to fp32, one at a time; adapters in fp32"

    def timeline(self, est) -> list[dict]:
        c = self.controls
        return fold_timeline(est, c["folds"].value, load_each_fold=c["load"].value == "each",
                             release=c["trainer"].value == "released")

    def html(self, est, preset) -> str:
        return "" if est is None or preset.gpu_bytes is None else folds_html(self.timeline(est), preset)


def fold2_text(folds: list[dict], limit: int) -> tuple[str, str]:
    """Fold 2's peak in one line, and its word: "fits", "TIGHT" (under the margin kept while it is modelled,
    :data:`kit.presets.MODELLED_MARGIN`) or "DOES NOT FIT"."""
    f2 = folds[1]
    figure = f2["load_peak_bytes"] or f2["train_peak_bytes"]
    gap = limit - figure
    word = "DOES NOT FIT" if gap < 0 else "TIGHT" if gap < margin_kept(limit) else "fits"
    room = f"{fmt_bytes(-gap)} over" if gap < 0 else f"{fmt_bytes(gap)} to spare" + (
        f", under the {MODELLED_MARGIN:.0%} margin kept while it is modelled" if word == "TIGHT" else "")
    if f2["load_peak_bytes"] is None:
        return (f"fold 2 loads no model (loaded once): its peak is one fold's step, {fmt_bytes(figure)} allocated "
                f"of {fmt_bytes(limit)} ({room})"), word
    return (f"fold 2's load, {f2['models_at_load']} model{'s' if f2['models_at_load'] > 1 else ''} alive: "
            f"{fmt_bytes(figure)} allocated of {fmt_bytes(limit)} ({room})"), word


def folds_html(folds: list[dict], preset) -> str:
    """The folds as bars (each fold's load and training peak) against the device's dashed line; fold 2's load
    judged in the line above them."""
    limit = preset.gpu_bytes
    tops = [f[k] for f in folds for k in ("load_peak_bytes", "train_peak_bytes") if f[k]]
    scale = max(tops + [limit]) * 1.05
    text, word = fold2_text(folds, limit)
    colour = {"fits": "#009E73", "TIGHT": "#E69F00"}.get(word, "#D55E00")
    head = (f"<div class='kit-fold2' style='font-size:105%'><b style='color:{colour}'>"
            f"{'fold 2 fits' if word == 'fits' else 'FOLD 2 ' + word}</b> {html.escape(preset.label)}: "
            f"{html.escape(text)} (ESTIMATED)</div>")
    line = (f"<div style='position:absolute;left:{100 * limit / scale:.2f}%;top:0;bottom:0;"
            f"border-left:2px dashed #D55E00' title='{fmt_bytes(limit)}'></div>")
    rows = []
    for f in folds:
        bars = []
        for kind, key in (("load", "load_peak_bytes"), ("train", "train_peak_bytes")):
            n = f[key]
            if n is None:
                continue
            alive = f" ({f['models_at_load']} model{'s' if f['models_at_load'] > 1 else ''} alive)" \
                if kind == "load" else ""
            bars.append(f"<div class='kit-fold-{kind}' style='display:flex;align-items:center;gap:6px'>"
                        f"<div style='width:{100 * n / scale:.2f}%;height:10px;background:{COLOURS[kind]}'></div>"
                        f"<span>{kind} {fmt_bytes(n)}{alive}</span></div>")
        rows.append(f"<div class='kit-fold' style='display:flex;gap:6px;font-size:80%'><span style='width:50px'>fold "
                    f"{f['fold']}</span><div style='flex:1;position:relative'>{''.join(bars)}{line}</div></div>")
    return (head + f"<div class='kit-folds' style='max-width:860px;margin:4px 0'>{''.join(rows)}</div>"
            f"<div style='font-size:80%;color:#555'>allocated memory fold by fold; - - the device's "
            f"{fmt_bytes(limit)}</div>")
