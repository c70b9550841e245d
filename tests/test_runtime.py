"""Smoke/real choice, Hub check, and the CLI's entry point."""
import subprocess
import sys

from kit import runtime


def test_offline_flag_means_no_hub_at_once():
    runtime.hub_reachable.cache_clear()
    assert runtime.hub_reachable() is False  # conftest sets HF_HUB_OFFLINE=1


def test_mode_follows_kit_smoke(monkeypatch):
    monkeypatch.setenv("KIT_SMOKE", "1")
    assert runtime.mode() == "smoke" and runtime.is_smoke()
    assert "SMOKE" in runtime.mode_reason() and "KIT_SMOKE=1" in runtime.mode_reason()
    monkeypatch.setenv("KIT_SMOKE", "0")
    assert runtime.mode() == "real"
    assert "twins" in runtime.mode_reason()  # offline: real sizes come from architecture twins


def test_mode_without_flag_picks_smoke_on_cpu(monkeypatch):
    monkeypatch.delenv("KIT_SMOKE", raising=False)
    monkeypatch.setattr(runtime, "has_cuda", lambda: False)
    assert runtime.mode() == "smoke"
    assert "no GPU" in runtime.mode_reason()
    monkeypatch.setattr(runtime, "has_cuda", lambda: True)
    assert runtime.mode() == "real"


def test_describe_names_libraries_and_hub():
    text = runtime.describe()
    for word in ("GPU:", "RAM:", "torch", "transformers", "Hub: NOT reachable"):
        assert word in text


def test_cli_help_and_info():
    help_ = subprocess.run([sys.executable, "-m", "kit", "--help"], capture_output=True, text=True)
    assert help_.returncode == 0
    for cmd in ("info", "estimate", "demo"):
        assert cmd in help_.stdout
    info = subprocess.run([sys.executable, "-m", "kit", "info"], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert "Reading now:" in info.stdout and "RSS" in info.stdout


def test_prediction_never_imports_the_readings():
    """estimate, plot and units never import device, so prediction runs anywhere."""
    code = "import sys, kit.estimate, kit.plot, kit.units; print('kit.measure.device' in sys.modules, 'psutil' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


def test_kit_panel_is_the_widget_panel():
    import kit
    from kit.widgets import build as widgets

    assert kit.panel is widgets.panel  # the README's contract: kit.panel(scenario=1|2)
