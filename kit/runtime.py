"""What this runtime can do: is the Hub reachable, and do we run smoke or real sizes?

The kit runs the same code everywhere; only the sizes change:

- **real**: real models from the Hub when it is reachable, else real-size
  architecture twins (random weights, the real shapes, so the real memory);
- **smoke**: tiny twins and a few steps, so a notebook runs in minutes on 2 CPU cores.

``KIT_SMOKE=1`` forces smoke mode and ``KIT_SMOKE=0`` forces real sizes (true/false, yes/no and on/off are read
too; any other word is refused). Unset, the kit picks smoke mode when there is no GPU, because real sizes need one,
and says so.

:func:`allocator_conf` reads the CUDA allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``) as torch does.

>>> mode()                                  # doctest: +SKIP
'smoke'
"""
from __future__ import annotations

import functools
import os
import re
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field

from kit.inputs import InputError

from kit import inputs
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
    forced = os.environ.get("KIT_SMOKE", "").strip()
    if not forced:
        return "real" if has_cuda() else "smoke"
    try:
        return "smoke" if inputs.flag("KIT_SMOKE", forced) else "real"
    except InputError:
        raise InputError("KIT_SMOKE", f"KIT_SMOKE must be 1 or 0 (or true/false, yes/no, on/off), not "
                                          f"{forced!r}: 1 runs tiny twins, 0 real sizes; unset, the kit picks tiny "
                                          "twins without a GPU.") from None


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
    source = ("real models and wikitext from the Hub" if hub_reachable()
              else "real-size architecture twins (random weights, real shapes)")
    return f"REAL sizes: {source}, because {why} and {hub}."


# -- the CUDA allocator's settings ----------------------------------------------------------------------------------
# torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF and, only where that is unset, PYTORCH_ALLOC_CONF (checked with
# torch._C._accelerator_getAllocatorSettings on this torch); its tokenizer splits at , : [ ] and drops spaces.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
MODELLED_KEYS = ("expandable_segments",)   # the reserved figure's allocator model reads this key alone


@dataclass(frozen=True)
class AllocatorConf:
    """The allocator settings torch will read: the variable (None where neither is set), its text, whether
    ``expandable_segments`` is on, and the keys set that the kit's allocator model ignores."""

    var: str | None = None
    text: str = ""
    expandable: bool = False
    ignored: list = field(default_factory=list)


def allocator_conf(environ=None) -> AllocatorConf:
    """The CUDA allocator's settings in ``environ`` (``os.environ``), read as torch 2.13 reads them: only
    ``True``/``False`` for ``expandable_segments`` (torch stops at CUDA's first use on anything else; refused
    here in one sentence), the last setting of a key wins.

    >>> c = allocator_conf({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"})
    >>> c.expandable, c.ignored
    (True, ['max_split_size_mb'])
    """
    environ = os.environ if environ is None else environ
    var = next((v for v in ALLOC_CONF_VARS if environ.get(v) is not None), None)
    if var is None:
        return AllocatorConf()
    text = environ[var]
    tokens = [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]
    expandable, ignored, depth = False, [], 0
    for i, key in enumerate(tokens):
        depth += (key == "[") - (key == "]")
        if depth or (i and tokens[i - 1] != ","):
            continue                                   # a value, or inside a list such as [64:8,256:4]
        if key == "expandable_segments":
            value = tokens[i + 2] if tokens[i + 1:i + 2] == [":"] and i + 2 < len(tokens) else None
            if value not in ("True", "False"):
                raise InputError(var, f"{var}={text!r}: torch accepts only True or False for "
                                          f"expandable_segments (capitalised), and stops at CUDA's first use with "
                                          f"anything else: write expandable_segments:True.")
            expandable = value == "True"
        elif key not in ignored and key not in (",", "]"):
            ignored.append(key)
    return AllocatorConf(var, text, expandable, ignored)


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
def describe(sizes: str | None = None) -> str:
    """What this runtime has, as a short text: GPU, RAM, libraries, Hub, and so real models or twins. ``sizes``: the
    last line, which sizes run and why, where a caller chose them (the demo's ``--size``); by default
    :func:`mode_reason`, this machine's default.

    >>> print(describe())                       # doctest: +SKIP
    GPU: none (CPU only)
    ...
    """

    hw = machine.hardware()
    gpu = f"{hw['gpu_name']}, {fmt_bytes(hw['gpu_total_bytes'])} total" if hw["gpu_name"] else "none (CPU only)"
    libs = ", ".join(f"{k} {v or 'MISSING'}" for k, v in versions().items())
    return "\n".join([
        f"GPU: {gpu}",
        f"RAM: {fmt_bytes(hw['ram_total_bytes'])} total, {fmt_bytes(hw['ram_available_bytes'])} available; "
        f"{hw['cpu_cores']} CPU cores",
        f"Libraries: {libs}",
        "Hugging Face Hub: " + ("reachable" if hub_reachable()
                                else "NOT reachable (offline: the kit uses shipped configs, text and tokenizer)"),
        sizes or mode_reason(),
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
