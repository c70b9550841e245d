"""The panel's HTML views: the estimate (verdict, breakdown bar, legend), the model list and its
messages, and the history of runs.

Plain functions of plain values, so that :mod:`kit.widgets` only wires controls to them.

>>> from kit.estimate import estimate
>>> from kit.presets import PRESETS, verdict
>>> est = estimate("tiny-gpt2", batch_size=2, seq_len=64)
>>> "FITS" in estimate_html(est, verdict(est, "colab-t4"), PRESETS["colab-t4"])
True
"""
from __future__ import annotations

import html
import re

from kit.plot import OFF_SCALE
from kit.presets import MODELLED_MARGIN, margin_kept
from kit.units import fmt_bytes

COLOURS = {"weights": "#0072B2", "gradients": "#E69F00", "optimizer state": "#009E73", "activations": "#CC79A7",
           "logits & loss": "#56B4E9", "autocast weight copies": "#D55E00", "temporaries": "#999999",
           "unsharded parameters": "#F0E442",   # (this and the next: kit.estimate.strategies)
           "communication buffers": "#000000"}


def estimate_html(est, verdict, preset, problem: str | None = None) -> str:
    """The estimate read aloud: :func:`verdict_html` (the answer), then :func:`details_html`."""
    return verdict_html(est, verdict, preset, problem) + ("" if est is None else details_html(est, preset))


def judged(est, preset) -> tuple[str, int, int, str]:
    """What :func:`kit.presets.verdict` judged: (its name, its bytes, the limit, where). On a GPU the reserved
    figure (the allocated peak plus the caching allocator's modelled gap), on the CPU the training peak.

    >>> from kit.estimate import estimate
    >>> from kit.presets import PRESETS
    >>> judged(estimate("tiny-gpt2", batch_size=2, seq_len=64, device="cpu"), PRESETS["cpu"])[0]
    'training peak'
    """
    if preset.gpu_bytes is None:   # training runs in the RAM the runtime leaves
        return "training peak", est.peak_bytes, preset.ram_for_model_bytes, "RAM the runtime leaves"
    held = getattr(est, "reserved_bytes", 0) or est.peak_bytes
    return ("reserved (modelled)" if held != est.peak_bytes else "peak allocated"), held, preset.gpu_bytes, "GPU"


def verdict_html(est, verdict, preset, problem: str | None = None) -> str:
    """The answer in two lines: the verdict with the one figure it judged, by name, and the limit; the biggest
    cause. The figure shown is the figure judged (never the allocated peak beside a reserved verdict)."""
    if est is None:
        return (f"<div class='kit-verdict' style='color:#D55E00;font-weight:bold'>No estimate: "
                f"{html.escape(problem or '')}</div>")
    name, figure, limit, where = judged(est, preset)
    colour, head = ("#009E73", "FITS") if verdict.fits else ("#E69F00", "TIGHT") if verdict.tight else \
        ("#D55E00", "DOES NOT FIT")
    if getattr(est, "num_gpus", 1) > 1 or getattr(est, "strategy", "single") != "single":
        head += f" EACH GPU ({est.num_gpus} x, {est.strategy})"
    margin = limit - figure
    spare = f"{fmt_bytes(margin)} to spare" if margin >= 0 else f"{fmt_bytes(-margin)} short"
    if verdict.tight:   # within the limit, not the margin kept while the figure is modelled
        spare += f", under the {MODELLED_MARGIN:.0%} margin ({fmt_bytes(margin_kept(limit))}) kept while it is modelled"
    ram = ""
    if preset.gpu_bytes is not None and verdict.ram_margin_bytes < margin_kept(preset.ram_bytes):
        ram = (f"; building the model needs <b>{fmt_bytes(est.cpu_build_bytes)}</b> beside the runtime's own "
               f"{fmt_bytes(preset.runtime_ram_bytes)}, of {fmt_bytes(preset.ram_bytes)} RAM ("
               + (f"{fmt_bytes(-verdict.ram_margin_bytes)} short: the session crashes" if verdict.ram_margin_bytes < 0
                  else f"a near miss, {fmt_bytes(verdict.ram_margin_bytes)} to spare") + ")")
    top = est.offenders[0] if est.offenders else None
    cause = (f"biggest: <b>{html.escape(top[0])}</b> {fmt_bytes(top[2])} with its training state &middot; "
             if top else "")
    return (f"<div class='kit-verdict' style='font-size:115%'><b style='color:{colour}'>{head}</b> "
            f"{html.escape(preset.label)}: <b class='kit-judged'>{fmt_bytes(figure)} {name}</b> of {fmt_bytes(limit)} "
            f"{where} ({spare}){ram}</div>"
            f"<div class='kit-cause' style='font-size:85%'>{cause}the breakdown and the notes: Details below</div>")


