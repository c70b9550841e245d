"""Bytes and their one formatter.

Every byte count in the kit is an ``int`` named ``*_bytes``. This module is the
only place that turns one into text, so every label means the same thing:
GiB is 1024**3 bytes, MiB is 1024**2.

>>> fmt_bytes(3 * GiB // 2)
'1.50 GiB'
"""
from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNITS = (("GiB", GiB), ("MiB", MiB), ("KiB", KiB))


def fmt_bytes(n: int | float | None, unit: str | None = None, digits: int = 2) -> str:
    """Format a byte count for people: ``fmt_bytes(5 * MiB) == '5.00 MiB'``.

    ``unit`` forces one of ``"GiB"``, ``"MiB"``, ``"KiB"`` or ``"B"`` (useful in
    tables, so a column reads in one unit). ``None`` prints ``"n/a"``, for a
    reading this runtime does not have (CUDA on a CPU machine, say).

    >>> fmt_bytes(2048, unit="KiB")
    '2.00 KiB'
    >>> fmt_bytes(None)
    'n/a'
    """
    if n is None:
        return "n/a"
    if unit is None:
        unit = next((name for name, size in _UNITS if abs(n) >= size), "B")
    if unit == "B":
        return f"{int(n)} B"
    size = dict(_UNITS)[unit]
    return f"{n / size:.{digits}f} {unit}"


def gib(n: int | float) -> float:
    """Bytes as a float number of GiB, for plot axes: ``gib(GiB) == 1.0``."""
    return n / GiB
