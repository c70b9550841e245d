"""What the widget panel's runs share (the setup checked, its estimate as run here, why a run is refused, the
model built, its Trainer), and a size sweep. The Run itself, stage by stage, is :mod:`kit.widgets.stages`.

A *setup* is the panel's settings as a dict: ``model``, ``batch_size``, ``seq_len``, ``task``,
``precision``, ``quantization``, ``lora_r``, ``optimizer``, ``gradient_checkpointing``.
Each sweep point goes through a :class:`~kit.measure.track.Tracker`, is OOM-safe (:func:`kit.measure.oom.oom_safe`)
and frees what it built (:func:`kit.measure.cleanup.release`); the sweep then checks that memory came back to its
baseline.

>>> setup = dict(model="tiny-gpt2", batch_size=2, seq_len=64, task="causal-lm", precision="fp32",
...              quantization="none", lora_r=0, optimizer="adamw-fused", gradient_checkpointing=False)
>>> result = sweep(setup, "batch_size", (1, 2))          # doctest: +SKIP
"""
from __future__ import annotations

import functools
import shutil
import tempfile

import torch

from kit import data as kdata
from kit import dtypes, machine, plot
from kit import models as kmodels
from kit.dtypes import run_precision
from kit.estimate import INT32_OPTIMIZER, estimate
from kit.inputs import has_note, whole_number
from kit.measure import cleanup, leaks, oom
from kit.measure import device as kdevice
from kit.measure.track import Tracker
from kit.presets import OPTIMIZERS
from kit.training_setup import PANEL
from kit.units import fmt_bytes, gib

SETUP_KEYS = ("model",) + PANEL   # what a panel run's setup holds


def check_setup(setup: dict) -> dict:
    """The setup with exactly :data:`SETUP_KEYS`; a ValueError names what is missing."""
    missing = [k for k in SETUP_KEYS if k not in setup]
    if missing:
        raise ValueError(f"setup lacks {missing}; a setup has {', '.join(SETUP_KEYS)}.")
    return {k: setup[k] for k in SETUP_KEYS}


@functools.lru_cache(maxsize=None)
def bnb_problem() -> str | None:
    """Why bitsandbytes (4-bit/8-bit weights, 8-bit optimizers) cannot run here, or None.

    >>> bnb_problem() is None or "bitsandbytes" in bnb_problem()
    True
    """
    try:
        import bitsandbytes
    except Exception as exc:  # ImportError, or a broken native library
        return f"bitsandbytes is not usable here ({type(exc).__name__}): pip install bitsandbytes"
    version = tuple(int(x) for x in bitsandbytes.__version__.split(".")[:2] if x.isdigit())
    if not machine.has_cuda() and version < (0, 46):
        return f"bitsandbytes {bitsandbytes.__version__} has no CPU backend (needs >= 0.46, or a GPU)"
    return None


def estimate_as_run(setup: dict, **override):
    """The estimate of ``setup`` as this machine runs it (CPU kernels, fp16 ignored on a CPU)."""
    s = {**check_setup(setup), **override}
    return estimate(s["model"], batch_size=s["batch_size"], seq_len=s["seq_len"],
                    precision=run_precision(s["precision"]), quantization=s["quantization"],
                    lora_r=s["lora_r"], optimizer=s["optimizer"],
                    gradient_checkpointing=s["gradient_checkpointing"], eval_batch_size=s["batch_size"],
                    device=machine.device_name())


def refusal(setup: dict, est) -> str | None:
    """Why a run of ``setup`` must not start here, or None. Checked before anything is built.

    A CPU out-of-memory kills the kernel instead of raising, and bitsandbytes' 8-bit AdamW kills
    the process on a tensor over 2**31 elements: neither can be caught, so both are refused.
    """
    needs_bnb = setup["quantization"] != "none" or "8bit" in setup["optimizer"]
    if needs_bnb and bnb_problem():
        return bnb_problem()
    if has_note(est.notes, INT32_OPTIMIZER):
        return "8-bit AdamW would kill the process on a tensor over 2^31 elements: use adamw"
    need = max(est.cpu_build_bytes, 0 if machine.has_cuda() else est.peak_bytes)
    free = kdevice.snapshot(live_tensors=False).ram_available_bytes
    if need > 0.8 * free:
        return (f"needs about {fmt_bytes(need)} of RAM and {fmt_bytes(free)} is free: a CPU out-of-memory "
                "kills the kernel, so it is not run")
    return None


