"""Notebook 02's exercises: write your own adapter reset and your own cleanup, and let the kit check them; then make
fold 2 fit on the panel without changing the model (:func:`fold2_check`).

- :func:`check_reset`: one fold, trained once and kept (:func:`shared_fold`): the adapter is put back as that
  fold left it, ``my_reset(model, init)`` runs, then
  :func:`~kit.scenarios.cross_validation.lora_reset.verify_adapter_reset` says whether it is back at its init.
  Every attempt reuses the same loaded, trained model: no reload, no retraining.
- :func:`shared_trainer`: a new fold's ``SFTTrainer`` on the shared model (PyTorch's counters section).
- :func:`trained_trainer` / :func:`check_free`: one fold's trained ``SFTTrainer`` on the shared model, handed to the
  notebook as the only holder of that model (as the user's loop holds ``trainer`` until the next fold); the
  learner frees it in the notebook's own scope, then :func:`check_free` counts the loaded models left in memory
  (MEASURED). The whole exercise loads one model. :func:`drop_shared`: let the shared model go.

Both checks run on the model the notebook's loops train (the tiny twin in smoke mode) and return a verdict
in words; neither raises when the learner's code is wrong, only when it raises itself.

>>> print(check_reset(lambda model, init: None, "tiny-llama"))      # doctest: +SKIP
your reset: adapter NOT reset: base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight is not zero ...
"""
from __future__ import annotations

import tempfile

from kit import runtime
from kit.measure import cleanup
from kit.measure.track import Tracker
from kit.scenarios.cross_validation.folds import fold_texts
from kit.scenarios.cross_validation.lora_reset import (
    adapter_state,
    restore_adapter,
    save_adapter_init,
    states_equal,
    verify_adapter_reset,
)
from kit.scenarios.cross_validation.training import count_live_models, fold_trainer, load_for_training, loop_params
from kit.scenarios.cross_validation.cap import USER_MODEL
from kit.scenarios.cross_validation.panel_folds import fold2_text
from kit.units import wrapped

_SAID: dict = {}  # the loader lines, said once for all the checks of a notebook
_SHARED: dict = {}  # the one trained fold every reset check reuses: key, model, init, trained, data
_FREE: dict = {}    # the models in memory before trained_trainer() loaded its own


def _key(model_name: str, settings: dict) -> tuple:
    p = loop_params(**{"steps_per_fold": 1, **settings})
    return (model_name,) + tuple((k, str(v)) for k, v in sorted(p.items()) if k != "steps_per_fold")


def shared_fold(model_name: str, **settings) -> dict:
    """The exercise's fold: the model loaded and wrapped once, trained for one fold once, and kept. Returns
    ``{"model", "init", "trained", "tokenizer", "splits", "params"}``: ``init`` the adapter's saved initial state
    (after SFTTrainer cast it to the dtype it trains in), ``trained`` the adapter as that fold left it.
    Asked again with the same settings (steps aside), it returns the same fold."""
    key = _key(model_name, settings)
    if _SHARED.get("key") != key:
        drop_shared()
        p = loop_params(**{"steps_per_fold": 1, **settings})
        with runtime.once_per_run(_SAID):
            tok, splits = fold_texts(model_name, 2, p["max_samples"])
            model = load_for_training(model_name, p)
        trainer = fold_trainer(model, *splits[0], tok, p, tempfile.mkdtemp(prefix="kit-exercise-"), 1, Tracker())
        init = save_adapter_init(model)
        trainer.train()
        trainer = cleanup.release(trainer)
        _SHARED.update(key=key, model=model, init=init, trained=adapter_state(model), tokenizer=tok, splits=splits,
                       params=p)
    return _SHARED


def drop_shared(trainer=None) -> None:
    """Release ``trainer`` (if given) and let the exercise's shared model go: ``trainer = ex.drop_shared(trainer)``."""
    cleanup.release(trainer)
    _SHARED.clear()
    cleanup.release()


def shared_trainer(model_name: str, **settings):
    """A new fold's ``SFTTrainer`` on the shared model (:func:`shared_fold`), not trained yet: for a cell that
    reads PyTorch's counters around ``trainer.train()``. ``settings["steps_per_fold"]`` sets its steps."""
    fold = shared_fold(model_name, **settings)
    p = {**fold["params"], "steps_per_fold": loop_params(**settings)["steps_per_fold"]}
    return fold_trainer(fold["model"], *fold["splits"][0], fold["tokenizer"], p,
                        tempfile.mkdtemp(prefix="kit-torch-tools-"), 1, Tracker())


