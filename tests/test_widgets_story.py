"""Each scenario's story on the panel (issue 49 item 1), driven headless: scenario 1's head control and scenario 2's
fold loop, judged at real size in smoke mode too (conftest sets KIT_SMOKE=1)."""

import pytest

from kit.inputs import InputError
from kit import panel

pytestmark = pytest.mark.filterwarnings("ignore")


def _verdict(p) -> str:
    return "DOES NOT FIT" if "DOES NOT FIT" in p.estimate_html.value else "FITS"


def test_the_head_control_tells_scenario_1s_story():
    """DOES NOT FIT until the head changes to a low-rank one or none; fix (c), the 16-bit V x V head, still does not
    fit a T4, and the reason says why. Each head's estimate is the notebook's own fix (kit.scenarios.custom_head)."""
    from kit.scenarios.custom_head import scenario as s1

    p = panel(scenario=1)
    assert [v for _, v in p.controls["head"].options] == ["vxv", "low-rank", "none", "vxv-16bit"]
    assert p.controls["head"].value == "vxv" and p.controls["head_rank"].disabled
    assert _verdict(p) == "DOES NOT FIT" and "2,525,916,822 trainable" in p.reasons["head"].value
    p.controls["head"].value = "vxv-16bit"                       # fix (c)
    fix_c = s1.estimate_fix("c", "real", dtype="fp16")           # a T4: fp16, 8-bit AdamW refused on the head
    assert _verdict(p) == "DOES NOT FIT" and p.estimate.peak_bytes == fix_c.peak_bytes
    assert p.controls["optimizer"].value == "adamw-fused" and p.controls["optimizer"].disabled
    assert p.controls["precision"].value == "fp32" and "set by fix (c)" in p.reasons["precision"].value
    why = p.reasons["head"].value
    assert "8-bit AdamW is refused" in why and "2**31 - 1" in why and "14.11 GiB" in why, why
    p.controls["head"].value = "low-rank"                        # fix (b), at the notebook's rank
    assert not p.controls["head_rank"].disabled and p.controls["head_rank"].value == s1.RANK["real"]
    assert _verdict(p) == "FITS" and p.estimate.peak_bytes == s1.estimate_fix("b", "real").peak_bytes
    assert p.controls["precision"].value == "fp16" and not p.controls["optimizer"].disabled, "(c)'s given back"
    small = p.estimate.trainable_params
    p.controls["head_rank"].value = 1024
    assert p.estimate.trainable_params == 2 * 50258 * 1024 + 50258 > small
    p.controls["head"].value = "none"                            # fix (a)
    assert _verdict(p) == "FITS" and p.estimate.peak_bytes == s1.estimate_fix("a", "real").peak_bytes
    assert p.estimate.setup["model"] == "distilgpt2" and p.run_setup()["model"] == "tiny-gpt2"
    p.controls["head"].value = "low-rank"
    assert p.run_button.disabled and "notebook 01 measures fix (b)" in p.run_why.value
    p.controls["model"].value = "distilgpt2"                     # no V x V head to change
    assert p.controls["head"].disabled and "no V×V head" in p.reasons["head"].value


def test_bad_story_options_are_refused_by_name():
    with pytest.raises(InputError, match="head must be one of"):
        panel(scenario=1, head="square")
    with pytest.raises(InputError, match="head_rank"):
        panel(scenario=1, head_rank=4096)
    with pytest.raises(InputError, match="folds"):
        panel(scenario=2, folds=1)
    with pytest.raises(ValueError, match="unknown panel options"):
        panel(scenario=1, folds=3)                               # scenario 2's, not 1's


def test_the_fold_loop_shows_fold_2s_load_against_the_device():
    """Scenario 2's user's loop (the model loaded each fold, the old Trainer kept, 2024's recipe) puts fold 2's load
    over a T4, two models alive; the fixed loop (loaded once, the Trainer released) keeps it under. The figures are
    notebook 02's fold arithmetic (kit.scenarios.cross_validation.predict), and .estimate stays one fold's step."""
    from kit.scenarios.cross_validation import predict

    p = panel(scenario=2)
    t4 = p.preset().gpu_bytes
    assert (p.controls["folds"].value, p.controls["load"].value, p.controls["trainer"].value,
            p.controls["recipe"].value) == (5, "each", "kept", "2024")
    folds = p.story.timeline(p.estimate)
    expected = predict.fold2_prediction(p.estimate)
    assert len(folds) == 5 and folds[1]["load_peak_bytes"] == expected["load_peak_bytes"] > t4
    assert [f["models_at_load"] for f in folds] == [1, 2, 2, 2, 2]
    assert "FOLD 2 DOES NOT FIT" in p.story_html.value and "2 models alive" in p.story_html.value
    assert p.story_html.value.count("class='kit-fold'") == 5 and "dashed" in p.story_html.value
    assert p.estimate.setup["kbit_recipe"] == "standard" and p.verdict.fits, "one fold's step fits: the loop fails"
    one_fold = p.estimate.peak_bytes
    p.controls["load"].value = "once"                            # the fixed loop
    p.controls["trainer"].value = "released"
    folds = p.story.timeline(p.estimate)
    assert folds[1]["load_peak_bytes"] is None and max(f["train_peak_bytes"] for f in folds) <= t4
    assert "fold 2 fits" in p.story_html.value and p.estimate.peak_bytes == one_fold
    p.controls["load"].value = "each"                            # reloaded, the old Trainer released: one model
    folds = p.story.timeline(p.estimate)
    assert folds[1]["models_at_load"] == 1 and folds[1]["load_peak_bytes"] < t4
    p.controls["trainer"].value = "kept"
    p.controls["recipe"].value = "lean"                          # today's TRL: no upcast, fold 2 loads under a T4
    assert p.estimate.setup["kbit_recipe"] == "lean" and "fold 2 fits" in p.story_html.value
    p.controls["folds"].value = 3
    assert p.story_html.value.count("class='kit-fold'") == 3


def test_the_panel_says_tight_under_the_margin_never_fits():
    """Issue 49 item 5: the panel keeps the advisor's margin (kit.presets.MODELLED_MARGIN) while its figures are
    modelled: a setup 1% under a device's limit is TIGHT, and the largest batch that fits leaves the margin too."""
    from kit.advise import limit_for, max_batch_size
    from kit.presets import MODELLED_MARGIN

    setup = dict(model="tiny-llama", quantization="none", lora_r=0, batch_size=4, seq_len=128)
    device = int(panel(scenario=2, **setup).estimate.reserved_bytes * 1.01)
    p = panel(scenario=2, preset=str(device), **setup)
    p.advice_view.rest_s = None
    assert p.verdict.tight and not p.verdict.fits
    assert "TIGHT" in p.estimate_html.value and "FITS" not in p.estimate_html.value
    assert f"under the {MODELLED_MARGIN:.0%} margin" in p.estimate_html.value
    largest = max_batch_size({**p.setup(), "device": "cuda"}, device)
    assert largest < 4 and f"largest batch that fits: <b>{largest}</b>" in p.advice_view.largest_html.value
    p.advice_view.ask()
    assert all(s.reserved_bytes <= limit_for(device).usable_bytes for s in p.advice_view.rows if s.fits)
    assert f"less the {MODELLED_MARGIN:.0%} margin" in p.advice_view.header.value
