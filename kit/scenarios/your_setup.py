"""Notebook 03, your own setup: the objects you write (``TrainingArguments``, ``BitsAndBytesConfig``,
``LoraConfig``), predicted, advised, run with ``kit.train`` and, when it runs out of memory, fixed with
the advisor's top change and run again.

:class:`YourSetup` holds the objects and the model id; it makes the Trainer (the real model, or in smoke
mode the tiny twin of its family: :func:`kit.model_configs.smoke_twin`), estimates it as run here, and
applies an advisor's ``changes`` (the estimate CLI's option names) to the objects. :func:`memory_cap`
picks the cap a run gets (:func:`kit.measure.controls.memory_cap` sets it) and says how; :func:`compare` reads
the two runs aloud, measured beside estimated.

>>> from transformers import TrainingArguments
>>> s = YourSetup("Qwen/Qwen2.5-0.5B", TrainingArguments("/tmp/kit-s3", per_device_train_batch_size=16),
...               seq_len=512, size="smoke")
>>> s.run_model, s.changed({"batch-size": 2, "grad-accum": 8}).args.gradient_accumulation_steps
('tiny-qwen2', 8)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass
from types import SimpleNamespace

from kit import data as kdata
from kit.inputs import InputError
from kit import inputs
from kit import machine
from kit import models as kmodels
from kit.advise.check import show_value as _show
from kit.estimate import estimate_from
from kit.measure import cleanup
from kit.presets import PRESETS
from kit.units import fmt_bytes, wrap, wrapped
from kit.watching.trainer import draw_watch

MIN_GAP = 0.2    # smoke mode: the advised twin's estimated peak must be this much under the original's


@dataclass
class YourSetup:
    """The user's objects and model: ``model`` (a shipped name or Hub id), ``args`` (TrainingArguments),
    ``quantization_config`` (a BitsAndBytesConfig or None), ``peft_config`` (a LoraConfig or None),
    ``seq_len`` (every row is padded to it), ``size`` ("smoke": the tiny twin runs; "real": the model).
    ``load_dtype``: from_pretrained's dtype (None: fp32, or bf16 for the parts a quantized model keeps)."""

    model: str
    args: object
    quantization_config: object = None
    peft_config: object = None
    seq_len: int = 512
    size: str = "real"
    load_dtype: str | None = None

    def __post_init__(self):
        if self.size not in ("smoke", "real"):
            raise ValueError(f"size must be 'smoke' or 'real', not {self.size!r}.")
        self.seq_len = inputs.whole_number("seq_len", self.seq_len)
        if self.load_dtype is None:
            self.load_dtype = "bf16" if self.quantization_config is not None else "fp32"
        if self.size == "smoke":
            kmodels.smoke_twin(self.model)   # a model with no tiny twin: one clear line now

    @property
    def run_model(self) -> str:
        """What trains here: the model, or in smoke mode its family's tiny twin."""
        return kmodels.smoke_twin(self.model) if self.size == "smoke" else self.model

    @property
    def run_args(self):
        """The TrainingArguments as this machine runs them: on a CPU, ``use_cpu`` and no fp16 (Trainer has no
        fp16 on a CPU; the estimate as run follows)."""
        if machine.has_cuda():
            return self.args
        return dataclasses.replace(self.args, use_cpu=True, fp16=False)

    def estimate(self, *, as_run: bool = False):
        """``estimate_from`` of these objects: the model on the GPU's kernels, or (``as_run``) what runs here
        (the twin in smoke mode, this device's kernels, the args as run)."""

        return estimate_from(self.run_model if as_run else self.model, self.run_args if as_run else self.args,
                             self.quantization_config, self.peft_config, seq_len=self.seq_len,
                             load_dtype=self.load_dtype, device=machine.device_name() if as_run else "cuda")

    def changed(self, changes: dict) -> "YourSetup":
        """A new setup with an advisor's ``changes`` ({estimate CLI option: value}) applied to copies of the objects
        (:func:`kit.advise.objects.apply`); a change no object holds (``--kbit-recipe``, ``--expandable-segments``,
        a launch) is refused, as the run here could not make it."""
        from kit.advise.objects import apply

        given = SimpleNamespace(changes=dict(changes), options={})   # the shape of an advisor's suggestion
        # on a CPU, TrainingArguments refuses bf16 unless told it runs there (run_args says so too)
        args = self.args if machine.has_cuda() else dataclasses.replace(self.args, use_cpu=True)
        try:
            new = apply(given, training_args=args, peft_config=self.peft_config,
                        quantization_config=self.quantization_config, strict=True)
        except InputError as exc:
            raise ValueError(f"the change is not applied to your objects here ({exc}): make it in your own code "
                             "(the advisor's text says what it costs).") from None
        kw = {k: changes[c] for k, c in (("seq_len", "seq-len"), ("load_dtype", "load-dtype")) if c in changes}
        return dataclasses.replace(self, args=new["training_args"], peft_config=new.get("peft_config"),
                                   quantization_config=new.get("quantization_config"), **kw)

    def advised(self, advice) -> "YourSetup":
        """This setup with the advisor's first change that fits and that a run here can make and run (``advice``:
        :func:`kit.advise.advise` of it), or this setup itself where there is none (it fits already, or nothing
        tried fits)."""
        if advice.fits:
            return self
        for top in advice.suggestions:
            if top.fits:
                if top.changes.get("liger-kernel") and importlib.util.find_spec("liger_kernel") is None:
                    continue   # not installed here (pip install liger-kernel): Trainer would fail at train()
                try:
                    new = self.changed(top.changes)
                    new.estimate(as_run=True)   # a change this machine cannot run (Liger's kernels on a CPU) is refused
                    return new
                except ValueError:   # an environment variable, a launch, or a GPU-only kernel: not this run's
                    continue
        return self

    def diff(self, other: "YourSetup") -> str:
        """What differs from ``other``, in the objects' own words."""
        lines = []
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", _ckpt_name(self.args),
                     "optim", "fp16", "bf16"):
            a, b = getattr(other.args, name), getattr(self.args, name)
            if a != b:
                lines.append(f"  TrainingArguments.{name}: {_word(a)} -> {_word(b)}")
        for name, a, b in (("seq_len (rows padded to)", other.seq_len, self.seq_len),
                           ("load dtype", other.load_dtype, self.load_dtype),
                           ("BitsAndBytesConfig", _bnb(other.quantization_config), _bnb(self.quantization_config)),
                           ("LoraConfig", _lora_text(other.peft_config), _lora_text(self.peft_config))):
            if a != b:
                lines.append(f"  {name}: {a} -> {b}")
        return "\n".join(lines) or "  nothing"

    @wrapped
    def __str__(self) -> str:
        a = self.args
        mixed = "fp16" if a.fp16 else "bf16" if a.bf16 else "fp32"
        run = "" if self.size == "real" else f" (in smoke mode its tiny twin {self.run_model} trains here)"
        return "\n".join([
            f"model {self.model}{run}, loaded in {self.load_dtype}",
            f"TrainingArguments: batch {a.per_device_train_batch_size} x accumulation {a.gradient_accumulation_steps}"
            f", {a.max_steps} steps, optim {a.optim.value if hasattr(a.optim, 'value') else a.optim}, {mixed}, "
            f"gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}",
            f"BitsAndBytesConfig: {_bnb(self.quantization_config)}", f"LoraConfig: {_lora_text(self.peft_config)}",
            f"rows padded to {self.seq_len} tokens"])

    def trainer(self, rows: int | None = None):
        """Load the model (the Hub's, or a twin: it says which), wrap it as the objects say, tokenize text
        padded to ``seq_len`` and return a Trainer with ``run_args``. Refused in one line where a CPU run
        without a cap could exhaust RAM (that kills the kernel instead of raising)."""
        from transformers import PrinterCallback, Trainer

        args = self.run_args
        bnb = self.quantization_config
        model = kmodels.load_model(self.run_model, quantization=bnb if bnb is not None else "none",
                                   load_dtype=self.load_dtype)
        model.config.use_cache = False
        if bnb is not None:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model)     # the standard recipe, as estimate_from assumes
        elif self.peft_config is not None and args.gradient_checkpointing:
            model.enable_input_require_grads()                  # checkpointing a frozen base needs it
        if self.peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, self.peft_config)
        tok = kdata.load_tokenizer(self.run_model)
        train = kdata.load_text_dataset()["train"]
        need = rows or args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.max_steps, 1)
        ds = kdata.tokenize(train.select(range(min(len(train), max(2 * need, 64)))), tok, max_length=self.seq_len,
                            padding="max_length")
        trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=kdata.collator(tok))
        trainer.remove_callback(PrinterCallback)
        return trainer


