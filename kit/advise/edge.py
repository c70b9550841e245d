"""The largest batch or sequence that fits: a search on a non-decreasing peak (:func:`largest_fitting`), and on
the figure the fit advisor judges, the reserved one (:func:`largest_judged`, and :func:`largest_replayed`, which
runs the allocator's model about once).
"""
from __future__ import annotations


def largest_judged(estimate_of, lim, low: int, high: int, known: int | None = None, evaluates: bool = False) -> int:
    """:func:`largest_fitting` on what ``lim`` judges (``lim.judged``: the reserved figure) of ``estimate_of(x)``
    (an Estimate, or None where the estimator refuses x). A probe whose allocated peak fails already is judged
    without the allocator's model (the reserved figure is never below it): the model runs for the probes under
    the limit only."""
    def held(value):
        e = estimate_of(value)
        return float("inf") if e is None else lim.judged(e, evaluates, exact=False)

    return largest_fitting(held, low, high, lim.usable_bytes, known)


def largest_replayed(estimate_of, lim, low: int, high: int, known: int | None = None, evaluates: bool = False,
                     tries: int = 6) -> int:
    """:func:`largest_judged` with the allocator's model run near the answer, not at every probe. The largest x by
    its allocated peak comes first (no allocator model: the reserved figure is never below it, so nothing above
    it fits); then, in turn, the largest x whose allocated peak plus the last modelled gap fits is modelled, until
    the x that fits and the one above that does not are both known. One replay where the gap leaves the answer
    alone, two or three where it moves it (from the second replay on, the gap at x is drawn through the two modelled
    nearest x: :func:`gap_near`); after ``tries``, :func:`largest_judged` on what is left.

    >>> class Lim:   # a reserved figure 10 over the peak, judged against 100
    ...     usable_bytes = 100
    ...     def judged(self, e, evaluates=False, exact=True): return e.peak_bytes + 10
    >>> from types import SimpleNamespace as Est
    >>> largest_replayed(lambda x: Est(peak_bytes=7 * x, eval_peak_bytes=0), Lim(), 1, 1000)
    12
    """
    usable = lim.usable_bytes

    def allocated(value):
        e = estimate_of(value)
        return float("inf") if e is None else max(e.peak_bytes, e.eval_peak_bytes if evaluates else 0)

    fits_below, top = low - 1, largest_fitting(allocated, low, high, usable, known)   # x <= fits_below fit; > top fail
    n, gaps = top, {}   # the modelled x -> its reserved figure's gap over the allocated peak
    for _ in range(tries):
        if fits_below >= top:
            return fits_below
        judged = lim.judged(estimate_of(n), evaluates)        # the allocator's model, at n
        if judged <= usable:
            fits_below = n
        else:
            top = n - 1
        gaps[n] = judged - allocated(n)
        n = largest_fitting(lambda value: allocated(value) + gap_near(gaps, value), fits_below + 1, top, usable) \
            if fits_below < top else n
        n = max(n, fits_below + 1)               # none by that gap: the next one up, modelled
    if fits_below >= top:
        return fits_below
    return largest_judged(estimate_of, lim, fits_below + 1, top, evaluates=evaluates)


def gap_near(gaps: dict, value: int) -> float:
    """The reserved figure's gap over the allocated peak at ``value``, from the gaps modelled so far: the one
    modelled gap, or the line through the two modelled nearest ``value`` (the gap grows with the batch as blocks
    round up and split, so one gap carried far over- or undershoots and costs a replay per step).

    >>> gap_near({10: 5}, 99), gap_near({10: 100, 20: 200, 90: 0}, 15)
    (5, 150.0)
    """
    if len(gaps) == 1:
        return next(iter(gaps.values()))
    (a, gap_a), (b, gap_b) = sorted(gaps.items(), key=lambda point: abs(point[0] - value))[:2]
    return gap_a + (gap_b - gap_a) * (value - a) / (b - a)


def largest_fitting(peak, low: int, high: int, limit: int, known: int | None = None) -> int:
    """The largest x in [lo, hi] with ``peak(x) <= limit`` (``peak`` non-decreasing), or ``lo - 1``.

    Peaks are piecewise linear in batch and sequence (quadratic with eager attention), so it interpolates
    between the bracketing points, halving the weight of an end kept twice (regula falsi, Illinois): about
    two estimates after the ends on a linear piece. ``known``: a point whose peak is known (cached), which
    replaces one end.

    >>> largest_fitting(lambda x: 10 * x + 5, 1, 1000, 4321), largest_fitting(lambda x: x * x, 1, 10**6, 2e6)
    (431, 1414)
    """
    fat = peak(known) - limit if known is not None and low < known < high else None
    if fat is not None and fat <= 0:
        low, fa = known, fat
    else:
        high, fb = (known, fat) if fat is not None else (high, None)
        fa = peak(low) - limit
        if fa > 0:
            return low - 1
    if fat is None or fat <= 0:
        fb = (peak(high) if high > low else fa + limit) - limit
        if fb <= 0:
            return high
    side = steps = 0
    while high - low > 1:
        steps += 1   # interpolate 8 times at most, then bisect: at most 8 + log2(hi - lo) estimates
        x = low + int((high - low) * -fa / (fb - fa)) if fb != float("inf") and steps <= 8 else (low + high) // 2
        x = min(max(x, low + 1), high - 1)
        fx = peak(x) - limit
        if fx <= 0:
            low, fa, fb, side = x, fx, fb / 2 if side == -1 else fb, -1
        else:
            high, fb, fa, side = x, fx, fa / 2 if side == 1 else fa, 1
    return low
