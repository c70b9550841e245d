"""``python -m kit demo --out DIR``: both scenarios end to end, and a report a person wants to read.

On this machine's best default (``kit.runtime.mode()``): tiny CPU twins without a GPU,
real sizes with one. For each scenario it predicts the original setup, measures (or
safely fails) it, measures the fixes and checks the cleanup. It writes PNG plots,
``report.md``, ``report.html`` and ``summary.json`` (fields in docs/cli-and-api.md) into DIR.
A failed step is reported, the figures already gathered are still written, and the
exit status is 1.

>>> # python -m kit demo --out report/ --scenario 2 --size smoke
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from pathlib import Path

from kit import dtypes, machine, runtime
from kit.cli import outputs
from kit.cli.demo_folds import save_png, scenario2, t4_preset
from kit.cli.report import Section
from kit.inputs import InputError
from kit.measure import device
from kit.units import fmt_bytes

LOG = "demo.log"     # what the libraries print during the runs
S1_STEPS = 2        # scenario 1's measured runs: two optimizer steps, so AdamW's state exists during backward


class Steps:
    """One line per stage on the terminal (``console``), numbered; everything else goes to the log."""

    def __init__(self, console):
        self.console, self.count = console, 0

    def __call__(self, label: str) -> None:
        self.count += 1
        self.say(f"[{self.count}] {label}")

    def say(self, line: str) -> None:
        self.console.write(line + "\n")
        self.console.flush()


@contextlib.contextmanager
def output_to_log(path: Path):
    """Inside the block, all the process prints (the libraries' warnings and progress bars, the loaders' lines, C
    code's too: the file descriptors themselves are redirected) goes to ``path``; yields a stream to the terminal
    for the demo's own lines."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    console = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    with open(path, "a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield console
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved):
                os.dup2(old, fd)
                os.close(old)
            console.close()


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run both scenarios end to end and write a report into --out",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the report (created if missing)")
    p.add_argument("--size", choices=("smoke", "real"), default=None,
                   help="tiny twins or real sizes (default: smoke without a GPU, real with one)")
    p.add_argument("--scenario", choices=("1", "2", "all"), default="all", help="which scenario to run")
    p.set_defaults(func=run)


def _ratio(measured, estimated, oom: bool = False) -> str:
    if oom:
        return "out of memory (caught)"
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
    from kit.scenarios.custom_head import scenario

    real = real or scenario.predict_original("real")
    t4, t4_name = t4_preset()
    return plot.breakdown(real.estimate.components(), t4, device_label=t4_name, judged=real.estimate,
                          title=f"ESTIMATED at real size: {real.name}, one training step (nothing measured)")


def scenario1_cap(size: str, pred, real) -> dict | None:
    """In smoke mode, a T4 scaled to the twin: the T4's bytes x (the twin's ESTIMATED peak / the real model's),
    both for the user's Colab recipe; None at real size (the device is the device).

    >>> from kit.scenarios.custom_head import scenario
    >>> cap = scenario1_cap("smoke", scenario.predict_original("smoke"), scenario.predict_original("real"))
    >>> cap["cap_bytes"] < 2**30 < cap["limit_bytes"]
    True
    """
    if size != "smoke":
        return None
    t4, t4_name = t4_preset()
    cap = t4 * pred.peak_bytes // real.peak_bytes
    return {"cap_bytes": cap, "limit_bytes": t4, "text": (
        f"Memory cap {fmt_bytes(cap)}: a {t4_name}'s {fmt_bytes(t4)} x {pred.name}'s peak "
        f"({fmt_bytes(pred.peak_bytes)}) / {real.name}'s ({fmt_bytes(real.peak_bytes)}), both ESTIMATED for the "
        "user's Colab recipe.")}


