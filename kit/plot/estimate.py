"""Figures of an estimate: its components stacked, beside a measured peak, against the device's limit."""
from __future__ import annotations

from matplotlib.figure import Figure

from kit.plot.style import CYCLE, OKABE_ITO, UNIT_BYTES, WIDTH_IN, axis_unit, draw_limit, new_figure, unit_label
from kit.units import fmt_bytes, gib

OFF_SCALE = 2.0     # a limit over twice the highest bar is stated in text and drawn in a side panel


def limit_text(peak_bytes, limit_bytes: int | float, device_label: str | None = None, figure: str = "peak") -> str:
    """The device verdict in words, for a limit too far off a chart's scale to draw as a line. ``figure`` names
    the figure judged (``peak_bytes``). An estimate in place of ``peak_bytes`` is judged as the verdicts judge it
    (:func:`kit.presets.verdict`): its reserved figure, "reserved (modelled)", where it has one.

    >>> limit_text(2**30, 15 * 2**30, "Colab T4")
    'limit 15.00 GiB on a Colab T4: fits, peak 1.00 GiB, 93.3% to spare'
    >>> limit_text(60 * 2**30, 15 * 2**30, figure="reserved (modelled)")
    'limit 15.00 GiB: does NOT fit, reserved (modelled) 60.00 GiB is 45.00 GiB over (4.0x the limit)'
    """
    if hasattr(peak_bytes, "peak_bytes"):   # an Estimate
        held = getattr(peak_bytes, "reserved_bytes", 0)
        peak_bytes, figure = (held, "reserved (modelled)") if held else (peak_bytes.peak_bytes, figure)
    where = f" on a {device_label}" if device_label else ""
    spare = limit_bytes - peak_bytes
    if spare >= 0:
        return (f"limit {gib(limit_bytes):.2f} GiB{where}: fits, {figure} {fmt_bytes(peak_bytes)}, "
                f"{100 * spare / limit_bytes:.1f}% to spare")
    return (f"limit {gib(limit_bytes):.2f} GiB{where}: does NOT fit, {figure} {fmt_bytes(peak_bytes)} is "
            f"{fmt_bytes(-spare)} over ({peak_bytes / limit_bytes:.1f}x the limit)")


def _stack(axes, position, components: dict, scale: int = UNIT_BYTES["GiB"]) -> float:
    """The components stacked in one bar at ``position`` (zero ones left out); returns the total in units of
    ``scale``."""
    bottom = 0.0
    for i, (name, n) in enumerate(components.items()):
        if n:
            axes.bar(position, n / scale, 0.55, bottom=bottom, color=CYCLE[i % len(CYCLE)],
                     label=f"{name} ({fmt_bytes(n)})")
            bottom += n / scale
    return bottom


def _checked(components: dict) -> dict:
    if not components:
        raise ValueError("components is empty: pass a dict of name -> bytes, e.g. {'weights': 4 * GiB}")
    bad = {k: v for k, v in components.items() if not isinstance(v, (int, float)) or v < 0}
    if bad:
        raise ValueError(f"component sizes must be non-negative byte counts; got {bad}")
    return components


def _bars_and_limit(components: dict, bars: list, limit_bytes, title: str, device_label: str | None,
                    xlabels: list[str], not_run: bool = False, unit: str | None = "GiB",
                    judged=None) -> Figure:
    """The shared body: stacked estimate at x=0, ``bars`` [(label, bytes)] after it, and the limit.

    The bars set the main axis' scale. A limit within ``OFF_SCALE`` times the highest bar is a
    dashed line on it; a farther one is stated in text on the main axis, and a narrow side panel
    draws the bars against it (the first axis is always the bars' own scale). ``unit``: the main axis' unit
    (None: the one that suits its highest value, :func:`kit.plot.style.axis_unit`). ``judged``: the estimate whose
    figure the verdict judges (its reserved figure), where not the highest bar's peak.
    """
    total_bytes = sum(components.values())
    top_bytes = max([total_bytes] + [b for _, b in bars])
    far = limit_bytes is not None and limit_bytes > OFF_SCALE * max(top_bytes, 1)
    unit = axis_unit(top_bytes if far or limit_bytes is None else max(top_bytes, limit_bytes), unit)
    scale = UNIT_BYTES[unit]
    if far:
        fig = Figure(figsize=(WIDTH_IN, 4.2), layout="constrained")
        ax, side = fig.subplots(1, 2, width_ratios=[5, 1])
        ax.set_title(title)
    else:
        (fig, ax), side = new_figure(title=title), None
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    total = _stack(ax, 0, components, scale)
    ax.text(0, total, fmt_bytes(total_bytes), ha="center", va="bottom", fontsize=9)
    for j, (label, n) in enumerate(bars, 1):
        m = n / scale
        ax.bar(j, m, 0.55, color="0.35", hatch="//", edgecolor="white", label=label)
        ratio = f"\n({m / total:.2f}x the estimate)" if total else ""
        ax.text(j, m, f"{fmt_bytes(n)}{ratio}", ha="center", va="bottom", fontsize=9)
    if not_run:
        ax.text(1, total / 2 if total else 0.5, "not run", ha="center", va="center", fontsize=11, color="0.4")
    top = top_bytes / scale
    if limit_bytes is not None and not far:
        draw_limit(ax, limit_bytes, "limit" if not device_label else f"{device_label}: limit", unit)
        top = max(top, limit_bytes / scale)
    if limit_bytes is not None:
        said = limit_text(top_bytes if judged is None else judged, limit_bytes, device_label)
        ax.text(0.98, 0.03, said.replace(": ", ":\n", 1),
                transform=ax.transAxes, ha="right",
                va="bottom", fontsize=9, bbox=dict(boxstyle="round", facecolor="white", edgecolor="0.7"))
    ax.set_xticks(range(len(xlabels)), xlabels)
    ax.set_xlim(-0.6, 2.6)          # room on the right for the legend and the verdict
    ax.set_ylim(0, top * 1.3 or 1.0)  # the bars' own scale (with the limit only when it is near)
    ax.set_ylabel(unit_label(unit))
    ax.legend(loc="upper right", fontsize=8)
    if far:
        _side(side, [("est.", total_bytes)] + [("meas.", n) for _, n in bars], limit_bytes, device_label)
    return fig


