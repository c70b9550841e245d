"""``python -m kit demo --out DIR``: both scenarios end to end, and a report a person wants to read.

On this machine's best default (``kit.runtime.mode()``): tiny CPU twins without a GPU,
real sizes with one. For each scenario it predicts the original setup, measures (or
safely fails) it, measures the fixes and checks the cleanup. It writes PNG plots,
``report.md``, ``report.html`` and ``summary.json`` (fields in the README) into DIR.
A failed step is reported, the figures already gathered are still written, and the
exit status is 1.

>>> # python -m kit demo --out report/ --scenario 2 --size smoke
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from kit import machine, runtime
from kit.cli import outputs
from kit.cli.report import Section
from kit.inputs import InputError
from kit.measure import device
from kit.units import fmt_bytes

CV_MODEL = {"smoke": "tiny-llama", "real": "meta-llama/Llama-3.2-1B"}
CV_SETTINGS = {"smoke": {}, "real": {"seq_len": 256}}
S1_STEPS = 2        # scenario 1's measured runs: two optimizer steps, so AdamW's state exists during backward


class Steps:
    """One tqdm bar over the scenarios; each step is named on the bar and printed above it."""

    def __init__(self, total: int):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="scenario", dynamic_ncols=True)

    def __call__(self, label: str) -> None:
        self.bar.set_description(label)
        self.bar.write(f"-> {label}")

    def done_scenario(self) -> None:
        self.bar.update(1)

    def __enter__(self) -> "Steps":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run both scenarios end to end and write a report into --out",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the report (created if missing)")
    p.add_argument("--size", choices=("smoke", "real"), default=None,
                   help="tiny twins or real sizes (default: smoke without a GPU, real with one)")
    p.add_argument("--scenario", choices=("1", "2", "all"), default="all", help="which scenario to run")
    p.set_defaults(func=run)


def _save(fig, out: Path, name: str) -> Path:
    import matplotlib.pyplot as plt

    path = outputs.claim(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _t4():
    from kit.presets import PRESETS

    t4 = PRESETS["colab-t4"]
    return t4.gpu_bytes, t4.label.split(" (")[0]        # "Colab T4"


def _ratio(measured, estimated) -> str:
    return f"{measured / estimated:.2f}" if measured and estimated else "not run"


def _estimate_as_recorded(est, record: dict, what: str):
    """The estimate a chart draws must be the record's (the setup as run); say so loudly if not."""
    if est.peak_bytes != record["estimate_peak_bytes"]:
        raise RuntimeError(f"{what}: the chart's estimate ({est.peak_bytes:,} bytes) is not the run's "
                           f"({record['estimate_peak_bytes']:,} bytes); the setups differ")
    return est


def real_size_figure(real=None):
    """Scenario 1's first figure: the user's setup at real size, ESTIMATED, against a Colab T4.

    >>> fig = real_size_figure()
    >>> "ESTIMATED" in fig.axes[0].get_title()
    True
    """
    from kit import plot
    from kit.scenarios.custom_head import scenario as s1

    real = real or s1.predict_original("real")
    t4, t4_name = _t4()
    return plot.breakdown(real.estimate.components(), t4, device_label=t4_name, judged=real.estimate,
                          title=f"ESTIMATED at real size: {real.name}, one training step (nothing measured)")


