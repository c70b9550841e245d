"""Memory plots: matplotlib only, every function returns a Figure and never shows it.

Figures are built with ``matplotlib.figure.Figure``, outside pyplot: a notebook shows
a returned figure once (no duplicate from the inline backend), and nothing piles up
in pyplot's figure list. Axes are in GiB (1024**3 bytes) and say so. Colours are the
Okabe-Ito palette, safe for colour-blind readers; the width fits Colab's output.
This package never imports ``kit.measure.device``: it draws whatever it is given. Its rooms: ``style`` (the
look), ``runs`` (what was measured: stages, time, folds, sweeps), ``stages`` (a run's stages, each beside its
estimate) and ``estimate`` (an estimate,
alone or beside a measurement, against the device).

>>> fig = sweep([(1, 2**30, False), (2, 2**31, False), (4, None, True)], "batch size")
>>> fig.savefig("sweep.png")                                   # doctest: +SKIP
"""
from __future__ import annotations

from kit.plot.estimate import OFF_SCALE, breakdown, limit_text, predicted_vs_measured
from kit.plot.runs import folds, load_moment, stage_bars, sweep, timeline
from kit.plot.stages import stages_beside_estimates
from kit.plot.style import CYCLE, GIB_LABEL, OKABE_ITO, WIDTH_IN

__all__ = ["OFF_SCALE", "breakdown", "limit_text", "predicted_vs_measured", "folds", "load_moment", "stage_bars",
           "stages_beside_estimates", "sweep", "timeline", "CYCLE", "GIB_LABEL", "OKABE_ITO", "WIDTH_IN"]