def _ckpt_name(args) -> str:
    # transformers 5 renamed it; the old name mirrors the new one and a copy setting only the old name is ignored
    return "activation_checkpointing" if hasattr(args, "activation_checkpointing") else "gradient_checkpointing"


def _word(value) -> str:
    return str(value.value if hasattr(value, "value") else value)


def _bnb(cfg) -> str:
    if cfg is None:
        return "none (not quantized)"
    if cfg.load_in_4bit:
        return (f"4-bit {cfg.bnb_4bit_quant_type}{', double quant' if cfg.bnb_4bit_use_double_quant else ''}, "
                f"compute {str(cfg.bnb_4bit_compute_dtype).replace('torch.', '')}")
    return "8-bit" if cfg.load_in_8bit else "none (neither 4- nor 8-bit)"


def _lora_text(cfg) -> str:
    if cfg is None:
        return "none (every weight trains)"
    t = cfg.target_modules
    return f"r={cfg.r}, targets {t if isinstance(t, str) or t is None else ','.join(sorted(t))}"


@dataclass
class CapChoice:
    """The memory cap a run gets: ``cap_bytes`` (None: none), ``how`` (one sentence), and the numbers it
    was computed from (``original_bytes``, ``advised_bytes``: the run's estimated peaks, or None)."""

    cap_bytes: int | None
    how: str
    original_bytes: int | None = None
    advised_bytes: int | None = None
    simulated: bool = False

    @wrapped
    def __str__(self) -> str:
        head = "no memory cap" if self.cap_bytes is None else \
            f"memory cap {fmt_bytes(self.cap_bytes)}{' (SIMULATED)' if self.simulated else ''}"
        return f"{head}: {self.how}"


