"""What fits: the fit advisor's ranked changes, the largest batch and sequence, and ``kit.check``.

Its rooms: ``core`` (:func:`advise`, the device limit, judged on the reserved estimate), ``search`` (the moves
and the bounded search), ``costs`` (what each move costs, in words), ``edge`` (the largest batch and sequence),
``levers`` (TRL's levers: padding-free, and why chunked NLL is none in TRL 1.16), ``grpo_levers``,
``dpo_levers`` and ``kto_levers`` (the trainer kinds' own: :mod:`kit.trainer_kinds`), ``table`` (``table.levers``: each
lever alone on a setup), ``gpus`` (the fewest GPUs when one is not enough), ``said`` (the advisor's text, the answer
first) and ``answer`` (the biggest cause, a change in one line), ``objects`` and ``mapping`` (a suggestion in the
user's own objects: :func:`in_objects`, :func:`apply`) and ``check`` (:func:`check`). Prediction only: it imports
:mod:`kit.estimate` and the foundations, never :mod:`kit.measure`.
"""
# the kinds' levers: each registers as imported
from kit.advise import distillation_levers, dpo_levers, grpo_levers, kto_levers, sentence_levers  # noqa: F401
from kit.advise.check import check
from kit.advise.core import SAFETY, Advice, Limit, advise, limit_for, max_batch_size, max_seq_len
from kit.advise.objects import apply, in_objects

__all__ = ["advise", "max_batch_size", "max_seq_len", "check", "Advice", "Limit", "limit_for", "SAFETY",
           "apply", "in_objects"]
