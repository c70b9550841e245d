"""The fit advisor's part for sentence-transformers' SentenceTransformerTrainer (:mod:`kit.estimate.sentence_trainer`):
its forwards (the anchor column, then the others merged) are estimated from the trainer's columns, which a changed
setup would not keep, so the advisor says which fields to change, in one sentence, rather than search without them.
"""
from __future__ import annotations

from kit import trainer_kinds
from kit.advise.dpo_levers import search_refused

_REFUSE = search_refused("the fit advisor does not search SentenceTransformerTrainer setups (its forwards, one "
                         "per text column group, are read from the trainer's data): lower "
                         "per_device_train_batch_size or the model's max_seq_length, or turn on "
                         "gradient_checkpointing, and estimate again.")


def refuse_search(est, limit, model=None):
    """The advisor's answer for a SentenceTransformerTrainer's estimate: no search, the fields that move its peak."""
    _REFUSE(est, limit, model)


trainer_kinds.register_part("sentence", "advise", refuse_search)
