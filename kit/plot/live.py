"""Live plots in notebooks, with the inline backend: no ipympl.

A :class:`LivePlot` redraws a figure into an ``ipywidgets.Output`` at each stage end and,
throttled, at the tracker's samples during training: ``clear_output(wait=True)``, then
``display(fig)``, then ``plt.close(fig)``. This works in Colab (ipywidgets 7.7.1) and
JupyterLab (ipywidgets 8): it uses only ``Output`` as a context manager and
``IPython.display.clear_output``/``display``, which both versions have. Without a
notebook kernel (a script, the CLI, CI) it saves numbered PNGs into a folder instead.
Checked in real kernels with ipywidgets 7.7.1 and 8.1.9: the same messages reach the
front end (the Output's capture id set, ``clear_output`` with wait, an ``image/png``).

In a notebook, ``LivePlot(tracker)`` displays an empty Output at once; it fills as stages end.

>>> tracker = Tracker()                                       # doctest: +SKIP
>>> live = LivePlot(tracker)                                  # doctest: +SKIP
>>> trainer = Trainer(..., callbacks=[tracker.callback()])   # doctest: +SKIP
>>> with tracker.stage("train"):                             # doctest: +SKIP
...     trainer.train()
"""
from __future__ import annotations

import time
from pathlib import Path

from kit.plot.runs import timeline

try:
    from IPython import get_ipython
    from IPython.display import clear_output as _clear_output
    from IPython.display import display as _display
except ImportError:  # headless installs without IPython still get PNGs
    get_ipython = _display = _clear_output = None


def in_notebook() -> bool:
    """True inside a Jupyter/Colab kernel (where widgets can render), False in scripts and plain IPython."""
    ip = get_ipython() if get_ipython else None
    return ip is not None and getattr(ip, "kernel", None) is not None


class LivePlot:
    """Redraw ``draw(tracker)`` live: into an ``ipywidgets.Output`` in a notebook, else to PNGs.

    - ``draw``: a function tracker -> Figure (default ``kit.plot.timeline``).
    - ``out``: an Output to draw into (created and displayed when None in a notebook).
    - ``folder``: where PNGs go without a notebook (default ``./kit-live``); passing a
      folder in a notebook saves PNGs there instead of drawing.
    - ``min_interval_s`` / ``max_overhead``: redraws during training come at most every
      ``min_interval_s`` seconds, and less often when a redraw is slow, so that they take
      at most ``max_overhead`` (2%) of the time; with the callback's 1% budget, training
      slows by 3% at most. Stage ends always redraw.

    >>> live = LivePlot(tracker, folder="plots")       # doctest: +SKIP
    >>> live.paths[-1]                                  # doctest: +SKIP
    PosixPath('plots/live-0003.png')
    """

    def __init__(self, tracker=None, draw=None, *, out=None, folder=None, min_interval_s: float = 2.0,
                 max_overhead: float = 0.02, prefix: str = "live", dpi: int = 90):
        draw = timeline if draw is None else draw
        if not callable(draw):
            raise ValueError(f"draw must be a function tracker -> Figure, not {draw!r}")
        if min_interval_s < 0 or not 0 < max_overhead <= 1:
            raise ValueError("min_interval_s must be >= 0 and max_overhead a fraction in (0, 1]")
        self.tracker, self.draw = tracker, draw
        self.min_interval_s, self.max_overhead = min_interval_s, max_overhead
        self.prefix, self.dpi = prefix, dpi
        self.paths: list[Path] = []
        self._number = 0                          # the last PNG's number (see _free_path)
        self.n_draws = 0
        self.last_cost_s = 0.3                    # a guess until the first draw measures it
        self._last_draw = time.perf_counter()     # samples redraw min_interval_s after this at the earliest
        if out is None and folder is None and in_notebook():
            import ipywidgets

            out = ipywidgets.Output()
            _display(out)
        self.out = out
        self.folder = None if out is not None else Path(folder or "kit-live")
        if tracker is not None:
            tracker.add_listener(self._on_event)

    @property
    def mode(self) -> str:
        """``"widget"`` when drawing into an Output, ``"png"`` when saving files."""
        return "widget" if self.out is not None else "png"

    def _on_event(self, event: str, tracker) -> None:
        if event == "stage_end":
            self.update()
        elif event == "sample":
            wait = max(self.min_interval_s, self.last_cost_s / self.max_overhead)
            if time.perf_counter() - self._last_draw >= wait:
                self.update()

    def update(self):
        """Redraw now; returns the PNG path in png mode, else None.

        A drawing error (say, no stage finished yet) is shown in place of the figure
        rather than raised: a live plot must never stop a training run.
        """
        t = time.perf_counter()
        try:
            fig = self.draw(self.tracker)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            fig, note = None, f"(live plot: {type(exc).__name__}: {exc})"
        path = None
        if self.out is not None:
            if fig is not None:
                show(fig, self.out)
            else:
                with self.out:
                    _clear_output(wait=True)
                    print(note)
        elif fig is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self._free_path()
            fig.savefig(path, dpi=self.dpi)
            self.paths.append(path)
        if fig is not None:
            _close(fig)
            self.n_draws += 1
        self._last_draw = time.perf_counter()
        self.last_cost_s = self._last_draw - t
        return path

    def _free_path(self) -> Path:
        """The next numbered PNG path in the folder that holds no file yet: nothing there is overwritten (the
        user's own plots, or an earlier run's)."""
        self._number += 1
        while (self.folder / f"{self.prefix}-{self._number:04d}.png").exists():
            self._number += 1
        return self.folder / f"{self.prefix}-{self._number:04d}.png"

    def close(self) -> None:
        """Stop redrawing (detach from the tracker)."""
        if self.tracker is not None and self._on_event in self.tracker.listeners:
            self.tracker.listeners.remove(self._on_event)


def show(fig, out) -> None:
    """Show ``fig`` as a PNG in the ``ipywidgets.Output`` ``out``, replacing what it showed.

    The one place the kit displays a figure in a notebook. kit.plot builds Figures outside
    pyplot, and IPython registers its Figure formatter only once pyplot's inline backend
    loads: until then, in a fresh kernel, ``display(fig)`` prints "<Figure ...>". So the
    PNG formatter is registered first, as the inline backend does; a format the user
    chose (svg, retina) is left alone.
    """
    _figures_as_png()
    with out:
        _clear_output(wait=True)
        _display(fig)


def _figures_as_png() -> None:
    ip = get_ipython() if get_ipython else None
    if ip is None:
        return
    from matplotlib.figure import Figure

    fmts = ip.display_formatter.formatters
    if not any(Figure in fmts[m].type_printers for m in ("image/png", "image/svg+xml", "image/jpeg")):
        from IPython.core.pylabtools import select_figure_formats

        select_figure_formats(ip, {"png"}, bbox_inches="tight")


def _close(fig) -> None:
    # kit.plot builds figures outside pyplot, but a user's draw function may use pyplot;
    # closing keeps the inline backend from showing it a second time at the cell's end.
    import matplotlib.pyplot as plt

    plt.close(fig)
