"""GRPOTrainer's (and RLOOTrainer's, DistillationTrainer's) generation phase as a stage of its own in
``kit.watch`` / ``kit.train``.

TRL's GRPOTrainer generates inside ``training_step`` (``_prepare_inputs`` -> ``_generate_and_score_completions``:
``generate``, the no-grad old-log-prob and reference passes, the rewards), once every ``steps_per_generation x
num_iterations`` steps. :class:`GenerationStage` wraps that method on the instance: while it runs the phase is
"first_generation" (step 1, no optimizer state yet) or "generation", and the tracker records a ``"generation"``
stage (nested in ``kit.train``'s ``"train"``), which the live plot shades and names. The stage resets no peak
counter, so kit.train's step peaks still hold the generation (the estimate's step peaks include it where it is the
largest; ``estimate.setup["generation_peak_bytes"]`` is its own).
"""
from __future__ import annotations

import weakref

from kit import trainer_kinds
from kit.watching.core import StageHook

METHOD = "_generate_and_score_completions"   # GRPOTrainer's (TRL 1.16)


class GenerationStage:
    """``trainer._generate_and_score_completions``, marked for the phase callback and the tracker. Holds the
    Trainer weakly (no cycle); a wrapper someone else put there is kept and called."""

    def __init__(self, trainer, phases, tracker):
        self.trainer, self.phases, self.tracker = weakref.ref(trainer), phases, tracker
        self.inner = trainer.__dict__.get(METHOD)

    def __call__(self, *args, **kwargs):
        tr, p = self.trainer(), self.phases
        before = p.phase
        p.phase = "first_generation" if before.startswith("first") else "generation"
        with self.tracker.stage("generation", reset_peak=False, collect=False, live_tensors=False):
            out = self.inner(*args, **kwargs) if self.inner else getattr(type(tr), METHOD)(tr, *args, **kwargs)
        p.phase = before
        return out


def attach(trainer, phases, tracker) -> bool:
    """Mark a GRPOTrainer's generation (nothing where its class has no such method); whether it was marked."""
    if not callable(getattr(type(trainer), METHOD, None)):
        return False
    setattr(trainer, METHOD, GenerationStage(trainer, phases, tracker))
    return True


def detach(trainer) -> None:
    """Put back what :func:`attach` wrapped."""
    marked = trainer.__dict__.get(METHOD)
    if isinstance(marked, GenerationStage):
        if marked.inner is None:
            delattr(trainer, METHOD)
        else:
            setattr(trainer, METHOD, marked.inner)


trainer_kinds.register_part("grpo", "watch", StageHook(attach, detach))
trainer_kinds.register_part("rloo", "watch", StageHook(attach, detach))   # RLOOTrainer generates as GRPOTrainer
trainer_kinds.register_part("distillation", "watch", StageHook(attach, detach))   # on-policy: the same method
