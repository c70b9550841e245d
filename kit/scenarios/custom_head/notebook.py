"""Notebook-facing helpers of scenario 1 (``notebooks/01_distilgpt2_custom_head.ipynb``).

The logic is in :mod:`kit.scenarios.custom_head.scenario`; this module only wraps its runs in a live
stage plot and reads its records aloud, so that each notebook cell stays short. The helpers
every notebook uses (``run_note``, ``quiet``) are :mod:`kit.scenarios.notebook`'s.

- :func:`breakdown_figure`: the original's estimate as a stacked bar (nothing measured).
- :func:`fixes_at_real_size`: the three fixes at DistilGPT2's real size, against a preset.
- :func:`advisor_text`: what the fit advisor (:mod:`kit.advise`) finds for the user's setup, unaided.
- :func:`live_fix` / :func:`live_original`: a run with the live stage plot.
- :func:`user_trainer`: the user's own Trainer, built by their code; :func:`beside_registry`: its estimate
  (``kit.check``'s) beside the kit's registry model's.
- :func:`record_text` / :func:`record_figure`: a run's estimate against its measurement.
- :func:`original_at_real_size`: why the real-size original is not started here (or that it would be).
- :func:`stage_table`: a run's stages in the columns the lesson reads. The exercises and the checks of the
  learner's answers are :mod:`.exercises`' (imported here, so that the notebook reads them as ``nb.*``).
- :func:`reading_text`: what a run's MEASURED peak is, said once; :func:`temporaries_text`: what the
  breakdown's temporaries are at the peak, from the estimate's own parts.
- :func:`fix_trainer` / :func:`release`: a fix's Trainer for a cell that reads torch's own counters.
- :func:`workshop_plan`: the teaching plan with its compute minutes, counted at real size on a T4 (a PLAN), from
  :mod:`.workshop`.

>>> print(fixes_at_real_size())                       # doctest: +SKIP
>>> record, tracker = live_fix("a", "smoke")          # doctest: +SKIP
"""
from __future__ import annotations

from kit import dtypes, machine, plot
from kit.advise import advise
from kit.measure import cleanup
from kit.measure import device as kdevice
from kit.measure.track import Tracker
from kit.plot.live import LivePlot
from kit.presets import PRESETS, verdict
from kit.scenarios.custom_head import runs as s1_runs
from kit.scenarios.custom_head import scenario
from kit.scenarios.custom_head.exercises import (  # noqa: F401 (read by the notebook as nb.*)
    culprit_check,
    fits_answer_text,
    fix_verdicts,
    largest_rank,
    gpu_verdicts,
    panel_gpu_check,
    rank_check,
    ratio_text,
    toy_model,
    twin_rank,
    usable_bytes,
)
from kit.scenarios.custom_head.workshop import (  # noqa: F401 (read by the notebook as nb.*)
    WORKSHOP_MINUTES,
    WORKSHOP_SECTIONS,
    plan_work,
    workshop_plan,
)
from kit.units import fmt_bytes, wrap, wrapped


def breakdown_figure(pred: "scenario.Prediction", preset: str = "colab-t4"):
    """The prediction's components stacked in one bar, against the preset's GPU memory (an estimate:
    nothing is measured, so nothing is drawn as "not run").

    >>> fig = breakdown_figure(scenario.predict_original("real"))
    """
    p = PRESETS[preset]
    return plot.breakdown(pred.estimate.components(), p.gpu_bytes, device_label=p.label.split(" (")[0],
                          title=f"ESTIMATED peak of a training step: {pred.name}", unit=None)


