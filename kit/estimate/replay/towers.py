"""Several forwards of one model before one backward: sentence-transformers' towers.

A sentence-transformers loss runs the model more than once a step (the anchor column, then the other columns merged
into one forward), keeps every forward's embeddings, and calls backward once on the loss. So the forwards' saved
tensors add up at the loss, and autograd then walks the last forward's graph first, whole (its nodes were made last,
and the engine runs the ready node made last), then the one before it, and so on: a forward's backward runs beside
the saved tensors of the forwards still to come, and every backward after the first meets the grads the earlier
ones made (as a later micro-batch of gradient accumulation does: each new grad added in place).

>>> from kit.estimate.replay.core import Moment, Replay
>>> rp = Replay(L=1, ckpt=False, embed=0, block=10, block_in=0, shared=0, head=0, head_in=0, loss=0, logits_live=2,
...             cache=0, block_bwd=0, block_bwd_grads=0, hidden=0, copies_block=0, copies_head=0, copies_head_in=0,
...             last_logits=0, ls=0)
>>> fresh = [Moment("forward (at the loss)", 10, 2, 0, 0, 0), Moment("backward (block 1)", 10, 0, 0, 5, 1)]
>>> alive = [Moment("forward (at the loss)", 10, 2, 0, 9, 0), Moment("backward (block 1)", 10, 0, 0, 9, 1)]
>>> [(m.where, m.total) for m in tower_moments([(rp, fresh, alive), (rp, fresh, alive)])]
[('forward (at the loss)', 24), ('backward (block 1)', 28), ('backward (block 1), forward 1 of 2', 20)]
"""
from __future__ import annotations

from dataclasses import replace


def tower_bytes(rp) -> int:
    """What one forward holds from its end till its backward: its saved tensors and its pooled output."""
    return rp.saved_bytes() + rp.logits_live


def tower_moments(towers: list) -> list:
    """The moments of the forwards ``towers`` (``(replay, fresh, alive)`` each, in the order they run; ``fresh``: its
    moments with the grads as the step finds them, ``alive``: with every grad made, each new one added in place) and
    one backward: the last forward and its backward beside the earlier forwards' saved tensors, then each earlier
    forward's backward beside those still to come."""
    held = [tower_bytes(rp) for rp, _, _ in towers]
    out = [replace(m, activations=m.activations + sum(held[:-1])) for m in towers[-1][1]]
    for index in range(len(towers) - 2, -1, -1):
        out += [replace(m, where=f"{m.where}, forward {index + 1} of {len(towers)}",
                        activations=m.activations + sum(held[:index]))
                for m in towers[index][2] if m.where.startswith("backward") and m.where != "backward (loss)"]
    return out
