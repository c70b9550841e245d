"""Scenario 2's predictions, as notebook 02 shows them: all ESTIMATED, nothing loaded.

- :func:`weights_split` / :func:`four_gb_text`: the 4-bit model as loaded, its 16-bit parts
  named, against the advice's "about 4 GB".
- :func:`fold2_prediction` / :func:`two_models_text`: where the user's loop doubles (fold 2's load),
  moment by moment, against a GPU; :func:`crash_models_text`: which ungated model crashes a T4 there.
- :func:`advisor_text`: the fit advisor on one fold, and on fold 2 beside fold 1's leftovers.
- :func:`recipe_estimates`: the standard k-bit recipe against the lean one.

>>> print(four_gb_text(estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512,
...                             quantization="4bit", lora_r=8)))          # doctest: +SKIP
"""
from __future__ import annotations

from kit import inputs as kin
from kit import models as kmodels
from kit.advise import advise
from kit.estimate import estimate
from kit.estimate import estimate as est_fn
from kit.model_configs import REGISTRY, gated
from kit.presets import PRESETS, Preset
from kit.units import fmt_bytes, wrapped


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

    gpu, rows = PRESETS[preset].gpu_bytes, []
    for name in REGISTRY:
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

    p = PRESETS[preset]
    old = fold1_leftovers(est)
    left = Preset(p.name, f"{p.label} less fold 1's {fmt_bytes(old)}", p.gpu_bytes - old, p.ram_bytes)
    return "\n".join(["ESTIMATED by the fit advisor (python -m kit fit), one fold:", advise(est, p).text(top=top), "",
                      "fold 2, with fold 1's model and optimizer state still alive:",
                      advise(est, left).text(top=top)])


def recipe_estimates(model_name: str, **setup) -> dict:
    """Estimates of the standard recipe (``prepare_model_for_kbit_training``, which upcasts the
    16-bit parts to fp32) and the lean one (no upcast), gradient checkpointing on in both.

    >>> e = recipe_estimates("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8)
    >>> e["standard"].weights_bytes > e["lean"].weights_bytes
    True
    """
    return {r: estimate(model_name, kbit_recipe=r, gradient_checkpointing=True, **setup)
            for r in ("standard", "lean")}
