"""``make gpu-check``'s verdicts: what the demo's ``summary.json`` says against what the kit predicted.

Pure logic on dicts (no torch, no GPU), so it is unit-tested with summary.json dicts. Each verdict is
``{"check", "status", "detail", "figures"}``; ``status`` is one of ``passed``, ``FAILED``,
``not checked`` (the check cannot be made from what exists; ``detail`` says why) and ``not taken`` (a
reading it needs is missing). Each figure is ``{"bytes", "kind"}`` with ``kind`` ``measured``,
``estimated`` or ``set`` (the cap), so the report can label every number.

>>> v = verdicts({"size": "real", "device": "NVIDIA T4", "reading": "cuda_allocated", "errors": []}, 2**30)
>>> [(x["check"], x["status"]) for x in v][:2]
[('demo ran at real size on the GPU', 'passed'), ('scenario 1', 'not taken')]
"""
from __future__ import annotations

PASSED, FAILED, NOT_CHECKED, NOT_TAKEN = "passed", "FAILED", "not checked", "not taken"
MEASURED, ESTIMATED, SET = "measured", "estimated", "set"
FLAT = 0.01            # the fixed loop's fold peaks, and every fold's end, within 1% (kit's own tolerance)
FIXED_FOLDS = 5        # kit/demo.py runs the fixed loop over 5 folds


def fig(value, kind: str) -> dict:
    """One labelled figure: ``{"bytes": int|None, "kind": "measured"|"estimated"|"set"}``."""
    return {"bytes": value if isinstance(value, int) and not isinstance(value, bool) else None, "kind": kind}


def verdict(check: str, status: str, detail: str, figures: dict | None = None) -> dict:
    return {"check": check, "status": status, "detail": detail, "figures": figures or {}}


def _gib(n) -> str:
    return "not taken" if n is None else f"{n / 2**30:.2f} GiB"


def _demo(summary: dict) -> dict:
    problems = []
    if summary.get("size") != "real":
        problems.append(f"size is {summary.get('size')!r}, not 'real'")
    if summary.get("reading") != "cuda_allocated":
        problems.append(f"reading is {summary.get('reading')!r}, not 'cuda_allocated'")
    if summary.get("errors"):
        problems.append("errors: " + "; ".join(map(str, summary["errors"])))
    return verdict("demo ran at real size on the GPU", FAILED if problems else PASSED,
                   "; ".join(problems) or f"{summary.get('device')}, reading {summary.get('reading')}")


def _original(s1: dict, cap: int) -> dict:
    o = s1.get("original") or {}
    est, meas, oom = o.get("estimate_peak_bytes"), o.get("measured_peak_bytes"), o.get("oom")
    figs = {"estimated peak": fig(est, ESTIMATED), "measured peak": fig(meas, MEASURED), "cap": fig(cap, SET)}
    name = "scenario 1: the original runs out of memory and is caught (or is refused)"
    if o.get("refused"):
        return verdict(name, PASSED, f"refused before it ran: {o['refused']}", figs)
    if est is None or oom is None:
        return verdict(name, NOT_TAKEN, "the original's estimate or its oom flag is missing", figs)
    if oom is True:
        if est <= cap:
            return verdict(name, FAILED, f"it ran out of memory, but was estimated to fit ({_gib(est)})", figs)
        return verdict(name, PASSED, f"estimated at {_gib(est)} against the cap {_gib(cap)}; it ran out of "
                                     "memory and the demo caught it and went on", figs)
    if meas is None:
        return verdict(name, NOT_TAKEN, "no out-of-memory error and no measured peak recorded", figs)
    return verdict(name, FAILED, f"it fit: measured {_gib(meas)} under the cap {_gib(cap)} "
                                 f"(estimated {_gib(est)})", figs)


def _fix(s1: dict, letter: str, cap: int) -> dict:
    fixes = [f for f in s1.get("fixes") or [] if str(f.get("name", "")).startswith(f"({letter})")]
    name = f"scenario 1: fix ({letter}) fits"
    if not fixes:
        return verdict(name, NOT_TAKEN, f"fix ({letter}) is not in summary.json")
    f = fixes[0]
    est, meas = f.get("estimate_peak_bytes"), f.get("measured_peak_bytes")
    figs = {"estimated peak": fig(est, ESTIMATED), "measured peak": fig(meas, MEASURED)}
    if f.get("oom"):
        return verdict(name, FAILED, f"{f['name']}: ran out of memory under the cap {_gib(cap)}", figs)
    if meas is None:
        return verdict(name, NOT_TAKEN, f"{f['name']}: no measured peak recorded", figs)
    ratio = f", {meas / est:.2f}x the estimate" if est else ""
    status = PASSED if meas <= cap else FAILED
    return verdict(name, status, f"{f['name']}: measured {_gib(meas)}{ratio}, cap {_gib(cap)}", figs)