def _scenario1(size: str, out: Path, summary: dict, sections: list, step, glance: dict) -> None:
    from kit import plot
    from kit.scenarios.custom_head import runs as s1_runs
    from kit.scenarios.custom_head import scenario as s1

    t4, t4_name = _t4()
    step("scenario 1: predict the original")
    pred = s1.predict_original(size)       # the Colab recipe (fp16 on a GPU, accumulation 16) at this run's size
    real = pred if size == "real" else s1.predict_original("real")  # an estimate: instant at any size
    # The original as it runs here: Trainer ignores fp16 on a CPU, and the accumulation follows the device.
    accum, precision = s1_runs.grad_accum_for(None), s1.run_precision(s1.USER["precision"])
    as_run = s1.estimate_user(pred.name, precision=precision, device=machine.device_name(), grad_accum=accum)
    setup = f"{precision}, accumulation {accum}, {S1_STEPS} optimizer steps"
    s1_sum = summary["scenario1"] = {"offender": pred.offender, "original": {
        "estimate_peak_bytes": as_run.peak_bytes, "measured_peak_bytes": None, "oom": False,
        "recipe_estimate_peak_bytes": pred.peak_bytes, "precision": precision, "grad_accum": accum,
        "steps": S1_STEPS}, "fixes": []}
    glance["real_figure"] = _save(real_size_figure(real), out, "s1_breakdown")
    advice = s1.advice_table(size)
    s1_sum["real_size_estimate"] = {"peak_bytes": real.peak_bytes, "cpu_build_bytes": real.cpu_build_bytes,
                                    "fits_t4": real.fits_t4}
    s1_sum["advice"] = {"rows": advice.rows, "data": advice.data}
    glance["real"] = (f"**Scenario 1 at the user's real size**, ESTIMATED before loading anything: "
                      f"`{real.name}` needs **{fmt_bytes(real.peak_bytes)}** at the peak of a training step; "
                      f"{plot.limit_text(real.estimate, t4, t4_name)}. The head `{real.offender}` is the cause.")
    recipe = "" if size == "real" else (
        f" The Colab recipe at this size (fp16 mixed precision on a GPU, accumulation {s1.USER['grad_accum']}) "
        f"is ESTIMATED at {fmt_bytes(pred.peak_bytes)}; that is not what runs here, so it is not compared.")
    sections.append(Section("Scenario 1: a vocab-by-vocab head on DistilGPT2", [
        f"At the user's real size the kit ESTIMATES, before loading anything, **{fmt_bytes(real.peak_bytes)}** at "
        f"the peak of a training step and **{fmt_bytes(real.cpu_build_bytes)}** of RAM just to build the model "
        f"({'fits' if real.fits_t4 else 'does NOT fit'} a {t4_name}). The offender is `{real.offender}` with "
        f"{real.offender_params:,} trainable parameters.",
        f"This run trains `{pred.name}` as it runs here ({setup}, on the {machine.device_name()}): ESTIMATED at "
        f"**{fmt_bytes(as_run.peak_bytes)}**." + recipe,
        "Below: the estimate at real size" + ("" if size == "real" else ", the Colab recipe at this run's size")
        + ", and the usual advice, put to the estimator one change at a time:"],
        pre=[real.text()] + ([pred.text()] if real is not pred else []) + [advice.text()]))

    step("scenario 1: run the original, OOM-safe")
    original, tracker = s1_runs.run_original_safely(size, steps=S1_STEPS, grad_accum=accum)
    # the user's own Trainer was read as it ran (its tokenizer's vocabulary): the record's estimate, else the prediction
    est = _estimate_as_recorded(original.get("estimate") or as_run, original, "the original")
    measured = original["measured_peak_bytes"]
    s1_sum["original"].update(estimate_peak_bytes=original["estimate_peak_bytes"], measured_peak_bytes=measured,
                              oom=original["oom"])
    glance["runs"] = [["the user's setup", setup, fmt_bytes(est.peak_bytes), fmt_bytes(measured),
                       _ratio(measured, est.peak_bytes)]]
    if original["refused"]:
        said = f"The kit did not start it: {original['refused']}"
    elif original["oom"]:
        said = f"It ran out of memory, as predicted; the kit caught it and freed the memory. ({original['error']})"
    else:
        said = (f"It ran: MEASURED peak **{fmt_bytes(measured)}** ({original['reading']}), "
                f"{measured / est.peak_bytes:.2f}x the ESTIMATE of the same setup ({fmt_bytes(est.peak_bytes)}).")
    images = []
    if measured is not None:
        images.append(_save(plot.predicted_vs_measured(
            est.components(), measured, t4, device_label=t4_name, measured_label="MEASURED peak",
            title=f"The original as run here ({precision}, accumulation {accum}): ESTIMATED vs MEASURED"),
            out, "s1_original_vs_estimate"))
    if tracker.records:
        images.append(_save(plot.stage_bars(tracker, "Scenario 1, the original: MEASURED per stage"), out,
                            "s1_original"))
    sections.append(Section("Scenario 1: the original, run safely", [said], images=images))

    rows, images = [], []
    for which, label in s1.FIXES.items():
        step(f"scenario 1: fix ({which}) {label}")
        record, tracker = s1_runs.run_fix(which, size, steps=S1_STEPS)
        s1_sum["fixes"].append({k: record.get(k) for k in ("name", "estimate_peak_bytes", "measured_peak_bytes",
                                                            "returned", "oom", "steps", "grad_accum")})
        # The chart draws the record's estimate: the setup as run, with the run's accumulation.
        est = _estimate_as_recorded(s1.estimate_fix(which, size, as_run=True, grad_accum=record["grad_accum"],
                                                    seq_len=record["seq_len"]), record, f"fix ({which})")
        measured = record["measured_peak_bytes"]
        fix_setup = (f"{s1.run_precision(s1.fix_setup(which, size)['precision'])}, accumulation "
                     f"{record['grad_accum']}, {record['steps']} optimizer steps")
        rows.append([f"({which}) {label}", fix_setup, fmt_bytes(est.peak_bytes), fmt_bytes(measured),
                     _ratio(measured, est.peak_bytes),
                     {True: "yes", False: "NO", None: "n/a"}[record.get("returned")], record.get("note", "")])
        glance["runs"].append([f"fix {record['name']}", fix_setup, *rows[-1][2:5]])
        images.append(_save(plot.predicted_vs_measured(
            est.components(), measured, t4, device_label=t4_name, measured_label="MEASURED peak",
            title=f"Fix ({which}) as run here: ESTIMATED vs MEASURED"), out, f"s1_fix_{which}"))
    sections.append(Section("Scenario 1: fixes that work, estimated and measured", [
        f"Each fix was ESTIMATED for the setup as it ran here, then MEASURED over a short Trainer run "
        f"(reading: `{device.best_reading()}`). Each chart draws the bars on their own scale; the "
        f"{t4_name}'s verdict is written on it, and the small panel draws the bars against the whole GPU."],
        table=(["fix", "as run", "estimated peak", "measured peak", "measured/estimated", "memory returned",
                "note"], rows), images=images))


