"""A run's named stages, each measured bar beside its own estimate, drawn as the stages end.

A row is ``{"name", "estimate_bytes", "measured_bytes", "ran", "oom"}``: a stage not run yet shows its estimate
alone; the stage an out-of-memory error stopped is marked OOM where its measured bar would stand.

>>> rows = [{"name": "load", "estimate_bytes": 2**20, "measured_bytes": 2**20, "ran": True, "oom": False},
...         {"name": "step 1", "estimate_bytes": 3 * 2**20, "measured_bytes": None, "ran": True, "oom": True}]
>>> fig = stages_beside_estimates(rows, limit_bytes=2 * 2**20, limit_label="memory cap")
>>> [t.get_text() for t in fig.axes[0].texts if t.get_text() == "OOM"]
['OOM']
"""
from __future__ import annotations

from matplotlib.figure import Figure

from kit.plot.style import OKABE_ITO, UNIT_BYTES, axis_unit, draw_limit, new_figure, short_label, unit_label

WIDTH = 0.38   # each of the two bars of a stage


def stages_beside_estimates(rows: list[dict], limit_bytes: int | None = None, limit_label: str = "limit",
                            title: str = "Each stage beside its estimate", measured_label: str = "measured",
                            unit: str | None = None) -> Figure:
    """Grouped bars, one group per planned stage in order: the ESTIMATE (hatched) and the MEASURED value."""
    if not rows:
        raise ValueError("nothing to draw: no stage is planned")
    top = max([r["estimate_bytes"] or 0 for r in rows] + [r["measured_bytes"] or 0 for r in rows]
              + [limit_bytes or 0])
    unit = axis_unit(top, unit)
    scale = UNIT_BYTES[unit]
    fig, ax = new_figure(title=title)
    turn = 90 if len(rows) > 6 else 0     # many stages: bar labels upright, so that neighbours never overlap
    pending = "not run" if any(r["oom"] for r in rows) else "not yet"
    for i, r in enumerate(rows):
        if r["estimate_bytes"] is not None:
            bar = ax.bar(i - WIDTH / 2, r["estimate_bytes"] / scale, WIDTH, color="white", hatch="//",
                         edgecolor=OKABE_ITO["black"], label="ESTIMATE" if i == 0 else None)
            ax.bar_label(bar, labels=[short_label(r["estimate_bytes"])], fontsize=7, padding=1, rotation=turn)
        if r["oom"]:
            ax.text(i + WIDTH / 2, 0, "OOM", rotation=90, ha="center", va="bottom", fontsize=10, fontweight="bold",
                    color=OKABE_ITO["vermillion"])
        elif r["measured_bytes"] is not None:
            bar = ax.bar(i + WIDTH / 2, r["measured_bytes"] / scale, WIDTH, color=OKABE_ITO["blue"],
                         label=measured_label if not any(q["measured_bytes"] is not None for q in rows[:i]) else None)
            ax.bar_label(bar, labels=[short_label(r["measured_bytes"])], fontsize=7, padding=1, rotation=turn)
        elif not r["ran"]:
            ax.text(i + WIDTH / 2, 0, pending, rotation=90, ha="center", va="bottom", fontsize=7, color="0.5")
    draw_limit(ax, limit_bytes, limit_label, unit)
    names = [r["name"] for r in rows]
    ax.set_xticks(range(len(rows)), names, rotation=20 if len(rows) > 5 else 0,
                  ha="right" if len(rows) > 5 else "center")
    ax.set_ylabel(unit_label(unit))
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)   # below the axes: never over a bar
    ax.margins(y=0.25 if turn else 0.15)
    return fig
