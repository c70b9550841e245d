"""Memory plots: matplotlib only, every function returns a Figure and never shows it.

Figures are built with ``matplotlib.figure.Figure``, outside pyplot: a notebook shows
a returned figure once (no duplicate from the inline backend), and nothing piles up
in pyplot's figure list. Axes are in GiB (1024**3 bytes) and say so. Colours are the
Okabe-Ito palette, safe for colour-blind readers; the width fits Colab's output.
This module never imports ``kit.device``: it draws whatever it is given.

>>> fig = sweep([(1, 2**30, False), (2, 2**31, False), (4, None, True)], "batch size")
>>> fig.savefig("sweep.png")                                   # doctest: +SKIP
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .units import fmt_bytes, gib

# Okabe & Ito (2008), "Color Universal Design".
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7"}
CYCLE = [OKABE_ITO[k] for k in ("blue", "orange", "green", "purple", "sky", "vermillion", "yellow", "black")]
WIDTH_IN = 9.0          # Colab's output column shows about 9-10 inches at 100 dpi
GIB_LABEL = "memory (GiB)"


def _fig(height: float = 4.2, title: str | None = None):
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    ax = fig.subplots()
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return fig, ax


def _short(n: int | float) -> str:
    """A bar label: three significant digits in the unit that suits it.

    >>> _short(2_372_164), _short(623_000_000), _short(1.01 * 2**30), _short(0)
    ('2.26 MiB', '594 MiB', '1.01 GiB', '0 B')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if unit != "GiB" else f"{n / size:.2f} GiB"
    return f"{n:.0f} B"


def _limit(ax, limit_bytes, label="limit"):
    if limit_bytes is not None:
        ax.axhline(gib(limit_bytes), color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.5,
                   label=f"{label} {gib(limit_bytes):.2f} GiB")


def _records(obj):
    records = getattr(obj, "records", obj)
    done = [r for r in records if getattr(r, "end", None) is not None]
    if not done:
        raise ValueError("nothing to draw: no finished stage (use `with tracker.stage(name): ...` first)")
    return done


def _labels(records) -> list[str]:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.name] = counts.get(r.name, 0) + 1
    return [r.name if counts[r.name] == 1 else f"{r.name} #{r.index + 1}" for r in records]


def _grouped(ax, names, series, width=0.8):
    """Grouped bars; ``series`` is [(label, colour, [bytes or None per group])]. None is a reading
    that was not taken: written "not read" where its bar would stand, never drawn as 0."""
    n = len(series)
    w = width / n
    for i, (label, colour, vals) in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * w for j, v in enumerate(vals) if v is not None]
        hs = [gib(v) for v in vals if v is not None]
        bars = ax.bar(xs, hs, w, label=label, color=colour)
        ax.bar_label(bars, labels=[_short(v) for v in vals if v is not None], fontsize=7, padding=1)
        for j, v in enumerate(vals):
            if v is None:
                ax.text(j + (i - (n - 1) / 2) * w, 0, "not read", rotation=90, ha="center", va="bottom",
                        fontsize=6, color=colour)
    ax.set_xticks(range(len(names)), names, rotation=20 if len(names) > 4 else 0, ha="right" if len(names) > 4 else "center")


