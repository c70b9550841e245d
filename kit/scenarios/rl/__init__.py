"""Notebook 04, why RL fine-tuning runs out of memory: TRL's GRPOTrainer (its quick start: an instruct model and
the number-of-distinct-characters reward) predicted phase by phase, measured, and fixed with the advisor's best
GRPOConfig change (:mod:`kit.advise.grpo_levers`), measured again.

``setup``: the run's GRPOConfig at each size, the prompts (from the kit's shipped text, offline) and the Trainer;
``phases``: the three suspects (the generation, the reference model, the logits) read off the estimate;
``runs``: a measured run, each phase beside its estimate.
"""
__all__: list = []
