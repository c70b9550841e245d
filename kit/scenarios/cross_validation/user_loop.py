"""Scenario 2, the user's fold loop, as they wrote it: where the second model comes from, and when.

:func:`user_fold_loop` is the user's loop with ``SFTTrainer``, short enough to read in a notebook
(``inspect.getsource``), adapted only where TRL renamed something (each rename is commented). Every fold
loads a fresh 4-bit model while ``trainer`` still holds fold 1's SFTTrainer, with fold 1's model and
optimizer state. So the doubling happens while fold 2 *loads*: two models are alive until the line
``trainer = SFTTrainer(...)`` lets go of the old one. ``free_gpu_cache()`` frees nothing at all: its
``del trainer`` makes ``trainer`` a *local* name of the helper, so it raises ``UnboundLocalError`` (a
``NameError``), which is swallowed, and the caller's ``trainer`` lives on. (The loop's own comments and the
helper's docstring describe what each line does, not this: the notebook prints them before it asks.)

:func:`run_broken_loop` runs it OOM-safe, with the kit's readings around its two halves
(:class:`FoldWatch`): per fold, the memory before the load, the peak while loading and the
models alive after it; the peak while training and the models alive then; the end.

>>> broken = run_broken_loop("tiny-llama", folds=2)                  # doctest: +SKIP
>>> broken["folds"][1]["models_alive_after_load"], broken["folds"][1]["models_alive_in_training"]  # doctest: +SKIP
(2, 1)
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, PrinterCallback, TrainerCallback
from trl import SFTTrainer

from kit import data as kdata
from kit import models as kmodels
from kit import runtime
from kit.measure import cleanup, oom
from kit.measure.controls import memory_cap
from kit.measure.track import Tracker
from kit.scenarios.cross_validation.folds import KFold, user_data
from kit.scenarios.cross_validation.lora_reset import lora_config
from kit.scenarios.cross_validation.training import (PostSFTTrainer, count_live_models, fold_count, loop_params,
                                                     sft_config)
from kit.units import fmt_bytes, wrap


def free_gpu_cache() -> None:
    """The user's cleanup helper, as the advice wrote it (its ``gpu_usage()`` prints left out)."""
    # What it frees is the notebook's question; the answer is in this module's docstring.
    try:
        del trainer
    except NameError:
        pass
    gc.collect()
    torch.cuda.empty_cache()


def user_bnb_config() -> BitsAndBytesConfig:
    """The user's 4-bit settings, as written: NF4, double quantization, bf16 compute."""
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=torch.bfloat16)


def bnb_for(settings: dict):
    """The user's 4-bit settings for ``quantization="4bit"``, the kit's 8-bit ones (None: no quantization)."""
    return user_bnb_config() if settings["quantization"] == "4bit" else kmodels.bnb_config(settings["quantization"])


def user_fold_loop(data, kfold, model_name, bnb_config, lora_config, training_arguments, tokenizer, watch) -> None:
    """The user's loop with SFTTrainer. The kit's lines are the two ``with watch(...)`` and ``watch.attach``."""
    for fold, (train_index, test_index) in enumerate(kfold.split(data), 1):  # enumerate: the kit's fold number
        training_data, test_data = data['text'][train_index], data['text'][test_index]
        training_data = Dataset.from_pandas(training_data.to_frame().reset_index())
        test_data = Dataset.from_pandas(test_data.to_frame().reset_index())
        with watch("load", fold):
            model = AutoModelForCausalLM.from_pretrained(
                model_name,
                device_map='auto',
                quantization_config=bnb_config,
                # token=access_token: the notebook logs in once instead (huggingface_hub.login())
            )  # a 4-bit model, loaded at the start of every fold
            model.config.use_cache = False
            model.config.pretraining_tp = 1
        with watch("train", fold):
            trainer = SFTTrainer(  # a new trainer every fold, bound to the same name
                model=model,
                train_dataset=training_data,
                peft_config=lora_config,
                # dataset_text_field='text', max_seq_length=30, packing=True: in SFTConfig now (training_arguments),
                # max_seq_length renamed max_length
                processing_class=tokenizer,  # was tokenizer=
                args=training_arguments,
            )
            watch.attach(trainer)
            trainer.train()
            free_gpu_cache()  # the user's cleanup helper: its source is below


