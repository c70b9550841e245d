"""The user's own run: ``kit.watch(trainer)`` (a live plot and the tracker) and ``kit.train(trainer)`` (a
report, never the out-of-memory error). Its rooms: ``trainer`` (watch and train), ``loop`` (``kit.watch_loop``: a
plain PyTorch loop, step by step), ``core`` (what both share: the options checked up front, the live plot, and a
run that stops early: the OOM report, the Ctrl-C cleanup), ``peaks`` (each part's peak read apart), ``recover``
(releasing what a dead run held), ``report`` (the report) and ``generation`` (GRPO's generation, a stage of its
own: a trainer kind's part, :mod:`kit.trainer_kinds`).
"""
from kit.watching import generation  # noqa: F401 (the kinds' stages: each registers as imported)
from kit.watching.loop import LoopWatch, step, watch_loop
from kit.watching.report import TrainReport
from kit.watching.trainer import train, watch

__all__ = ["LoopWatch", "TrainReport", "step", "train", "watch", "watch_loop"]
