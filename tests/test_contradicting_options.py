"""Options that contradict the model, or each other, are refused in one sentence naming the option (or honoured),
never dropped without a word."""
import pytest
import torch.nn as nn
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import kit
from kit.estimate import estimate, estimate_from
from kit.inputs import InputError
from kit.models import get_config


@pytest.fixture(scope="module")
def causal_lm():
    return AutoModelForCausalLM.from_config(get_config("tiny-gpt2"))


@pytest.fixture(scope="module")
def classifier():
    cfg = get_config("tiny-bert")
    cfg.num_labels = 3
    return AutoModelForSequenceClassification.from_config(cfg)


def _refused(fn, name, code, *words):
    with pytest.raises(InputError) as caught:
        fn()
    assert (caught.value.name, caught.value.code) == (name, code), caught.value
    for w in words:
        assert w in str(caught.value)


def test_a_task_that_contradicts_a_built_model_is_refused(causal_lm, classifier):
    _refused(lambda: estimate(causal_lm, batch_size=2, seq_len=16, task="seq-cls"), "task",
             "task-contradicts-model", "task='seq-cls' contradicts this GPT2LMHeadModel, a causal-lm model")
    for fn in (lambda: estimate(classifier, batch_size=2, seq_len=16, task="token-cls"),
               lambda: estimate_from(classifier, seq_len=16, task="token-cls")):
        _refused(fn, "task", "task-contradicts-model", "contradicts this BertForSequenceClassification, a seq-cls")


def test_num_labels_that_contradict_a_built_classifier_are_refused(classifier):
    for fn in (lambda: estimate(classifier, batch_size=2, seq_len=16, num_labels=7),
               lambda: estimate_from(classifier, seq_len=16, num_labels=7)):
        _refused(fn, "num_labels", "num-labels-contradicts-model", "num_labels=7", "gives 3 labels")
    # what the model says is taken, given or not
    assert estimate(classifier, batch_size=2, seq_len=16, num_labels=3).peak_bytes == \
        estimate(classifier, batch_size=2, seq_len=16).peak_bytes
    assert estimate_from(classifier, seq_len=16).setup["task"] == "seq-cls"


def test_num_labels_that_contradict_a_head_of_ones_own_are_refused():
    class Own(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = AutoModel.from_config(get_config("tiny-llama"))
            self.head = nn.Linear(self.encoder.config.hidden_size, 3)

        def forward(self, input_ids, attention_mask=None, labels=None):
            return {"logits": self.head(self.encoder(input_ids=input_ids).last_hidden_state[:, 0])}

    _refused(lambda: estimate_from(Own(), seq_len=16, num_labels=7), "num_labels", "num-labels-contradicts-model",
             "whose classifier gives 3 labels")


def test_num_labels_without_a_classifier_task_is_refused(run_kit):
    _refused(lambda: estimate("tiny-gpt2", batch_size=2, seq_len=16, num_labels=3), "num_labels",
             "num-labels-without-classifier", "pass task='seq-cls' or 'token-cls'")
    code, out, err = run_kit("estimate", "--model", "tiny-gpt2", "--batch-size", "2", "--seq-len", "16",
                             "--num-labels", "3")
    assert code != 0 and "--num-labels" in out + err and "pass task='seq-cls'" in out + err
    code, out, _ = run_kit("estimate", "--model", "tiny-bert", "--batch-size", "2", "--seq-len", "16",
                           "--task", "seq-cls", "--num-labels", "3")
    assert code == 0 and out.startswith("fits")


def test_check_of_an_estimate_refuses_a_seq_len_it_cannot_honour_and_reads_details_as_a_flag(capsys):
    est = estimate("tiny-gpt2", batch_size=2, seq_len=64)
    _refused(lambda: kit.check(est, seq_len=10), "seq_len", "seq-len-of-an-estimate", "made for seq_len 64")
    kit.check(est, details="no")
    brief = capsys.readouterr().out
    kit.check(est, details="yes")
    full = capsys.readouterr().out
    assert "details: kit.check(..., details=True)" in brief and "where each setting" not in brief.split("details:")[0]
    assert len(full.splitlines()) > len(brief.splitlines()) and "details: kit.check" not in full
    _refused(lambda: kit.check(est, details="maybe"), "details", "invalid")
