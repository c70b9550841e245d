"""The look every kit figure shares: the Okabe-Ito palette, the width that fits Colab, GiB axes."""
from __future__ import annotations

from matplotlib.figure import Figure

from kit.units import GiB, KiB, MiB, fmt_bytes

# Okabe & Ito (2008), "Color Universal Design".
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7"}
CYCLE = [OKABE_ITO[k] for k in ("blue", "orange", "green", "purple", "sky", "vermillion", "yellow", "black")]
WIDTH_IN = 9.0          # Colab's output column shows about 9-10 inches at 100 dpi
GIB_LABEL = "memory (GiB)"
UNIT_BYTES = {"GiB": GiB, "MiB": MiB, "KiB": KiB, "B": 1}


def axis_unit(top_bytes: int | float, unit: str | None = None) -> str:
    """The unit a figure's memory axis reads in: ``unit`` when given, else the one :func:`kit.units.fmt_bytes`
    picks for the axis' highest value, so that a 20 MiB bar is drawn on a MiB axis, not as 0.02 GiB.

    >>> axis_unit(20 * MiB), axis_unit(52 * GiB), axis_unit(3 * GiB, "GiB"), axis_unit(0)
    ('MiB', 'GiB', 'GiB', 'B')
    """
    if unit is not None:
        if unit not in UNIT_BYTES:
            raise ValueError(f"unit must be one of {sorted(UNIT_BYTES)} or None (chosen per figure), not {unit!r}")
        return unit
    return fmt_bytes(top_bytes).split()[-1]


def unit_label(unit: str) -> str:
    """The memory axis' label in ``unit``: ``unit_label("GiB") == GIB_LABEL``."""
    return f"memory ({unit})"


def new_figure(height: float = 4.2, title: str | None = None):
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    ax = fig.subplots()
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return fig, ax


def short_label(value: int | float) -> str:
    """A bar label: three significant digits in the unit that suits it.

    >>> short_label(2_372_164), short_label(623_000_000), short_label(1.01 * 2**30), short_label(0)
    ('2.26 MiB', '594 MiB', '1.01 GiB', '0 B')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.3g} {unit}" if unit != "GiB" else f"{value / size:.2f} GiB"
    return f"{value:.0f} B"


def draw_limit(axes, limit_bytes, label="limit", unit: str = "GiB"):
    if limit_bytes is not None:
        axes.axhline(limit_bytes / UNIT_BYTES[unit], color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.5,
                     label=f"{label} {fmt_bytes(limit_bytes, unit)}")
