"""Data: the shipped text and tokenizer, and the no-padding-at-map-time recipe."""
import json

import pytest

from kit import data, models
from kit.assets import ASSETS_DIR, TOKENIZER_FILE, build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return data.shipped_tokenizer()


@pytest.fixture(scope="module")
def text():
    return data.load_text_dataset()


def test_offline_text_is_the_shipped_sample(text, capsys):
    data.load_text_dataset()
    assert "DATA: shipped sample" in capsys.readouterr().out
    assert set(text) == {"train", "test"} and text["train"].column_names == ["text"]
    lines = text["train"]["text"]
    assert lines[2].startswith("It is a truth universally acknowledged")
    assert "" in lines  # empty lines between paragraphs, like wikitext
    assert len(text["train"]) > 1000 and len(text["test"]) > 100
    shipped_bytes = sum((ASSETS_DIR / f).stat().st_size for f in ("austen_train.txt", "austen_test.txt"))
    assert shipped_bytes < 400 * 1024
    source = (ASSETS_DIR / "SOURCE.md").read_text()
    assert "public domain" in source and "janeaustenr" in source


def test_tokenizer_length_is_the_tiny_vocab_and_pad_is_set(tok, capsys):
    assert len(data.load_tokenizer("tiny-llama")) == len(tok)
    assert "TOKENIZER: shipped" in capsys.readouterr().out
    assert len(tok) == models.get_config("tiny-gpt2").vocab_size == models.get_config("tiny-llama").vocab_size
    assert tok.pad_token == "[PAD]" and tok.pad_token_id == 1 and tok.eos_token_id == 0
    ids = tok("It is a truth universally acknowledged")["input_ids"]
    assert tok.decode(ids) == "It is a truth universally acknowledged" and max(ids) < len(tok)


def test_offline_tokenizer_for_a_hub_model_says_why(capsys):
    data.load_tokenizer("distilgpt2")
    assert "the Hub is not reachable" in capsys.readouterr().out


def test_rebuild_gives_the_shipped_tokenizer_file():
    shipped = json.loads(TOKENIZER_FILE.read_text(encoding="utf-8"))
    assert json.loads(build_tokenizer.build().to_str()) == shipped
    assert TOKENIZER_FILE.stat().st_size < 512 * 1024


def test_tokenize_drops_empty_lines_truncates_and_does_not_pad(text, tok):
    ds = data.tokenize(text, tok, max_length=32)
    nonempty = [t for t in text["train"]["text"] if t.strip()]
    assert len(ds["train"]) == len(nonempty) < len(text["train"])
    assert set(ds["train"].column_names) == {"input_ids", "attention_mask"}
    lengths = [len(ids) for ids in ds["train"]["input_ids"]]
    assert min(lengths) > 0 and max(lengths) == 32  # truncated
    assert min(lengths) < 32  # short lines stay short: nothing padded
    assert all(tok.pad_token_id not in ids for ids in ds["train"]["input_ids"])


def test_collator_pads_each_batch_to_its_longest_row(text, tok):
    ds = data.tokenize(text, tok, max_length=128)["train"]
    rows = [ds[i] for i in range(6)]
    longest = max(len(r["input_ids"]) for r in rows)
    assert longest < 128
    batch = data.collator(tok)(rows)
    assert tuple(batch["input_ids"].shape) == (6, longest)
    shortest = min(range(6), key=lambda i: len(rows[i]["input_ids"]))
    n = len(rows[shortest]["input_ids"])
    assert (batch["input_ids"][shortest, n:] == tok.pad_token_id).all()
    assert (batch["labels"][shortest, n:] == -100).all()
    assert (batch["attention_mask"][shortest, n:] == 0).all()


def test_max_length_padding_holds_more_bytes_than_dynamic(text, tok):
    dynamic = data.tokenize(text, tok, max_length=128)
    padded = data.tokenize(text, tok, max_length=128, padding="max_length")
    assert all(len(ids) == 128 for ids in padded["train"]["input_ids"])
    assert data.dataset_bytes(padded) > 1.5 * data.dataset_bytes(dynamic) > 0


def test_bad_input_is_a_clear_error(text, tok):
    with pytest.raises(ValueError, match="padding"):
        data.tokenize(text, tok, padding="pt")
    with pytest.raises(ValueError, match="source"):
        data.load_text_dataset("wiki")
    with pytest.raises(ValueError, match="'text' column"):
        data.tokenize(data.tokenize(text["test"], tok), tok)


def test_a_gated_tokenizer_without_a_token_falls_back_and_says_how_to_get_in(monkeypatch, capsys):
    # As the Hub answers meta-llama/* without a token; the notebook must go on (memory needs only the shapes).
    import transformers

    def gated(name, *a, **kw):
        raise OSError(f"You are trying to access a gated repo.\nMake sure to have access to it at "
                      f"https://huggingface.co/{name}.")

    monkeypatch.setattr(data.runtime, "hub_reachable", lambda: True)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", gated)
    tok = data.load_tokenizer("meta-llama/Llama-3.2-1B")
    out = capsys.readouterr().out
    assert len(tok) == len(data.shipped_tokenizer()) and tok.pad_token == data.PAD_TOKEN
    assert "refused meta-llama/Llama-3.2-1B (You are trying to access a gated repo.)" in out
    assert "huggingface_hub.login()" in out