def tokenized(name: str, seq_len: int, rows: int):
    """The tokenizer of ``name`` and at least ``rows`` rows of the shipped text, padded to ``seq_len``."""
    tok = kdata.load_tokenizer(name)
    train = kdata.load_text_dataset()["train"]
    # Padded to seq_len, as the estimate assumes (padded=True): measured shapes = predicted shapes.
    ds = kdata.tokenize(train.select(range(min(len(train), max(4 * rows, 32)))), tok, max_length=seq_len,
                        padding="max_length")
    return tok, ds


def files_ready(model: str, quantization: str) -> None:
    """Write the saved twin ``from_pretrained`` loads in place of ``model`` (once, where the Hub does not serve it),
    before a capped run: a first load writes its files (a model built and saved), which no user's load does. Its
    dtype is the one :func:`kit.models.load_model` loads: the device's 16 bits under quantization, else fp32."""
    sixteen = dtypes.for_this_device()[0] if machine.has_cuda() else "bf16"
    kmodels.pretrained_source(kmodels.split_name(model)[0], sixteen if quantization != "none" else "fp32")


def build(setup: dict):
    """Load the model of ``setup`` (real or twin), with LoRA and checkpointing as set."""
    model = kmodels.load_model(setup["model"], quantization=setup["quantization"])
    vocab_head = isinstance(model, kmodels.VocabHeadModel)
    model.config.use_cache = False  # the KV cache is useless in training
    ckpt, r = setup["gradient_checkpointing"], setup["lora_r"]
    if r:
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if setup["quantization"] != "none":  # the standard QLoRA recipe, as the estimator assumes
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=bool(ckpt))
        elif ckpt:
            kmodels.set_checkpointing(model)
            model.enable_input_require_grads()  # checkpointing a frozen base needs inputs with grad
        # target_modules=None: peft's default per model type, as the estimator's default targets
        model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, task_type="CAUSAL_LM"))
    elif ckpt:
        kmodels.set_checkpointing(model)
    elif vocab_head:  # VocabHeadModel checkpoints its base itself, as the user's code did
        kmodels.set_checkpointing(model.gpt2, enabled=False)
    return model


def amp_flags(model, precision: str, cuda: bool) -> dict:
    """Trainer's ``fp16`` / ``bf16`` for ``precision`` on this model. Trainable fp16 weights (scenario 1's
    V x V head takes the embedding's dtype, and a quantized load on a T4 is fp16) train without fp16
    autocast: its GradScaler refuses to unscale fp16 gradients (``ValueError: Attempting to unscale FP16
    gradients``), as scenario 1's fix (c) does.

    >>> amp_flags(torch.nn.Linear(2, 2).half(), "fp16", cuda=True)
    {'fp16': False, 'bf16': False}
    """
    fp16_weights = any(p.requires_grad and p.dtype == torch.float16 for p in model.parameters())
    return {"fp16": cuda and precision == "fp16" and not fp16_weights, "bf16": precision == "bf16"}