def _alive(n) -> str:
    return f"{n} model{'' if n == 1 else 's'} alive"


def _second_fold(broken: list, prediction: dict | None = None) -> str:
    """Where the broken loop's second model came, from the counted models (not from the bytes); with
    ``prediction`` (``fold2_prediction``), fold 2's measured bytes beside the estimate of the same moment.

    >>> _second_fold([{"load_peak_bytes": 2**20, "models_alive_after_load": 1},
    ...               {"load_peak_bytes": 2**21, "models_alive_after_load": 2, "models_alive_in_training": 1}])
    'loads with 2 models alive (the first with 1 model alive), a load peak of 2.00 MiB against 1.00 MiB; it trains with 1 model alive.'
    """
    if len(broken) < 2:
        return "never started."
    first, second = broken[0], broken[1]
    where = f"a load peak of {fmt_bytes(second['load_peak_bytes'])} against {fmt_bytes(first['load_peak_bytes'])}"
    if second.get("models_alive_after_load") is None:
        return f"loads with {where} (the models alive were not counted)."
    training = second.get("models_alive_in_training")
    text = (f"loads with {_alive(second['models_alive_after_load'])} (the first with "
            f"{_alive(first.get('models_alive_after_load'))}), {where}"
            + (f"; it trains with {_alive(training)}." if training is not None else "."))
    if prediction:   # each measurement beside the estimate of the same moment, counted from before fold 1
        base, pairs = first.get("start_bytes") or 0, []
        for what, k in (("fold 2 loaded", "loaded_bytes"), ("its load peak", "load_peak_bytes")):
            got = None if second.get(k) is None else second[k] - base
            pairs.append(f"{what}: MEASURED {fmt_bytes(got)}, ESTIMATED {fmt_bytes(prediction.get(k))}"
                         + (f" ({got / prediction[k]:.4f}x)" if got and prediction.get(k) else ""))
        text += " Counted from before fold 1, " + "; ".join(pairs) + "."
    return text