def memory_cap(setup: YourSetup, advice, device: str = "colab-t4") -> CapChoice:
    """The cap for the runs of ``setup`` and of ``setup.advised(advice)`` (the advisor's top change).

    - smoke mode: the twin cannot run out of memory by itself, so the cap is simulated: the geometric mean
      of the twin's estimated peak (as run here) with the change and without, so that the estimate puts
      the original over it and the advised run under it. Refused (a ValueError) when the change saves
      less than :data:`MIN_GAP` of the twin's peak: no cap could then separate them honestly.
    - real size on a GPU larger than the preset: the preset's GPU memory (a CUDA memory fraction).
    - real size on a GPU no larger than it: no cap; the GPU is the device.
    - real size on a CPU: the preset's GPU memory, counted on the CPU (simulated).
    """
    preset = PRESETS.get(device)
    if preset is None:
        raise InputError("device", f"device must be a preset ({', '.join(PRESETS)}), not {device!r}.")
    advised = setup.advised(advice)
    if setup.size == "smoke" and advised is setup:
        return CapChoice(None, f"by the estimate your setup fits {preset.label} (or nothing the advisor tried "
                               "does), so no cap is simulated for the twin")
    if setup.size == "smoke":
        orig, adv = setup.estimate(as_run=True).peak_bytes, advised.estimate(as_run=True).peak_bytes
        if adv > (1 - MIN_GAP) * orig:
            raise ValueError(f"the advised change takes the twin's estimated peak only from {fmt_bytes(orig)} to "
                             f"{fmt_bytes(adv)}: too close for a simulated cap to tell them apart; pick a setup "
                             "further from the device's limit.")
        cap = int(math.sqrt(orig * adv))
        return CapChoice(cap, f"a tiny twin cannot run out of memory on this machine, so kit.train caps it at the "
                              f"geometric mean of its estimated training peaks (step 2 on, as run here) with the "
                              f"advisor's change "
                              f"({fmt_bytes(adv)}) and without it ({fmt_bytes(orig)}); the CPU counts live tensor "
                              "bytes op by op and raises torch.OutOfMemoryError past it. The cap sits "
                              f"{math.sqrt(orig / adv):.2f}x from each estimate, so it shows the report, the "
                              "advised change and the cleanup; it tests the estimate only that far, and proves "
                              "nothing about a GPU of that size", orig, adv, True)
    if preset.gpu_bytes is None:
        return CapChoice(None, f"the {device} preset has no GPU memory to cap to")
    hw = machine.hardware()
    if not hw["gpu_name"]:
        return CapChoice(preset.gpu_bytes, f"{preset.label}'s GPU memory, counted on this CPU (no GPU here)",
                         simulated=True)
    if hw["gpu_total_bytes"] <= preset.gpu_bytes:
        return CapChoice(None, f"this {hw['gpu_name']} ({fmt_bytes(hw['gpu_total_bytes'])}) is the device: "
                               "it runs out of memory by itself")
    return CapChoice(preset.gpu_bytes, f"{preset.label}'s GPU memory, on this {hw['gpu_name']} "
                                       f"({fmt_bytes(hw['gpu_total_bytes'])}) through a CUDA memory fraction")


