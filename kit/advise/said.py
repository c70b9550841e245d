"""The fit advisor's text (:class:`kit.advise.core.Advice`): the answer first (the verdict with the one figure
judged, by name, and the limit; what the peak and reserved figures are; the biggest cause; the best change, in the
user's objects where there are some), then the other changes one line each; the details give each change's costs,
its code and the notes. Prediction only.
"""
from __future__ import annotations

from kit.advise.answer import ANSWER_LINES, SHORT_WIDTH, in_short
from kit.estimate.reserved import HOW_TO
from kit.presets import figures_said, ram_said, short_label
from kit.units import WIDTH, GiB, fmt_bytes, wrap


def _f(advice, nbytes: int) -> str:
    return fmt_bytes(nbytes, _unit(advice))


def _unit(advice) -> str | None:
    return "GiB" if advice.limit.limit_bytes >= GiB else None   # one unit in a text


def _margin(advice, nbytes: int) -> str:
    return f"{_f(advice, nbytes)} to spare" if nbytes >= 0 else f"{_f(advice, -nbytes)} short"


def _signed(advice, nbytes: int) -> str:
    return ("+" if nbytes >= 0 else "-") + _f(advice, abs(nbytes))


def _held(advice, suggestion) -> int:
    """What of suggestion ``suggestion`` is judged: its reserved figure, or its peak under a safety fraction."""
    judged_reserved = advice.limit.safety_fraction is None and suggestion.reserved_bytes
    return suggestion.reserved_bytes if judged_reserved else suggestion.peak_bytes


def judged_name(advice) -> str:
    if advice.limit.safety_fraction is not None:
        return "peak (allocated)"
    if advice.limit.kernels == "cpu":   # no caching allocator: the peak of the live tensors is judged
        return "peak"
    return "reserved at evaluate() (modelled)" if advice.evaluates and advice.eval_peak_bytes > advice.peak_bytes \
        else "reserved (modelled)"


def word(advice_or_suggestion) -> str:
    """"fits", "TIGHT" (within the limit, not the margin kept) or "DOES NOT FIT"."""
    return "fits" if advice_or_suggestion.fits else "TIGHT" if advice_or_suggestion.tight else "DOES NOT FIT"


def usable_said(advice) -> str:
    """The usable bytes and what they are: the limit less the margin kept while modelled (or the safety fraction)."""
    lim = advice.limit
    if not lim.margin_fraction:
        return _f(advice, lim.limit_bytes)
    less = f"the {lim.margin_fraction:.0%} margin" if lim.safety_fraction is None else f"{lim.margin_fraction:.0%}"
    return f"{_f(advice, lim.usable_bytes)} usable ({_f(advice, lim.limit_bytes)} less {less})"


def verdict_line(advice) -> str:
    """The verdict with the one figure judged, by name, and the limit (and RAM where the build does not fit)."""
    lim = advice.limit
    ram = "" if advice.cpu_build_bytes <= lim.ram_for_model_bytes else \
        "; " + ram_said(advice.cpu_build_bytes, lim.ram_bytes, lim.runtime_ram_bytes, _unit(advice))
    room = _margin(advice, advice.margin_bytes) if not advice.tight else \
        f"{_f(advice, lim.limit_bytes - advice.judged_bytes)} to spare of the limit, under its margin"
    return (f"{word(advice)} {short_label(lim.label)}: {_f(advice, advice.judged_bytes)} "
            f"{judged_name(advice)} of {usable_said(advice)} ({room}){ram}{advice.kernel}")


def answer(advice) -> list:
    """At most :data:`~kit.advise.answer.ANSWER_LINES` lines, folded: the verdict, what the peak and reserved
    figures are, the biggest cause, and the single best change (its objects in the lines left)."""
    figures = [figures_said(advice.peak_bytes, _unit(advice))] if advice.limit.safety_fraction is None and \
        advice.reserved_bytes and advice.limit.kernels == "cuda" else []
    out = [verdict_line(advice)] + figures + ([advice.cause] if advice.cause else [])
    if advice.fits:
        return out + [f"no change needed; the largest batch that fits: {advice.max_batch_size}, the longest sequence: "
                      f"{advice.max_seq_len}"]
    if not advice.suggestions:
        return out
    s = advice.suggestions[0]
    head = ("best change" if s.fits else "closest change (TIGHT: under the margin)" if s.tight else
            "closest change (still short)") + ": "
    tail = f" -> {_f(advice, _held(advice, s))} {judged_name(advice).split(' ')[0]} ({_signed(advice, s.margin_bytes)})"
    room = ANSWER_LINES - _folded(out)   # the lines left for it, folded
    width = min(room * (WIDTH - 4) - len(head) - len(tail) - 8, SHORT_WIDTH)
    code = in_short(advice.objects[0], advice.classes, width) if advice.objects else None
    out.append(f"{head}{code or s.cli}{tail}")
    if figures and _folded(out) > ANSWER_LINES:   # the verdict, its cause and the change come first: what the two
        out.remove(figures[0])                   # figures are is said in the details
    return out


