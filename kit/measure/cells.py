"""``%load_ext kit``: one line under each cell that runs: the memory it added, its peak, its time.

On a GPU the line reads CUDA allocated (change, and the peak allocated inside the cell), CUDA
reserved (change) and the process RSS; on a CPU the RSS change and the peak RSS inside the cell.
The peaks are exact: both counters are reset as each cell starts (``kit.measure.device.reset_peak``, which
counts its resets, so a :class:`kit.measure.track.Tracker` stage spanning cells marks its own peak not exact).
Live-tensor bytes need a ``gc.collect()`` and a walk of every object before and after the cell (about
0.6 s a cell with transformers loaded, on a 2-core CPU; the default readings take about 0.3 ms:
``benchmarks/callback_overhead.py``), so they are read only when asked::

    %load_ext kit
    %kit_cells live      # add the live-tensor change (a gc.collect and a walk before and after each cell)
    %kit_cells cheap     # back to the default readings (about a millisecond a cell)
    %kit_cells off       # pause; `%kit_cells on` resumes
    %unload_ext kit      # stop

>>> print(CellReading(0.25, 2**30, 2**30 + 64 * 2**20, 2**30 + 64 * 2**20).text())
kit cell: RSS +64.00 MiB (now 1.06 GiB), peak in cell +64.00 MiB above its start | 0.25 s
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from kit.measure import device
from kit.units import fmt_bytes

MODES = ("cheap", "live", "off")


def _signed(nbytes: int) -> str:
    return ("+" if nbytes >= 0 else "-") + fmt_bytes(abs(nbytes))


@dataclass
class CellReading:
    """One cell's reading. Bytes are ints; None where this runtime has no such counter (or, for live
    tensors, where it was not asked for)."""

    seconds: float
    rss_start_bytes: int
    rss_end_bytes: int
    rss_peak_bytes: int | None = None            # VmHWM since the cell started (None: could not be reset)
    cuda_start_bytes: int | None = None           # CUDA allocated
    cuda_end_bytes: int | None = None
    cuda_peak_bytes: int | None = None            # max allocated inside the cell
    reserved_start_bytes: int | None = None
    reserved_end_bytes: int | None = None
    live_start_bytes: int | None = None           # live tensors on every device
    live_end_bytes: int | None = None
    peak_exact: bool = True                       # False: someone reset a peak counter inside the cell

    @property
    def rss_delta_bytes(self) -> int:
        return self.rss_end_bytes - self.rss_start_bytes

    @property
    def cuda_delta_bytes(self) -> int | None:
        return None if self.cuda_end_bytes is None else self.cuda_end_bytes - self.cuda_start_bytes

    @property
    def live_delta_bytes(self) -> int | None:
        return None if self.live_end_bytes is None else self.live_end_bytes - self.live_start_bytes

    def text(self) -> str:
        """The line printed under the cell."""
        approx = "" if self.peak_exact else ">="
        parts = []
        if self.cuda_end_bytes is not None:
            peak = (f", peak {approx}{fmt_bytes(self.cuda_peak_bytes)} in cell"
                    if self.cuda_peak_bytes is not None else "")
            parts.append(f"CUDA allocated {_signed(self.cuda_delta_bytes)} "
                         f"(now {fmt_bytes(self.cuda_end_bytes)}){peak}; "
                         f"reserved {_signed(self.reserved_end_bytes - self.reserved_start_bytes)} "
                         f"(now {fmt_bytes(self.reserved_end_bytes)})")
        rss = f"RSS {_signed(self.rss_delta_bytes)} (now {fmt_bytes(self.rss_end_bytes)})"
        if self.rss_peak_bytes is not None and self.cuda_end_bytes is None:
            rss += f", peak in cell {approx}{_signed(self.rss_peak_bytes - self.rss_start_bytes)} above its start"
        parts.append(rss)
        if self.live_end_bytes is not None:
            parts.append(f"live tensors {_signed(self.live_delta_bytes)} (now {fmt_bytes(self.live_end_bytes)})")
        return "kit cell: " + " | ".join(parts) + f" | {self.seconds:.2f} s"


class CellMemory:
    """The extension's state: the mode, the reading under way, the last one (``last``), what they cost."""

    def __init__(self, ipython, mode: str = "cheap"):
        self.ip, self.mode = ipython, mode
        self.last: CellReading | None = None
        self.cost_s = 0.0                         # the last cell's own reading time (pre + post)
        self._start = None

    def _live(self) -> int | None:
        if self.mode != "live":
            return None
        gc.collect()
        return sum(device.live_tensor_bytes().values())

    def pre(self, info=None) -> None:
        if self.mode == "off":
            self._start = None
            return
        t = time.perf_counter()
        took = device.reset_peak()
        live = self._live()
        snap = device.snapshot(live_tensors=False)
        self._start = (snap, live, took, device.peak_resets(), time.perf_counter())
        self.cost_s = self._start[-1] - t

    def post(self, result=None) -> None:
        if self._start is None:                   # `%load_ext kit` itself, or paused
            return
        t = time.perf_counter()
        start, live, took, resets, t0 = self._start
        self._start = None
        snap = device.snapshot(live_tensors=False)
        seconds = t - t0
        end_live = self._live() if live is not None else None   # `%kit_cells live` in this cell: from the next one
        again = device.peak_resets() != resets
        r = CellReading(seconds=seconds, rss_start_bytes=start.rss_bytes, rss_end_bytes=snap.rss_bytes,
                        # the kernel syncs its RSS counters lazily: a peak a few pages under a reading is that reading
                        rss_peak_bytes=max(snap.rss_peak_bytes, start.rss_bytes, snap.rss_bytes) if took.get("rss") and
                        snap.rss_peak_bytes is not None else None,
                        cuda_start_bytes=start.cuda_allocated_bytes, cuda_end_bytes=snap.cuda_allocated_bytes,
                        cuda_peak_bytes=snap.cuda_peak_allocated_bytes, reserved_start_bytes=start.cuda_reserved_bytes,
                        reserved_end_bytes=snap.cuda_reserved_bytes,
                        live_start_bytes=live, live_end_bytes=end_live, peak_exact=not again)
        self.last = r
        self.cost_s += time.perf_counter() - t
        print(r.text(), flush=True)

    def magic(self, line: str = "") -> None:
        """``%kit_cells [cheap|live|off|on]``: set the readings (no argument: say which are on)."""
        arg = line.strip().lower()
        if arg == "on":
            arg = "cheap"
        if arg and arg not in MODES:
            from IPython.core.error import UsageError  # IPython prints it in one line, no traceback

            raise UsageError(f"%kit_cells takes one of cheap, live, off, on; not {line.strip()!r}")
        if arg:
            self.mode = arg
        print(f"kit cell readings: {self.mode}" + (" (live tensors: a gc walk before and after each cell)"
                                                    if self.mode == "live" else ""))