@wrapped
def fixes_at_real_size(preset: str = "colab-t4") -> str:
    """The original and the three fixes at real size (the Colab recipe: fp16 or bf16 on a GPU), ESTIMATED.

    >>> "custom_layer" in fixes_at_real_size() or "(a)" in fixes_at_real_size()
    True
    """
    pred, dtype = scenario.predict_original("real"), dtypes.for_preset(preset)[0]  # fix (c) in the preset's 16 bits
    rows = [("the user's setup", pred.estimate)] + [
        (scenario.fix_setup(w, "real", dtype=dtype)["name"], scenario.estimate_fix(w, "real", dtype=dtype))
        for w in scenario.FIXES]
    w = max(len(name) for name, _ in rows) + 2
    lines = [f"ESTIMATED at real size, against {PRESETS[preset].label}:",
             f"  {'setup':<{w}}{'trainable':>15}{'GPU peak':>12}{'CPU build':>12}  verdict"]
    for name, est in rows:
        fits = "fits" if verdict(est, preset).fits else "DOES NOT FIT"
        lines.append(f"  {name:<{w}}{est.trainable_params:>15,}{fmt_bytes(est.peak_bytes):>12}"
                     f"{fmt_bytes(est.cpu_build_bytes):>12}  {fits}")
    refused = scenario.fix_setup("c", "real", dtype=dtype).get("refused")
    if refused:
        est8 = scenario.estimate_fix("c", "real", dtype=dtype, optimizer="adamw-8bit")
        lines.append(f"  (c) with 8-bit AdamW, had bitsandbytes allowed it: GPU peak {fmt_bytes(est8.peak_bytes)}, "
                     f"{'fits' if verdict(est8, preset).fits else 'DOES NOT FIT'}.")
        lines.append(f"  Why not: {refused}")
    return "\n".join(lines)


@wrapped
def advisor_text(preset: str = "colab-t4", top: int = 3) -> str:
    """The fit advisor on the user's setup at real size: its ``top`` cheapest changes, ESTIMATED.

    >>> "custom_layer" in advisor_text()
    True
    """

    return "ESTIMATED by the fit advisor (python -m kit fit), for the user's setup at real size:\n" + \
        advise({"model": scenario.NAMES["real"], **scenario.USER}, preset).text(top=top)


def _live(title: str) -> Tracker:
    tracker = Tracker()
    LivePlot(tracker, draw=lambda tracked: plot.timeline(tracked, title=f"{title} ({kdevice.best_reading()})",
                                                         unit=None))
    return tracker


def live_fix(which: str, size: str | None = None, *, steps: int = 2, grad_accum: int | None = None,
             rank: int | None = None):
    """:func:`kit.scenarios.custom_head.runs.run_fix` with the live stage plot. Returns ``(record, tracker)``.

    After an out-of-memory error (caught and freed) ``record`` has ``oom=True``, ``error`` and no
    measured peak.

    >>> record, tracker = live_fix("b", "smoke")      # doctest: +SKIP
    """
    tracker = _live(f"Fix ({which}): MEASURED per stage")
    return s1_runs.run_fix(which, size, steps=steps, grad_accum=grad_accum, tracker=tracker, rank=rank)  # OOM-safe


def user_trainer(size: str | None = None, *, steps: int = 2, grad_accum: int | None = None):
    """The user's Trainer, built by their own code on the model this run trains
    (:func:`kit.scenarios.custom_head.runs.user_trainer`), with the workshop's keywords said; None (and why)
    where building it would exhaust this CPU's RAM.

    >>> trainer = user_trainer("smoke")               # doctest: +SKIP
    """
    size = scenario.size_name(size)
    _, refused = s1_runs.ram_check(size, s1_runs.grad_accum_for(None, grad_accum))
    if refused:
        print(f"The user's code was not run at {size} size here. {refused}")
        return None
    trainer, workshop = s1_runs.user_trainer(size, steps=steps, grad_accum=grad_accum)
    print(f"The user's Trainer, on {type(trainer.model).__name__} (V = {trainer.model.custom_layer.out_features:,}); "
          "the workshop's keywords over their TrainingArguments:")
    print(wrap("  " + ", ".join(f"{k}={v!r}" for k, v in workshop.items() if k != "output_dir") +
               ", output_dir=a temporary folder"))
    return trainer