def _scenario2(size: str, out: Path, summary: dict, sections: list, step, glance: dict) -> None:
    from kit import plot
    from kit.estimate import estimate
    from kit.presets import PRESETS
    from kit.scenarios.cross_validation import fixed_loop as s2
    from kit.scenarios.cross_validation.notebook import fold2_prediction

    model = CV_MODEL[size]
    p = {**s2.DEFAULTS, **CV_SETTINGS[size]}
    step("scenario 2: predict one fold")
    est = estimate(model, batch_size=p["batch_size"], seq_len=p["seq_len"], quantization=p["quantization"],
                   lora_r=p["lora_r"], lora_targets=p["lora_targets"])
    big = estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512, quantization="4bit", lora_r=8,
                   lora_targets=("q_proj", "v_proj"))
    t4 = PRESETS["colab-t4"].gpu_bytes
    step("scenario 2: broken loop, advice reset, fixed loop")
    result = s2.run_scenario2(model, folds=5, broken_folds=3, output_dir=outputs.claim(out, "cv-runs"),
                              **CV_SETTINGS[size])
    summary["scenario2"] = {**result, "estimate": {
        "model": model, "peak_bytes": est.peak_bytes, "weights_bytes": est.weights_bytes,
        "two_models_bytes": fold2_prediction(est)["loaded_bytes"],
        "llama3_8b_nf4_loaded_weights_bytes": big.loaded_weights_bytes,
        "llama3_8b_nf4_training_weights_bytes": big.weights_bytes}}
    broken, fixed = result["broken"]["folds"], result["fixed"]["folds"]
    labelled = [dict(f, label=f"fold {i + 1}" + (f" ({_alive(f['models_alive_after_load'])} after load)"
                                                  if f.get("models_alive_after_load") is not None else ""))
                for i, f in enumerate(broken)]
    images = [_save(plot.folds(labelled, limit_bytes=t4 if size == "real" else None,
                               title="Broken loop: MEASURED per fold"), out, "s2_broken_folds"),
              _save(plot.folds(fixed, baseline_bytes=fixed[0]["start_bytes"],
                               title="Fixed loop: MEASURED per fold"), out, "s2_fixed_folds")]
    rows = [[f"broken {i + 1}", fmt_bytes(f["start_bytes"]), fmt_bytes(f["peak_bytes"]), fmt_bytes(f["end_bytes"]), ""]
            for i, f in enumerate(broken)]
    rows += [[f"fixed {i + 1}", fmt_bytes(f["start_bytes"]), fmt_bytes(f["peak_bytes"]), fmt_bytes(f["end_bytes"]),
              "verified" if f["adapter_reset_ok"] else "NOT reset"] for i, f in enumerate(fixed)]
    spread = max(abs(f["end_bytes"] - fixed[0]["end_bytes"]) for f in fixed) / max(fixed[0]["end_bytes"], 1)
    sections.append(Section("Scenario 2: QLoRA cross-validation that dies on fold 2", [
        f"ESTIMATED for one fold of `{model}` ({p['quantization']}, LoRA r={p['lora_r']}): "
        f"**{fmt_bytes(est.peak_bytes)}** peak, of which weights {fmt_bytes(est.weights_bytes)}; when fold 2 loads "
        f"beside the old fold's model and optimizer state, {fmt_bytes(fold2_prediction(est)['loaded_bytes'])}.",
        f"Llama-3-8B in NF4 with double quant is ESTIMATED at {fmt_bytes(big.loaded_weights_bytes)} of weights "
        f"as loaded ({big.loaded_weights_bytes / 1e9:.2f} GB), not the 'about 4 GB' often quoted: embeddings and "
        f"lm_head stay 16-bit. peft's prepare_model_for_kbit_training then upcasts those to fp32: "
        f"{fmt_bytes(big.weights_bytes)} while training.",
        "MEASURED: in the broken loop the second fold " + _second_fold(broken, fold2_prediction(est)) +
        (f" It ran out of memory at fold {result['broken']['oom_at_fold']}." if result["broken"]["oom_at_fold"] else ""),
        "The advice's LoRA reset (`if 'lora' in model.named_modules()`) " + (
            "**changed nothing**: fold 2 trained on from fold 1's adapter." if result["advice_reset_changed_nothing"]
            else "did reset the adapter here."),
        f"The fixed loop loads once, restores the saved adapter each fold and releases each Trainer: every fold "
        f"ends within {100 * spread:.2f}% of fold 1 (MEASURED, `{device.best_reading()}`)."],
        table=(["fold", "start", "peak", "end", "adapter reset"], rows), images=images))


