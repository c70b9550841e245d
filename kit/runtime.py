"""What this runtime can do: is the Hub reachable, and do we run smoke or real sizes?

The kit runs the same code everywhere; only the sizes change:

- **real**: real models from the Hub when it is reachable, else real-size
  architecture twins (random weights, the real shapes, so the real memory);
- **smoke**: tiny twins and a few steps, so a notebook runs in minutes on 2 CPU cores.

``KIT_SMOKE=1`` forces smoke mode and ``KIT_SMOKE=0`` forces real sizes. Unset, the
kit picks smoke mode when there is no GPU, because real sizes need one, and says so.

>>> mode()                                  # doctest: +SKIP
'smoke'
"""
from __future__ import annotations

import functools
import os
import socket
from contextlib import contextmanager

from kit import machine
from kit.units import fmt_bytes, wrapped

HUB_HOST = "huggingface.co"


@functools.lru_cache(maxsize=None)
def hub_reachable(timeout_s: float = 2.0) -> bool:
    """True when the Hugging Face Hub answers. ``HF_HUB_OFFLINE=1`` means no, at once.

    The answer is cached for the process: without a network a Hub call otherwise
    hangs about 47 s before failing, and the kit asks often.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def has_cuda() -> bool:
    """Whether a GPU is there (kit.machine asks torch on first use, so importing runtime loads no torch)."""

    return machine.has_cuda()


def mode() -> str:
    """``"smoke"`` or ``"real"``, from ``KIT_SMOKE`` or, unset, from whether a GPU is there."""
    forced = os.environ.get("KIT_SMOKE")
    if forced is not None and forced.strip() != "":
        return "smoke" if forced.strip().lower() in ("1", "true", "yes") else "real"
    return "real" if has_cuda() else "smoke"


def is_smoke() -> bool:
    """Shorthand for ``mode() == "smoke"``."""
    return mode() == "smoke"


def mode_reason() -> str:
    """One sentence that says which sizes this run uses, and why."""
    forced = os.environ.get("KIT_SMOKE", "").strip()
    hub = "the Hub is reachable" if hub_reachable() else "the Hub is not reachable"
    if forced:
        why = f"KIT_SMOKE={forced} was set"
    elif has_cuda():
        why = "a GPU is present"
    else:
        why = "there is no GPU, and real sizes need one (set KIT_SMOKE=0 to force them)"
    if mode() == "smoke":
        return f"SMOKE mode: tiny twins and a few steps, because {why}."
    source = "real models and wikitext from the Hub" if hub_reachable() else "real-size architecture twins (random weights, real shapes)"
    return f"REAL sizes: {source}, because {why} and {hub}."


LIBRARIES = ("torch", "transformers", "datasets", "peft", "bitsandbytes", "accelerate", "ipywidgets", "matplotlib")


def versions() -> dict[str, str | None]:
    """Installed versions of the libraries the kit uses (None where one is missing).

    >>> versions()["torch"]                     # doctest: +SKIP
    '2.13.0+cpu'
    """
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


@wrapped
def describe() -> str:
    """What this runtime has, as a short text: GPU, RAM, libraries, Hub, and so real models or twins.

    >>> print(describe())                       # doctest: +SKIP
    GPU: none (CPU only)
    ...
    """

    hw = machine.hardware()
    gpu = f"{hw['gpu_name']}, {fmt_bytes(hw['gpu_total_bytes'])} total" if hw["gpu_name"] else "none (CPU only)"
    libs = ", ".join(f"{k} {v or 'MISSING'}" for k, v in versions().items())
    return "\n".join([
        f"GPU: {gpu}",
        f"RAM: {fmt_bytes(hw['ram_total_bytes'])} total, {fmt_bytes(hw['ram_available_bytes'])} available; {hw['cpu_cores']} CPU cores",
        f"Libraries: {libs}",
        f"Hugging Face Hub: {'reachable' if hub_reachable() else 'NOT reachable (offline: the kit uses shipped configs, text and tokenizer)'}",
        mode_reason(),
    ])


_said: dict | None = None  # inside once_per_run(): kind -> the last line said of that kind


def say(line: str) -> None:
    """Print a loader's line (``"MODEL: ..."``, ``"DATA: ..."``); inside :func:`once_per_run`, a line
    that repeats the last one of its kind is not printed again.

    >>> with once_per_run():
    ...     for fold in (1, 2):
    ...         say("MODEL: tiny TWIN tiny-llama")
    MODEL: tiny TWIN tiny-llama
    """
    if _said is not None:
        kind = line.split(":", 1)[0]
        if _said.get(kind) == line:
            return
        _said[kind] = line
    print(line, flush=True)


@contextmanager
def once_per_run(seen: dict | None = None):
    """Within this block (a loop of folds, a pair of runs), each loader line is said once. ``seen``: a dict
    to share between blocks, so that a line said in one is not said again in the next."""
    global _said
    outer = _said
    _said = outer if outer is not None else {} if seen is None else seen
    try:
        yield
    finally:
        _said = outer
