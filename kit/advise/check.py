"""``kit.check(trainer)``: the answer first (the verdict with the figure judged, the biggest cause, the best change),
then the setup and its components in a few lines; ``details=True`` adds the full estimate table, where each
setting was read from and the fit advisor's changes with their costs and code. Prediction only.

>>> from kit.estimate import estimate_from
>>> est = check(estimate_from("tiny-gpt2", seq_len=64), device="colab-t4")  # doctest: +ELLIPSIS
fits Colab T4: ... reserved (modelled) of 14.56 GiB (... to spare)
...
"""
from __future__ import annotations

from kit.advise.answer import biggest_cause
from kit.advise.core import advise, limit_for, setup_options
from kit.dtypes import trainer_precision
from kit.estimate import Estimate, estimate, estimate_trainer
from kit.inputs import InputError, Refusal, assumed, flag
from kit.presets import figures_line, resolve_device, verdict
from kit.units import fmt_bytes, wrap

TOP = 3   # the fit advisor's changes shown


def check(trainer_or_estimate, device=None, *, seq_len=None, details: bool = False):
    """Print the answer first (at most 5 lines), the setup in brief and the next changes; return the Estimate.

    A setup the kit cannot estimate is answered in three lines (what was found, why it cannot be predicted, the way
    forward), and None is returned: nothing raises for the kit's own refusal (:class:`kit.inputs.Refusal`).

    ``details=True`` prints the answer, then everything: the estimate table, where each setting was read from,
    and each of the advisor's changes with its costs and in your objects. ``device``: None judges against this
    GPU (what torch can have of it now: total memory less what other processes and the CUDA context use), or,
    with no GPU here, the ``"colab-t4"`` preset, and says so. A preset name (``"l4"``, ``"a100-80"``...),
    ``"this"`` or a number of bytes judges against that (:func:`kit.presets.resolve_device`). ``seq_len`` is for a
    Trainer (its data is read otherwise); with an Estimate it is refused, as the Estimate holds its own.
    """
    details = flag("details", details)
    if isinstance(trainer_or_estimate, Estimate) and seq_len is not None:
        made = trainer_or_estimate.setup.get("seq_len")
        raise InputError("seq_len", f"seq_len={seq_len!r} is read with a Trainer, and this Estimate was made for "
                         f"seq_len {made}: estimate again with seq_len={seq_len!r} and check that, or pass the "
                         "Trainer.", code="seq-len-of-an-estimate")
    preset, why = resolve_device(device)
    try:
        est = trainer_or_estimate if isinstance(trainer_or_estimate, Estimate) else \
            estimate_trainer(trainer_or_estimate, seq_len=seq_len, device="cuda" if preset.gpu_bytes else "cpu")
    except Refusal as exc:   # the kit's own refusal is the answer; any other exception is a bug, and propagates
        print("\n".join(refusal(trainer_or_estimate, exc)), flush=True)
        return None
    est = on_device(est, preset)
    v = verdict(est, preset)
    advice, problem = None, None
    if not v.fits:  # the fit advisor's changes
        try:
            advice = advise(trainer_or_estimate, preset, trainer_estimate=est)
        except ValueError as exc:
            problem = f"(no advice: {exc})"
    lines = answer(est, v, advice) + [problem] * bool(problem)
    lines += full(est, preset, why, advice) if details else brief(est, why) + [
        "details: kit.check(..., details=True): the full table, where each setting came from"
        + (", every change in full" if advice is not None else "")]
    print(wrap("\n".join(lines)), flush=True)  # a notebook page is WIDTH wide: the long lines fold
    return est


def on_device(est, preset):
    """``est`` as the device judged runs it: an Estimate made for other kernels (CUDA's, judged against a CPU, or
    the reverse), or with fp16 that Trainer ignores on a CPU (:func:`kit.dtypes.trainer_precision`), is estimated
    again for that device, so one setup on one device gets one verdict, whichever face asks (``python -m kit
    estimate --preset cpu`` estimates on CPU kernels too). One that cannot be rebuilt by name is refused."""
    device = "cuda" if preset.gpu_bytes else "cpu"
    made, precision = est.setup.get("device", "cuda"), est.setup.get("precision", "fp32")
    run, note = trainer_precision(precision, device)
    if made == device and run == precision:
        return est
    try:
        options, notes = setup_options(est, limit_for(preset))
    except InputError:
        raise InputError("device", f"this Estimate was made for {made} kernels in {precision}, and {preset.label} "
                         f"runs {device} kernels in {run}, which it cannot be rebuilt for: estimate it with "
                         f"device={device!r}" + (f", precision={run!r}" if run != precision else "") + ".",
                         code="estimate-of-another-device") from None
    again = estimate(**{**options, "device": device, "precision": run})
    again.notes.extend(notes + [note] * bool(note) + [
        f"estimated again for {preset.label}: the Estimate given was made for {made} kernels in {precision}"])
    return again


