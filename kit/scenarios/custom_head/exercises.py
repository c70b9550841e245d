"""Notebook 01's exercises and prediction checks: the largest low-rank head that fits a device, a hidden
outsized layer for ``find_culprit``, the learner's ratio guess, and their fits/does-not-fit answers against the
estimates; on the panel, the smallest GPU that holds fix (c) (:func:`panel_gpu_check`).

>>> rank_check(256).startswith("rank 256: ESTIMATED peak")
True
"""
from __future__ import annotations

from kit import dtypes
from kit.inputs import InputError
from kit import inputs
from kit import models as kmodels
from kit.advise import limit_for
from kit.presets import PRESETS, verdict
from kit.scenarios.custom_head import scenario
from kit.units import fmt_bytes, wrapped

RATIO_TOLERANCE = 0.05   # a ratio guess within 5% of the computed one is right (30 for 30.8)


# -- the exercise: the largest low-rank head that fits -----------------------------------------
def usable_bytes(preset: str = "colab-t4") -> int:
    """What the rank exercise must fit: ``preset``'s GPU memory less the fit advisor's 5% margin (kept while the
    figures are modelled: :data:`kit.presets.MODELLED_MARGIN`), judged as ``python -m kit fit`` judges, on each
    estimate's reserved figure (the allocated peak plus what the caching allocator holds beyond it, modelled), so
    that the solution's rank leaves room for the allocator and the margin.

    >>> round(usable_bytes("colab-t4") / 2**30, 2)
    13.83
    """
    return limit_for(preset).usable_bytes


def _limit_words(preset: str) -> str:
    lim = limit_for(preset)
    return (f"the {fmt_bytes(lim.usable_bytes)} usable of {PRESETS[preset].label.split(' (')[0]} (its "
            f"{fmt_bytes(lim.limit_bytes)} less the {lim.margin_fraction:.0%} margin; reserved judged)")


def _rank_fits(rank: int, preset: str) -> tuple[bool, object]:
    est = scenario.estimate_fix("b", "real", rank=rank)
    return limit_for(preset).judged(est) <= usable_bytes(preset), est


@wrapped
def rank_check(my_rank, preset: str = "colab-t4") -> str:
    """The exercise's check: fix (b) with a head of rank ``my_rank`` at real size, ESTIMATED against ``preset``'s
    memory (:func:`usable_bytes`: its reserved figure judged, as the fit advisor judges).

    >>> print(rank_check(256))
    rank 256: ESTIMATED peak 917.27 MiB, reserved 1.03 GiB, fits the 13.83 GiB usable of Colab T4 (its 14.56 GiB
        less the 5% margin; reserved judged); rank + 1 fits too: go higher
    """
    vocab = kmodels.get_config("distilgpt2").vocab_size + 1  # the pad token the user added
    rank = inputs.whole_number("my_rank", my_rank)
    if rank >= vocab:
        raise InputError("my_rank", f"my_rank must be below the vocabulary ({vocab}): a rank-V head is no "
                                        f"smaller than the V x V one. Try a few hundred or a few thousand.")
    fits, est = _rank_fits(rank, preset)
    more, _ = _rank_fits(rank + 1, preset)
    return (f"rank {rank}: ESTIMATED peak {fmt_bytes(est.peak_bytes)}, reserved {fmt_bytes(est.reserved_bytes)}, "
            f"{'fits' if fits else 'DOES NOT FIT'} "
            f"{_limit_words(preset)}" + ("; and rank + 1 does not: the largest" if fits and not more else
                                          "; rank + 1 fits too: go higher" if fits else "; go lower"))