def _fix_c(s1: dict, cap: int) -> dict:
    """Fix (c) (the V x V head in bf16) is predicted NOT to fit a T4: the prediction must hold either way."""
    fixes = [f for f in s1.get("fixes") or [] if str(f.get("name", "")).startswith("(c)")]
    name = "scenario 1: fix (c) behaves as estimated"
    if not fixes:
        return verdict(name, NOT_TAKEN, "fix (c) is not in summary.json")
    f = fixes[0]
    est, meas, oom = f.get("estimate_peak_bytes"), f.get("measured_peak_bytes"), f.get("oom")
    figs = {"estimated peak": fig(est, ESTIMATED), "measured peak": fig(meas, MEASURED)}
    if est is None or oom is None or (not oom and meas is None):
        return verdict(name, NOT_TAKEN, "its estimate, oom flag or measured peak is missing", figs)
    predicted_oom = est > cap
    said = "ran out of memory (caught)" if oom else f"fit, measured {_gib(meas)}"
    return verdict(name, PASSED if predicted_oom == bool(oom) else FAILED,
                   f"estimated {_gib(est)} ({'over' if predicted_oom else 'under'} the cap {_gib(cap)}); it {said}",
                   figs)


def _alive(fold: dict):
    """Models alive when the fold's model had loaded: the newer field, else the older one."""
    for key in ("models_alive_after_load", "models_alive_at_start"):
        if fold.get(key) is not None:
            return fold[key]
    return None


def _broken(s2: dict, cap: int) -> dict:
    b, est = s2.get("broken") or {}, s2.get("estimate") or {}
    folds, oom_at, model = b.get("folds") or [], b.get("oom_at_fold"), est.get("model", "the demo's model")
    name = "scenario 2: the broken loop runs out of memory in fold 2, or shows two models alive"
    figs = {"two models, estimated": fig(est.get("two_models_bytes"), ESTIMATED), "cap": fig(cap, SET)}
    for i, f in enumerate(folds[:2], 1):
        figs[f"fold {i} peak"] = fig(f.get("peak_bytes"), MEASURED)
    if oom_at == 1:
        return verdict(name, FAILED, "it ran out of memory in fold 1: one model alone did not fit", figs)
    if oom_at == 2:
        return verdict(name, PASSED, f"it ran out of memory in fold 2 ({model}), as predicted", figs)
    if oom_at is not None and oom_at > 2:
        return verdict(name, FAILED, f"it ran out of memory in fold {oom_at}, not in fold 2: something the "
                                     "prediction does not count grew after fold 2", figs)
    if len(folds) < 2:
        return verdict(name, NOT_TAKEN, "fold 2 has no record", figs)
    alive = _alive(folds[1])
    if alive is None:
        return verdict(name, NOT_TAKEN, "fold 2's count of models alive is missing", figs)
    if alive < 2:
        return verdict(name, FAILED, f"fold 2 had {alive} model alive: the old model was freed, the bug did not "
                                     "reproduce", figs)
    two = est.get("two_models_bytes")
    if two is not None and two > cap:
        return verdict(name, FAILED, f"fold 2 had {alive} models alive, estimated at {_gib(two)}, over the cap "
                                     f"{_gib(cap)}, and yet it did not run out of memory", figs)
    why = (f"two models alive did not run out of memory because the demo's real-size model is {model} in 4-bit: "
           f"two of them are estimated at {_gib(two)}, under the cap {_gib(cap)}")
    return verdict(name, PASSED, f"two models alive: fold 2 had {alive} models alive after its load; {why}", figs)


GRID_TOLERANCE_PCT = 2.0   # the error a GPU grid row may have: the kit's claim for the setups it builds itself


