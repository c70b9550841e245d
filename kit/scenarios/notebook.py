"""Helpers every notebook calls in its first cells: which run made the outputs, quiet output, scratch space.

>>> from kit.scenarios import notebook
>>> notebook.quiet()
>>> notebook.run_note().startswith("These outputs come from")
True
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path  # noqa: F401 (the doctest of scratch_dir)

from kit import dtypes, machine, runtime
from kit.units import fmt_bytes, wrapped


@wrapped
def run_note() -> str:
    """Which run produced a notebook's outputs: mode, the device it ran on, and the 16-bit dtype its runs take
    (:mod:`kit.dtypes`: fp16 on a GPU without native bf16, such as a T4).

    >>> run_note().startswith("These outputs come from")
    True
    """
    hw = machine.hardware()
    where = (f"a {hw['gpu_name']} GPU ({fmt_bytes(hw['gpu_total_bytes'])})" if hw["gpu_name"]
             else f"a {hw['cpu_cores']}-core CPU, no GPU")
    dtype, why = dtypes.for_this_device()
    return (f"These outputs come from a run on {where}. {runtime.mode_reason()}\n"
            f"16-bit dtype of the runs: {dtype} ({why}).")


def quiet() -> None:
    """No progress bars (datasets' map, transformers' weight loading) and no warnings about the
    libraries' own deprecated internals: the loops print one line per fold instead.

    >>> quiet()
    """
    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # transformers' advice to library authors (config fields, resized embeddings)
    # peft and Trainer call transformers 5's renamed checkpointing methods; nothing for a reader to do
    warnings.filterwarnings("ignore", message=r".*deprecated and will be removed in v6", category=FutureWarning)


def scratch_dir() -> str:
    """A new temporary folder, for smoke runs that must leave nothing behind.

    >>> Path(scratch_dir()).is_dir()
    True
    """
    return tempfile.mkdtemp(prefix="kit-nb-")
