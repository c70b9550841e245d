"""Notebook 02's exercise: write your own adapter reset and your own cleanup, and let the kit check them.

- :func:`check_reset`: trains one fold, calls ``my_reset(model, init)``, then asks
  :func:`~kit.scenarios.cross_validation.lora_reset.verify_adapter_reset` whether the adapter is back at its init.
- :func:`check_free`: trains one fold, calls ``my_free(trainer)`` while the caller still holds
  ``trainer`` (as the user's loop does until the next fold), then counts the models still in memory.

Both run on the model the notebook's loops train (the tiny twin in smoke mode) and return a verdict
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
from kit.scenarios.cross_validation.lora_reset import save_adapter_init, verify_adapter_reset
from kit.scenarios.cross_validation.training import count_live_models, fold_trainer, load_for_training, loop_params
from kit.units import wrapped

_SAID: dict = {}  # the loader lines, said once for all the checks of a notebook


@runtime.once_per_run(_SAID)
def _one_fold(model_name: str, settings: dict):
    p = loop_params(**{"steps_per_fold": 1, **settings})
    tok, splits = fold_texts(model_name, 2, p["max_samples"])
    model = load_for_training(model_name, p)
    trainer = fold_trainer(model, *splits[0], tok, p, tempfile.mkdtemp(prefix="kit-exercise-"), 1, Tracker())
    init = save_adapter_init(model)  # after SFTTrainer cast the adapters to the dtype it trains them in
    trainer.train()
    return model, init, trainer


@wrapped
def check_reset(my_reset, model_name: str, **settings) -> str:
    """Train one fold, run ``my_reset(model, init)`` (``init``: the adapter's saved initial state, a dict of
    tensors by name, as :func:`~kit.scenarios.cross_validation.lora_reset.save_adapter_init` returns it), and check it."""
    model, init, trainer = _one_fold(model_name, settings)
    trainer = cleanup.release(trainer)
    try:
        my_reset(model, init)
        check = verify_adapter_reset(model, init)
    finally:
        del model, init
        cleanup.release()
    return ("your reset works: " if check.ok else "your reset: ") + check.text()


@wrapped
def check_free(my_free, model_name: str, **settings) -> str:
    """Train one fold, run ``my_free(trainer)`` while this function still holds ``trainer`` (as the user's
    loop holds it until the next fold), and count the loaded models left in memory (MEASURED)."""
    before = count_live_models()
    model, init, trainer = _one_fold(model_name, settings)
    del model, init  # only the Trainer holds the model now, as in the user's loop
    try:
        my_free(trainer)
        left = count_live_models() - before
    finally:
        trainer = cleanup.release(trainer)
    if left == 0:
        return "your cleanup works: no model is left in memory, though the caller still holds `trainer`"
    return (f"your cleanup left {left} model(s) in memory: the Trainer still reaches the model (trainer.model, "
            "trainer.model_wrapped, the accelerator's lists) or the optimizer. Drop those references, then collect.")