def _folded(lines: list) -> int:
    return len(wrap("\n".join(lines)).splitlines())


def short_rows(advice, top: int | None) -> list:
    """The changes after the best (the answer gives it), one line each: the figure judged, margin, options."""
    rows = advice.suggestions[:top]
    out = [f"{'other changes that fit' if rows[1].fits else 'the next closest'}, cheapest first "
           f"({'reserved' if advice.limit.safety_fraction is None else 'peak'}, margin; append to the command):"
           ] if len(rows) > 1 else []
    out += [f"  {i:>2} {_f(advice, _held(advice, s)):>10} {_signed(advice, s.margin_bytes):>11}  {s.cli}"
            + (" (TIGHT)" if s.tight else "") for i, s in enumerate(rows[1:], 2)]
    if not advice.fits:
        out.append(largest_said(advice))
    return out


def largest_said(advice) -> str:
    """The largest batch and the longest sequence that fit, or that none does ("no batch fits"), never a 0.

    >>> from types import SimpleNamespace as Advice
    >>> largest_said(Advice(max_batch_size=8, max_seq_len=2048)), largest_said(Advice(max_batch_size=0, max_seq_len=0))
    ('largest batch that fits: 8; longest sequence: 2048', 'no batch fits, not even 1, and no sequence length either')
    """
    batch = (f"largest batch that fits: {advice.max_batch_size}" if advice.max_batch_size else
             "no batch fits, not even 1")
    seq = (f"longest sequence: {advice.max_seq_len}" if advice.max_seq_len else
           "and no sequence length either" if not advice.max_batch_size else "no sequence length fits at this batch")
    return f"{batch}{'; ' if advice.max_seq_len or advice.max_batch_size else ', '}{seq}"


def details(advice, top: int | None = None) -> list:
    """The full text: the verdict with both figures, each change with its costs and in the user's objects."""
    lim = advice.limit
    ram = "" if advice.cpu_build_bytes <= lim.ram_for_model_bytes else \
        f"; CPU build {_f(advice, advice.cpu_build_bytes)} does NOT fit the {_f(advice, lim.ram_for_model_bytes)} " \
        f"of RAM the runtime leaves ({_f(advice, lim.ram_bytes)} less its own {_f(advice, lim.runtime_ram_bytes)})"
    if advice.evaluates:
        ram += f"; evaluate() {_f(advice, advice.eval_peak_bytes)}" + (
            " does NOT fit" if advice.eval_peak_bytes > lim.usable_bytes else "")
    if lim.safety_fraction is None and lim.kernels == "cpu":   # no caching allocator: the peak is judged
        what = f"peak {_f(advice, advice.peak_bytes)} of {usable_said(advice)}"
    elif lim.safety_fraction is None:
        what = (f"peak {_f(advice, advice.peak_bytes)} allocated, {_f(advice, advice.reserved_bytes)} reserved "
                f"(the caching allocator modelled, expandable_segments "
                f"{'on' if advice.expandable_segments else 'off'}) of {usable_said(advice)}")
    else:
        what = f"peak {_f(advice, advice.peak_bytes)} of {usable_said(advice)}"
    out = [f"{lim.label}: {what}: {_margin(advice, advice.margin_bytes)}{ram}"]
    rows = advice.suggestions[:top]
    if rows:
        out.append(("what makes it fit, cheapest first:" if rows[0].fits else "nothing tried fits; the closest:")
                   + f"\n  {'#':>2} {'peak':>10} {'reserved':>10} {'margin':>11}  changes (append to the command)")
    for i, s in enumerate(rows, 1):
        held = _f(advice, s.reserved_bytes) if lim.safety_fraction is None else "-"
        out.append(f"  {i:>2} {_f(advice, s.peak_bytes):>10} {held:>10} {_signed(advice, s.margin_bytes):>11}  {s.cli}"
                   + (" (TIGHT: within the limit, not its margin)" if s.tight else "")
                   + "".join(f"\n{'':38}cost: {c}" for c in s.costs))
        if i <= len(advice.objects):   # the same change in the user's own objects
            out += _in_objects(advice.objects[i - 1], s.costs)
    out += [f"note: {n}" for n in advice.notes]
    return out + [largest_said(advice)]


def _in_objects(objects, costs: list) -> list:
    code = objects.statements() or ["(no field of your objects changes)"]
    return [f"{'':38}{'in your objects: ' if j == 0 else '':17}{c}" for j, c in enumerate(code)] + [
        f"{'':38}not in an object: {said_once(n, costs)}" for n in objects.notes]


def said_once(note: str, costs: list) -> str:
    """An objects note without the how-to its change's cost already gave (expandable_segments' variable)."""
    return note.replace(HOW_TO, "as its cost above says") if any(HOW_TO in c for c in costs) else note