def refusal(trainer, exc: Refusal) -> list:
    """A refusal as the answer, in three lines: what was found, why the kit cannot predict it, the way forward
    (``kit.watch(trainer)`` measures what the estimator cannot predict; the input that would make it estimable)."""
    model = getattr(trainer, "model", None)
    found = f"{type(trainer).__name__} ({type(trainer).__module__})"
    if model is not None:
        params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
        found += f" training {type(model).__name__}" + (f" of {params:,} parameters" if params else "")
    forward = "kit.watch(trainer), then kit.train(trainer), measures it on a real step" if \
        hasattr(trainer, "callback_handler") else "nothing to measure: kit.check reads a Trainer or an Estimate"
    return [f"cannot estimate: found {found}",
            f"why: {getattr(exc, 'why', None) or exc}",
            f"way forward: {forward}" + (f"; {exc.instead}" if getattr(exc, "instead", None) else "")]


def answer(est, verdict, advice=None) -> list:
    """The answer's lines: the advisor's where it ran (the same verdict, its best change), else the verdict's
    (``verdict``: :func:`kit.presets.verdict` of ``est``)."""
    if advice is not None:
        return advice.answer()
    return [verdict.text] + [x for x in [figures_line(est)] if x] + [biggest_cause(est)] + \
        ["no change needed"] * verdict.fits


def brief(est, why=None) -> list:
    """A blank line, the setup and its components at the peak in two lines, and where the device came from."""
    s, peak = est.setup, est.peak_bytes
    idle = est.sources.get("idle_params", (0,))[0]   # requires_grad, and no gradient
    trained = f"LoRA r{s.get('lora_r')}" if s.get("lora_r") else "full fine-tune" if \
        est.trainable_params + idle >= est.params else f"{est.trainable_params:,} of {est.params:,} parameters trained"
    trained += f" ({idle:,} more get no gradient: the base's pooler, unread by the head)" if idle else ""
    quant = "" if s.get("quantization") in (None, "none") else f"{s.get('quantization')} weights, "
    parts = [f"{k} {fmt_bytes(n)}" for k, n in est.components().items() if n >= 0.01 * peak]
    out = ["", f"{s.get('model')}: batch {s.get('batch_size')} x seq {s.get('seq_len')}, {s.get('precision')}, "
               f"{quant}{trained}, {s.get('optimizer')}, checkpointing "
               f"{'on' if s.get('gradient_checkpointing') else 'off'}",
           "  at the peak: " + ", ".join(parts)]
    if s.get("generation_peak_bytes"):   # GRPOTrainer (kit.estimate.grpo): the generation phase, its own peak
        out.append(f"  generation phase: {fmt_bytes(s['generation_peak_bytes'])} at {s['generation_moment']} "
                   f"({s['generation_rows']} rows x {s['prompt_len']} + {s['completion_len']} tokens)")
    vllm = [n for n in est.notes if getattr(n, "code", None) == "grpo-vllm-cpu"]
    out += [f"  note: {n}" for n in assumed(est.notes) + vllm]   # (what the figures assumed, said with the setup)
    return out + ([why] if why else [])


def full(est, preset, why, advice) -> list:
    """Everything: the estimate table, where the device came from, the sources, the advisor's changes in full."""
    out = ["", est.table(preset, answer=False)] + ([why] if why else [])   # (the answer is printed above it)
    sources = est.sources
    if sources:
        out.append("where each setting was read from:")
        out += [f"  {k:<24}{show_value(v):<22} {w}" for k, (v, w) in sources.items()]
    if advice is not None:
        out += ["", "the fit advisor in full:"] + advice.details(TOP)
    return out


def show_value(value) -> str:
    """A setting's value as :func:`check` prints it: a list joined by commas, or its count when long.

    >>> show_value(("q_proj", "v_proj")), show_value(16)
    ('q_proj,v_proj', '16')
    """
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) if len(",".join(map(str, value))) <= 40 else f"{len(value)} modules"
    return str(value)
