"""The fit advisor's part for TRL's DPOTrainer (:mod:`kit.estimate.dpo`): its reference model and phases are
estimated but not searched, so the advisor says which DPOConfig fields to change, in one sentence.
"""
from __future__ import annotations

from kit.inputs import InputError

from kit import trainer_kinds
from kit.estimate.trainer_reader import listed


def search_refused(sentence: str):
    """The advisor's part for a kind it does not search: no search, the one ``sentence`` that says why and which
    fields move its peak (``{searched}`` in it: the trainers the advisor does search)."""

    def refuse_search(est, limit, model=None):
        searched = [trainer_kinds.part_of(key, "estimate").trainer_name for key in trainer_kinds.keys()
                    if trainer_kinds.part_of(key, "advise") is None and trainer_kinds.part_of(key, "estimate")]
        raise InputError("setup", sentence.format(searched=listed(searched)))

    return refuse_search


def reference_sentence(trainer_name: str, config_name: str, fields: str) -> str:
    """:func:`search_refused`'s sentence for a kind whose reference model is estimated but not searched: the
    ``fields`` of its config (``config_name``) that move its peak."""
    return (f"the fit advisor searches {{searched}} setups, and {trainer_name}'s reference model and phases are "
            f"estimated but not searched: change the {config_name} ({fields}) and estimate again.")


refuse_search = search_refused(reference_sentence(
    "DPOTrainer", "DPOConfig", "per_device_train_batch_size, max_length, precompute_ref_log_probs, a peft_config"))
trainer_kinds.register_part("dpo", "advise", refuse_search)