@wrapped
def read_aloud(est) -> str:
    """The estimate's peak split three ways: what batch and sequence scale (activations, logits and loss,
    temporaries) and what they do not (weights, gradients, optimizer state, autocast copies).

    >>> from kit.estimate import estimate
    >>> print(read_aloud(estimate("tiny-llama", batch_size=2, seq_len=64)).splitlines()[1])
      optimizer state            11.38 MiB   43%
    """
    parts, peak = est.components(), est.peak_bytes
    rows = sorted(((k, v) for k, v in parts.items() if v), key=lambda item: -item[1])
    fixed = sum(parts.get(k, 0) for k in ("weights", "gradients", "optimizer state", "autocast weight copies"))
    lines = [f"ESTIMATED peak {fmt_bytes(peak)} ({est.peak_moment}):"]
    lines += [f"  {k:<24}{fmt_bytes(v):>12}  {v / peak:>4.0%}" for k, v in rows]
    lines.append(f"batch and sequence length scale {fmt_bytes(peak - fixed)} ({(peak - fixed) / peak:.0%}) of it; "
                 f"the weights, gradients and optimizer state ({fmt_bytes(fixed)}) do not change with them")
    return "\n".join(lines)


@wrapped
def sources(est) -> str:
    """Where ``estimate_from`` read each setting, so you can check it read your objects as you meant."""

    return "\n".join(f"  {k:<24}{_show(v):<22}{where}" for k, (v, where) in getattr(est, "sources", {}).items())


def figure(trainer, title: str | None = None):
    """The live plot of ``kit.train(trainer)`` (or ``kit.watch``) as a plain Figure, which shows where widgets
    do not (a saved notebook on GitHub). A ValueError where the Trainer was never watched."""
    w = trainer.__dict__.get("_kit_watch") if hasattr(trainer, "__dict__") else None
    if w is None:
        raise ValueError("this Trainer was not run with kit.train or kit.watch: there is no plot to draw.")
    import matplotlib.pyplot as plt


    fig = draw_watch(w.tracker, w.estimate, w.limit_bytes, w.limit_label)
    if title:
        fig.axes[0].set_title(title)
    plt.close(fig)   # returned, displayed once by the notebook
    return fig


def release(trainer) -> None:
    """Free a finished (or failed) run's Trainer and model, so the next run starts from the baseline."""
    cleanup.release(trainer, free_model=True)


def compare(runs: list) -> str:
    """``runs``: ``[(name, TrainReport)]``. A table, estimated beside measured, with the cap and the outcome."""
    reading = next((r.reading for _, r in runs), "")
    lines = [f"({reading})", f"{'run':<22}{'estimated':>11}{'measured':>11}{'meas/est':>9}{'cap':>11}  outcome"]
    for name, r in runs:
        if r.oom:
            est, meas = r.estimated.get("total"), r.measured.get("total")
            what = f"OUT OF MEMORY at step {r.step} ({r.phase})"  # phase: at most 22 characters
        else:
            est, meas, what = r.estimate_peak_bytes, r.measured_peak_bytes, f"completed {r.step} steps"
        ratio = f"{meas / est:.3f}" if est and meas is not None and not r.oom else "-"
        lines.append(f"{name[:22]:<22}{fmt_bytes(est):>11}{fmt_bytes(meas):>11}{ratio:>9}"
                     f"{fmt_bytes(r.cap_bytes) if r.cap_bytes else 'none':>11}  {what}")
    if any(r.oom for _, r in runs):
        lines.append(wrap("(a run that ran out of memory: measured = what was alive at the failing op, which never "
                          "ran; estimated = that phase's estimated peak, which the run never reached: no ratio)"))
    if reading == "live_tensor_bytes":
        lines.append(wrap("(on a CPU a completed run's measured peak is the most tensor bytes alive at once, counted "
                          "op by op by the cap's live-tensor counter: the CPU's stand-in for CUDA's max allocated)"))
    return "\n".join(lines)  # the rows stay whole (at most 114 characters): a table must not fold
