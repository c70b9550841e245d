"""The fit advisor's part for TRL's KTOTrainer (:mod:`kit.estimate.kto`): its reference model and KL rows are
estimated but not searched, so the advisor says which KTOConfig fields to change, in one sentence.
"""
from __future__ import annotations

from kit import trainer_kinds
from kit.advise.dpo_levers import reference_sentence, search_refused

_REFUSE = search_refused(reference_sentence("KTOTrainer", "KTOConfig",
                                            "per_device_train_batch_size, max_length, a peft_config"))


def refuse_search(est, limit, model=None):
    """The advisor's answer for a KTO estimate: no search, the KTOConfig fields that move its peak."""
    _REFUSE(est, limit, model)


trainer_kinds.register_part("kto", "advise", refuse_search)