def grid_verdict(rc: int | None, rows: list[dict], stage_detail: str) -> dict:
    """The GPU grid passes on its numbers, not its exit code: every row parsed, each within
    :data:`GRID_TOLERANCE_PCT` of its measurement.

    >>> grid_verdict(0, [{"label": "a", "model": "m", "error_pct": -3.1}], "exit 0")["status"]
    'FAILED'
    >>> grid_verdict(0, [], "exit 0")["status"]
    'not taken'
    """
    name = f"the GPU grid: every estimate within {GRID_TOLERANCE_PCT:g}% of its measured peak"
    if not rows:
        return verdict(name, NOT_TAKEN, f"no grid row was printed ({stage_detail})")
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    figs = {"worst error, percent": fig(worst["error_pct"], MEASURED)}
    bad = [r for r in rows if abs(r["error_pct"]) > GRID_TOLERANCE_PCT]
    detail = (f"{len(rows)} rows, worst {worst['error_pct']:+.2f}% ({worst['label'].strip()}, {worst['model']})"
              + (f"; {len(bad)} over {GRID_TOLERANCE_PCT:g}%" if bad else "") + (f"; {stage_detail}" if rc else ""))
    return verdict(name, FAILED if bad or rc else PASSED, detail, figs)


def notebook_verdict(name: str, rc: int | None, outputs: str | None, stage_detail: str) -> dict:
    """A notebook run at real size passes when it ran to its end *and* its run note says REAL sizes.

    >>> notebook_verdict("nb", 0, "These outputs come from a run on ... SMOKE mode: tiny twins", "exit 0")["status"]
    'FAILED'
    """
    what = f"notebook {name} runs at real size under the cap"
    if outputs is None:
        return verdict(what, NOT_TAKEN, f"no executed notebook was written ({stage_detail})")
    if rc:
        return verdict(what, FAILED, stage_detail)
    if "REAL sizes" not in outputs:
        return verdict(what, FAILED, "it ran, but its run note does not say REAL sizes: it ran in smoke mode")
    return verdict(what, PASSED, f"ran to its end, and its run note says REAL sizes ({stage_detail})")


def crash_verdict(crash: dict | None, cap: int, missing: str = "") -> dict:
    """The crash stage (``gpu_check_crash.py``): the user's loop at Llama-3-8B size under the cap. It passes
    only when what was predicted came true: out of memory in fold 2, at its load when the estimate put the
    load over the cap.

    >>> crash_verdict(None, 2**30, "timed out")["status"]
    'not taken'
    """
    name = "scenario 2 at Llama-3-8B size: out of memory in fold 2"
    if not crash:
        return verdict(name, NOT_TAKEN, f"the crash stage wrote no result: {missing or 'no file'}")
    pred, b = crash.get("prediction") or {}, crash.get("broken") or {}
    folds, oom_at = b.get("folds") or [], b.get("oom_at_fold")
    f2 = folds[1] if len(folds) > 1 else {}
    figs = {"fold 2 loaded, estimated": fig(pred.get("loaded_bytes"), ESTIMATED),
            "fold 2's load peak, estimated": fig(pred.get("load_peak_bytes"), ESTIMATED), "cap": fig(cap, SET),
            "fold 2's load peak": fig(f2.get("load_peak_bytes"), MEASURED)}
    at_load = (pred.get("load_peak_bytes") or 0) > cap
    expected = "at its load" if at_load else "in its training"
    if oom_at == 2:
        during = f2.get("oom_during")
        where = "while loading" if during == "load" else "while training" if during == "train" else "(phase not taken)"
        ok = during == ("load" if at_load else "train")
        return verdict(name, PASSED if ok else FAILED,
                       f"{crash.get('model')}: out of memory in fold 2 {where}, with "
                       f"{f2.get('models_alive_after_load', 'an uncounted number of')} models alive after the load; "
                       f"predicted {expected} (load peak ESTIMATED {_gib(pred.get('load_peak_bytes'))}, "
                       f"cap {_gib(cap)})", figs)
    if oom_at == 1:
        return verdict(name, FAILED, "out of memory in fold 1: one model alone did not fit", figs)
    if len(folds) < 2:
        return verdict(name, NOT_TAKEN, "fold 2 has no record", figs)
    return verdict(name, FAILED, f"no out-of-memory error: fold 2's load peaked at "
                                 f"{_gib(f2.get('load_peak_bytes'))} with {_alive(f2)} models alive, under the cap "
                                 f"{_gib(cap)}; the estimate ({_gib(pred.get('load_peak_bytes'))}) said it would not "
                                 "fit", figs)


