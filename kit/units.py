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


def fmt_bytes(nbytes: int | float | None, unit: str | None = None, digits: int = 2) -> str:
    """Format a byte count for people: ``fmt_bytes(5 * MiB) == '5.00 MiB'``.

    ``unit`` forces one of ``"GiB"``, ``"MiB"``, ``"KiB"`` or ``"B"`` (useful in
    tables, so a column reads in one unit). ``None`` prints ``"n/a"``, for a
    reading this runtime does not have (CUDA on a CPU machine, say).

    >>> fmt_bytes(2048, unit="KiB")
    '2.00 KiB'
    >>> fmt_bytes(None)
    'n/a'
    """
    if nbytes is None:
        return "n/a"
    if unit is None:
        unit = next((name for name, size in _UNITS if abs(nbytes) >= size), "B")
    if unit == "B":
        return f"{int(nbytes)} B"
    size = dict(_UNITS)[unit]
    return f"{nbytes / size:.{digits}f} {unit}"


def gib(nbytes: int | float) -> float:
    """Bytes as a float number of GiB, for plot axes: ``gib(GiB) == 1.0``."""
    return nbytes / GiB


WIDTH = 110  # characters: what Colab's output column shows on a laptop screen without a scroll bar


def wrap(text: str, width: int = WIDTH) -> str:
    """Fold every line of ``text`` longer than ``width`` at its spaces, continuing under its own indent + 4.

    Short lines, and so tables narrower than ``width``, pass through unchanged.

    >>> print(wrap("  note: " + "word " * 30, width=40))
      note: word word word word word word
          word word word word word word word
          word word word word word word word
          word word word word word word word
          word word word
    """
    import textwrap

    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()))
        out.extend(textwrap.wrap(line.strip(), width=width, initial_indent=indent, subsequent_indent=indent + "    ",
                                 break_long_words=True, break_on_hyphens=False))
    return "\n".join(out)


def wrapped(func):
    """Decorate a function that returns text, so that its lines fit :data:`WIDTH` (:func:`wrap`).

    >>> wrapped(lambda: "x " * 80)().count("\\n")
    1
    """
    import functools

    @functools.wraps(func)
    def inner(*args, **kwargs):
        return wrap(func(*args, **kwargs))

    return inner
