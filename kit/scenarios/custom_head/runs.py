"""Scenario 1's measured runs: each fix, and the user's original, trained for a few steps, OOM-safe.

The setups are :mod:`kit.scenarios.custom_head.scenario`'s; this module runs them (tokenize, build,
Trainer init, train, cleanup, each a tracker stage) and sets each measured peak beside the
estimate of the same setup as it ran here: the device's precision and accumulation, the rows' real
length, and the step count (a one-step run beside the first step's peak, whose backward runs before
AdamW's state exists; from the second step on, the peak). The original is the user's own code
(:mod:`kit.scenarios.custom_head.user_code`), estimated from the Trainer it builds.

>>> record, tracker = run_fix("b", "smoke")       # doctest: +SKIP
>>> record["measured_peak_bytes"] / record["estimate_peak_bytes"]   # doctest: +SKIP
0.99...
"""
from __future__ import annotations

import contextlib
import gc
import tempfile

from transformers import PrinterCallback

from kit import data as kdata
from kit import machine, runtime
from kit import models as kmodels
from kit.dtypes import run_precision
from kit.estimate import estimate_trainer
from kit.inputs import whole_number
from kit.measure import cleanup, leaks
from kit.measure import device as kdevice
from kit.measure.oom import oom_safe
from kit.measure.track import Tracker
from kit.presets import OPTIMIZERS
from kit.scenarios.custom_head import user_code
from kit.scenarios.custom_head.scenario import (
    NAMES,
    T4_BYTES,
    USER,
    estimate_fix,
    estimate_user,
    fix_setup,
    size_name,
)
from kit.units import fmt_bytes


def user_rows(size: str, tracker: Tracker | None = None):
    """The rows the fixes' runs train: the user's first 100 rows, empty lines dropped, padded to 128 as they did.
    Returns ``(tokenizer, rows, longest)``: ``longest`` is the rows' real length, at which the run is estimated."""
    with (tracker.stage("tokenize") if tracker is not None else contextlib.nullcontext()):
        tok = kdata.load_tokenizer(NAMES[size])
        train = kdata.load_text_dataset()["train"]
        ds = kdata.tokenize(train.select(range(min(100, len(train)))), tok, max_length=USER["seq_len"],
                            padding="max_length")
    return tok, ds, max(len(ids) for ids in ds["input_ids"])


def peak_of_run(est, steps: int) -> int:
    """The estimate's peak for a run of ``steps`` optimizer steps: with one, its backward runs before AdamW's state
    exists (``first_step_peak_bytes``); from the second on, ``peak_bytes``.

    >>> from kit.scenarios.custom_head.scenario import estimate_user
    >>> est = estimate_user("tiny-gpt2")
    >>> peak_of_run(est, 1) == est.first_step_peak_bytes < peak_of_run(est, 2) == est.peak_bytes
    True
    """
    return est.first_step_peak_bytes if steps == 1 else est.peak_bytes


def fix_trainer_for(model, tok, dataset, precision: str, optimizer: str, steps: int, accum: int, callbacks=()):
    """The Trainer every fix's run trains: ``model`` on the tokenized rows ``dataset``, batch 1, ``accum``
    micro-batches, ``steps`` optimizer steps, in ``precision`` with ``optimizer``; nothing saved or reported."""
    from transformers import Trainer, TrainingArguments

    cuda = machine.has_cuda()
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="kit-s1-"), max_steps=steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=accum, learning_rate=5e-5, warmup_steps=0, use_cpu=not cuda,
        fp16=cuda and precision == "fp16", bf16=precision == "bf16", report_to="none",
        optim=OPTIMIZERS[optimizer],
        save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=kdata.collator(tok),
                      callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # the live plot and the record say what matters
    return trainer


