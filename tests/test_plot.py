"""Every plot renders headless; checked through its artists (bars, lines, labels), not pixels."""
import io

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from kit import plot
from kit.measure.device import Snapshot
from kit.measure.track import Sample, StageRecord, Tracker
from kit.units import GiB, MiB


def _snap(t, live=0, rss=GiB, cuda=None):
    s = Snapshot(time=t, rss_bytes=rss, rss_peak_bytes=rss, ram_available_bytes=8 * GiB,
                 live_tensor_bytes={"cpu": live})
    if cuda is not None:
        s.cuda_allocated_bytes, s.cuda_reserved_bytes, s.cuda_peak_allocated_bytes = cuda, cuda + GiB, cuda
    return s


def _tracker(cuda: bool) -> Tracker:
    """A tracker with three stages (one repeated) and samples, built from readings."""
    t = Tracker()
    c = (lambda n: n) if cuda else (lambda n: None)
    t.records = [
        StageRecord("load model", 0, 0, _snap(0, 0, GiB, c(0)), _snap(2, 2 * GiB, 3 * GiB, c(2 * GiB)),
                    cuda_peak_bytes=c(2 * GiB), rss_peak_bytes=3 * GiB, live_peak_bytes={"cpu": 2 * GiB}),
        StageRecord("fold", 0, 1, _snap(3, 2 * GiB, 3 * GiB, c(2 * GiB)), _snap(6, 2 * GiB, 4 * GiB, c(2 * GiB)),
                    cuda_peak_bytes=c(5 * GiB), rss_peak_bytes=5 * GiB, live_peak_bytes={"cpu": 3 * GiB}),
        StageRecord("fold", 1, 2, _snap(7, 2 * GiB, 4 * GiB, c(2 * GiB)), _snap(9, 2 * GiB, 4 * GiB, c(2 * GiB)),
                    cuda_peak_bytes=c(5 * GiB), rss_peak_bytes=5 * GiB, live_peak_bytes={"cpu": 3 * GiB}),
    ]
    t.samples = [Sample(_snap(4, 3 * GiB, 4 * GiB, c(4 * GiB)), step=1, event="step", has_live=True),
                 Sample(_snap(5, 0, 4 * GiB, c(4 * GiB)), step=2, event="step", has_live=False)]
    return t


def _render(fig):
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")          # draws every artist headless (Agg)
    assert buf.getvalue()[:4] == b"\x89PNG"
    assert fig.get_size_inches()[0] <= 10   # readable at Colab's width
    ax = fig.axes[0]
    assert "GiB" in ax.get_ylabel()
    return ax


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("cuda", [False, True])
def test_stage_bars(cuda):
    ax = _render(plot.stage_bars(_tracker(cuda)))
    series = 4 if cuda else 3
    assert len(ax.patches) == 3 * series
    assert [t.get_text() for t in ax.get_xticklabels()] == ["load model", "fold #1", "fold #2"]
    names = _legend(ax)
    assert (["CUDA allocated (end)", "CUDA reserved (end)", "CUDA peak allocated", "process RSS (end)"] if cuda
            else ["live CPU tensors (end)", "process RSS (end)", "peak RSS in stage"]) == names
    heights = sorted(round(p.get_height(), 3) for p in ax.patches)
    assert heights[-1] == 5.0               # drawn in GiB


@pytest.mark.parametrize("cuda", [False, True])
def test_timeline(cuda):
    t = _tracker(cuda)
    ax = _render(plot.timeline(t))
    lines = {l.get_label(): l for l in ax.get_lines()}
    if cuda:
        assert set(lines) == {"CUDA allocated", "CUDA reserved", "process RSS"}
        assert len(lines["CUDA allocated"].get_xdata()) == 8          # 6 stage ends + 2 samples
    else:
        assert set(lines) == {"live CPU tensors", "process RSS"}
        assert len(lines["live CPU tensors"].get_xdata()) == 7        # the sample without the gc walk is left out
        assert max(lines["live CPU tensors"].get_ydata()) == 3.0
    assert len(lines["process RSS"].get_xdata()) == 8
    texts = [x.get_text() for x in ax.texts]
    assert texts == ["load model", "fold #1", "fold #2"]
    assert "s)" in ax.get_xlabel()
    with pytest.raises(ValueError, match="no readings"):
        plot.timeline(Tracker())


def test_predicted_vs_measured():
    comps = {"weights": 2 * GiB, "gradients": 2 * GiB, "optimizer": 4 * GiB, "activations": GiB}
    ax = _render(plot.predicted_vs_measured(comps, 10 * GiB, limit_bytes=15 * GiB))
    assert len(ax.patches) == 5                      # four stacked components + the measured bar
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert tops[3] == pytest.approx(9.0) and tops[4] == pytest.approx(10.0)
    assert any("limit 15.00 GiB" in s for s in _legend(ax))
    assert any("1.11x" in t.get_text() for t in ax.texts)
    ax = _render(plot.predicted_vs_measured({"weights": GiB}, None))
    assert len(ax.patches) == 1 and any(t.get_text() == "not run" for t in ax.texts)
    with pytest.raises(ValueError, match="components"):
        plot.predicted_vs_measured({}, GiB)
    with pytest.raises(ValueError, match="non-negative"):
        plot.predicted_vs_measured({"weights": -1}, GiB)


