"""Notebook 01's exercises and prediction checks: the largest low-rank head that fits a device, a hidden
outsized layer for ``find_culprit``, and the learner's fits/does-not-fit answers against the estimates.

>>> rank_check(256).startswith("rank 256: ESTIMATED peak")
True
"""
from __future__ import annotations

from kit import inputs as kin
from kit import models as kmodels
from kit.presets import PRESETS
from kit.scenarios.custom_head import scenario as s1
from kit.units import fmt_bytes, wrapped


# -- the exercise: the largest low-rank head that fits -----------------------------------------
def _rank_fits(rank: int, preset: str) -> tuple[bool, int]:
    peak = s1.estimate_fix("b", "real", rank=rank).peak_bytes
    return peak <= PRESETS[preset].gpu_bytes, peak


@wrapped
def rank_check(my_rank, preset: str = "colab-t4") -> str:
    """The exercise's check: fix (b) with a head of rank ``my_rank`` at real size, ESTIMATED against ``preset``.

    >>> rank_check(256).startswith("rank 256: ESTIMATED peak")
    True
    """
    vocab = kmodels.get_config("distilgpt2").vocab_size + 1  # the pad token the user added
    rank = kin.whole_number("my_rank", my_rank)
    if rank >= vocab:
        raise kin.InputError("my_rank", f"my_rank must be below the vocabulary ({vocab}): a rank-V head is no "
                                        f"smaller than the V x V one. Try a few hundred or a few thousand.")
    fits, peak = _rank_fits(rank, preset)
    more, _ = _rank_fits(rank + 1, preset)
    return (f"rank {rank}: ESTIMATED peak {fmt_bytes(peak)}, {'fits' if fits else 'DOES NOT FIT'} "
            f"{PRESETS[preset].label}" + ("; and rank + 1 does not: the largest" if fits and not more else
                                          "; rank + 1 fits too: go higher" if fits else "; go lower"))


def largest_rank(preset: str = "colab-t4") -> int:
    """The exercise's solution: the largest rank of fix (b)'s head whose ESTIMATED peak fits ``preset``
    (a bisection on the estimator; the peak grows with the rank).

    >>> largest_rank("colab-t4") > s1.RANK["real"]        # doctest: +SKIP
    True
    """
    lo, hi = 1, kmodels.get_config("distilgpt2").vocab_size  # fits at lo (checked), the search stays below V
    if not _rank_fits(lo, preset)[0]:
        raise ValueError(f"even a rank-1 head does not fit {PRESETS[preset].label}: the base alone is too big.")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _rank_fits(mid, preset)[0] else (lo, mid)
    return lo


def twin_rank(rank: int, size: str | None = None) -> int:
    """The rank a run of ``size`` trains for a real-size ``rank``: the same, or in smoke mode the same share
    of the tiny twin's vocabulary (its V is 4097, not 50258).

    >>> twin_rank(5000, "smoke")
    408
    """
    if s1.size_name(size) == "real":
        return rank
    share = rank / (kmodels.get_config("distilgpt2").vocab_size + 1)
    return max(1, round(share * (kmodels.get_config(kmodels.smoke_twin("distilgpt2")).vocab_size + 1)))


def fits_answer_text(my_fits: dict, preset: str = "colab-t4") -> str:
    """The learner's True/False per fix against the estimate's verdict at real size (ESTIMATED).

    >>> print(fits_answer_text({"a": True, "b": None, "c": True}))      # doctest: +SKIP
    """
    lines = [f"ESTIMATED verdicts against {PRESETS[preset].label}:"]
    for which in "abc":
        fits = s1.estimate_fix(which, "real").peak_bytes <= PRESETS[preset].gpu_bytes
        mine = (my_fits or {}).get(which)
        mark = "no answer" if mine is None else ("right" if mine == fits else "not this time")
        lines.append(f"  fix ({which}): {'fits' if fits else 'does not fit'}; you said {mine}: {mark}")
    return "\n".join(lines)


# -- the exercise: a hidden culprit ------------------------------------------------------------
def toy_model(device: str = "meta"):
    """A small text classifier (4 blocks of width 256) with one outsized layer buried in its third block,
    a mistyped width, for :func:`kit.scenarios.custom_head.scenario.find_culprit` to catch.

    >>> sum(p.numel() for p in toy_model().parameters()) > 100_000_000
    True
    """
    import torch
    from torch import nn

    def block(d, hidden):
        return nn.Sequential(nn.LayerNorm(d, device=device), nn.Linear(d, hidden, device=device), nn.GELU(),
                             nn.Linear(hidden, d, device=device))

    with torch.device(device):
        blocks = nn.ModuleList([block(256, 1024) for _ in range(4)])
        blocks[2][1] = nn.Linear(256, 1024 * 512)   # the hidden culprit: a width that someone mistyped
        blocks[2][3] = nn.Linear(1024 * 512, 256)
        return nn.ModuleDict({"embed": nn.Embedding(8000, 256), "blocks": blocks, "classify": nn.Linear(256, 4)})


def culprit_check(my_culprit, model) -> str:
    """Whether ``my_culprit`` names a module with the most trainable parameters of ``model`` (within 10% of
    the top one: the toy's mistyped width makes two such layers).

    >>> culprit_check("blocks.2.1", toy_model())
    'Right: blocks.2.1 holds 134,742,016 of 272,587,780 trainable parameters (49%).'
    """
    own = {n: sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad) for n, m in model.named_modules()}
    total, top = sum(own.values()), max(own, key=own.get)
    if my_culprit is None:
        return "No answer written (my_culprit is None): run find_culprit above and copy the top module's name."
    if my_culprit not in own:
        return f"{my_culprit!r} is not a module of this model: copy a name exactly as find_culprit prints it."
    share = f"{own[my_culprit]:,} of {total:,} trainable parameters ({own[my_culprit] / total:.0%})"
    return f"Right: {my_culprit} holds {share}." if own[my_culprit] >= 0.9 * own[top] else \
        f"Not this one: {my_culprit} holds {share}. Look at the top line again."
