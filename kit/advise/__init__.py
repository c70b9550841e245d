"""What fits: the fit advisor's ranked changes, the largest batch and sequence, and ``kit.check``.

Its rooms: ``core`` (:func:`advise`, the device limit), ``search`` (the moves, their costs, the bounded
search), ``gpus`` (the fewest GPUs when one is not enough) and ``check`` (:func:`check`). Prediction only:
it imports :mod:`kit.estimate` and the foundations, never :mod:`kit.measure`.
"""
from kit.advise.check import check
from kit.advise.core import SAFETY, Advice, Limit, advise, limit_for, max_batch_size, max_seq_len

__all__ = ["advise", "max_batch_size", "max_seq_len", "check", "Advice", "Limit", "limit_for", "SAFETY"]