@wrapped
def beside_registry(trainer, est_user, pred: "scenario.Prediction | None" = None) -> str:
    """``kit.check``'s estimate of the user's Trainer beside the kit's: its registry model (``VocabHeadModel``
    on the same base) at the same vocabulary and in the same settings, their ratio, and ``pred``, the registry
    model at real size (section 1). All ESTIMATED: nothing trains.

    >>> print(beside_registry(trainer, kit.check(trainer), scenario.predict_original("real")))   # doctest: +SKIP
    """
    same = scenario.same_size_registry(trainer, est_user)
    v = trainer.model.custom_layer.out_features
    lines = [f"ESTIMATED peaks (kit.check's settings: {est_user.setup['precision']}, batch "
             f"{est_user.setup['batch_size']} x {est_user.setup['seq_len']} tokens, accumulation "
             f"{est_user.setup['grad_accum']}, {est_user.setup['device']} kernels):",
             f"  the user's Trainer ({type(trainer.model).__name__}, V = {v:,}): {fmt_bytes(est_user.peak_bytes)}",
             f"  the kit's {same.setup['model']}, the same settings: {fmt_bytes(same.peak_bytes)}",
             f"  ratio, the user's / the kit's: {est_user.peak_bytes / same.peak_bytes:.6f}"]
    if pred is not None:
        lines.append(f"  the kit's {pred.name} at real size (V = 50,258, section 1): {fmt_bytes(pred.peak_bytes)}")
    return "\n".join(lines)


def live_original(size: str | None = None, *, steps: int = 2, grad_accum: int | None = None, trainer=None):
    """:func:`kit.scenarios.custom_head.runs.run_original_safely` with the live stage plot: the user's own code,
    or ``trainer``, the one :func:`user_trainer` built (freed after the run).

    >>> record, tracker = live_original("smoke")      # doctest: +SKIP
    """
    return s1_runs.run_original_safely(size, steps=steps, grad_accum=grad_accum, trainer=trainer,
                                       tracker=_live("The user's code, OOM-safe: MEASURED per stage"))


@wrapped
def record_text(record: dict) -> str:
    """A run's ESTIMATED peak (the setup as it ran here) against its MEASURED peak, read aloud.

    >>> print(record_text({"name": "x", "estimate_peak_bytes": 2**20, "measured_peak_bytes": None,
    ...                    "reading": "live_tensor_bytes", "note": "Not run."}))   # doctest: +NORMALIZE_WHITESPACE
    x
      ESTIMATED peak, as run here: 1.00 MiB
      MEASURED peak (live_tensor_bytes): not run. Not run.
    """
    est, meas = record["estimate_peak_bytes"], record["measured_peak_bytes"]
    lines = [record.get("name", "the user's setup"), f"  ESTIMATED peak, as run here: {fmt_bytes(est)}"]
    if meas is None:
        why = record.get("refused") or record.get("note") or ""
        if record.get("oom"):
            why = f"OUT OF MEMORY, caught by the kit and freed: {record.get('error')}"
        lines.append(f"  MEASURED peak ({record['reading']}): not run. {why}".rstrip())
        return "\n".join(lines)
    lines.append(f"  MEASURED peak ({record['reading']}): {fmt_bytes(meas)}, {meas / est:.2f}x the estimate")
    returned = {True: "yes", False: "NO", None: "not checked"}[record.get("returned")]
    lines.append(f"  memory back at the baseline after cleanup: {returned}")
    if record.get("note"):
        lines.append(f"  note: {record['note']}")
    return "\n".join(lines)


