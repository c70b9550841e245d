"""Any model id: a shipped config first, else only the Hub's config.json (mocked here: no network),
and one sentence for a gated, private, missing or unreachable one."""
import json
import re

import httpx
import huggingface_hub
import pytest
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
from transformers import Qwen2Config

from kit import runtime
from kit.estimate import estimate
from kit.model_configs import CONFIG_DIR, get_config


def _response(status: int):
    return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x/y/resolve/main/config.json"))


@pytest.fixture
def tiny_qwen(tmp_path):
    cfg = Qwen2Config(vocab_size=4096, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    path = tmp_path / "config.json"
    cfg.to_json_file(path)
    return path


@pytest.fixture
def hub(monkeypatch):
    """A Hub that answers; ``calls`` records each hf_hub_download call, ``answer`` what it does."""
    from kit import model_configs

    calls, state = [], {}
    monkeypatch.setattr(model_configs, "_HUB_CONFIGS", {})

    def download(repo_id, filename, **kw):
        calls.append((repo_id, filename, kw))
        result = state["answer"](repo_id)
        return str(result)

    monkeypatch.setattr(runtime, "hub_reachable", lambda *a, **k: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return calls, state


def test_a_hub_id_fetches_only_its_config_and_estimates_like_the_file(hub, tiny_qwen):
    calls, state = hub
    state["answer"] = lambda repo: tiny_qwen
    est = estimate("someone/tiny-qwen", batch_size=2, seq_len=32)
    assert calls == [("someone/tiny-qwen", "config.json", {"local_files_only": False})]   # never weights
    assert est.to_json() | {"setup": None} == estimate(tiny_qwen, batch_size=2, seq_len=32).to_json() | {"setup": None}
    assert get_config("someone/tiny-qwen").kit_name == "someone/tiny-qwen"


def test_a_shipped_name_never_asks_the_hub(hub):
    calls, state = hub
    state["answer"] = lambda repo: pytest.fail("the Hub was asked for a shipped config")
    assert get_config("meta-llama/Meta-Llama-3-8B").num_hidden_layers == 32 and calls == []


@pytest.mark.parametrize("error,words", [
    (lambda: GatedRepoError("gated", response=_response(401)), ["is gated", "login", "config.json"]),
    (lambda: RepositoryNotFoundError("missing", response=_response(404)), ["not on the Hub", "private", "spelling"]),
    (lambda: HfHubHTTPError("forbidden", response=_response(403)), ["refused", "(403)", "log in"]),
])
def test_gated_private_and_refused_repositories_get_one_sentence(hub, error, words):
    calls, state = hub

    def raise_it(repo):
        raise error()

    state["answer"] = raise_it
    with pytest.raises(ValueError) as info:
        estimate("meta-llama/Llama-3.1-70B", batch_size=1, seq_len=128)
    text = str(info.value)
    assert all(w in text for w in words), text
    assert "\n" not in text and "Traceback" not in text


def test_offline_the_cache_alone_is_asked_and_a_miss_says_what_to_pass(monkeypatch):
    from kit import model_configs

    monkeypatch.setattr(model_configs, "_HUB_CONFIGS", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    seen = []

    def download(repo_id, filename, **kw):
        seen.append(kw)
        from huggingface_hub.errors import LocalEntryNotFoundError
        raise LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    with pytest.raises(ValueError, match=r"cannot be reached from here to fetch its config\.json\. Known names"):
        get_config("Qwen/Qwen2.5-3B")
    assert seen == [{"local_files_only": True}]     # no 47 s hang: the network is not tried


def test_a_name_that_cannot_be_a_hub_id_is_refused_without_asking(hub):
    calls, state = hub
    with pytest.raises(ValueError, match="no known name, no file and no Hub id"):
        get_config("not a model!")
    assert calls == []


def test_a_config_that_needs_remote_code_is_refused_in_words(hub, tmp_path):
    calls, state = hub
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "my_custom_arch", "auto_map": {"AutoConfig": "x.Config"}}))
    state["answer"] = lambda repo: path
    with pytest.raises(ValueError, match="remote code, which the kit never runs"):
        get_config("someone/custom")


@pytest.mark.parametrize("change, words", [
    ({"hidden_size": -64}, "hidden_size is -64, and a model needs it a whole number >= 1"),
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0, and a model needs it a whole number >= 1"),
    ({"num_attention_heads": 5, "num_key_value_heads": 5}, "not a multiple of the number of attention heads (5)"),
    ({"hidden_size": "64"}, "Field 'hidden_size' expected int, got str"),
])
def test_i50_2_a_config_with_a_bad_size_is_refused_by_its_field(tmp_path, change, words):
    from kit.inputs import InputError

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads((CONFIG_DIR / "tiny-llama.json").read_text()), **change}))
    with pytest.raises(InputError, match=re.escape(words)) as caught:
        estimate(str(path), batch_size=1, seq_len=64)
    assert caught.value.code == "bad-config" and caught.value.name == "model" and "fix" in str(caught.value)


def test_i50_2_a_pretrained_config_with_a_size_set_wrong_after_it_was_built_is_refused():
    from kit.inputs import InputError

    cfg = get_config("tiny-gpt2")
    cfg.n_layer = 0   # GPT-2 spells num_hidden_layers n_layer: the sentence uses the config's own spelling
    with pytest.raises(InputError, match="n_layer is 0"):
        estimate(cfg, batch_size=1, seq_len=64)


def test_i50_2_the_vocab_head_model_with_a_classifier_task_is_refused_naming_the_task():
    from kit.inputs import InputError

    with pytest.raises(InputError, match="has no seq-cls head: drop the task, or pass the base model "
                                         r"\(distilgpt2\)") as caught:
        estimate("distilgpt2+vocab-head", batch_size=1, seq_len=64, task="seq-cls")
    assert caught.value.name == "task" and caught.value.code == "contradicts"
