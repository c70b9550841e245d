"""The fit advisor's part for TRL's RLOOTrainer (:mod:`kit.estimate.rloo`): its generation phase, reference model
and rollouts are estimated but not searched, so the advisor says, in one sentence, which RLOOConfig fields move its
peak.
"""
from __future__ import annotations

from kit.inputs import InputError

from kit import trainer_kinds
from kit.estimate.trainer_reader import listed


def refuse_search(est, limit, model=None):
    """The advisor's answer for an RLOO estimate: no search, the RLOOConfig fields that move its peak."""
    searched = [trainer_kinds.part_of(key, "estimate").trainer_name for key in trainer_kinds.keys()
                if trainer_kinds.part_of(key, "advise") is None and trainer_kinds.part_of(key, "estimate")]
    raise InputError("setup", f"the fit advisor searches {listed(searched)} setups, and RLOOTrainer's generation "
                              "phase, reference model and rollouts are estimated but not searched: change the "
                              "RLOOConfig (per_device_train_batch_size, max_completion_length, num_generations, "
                              "beta=0.0 for no reference, a peft_config) and estimate again.", code="rloo-no-search")


trainer_kinds.register_part("rloo", "advise", refuse_search)
