"""Scenario 2, Llama-3 QLoRA cross-validation: ``user_loop`` (the user's fold loop, measured per half),
``fixed_loop`` (the advice and the loop whose memory stays flat), ``training`` (what they share), ``folds``
(data, resumable results), ``lora_reset``, ``predict``, ``notebook`` (notebook 02's cells), ``workshop`` (the
download ahead, the plan) and ``exercises``."""
__all__: list = []
