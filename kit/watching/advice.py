"""The fit advisor's words in a report of ``kit.train`` or ``kit.watch_loop``: its text in full, and its best change
in one line for the report's answer. ``kit.advise`` is imported lazily: it may not be there.
"""
from __future__ import annotations


def advice_text(est, trainer, device_name: str) -> tuple[str, bool | None]:
    """The fit advisor's verdict and top changes (or why there are none), and whether it says the setup
    fits (None: no verdict). ``kit.advise`` is imported lazily: it may not be there."""
    try:
        from kit.advise import advise
    except ImportError:
        return "advisor not available", None
    if est is None:
        return "advisor: no estimate of this Trainer, so no advice", None
    try:
        a = advise(trainer, device=device_name, trainer_estimate=est)
    except (ValueError, TypeError) as exc:
        return f"advisor: could not run ({type(exc).__name__}: {exc})", None
    text = a.text(top=3, details=True) if hasattr(a, "details") else str(a)
    said = AdviceText("The fit advisor (prediction only):\n" + "\n".join("  " + ln for ln in text.splitlines()))
    said.best = a.answer()[-1] if hasattr(a, "answer") and not a.fits and a.suggestions else None
    return said, getattr(a, "fits", None)


class AdviceText(str):
    """The advisor's text in a report; ``best``: its best change in one line (the report's answer), or None."""

    best: str | None = None