@wrapped
def check_reset(my_reset, model_name: str, **settings) -> str:
    """Put the shared fold's adapter back as its training left it, run ``my_reset(model, init)`` (``init``: the
    adapter's saved initial state, a dict of tensors by name, as
    :func:`~kit.scenarios.cross_validation.lora_reset.save_adapter_init` returns it), and check it."""
    fold = shared_fold(model_name, **settings)
    model, init = fold["model"], fold["init"]
    restore_adapter(model, fold["trained"])  # as fold 1 left it: a reset that does nothing must fail
    if states_equal(adapter_state(model), init):
        raise RuntimeError("the exercise's fold did not move the adapter: the check would mean nothing")
    my_reset(model, init)
    check = verify_adapter_reset(model, init)
    return ("your reset works: " if check.ok else "your reset: ") + check.text()


def trained_trainer(model_name: str, **settings):
    """One fold's ``SFTTrainer``, trained, handed to the notebook as the only holder of its model (through
    ``trainer``), as the user's loop holds it at a fold's end. It takes the shared fold's model over (no new load):
    the kit keeps no reference to it after this."""
    fold = shared_fold(model_name, **settings)
    model, tok, splits, p = fold["model"], fold["tokenizer"], fold["splits"], fold["params"]
    _SHARED.clear()  # the kit lets go of the model and its saved adapter states: only the trainer will hold it
    _FREE["before"] = count_live_models() - 1  # every loaded model but this one
    trainer = fold_trainer(model, *splits[0], tok, p, tempfile.mkdtemp(prefix="kit-exercise-"), 1, Tracker())
    del model, fold
    trainer.train()
    return trainer


@wrapped
def check_free() -> str:
    """Count the loaded models left in memory since :func:`trained_trainer` (MEASURED), after a collection: 0
    when the notebook let go of its trainer in the scope that owns it."""
    if "before" not in _FREE:
        raise RuntimeError("run `trainer = ex.trained_trainer(MODEL_ID, **SETTINGS)` first")
    cleanup.release()  # gc.collect() and the CUDA cache emptied: what is left is held by someone
    left = count_live_models() - _FREE["before"]
    if left <= 0:
        return "your cleanup works: no model of that fold is left in memory (MEASURED: loaded models counted)"
    return (f"your cleanup left {left} model(s) in memory (MEASURED): a name in this notebook still reaches the "
            "Trainer, and through it the model and the optimizer. Let go of it here, where it was made: "
            "`trainer = release(trainer)` (kit.measure.cleanup.release) or `del trainer`.")


# -- the panel exercise: fold 2 made to fit, the model unchanged ----------------------------------------------------
USER_LOOP = {"load": "each", "trainer": "kept", "recipe": "2024"}   # the fold loop as the user ran it


@wrapped
def fold2_check(panel, model: str = USER_MODEL, preset: str = "colab-t4") -> str:
    """Notebook 02's panel exercise: is fold 2 made to fit ``preset`` on ``panel`` (its word "fits", with the
    :data:`~kit.presets.MODELLED_MARGIN` kept free: less is "TIGHT"), the model still the user's? Says which of the
    fold loop's controls now differ from the user's loop.

    >>> from kit import panel                                         # doctest: +SKIP
    >>> p = panel(scenario=2, trainer="released")                       # doctest: +SKIP
    >>> fold2_check(p).startswith("Right")                              # doctest: +SKIP
    True
    """
    c = panel.controls
    if c["model"].value != model:
        return f"Keep the user's model ({model}): the question is how to make fold 2 fit without changing it."
    if c["preset"].value != preset:
        return f"Judge it on the user's GPU: set the device to {preset}."
    if panel.estimate is None:
        return f"The panel has no estimate for these settings: {panel.problem}"
    text, word = fold2_text(panel.story.timeline(panel.estimate), panel.preset().gpu_bytes)
    changed = [f"{key} {value!r}" for key, value in ((k, c[k].value) for k in USER_LOOP) if value != USER_LOOP[key]]
    how = "with " + ", ".join(changed) if changed else "with the user's own loop"
    if word != "fits":
        return f"Not yet: {word}, {how}: {text}."
    return f"Right: fold 2 fits, {how}: {text}."

