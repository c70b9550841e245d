"""Any model id: a shipped config first, else only the Hub's config.json (mocked here: no network),
and one sentence for a gated, private, missing or unreachable one."""
import json

import httpx
import huggingface_hub
import pytest
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
from transformers import Qwen2Config

from kit import runtime
from kit.estimate import estimate
from kit.model_configs import get_config


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