def details_html(est, preset) -> str:
    """The details behind the verdict: the allocated peak and its moment, the breakdown bar (on its own scale beside
    a far limit), its legend, the model's size and CPU build, the notes."""
    limit = preset.gpu_bytes if preset.gpu_bytes is not None else preset.ram_bytes
    own_scale = limit > OFF_SCALE * est.peak_bytes    # else a small model's bar is a sliver
    scale = (est.peak_bytes if own_scale else max(est.peak_bytes, limit, 1)) * 1.05
    parts = [(k, n) for k, n in est.components().items() if n > 0]
    segs = "".join(f"<div title='{k}' style='width:{100 * n / scale:.3f}%;background:{COLOURS[k]}'></div>"
                   for k, n in parts)
    mark = "" if own_scale else (f"<div style='position:absolute;left:{100 * limit / scale:.3f}%;top:-4px;"
                                 f"bottom:-4px;border-left:3px dashed #D55E00'></div>")
    against = (f"<div class='kit-bar-limit' style='display:flex;align-items:center;gap:6px;font-size:85%;"
               f"max-width:860px'><div style='flex:1;height:6px;background:#eee;position:relative'><div "
               f"style='width:{max(100 * est.peak_bytes / limit, 0.3):.3f}%;height:6px;background:#555'></div>"
               f"</div><span>the bar above, against the {fmt_bytes(limit)} limit: "
               f"{100 * est.peak_bytes / limit:.2f}% of it</span></div>") if own_scale else ""
    legend = " ".join(f"<span style='white-space:nowrap'><span style='display:inline-block;width:10px;height:10px;"
                      f"background:{COLOURS[k]}'></span> {k} {fmt_bytes(n)}</span>" for k, n in parts)
    held = judged(est, preset)
    gap = (f"; the caching allocator is modelled to reserve {fmt_bytes(held[1] - est.peak_bytes)} more "
           f"(expandable_segments {'on' if est.expandable_segments else 'off'}), and the verdict judges that"
           if held[1] != est.peak_bytes else "")
    lines = [f"<div class='kit-peak-line' style='font-size:85%'>predicted peak <b class='kit-peak'>"
             f"{fmt_bytes(est.peak_bytes)}</b> allocated (max_memory_allocated), at the "
             f"{html.escape(est.peak_moment)}{gap}</div>",
             f"<div class='kit-bar' style='position:relative;display:flex;height:24px;width:100%;max-width:860px;"
             f"background:#eee;margin:6px 0'>{segs}{mark}</div>", against,
             f"<div style='font-size:85%'>{legend}" + ("" if own_scale else
                                                     f" &middot; <span style='color:#D55E00'>- - limit "
                                                     f"{fmt_bytes(limit)}</span>") + "</div>",
             f"<div style='font-size:85%;color:#555'>{est.params:,} params, {est.trainable_params:,} trainable; "
             f"CPU RAM to build the model {fmt_bytes(est.cpu_build_bytes)}, beside the runtime's own "
             f"{fmt_bytes(preset.runtime_ram_bytes)} ({html.escape(preset.runtime_said)}), of "
             f"{fmt_bytes(preset.ram_bytes)}</div>"]
    lines += [f"<div style='font-size:85%;color:#555'>note: {html.escape(n)}</div>" for n in est.notes]
    return "".join(lines)