def _at_a_glance(glance: dict) -> Section:
    """The two stories first: the real-size estimate against the device, then every run, estimated vs measured."""
    paragraphs, table = [], None
    if "real" in glance:
        paragraphs.append("1. " + glance["real"] + " (figure below: an estimate, nothing measured)")
    if glance.get("runs"):
        paragraphs.append(f"{len(paragraphs) + 1}. **Every run on this machine** ({machine.device_name()}), ESTIMATED "
                          "for the setup as it ran, then MEASURED (table below the figure; each run has a chart "
                          "further down):")
        table = (["run", "as run", "estimated peak", "measured peak", "measured/estimated"], glance["runs"])
    images = [glance["real_figure"]] if "real_figure" in glance else []
    return Section("At a glance", paragraphs, table=table, images=images, images_first=True)


def run(args: argparse.Namespace) -> int:
    from kit.cli import report

    out = Path(args.out).expanduser()
    try:   # before the run: a folder of the user's files is refused, an earlier demo run moved aside
        moved = outputs.prepare(out)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if moved:
        print(moved, flush=True)
    size = args.size or runtime.mode()
    hw = machine.hardware()
    summary = {"device": hw["gpu_name"] or "cpu", "size": size, "reading": device.best_reading()}
    sections = [Section("This run", [runtime.describe().replace("\n", "  \n"),
                                     f"Sizes: **{size}**. Every figure below was computed or measured by the kit "
                                     "in this run; the text says which."])]
    scenarios, glance = {"1": _scenario1, "2": _scenario2}, {}
    chosen = list(scenarios) if args.scenario == "all" else [args.scenario]
    failures = []
    started = time.time()
    with Steps(total=len(chosen)) as step:
        for key in chosen:
            try:
                scenarios[key](size, out, summary, sections, step, glance)
            except Exception as e:  # report it, keep what we have, go on with the next scenario
                failures.append(f"scenario {key}: {type(e).__name__}: {e}")
                sections.append(Section(f"Scenario {key}: FAILED", [f"{type(e).__name__}: {e}"],
                                        pre=[traceback.format_exc(limit=-3)]))
            step.done_scenario()
    if glance:
        sections.insert(1, _at_a_glance(glance))
    summary["errors"] = failures
    summary["seconds"] = round(time.time() - started, 1)
    for name in report.NAMES:
        outputs.claim(out, name)
    try:
        paths = report.write(out, "Memory kit demo report", sections, summary)
    except OSError as e:   # blocked since the start: the figures go to a fresh folder, never lost
        import tempfile

        failures.append(f"writing the report into {out}: {e.strerror or e}")
        paths = report.write(tempfile.mkdtemp(prefix="kit-demo-"), "Memory kit demo report", sections, summary)
    pngs = [n for n in outputs.written(out) if n.endswith(".png")]   # this run's plots, no one else's
    print(f"\nWrote {', '.join(str(p) for p in paths)} and {len(pngs)} PNG plots in {out} "
          f"in {summary['seconds']} s.")
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0
