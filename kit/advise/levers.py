"""Two levers practitioners pull first where TRL runs (TRL 1.16's source; tests/test_levers.py measures both on
SFTTrainer steps):

- ``loss_type="chunked_nll"`` is named in a note, never offered: ``SFTConfig.__post_init__`` rewrites it to
  ``"nll"`` ("computes the loss the same way"), and ``SFTTrainer.compute_loss`` takes every ``"nll"``/``"dft"``
  loss from ``add_fused_lm_head``'s tiles already (:mod:`kit.estimate.replay.fused_head`): the same bytes.
- ``padding_free=True`` (the move :func:`padding_free`): the micro-batch's rows flattened into one row of the
  same ``B * S`` tokens, estimated at those tokens (every row at ``seq_len``, as the padded estimate holds
  them). Its block-diagonal mask (``[1, 1, B*S, B*S]``) outweighs the padded one (``[B, 1, S, S]``), so there it
  often peaks higher and is not offered; a note then says so. What it saves beyond is the padding the rows
  carry, which the estimate cannot know.
"""
from __future__ import annotations

from kit.estimate.trl import MODELED
from kit.units import fmt_bytes


def _trl(setup) -> bool:
    return bool(setup.get("loss_type") or setup.get("fused_lm_head"))


def padding_free(setup, search):
    """The move: where TRL runs and a micro-batch of several rows is padded, the same tokens in one row."""
    if not _trl(setup) or not setup.get("padded", True) or setup.get("padding_free") or setup["batch_size"] < 2 \
            or setup["seq_len"] != search.base["seq_len"]:   # not after "seq": its refinement reads seq_len as a row's
        return None
    return {"batch_size": 1, "seq_len": setup["batch_size"] * setup["seq_len"], "padding_free": True}


def cost(base, setup) -> str:
    return (f"none at equal tokens: the same {base['batch_size']} rows and loss in one row of {setup['seq_len']} "
            "tokens "
            "(SFTConfig(padding_free=True); position_ids restart per sequence, so no row attends to another); the "
            f"estimate holds every row at {base['seq_len']} tokens: the padding your rows carry is saved on top, "
            "which it does not know")


def notes(search) -> set[str]:
    """The notes of a :class:`kit.advise.search.Search` whose setup runs TRL's loss and does not fit."""
    o, be = search.base, search.base_est
    if search.fits(be) or not _trl(o):
        return set()
    out = {f"loss_type='chunked_nll' is no lever in TRL {MODELED}: SFTConfig rewrites it to 'nll', whose loss "
           "SFTTrainer already computes in tiles (its fused LM head, no logits): the same peak"}
    ch = padding_free(o, search)
    e = ch and search.estimate({**o, **ch})
    if e and e.peak_bytes >= be.peak_bytes:
        out.add(f"padding_free=True at equal tokens (one row of {o['batch_size']} x {o['seq_len']}) peaks at "
                f"{fmt_bytes(e.peak_bytes)}, not less than {fmt_bytes(be.peak_bytes)} (its block-diagonal mask "
                "spans the whole row): it saves only the padding your rows carry, which this estimate (every row at "
                "seq_len) does not know; estimate it at batch_size 1 and seq_len your micro-batch's real tokens")
    return out
