"""The tracker's ``transformers.TrainerCallback``: memory readings between optimizer steps.

Made by ``Tracker.callback()``; imported on first use, since transformers takes seconds to import
and stages alone do not need it.

>>> trainer = Trainer(..., callbacks=[tracker.callback()])  # doctest: +SKIP
"""
from __future__ import annotations

import time

from transformers import TrainerCallback


class MemoryCallback(TrainerCallback):
    """Samples a Tracker during training; see ``Tracker.callback``."""

    def __init__(self, tracker, every_n_steps, overhead, live_tensors, min_interval_s):
        self.tracker, self.every_n_steps = tracker, every_n_steps
        self.overhead, self.live_tensors, self.min_interval_s = overhead, live_tensors, min_interval_s
        self.t0 = self.last = time.perf_counter()
        self.spent_s = 0.0               # seconds spent in samples and their listeners (redraws)

    def _take(self, step, event, live):
        self.last = time.perf_counter()
        self.tracker.sample(step, live_tensors=live, event=event)
        self.spent_s += time.perf_counter() - self.last

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.spent_s = time.perf_counter(), 0.0
        self._take(state.global_step, "train_begin", self.live_tensors is True)

    def on_optimizer_step(self, args, state, control, **kwargs):
        step = state.global_step + 1     # global_step is incremented after this hook
        now = time.perf_counter()
        budget = self.overhead * (now - self.t0) - self.spent_s
        cheap = self.tracker.cost_cheap_s
        if self.every_n_steps is not None:
            due = step % self.every_n_steps == 0
        else:
            due = budget >= cheap and now - self.last >= self.min_interval_s
        if due:
            live = self.live_tensors
            if live is None:
                live = budget >= cheap + self.tracker.cost_live_s
            self._take(step, "step", live)

    def on_evaluate(self, args, state, control, **kwargs):
        self._take(state.global_step, "evaluate", self.live_tensors is True)

    def on_train_end(self, args, state, control, **kwargs):
        self._take(state.global_step, "train_end", self.live_tensors is True)