def record_figure(record: dict):
    """Predicted (the estimate's components, as run) against measured, for a :func:`live_fix` record.

    >>> fig = record_figure(live_fix("a", "smoke")[0])      # doctest: +SKIP
    """
    est = scenario.estimate_fix(record["which"], record.get("size"), as_run=True, grad_accum=record["grad_accum"])
    return plot.predicted_vs_measured(est.components(), record["measured_peak_bytes"], PRESETS["colab-t4"].gpu_bytes,
                                      title=f"{record['name']}: ESTIMATED vs MEASURED ({record['reading']})",
                                      device_label="Colab T4", unit=None)   # MiB for a tiny twin, GiB at real size


@wrapped
def summary_table(original: dict, fixes: list) -> str:
    """Every measured run of the notebook in one table: ESTIMATED (as run) against MEASURED peak.

    >>> print(summary_table({"estimate_peak_bytes": 2**30, "measured_peak_bytes": None, "oom": True,
    ...                      "reading": "cuda_allocated"}, []))      # doctest: +NORMALIZE_WHITESPACE
    run                           estimated      measured  meas/est  (cuda_allocated)
    the user's setup, OOM-safe     1.00 GiB out of memory
    """
    runs = [dict(original, name="the user's setup, OOM-safe")] + list(fixes)
    w = max(len(r["name"]) for r in runs) + 2
    lines = [f"{'run':<{w}}{'estimated':>11}{'measured':>14}{'meas/est':>10}  ({original['reading']})"]
    for r in runs:
        m = r["measured_peak_bytes"]
        shown = fmt_bytes(m) if m is not None else ("out of memory" if r.get("oom") else "not run")
        ratio = f"{m / r['estimate_peak_bytes']:.2f}" if m is not None else ""
        lines.append(f"{r['name']:<{w}}{fmt_bytes(r['estimate_peak_bytes']):>11}{shown:>14}{ratio:>10}")
    return "\n".join(lines)


@wrapped
def original_at_real_size(size: str | None = None) -> str:
    """What running the user's real-size setup here would do, without starting it when it cannot fit.

    On a CPU, exhausting RAM kills the kernel instead of raising, so the kit refuses; on a GPU the
    OOM-safe wrapper would catch the error, but in smoke mode the notebook does not spend the time.

    >>> original_at_real_size("smoke").startswith(("Refused", "Not started"))
    True
    """
    if (size or scenario.runtime.mode()) == "real":
        return "The run above was the user's setup at real size."
    est = scenario.predict_original("real").estimate
    if not machine.has_cuda():
        problem = s1_runs.ram_problem(scenario.estimate_user(scenario.NAMES["real"], precision="fp32", device="cpu",
                                                    grad_accum=s1_runs.grad_accum_for(None)))
        if problem:
            return f"Refused at real size on this machine. {problem}"
    return ("Not started at real size in smoke mode (ESTIMATED GPU peak "
            f"{fmt_bytes(est.peak_bytes)}); set KIT_SMOKE=0 on a GPU to run it OOM-safe.")


def stage_table(tracker) -> str:
    """The stages of a run, MEASURED, in the columns the lesson reads: memory after each stage, what the
    stage added, and its peak where it was read exactly ("-" where only a lower bound was seen: on a CPU
    only the training is watched op by op). ``tracker.summary()`` has every column.

    >>> print(stage_table(Tracker()))
    no stages recorded
    """
    done = [r for r in tracker.records if r.end is not None]
    if not done:
        return "no stages recorded"
    lines = [f"MEASURED per stage ({tracker.reading}):", f"  {'stage':<16}{'after it':>12}{'change':>12}{'peak':>12}"]
    for r in done:
        change = "-" if r.delta_bytes is None else ("+" if r.delta_bytes >= 0 else "-") + fmt_bytes(abs(r.delta_bytes))
        peak = fmt_bytes(r.peak_bytes) if r.peak_bytes is not None and r.peak_exact else "-"
        lines.append(f"  {r.name[:16]:<16}{fmt_bytes(r.end_bytes):>12}{change:>12}{peak:>12}")
    return "\n".join(lines)


