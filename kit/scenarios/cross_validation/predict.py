"""Scenario 2's predictions, as notebook 02 shows them: all ESTIMATED, nothing loaded.

- :func:`user_estimate`: the user's own objects (their ``SFTConfig``, ``BitsAndBytesConfig`` and ``LoraConfig``)
  read by ``estimate_from``, as today's TRL trains them, or as the TRL of their post did (``then=True``);
  :func:`options_of`: an estimate's options, to change one and estimate again.
- :func:`weights_split` / :func:`four_gb_text`: the 4-bit model as loaded, its 16-bit parts
  named, against the advice's "about 4 GB".
- :func:`fold2_prediction` / :func:`two_models_text`: where the user's loop doubles (fold 2's load),
  moment by moment, against a GPU.
- :func:`advisor_text`: the fit advisor on one fold, and on fold 2 beside fold 1's leftovers.
- :func:`recipe_estimates`: the standard k-bit recipe against the lean one.

>>> print(four_gb_text(estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512,
...                             quantization="4bit", lora_r=8)))          # doctest: +SKIP
"""
from __future__ import annotations

import functools

from kit import machine
from kit import models as kmodels
from kit.advise import advise
from kit.estimate import estimate, estimate_from
from kit.presets import PRESETS, Preset
from kit.scenarios.cross_validation.lora_reset import lora_config
from kit.scenarios.cross_validation.training import loop_params, sft_config
from kit.scenarios.cross_validation.user_loop import bnb_for
from kit.training_setup import KEYWORDS
from kit.units import fmt_bytes, wrapped

# What SFTTrainer did to a 4-bit model in the TRL of the user's post, and no longer does in TRL 1.x: peft's
# prepare_model_for_kbit_training (the 16-bit parts upcast to fp32), fp32 adapters, the full logits.
THEN = {"kbit_recipe": "standard", "adapter_dtype": "fp32", "fused_lm_head": False}


def options_of(est) -> dict:
    """The :func:`kit.estimate.estimate` options an estimate was made with, ``model`` included.

    >>> options_of(estimate("tiny-llama", batch_size=2, seq_len=8))["batch_size"]
    2
    """
    return {k: est.setup[k] for k in ("model",) + KEYWORDS if k in est.setup}


def user_estimate(model_name: str, *, then: bool = False, here: bool = False, **settings):
    """The user's setup, ESTIMATED from their own objects: ``estimate_from(model, sft_config=SFTConfig(...),
    quantization_config=BitsAndBytesConfig(...), peft_config=LoraConfig(...))``, with ``fp16=True`` as they set
    it (a T4 run) and the 16-bit parts in bf16 (their ``from_pretrained`` names no dtype: transformers 5 loads
    the checkpoint's). ``then=True``: as the TRL of their post trained it (:data:`THEN`). ``here=True``: the
    run on this machine instead (on a CPU: fp32, CPU kernels), to set beside its measurement. ``settings``:
    the loops' (:func:`~kit.scenarios.cross_validation.training.loop_params`).

    >>> user_estimate("tiny-llama", batch_size=1, seq_len=30).setup["kbit_recipe"]
    'lean'
    """
    p = loop_params(**settings)
    est = estimate_from(model_name, sft_config=sft_config(p, "cv-runs", gpu=None if here else True),
                        load_dtype="bf16", quantization_config=bnb_for(p),
                        peft_config=lora_config(p["lora_r"], p["lora_targets"]),
                        device="cpu" if here and not machine.has_cuda() else "cuda")
    return estimate(**{**options_of(est), **THEN}) if then else est


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
    return sorted(parts.items(), key=lambda item: -item[1])


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
        ("  after prepare_model_for_kbit_training (16-bit parts upcast to fp32, LoRA added): "
         if est.setup.get("kbit_recipe") == "standard" else
         "  as SFTTrainer trains it (no upcast in TRL 1.x; LoRA added): ") + fmt_bytes(est.weights_bytes)])


@functools.lru_cache(maxsize=32)
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
    """What fold 1's trainer still holds when fold 2 starts: its model (as trained) and its optimizer state,
    in bytes, ESTIMATED."""
    return est.weights_bytes + est.optimizer_bytes


