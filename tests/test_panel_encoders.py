"""The panel's model list holds the shipped encoders, and its task control takes an encoder under a classifier head:
picked or typed in, an encoder gets an estimate, not "pass task='seq-cls'"."""
import pytest

import kit
from kit.model_configs import ENCODERS
from kit.widgets.models import MODELS


@pytest.fixture(scope="module")
def panel():
    return kit.panel(1)


def test_the_model_list_holds_every_shipped_encoder():
    for scenario in (1, 2):
        missing = sorted(set(ENCODERS) - set(MODELS[scenario]))
        assert not missing, missing


def test_an_encoder_picked_is_estimated_under_a_classifier_head(panel):
    c = panel.controls
    c["model"].value = "tiny-bert"
    assert panel.problem is None and c["task"].value == "seq-cls" and panel.estimate.setup["task"] == "seq-cls"
    assert "encoder" in panel.reasons["task"].value and "classifier" in panel.run_reason
    c["task"].value = "token-cls"
    assert panel.problem is None and panel.estimate.setup["task"] == "token-cls"
    c["task"].value = "causal-lm"   # an encoder has no causal-LM head: the control goes back to a classifier
    assert c["task"].value == "seq-cls" and panel.problem is None
    c["model"].value = "tiny-gpt2"
    c["task"].value = "causal-lm"
    assert panel.problem is None and panel.estimate.setup.get("task", "causal-lm") == "causal-lm"


def test_an_encoder_typed_in_is_used(panel):
    assert panel.use_model("tiny-modernbert"), panel.model_message.value
    assert "pass task" not in panel.model_message.value and panel.controls["task"].value == "seq-cls"
    assert panel.problem is None