@wrapped
def reading_text(reading: str) -> str:
    """What a run's MEASURED peak is, for the counter ``reading`` (:func:`kit.measure.device.best_reading`): said
    once, before the first run's numbers.

    >>> reading_text("live_tensor_bytes").startswith("On a CPU")
    True
    """
    if reading == "live_tensor_bytes":
        return ("On a CPU, each MEASURED peak below is the most tensor bytes alive at once, counted op by op by the "
                "kit's live-tensor counter, activations included: the CPU's stand-in for CUDA's max allocated.")
    return (f"On this GPU, each MEASURED peak below ({reading}) is CUDA's max allocated during training "
            "(torch.cuda.max_memory_allocated()), less what was alive before the run: what the estimate predicts.")


@wrapped
def temporaries_text(pred: "scenario.Prediction") -> str:
    """What the breakdown's *temporaries* are at the predicted peak, read from the estimate's own parts
    (ESTIMATED): at the head's backward of a later micro-batch, the new gradient of the head, in autocast's 16
    bits and cast to the weight's fp32, before it is added into the ``.grad`` that the earlier micro-batches left.

    >>> print(temporaries_text(scenario.predict_original("real")))      # doctest: +ELLIPSIS
    ESTIMATED temporaries at the peak (backward (head)): 14.13 GiB, 27% of the peak. ...
    """
    est = pred.estimate
    parts = est.components()
    temp, half, cast = parts["temporaries"], est.context.wtemp["head"], est.context.grads["head"]
    head = f"ESTIMATED temporaries at the peak ({est.peak_moment}): {fmt_bytes(temp)}, {temp / est.peak_bytes:.0%} " \
           "of the peak."
    rest = temp - half - cast
    if est.peak_moment != "backward (head)" or est.setup.get("grad_accum", 1) < 2 or not half or rest < 0:
        return f"{head} They are the tensors of one operation that live only until it ends (see the glossary)."
    return (f"{head} In a micro-batch after the first, autograd makes the head's new gradient for autocast's "
            f"16-bit copy of its weight ({fmt_bytes(half)}), then casts it to the weight's fp32 ({fmt_bytes(cast)}), "
            f"and only then adds it into the fp32 .grad that the earlier micro-batches left (the gradients bar, "
            f"{fmt_bytes(parts['gradients'])}); the rest ({fmt_bytes(rest)}) is the gradient flowing into the head "
            "and the batch's token ids. The 16-bit copy of the head is freed by then, so the autocast bar holds "
            f"only the other weights' copies ({fmt_bytes(parts['autocast weight copies'])}).")


# -- PyTorch's own counters, read by the notebook's cells -------------------------------------------------
def fix_trainer(which: str, size: str | None = None, *, steps: int = 2, grad_accum: int | None = None):
    """Fix ``which``'s Trainer, as its measured run builds it, built and not trained, with the ESTIMATE of its
    run here (:func:`kit.scenarios.custom_head.runs.fix_trainer`): for a cell that trains it and reads torch's own
    counters around the run. Returns ``(trainer, estimate)``.

    >>> trainer, est = fix_trainer("a", "smoke")      # doctest: +SKIP
    """
    trainer, est = s1_runs.fix_trainer(which, size, steps=steps, grad_accum=grad_accum)
    print(wrap(f"Fix ({which})'s Trainer, built, not trained yet: {trainer.args.max_steps} step(s) of "
               f"{trainer.args.gradient_accumulation_steps} micro-batches; the ESTIMATED peak of that run: "
               f"{fmt_bytes(est.peak_bytes)}"))
    return trainer, est


def release(trainer) -> None:
    """Free a Trainer that :func:`fix_trainer` built, its model's weights included; returns None, so that the
    cell can rebind the name (``step_trainer = nb.release(step_trainer)``).

    >>> release(None)
    """
    if trainer is not None:
        cleanup.release(trainer, getattr(trainer, "model", None), free_model=True)
    return None
