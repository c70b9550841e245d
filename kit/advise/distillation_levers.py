"""The fit advisor's part for TRL's DistillationTrainer (:mod:`kit.estimate.distillation`): its teacher is read from
the built trainer, which a changed setup would not rebuild, so the advisor says which DistillationConfig fields move
its peak, in one sentence, rather than search without the teacher.
"""
from __future__ import annotations

from kit import trainer_kinds
from kit.advise.dpo_levers import search_refused

_REFUSE = search_refused("the fit advisor does not search DistillationTrainer setups (the teacher's weights and "
                         "forward are read from the built trainer): lower per_device_train_batch_size or "
                         "max_completion_length (the divergence's tiles and the KV cache grow with them), pass "
                         "a peft_config, or use a smaller teacher, and estimate again.")


def refuse_search(est, limit, model=None):
    """The advisor's answer for a DistillationTrainer's estimate: no search, the fields that move its peak."""
    _REFUSE(est, limit, model)


trainer_kinds.register_part("distillation", "advise", refuse_search)