def _measured_run(make, tok, dataset, precision: str, optimizer: str, steps: int, accum: int,
                  tracker: Tracker) -> int | None:
    """build -> Trainer init -> train -> cleanup on the tokenized rows ``dataset``, each a tracker stage; returns
    train's peak."""
    trainer, model = None, None
    try:
        with tracker.stage("build"):
            model = make(machine.device_name())
        with tracker.stage("Trainer init"):
            trainer = fix_trainer_for(model, tok, dataset, precision, optimizer, steps, accum, [tracker.callback()])
        with tracker.stage("train", reset_peak=True, tensor_peak=True) as rec:
            trainer.train()
        return rec.peak_bytes
    finally:  # also after an OOM: free the weights and optimizer state before the error travels on
        with tracker.stage("cleanup"):
            trainer = cleanup.release(trainer, model, free_model=model is not None)
            model = None


def held_bytes(model) -> int:
    """Bytes of ``model``'s parameters and buffers (one count per storage) on the device the kit reads here (CUDA on
    a GPU, else the CPU): what a baseline taken after the model was built already holds.

    >>> import torch
    >>> held_bytes(torch.nn.Linear(4, 4))          # 16 weights + 4 biases, fp32
    80
    """
    import itertools

    seen, total = set(), 0
    on = "cuda" if machine.has_cuda() else "cpu"
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type != on:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def above(peak_bytes: int, base) -> int:
    """A run's measured peak above what was alive before it (``base``: :func:`kit.measure.leaks.take_baseline`,
    taken before the model was built): the run's own memory, which its estimate predicts, without what earlier
    cells or runs left in the process."""
    return peak_bytes - base.snapshot.best_bytes


def ram_problem(est) -> str | None:
    """Why a run must not start on this CPU: exhausting RAM kills the kernel instead of raising."""
    if machine.has_cuda():
        return None          # a GPU OOM raises, and the OOM-safe wrapper catches it
    need, free = max(est.peak_bytes, est.cpu_build_bytes), kdevice.snapshot(live_tensors=False).ram_available_bytes
    if need > 0.8 * free:
        return (f"Not run: it needs about {fmt_bytes(need)} of RAM and {fmt_bytes(free)} is free; running out of "
                "RAM kills the kernel instead of raising.")
    return None


def grad_accum_for(which: str | None, grad_accum: int | None = None) -> int:
    """Micro-batches per optimizer step for a run of fix ``which`` (None: the original) on this device.

    The one rule, used by the notebook and the demo alike. A GPU runs the user's 16. On a CPU the
    peak is reached by the second micro-batch (the first one's gradients are alive), so 2 are
    enough; fix (c)'s bf16 matmuls are slow on a CPU (about 30 s per backward of the tiny twin's
    head), so it runs one. The estimate is made for the same number.

    >>> grad_accum_for("a", 4)
    4
    """
    if grad_accum is not None:
        return whole_number("grad_accum", grad_accum)
    if machine.has_cuda():
        return USER["grad_accum"]
    return 1 if which == "c" else 2


