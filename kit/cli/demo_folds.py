"""Scenario 2 of ``python -m kit demo``: the user's fold loop and the fixed one, under a cap scaled from a T4 in
smoke mode (:func:`kit.scenarios.cross_validation.cap.scaled_cap`), measured, read aloud and drawn; and the small
helpers the demo's two scenarios share (:func:`save_png`, :func:`t4_preset`).

>>> alive(2)
'2 models alive'
"""
from __future__ import annotations

from pathlib import Path

from kit.cli import outputs
from kit.cli.report import Section
from kit.estimate.trl import SftReader
from kit.measure import device
from kit.units import fmt_bytes

CV_MODEL = {"smoke": "tiny-llama", "real": "meta-llama/Llama-3.2-1B"}
# smoke: one row of 8 tokens, so that the twin, like the 8B, is mostly its weights and fold 2's load is its peak
CV_SETTINGS = {"smoke": {"batch_size": 1, "seq_len": 8}, "real": {"seq_len": 256}}
CV_RECIPE = {"smoke": "standard", "real": None}   # smoke: the k-bit recipe of the user's post (its fp32 upcast)


def save_png(fig, out: Path, name: str) -> Path:
    """Save ``fig`` as ``out/name.png`` (claimed: a file of this run) and close it; returns the path."""
    import matplotlib.pyplot as plt

    path = outputs.claim(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def t4_preset():
    """``(bytes torch may allocate on a Colab T4, its short name)``."""
    from kit.presets import PRESETS

    t4 = PRESETS["colab-t4"]
    return t4.gpu_bytes, t4.label.split(" (")[0]        # "Colab T4"


def alive(count) -> str:
    return f"{count} model{'' if count == 1 else 's'} alive"


def second_fold_text(broken: list, prediction: dict | None = None) -> str:
    """Where the broken loop's second model came, from the counted models (not from the bytes); with
    ``prediction`` (``fold2_prediction``), fold 2's measured bytes beside the estimate of the same moment.

    >>> print(second_fold_text([{"load_peak_bytes": 2**20, "models_alive_after_load": 1},
    ...       {"load_peak_bytes": 2**21, "models_alive_after_load": 2, "models_alive_in_training": 1}]))
    ... # doctest: +NORMALIZE_WHITESPACE
    loads with 2 models alive (the first with 1 model alive), a load peak of 2.00 MiB against 1.00 MiB;
    it trains with 1 model alive.
    """
    if len(broken) < 2:
        return "never started."
    first, second = broken[0], broken[1]
    where = f"a load peak of {fmt_bytes(second['load_peak_bytes'])} against {fmt_bytes(first['load_peak_bytes'])}"
    if second.get("models_alive_after_load") is None:
        return f"loads with {where} (the models alive were not counted)."
    training = second.get("models_alive_in_training")
    text = (f"loads with {alive(second['models_alive_after_load'])} (the first with "
            f"{alive(first.get('models_alive_after_load'))}), {where}"
            + (f"; it trains with {alive(training)}." if training is not None else "."))
    if prediction:   # each measurement beside the estimate of the same moment, counted from before fold 1
        base, pairs = first.get("start_bytes") or 0, []
        # both moments are right after from_pretrained: fold 2's model as loaded, no recipe or adapter yet
        for what, k in (("fold 2 loaded", "loaded_bytes"), ("its load peak", "load_peak_bytes")):
            got, want = None if second.get(k) is None else second[k] - base, prediction.get("from_pretrained_bytes")
            pairs.append(f"{what}: MEASURED {fmt_bytes(got)}, ESTIMATED {fmt_bytes(want)}"
                         + (f" ({got / want:.4f}x)" if got and want else ""))
        text += (" Counted from before fold 1, right after fold 2's from_pretrained (fold 1's model and optimizer "
                 "state beside fold 2's model as loaded), " + "; ".join(pairs) + ".")
    return text


def scenario2(size: str, out: Path, summary: dict, sections: list, step, glance: dict) -> None:
    from kit import plot
    from kit.estimate import estimate
    from kit.presets import PRESETS
    from kit.scenarios.cross_validation import fixed_loop
    from kit.scenarios.cross_validation.cap import run_estimate, scaled_cap
    from kit.scenarios.cross_validation.predict import fold2_prediction

    model = CV_MODEL[size]
    p = {**fixed_loop.DEFAULTS, **CV_SETTINGS[size]}
    step("scenario 2: predict one fold")
    recipe, settings = CV_RECIPE[size], CV_SETTINGS[size]
    est = run_estimate(model, recipe, **settings)      # the loops as they run here
    prediction = fold2_prediction(est)
    cap = scaled_cap(model, recipe=recipe, **settings) if size == "smoke" else None
    if cap:
        step.say(f"    {cap['text']}")
        glance.setdefault("caps", []).append("Scenario 2: " + cap["text"])
    big = estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512, quantization="4bit", lora_r=8,
                   lora_targets=("q_proj", "v_proj"))
    t4 = PRESETS["colab-t4"].gpu_bytes
    step("scenario 2: broken loop, advice reset, fixed loop")
    result = fixed_loop.run_scenario2(model, folds=5, broken_folds=3, output_dir=outputs.claim(out, "cv-runs"),
                                      recipe=recipe, cap_bytes=cap["cap_bytes"] if cap else None, **settings)
    if cap:
        result["cap"] = {"cap_bytes": cap["cap_bytes"], "limit_bytes": cap["limit_bytes"], "text": cap["text"],
                         "how": result["cap"], "model_weights_bytes": cap["model_weights_bytes"],
                         "real_weights_bytes": cap["real_weights_bytes"]}
    summary["scenario2"] = {**result, "estimate": {
        "model": model, "peak_bytes": est.peak_bytes, "weights_bytes": est.weights_bytes,
        "two_models_bytes": prediction["loaded_bytes"], "fold2_load_peak_bytes": prediction["load_peak_bytes"],
        "from_pretrained_bytes": prediction["from_pretrained_bytes"],
        "llama3_8b_nf4_loaded_weights_bytes": big.loaded_weights_bytes,
        "llama3_8b_nf4_training_weights_bytes": big.weights_bytes}}
    broken, fixed = result["broken"]["folds"], result["fixed"]["folds"]
    labelled = [dict(f, label=f"fold {i + 1}" + (f" ({alive(f['models_alive_after_load'])} after load)"
                                                  if f.get("models_alive_after_load") is not None else ""))
                for i, f in enumerate(broken)]
    limit = cap["cap_bytes"] if cap else t4 if size == "real" else None
    images = [save_png(plot.load_moment(broken, fixed, limit, title="At each fold's load: the user's loop and the "
                                     f"fixed one, MEASURED ({device.best_reading()})"), out, "s2_load_moment"),
              save_png(plot.folds(labelled, limit_bytes=limit, title="Broken loop: MEASURED per fold"), out,
                    "s2_broken_folds"),
              save_png(plot.folds(fixed, baseline_bytes=fixed[0]["start_bytes"], limit_bytes=limit,
                               title="Fixed loop: MEASURED per fold"), out, "s2_fixed_folds")]
    rows = [[f"broken {i + 1}", fmt_bytes(f["start_bytes"]), fmt_bytes(f["peak_bytes"]), fmt_bytes(f["end_bytes"]), ""]
            for i, f in enumerate(broken)]
    rows += [[f"fixed {i + 1}", fmt_bytes(f["start_bytes"]), fmt_bytes(f["peak_bytes"]), fmt_bytes(f["end_bytes"]),
              "verified" if f["adapter_reset_ok"] else "NOT reset"] for i, f in enumerate(fixed)]
    spread = max(abs(f["end_bytes"] - fixed[0]["end_bytes"]) for f in fixed) / max(fixed[0]["end_bytes"], 1)
    how = (f"with the k-bit recipe of the user's post (peft's fp32 upcast, run by {SftReader.trainer_name}(...))"
           if recipe
           else "with today's TRL")
    sections.append(Section("Scenario 2: QLoRA cross-validation that dies on fold 2", [
        (cap["text"] + " Both loops run under it. " if cap else "") +
        f"ESTIMATED for one fold of `{model}` as it runs here ({p['quantization']}, LoRA r={p['lora_r']}, {how}): "
        f"**{fmt_bytes(est.peak_bytes)}** peak, of which weights {fmt_bytes(est.weights_bytes)}; when fold 2 loads "
        f"beside the old fold's model and optimizer state, {fmt_bytes(prediction['loaded_bytes'])}, and "
        f"{fmt_bytes(prediction['load_peak_bytes'])} at the peak of that load.",
        f"Llama-3-8B in NF4 with double quant is ESTIMATED at {fmt_bytes(big.loaded_weights_bytes)} of weights "
        f"as loaded ({big.loaded_weights_bytes / 1e9:.2f} GB), not the 'about 4 GB' often quoted: embeddings and "
        f"lm_head stay 16-bit. peft's prepare_model_for_kbit_training then upcasts those to fp32: "
        f"{fmt_bytes(big.weights_bytes)} while training.",
        "MEASURED: in the broken loop the second fold " + second_fold_text(broken, prediction) + oom_text(result),
        "The advice's LoRA reset (`if 'lora' in model.named_modules()`) " + (
            "**changed nothing**: fold 2 trained on from fold 1's adapter." if result["advice_reset_changed_nothing"]
            else "did reset the adapter here."),
        f"The fixed loop loads once, restores the saved adapter each fold and releases each Trainer: every fold "
        f"ends within {100 * spread:.2f}% of fold 1 (MEASURED, `{device.best_reading()}`)."],
        table=(["fold", "start", "peak", "end", "adapter reset"], rows), images=images))


def oom_text(result: dict) -> str:
    """Where each loop ran out of memory, in words."""
    from kit.scenarios.cross_validation.user_loop import OOM_MOMENTS

    broken, fixed = result["broken"], result["fixed"]
    text = ""
    if broken["oom_at_fold"]:
        during = (broken["folds"][-1].get("oom_during") if broken["folds"] else None) or "train"
        text += f" It ran out of memory at fold {broken['oom_at_fold']}, {OOM_MOMENTS[during]}; caught."
    return text + (f" The fixed loop ran out of memory at fold {fixed['oom_at_fold']}." if fixed.get("oom_at_fold")
                   else " The fixed loop did not run out of memory" + (" under the same cap." if result.get("cap_bytes")
                                                                        else "."))
