"""The user's own run: ``kit.watch(trainer)`` (a live plot and the tracker) and ``kit.train(trainer)`` (a
report, never the out-of-memory error). Its rooms: ``trainer`` (watch and train) and ``report`` (the report).
"""
from kit.watching.report import TrainReport
from kit.watching.trainer import train, watch

__all__ = ["watch", "train", "TrainReport"]