def on_a_t4_at_real_size(which: str) -> dict:
    """Fix ``which`` of scenario 1 as the user would run it, at real size on a Colab T4 (its 16-bit dtype there),
    ESTIMATED: ``fits`` (the verdict), ``name``, ``verdict`` (its sentence) and ``state_bytes`` (weights, gradients
    and optimizer state: what a kept V x V head keeps). A fix that does not fit there is not called a fix.

    >>> on_a_t4_at_real_size("c")["fits"], on_a_t4_at_real_size("a")["fits"]
    (False, True)
    """
    from kit.presets import verdict
    from kit.scenarios.custom_head import scenario

    dtype = dtypes.for_preset("colab-t4")[0]
    est = scenario.estimate_fix(which, "real", dtype=dtype)
    said = verdict(est, "colab-t4")
    parts = est.components()
    return {"fits": said.fits, "name": scenario.fix_setup(which, "real", dtype=dtype)["name"], "verdict": said.text,
            "state_bytes": parts["weights"] + parts["gradients"] + parts["optimizer state"]}


def kept_head_note(real: dict, offender_params: int) -> str:
    """Why a change that keeps the V x V head is no fix: its estimate at real size on a T4, and what it keeps.

    >>> kept_head_note(on_a_t4_at_real_size("c"), 2525916822)  # doctest: +ELLIPSIS
    'Not a fix: the VxV head kept, its 2,525,916,822 parameters still trained. At real size on a Colab T4, ...'
    """
    return (f"Not a fix: the VxV head kept, its {offender_params:,} parameters still trained. At real size on a "
            f"Colab T4, {real['name']} is ESTIMATED: {real['verdict']}; its weights, gradients and optimizer state "
            f"alone take {fmt_bytes(real['state_bytes'])}.")


def _capped(cap: dict | None):
    from kit.measure.controls import memory_cap

    return memory_cap(cap["cap_bytes"] if cap else None)