class _CountAtTrainBegin(TrainerCallback):
    """Counts the models in memory when ``train()`` begins (after the old Trainer was let go)."""

    def __init__(self, record: dict):
        self.record = record

    def on_train_begin(self, args, state, control, **kwargs):
        self.record["models_alive_in_training"] = count_live_models()


class FoldWatch:
    """The kit's readings around the two halves of each fold of :func:`user_fold_loop`.

    A fold record holds ``start_bytes`` (before the load: what fold 1 left), ``load_peak_bytes``,
    ``loaded_bytes`` and ``models_alive_after_load``; then ``train_peak_bytes``,
    ``models_alive_in_training`` and ``end_bytes``; ``peak_bytes`` is the fold's highest.
    Models are counted as they sit in memory: nothing is collected first (``free_gpu_cache``
    collected at the end of the last fold), so a model only garbage waits for counts too.
    """

    def __init__(self, tracker: Tracker, on_fold_end=None):
        self.tracker, self.on_fold_end = tracker, on_fold_end
        self.folds: list[dict] = []
        self.current: dict = {}
        self.attached = False     # attach() ran this fold: SFTTrainer(...) finished preparing the model

    @contextmanager
    def __call__(self, half: str, fold: int):
        if half == "load":
            self.current, self.attached = {"fold": fold}, False
        rec = self.current
        try:
            with self.tracker.stage(f"broken: {half}", reset_peak=True, collect=False, tensor_peak=True) as stage:
                yield
        except BaseException:
            # in the train half before attach(): SFTTrainer(...) was still preparing fold 2's model
            rec.update(self._readings(half, stage),
                       oom_during="prepare" if half == "train" and not self.attached else half)
            raise
        finally:
            if half == "load" and "oom_during" not in rec:
                rec.update(self._readings(half, stage), models_alive_after_load=count_live_models())
        if half == "train":
            rec.update(self._readings(half, stage))
            self._close(rec)

    def attach(self, trainer) -> None:
        """The kit's readings on the user's trainer: the tracker's callback, a count of the models when
        ``train()`` begins (after the old trainer was let go), and no per-step log lines."""
        self.attached = True
        for callback in (self.tracker.callback(), _CountAtTrainBegin(self.current)):
            trainer.add_callback(callback)
        trainer.remove_callback(PrinterCallback)  # we print one line per fold instead

    @staticmethod
    def _readings(half: str, stage) -> dict:
        if half == "load":
            return {"start_bytes": stage.start_bytes, "load_peak_bytes": stage.peak_bytes,
                    "loaded_bytes": stage.end_bytes}
        return {"train_peak_bytes": stage.peak_bytes, "end_bytes": stage.end_bytes}

    def _close(self, rec: dict) -> None:
        peaks = [rec.get(k) for k in ("load_peak_bytes", "train_peak_bytes") if rec.get(k) is not None]
        rec["peak_bytes"] = max(peaks) if peaks else None
        rec.setdefault("end_bytes", rec.get("loaded_bytes"))
        self.folds.append(rec)
        print(wrap(fold_line(rec)), flush=True)
        if self.on_fold_end is not None:
            self.on_fold_end(list(self.folds))

    def close_failed(self) -> None:
        """Record the fold an out-of-memory error cut short (``oom=True``), once."""
        if self.current and self.current not in self.folds:
            self.current["oom"] = True
            self._close(self.current)


# where a fold of the user's loop ran out of memory (a fold record's ``oom_during``), in words
OOM_MOMENTS = {"load": "while loading", "train": "while training",
               "prepare": "while SFTTrainer(...) prepared the new model (the fp32 upcast), the old one still alive"}


@contextmanager
def trl_of_the_post(recipe: str | None):
    """``recipe="standard"``: inside the block, the name ``SFTTrainer`` in :func:`user_fold_loop` is the trainer of
    the TRL of the user's post (:class:`~kit.scenarios.cross_validation.training.PostSFTTrainer`, which runs peft's
    fp32 upcast), so the loop runs as they ran it and its printed source stays theirs. None: today's TRL."""
    global SFTTrainer
    if recipe is None:
        yield
        return
    if recipe != "standard":
        raise ValueError(f"recipe must be None (today's TRL) or 'standard' (the TRL of the user's post), "
                         f"not {recipe!r}.")
    today, SFTTrainer = SFTTrainer, PostSFTTrainer
    try:
        yield
    finally:
        SFTTrainer = today


