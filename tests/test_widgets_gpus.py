"""The panel's GPUs control and strategy choice: the estimate becomes one GPU's of N, and a Run is refused."""
import pytest

from kit.estimate import estimate
from kit import panel

pytestmark = pytest.mark.filterwarnings("ignore")


def test_gpus_and_strategy_make_the_estimate_per_gpu():
    p = panel(scenario=2)   # Llama-3-8B QLoRA, in smoke mode too
    one = p.estimate
    assert p.controls["strategy"].value == "single" and p.controls["num_gpus"].value == 1
    assert not p.run_button.disabled and "EACH GPU" not in p.estimate_html.value
    p.controls["num_gpus"].value = 4           # more GPUs on "one GPU": DDP, as accelerate launch does
    assert p.controls["strategy"].value == "ddp" and p.estimate.num_gpus == 4
    assert p.estimate.peak_bytes == estimate(**p.setup(), strategy="ddp", num_gpus=4, device="cuda").peak_bytes
    assert p.estimate.peak_bytes == one.peak_bytes + one.gradients_bytes     # DDP's buckets
    assert "EACH GPU (4 x, ddp)" in p.estimate_html.value
    assert p.run_button.disabled and "one process" in p.run_why.value
    p.controls["strategy"].value = "fsdp"
    assert p.estimate.weights_bytes < one.weights_bytes and "communication buffers" in p.details_html.value
    p.controls["num_gpus"].value = 1
    p.controls["strategy"].value = "single"
    assert p.estimate.to_json() == one.to_json() and not p.run_button.disabled


def test_an_applied_shard_suggestion_sets_the_two_controls():
    p = panel(scenario=2)
    p.apply_options({**p.setup(), "strategy": "fsdp", "num_gpus": 8})
    assert (p.controls["strategy"].value, p.controls["num_gpus"].value) == ("fsdp", 8) and p.extra == {}
    assert p.estimate.num_gpus == 8 and p.estimate.strategy == "fsdp"
    assert p.advanced.value and p.rows["strategy"].layout.display is None, "a shard suggestion shows its rows"


def test_more_than_one_gpu_hides_behind_the_advanced_switch():
    """A learner in smoke mode is not offered ZeRO-3 and 64 GPUs by default: the rows show under "advanced", and
    turning it off goes back to one GPU."""
    p = panel(scenario=1)
    assert not p.advanced.value and {p.rows[k].layout.display for k in ("strategy", "num_gpus")} == {"none"}
    assert p.advanced in p.widget.children and "strategy" in p.controls and "num_gpus" in p.controls
    p.advanced.value = True
    assert p.rows["strategy"].layout.display is None and p.rows["num_gpus"].layout.display is None
    p.controls["strategy"].value, p.controls["num_gpus"].value = "zero3", 8
    assert p.estimate.num_gpus == 8 and "EACH GPU (8 x, zero3)" in p.estimate_html.value
    p.advanced.value = False
    assert (p.controls["strategy"].value, p.controls["num_gpus"].value) == ("single", 1)
    assert "EACH GPU" not in p.estimate_html.value and not hasattr(p.estimate, "num_gpus")   # one GPU's Estimate
    assert panel(scenario=2, num_gpus=4).advanced.value, "asked for in code: shown"