def stage_bars(tracker_or_records, title: str = "Memory per stage") -> Figure:
    """Bars per stage. GPU: allocated, reserved, peak allocated, RSS. CPU: live tensors, RSS, peak RSS.

    Values at the end of each stage, peaks inside it.

    >>> fig = stage_bars(tracker)                                 # doctest: +SKIP
    """
    recs = _records(tracker_or_records)
    if recs[0].end.cuda_allocated_bytes is not None:
        series = [("CUDA allocated (end)", OKABE_ITO["blue"], [r.end.cuda_allocated_bytes for r in recs]),
                  ("CUDA reserved (end)", OKABE_ITO["sky"], [r.end.cuda_reserved_bytes for r in recs]),
                  ("CUDA peak allocated", OKABE_ITO["vermillion"], [r.cuda_peak_bytes for r in recs]),
                  ("process RSS (end)", OKABE_ITO["orange"], [r.end.rss_bytes for r in recs])]
    else:
        series = [("live CPU tensors (end)", OKABE_ITO["blue"], [r.end.live("cpu") for r in recs]),
                  ("process RSS (end)", OKABE_ITO["orange"], [r.end.rss_bytes for r in recs]),
                  ("peak RSS in stage", OKABE_ITO["vermillion"], [r.rss_peak_bytes for r in recs])]
    fig, ax = _fig(title=title)
    _grouped(ax, _labels(recs), series)
    ax.set_ylabel(GIB_LABEL)
    ax.legend(loc="upper left", fontsize=8, ncols=2)
    ax.margins(y=0.15)
    return fig


def timeline(tracker, title: str = "Memory over time") -> Figure:
    """Every reading (stage boundaries and training-step samples) against time, stages shaded.

    GPU: CUDA allocated, reserved and RSS. CPU: live CPU tensors (where the gc walk ran) and RSS.

    >>> fig = timeline(tracker)                                   # doctest: +SKIP
    """
    recs = list(getattr(tracker, "records", []))
    samples = list(getattr(tracker, "samples", []))
    points = [(s, True) for r in recs for s in (r.start, r.end) if s is not None]
    points += [(s.snap, s.has_live) for s in samples]
    if not points:
        raise ValueError("nothing to draw: the tracker has no readings yet")
    points.sort(key=lambda p: p[0].time)
    t0 = points[0][0].time
    on_cuda = points[0][0].cuda_allocated_bytes is not None
    fig, ax = _fig(title=None)
    ax.set_title(title, pad=16)       # room for the stage names above the axes

    def line(label, colour, get, only_live=False, style="-"):
        xy = [(p.time - t0, gib(get(p))) for p, live in points if get(p) is not None and (live or not only_live)]
        if xy:
            ax.plot(*zip(*xy), style, color=colour, label=label, marker="o", markersize=3, linewidth=1.5)

    if on_cuda:
        line("CUDA allocated", OKABE_ITO["blue"], lambda s: s.cuda_allocated_bytes)
        line("CUDA reserved", OKABE_ITO["sky"], lambda s: s.cuda_reserved_bytes, style="--")
    else:
        line("live CPU tensors", OKABE_ITO["blue"], lambda s: s.live("cpu"), only_live=True)
    line("process RSS", OKABE_ITO["orange"], lambda s: s.rss_bytes)
    shade = [OKABE_ITO["green"], OKABE_ITO["purple"]]
    for i, (r, label) in enumerate(zip(recs, _labels(recs))):
        if r.end is None or r.depth > 0:
            continue
        a, b = r.start.time - t0, r.end.time - t0
        ax.axvspan(a, b, color=shade[i % 2], alpha=0.12, linewidth=0)
        ax.text((a + b) / 2, 1.0, label + (" (error)" if r.error else ""), transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=8, rotation=15 if len(recs) > 5 else 0, clip_on=False)
    ax.set_xlabel("time since the first reading (s)")
    ax.set_ylabel(GIB_LABEL)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    return fig


OFF_SCALE = 2.0     # a limit over twice the highest bar is stated in text and drawn in a side panel