def largest_rank(preset: str = "colab-t4") -> int:
    """The exercise's solution: the largest rank of fix (b)'s head whose ESTIMATED peak fits ``preset``'s usable
    memory (:func:`usable_bytes`, the fit advisor's limit; a bisection on the estimator: the peak grows with the
    rank).

    >>> largest_rank("colab-t4") > scenario.RANK["real"]        # doctest: +SKIP
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
    if scenario.size_name(size) == "real":
        return rank
    share = rank / (kmodels.get_config("distilgpt2").vocab_size + 1)
    return max(1, round(share * (kmodels.get_config(kmodels.smoke_twin("distilgpt2")).vocab_size + 1)))


def fix_verdicts(preset: str = "colab-t4") -> dict:
    """Each fix at real size, ESTIMATED in ``preset``'s 16-bit dtype (fix (c): fp16 on a T4), fits ``preset`` or
    not (:func:`kit.presets.verdict`, the verdict ``fixes_at_real_size`` prints).

    >>> fix_verdicts("colab-t4")
    {'a': True, 'b': True, 'c': False}
    """
    dtype = dtypes.for_preset(preset)[0]
    return {w: verdict(scenario.estimate_fix(w, "real", dtype=dtype), preset).fits for w in scenario.FIXES}


def fits_answer_text(my_fits: dict, preset: str = "colab-t4") -> str:
    """The learner's True/False per fix against the estimate's verdict at real size (ESTIMATED).

    >>> print(fits_answer_text({"a": True, "b": None, "c": True}))      # doctest: +SKIP
    """
    lines = [f"ESTIMATED verdicts against {PRESETS[preset].label}:"]
    for which, fits in fix_verdicts(preset).items():
        mine = (my_fits or {}).get(which)
        mark = "no answer" if mine is None else ("right" if mine == fits else "not this time")
        lines.append(f"  fix ({which}): {'fits' if fits else 'does not fit'}; you said {mine}: {mark}")
    return "\n".join(lines)


# -- the guess: how many times DistilGPT2 the head is ----------------------------------------
def ratio_text(my_ratio, actual: float, what: str = "the ratio", tolerance: float = RATIO_TOLERANCE) -> str:
    """The learner's ratio guess beside the computed ratio: right within ``tolerance`` (5%: a whole number
    near 30.8 is right; the question asks for a whole number, not the decimals).

    >>> print(ratio_text(30, 30.84))
    Your answer: 30. The ratio (computed): 30.84. Right: within 5% of it.
    >>> print(ratio_text(10, 30.84))
    Your answer: 10. The ratio (computed): 30.84. Not this time: 68% off, over the 5% counted as right.
    >>> print(ratio_text(None, 30.84))
    No answer written yet. The ratio (computed): 30.84.
    """
    said = f"{what[:1].upper()}{what[1:]} (computed): {actual:.2f}"
    if my_ratio is None:
        return f"No answer written yet. {said}."
    if isinstance(my_ratio, bool) or not isinstance(my_ratio, (int, float)):
        raise InputError("my_ratio", f"my_ratio must be a number, such as 12, not {my_ratio!r}.")
    off = abs(my_ratio - actual) / actual
    verdict = f"Right: within {tolerance:.0%} of it." if off <= tolerance else \
        f"Not this time: {off:.0%} off, over the {tolerance:.0%} counted as right."
    return f"Your answer: {my_ratio}. {said}. {verdict}"


# -- the exercise: a hidden culprit ------------------------------------------------------------
def toy_model(device: str = "meta"):
    """A small text classifier (rows of 64 tokens, 4 blocks of width 256) with one outsized layer buried in its
    third block, for :func:`kit.scenarios.custom_head.scenario.find_culprit` to catch: a token-mixing Linear
    over the flattened 64 x 256 row (16,384 wide) where one over the 64 positions was meant. It holds 99% of
    the parameters; the next module, the embedding, under 1%.

    >>> sum(p.numel() for p in toy_model().parameters()) > 100_000_000
    True
    """
    import torch
    from torch import nn

    def block(width, hidden):
        return nn.Sequential(nn.LayerNorm(width, device=device), nn.Linear(width, hidden, device=device), nn.GELU(),
                             nn.Linear(hidden, width, device=device))

    with torch.device(device):
        blocks = nn.ModuleList([block(256, 1024) for _ in range(4)])
        # the hidden culprit: mixing the 64 positions over the flattened row, (64 * 256)^2 weights, not 64^2
        blocks[2] = nn.Sequential(nn.Flatten(1), nn.Linear(64 * 256, 64 * 256), nn.Unflatten(1, (64, 256)))
        return nn.ModuleDict({"embed": nn.Embedding(8000, 256), "blocks": blocks, "classify": nn.Linear(256, 4)})


def culprit_check(my_culprit, model) -> str:
    """Whether ``my_culprit`` names the module with the most trainable parameters of ``model`` (its own, not its
    children's: as :func:`~kit.scenarios.custom_head.scenario.find_culprit` ranks them).

    >>> culprit_check("blocks.2.1", toy_model())
    'Right: blocks.2.1 holds 268,451,840 of 272,079,108 trainable parameters (99%).'
    >>> culprit_check("embed", toy_model())
    'Not this one: embed holds 2,048,000 of 272,079,108 trainable parameters (1%). Look at the top line again.'
    """
    own = {n: sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad) for n, m in model.named_modules()}
    total, top = sum(own.values()), max(own, key=own.get)
    if my_culprit is None:
        return "No answer written (my_culprit is None): run find_culprit above and copy the top module's name."
    if my_culprit not in own:
        return f"{my_culprit!r} is not a module of this model: copy a name exactly as find_culprit prints it."
    share = f"{own[my_culprit]:,} of {total:,} trainable parameters ({own[my_culprit] / total:.0%})"
    return f"Right: {my_culprit} holds {share}." if my_culprit == top else \
        f"Not this one: {my_culprit} holds {share}. Look at the top line again."


# -- the panel exercise: the smallest GPU that holds fix (c) ------------------------------------------------------
SIXTEEN_BIT_HEAD = "vxv-16bit"   # fix (c) on the panel's head control (kit.scenarios.custom_head.panel_head)


def gpu_verdicts(panel) -> list[tuple[str, object]]:
    """``(device key, the panel's verdict on it)`` for each GPU in the panel's device list, the smallest first: the
    panel itself is set to each device in turn and read, then set back (its settings stay the learner's)."""
    control = panel.controls["preset"]
    keys = [key for _, key in control.options if key in PRESETS and PRESETS[key].gpu_bytes is not None]
    chosen, out = control.value, []
    try:
        for key in sorted(keys, key=lambda k: PRESETS[k].gpu_bytes):
            control.value = key
            out.append((key, panel.verdict))
    finally:
        control.value = chosen
    return out


@wrapped
def panel_gpu_check(panel) -> str:
    """Notebook 01's panel exercise: with fix (c) as the head (the V x V head kept, in 16 bits), is the device chosen
    on ``panel`` the smallest GPU of its list on which the panel's verdict is "fits", with the
    :data:`~kit.presets.MODELLED_MARGIN` kept free (less is "TIGHT")?

    >>> from kit import panel                                             # doctest: +SKIP
    >>> p = panel(scenario=1, head="vxv-16bit", preset="a100-40")           # doctest: +SKIP
    >>> panel_gpu_check(p).startswith("Right")                              # doctest: +SKIP
    True
    """
    if panel.controls["head"].value != SIXTEEN_BIT_HEAD:
        return ("Pick fix (c) as the head first ('V×V head in 16 bits, 8-bit AdamW: fix (c)'): the question is which "
                "GPU holds the user's V×V head once it is in 16 bits.")
    chosen = panel.controls["preset"].value
    verdicts = gpu_verdicts(panel)
    smallest = next((key for key, v in verdicts if v.fits), None)
    if chosen not in dict(verdicts):
        return f"Pick a GPU in the device list: {chosen!r} is not one."
    said = dict(verdicts)[chosen]
    if smallest is None:
        return f"No GPU in the list holds fix (c): {said.text}"
    if not said.fits:
        return f"{said.text}. Try a bigger GPU."
    if chosen != smallest:
        return f"It fits {PRESETS[chosen].label}, and a smaller GPU in the list holds it too: try smaller."
    t4 = dict(verdicts).get("colab-t4")
    return (f"Right: {PRESETS[chosen].label} is the smallest GPU in the list that holds fix (c) ({said.text}). "
            + (f"On the user's T4: {t4.text}." if t4 is not None else ""))