def trainer_for(model, tok, dataset, setup: dict, steps: int, callbacks=(), eval_dataset=None):
    """A Trainer for ``steps`` optimizer steps of ``setup`` (no saving, no logging; evaluation at the batch size,
    on ``eval_dataset`` when it is called)."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    cuda, precision = machine.has_cuda(), run_precision(setup["precision"])
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="kit-panel-"), max_steps=steps,
        per_device_train_batch_size=setup["batch_size"], per_device_eval_batch_size=setup["batch_size"],
        learning_rate=1e-4, warmup_steps=0,
        **amp_flags(model, precision, cuda), use_cpu=not cuda,
        optim=OPTIMIZERS[setup["optimizer"]], optim_args="momentum=0.9" if setup["optimizer"] == "sgd" else None,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, eval_dataset=eval_dataset,
                      data_collator=kdata.collator(tok),
                      callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)
    return trainer


def _point(model, tok, dataset, setup: dict, steps: int, tracker: Tracker, name: str) -> int | None:
    trainer = trainer_for(model, tok, dataset, setup, steps, [tracker.callback()])
    out = trainer.args.output_dir
    try:
        with tracker.stage(name, reset_peak=True, collect=False, tensor_peak=True) as rec:
            trainer.train()
        return rec.peak_bytes
    finally:
        trainer = cleanup.release(trainer)  # keeps the model's weights: the next size reuses them
        shutil.rmtree(out, ignore_errors=True)


def sweep(setup: dict, over: str = "batch_size", sizes=(1, 2, 4, 8), *, steps: int = 2,
          tracker: Tracker | None = None) -> dict:
    """Peak against ``over`` ("batch_size" or "seq_len"), ascending, stopping at the first OOM.

    The model is built once. Each size trains ``steps`` optimizer steps (from the second, AdamW's
    state is alive, as the estimate assumes). A size the estimate says would exhaust this
    machine's RAM is not run (a CPU OOM kills the kernel): it is listed in ``refused``, never
    drawn as a measurement. Returns ``{"points": [(size, peak_bytes or None, oom)] (the sizes
    that ran), "predicted": [(size, peak_bytes)], "refused": [size], "largest": size or None,
    "over": over}``; ``points`` is ready for :func:`kit.plot.sweep`.

    >>> result = sweep(setup, "batch_size", (1, 2, 4))          # doctest: +SKIP
    """
    if over not in ("batch_size", "seq_len"):
        raise ValueError(f"over must be 'batch_size' or 'seq_len', not {over!r}.")
    setup, tracker, steps = check_setup(setup), tracker or Tracker(), whole_number("steps", steps)
    sizes = sorted({whole_number(over, s) for s in sizes})
    if not sizes:
        raise ValueError(f"sizes is empty: pass the {over.replace('_', ' ')}s to try, e.g. (1, 2, 4, 8).")
    result = {"points": [], "predicted": [], "refused": [], "largest": None, "over": over}
    first = {**setup, over: sizes[-1]}
    why = refusal(first, estimate_as_run(first))
    if why and "of RAM" not in why:  # RAM is checked per size below: the small sizes may still run
        raise ValueError(f"cannot sweep this setup here: {why}")
    base, model, data = leaks.take_baseline(), None, {}
    try:
        for size in sizes:
            s = {**setup, over: size}
            est = estimate_as_run(s)
            result["predicted"].append((size, est.peak_bytes))
            if refusal(s, est):
                result["refused"].append(size)
                break
            if model is None:
                with tracker.stage("build", collect=False):
                    model = build(setup)
            key = s["seq_len"]
            if key not in data:
                data = {key: tokenized(setup["model"], key, sizes[-1] * steps if over == "batch_size" else
                                   setup["batch_size"] * steps)}
            tok, ds = data[key]
            r = oom.oom_safe(_point, model, tok, ds, s, steps, tracker, f"{over} {size}", setup={over: size})
            result["points"].append((size, r.value if r.ok else None, r.oom))
            if r.oom:
                break
            result["largest"] = size
    finally:
        data = None
        model = cleanup.release(None, model, free_model=model is not None)
    result["returned"] = leaks.check_returned(base, raise_on_leak=False).ok
    return result


def sweep_figure(result: dict, model: str, limit_bytes: int | None = None):
    """:func:`kit.plot.sweep` of a :func:`sweep` result, with the predicted peaks as a dashed line."""

    label = result["over"].replace("_", " ")
    title = f"Peak against {label}: {model} (measured here)"
    if result["refused"]:
        title += f"\nnot run, predicted over this machine's RAM: {label} {', '.join(map(str, result['refused']))}"
    fig = plot.sweep(result["points"], label, limit_bytes=limit_bytes, title=title)
    ax, top = fig.axes[0], max(gib(b) for _, b in result["predicted"])
    ax.plot(*zip(*[(s, gib(b)) for s, b in result["predicted"]]), "--", color="0.5", label="predicted peak")
    ax.set_ylim(top=max(ax.get_ylim()[1], 1.1 * top))
    ax.legend(loc="upper left", fontsize=8)
    return fig


def sweep_record(result: dict, setup: dict) -> dict:
    """One history row for a sweep: the largest size that ran, and what was not run."""
    sizes = [p[0] for p in result["points"]] + result["refused"]
    peaks = [p for _, p, _ in result["points"] if p]
    note = f"largest that ran: {result['largest']}"
    if result["refused"]:
        note += f"; not run (predicted over RAM): {result['refused']}"
    return dict(setup, **{result["over"]: f"sweep {sizes[0]}-{sizes[-1]}"}, status="sweep", note=note,
                predicted_peak_bytes=None, measured_peak_bytes=max(peaks) if peaks else None,
                returned=result.get("returned"))