def run_fix(which: str, size: str | None = None, *, steps: int = 2, grad_accum: int | None = None,
            tracker: Tracker | None = None, rank: int | None = None):
    """Estimate, then measure, fix ``which`` with a short Trainer run. Returns ``(record, tracker)``.

    ``record`` has summary.json's fields: ``name``, ``estimate_peak_bytes`` (the setup as run here),
    ``measured_peak_bytes`` (the train stage's peak of ``kit.measure.device.best_reading()``: CUDA max
    allocated on a GPU; on a CPU the peak of tensor bytes counted op by op by
    ``kit.measure.tensor_peak.TensorPeak``, activations included), plus ``reading``, ``returned`` (memory back to
    the baseline), ``note``, ``which``, ``size``, ``steps`` and ``grad_accum`` (what ran), and ``oom`` / ``error``
    (an out-of-memory error is caught, recorded and freed).

    >>> record, tracker = run_fix("a", "smoke")       # doctest: +SKIP
    """
    size, tracker, accum = size_name(size), tracker or Tracker(), grad_accum_for(which, grad_accum)
    steps, s = whole_number("steps", steps), fix_setup(which, size, rank)
    tok, ds, seq_len = user_rows(size, tracker)
    # the estimate of the run's own setup: its rows' real length, its device, its accumulation, its step count
    est = estimate_fix(which, size, as_run=True, grad_accum=accum, rank=rank, seq_len=seq_len)
    record = {"name": s["name"], "which": which, "size": size, "steps": steps, "grad_accum": accum,
              "seq_len": seq_len, "estimate_peak_bytes": peak_of_run(est, steps), "measured_peak_bytes": None,
              "reading": kdevice.best_reading(), "returned": None, "note": s.get("refused") or ""}
    if s.get("refused"):  # what 8-bit AdamW would have needed, had it not crashed
        est8 = estimate_fix(which, size, optimizer="adamw-8bit").peak_bytes
        record["note"] += f" With it the estimate would be {fmt_bytes(est8)} (a T4 has {fmt_bytes(T4_BYTES)})."
    problem = ram_problem(est)
    if problem:
        record["note"] = f"{record['note']} {problem}".strip()
        return record, tracker
    base = leaks.take_baseline()
    # OOM-safe like the original: fix (c) at real size runs out of memory on a T4, and the
    # caller (a notebook, the demo) must go on to the next fix.
    result = oom_safe(_measured_run, s["make"], tok, ds, run_precision(s["precision"]), s["optimizer"],
                      steps, accum, tracker, setup={"fix": which, "size": size, "grad_accum": accum})
    record.update(measured_peak_bytes=above(result.value, base) if result.ok else None, oom=result.oom,
                  error=result.error)
    record["returned"] = leaks.check_returned(base, raise_on_leak=False).ok
    return record, tracker


def user_trainer(size: str | None = None, *, steps: int = 2, grad_accum: int | None = None):
    """The user's own Trainer, built by their code (:func:`kit.scenarios.custom_head.user_code.user_trainer`) on the
    model this run trains: DistilGPT2 where the Hub serves it, else its architecture twin's folder, or the tiny
    twin's in smoke mode. Returns ``(trainer, workshop)``: ``workshop`` is what a short run puts over their
    ``TrainingArguments`` (``max_steps``, the accumulation, ``report_to``, a temporary ``output_dir``).

    >>> trainer, workshop = user_trainer("smoke")     # doctest: +SKIP
    """
    size, steps = size_name(size), whole_number("steps", steps)
    path, line = kmodels.pretrained_source(NAMES[size])
    runtime.say(line)
    tok, ds = kdata.load_tokenizer(NAMES[size]), kdata.load_text_dataset()
    workshop = dict(max_steps=steps, gradient_accumulation_steps=grad_accum_for(None, grad_accum),
                    report_to="none", output_dir=tempfile.mkdtemp(prefix="kit-s1-user-"),
                    **({} if machine.has_cuda() else {"dataloader_pin_memory": False}))  # a CPU has none to pin
    trainer = user_code.user_trainer(path, tok, ds, **workshop)
    trainer.remove_callback(PrinterCallback)  # its end-of-run dict of floats; the record says what matters
    return trainer, workshop


def ram_check(size: str, accum: int) -> tuple:
    """The registry model's estimate as it would run here (before anything is built), and why not to start."""
    est = estimate_user(NAMES[size], precision=run_precision(USER["precision"]), device=machine.device_name(),
                        grad_accum=accum)
    return est, ram_problem(est)


def _user_run(trainer, size: str, steps: int, accum: int, tracker: Tracker, record: dict) -> int | None:
    """The user's code (unless ``trainer`` is theirs already) -> train -> cleanup, each a tracker stage."""
    try:
        if trainer is None:
            with tracker.stage("the user's code"):
                trainer = user_trainer(size, steps=steps, grad_accum=accum)[0]
        trainer.add_callback(tracker.callback())
        # the estimate of the run's own setup: its model, rows, device, accumulation and step count
        est = estimate_trainer(trainer, device=machine.device_name())
        record.update(estimate=est, estimate_peak_bytes=peak_of_run(est, trainer.args.max_steps),
                      seq_len=est.setup["seq_len"], steps=trainer.args.max_steps,
                      grad_accum=trainer.args.gradient_accumulation_steps)
        with tracker.stage("train", reset_peak=True, tensor_peak=True) as rec:
            trainer.train()
        return rec.peak_bytes
    finally:  # also after an OOM: free the weights and optimizer state before the error travels on
        with tracker.stage("cleanup"):
            model = getattr(trainer, "model", None)
            trainer = cleanup.release(trainer, model, free_model=model is not None)
            model = None