def fold_line(rec: dict) -> str:
    """One fold of the user's loop, read aloud in a line (MEASURED).

    >>> print(fold_line({"fold": 2, "start_bytes": 2**20, "load_peak_bytes": 3 * 2**20, "models_alive_after_load": 2,
    ...                  "train_peak_bytes": 2**21, "models_alive_in_training": 1, "end_bytes": 2**20}))
    fold 2: loading 1.00 MiB -> 3.00 MiB peak (2 models alive); training peak 2.00 MiB (1 model alive); end 1.00 MiB
    """
    def b(key):
        return fmt_bytes(rec[key]) if rec.get(key) is not None else "not read"

    def alive(key):
        n = rec.get(key)
        return "models not counted" if n is None else f"{n} model{'' if n == 1 else 's'} alive"

    line = (f"fold {rec['fold']}: loading {b('start_bytes')} -> {b('load_peak_bytes')} peak "
            f"({alive('models_alive_after_load')})")
    if rec.get("oom_during") in OOM_MOMENTS and rec["oom_during"] != "train":
        return line + f"; OUT OF MEMORY {OOM_MOMENTS[rec['oom_during']]}"
    line += f"; training peak {b('train_peak_bytes')} ({alive('models_alive_in_training')})"
    return line + ("; OUT OF MEMORY while training" if rec.get("oom") else f"; end {b('end_bytes')}")


@runtime.once_per_run()  # the MODEL line once, not once per fold
def run_broken_loop(model_name: str = "tiny-llama", *, folds: int = 3, output_dir="cv-runs/broken",
                    tracker=None, on_fold_end=None, recipe: str | None = None, cap_bytes: int | None = None,
                    **settings) -> dict:
    """The user's loop, tracked per fold, OOM-safe: ``{"folds": [...], "oom_at_fold": int|None}``.

    Each fold record is :class:`FoldWatch`'s. An out-of-memory error is caught
    (``kit.measure.oom.oom_safe``), its fold recorded with ``oom=True`` and ``oom_during`` ("load" or
    "train"), and the memory freed. ``on_fold_end(folds)`` gets the fold records so far, to
    redraw a chart. ``settings``: batch_size, seq_len, steps_per_fold, lora_r, lora_targets,
    quantization, max_samples, seed (see ``training.DEFAULTS``). The model is the real one where the Hub
    serves it, else its architecture twin, loaded by the user's own ``from_pretrained`` line. ``recipe="standard"``:
    as the TRL of their post ran it (:func:`trl_of_the_post`). ``cap_bytes``: the loop runs under that memory cap
    (``kit.measure.controls.memory_cap``: a GPU of that size; on a CPU, a live-tensor cap); ``cap`` says which.

    >>> broken = run_broken_loop("tiny-llama", folds=2)        # doctest: +SKIP
    >>> broken["folds"][1]["models_alive_after_load"]            # doctest: +SKIP
    2
    """
    p, folds = loop_params(**settings), fold_count(folds)
    tracker = tracker if tracker is not None else Tracker()
    tokenizer, data = kdata.load_tokenizer(model_name), user_data(p["max_samples"])
    model_path, line = kmodels.pretrained_source(model_name, "bf16")  # a Llama checkpoint is bf16
    runtime.say(line)
    watch = FoldWatch(tracker, on_fold_end)
    gc.collect()  # an earlier run's garbage must not be counted as this loop's
    with memory_cap(cap_bytes) as cap, trl_of_the_post(recipe):
        result = oom.oom_safe(user_fold_loop, data, KFold(n_splits=folds), model_path, bnb_for(p),
                              lora_config(p["lora_r"], p["lora_targets"]), sft_config(p, output_dir), tokenizer,
                              watch, setup={"model": model_name, **p})
    cleanup.release()  # the loop's models die with its frame; collect them and empty the CUDA cache
    if result.oom:
        fold = watch.current.get("fold")
        print(wrap(f"OUT OF MEMORY at fold {fold}, {OOM_MOMENTS.get(watch.current.get('oom_during'), 'while training')}"
                   f": {result.error}"), flush=True)
        watch.close_failed()
    return {"folds": watch.folds, "oom_at_fold": watch.current.get("fold") if result.oom else None,
            "cap_bytes": cap.cap_bytes, "cap": cap.how}
