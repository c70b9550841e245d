"""LivePlot: PNGs headless; clear_output(wait=True) + display(fig) into an ipywidgets.Output."""
import ipywidgets
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure

from kit.measure.track import Tracker
from kit.plot import live
from kit.units import MiB


def test_headless_saves_a_png_per_stage_end(tmp_path):
    assert not live.in_notebook()
    t = Tracker()
    lp = live.LivePlot(t, folder=tmp_path / "frames", min_interval_s=3600)
    assert lp.mode == "png"
    with t.stage("one"):
        x = torch.ones(MiB, dtype=torch.uint8)
    with t.stage("two"):
        del x
    t.sample(live_tensors=False)             # throttled: an hour between redraws from samples
    assert [p.name for p in lp.paths] == ["live-0001.png", "live-0002.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in lp.paths)
    lp.min_interval_s, lp.last_cost_s = 0, 0.0  # no minimum, and redraws cost nothing: draw again
    t.sample(live_tensors=False)
    assert len(lp.paths) == 3
    lp.close()
    with t.stage("three"):
        pass
    assert len(lp.paths) == 3                # detached: no more redraws
    assert plt.get_fignums() == []


def test_draws_into_an_output_widget(monkeypatch):
    calls = []
    monkeypatch.setattr(live, "_display", lambda obj: calls.append(("display", obj)))
    monkeypatch.setattr(live, "_clear_output", lambda wait=False: calls.append(("clear", wait)))
    out = ipywidgets.Output()                # API shared by ipywidgets 7.7.1 (Colab) and 8
    t = Tracker()
    lp = live.LivePlot(t, out=out)
    assert lp.mode == "widget" and lp.folder is None
    with t.stage("load"):
        pass
    assert [c[0] for c in calls] == ["clear", "display"]
    assert calls[0][1] is True               # wait=True: no flicker between frames
    assert isinstance(calls[1][1], Figure)
    assert lp.n_draws == 1 and lp.paths == []


def test_a_drawing_error_never_stops_the_run(monkeypatch, capsys):
    printed = []
    monkeypatch.setattr(live, "_display", lambda obj: printed.append(obj))
    monkeypatch.setattr(live, "_clear_output", lambda wait=False: None)
    lp = live.LivePlot(Tracker(), out=ipywidgets.Output())
    lp.update()                              # no readings yet: timeline raises ValueError inside
    assert printed == [] and "live plot:" in capsys.readouterr().out
    assert lp.n_draws == 0


def test_redraws_from_samples_are_throttled_by_their_cost(tmp_path):
    t = Tracker()
    lp = live.LivePlot(t, folder=tmp_path, min_interval_s=0, max_overhead=1e-9)
    assert lp.last_cost_s > 0                # a pessimistic guess until a draw measures it
    t.sample(live_tensors=False)             # the guess alone holds the first redraw back ...
    assert lp.paths == []
    lp.last_cost_s = 0.0
    t.sample(live_tensors=False)             # ... at no cost it draws, and measures the cost
    t.sample(live_tensors=False)             # a draw costs ms; at this budget the next waits for ages
    assert len(lp.paths) == 1 and lp.last_cost_s > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="draw"):
        live.LivePlot(Tracker(), draw="timeline")
    with pytest.raises(ValueError, match="max_overhead"):
        live.LivePlot(Tracker(), max_overhead=0)
