"""The fit advisor's text (:class:`kit.advise.core.Advice`): the answer first (the verdict with the one figure
judged, by name, and the limit; what the peak and reserved figures are; the biggest cause; the best change, in the
user's objects where there are some), then the other changes one line each; the details give each change's costs,
its code and the notes. Prediction only.
"""
from __future__ import annotations

from kit.advise.answer import ANSWER_LINES, SHORT_WIDTH, in_short
from kit.estimate.reserved import HOW_TO
from kit.presets import figures_said, short_label
from kit.units import WIDTH, GiB, fmt_bytes, wrap


def _f(a, n: int) -> str:
    return fmt_bytes(n, "GiB" if a.limit.limit_bytes >= GiB else None)   # one unit in a text


def _margin(a, n: int) -> str:
    return f"{_f(a, n)} to spare" if n >= 0 else f"{_f(a, -n)} short"


def _signed(a, n: int) -> str:
    return ("+" if n >= 0 else "-") + _f(a, abs(n))


def _held(a, s) -> int:
    """What of suggestion ``s`` is judged: its reserved figure, or its peak under a safety fraction."""
    return s.reserved_bytes if a.limit.safety_fraction is None and s.reserved_bytes else s.peak_bytes


def judged_name(a) -> str:
    if a.limit.safety_fraction is not None:
        return "peak (allocated)"
    if a.limit.kernels == "cpu":   # no caching allocator: the peak of the live tensors is judged
        return "peak"
    return "reserved at evaluate() (modelled)" if a.evaluates and a.eval_peak_bytes > a.peak_bytes \
        else "reserved (modelled)"


def verdict_line(a) -> str:
    """The verdict with the one figure judged, by name, and the limit (and RAM where the build does not fit)."""
    lim = a.limit
    of = _f(a, lim.limit_bytes) if lim.safety_fraction is None else \
        f"{_f(a, lim.usable_bytes)} usable ({_f(a, lim.limit_bytes)} less {lim.safety_fraction:.0%})"
    ram = "" if a.cpu_build_bytes <= lim.ram_bytes else \
        f"; CPU build {_f(a, a.cpu_build_bytes)} > {_f(a, lim.ram_bytes)} RAM"
    return (f"{'fits' if a.fits else 'DOES NOT FIT'} {short_label(lim.label)}: {_f(a, a.judged_bytes)} "
            f"{judged_name(a)} of {of} ({_margin(a, a.margin_bytes)}){ram}")


def answer(a) -> list:
    """At most :data:`~kit.advise.answer.ANSWER_LINES` lines, folded: the verdict, what the peak and reserved
    figures are, the biggest cause, and the single best change (its objects in the lines left)."""
    out = [verdict_line(a)]
    if a.limit.safety_fraction is None and a.reserved_bytes and a.limit.kernels == "cuda":
        out.append(figures_said(a.peak_bytes, "GiB" if a.limit.limit_bytes >= GiB else None))
    if a.cause:
        out.append(a.cause)
    if a.fits:
        return out + [f"no change needed; the largest batch that fits: {a.max_batch_size}, the longest sequence: "
                      f"{a.max_seq_len}"]
    if not a.suggestions:
        return out
    s = a.suggestions[0]
    head = f"{'best change' if s.fits else 'closest change (still short)'}: "
    tail = f" -> {_f(a, _held(a, s))} {judged_name(a).split(' ')[0]} ({_signed(a, s.margin_bytes)})"
    room = ANSWER_LINES - len(wrap("\n".join(out)).splitlines())   # the lines left for it, folded
    width = min(room * (WIDTH - 4) - len(head) - len(tail) - 8, SHORT_WIDTH)
    code = in_short(a.objects[0], a.classes, width) if a.objects else None
    return out + [f"{head}{code or s.cli}{tail}"]


def short_rows(a, top: int | None) -> list:
    """The changes after the best (the answer gives it), one line each: the figure judged, margin, options."""
    rows = a.suggestions[:top]
    out = [f"{'other changes that fit' if rows[1].fits else 'the next closest'}, cheapest first "
           f"({'reserved' if a.limit.safety_fraction is None else 'peak'}, margin; append to the command):"
           ] if len(rows) > 1 else []
    out += [f"  {i:>2} {_f(a, _held(a, s)):>10} {_signed(a, s.margin_bytes):>11}  {s.cli}"
            for i, s in enumerate(rows[1:], 2)]
    if not a.fits:
        out.append(f"largest batch that fits: {a.max_batch_size}; longest sequence: {a.max_seq_len}")
    return out


def details(a, top: int | None = None) -> list:
    """The full text: the verdict with both figures, each change with its costs and in the user's objects."""
    lim = a.limit
    ram = "" if a.cpu_build_bytes <= lim.ram_bytes else \
        f"; CPU build {_f(a, a.cpu_build_bytes)} does NOT fit {_f(a, lim.ram_bytes)} of RAM"
    if a.evaluates:
        ram += f"; evaluate() {_f(a, a.eval_peak_bytes)}" + (" does NOT fit" if a.eval_peak_bytes > lim.usable_bytes
                                                             else "")
    if lim.safety_fraction is None and lim.kernels == "cpu":   # no caching allocator: the peak is judged
        what = f"peak {_f(a, a.peak_bytes)} of {_f(a, lim.limit_bytes)}"
    elif lim.safety_fraction is None:
        what = (f"peak {_f(a, a.peak_bytes)} allocated, {_f(a, a.reserved_bytes)} reserved (the caching allocator "
                f"modelled, expandable_segments {'on' if a.expandable_segments else 'off'}) of "
                f"{_f(a, lim.limit_bytes)}")
    else:
        what = (f"peak {_f(a, a.peak_bytes)} of {_f(a, lim.usable_bytes)} usable ({_f(a, lim.limit_bytes)} less a "
                f"{lim.safety_fraction:.0%} safety margin)")
    out = [f"{lim.label}: {what}: {_margin(a, a.margin_bytes)}{ram}"]
    rows = a.suggestions[:top]
    if rows:
        out.append(("what makes it fit, cheapest first:" if rows[0].fits else "nothing tried fits; the closest:")
                   + f"\n  {'#':>2} {'peak':>10} {'reserved':>10} {'margin':>11}  changes (append to the command)")
    for i, s in enumerate(rows, 1):
        held = _f(a, s.reserved_bytes) if lim.safety_fraction is None else "-"
        out.append(f"  {i:>2} {_f(a, s.peak_bytes):>10} {held:>10} {_signed(a, s.margin_bytes):>11}  {s.cli}"
                   + "".join(f"\n{'':38}cost: {c}" for c in s.costs))
        if i <= len(a.objects):   # the same change in the user's own objects
            out += _in_objects(a.objects[i - 1], s.costs)
    out += [f"note: {n}" for n in a.notes]
    return out + [f"largest batch that fits: {a.max_batch_size}; longest sequence: {a.max_seq_len}"]


def _in_objects(o, costs: list) -> list:
    code = o.statements() or ["(no field of your objects changes)"]
    return [f"{'':38}{'in your objects: ' if j == 0 else '':17}{c}" for j, c in enumerate(code)] + [
        f"{'':38}not in an object: {said_once(n, costs)}" for n in o.notes]


def said_once(note: str, costs: list) -> str:
    """An objects note without the how-to its change's cost already gave (expandable_segments' variable)."""
    return note.replace(HOW_TO, "as its cost above says") if any(HOW_TO in c for c in costs) else note