def _scenario1(size: str, out: Path, summary: dict, sections: list, step, glance: dict) -> None:
    from kit import plot
    from kit.scenarios.custom_head import runs as s1_runs
    from kit.scenarios.custom_head import scenario

    t4, t4_name = t4_preset()
    step("scenario 1: predict the original")
    pred = scenario.predict_original(size)       # the Colab recipe (fp16 on a GPU, accumulation 16) at this run's size
    real = pred if size == "real" else scenario.predict_original("real")  # an estimate: instant at any size
    # The original as it runs here: Trainer ignores fp16 on a CPU, and the accumulation follows the device.
    accum, precision = s1_runs.grad_accum_for(None), scenario.run_precision(scenario.USER["precision"])
    as_run = scenario.estimate_user(pred.name, precision=precision, device=machine.device_name(), grad_accum=accum)
    setup = f"{precision}, accumulation {accum}, {S1_STEPS} optimizer steps"
    s1_sum = summary["scenario1"] = {"offender": pred.offender, "original": {
        "estimate_peak_bytes": as_run.peak_bytes, "measured_peak_bytes": None, "oom": False,
        "recipe_estimate_peak_bytes": pred.peak_bytes, "precision": precision, "grad_accum": accum,
        "steps": S1_STEPS}, "fixes": []}
    glance["real_figure"] = save_png(real_size_figure(real), out, "s1_breakdown")
    cap = scenario1_cap(size, pred, real)
    if cap:
        step.say(f"    {cap['text']}")
        glance.setdefault("caps", []).append("Scenario 1: " + cap["text"])
        s1_sum["cap"] = {"cap_bytes": cap["cap_bytes"], "limit_bytes": cap["limit_bytes"], "text": cap["text"]}
    advice = scenario.advice_table(size)
    s1_sum["real_size_estimate"] = {"peak_bytes": real.peak_bytes, "cpu_build_bytes": real.cpu_build_bytes,
                                    "fits_t4": real.fits_t4}
    s1_sum["advice"] = {"rows": advice.rows, "data": advice.data}
    glance["real"] = (f"**Scenario 1 at the user's real size**, ESTIMATED before loading anything: "
                      f"`{real.name}` needs **{fmt_bytes(real.peak_bytes)}** at the peak of a training step; "
                      f"{plot.limit_text(real.estimate, t4, t4_name)}. The head `{real.offender}` is the cause.")
    recipe = "" if size == "real" else (
        f" The Colab recipe at this size (fp16 mixed precision on a GPU, accumulation {scenario.USER['grad_accum']}) "
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
    with _capped(cap) as capped:
        original, tracker = s1_runs.run_original_safely(size, steps=S1_STEPS, grad_accum=accum)
    if cap:
        s1_sum["cap"]["how"] = capped.how
    # the user's own Trainer was read as it ran (its tokenizer's vocabulary): the record's estimate, else the prediction
    est = _estimate_as_recorded(original.get("estimate") or as_run, original, "the original")
    measured = original["measured_peak_bytes"]
    s1_sum["original"].update(estimate_peak_bytes=original["estimate_peak_bytes"], measured_peak_bytes=measured,
                              oom=original["oom"])
    glance["runs"] = [["the user's setup", setup, fmt_bytes(est.peak_bytes), fmt_bytes(measured),
                       _ratio(measured, est.peak_bytes, original["oom"])]]
    if original["refused"]:
        said = f"The kit did not start it: {original['refused']}"
    elif original["oom"]:
        said = (f"It ran out of memory{' under the cap' if cap else ''}, as predicted; the kit caught it and freed "
                f"the memory. ({original['error']})")
    else:
        said = (f"It ran: MEASURED peak **{fmt_bytes(measured)}** ({original['reading']}), "
                f"{measured / est.peak_bytes:.2f}x the ESTIMATE of the same setup ({fmt_bytes(est.peak_bytes)}).")
    images = []
    if measured is not None:
        images.append(save_png(plot.predicted_vs_measured(
            est.components(), measured, t4, device_label=t4_name, measured_label="MEASURED peak",
            title=f"The original as run here ({precision}, accumulation {accum}): ESTIMATED vs MEASURED"),
            out, "s1_original_vs_estimate"))
    if tracker.records:
        images.append(save_png(plot.stage_bars(tracker, "Scenario 1, the original: MEASURED per stage"), out,
                            "s1_original"))
    sections.append(Section("Scenario 1: the original, run safely", [said], images=images))

    rows, images, kept = [], [], []
    for which, label in scenario.FIXES.items():
        at_real_size = on_a_t4_at_real_size(which)
        step(f"scenario 1: fix ({which}) {label}" if at_real_size["fits"] else
             f"scenario 1: ({which}) {label}: not a fix, it still does not fit a T4 at real size")
        with _capped(cap):
            record, tracker = s1_runs.run_fix(which, size, steps=S1_STEPS)
        s1_sum["fixes"].append({**{k: record.get(k) for k in ("name", "estimate_peak_bytes", "measured_peak_bytes",
                                                              "returned", "oom", "steps", "grad_accum")},
                                "fits_t4_at_real_size": at_real_size["fits"]})
        note = record.get("note", "")
        if not at_real_size["fits"]:
            kept.append(f"({which})")
            note = f"{kept_head_note(at_real_size, real.offender_params)} {note}".strip()
        # The chart draws the record's estimate: the setup as run, with the run's accumulation.
        est = _estimate_as_recorded(scenario.estimate_fix(which, size, as_run=True, grad_accum=record["grad_accum"],
                                                          seq_len=record["seq_len"]), record, f"fix ({which})")
        measured = record["measured_peak_bytes"]
        fix_setup = (f"{scenario.run_precision(scenario.fix_setup(which, size)['precision'])}, accumulation "
                     f"{record['grad_accum']}, {record['steps']} optimizer steps")
        rows.append([f"({which}) {label}", fix_setup, fmt_bytes(est.peak_bytes), fmt_bytes(measured),
                     _ratio(measured, est.peak_bytes, record.get("oom")),
                     {True: "yes", False: "NO", None: "n/a"}[record.get("returned")],
                     ("OUT OF MEMORY under the cap, caught, as its estimate says. " if record.get("oom") else "")
                     + note])
        run_name = f"fix {record['name']}" if at_real_size["fits"] else f"{record['name']}: the head kept, not a fix"
        glance["runs"].append([run_name, fix_setup, *rows[-1][2:5]])
        if measured is not None:
            images.append(save_png(plot.predicted_vs_measured(
                est.components(), measured, t4, device_label=t4_name, measured_label="MEASURED peak",
                title=f"Fix ({which}) as run here: ESTIMATED vs MEASURED"), out, f"s1_fix_{which}"))
    title = "Scenario 1: the fixes, estimated and measured"
    if kept:
        title = (f"Scenario 1: the fixes, and {' and '.join(kept)}, the VxV head kept, which still does not fit a "
                 "T4: estimated and measured")
    sections.append(Section(title, [
        (cap["text"] + " A run that runs out of memory under it is marked in the note. " if cap else "") +
        f"Each change was ESTIMATED for the setup as it ran here, then MEASURED over a short Trainer run "
        f"(reading: `{device.best_reading()}`). Each chart draws the bars on their own scale; the "
        f"{t4_name}'s verdict is written on it, and the small panel draws the bars against the whole GPU."],
        table=(["change", "as run", "estimated peak", "measured peak", "measured/estimated", "memory returned",
                "note"], rows), images=images))


def _at_a_glance(glance: dict) -> Section:
    """The two stories first: the real-size estimate against the device, then every run, estimated vs measured."""
    paragraphs, table = [], None
    if "real" in glance:
        paragraphs.append("1. " + glance["real"] + " (figure below: an estimate, nothing measured)")
    if glance.get("caps"):
        paragraphs.append(f"{len(paragraphs) + 1}. **The runs here had a smaller GPU**, a memory cap scaled from a "
                          "Colab T4 to the tiny twins, so that what fails on a T4 fails here too. "
                          + " ".join(glance["caps"]))
    if glance.get("runs"):
        paragraphs.append(f"{len(paragraphs) + 1}. **Every run on this machine** ({machine.device_name()}), ESTIMATED "
                          "for the setup as it ran, then MEASURED (table below the figure; each run has a chart "
                          "further down):")
        table = (["run", "as run", "estimated peak", "measured peak", "measured/estimated"], glance["runs"])
    images = [glance["real_figure"]] if "real_figure" in glance else []
    return Section("At a glance", paragraphs, table=table, images=images, images_first=True)


def sizes_reason(asked: str | None) -> str:
    """Which sizes this run uses, and why: ``--size`` where it was given, else the runtime's default and its reason.

    >>> sizes_reason("real") if runtime.mode() == "smoke" else sizes_reason("smoke")  # doctest: +ELLIPSIS
    '... sizes, because --size ... was given (without it this machine runs ...).'
    """
    if asked is None:
        return runtime.mode_reason()
    sizes = "SMOKE sizes: tiny twins and a few steps" if asked == "smoke" else "REAL sizes"
    default = runtime.mode()
    return f"{sizes}, because --size {asked} was given" + (
        "." if asked == default else f" (without it this machine runs {default} sizes).")


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
    sections = [Section("This run", [runtime.describe(sizes_reason(args.size)).replace("\n", "  \n"),
                                     f"Sizes: **{size}**. Every figure below was computed or measured by the kit "
                                     "in this run; the text says which."])]
    scenarios, glance = {"1": _scenario1, "2": scenario2}, {}
    chosen = list(scenarios) if args.scenario == "all" else [args.scenario]
    failures = []
    started = time.time()
    print(f"Memory kit demo, {size} size, on {machine.device_name()}: one line per stage; the libraries' output "
          f"goes to {out / LOG}", flush=True)
    with output_to_log(outputs.claim(out, LOG)) as console:
        from kit.scenarios import notebook

        notebook.quiet()      # fewer progress bars and library notes in the log too
        step = Steps(console)
        for key in chosen:
            try:
                scenarios[key](size, out, summary, sections, step, glance)
            except Exception as e:  # report it, keep what we have, go on with the next scenario
                failures.append(f"scenario {key}: {type(e).__name__}: {e}")
                sections.append(Section(f"Scenario {key}: FAILED", [f"{type(e).__name__}: {e}"],
                                        pre=[traceback.format_exc(limit=-3)]))
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
    first = next((p for p in paths if str(p).endswith(".md")), paths[0])
    pngs = [n for n in outputs.written(out) if n.endswith(".png")]   # this run's plots, no one else's
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr, flush=True)
    print(f"Wrote {', '.join(str(p) for p in paths)} and {len(pngs)} PNG plots in {out} "
          f"in {summary['seconds']} s. Read {first} first.", flush=True)
    return 1 if failures else 0
