"""Figures of what was measured: stages, readings over time, folds and sweeps."""
from __future__ import annotations

from matplotlib.figure import Figure

from kit.plot.style import (GIB_LABEL, OKABE_ITO, UNIT_BYTES, WIDTH_IN, axis_unit, draw_limit, new_figure, short_label,
                            unit_label)
from kit.units import fmt_bytes, gib


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


def _grouped(axes, names, series, width=0.8):
    """Grouped bars; ``series`` is [(label, colour, [bytes or None per group])]. None is a reading
    that was not taken: written "not read" where its bar would stand, never drawn as 0."""
    n = len(series)
    w = width / n
    for i, (label, colour, vals) in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * w for j, v in enumerate(vals) if v is not None]
        hs = [gib(v) for v in vals if v is not None]
        bars = axes.bar(xs, hs, w, label=label, color=colour)
        axes.bar_label(bars, labels=[short_label(v) for v in vals if v is not None], fontsize=7, padding=1)
        for j, v in enumerate(vals):
            if v is None:
                axes.text(j + (i - (n - 1) / 2) * w, 0, "not read", rotation=90, ha="center", va="bottom",
                          fontsize=6, color=colour)
    axes.set_xticks(range(len(names)), names, rotation=20 if len(names) > 4 else 0,
                    ha="right" if len(names) > 4 else "center")


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
    fig, ax = new_figure(title=title)
    _grouped(ax, _labels(recs), series)
    ax.set_ylabel(GIB_LABEL)
    ax.legend(loc="upper left", fontsize=8, ncols=2)
    ax.margins(y=0.15)
    return fig