def model_options(scenario: int, own, shipped, tiny, yours=()) -> list[tuple[str, str]]:
    """The model dropdown's ``(label, value)`` pairs, in groups: the scenario's own models, yours
    (typed into the box), the shipped real models, then the tiny CPU twins. A Dropdown has no
    option groups in ipywidgets 7.7 or 8, so each label starts with its group.

    >>> [label for label, _ in model_options(1, ["distilgpt2"], ["gpt2"], ["tiny-llama"], ["my/config.json"])]
    ['scenario 1 · distilgpt2', 'yours · my/config.json', 'shipped · gpt2', 'tiny twin · tiny-llama']
    """
    groups = [(f"scenario {scenario}", own), ("yours", yours), ("shipped", shipped), ("tiny twin", tiny)]
    seen, out = set(), []
    for group, names in groups:
        for n in names:
            if n not in seen:
                seen.add(n)
                out.append((f"{group} · {n}", n))
    return out


def message_html(text: str, kind: str = "error") -> str:
    """A message under the model box: ``kind`` "error" (red, a warning sign), "ok" (green) or "busy" (grey).
    A list of the kit's known names in it is folded: the model list above shows them.

    >>> m = message_html("Unknown model 'x'. Known names: gpt2, tiny-llama. A path works too.")
    >>> m.split(">", 1)[1].split("<details")[0], m.split("</summary>")[1]
    ('&#9888; Unknown model &#x27;x&#x27;. A path works too.', 'gpt2, tiny-llama</details></div>')
    """
    if not text:
        return ""
    colour, sign = {"error": ("#D55E00", "&#9888; "), "ok": ("#009E73", ""), "busy": ("#555", "")}[kind]
    names = re.search(r" ?Known names: ((?:[^\s,]+, )*[^\s,]+)\.", text)
    body = html.escape(text)
    if names:
        listed = names.group(1).split(", ")
        body = (html.escape(text[:names.start()] + text[names.end():]) +
                f"<details style='color:#555'><summary>the kit's {len(listed)} known names</summary>"
                f"{html.escape(names.group(1))}</details>")
    return (f"<div class='kit-model-message kit-{kind}' style='font-size:85%;line-height:1.4;color:{colour};"
            f"max-width:860px'>{sign}{body}</div>")


def status_html(run: dict) -> str:
    """A run's status, coloured, with its error or note."""
    colour = {"ok": "#009E73", "sweep": "#0072B2"}.get(run["status"], "#D55E00")
    text = run.get("error") or run.get("note")
    extra = f": {html.escape(text)}" if text else ""
    who = f" &middot; {html.escape(run_label(run))}" if run.get("twin_of") else ""
    return f"<span class='kit-status' style='color:{colour}'><b>{run['status']}</b>{extra}{who}</span>"

def run_label(run: dict) -> str:
    """The model a run trained, named as the twin it is where it stood in for the model chosen (smoke mode).

    >>> run_label({"model": "tiny-llama", "twin_of": "meta-llama/Meta-Llama-3-8B"})
    'tiny twin tiny-llama (for meta-llama/Meta-Llama-3-8B)'
    """
    twin_of = run.get("twin_of")
    return f"tiny twin {run['model']} (for {twin_of})" if twin_of else str(run["model"])


def history_html(history: list) -> str:
    """Every run and sweep so far, one row each, measured beside predicted and their ratio."""
    cols = ["model", "batch_size", "seq_len", "quantization", "precision", "lora_r", "optimizer", "status",
            "predicted", "measured", "ratio", "returned"]
    names = {"ratio": "measured / predicted"}
    head = "".join(f"<th style='padding:2px 8px'>{names.get(c, c.replace('_', ' '))}</th>" for c in cols)
    rows = []
    for i, r in enumerate(history, 1):
        pred, meas = r.get("predicted_peak_bytes"), r.get("measured_peak_bytes")
        vals = {**r, "model": run_label(r), "predicted": fmt_bytes(pred) if pred else "",
                "measured": fmt_bytes(meas) if meas else "",
                "ratio": f"{meas / pred:.2f}x" if pred and meas else "",
                "returned": {True: "yes", False: "NO", None: ""}[r.get("returned")]}
        rows.append(f"<tr><td>{i}</td>" + "".join(f"<td class='kit-{c}' style='padding:2px 8px'>"
                                                  f"{html.escape(str(vals.get(c, '')))}</td>" for c in cols) + "</tr>")
    return (f"<table class='kit-history' style='font-size:85%;border-collapse:collapse'><tr><th>#</th>{head}</tr>"
            + "".join(rows) + "</table>")
