"""A GPU scaled down to the model a run trains, so that its out-of-memory error shows on any machine.

The user's Llama-3-8B crashes a T4 at fold 2's load; the model a workshop trains (Llama-3.2-1B, or its tiny twin on
a CPU) never does. :func:`scaled_cap` gives the cap that is to that model what the T4 is to the 8B, from the kit's
estimates; ``run_broken_loop`` / ``run_fixed_loop`` take it as ``cap_bytes`` (``kit.measure.controls.memory_cap``:
a CUDA memory fraction on a GPU, a live-tensor cap on a CPU). :func:`run_estimate` is the loops' run as estimated.

>>> print(scaled_cap("tiny-llama", batch_size=1, seq_len=8)["text"])      # doctest: +SKIP
"""
from __future__ import annotations

from kit.estimate import estimate
from kit.presets import PRESETS
from kit.scenarios.cross_validation.predict import options_of, user_estimate
from kit.units import fmt_bytes, wrap

USER_MODEL = "meta-llama/Meta-Llama-3-8B"   # the user's model


def run_estimate(model_name: str, recipe: str | None = None, **settings):
    """The loops' run on this machine, ESTIMATED (:func:`user_estimate` ``here=True``): today's TRL (``recipe``
    None) or with the k-bit recipe ``"standard"`` (peft's fp32 upcast, as the TRL of the user's post ran it;
    the rest is today's SFTTrainer, as :class:`~kit.scenarios.cross_validation.training.PostSFTTrainer` runs).

    >>> run_estimate("tiny-llama", "standard", batch_size=1, seq_len=8).setup["kbit_recipe"]
    'standard'
    """
    est = user_estimate(model_name, here=True, **settings)
    return est if recipe is None else estimate(**{**options_of(est), "kbit_recipe": recipe})


def scaled_cap(model_name: str, preset: str = "colab-t4", real_model: str = USER_MODEL, recipe: str | None = "standard",
               **settings) -> dict:
    """A memory cap that is to ``model_name`` what ``preset``'s GPU is to ``real_model``: the GPU's bytes x (the
    model's weights as trained / the real model's), both ESTIMATED with the same recipe and LoRA (weights do not
    depend on batch or sequence). The weights, because fold 2's load holds two models: the cap holds as many of
    ``model_name``'s models as the GPU holds ``real_model``'s. Returns ``{"cap_bytes", "limit_bytes",
    "model_weights_bytes", "real_weights_bytes", "models_per_gpu", "text"}``.

    >>> cap = scaled_cap("tiny-llama", batch_size=1, seq_len=8)
    >>> cap["cap_bytes"] == PRESETS["colab-t4"].gpu_bytes * cap["model_weights_bytes"] // cap["real_weights_bytes"]
    True
    """
    limit = PRESETS[preset].gpu_bytes
    mine = run_estimate(model_name, recipe, **settings).weights_bytes
    real = user_estimate(real_model, **settings)
    real = real if recipe is None else estimate(**{**options_of(real), "kbit_recipe": recipe})
    cap, gpu = limit * mine // real.weights_bytes, PRESETS[preset].label.split(" (")[0]
    how = "the 2024 recipe's fp32 upcast" if recipe == "standard" else "today's TRL"
    text = (f"Memory cap {fmt_bytes(cap)}: a {gpu}'s {fmt_bytes(limit)} x {model_name}'s model as trained "
            f"({fmt_bytes(mine)}) / {real_model}'s ({fmt_bytes(real.weights_bytes)}), ESTIMATED with {how}: it holds "
            f"{limit / real.weights_bytes:.2f} of these models, as the {gpu} holds {limit / real.weights_bytes:.2f} "
            f"of the real ones.")
    return {"cap_bytes": cap, "limit_bytes": limit, "model_weights_bytes": mine,
            "real_weights_bytes": real.weights_bytes, "models_per_gpu": limit / real.weights_bytes, "text": wrap(text)}
