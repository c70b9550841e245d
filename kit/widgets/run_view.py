"""The panel's Run and Sweep: the controls' setup run stage by stage, each stage drawn beside its estimate as it
ends (:mod:`kit.widgets.stages`; scenario 2's story runs its folds), or a peak against batch size or sequence
length (:mod:`kit.widgets.runs`); the controls are locked while one goes.

:class:`PanelRuns` is a part of :class:`kit.widgets.Panel` (its controls, buttons and outputs are the panel's).
"""
from __future__ import annotations

import html

from kit.measure.track import Tracker
from kit.plot.live import LivePlot, show
from kit.widgets import runs as panel_runs
from kit.widgets import stages as staged
from kit.widgets import views as views


class PanelRuns:
    def _lock(self, locked: bool) -> None:
        self._running = locked
        for w in list(self.controls.values()) + [self.run_button, self.sweep_button, self.sweep_over,
                                                 self.model_box, self.use_button]:
            w.disabled = locked  # when off, _refresh disables again what makes no sense
        if not locked:
            self._refresh()  # gives back each control's own disabled state and reason

    def _show(self, fig) -> None:

        self.last_figure = fig
        show(fig, self.plot_out)

    def _on_run(self, _button=None) -> None:

        if self.problem or self.run_reason or self._running:
            return
        setup, tracker = self.run_setup(), Tracker()
        self._lock(True)
        self.status.value = f"running {html.escape(views.run_label(setup))} stage by stage&hellip;"
        chart, go = (getattr(self.story, "staged_run", None) or staged.trainer_run)(
            setup, self.steps, self.preset(), self.estimate)
        live = LivePlot(tracker, chart, out=self.plot_out, min_interval_s=1.0)
        try:
            record = go(tracker)
            if record["status"] != "refused":
                self.last_figure = chart(tracker)   # the run as it ended, kept for the caller
        except KeyboardInterrupt:  # the notebook's stop button: the run has cleaned up (finally blocks)
            record = dict(setup, status="stopped", error="interrupted; memory released")
        except Exception as exc:  # never leave the panel locked; show what went wrong
            record = dict(setup, status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            live.close()
            self._lock(False)
        self.last_chart = chart
        self._finish(dict(record, twin_of=setup["twin_of"]))

    def _on_sweep(self, _button=None) -> None:

        if self.problem or self.run_reason or self._running:
            return
        over, setup = self.sweep_over.value, self.run_setup()
        sizes = self.sweep_sizes if over == "batch_size" else tuple(
            s for s in (64, 128, 256, 512, 1024, 2048, 4096, 8192) if s <= self.controls["seq_len"].max)
        self._lock(True)
        self.status.value = f"sweeping {over.replace('_', ' ')} over {', '.join(map(str, sizes))}&hellip;"
        try:
            res = panel_runs.sweep(setup, over, sizes, tracker=Tracker())
            if res["points"]:  # else every size was refused before it ran: the history row says why
                self._show(panel_runs.sweep_figure(res, views.run_label(setup), self.machine.gpu_bytes))
            record = dict(panel_runs.sweep_record(res, setup), twin_of=setup["twin_of"])
        except KeyboardInterrupt:
            record = dict(setup, status="stopped", error="interrupted; memory released")
        except Exception as exc:
            record = dict(setup, status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self._lock(False)
        self._finish(record)

    def _finish(self, record: dict) -> None:
        self.last_result = record
        self.history.append(record)
        self.status.value = views.status_html(record)
        self.history_html.value = views.history_html(self.history)
