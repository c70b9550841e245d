"""The prediction: how much memory a training setup needs, before anything is loaded, and who eats it.

Its rooms: ``core`` (:func:`estimate`), ``result`` (what it returns), ``inventory`` (what a model is made of,
counted on meta), ``quantization`` (bitsandbytes' bytes), ``evaluation`` (``Trainer.evaluate()``'s peak),
``strategies`` (per GPU under DDP, FSDP and ZeRO), ``launch`` (accelerate's config YAML), ``from_objects``,
``read_model`` and ``read_training`` (the user's own Trainer and configs), and ``replay/`` (what the
forward saves, op by op). It never imports :mod:`kit.measure`, :mod:`kit.widgets` or :mod:`kit.plot`.

>>> estimate("tiny-gpt2", batch_size=1, seq_len=16).peak_phase in ("forward/backward", "optimizer step")
True
"""
# the trainer kinds: each registers as imported
from kit.estimate import dpo, grpo, kto, reward, rloo, sentence_trainer, seq2seq, trl  # noqa: F401
from kit.estimate import distillation  # noqa: F401  (registered last: refusals list the kinds in this order)
from kit.estimate.core import INT32_OPTIMIZER, estimate
from kit.estimate.from_objects import estimate_from, estimate_trainer
from kit.estimate.inventory import UnsupportedModel
from kit.estimate.result import COMPONENTS, Estimate, ShardedEstimate
from kit.estimate.strategies import STRATEGIES

__all__ = ["estimate", "estimate_from", "estimate_trainer", "Estimate", "ShardedEstimate", "COMPONENTS",
           "STRATEGIES", "UnsupportedModel", "INT32_OPTIMIZER"]