def timeline(tracker, title: str = "Memory over time", unit: str | None = "GiB") -> Figure:
    """Every reading (stage boundaries and training-step samples) against time, stages shaded.

    GPU: CUDA allocated, reserved and RSS. CPU: live CPU tensors (where the gc walk ran) and RSS.
    ``unit``: the axis' unit (None: the one that suits the highest reading drawn).

    >>> fig = timeline(tracker)                                   # doctest: +SKIP
    """
    recs = list(getattr(tracker, "records", []))
    samples = list(getattr(tracker, "samples", []))
    points = [(s, True) for r in recs for s in (r.start, r.end) if s is not None]
    points += [(s.snap, s.has_live) for s in samples]
    if not points:
        raise ValueError("nothing to draw: the tracker has no readings yet")
    points.sort(key=lambda point: point[0].time)
    t0 = points[0][0].time
    on_cuda = points[0][0].cuda_allocated_bytes is not None
    fig, ax = new_figure(title=None)
    ax.set_title(title, pad=16)       # room for the stage names above the axes
    drawn = [v for p, _ in points for v in (p.cuda_allocated_bytes, p.cuda_reserved_bytes, p.rss_bytes,
                                           p.live("cpu")) if v is not None]
    unit = axis_unit(max(drawn, default=0), unit)
    scale = UNIT_BYTES[unit]

    def line(label, colour, get, only_live=False, style="-"):
        xy = [(p.time - t0, get(p) / scale) for p, live in points if get(p) is not None and (live or not only_live)]
        if xy:
            ax.plot(*zip(*xy), style, color=colour, label=label, marker="o", markersize=3, linewidth=1.5)

    if on_cuda:
        line("CUDA allocated", OKABE_ITO["blue"], lambda sample: sample.cuda_allocated_bytes)
        line("CUDA reserved", OKABE_ITO["sky"], lambda sample: sample.cuda_reserved_bytes, style="--")
    else:
        line("live CPU tensors", OKABE_ITO["blue"], lambda sample: sample.live("cpu"), only_live=True)
    line("process RSS", OKABE_ITO["orange"], lambda sample: sample.rss_bytes)
    shade = [OKABE_ITO["green"], OKABE_ITO["purple"]]
    for i, (r, label) in enumerate(zip(recs, _labels(recs))):
        if r.end is None or r.depth > 0:
            continue
        a, b = r.start.time - t0, r.end.time - t0
        ax.axvspan(a, b, color=shade[i % 2], alpha=0.12, linewidth=0)
        ax.text((a + b) / 2, 1.0, label + (" (error)" if r.error else ""), transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=8, rotation=15 if len(recs) > 5 else 0, clip_on=False)
    ax.set_xlabel("time since the first reading (s)")
    ax.set_ylabel(unit_label(unit))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def folds(fold_records: list, baseline_bytes: int | None = None, limit_bytes: int | None = None,
          title: str = "Memory per fold", unit: str | None = None) -> Figure:
    """Start, peak and end memory per fold, with the baseline (before fold 1) drawn.

    Each fold is a dict with ``start_bytes``, ``peak_bytes``, ``end_bytes`` (None where
    unknown), and optionally ``oom`` (True marks the fold) and ``label``. Folds with
    ``load_peak_bytes`` and ``train_peak_bytes`` (the user's loop) show both peaks apart.
    ``unit``: the axis' unit; None picks the one that suits the highest value drawn (the limit included), so the
    bars, their labels and the axis read in one unit. The legend sits below the axes, clear of the title.

    >>> fig = folds([{"start_bytes": 2**30, "peak_bytes": 2**31, "end_bytes": 2**30}], baseline_bytes=2**30)
    >>> small = folds([{"start_bytes": 2**20, "peak_bytes": 2**24, "end_bytes": 2**20}])
    >>> fig.axes[0].get_ylabel(), small.axes[0].get_ylabel()
    ('memory (GiB)', 'memory (MiB)')
    """
    if not fold_records:
        raise ValueError("fold_records is empty: pass one dict per fold with start_bytes/peak_bytes/end_bytes")
    for i, f in enumerate(fold_records):
        missing = {"start_bytes", "peak_bytes", "end_bytes"} - set(f)
        if missing:
            raise ValueError(f"fold {i + 1} lacks {sorted(missing)}; "
                             "each fold needs start_bytes, peak_bytes, end_bytes")
    names = [f.get("label") or f"fold {i + 1}" for i, f in enumerate(fold_records)]
    if any("load_peak_bytes" in f for f in fold_records):  # the user's loop: its load and its training apart
        series = [("before load", OKABE_ITO["sky"], [f["start_bytes"] for f in fold_records]),
                  ("peak while loading", OKABE_ITO["orange"], [f.get("load_peak_bytes") for f in fold_records]),
                  ("peak while training", OKABE_ITO["vermillion"], [f.get("train_peak_bytes") for f in fold_records]),
                  ("end", OKABE_ITO["blue"], [f["end_bytes"] for f in fold_records])]
    else:
        series = [("start", OKABE_ITO["sky"], [f["start_bytes"] for f in fold_records]),
                  ("peak", OKABE_ITO["vermillion"], [f["peak_bytes"] for f in fold_records]),
                  ("end", OKABE_ITO["blue"], [f["end_bytes"] for f in fold_records])]
    drawn = [v for _, _, vals in series for v in vals if v is not None] + [
        v for v in (baseline_bytes, limit_bytes) if v is not None]
    unit = axis_unit(max(drawn, default=0), unit)
    scale = UNIT_BYTES[unit]
    fig, ax = new_figure(title=title)
    n, w = len(series), 0.8 / len(series)
    for i, (label, colour, vals) in enumerate(series):  # grouped bars, labelled in the axis' unit
        xs = [j + (i - (n - 1) / 2) * w for j, v in enumerate(vals) if v is not None]
        bars = ax.bar(xs, [v / scale for v in vals if v is not None], w, label=label, color=colour)
        ax.bar_label(bars, labels=[fmt_bytes(v, unit if v >= scale / 100 else None) for v in vals if v is not None],
                     fontsize=7, padding=1)  # a value too small for the axis' unit keeps its own
        for j, v in enumerate(vals):
            if v is None:  # a reading not taken: said, never drawn as 0
                ax.text(j + (i - (n - 1) / 2) * w, 0, "not read", rotation=90, ha="center", va="bottom",
                        fontsize=6, color=colour)
    ax.set_xticks(range(len(names)), names, rotation=20 if len(names) > 4 else 0,
                  ha="right" if len(names) > 4 else "center")
    if baseline_bytes is not None:
        ax.axhline(baseline_bytes / scale, color=OKABE_ITO["black"], linestyle=":", linewidth=1.5,
                   label=f"baseline {fmt_bytes(baseline_bytes, unit)}")
    draw_limit(ax, limit_bytes, unit=unit)
    for j, f in enumerate(fold_records):
        if f.get("oom"):
            ax.text(j, 0.5, "OOM", transform=ax.get_xaxis_transform(), ha="center", va="center",
                    color=OKABE_ITO["vermillion"], fontsize=12, weight="bold", zorder=5,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    ax.set_xlim(-0.6, len(fold_records) - 0.4)
    ax.set_ylabel(unit_label(unit))
    ax.set_ylim(0, (max(drawn, default=0) / scale or 1.0) * 1.15)  # room for the bar labels above the highest
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2 if "\n" in "".join(names) else -0.12), fontsize=8,
              ncols=min(len(ax.get_legend_handles_labels()[1]), 6), frameon=False)  # below the axes, clear of the title
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
    pts = sorted((tuple(p)[:3] for p in points), key=lambda point: point[0])
    ok = [(s, gib(b)) for s, b, oom in pts if not oom and b is not None]
    failed = [s for s, _, oom in pts if oom]
    fig, ax = new_figure(title=title or f"Peak memory against {xlabel}")
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
    draw_limit(ax, limit_bytes)
    sizes = [p[0] for p in pts]
    if len(sizes) > 2 and min(sizes) > 0 and max(sizes) / min(sizes) >= 16:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0, top=max(y_oom, top) * 1.2 or 1.0)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def load_moment(broken: list, fixed: list, limit_bytes: int | None = None, title: str | None = None,
                unit: str | None = None) -> Figure:
    """The user's loop against the fixed one at each fold's load, at a glance: left, the models alive (the user's
    loop counts them after each load; the fixed loop's fold records carry ``models_alive``); right, the memory of
    that moment (the user's loop: the peak while loading, or, where it ran out, the highest reading before the
    error; the fixed loop: the fold's peak), against ``limit_bytes``. A fold that ran out of memory is marked with
    an X on the limit it crossed.

    >>> fig = load_moment([{"fold": 1, "load_peak_bytes": 2**20, "models_alive_after_load": 1},
    ...                    {"fold": 2, "load_peak_bytes": 2**21, "models_alive_after_load": 2, "oom": True}],
    ...                   [{"fold": 1, "peak_bytes": 2**20, "models_alive": 1}], limit_bytes=3 * 2**20)
    >>> [ax.get_title() for ax in fig.axes]
    ['models alive at the load', 'memory at the load']
    """
    if not broken and not fixed:
        raise ValueError("nothing to draw: pass the fold records of at least one loop")
    folds_n = max(len(broken), len(fixed))
    loops = [("the user's loop", OKABE_ITO["vermillion"], broken, "models_alive_after_load", _load_bytes,
              "the user's loop: its load's peak"),
             ("fixed loop", OKABE_ITO["blue"], fixed, "models_alive", lambda fold: fold.get("peak_bytes"),
              "fixed loop: its fold's peak")]
    drawn = [read(f) for _, _, recs, _, read, _ in loops for f in recs if read(f) is not None]
    unit = axis_unit(max(drawn + [limit_bytes or 0], default=0), unit)
    scale = UNIT_BYTES[unit]
    fig = Figure(figsize=(WIDTH_IN, 4.2), layout="constrained")
    count_ax, bytes_ax = fig.subplots(1, 2)
    if title:
        fig.suptitle(title)
    for i, (name, colour, recs, count_key, read, what) in enumerate(loops):
        xs = [j + (i - 0.5) * 0.4 for j in range(len(recs))]
        counts = [f.get(count_key) for f in recs]
        bars = count_ax.bar([x for x, c in zip(xs, counts) if c is not None], [c for c in counts if c is not None],
                            0.4, color=colour, label=name)
        count_ax.bar_label(bars, fontsize=8, padding=1)
        values = [read(f) for f in recs]
        bars = bytes_ax.bar([x for x, v in zip(xs, values) if v is not None],
                            [v / scale for v in values if v is not None], 0.4, color=colour, label=what)
        bytes_ax.bar_label(bars, labels=[fmt_bytes(v, unit) for v in values if v is not None], fontsize=7, padding=1)
        for x, f in zip(xs, recs):
            if f.get("oom"):   # it crossed the cap (or the device): marked there; its bar is the last reading before
                at = (limit_bytes if limit_bytes is not None else read(f) or 0) / scale
                bytes_ax.plot([x], [at], "X", color=OKABE_ITO["vermillion"], markersize=11)
                bytes_ax.annotate("out of memory", (x, at), textcoords="offset points", xytext=(0, 9), ha="center",
                                  color=OKABE_ITO["vermillion"], fontsize=9, weight="bold")
    ticks = [f"fold {j + 1}" for j in range(folds_n)]
    for ax in (count_ax, bytes_ax):
        ax.set_xticks(range(folds_n), ticks)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    count_ax.set_title("models alive at the load")
    count_ax.set_ylabel("models in memory")
    count_ax.set_ylim(0, max([f.get(k) or 0 for _, _, recs, k, _, _ in loops for f in recs] + [1]) + 1)
    bytes_ax.set_title("memory at the load")
    bytes_ax.set_ylabel(unit_label(unit))
    draw_limit(bytes_ax, limit_bytes, label="cap", unit=unit)
    bytes_ax.set_ylim(0, max(drawn + [limit_bytes or 0, 1]) / scale * 1.25)
    for ax in (count_ax, bytes_ax):   # below the axes, clear of the bars and the out-of-memory mark
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize=8, frameon=False)
    return fig


def _load_bytes(fold: dict) -> int | None:
    """The user's loop at a fold's load: the peak while loading; where the fold ran out of memory while SFTTrainer
    prepared the new model (still the load: the old trainer alive), the highest reading before the error."""
    values = [fold.get("load_peak_bytes")]
    if fold.get("oom_during") == "prepare":
        values.append(fold.get("train_peak_bytes"))
    values = [v for v in values if v is not None]
    return max(values) if values else None