def limit_text(peak_bytes: int | float, limit_bytes: int | float, device_label: str | None = None) -> str:
    """The device verdict in words, for a limit too far off a chart's scale to draw as a line.

    >>> limit_text(2**30, 15 * 2**30, "Colab T4")
    'limit 15.00 GiB on a Colab T4: fits, 93.3% to spare'
    >>> limit_text(60 * 2**30, 15 * 2**30)
    'limit 15.00 GiB: does NOT fit, 45.00 GiB over (4.0x the limit)'
    """
    where = f" on a {device_label}" if device_label else ""
    spare = limit_bytes - peak_bytes
    if spare >= 0:
        return f"limit {gib(limit_bytes):.2f} GiB{where}: fits, {100 * spare / limit_bytes:.1f}% to spare"
    return (f"limit {gib(limit_bytes):.2f} GiB{where}: does NOT fit, {fmt_bytes(-spare)} over "
            f"({peak_bytes / limit_bytes:.1f}x the limit)")


def _stack(ax, x, components: dict) -> float:
    """The components stacked in one bar at ``x`` (zero ones left out); returns the total in GiB."""
    bottom = 0.0
    for i, (name, n) in enumerate(components.items()):
        if n:
            ax.bar(x, gib(n), 0.55, bottom=bottom, color=CYCLE[i % len(CYCLE)], label=f"{name} ({fmt_bytes(n)})")
            bottom += gib(n)
    return bottom


def _checked(components: dict) -> dict:
    if not components:
        raise ValueError("components is empty: pass a dict of name -> bytes, e.g. {'weights': 4 * GiB}")
    bad = {k: v for k, v in components.items() if not isinstance(v, (int, float)) or v < 0}
    if bad:
        raise ValueError(f"component sizes must be non-negative byte counts; got {bad}")
    return components


def _bars_and_limit(components: dict, bars: list, limit_bytes, title: str, device_label: str | None,
                    xlabels: list[str], not_run: bool = False) -> Figure:
    """The shared body: stacked estimate at x=0, ``bars`` [(label, bytes)] after it, and the limit.

    The bars set the main axis' scale. A limit within ``OFF_SCALE`` times the highest bar is a
    dashed line on it; a farther one is stated in text on the main axis, and a narrow side panel
    draws the bars against it (the first axis is always the bars' own scale).
    """
    total_bytes = sum(components.values())
    top_bytes = max([total_bytes] + [b for _, b in bars])
    far = limit_bytes is not None and limit_bytes > OFF_SCALE * max(top_bytes, 1)
    if far:
        fig = Figure(figsize=(WIDTH_IN, 4.2), layout="constrained")
        ax, side = fig.subplots(1, 2, width_ratios=[5, 1])
        ax.set_title(title)
    else:
        (fig, ax), side = _fig(title=title), None
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    total = _stack(ax, 0, components)
    ax.text(0, total, fmt_bytes(total_bytes), ha="center", va="bottom", fontsize=9)
    for j, (label, n) in enumerate(bars, 1):
        m = gib(n)
        ax.bar(j, m, 0.55, color="0.35", hatch="//", edgecolor="white", label=label)
        ratio = f"\n({m / total:.2f}x the estimate)" if total else ""
        ax.text(j, m, f"{fmt_bytes(n)}{ratio}", ha="center", va="bottom", fontsize=9)
    if not_run:
        ax.text(1, total / 2 if total else 0.5, "not run", ha="center", va="center", fontsize=11, color="0.4")
    top = gib(top_bytes)
    if limit_bytes is not None and not far:
        _limit(ax, limit_bytes, "limit" if not device_label else f"{device_label}: limit")
        top = max(top, gib(limit_bytes))
    if limit_bytes is not None:
        ax.text(0.98, 0.03, limit_text(top_bytes, limit_bytes, device_label).replace(": ", ":\n", 1),
                transform=ax.transAxes, ha="right",
                va="bottom", fontsize=9, bbox=dict(boxstyle="round", facecolor="white", edgecolor="0.7"))
    ax.set_xticks(range(len(xlabels)), xlabels)
    ax.set_xlim(-0.6, 2.6)          # room on the right for the legend and the verdict
    ax.set_ylim(0, top * 1.3 or 1.0)  # the bars' own scale (with the limit only when it is near)
    ax.set_ylabel(GIB_LABEL)
    ax.legend(loc="upper right", fontsize=8)
    if far:
        _side(side, [("est.", total_bytes)] + [("meas.", n) for _, n in bars], limit_bytes, device_label)
    return fig