def run_original_safely(size: str | None = None, *, steps: int = 2, grad_accum: int | None = None,
                        tracker: Tracker | None = None, trainer=None):
    """Run the user's own code (their class, ``tokenize_func``, ``TrainingArguments`` and ``Trainer``,
    :mod:`kit.scenarios.custom_head.user_code`) for ``steps`` optimizer steps inside
    ``kit.measure.oom.oom_safe``. ``trainer``: the one :func:`user_trainer` built already (it is freed after the
    run), else it is built here. Returns ``(record, tracker)``.

    ``record``: ``estimate_peak_bytes`` (of the Trainer that ran, as it ran here: ``kit.estimate.estimate_trainer``
    on this device, at its rows' length, the first step's peak for a one-step run; ``estimate``, that Estimate,
    once the Trainer was built), ``measured_peak_bytes``
    (None unless it ran), ``oom``, ``refused`` (why it was not started: on a CPU, a run that would exhaust RAM),
    ``error``, ``returned``, ``reading``, ``seq_len``, ``steps``, ``grad_accum``. After an OOM the memory is freed
    and the caller goes on.

    >>> record, _ = run_original_safely("real")      # doctest: +SKIP
    """
    size, tracker, accum = size_name(size), tracker or Tracker(), grad_accum_for(None, grad_accum)
    steps = whole_number("steps", steps)
    est, refused = ram_check(size, accum)
    record = {"estimate_peak_bytes": peak_of_run(est, steps), "measured_peak_bytes": None, "oom": False,
              "refused": None if trainer is not None else refused, "error": None, "returned": None,
              "reading": kdevice.best_reading(), "seq_len": USER["seq_len"], "steps": steps, "grad_accum": accum}
    if record["refused"]:
        return record, tracker
    held = held_bytes(trainer.model) if trainer is not None else 0   # built before the baseline: the run's own
    base = leaks.take_baseline()
    result = oom_safe(_user_run, trainer, size, steps, accum, tracker, record,
                      setup={"model": NAMES[size], **USER, "grad_accum": accum})
    trainer = None
    record.update(measured_peak_bytes=above(result.value, base) + held if result.ok else None, oom=result.oom,
                  error=result.error)
    gc.collect()
    record["returned"] = leaks.check_returned(base, raise_on_leak=False).ok
    return record, tracker


def fix_trainer(which: str, size: str | None = None, *, steps: int = 2, grad_accum: int | None = None):
    """Fix ``which``'s Trainer as :func:`run_fix` builds it (the same rows, model, precision, optimizer and
    accumulation), built and not trained, and the estimate of its run here. Returns ``(trainer, estimate)``; for
    a run of one step the estimate's ``peak_bytes`` is the first step's (no AdamW state in its backward, as
    :func:`peak_of_run`). For a cell of the notebook's own to train while it reads torch's counters.

    >>> trainer, est = fix_trainer("a", "smoke")       # doctest: +SKIP
    """
    import dataclasses

    size, accum = size_name(size), grad_accum_for(which, grad_accum)
    steps, s = whole_number("steps", steps), fix_setup(which, size)
    tok, ds, seq_len = user_rows(size)
    est = estimate_fix(which, size, as_run=True, grad_accum=accum, seq_len=seq_len)
    est = dataclasses.replace(est, peak_bytes=peak_of_run(est, steps))
    trainer = fix_trainer_for(s["make"](machine.device_name()), tok, ds, run_precision(s["precision"]),
                              s["optimizer"], steps, accum)
    return trainer, est