def fold2_prediction(est) -> dict:
    """Where the user's loop doubles, ESTIMATED from one fold's estimate: bytes at three moments.

    - ``leftover_bytes``: what fold 1's trainer still holds when fold 2 starts loading;
    - ``from_pretrained_bytes``: right after fold 2's ``from_pretrained``, its model as loaded (no recipe, no
      adapter yet) beside them;
    - ``loaded_bytes``: fold 2's model loaded and prepared beside them (two models alive), and
      ``load_peak_bytes``: the peak of that load, which under the standard k-bit recipe adds the moment of
      the last fp32 upcast (:func:`upcast_moment_bytes`; today's TRL runs no upcast);
    - ``train_peak_bytes``: fold 2 training, after ``trainer = ...`` let the old trainer go:
      one fold's peak, as in fold 1.

    >>> p = fold2_prediction(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8))
    >>> p["loaded_bytes"] > p["leftover_bytes"]
    True
    """
    old = fold1_leftovers(est)
    loaded = old + est.weights_bytes
    prepared = est.setup.get("kbit_recipe") == "standard" and est.setup.get("quantization", "none") != "none"
    upcast = upcast_moment_bytes(est.setup["model"]) if prepared else 0   # the recipe prepares a quantized model
    return {"leftover_bytes": old, "from_pretrained_bytes": old + est.loaded_weights_bytes, "loaded_bytes": loaded,
            "load_peak_bytes": loaded + upcast, "train_peak_bytes": est.peak_bytes}


def fold_timeline(est, folds: int, *, load_each_fold: bool = True, release: bool = False) -> list[dict]:
    """Memory fold by fold through a k-fold loop, ESTIMATED (allocated) from one fold's estimate with
    :func:`fold2_prediction`'s arithmetic. ``load_each_fold``: the model is loaded in every fold (the user's loop),
    or once before the loop (the fixed loop: its adapter reset each fold). ``release``: the old Trainer and model
    are let go (``del``, ``gc.collect()``) before the next load; kept, as in the user's loop, they stay alive until
    ``trainer = ...`` replaces them, after the next model has loaded beside them.

    One dict per fold: ``models_at_load`` (the models alive once its model has loaded; 0: it loads none),
    ``leftover_bytes`` (the old fold's model and optimizer state still alive then), ``load_peak_bytes`` (the peak of
    its load; None where it loads none) and ``train_peak_bytes`` (one fold's training step: the old trainer is gone).

    >>> est = estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8)
    >>> [f["models_at_load"] for f in fold_timeline(est, 3)], [f["models_at_load"] for f in fold_timeline(
    ...     est, 3, load_each_fold=False)]
    ([1, 2, 2], [1, 0, 0])
    """
    f2 = fold2_prediction(est)
    one_load = f2["load_peak_bytes"] - f2["leftover_bytes"]   # one model loaded and prepared (its upcast moment)
    rows = []
    for fold in range(1, folds + 1):
        loads = fold == 1 or load_each_fold
        kept = fold > 1 and loads and not release
        leftover = f2["leftover_bytes"] if kept else 0
        rows.append({"fold": fold, "models_at_load": (2 if kept else 1) if loads else 0, "leftover_bytes": leftover,
                     "load_peak_bytes": leftover + one_load if loads else None,
                     "train_peak_bytes": f2["train_peak_bytes"]})
    return rows


def _verdict(nbytes: int, limit: int) -> str:
    return "fits" if nbytes <= limit else f"DOES NOT FIT ({fmt_bytes(nbytes - limit)} over)"