def _fixed(s2: dict) -> list[dict]:
    folds = (s2.get("fixed") or {}).get("folds") or []
    flat, reset = ("scenario 2: the fixed loop's fold peaks stay within 1%",
                   "scenario 2: the adapter reset is verified on every fold")
    peaks = [f.get("peak_bytes") for f in folds]
    figs = {f"fold {i} peak": fig(p, MEASURED) for i, p in enumerate(peaks, 1)}
    if len(folds) < 2 or any(p is None for p in peaks):
        out = [verdict(flat, NOT_TAKEN, f"{len(folds)} fold record(s), a peak missing or fewer than two", figs)]
    else:
        spread = (max(peaks) - min(peaks)) / min(peaks)
        short = len(folds) < FIXED_FOLDS
        ok = spread <= FLAT and not short
        out = [verdict(flat, PASSED if ok else FAILED,
                       f"peaks spread {100 * spread:.3f}% over {len(folds)} of {FIXED_FOLDS} folds"
                       + (" (folds missing)" if short else ""), figs)]
    resets = [f.get("adapter_reset_ok") for f in folds]
    if not resets or any(r is None for r in resets):
        out.append(verdict(reset, NOT_TAKEN, f"adapter_reset_ok missing ({resets})"))
    else:
        out.append(verdict(reset, PASSED if all(resets) else FAILED,
                           f"adapter_reset_ok per fold: {resets}"))
    return out


def _baseline(s1: dict | None, s2: dict | None) -> list[dict]:
    out = []
    name = "memory back at baseline: scenario 1's fixes (kit.measure.leaks.check_returned)"
    fixes = (s1 or {}).get("fixes") or []
    returned = {f.get("name", "?"): f.get("returned") for f in fixes}
    if not fixes or any(v is None for v in returned.values()):
        out.append(verdict(name, NOT_TAKEN, f"returned per fix: {returned or 'no fixes recorded'}"))
    else:
        out.append(verdict(name, PASSED if all(returned.values()) else FAILED, f"returned per fix: {returned}"))
    o = (s1 or {}).get("original") or {}
    name = "memory back at baseline: scenario 1's original"
    if o.get("returned") is None:
        out.append(verdict(name, NOT_CHECKED, "summary.json does not record it (kit/demo.py keeps the original's "
                                              "estimate, measured peak and oom flag only)"))
    else:
        out.append(verdict(name, PASSED if o["returned"] else FAILED, f"returned: {o['returned']}"))
    folds = ((s2 or {}).get("fixed") or {}).get("folds") or []
    name = "memory back at baseline: every fixed fold's end within 1% of fold 1's start"
    base, ends = (folds[0].get("start_bytes") if folds else None), [f.get("end_bytes") for f in folds]
    figs = {"fold 1 start": fig(base, MEASURED), **{f"fold {i} end": fig(e, MEASURED) for i, e in enumerate(ends, 1)}}
    if not base or not ends or any(e is None for e in ends):
        out.append(verdict(name, NOT_TAKEN, "fold 1's start or a fold's end is missing", figs))
    else:
        worst = max(abs(e - base) for e in ends) / base
        out.append(verdict(name, PASSED if worst <= FLAT else FAILED, f"worst fold end {100 * worst:+.3f}% "
                                                                      "from fold 1's start", figs))
    out.append(verdict("memory back at baseline: the broken loop", NOT_CHECKED,
                       "by design its folds keep the old Trainer alive; its release after the loop is not recorded "
                       "in summary.json"))
    return out


def verdicts(summary: dict | None, cap_bytes: int, missing: str = "") -> list[dict]:
    """Every check that summary.json allows, in the order the report shows them."""
    if summary is None:
        return [verdict("the demo's summary.json", NOT_TAKEN, missing or "summary.json was not written")]
    out = [_demo(summary)]
    s1, s2 = summary.get("scenario1"), summary.get("scenario2")
    if s1:
        out += [_original(s1, cap_bytes), _fix(s1, "a", cap_bytes), _fix(s1, "b", cap_bytes), _fix_c(s1, cap_bytes)]
    else:
        out.append(verdict("scenario 1", NOT_TAKEN, "scenario 1 is not in summary.json (see the demo's errors)"))
    if s2:
        out += [_broken(s2, cap_bytes), *_fixed(s2)]
        if s2.get("advice_reset_changed_nothing") is not None:
            out.append(verdict("scenario 2: the advice's LoRA reset changes nothing",
                               PASSED if s2["advice_reset_changed_nothing"] else FAILED,
                               f"advice_reset_changed_nothing: {s2['advice_reset_changed_nothing']}"))
    else:
        out.append(verdict("scenario 2", NOT_TAKEN, "scenario 2 is not in summary.json (see the demo's errors)"))
    return out + _baseline(s1, s2)