def test_folds():
    f = [{"start_bytes": GiB, "peak_bytes": 3 * GiB, "end_bytes": GiB},
         {"start_bytes": 2 * GiB, "peak_bytes": None, "end_bytes": None, "oom": True}]
    ax = _render(plot.folds(f, baseline_bytes=GiB, limit_bytes=4 * GiB))
    assert len(ax.patches) == 4                      # 3 bars for fold 1, the start bar of fold 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fold 1", "fold 2"]
    names = _legend(ax)
    assert "baseline 1.00 GiB" in names and "limit 4.00 GiB" in names
    assert "OOM" in [t.get_text() for t in ax.texts]
    with pytest.raises(ValueError, match="peak_bytes"):
        plot.folds([{"start_bytes": 1}])
    with pytest.raises(ValueError, match="empty"):
        plot.folds([])


def test_sweep_marks_oom_points():
    pts = [(1, GiB, False), (2, 2 * GiB, False), (4, 4 * GiB, False), (8, None, True), (16, None, True)]
    ax = _render(plot.sweep(pts, "batch size", limit_bytes=6 * GiB))
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert list(lines["fits (measured peak)"].get_xdata()) == [1, 2, 4]
    assert list(lines["out of memory"].get_xdata()) == [8, 16]
    assert list(lines["out of memory"].get_ydata()) == [6.0, 6.0]       # on the limit line
    assert ax.get_xlabel() == "batch size"
    assert [t.get_text() for t in ax.texts] == ["OOM", "OOM"]
    ax = _render(plot.sweep([(128, 100 * MiB, False), (256, None, True)], "sequence length"))
    assert len(ax.get_lines()) == 2
    with pytest.raises(ValueError, match="GiB"):
        plot.sweep(pts, "batch size", ylabel="peak")


def test_plots_stay_out_of_pyplot():
    before = plt.get_fignums()
    plot.stage_bars(_tracker(False))
    assert plt.get_fignums() == before               # nothing for the inline backend to show twice


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_tiny_bars_keep_their_own_scale_and_state_the_limit_in_text():
    """A tiny model against a 15 GiB GPU: the bars set the scale; the limit is text and a side panel."""
    comps = {"weights": 4 * MiB, "gradients": 6 * MiB, "optimizer state": 8 * MiB}
    fig = plot.predicted_vs_measured(comps, 20 * MiB, limit_bytes=15 * GiB, device_label="Colab T4")
    ax = _render(fig)
    assert ax.get_ylim()[1] <= 2 * 20 * MiB / GiB              # scaled to the bars, not to the 15 GiB limit
    assert not [l for l in ax.get_lines() if l.get_ydata()[0] == pytest.approx(15.0)]   # no far-off line
    assert any("limit 15.00 GiB on a Colab T4" in t and "fits" in t and "to spare" in t for t in _texts(ax))
    side = fig.axes[1]                                           # the bars against the whole GPU
    assert side.get_ylim()[1] >= 15.0 and [l for l in side.get_lines() if l.get_ydata()[0] == pytest.approx(15.0)]
    assert "optimizer state (8.00 MiB)" in _legend(ax)          # components read in their own unit


def test_breakdown_is_an_estimate_alone_against_a_near_limit():
    comps = {"weights": 10 * GiB, "optimizer state": 40 * GiB, "activations": 0}
    ax = _render(plot.breakdown(comps, 15 * GiB, title="ESTIMATED", device_label="Colab T4"))
    assert len(ax.patches) == 2                                  # the zero component is left out
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ESTIMATED peak"]
    assert not any("not run" in t or "measured" in t.lower() for t in _texts(ax) + _legend(ax))
    assert "Colab T4: limit 15.00 GiB" in _legend(ax)            # near the bar: drawn as a line
    assert any("does NOT fit, peak 50.00 GiB is 35.00 GiB over" in t for t in _texts(ax))   # the figure, by name


def test_stages_beside_estimates_marks_the_oom_and_what_never_ran():
    rows = [{"name": "load", "estimate_bytes": 4 * MiB, "measured_bytes": 4 * MiB, "ran": True, "oom": False},
            {"name": "step 1", "estimate_bytes": 16 * MiB, "measured_bytes": None, "ran": True, "oom": True},
            {"name": "later steps", "estimate_bytes": 20 * MiB, "measured_bytes": None, "ran": False, "oom": False}]
    ax = plot.stages_beside_estimates(rows, limit_bytes=8 * MiB, limit_label="memory cap").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["load", "step 1", "later steps"]
    assert [t.get_text() for t in ax.texts if not t.get_text().endswith("MiB")] == ["OOM", "not run"]
    heights = sorted(round(b.get_height(), 3) for b in ax.patches)
    assert heights == [4.0, 4.0, 16.0, 20.0], "three estimates and one measurement, in MiB"
    rows[1].update(oom=False, ran=False)                     # mid-run: the stages to come are "not yet"
    assert "not yet" in [t.get_text() for t in plot.stages_beside_estimates(rows).axes[0].texts]
    with pytest.raises(ValueError, match="no stage is planned"):
        plot.stages_beside_estimates([])