def two_models_text(est, preset: str = "colab-t4") -> str:
    """One fold's predicted peak, then the moment fold 2 loads beside fold 1's leftovers, then fold 2 training.

    The user's loop loads fold 2's model while fold 1's trainer still holds fold 1's model
    and its optimizer state; ``trainer = ...`` lets them go only after. ESTIMATED (allocated memory),
    against ``preset``.

    >>> est = estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8)  # doctest: +SKIP
    >>> print(two_models_text(est))  # doctest: +SKIP
    """
    gpu, f2 = PRESETS[preset].gpu_bytes, fold2_prediction(est)
    rows = [("fold 1, peak of a training step", est.peak_bytes),
            ("fold 2 loads: fold 1's model + optimizer state", f2["leftover_bytes"]),
            ("  + fold 2's freshly loaded model (2 models)", f2["loaded_bytes"])]
    if f2["load_peak_bytes"] != f2["loaded_bytes"]:
        rows.append(("  + the moment of its last fp32 upcast: peak of the load", f2["load_peak_bytes"]))
    rows.append(("fold 2 trains, the old trainer let go (1 model)", f2["train_peak_bytes"]))
    return "\n".join([f"ESTIMATED, allocated memory, against {PRESETS[preset].label}:"]
                     + [f"  {what:<56}{fmt_bytes(n):>11}  " + ("" if what.startswith("fold 2 loads") else
                                                               _verdict(n, gpu)) for what, n in rows])


@wrapped
def advisor_text(est, preset: str = "colab-t4", top: int = 3) -> str:
    """The fit advisor (:mod:`kit.advise`) on one fold, then on fold 2 with fold 1's model and optimizer
    state still alive: the device less those bytes. ESTIMATED.

    >>> "fold 2" in advisor_text(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8))
    True
    """

    p = PRESETS[preset]
    old = fold1_leftovers(est)
    left = Preset(p.name, f"{p.label} less fold 1's {fmt_bytes(old)}", p.gpu_bytes - old, p.ram_bytes,
                  runtime_ram_bytes=p.runtime_ram_bytes, runtime_said=p.runtime_said)
    lines = ["ESTIMATED by the fit advisor (python -m kit fit), one fold:", advise(est, p).text(top=top), "",
             "fold 2, with fold 1's model and optimizer state still alive:", advise(est, left).text(top=top)]
    if any("--kbit-recipe" in line for line in lines):  # explained where it first appears
        lines.append("(--kbit-recipe lean: prepare a 4-bit model without prepare_model_for_kbit_training's fp32 "
                     "upcast of the embedding, lm_head and norms; the same as today's TRL, measured in section 5)")
    return "\n".join(lines)


def recipe_estimates(est) -> dict:
    """``est``'s setup under the standard recipe (``prepare_model_for_kbit_training``, which upcasts the 16-bit
    parts to fp32) and under the lean one (no upcast, what today's TRL amounts to), all else alike.

    >>> e = recipe_estimates(estimate("tiny-llama", batch_size=1, seq_len=8, quantization="4bit", lora_r=8))
    >>> e["standard"].weights_bytes > e["lean"].weights_bytes
    True
    """
    return {r: estimate(**{**options_of(est), "kbit_recipe": r}) for r in ("standard", "lean")}


# The user's knobs the crash search turns: LoRA ranks as people set them (powers of two), and the targets of the
# user's post or every linear layer. Batch and sequence are left alone: fold 2's load holds fold 1's weights and
# optimizer state beside a fresh model, so it grows with the adapter and the model, not with the activations.
CRASH_RANKS = (8, 16, 32, 64, 128, 256, 512)
CRASH_TARGETS = (("q_proj", "v_proj"), "all-linear")


def _targets_key(targets) -> tuple | str:
    return targets if isinstance(targets, str) else tuple(targets)