def _side(axes, bars: list, limit_bytes: int, device_label: str | None) -> None:
    """The bars against the whole limit: slivers, which is the point; each one's share is written on it."""
    for j, (label, n) in enumerate(bars):
        axes.bar(j, gib(n), 0.6, color=OKABE_ITO["blue"] if j == 0 else "0.35")
        axes.text(j, gib(n), f"{100 * n / limit_bytes:.1f}%", ha="center", va="bottom", fontsize=8)
    axes.axhline(gib(limit_bytes), color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.5)
    axes.text(len(bars) / 2 - 0.5, gib(limit_bytes), f"{gib(limit_bytes):.2f} GiB", ha="center", va="bottom",
              fontsize=8, color=OKABE_ITO["vermillion"])
    axes.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    axes.set_xlim(-0.6, len(bars) - 0.4)
    axes.set_ylim(0, gib(limit_bytes) * 1.12)
    axes.set_xlabel(f"against the {device_label or 'limit'} (GiB)", fontsize=9)   # below: clear of the main title
    axes.tick_params(axis="y", labelsize=8)
    axes.grid(axis="y", alpha=0.3)
    axes.set_axisbelow(True)


def predicted_vs_measured(components: dict, measured_peak_bytes: int | None, limit_bytes: int | None = None,
                          title: str = "Predicted vs measured peak", measured_label: str = "measured peak",
                          device_label: str | None = None, unit: str | None = "GiB") -> Figure:
    """The estimate's components stacked in one bar, the measured peak beside it, on their own scale.

    ``components`` maps a name to bytes (e.g. weights, gradients, optimizer state,
    activations, logits). ``measured_peak_bytes=None`` draws "not run" in its place.
    ``limit_bytes`` (the device's memory, ``device_label`` its name) is a dashed line when
    it is near the bars; when it is more than ``OFF_SCALE`` times the highest bar, the
    verdict is written on the chart and a narrow side panel draws the bars against it,
    so that a small model's components stay readable. ``fig.axes[0]`` is the bars' axis; ``unit`` its unit
    (None: chosen for the figure, e.g. MiB for a tiny model).

    >>> fig = predicted_vs_measured({"weights": 2**30, "gradients": 2**30}, 2**31 + 2**28)
    >>> fig = predicted_vs_measured({"weights": 2**20}, 2**21, 15 * 2**30, device_label="Colab T4")
    >>> len(fig.axes), bool(fig.axes[0].get_ylim()[1] < 0.01)           # own scale, limit beside it
    (2, True)
    """
    bars = [] if measured_peak_bytes is None else [(measured_label, measured_peak_bytes)]
    return _bars_and_limit(_checked(components), bars, limit_bytes, title, device_label,
                           ["estimate", measured_label], not_run=measured_peak_bytes is None, unit=unit)


def breakdown(components: dict, limit_bytes: int | None = None, title: str = "ESTIMATED peak",
              device_label: str | None = None, unit: str | None = "GiB", judged=None) -> Figure:
    """An estimate alone (nothing measured): its components stacked in one bar, against the device.

    Like :func:`predicted_vs_measured` without a measured column: the limit is a line when it
    is near, else written as text with a side panel. ``judged``: the Estimate, where the verdict is to judge its
    reserved figure (as :func:`kit.presets.verdict` does), not the bar's peak.

    >>> fig = breakdown({"weights": 10 * 2**30, "optimizer state": 20 * 2**30}, 15 * 2**30, device_label="Colab T4")
    >>> print([t.get_text() for t in fig.axes[0].texts][-1])
    limit 15.00 GiB on a Colab T4:
    does NOT fit, peak 30.00 GiB is 15.00 GiB over (2.0x the limit)
    """
    return _bars_and_limit(_checked(components), [], limit_bytes, title, device_label, ["ESTIMATED peak"], unit=unit,
                           judged=judged)
