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


def test_cli_help_and_info(run_kit):
    code, out, _ = run_kit("--help")
    assert code == 0
    for cmd in ("info", "estimate", "demo"):
        assert cmd in out
    code, out, err = run_kit("info")
    assert code == 0, err
    assert "Reading now:" in out and "RSS" in out


def test_prediction_never_imports_the_readings():
    """estimate, plot and units never import device, so prediction runs anywhere."""
    code = ("import sys, kit.estimate, kit.plot, kit.units; "
            "print('kit.measure.device' in sys.modules, 'psutil' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


def test_kit_panel_is_the_widget_panel():
    import kit
    from kit.widgets import build as widgets

    assert kit.panel is widgets.panel  # the README's contract: kit.panel(scenario=1|2)


# -- issue 35: environment variables read as their readers read them -----------------------------------------------
import os                                                           # noqa: E402

import pytest                                                       # noqa: E402

from kit.inputs import InputError                                   # noqa: E402

CUDA_CONF, CONF = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"


def test_i35_3_a_junk_gpu_cap_is_one_line_and_no_traceback():
    run = subprocess.run([sys.executable, "-m", "kit", "info"], capture_output=True, text=True,
                         env={**os.environ, "KIT_GPU_CAP_BYTES": "junk"})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.splitlines() == [
        "error: KIT_GPU_CAP_BYTES must be a positive whole number of bytes, such as 15633680957 (a Colab T4's "
        "14.56 GiB), not 'junk'."], run.stderr


@pytest.mark.parametrize("value, smoke", [("on", True), ("Yes", True), ("true", True), ("1", True),
                                          ("off", False), ("no", False), ("FALSE", False), ("0", False)])
def test_i35_10_kit_smoke_reads_the_usual_words(monkeypatch, value, smoke):
    monkeypatch.setenv("KIT_SMOKE", value)
    assert runtime.mode() == ("smoke" if smoke else "real")


def test_i35_10_kit_smoke_refuses_a_word_it_does_not_know(monkeypatch):
    monkeypatch.setenv("KIT_SMOKE", "junk")
    with pytest.raises(InputError) as e:
        runtime.mode()
    assert e.value.name == "KIT_SMOKE" and str(e.value) == (
        "KIT_SMOKE must be 1 or 0 (or true/false, yes/no, on/off), not 'junk': 1 runs tiny twins, 0 real sizes; "
        "unset, the kit picks tiny twins without a GPU."), str(e.value)


@pytest.mark.parametrize("environ, expandable, ignored", [
    ({CUDA_CONF: "expandable_segments:True"}, True, []),
    ({CUDA_CONF: " expandable_segments : True "}, True, []),              # torch skips spaces
    ({CUDA_CONF: "expandable_segments:True,expandable_segments:False"}, False, []),   # the last one wins
    ({CUDA_CONF: "max_split_size_mb:128,expandable_segments:True"}, True, ["max_split_size_mb"]),
    ({CUDA_CONF: "garbage_collection_threshold:0.6"}, False, ["garbage_collection_threshold"]),
    ({CUDA_CONF: "roundup_power2_divisions:[64:8,256:4,>:1],expandable_segments:True"}, True,
     ["roundup_power2_divisions"]),
    ({CONF: "expandable_segments:True"}, True, []),
    ({CUDA_CONF: "max_split_size_mb:128", CONF: "expandable_segments:True"}, False, ["max_split_size_mb"]),
    ({}, False, []),
])
def test_i35_9_the_allocator_settings_are_read_as_torch_reads_them(environ, expandable, ignored):
    conf = runtime.allocator_conf(environ)
    assert (conf.expandable, conf.ignored) == (expandable, ignored)


@pytest.mark.parametrize("value", ["expandable_segments:true", "expandable_segments:1", "expandable_segments:junk",
                                   "expandable_segments"])
def test_i35_9_a_value_torch_refuses_is_refused_in_one_sentence(value):
    with pytest.raises(InputError) as e:
        runtime.allocator_conf({CUDA_CONF: value})
    assert e.value.name == CUDA_CONF and str(e.value).startswith(
        f"{CUDA_CONF}={value!r}: torch accepts only True or False for expandable_segments"), str(e.value)


@pytest.mark.skipif(runtime.has_cuda(), reason="sets the live allocator's settings: only where no GPU uses them")
@pytest.mark.parametrize("value", ["expandable_segments:True", "expandable_segments:true", "expandable_segments:1",
                                   "expandable_segments:junk", " expandable_segments : True ",
                                   "max_split_size_mb:128,expandable_segments:False"])
def test_i35_9_the_kit_refuses_exactly_what_torchs_own_parser_refuses(value):
    import torch

    try:
        torch._C._accelerator_setAllocatorSettings(value)   # torch's own parser (c10 AcceleratorAllocatorConfig)
        torch_refuses = False
    except ValueError:
        torch_refuses = True
    finally:
        torch._C._accelerator_setAllocatorSettings("")
    try:
        runtime.allocator_conf({CUDA_CONF: value})
        kit_refuses = False
    except InputError:
        kit_refuses = True
    assert kit_refuses == torch_refuses


def test_i35_9_the_estimate_notes_a_setting_its_allocator_model_ignores(monkeypatch):
    from kit.estimate import estimate

    monkeypatch.setenv(CUDA_CONF, "max_split_size_mb:128")
    monkeypatch.delenv(CONF, raising=False)
    est = estimate("tiny-llama", batch_size=1, seq_len=32)
    note = next(n for n in est.notes if getattr(n, "code", None) == "alloc-conf-ignored")
    assert note.startswith(f"{CUDA_CONF} sets max_split_size_mb, which the reserved figure's allocator model "
                           "ignores"), note
    monkeypatch.setenv(CUDA_CONF, "expandable_segments:true")
    with pytest.raises(InputError, match="torch accepts only True or False for expandable_segments"):
        estimate("tiny-llama", batch_size=1, seq_len=32)
    assert estimate("tiny-llama", batch_size=1, seq_len=32, expandable_segments=True).expandable_segments