def crash_setting(model_name: str, preset: str = "colab-t4", *, ranks=CRASH_RANKS, targets=CRASH_TARGETS,
                  **settings) -> dict | None:
    """The smallest change of the user's LoRA knobs under which one fold fits ``preset`` and fold 2's load does
    not, with today's TRL, ESTIMATED (:func:`user_estimate`, :func:`fold2_prediction`); None when no setting tried
    does that.

    The user's own targets come first (a change of rank alone is the smaller change), then each target set in
    ``targets`` order; within one, the lowest rank in ``ranks``. ``settings``: the loops' others (batch, sequence).
    Returns ``{"lora_r", "lora_targets", "estimate", "fold2", "limit_bytes", "tried"}``; ``tried`` holds
    ``(lora_r, lora_targets, one fold's peak, fold 2's load peak)`` for every setting estimated.

    >>> crash_setting("tiny-llama", batch_size=4, seq_len=30) is None   # two tiny twins fit any GPU
    True
    """
    limit, tried = PRESETS[preset].gpu_bytes, []
    own = _targets_key(loop_params(**settings)["lora_targets"])
    order = [own] + [t for t in map(_targets_key, targets) if t != own]
    for tg in order:
        for r in ranks:
            est = user_estimate(model_name, **{**settings, "lora_r": r, "lora_targets": tg})
            f2 = fold2_prediction(est)
            tried.append((r, tg, est.peak_bytes, f2["load_peak_bytes"]))
            if est.peak_bytes <= limit < f2["load_peak_bytes"]:
                return {"lora_r": r, "lora_targets": tg if isinstance(tg, str) else list(tg), "estimate": est,
                        "fold2": f2, "limit_bytes": limit, "tried": tried}
    return None


def _targets_text(targets) -> str:
    return repr(targets) if isinstance(targets, str) else "[" + ", ".join(repr(t) for t in targets) + "]"


@wrapped
def crash_setting_text(model_name: str, preset: str = "colab-t4", **settings) -> str:
    """:func:`crash_setting` in words: the setting, one fold's peak and fold 2's load against ``preset``.

    >>> "no setting tried" in crash_setting_text("tiny-llama", batch_size=4, seq_len=30)
    True
    """
    found = crash_setting(model_name, preset, **settings)
    label = PRESETS[preset].label
    if found is None:
        return (f"{model_name}: no setting tried (LoRA rank {CRASH_RANKS[0]} to {CRASH_RANKS[-1]}, targets "
                f"{' or '.join(_targets_text(t) for t in CRASH_TARGETS)}) fits one fold on {label} and not fold 2's "
                "load (ESTIMATED)")
    est, f2, lim = found["estimate"], found["fold2"], found["limit_bytes"]
    return "\n".join([
        f"{model_name}, ESTIMATED with today's TRL, against {label}: the smallest change that crashes fold 2 is",
        f"  LORA_R = {found['lora_r']}, LORA_TARGETS = {_targets_text(found['lora_targets'])} "
        f"({est.trainable_params:,} trainable parameters)",
        f"  one fold's peak                                {fmt_bytes(est.peak_bytes):>11}  "
        f"{_verdict(est.peak_bytes, lim)}",
        f"  fold 2's load: fold 1's model + optimizer state {fmt_bytes(f2['leftover_bytes']):>10}",
        f"    + fold 2's fresh model (2 models)            {fmt_bytes(f2['load_peak_bytes']):>11}  "
        f"{_verdict(f2['load_peak_bytes'], lim)}",
        f"  ({len(found['tried'])} settings estimated, the user's targets first, each from rank {CRASH_RANKS[0]} up)"])


@wrapped
def installed_trl_text() -> str:
    """What the installed TRL's ``SFTTrainer`` does to a 4-bit model, read from its own source (not a version
    table): whether it calls peft's ``prepare_model_for_kbit_training``, and whether it casts the trainable
    (adapter) parameters of a quantized model to bf16.

    >>> installed_trl_text().startswith("TRL ")
    True
    """
    import inspect

    import trl
    from trl.trainer import sft_trainer

    src = inspect.getsource(sft_trainer)
    upcast = "prepare_model_for_kbit_training(" in src
    to_bf16 = "param.data.to(torch.bfloat16)" in src and "_is_quantized_model" in src
    return "\n".join([
        f"TRL {trl.__version__} (installed here), read from trl/trainer/sft_trainer.py, on a 4-bit model:",
        "  calls peft's prepare_model_for_kbit_training (the fp32 upcast of every 16-bit part): "
        + ("yes" if upcast else "no: the embedding, lm_head and the norms stay in 16 bits"),
        "  casts the trainable LoRA adapters to bf16 (QLoRA's recommendation): "
        + ("yes: 2 bytes a parameter, not fp32's 4" if to_bf16 else "no: they stay in peft's fp32"),
        "  the TRL of the user's 2024 post did the upcast and kept fp32 adapters: the `then` estimates below"])