_STATE: dict = {}


def load(ipython, mode: str = "cheap") -> CellMemory:
    """Start the readings in the IPython shell ``ipython`` (what ``%load_ext kit`` calls). Loading twice keeps one.

    >>> from IPython.core.interactiveshell import InteractiveShell     # doctest: +SKIP
    >>> load(InteractiveShell.instance()).mode                         # doctest: +SKIP
    'cheap'
    """
    if ipython is None or not hasattr(ipython, "events"):
        raise ValueError("kit's cell readings need an IPython shell: run `%load_ext kit` in a notebook")
    old = _STATE.get(id(ipython))
    if old is not None:
        return old
    cm = CellMemory(ipython, mode)
    ipython.events.register("pre_run_cell", cm.pre)
    ipython.events.register("post_run_cell", cm.post)
    ipython.register_magic_function(cm.magic, magic_kind="line", magic_name="kit_cells")
    _STATE[id(ipython)] = cm
    return cm


def unload(ipython) -> None:
    """Stop the readings (what ``%unload_ext kit`` calls)."""
    cm = _STATE.pop(id(ipython), None)
    if cm is None:
        return
    for name, fn in (("pre_run_cell", cm.pre), ("post_run_cell", cm.post)):
        try:
            ipython.events.unregister(name, fn)
        except ValueError:
            pass
    ipython.magics_manager.magics["line"].pop("kit_cells", None)


def current(ipython=None) -> CellMemory | None:
    """The loaded extension's state in ``ipython`` (default: the running shell), or None."""
    if ipython is None:
        from IPython import get_ipython

        ipython = get_ipython()
    return _STATE.get(id(ipython))