def _side(ax, bars: list, limit_bytes: int, device_label: str | None) -> None:
    """The bars against the whole limit: slivers, which is the point; each one's share is written on it."""
    for j, (label, n) in enumerate(bars):
        ax.bar(j, gib(n), 0.6, color=OKABE_ITO["blue"] if j == 0 else "0.35")
        ax.text(j, gib(n), f"{100 * n / limit_bytes:.1f}%", ha="center", va="bottom", fontsize=8)
    ax.axhline(gib(limit_bytes), color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.5)
    ax.text(len(bars) / 2 - 0.5, gib(limit_bytes), f"{gib(limit_bytes):.2f} GiB", ha="center", va="bottom",
            fontsize=8, color=OKABE_ITO["vermillion"])
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_ylim(0, gib(limit_bytes) * 1.12)
    ax.set_title(f"against the {device_label or 'limit'}", fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def predicted_vs_measured(components: dict, measured_peak_bytes: int | None, limit_bytes: int | None = None,
                          title: str = "Predicted vs measured peak", measured_label: str = "measured peak",
                          device_label: str | None = None) -> Figure:
    """The estimate's components stacked in one bar, the measured peak beside it, on their own scale.

    ``components`` maps a name to bytes (e.g. weights, gradients, optimizer state,
    activations, logits). ``measured_peak_bytes=None`` draws "not run" in its place.
    ``limit_bytes`` (the device's memory, ``device_label`` its name) is a dashed line when
    it is near the bars; when it is more than ``OFF_SCALE`` times the highest bar, the
    verdict is written on the chart and a narrow side panel draws the bars against it,
    so that a small model's components stay readable. ``fig.axes[0]`` is the bars' axis.

    >>> fig = predicted_vs_measured({"weights": 2**30, "gradients": 2**30}, 2**31 + 2**28)
    >>> fig = predicted_vs_measured({"weights": 2**20}, 2**21, 15 * 2**30, device_label="Colab T4")
    >>> len(fig.axes), bool(fig.axes[0].get_ylim()[1] < 0.01)           # own scale, limit beside it
    (2, True)
    """
    bars = [] if measured_peak_bytes is None else [(measured_label, measured_peak_bytes)]
    return _bars_and_limit(_checked(components), bars, limit_bytes, title, device_label,
                           ["estimate", measured_label], not_run=measured_peak_bytes is None)


def breakdown(components: dict, limit_bytes: int | None = None, title: str = "ESTIMATED peak",
              device_label: str | None = None) -> Figure:
    """An estimate alone (nothing measured): its components stacked in one bar, against the device.

    Like :func:`predicted_vs_measured` without a measured column: the limit is a line when it
    is near, else written as text with a side panel.

    >>> fig = breakdown({"weights": 10 * 2**30, "optimizer state": 20 * 2**30}, 15 * 2**30, device_label="Colab T4")
    >>> print([t.get_text() for t in fig.axes[0].texts][-1])
    limit 15.00 GiB on a Colab T4:
    does NOT fit, 15.00 GiB over (2.0x the limit)
    """
    return _bars_and_limit(_checked(components), [], limit_bytes, title, device_label, ["ESTIMATED peak"])


def folds(fold_records: list, baseline_bytes: int | None = None, limit_bytes: int | None = None,
          title: str = "Memory per fold") -> Figure:
    """Start, peak and end memory per fold, with the baseline (before fold 1) drawn.

    Each fold is a dict with ``start_bytes``, ``peak_bytes``, ``end_bytes`` (None where
    unknown), and optionally ``oom`` (True marks the fold) and ``label``.

    >>> fig = folds([{"start_bytes": 2**30, "peak_bytes": 2**31, "end_bytes": 2**30}], baseline_bytes=2**30)
    """
    if not fold_records:
        raise ValueError("fold_records is empty: pass one dict per fold with start_bytes/peak_bytes/end_bytes")
    for i, f in enumerate(fold_records):
        missing = {"start_bytes", "peak_bytes", "end_bytes"} - set(f)
        if missing:
            raise ValueError(f"fold {i + 1} lacks {sorted(missing)}; each fold needs start_bytes, peak_bytes, end_bytes")
    names = [f.get("label") or f"fold {i + 1}" for i, f in enumerate(fold_records)]
    series = [("start", OKABE_ITO["sky"], [f["start_bytes"] for f in fold_records]),
              ("peak", OKABE_ITO["vermillion"], [f["peak_bytes"] for f in fold_records]),
              ("end", OKABE_ITO["blue"], [f["end_bytes"] for f in fold_records])]
    fig, ax = _fig(title=title)
    _grouped(ax, names, series)
    if baseline_bytes is not None:
        ax.axhline(gib(baseline_bytes), color=OKABE_ITO["black"], linestyle=":", linewidth=1.5,
                   label=f"baseline {fmt_bytes(baseline_bytes)}")
    _limit(ax, limit_bytes)
    for j, f in enumerate(fold_records):
        if f.get("oom"):
            ax.text(j, 0.5, "OOM", transform=ax.get_xaxis_transform(), ha="center", va="center",
                    color=OKABE_ITO["vermillion"], fontsize=12, weight="bold")
    ax.set_xlim(-0.6, len(fold_records) - 0.4)
    ax.set_ylabel(GIB_LABEL)
    ax.margins(y=0.25)              # room for the legend above the bars
    ax.legend(loc="upper left", fontsize=8, ncols=5)
    return fig


def sweep(points: list, xlabel: str, limit_bytes: int | None = None, title: str | None = None,
          ylabel: str = "peak memory (GiB)") -> Figure:
    """Peak memory against a size (batch size, sequence length), OOM points marked with an X.

    ``points`` holds ``(size, peak_bytes or None, oom)`` tuples, e.g. from
    ``oom.largest_batch_size(...).points``. OOM points sit on the limit line when
    one is given, else just above the highest measured peak.

    >>> fig = sweep([(8, 2**30, False), (16, None, True)], "batch size", limit_bytes=2**31)
    """
    if not points:
        raise ValueError("points is empty: pass (size, peak_bytes or None, oom) tuples")
    if "GiB" not in ylabel:
        raise ValueError(f"ylabel must state the unit, GiB: {ylabel!r}")
    pts = sorted((tuple(p)[:3] for p in points), key=lambda p: p[0])
    ok = [(s, gib(b)) for s, b, oom in pts if not oom and b is not None]
    failed = [s for s, _, oom in pts if oom]
    fig, ax = _fig(title=title or f"Peak memory against {xlabel}")
    if ok:
        ax.plot(*zip(*ok), "-o", color=OKABE_ITO["blue"], label="fits (measured peak)")
    top = max([y for _, y in ok] + [0])
    y_oom = gib(limit_bytes) if limit_bytes is not None else (top * 1.1 or 1.0)
    if failed:
        ax.plot(failed, [y_oom] * len(failed), "X", color=OKABE_ITO["vermillion"], markersize=11,
                linestyle="none", label="out of memory")
        for s in failed:
            ax.annotate("OOM", (s, y_oom), textcoords="offset points", xytext=(0, 8), ha="center",
                        color=OKABE_ITO["vermillion"], fontsize=8)
    _limit(ax, limit_bytes)
    sizes = [p[0] for p in pts]
    if len(sizes) > 2 and min(sizes) > 0 and max(sizes) / min(sizes) >= 16:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0, top=max(y_oom, top) * 1.2 or 1.0)
    ax.legend(loc="upper left", fontsize=8)
    return fig
