"""The live plot of a watched run: :func:`kit.plot.timeline` with the estimate's lines and the device limit
(:func:`draw_watch`, for ``kit.watch``), and each step's measured peak marked (:func:`draw_steps`, for
``kit.watch_loop``).
"""
from __future__ import annotations

from kit import trainer_kinds
from kit.measure.track import Tracker  # noqa: F401 (the doctests read with it)
from kit.plot import OKABE_ITO, timeline
from kit.plot.estimate import OFF_SCALE, limit_text
from kit.units import fmt_bytes, gib


def draw_watch(tracker, est=None, limit_bytes=None, limit_label="limit"):
    """:func:`kit.plot.timeline` with the estimate's lines and the device limit (stated in words when it is
    far above the readings). Returns a Figure.

    >>> t = Tracker(); _ = t.sample(live_tensors=False)
    >>> len(draw_watch(t, limit_bytes=2**40).axes[0].texts) >= 1
    True
    """

    fig = timeline(tracker, title="Memory while training (kit.watch)")
    ax = fig.axes[0]
    top = ax.get_ylim()[1] * 2**30
    if est is not None:
        w, g, o = est.weights_bytes, est.gradients_bytes, est.optimizer_bytes
        for label, n, colour, style in (("estimate: weights", w, "green", ":"), ("+ gradients", w + g, "purple", ":"),
                                        ("+ optimizer state", w + g + o, "black", "-."),
                                        ("predicted peak", est.peak_bytes, "black", "--")):
            ax.axhline(gib(n), color=OKABE_ITO[colour], linestyle=style, linewidth=1.2, label=f"{label} {fmt_bytes(n)}")
        gen = getattr(est, "setup", {}).get("generation_peak_bytes")
        if gen:   # a generating trainer's (GRPO's, RLOO's) generation phase, its own predicted peak
            ax.axhline(gib(gen), color=OKABE_ITO["vermillion"], linestyle=":", linewidth=1.2,
                       label=f"predicted generation peak {fmt_bytes(gen)}")
        top = max(top, est.peak_bytes)
    _shade_generation(ax, tracker, est)
    if limit_bytes:
        if limit_bytes <= OFF_SCALE * top:
            ax.axhline(gib(limit_bytes), color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.5,
                       label=f"{limit_label} {fmt_bytes(limit_bytes)}")
        else:
            ax.text(0.99, 0.97, limit_text(est.peak_bytes if est else top, limit_bytes, limit_label),
                    transform=ax.transAxes, ha="right", va="top", fontsize=8, color=OKABE_ITO["vermillion"])
    ax.legend(loc="upper left", fontsize=7, ncols=2)
    return fig


def _shade_generation(ax, tracker, est=None) -> None:
    """A generating trainer's (GRPOTrainer's, RLOOTrainer's) generation stages (:mod:`kit.watching.generation`),
    shaded apart: inside kit.train's "train" stage they are nested, which the timeline does not shade. The label
    names the trainer the estimate ``est`` was read from."""
    recs = list(getattr(tracker, "records", []))
    gens = [r for r in recs if r.name == "generation" and r.end is not None]
    if not gens:
        return
    t0 = min([r.start.time for r in recs] + [s.snap.time for s in getattr(tracker, "samples", [])])
    reader = trainer_kinds.part_of(getattr(est, "kind", None) or "", "estimate")
    label = f"generation ({reader.trainer_name})" if reader else "generation"
    for i, r in enumerate(gens):
        ax.axvspan(r.start.time - t0, r.end.time - t0, color=OKABE_ITO["vermillion"], alpha=0.18, linewidth=0,
                   label=label if i == 0 else None)


def draw_steps(tracker, steps, est=None, limit_bytes=None, limit_label="limit"):
    """:func:`draw_watch`, with each step's measured peak (``steps``: :class:`kit.watching.objects.StepPeak`) marked,
    step 1 apart from the later steps. Returns a Figure.

    >>> t = Tracker(); _ = t.sample(live_tensors=False)
    >>> len(draw_steps(t, []).axes[0].lines) >= 1
    True
    """
    fig = draw_watch(tracker, est, limit_bytes, limit_label)
    ax = fig.axes[0]
    t0 = min(s.snap.time for s in tracker.samples)
    for first, label, colour in ((True, "step 1 peak (measured)", "vermillion"),
                                 (False, "later steps' peak (measured)", "blue")):
        xy = [(s.end - t0, gib(s.peak_bytes)) for s in steps if s.first == first and s.peak_bytes is not None]
        if xy:
            ax.plot(*zip(*xy), "x", color=OKABE_ITO[colour], markersize=7, label=label)
    ax.legend(loc="upper left", fontsize=7, ncols=2)
    return fig
