"""Data: wikitext-2 and the real tokenizer from the Hub when reachable, else the shipped ones.

Offline, the text is the opening of *Pride and Prejudice* (public domain, see
``kit/assets/SOURCE.md``) and the tokenizer a 4096-token byte-level BPE trained from
it, whose length equals the tiny twins' vocabulary. The recipe the scenarios need:
drop empty lines, truncate, **no padding at map time**; the collator pads per batch.

>>> tok = load_tokenizer()                                         # doctest: +SKIP
>>> ds = tokenize(load_text_dataset(), tok, max_length=128)         # doctest: +SKIP
>>> batch = collator(tok)([ds["train"][i] for i in range(4)])       # doctest: +SKIP
"""
from __future__ import annotations

from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer, DataCollatorForLanguageModeling, PreTrainedTokenizerFast

from kit import runtime
from kit.assets import TEST_TEXT, TOKENIZER_FILE, TRAIN_TEXT

PAD_TOKEN = "[PAD]"  # the user's pad token, trained into the shipped tokenizer
EOS_TOKEN = "<|endoftext|>"
_PADDINGS = (False, True, "longest", "max_length", "do_not_pad")


def _local_only(model_name: str | None) -> bool:
    return model_name is None or str(model_name).startswith("tiny-")


def load_text_dataset(source: str = "auto") -> DatasetDict:
    """Lines of English text with ``"train"`` and ``"test"`` splits and a ``"text"`` column.

    ``source``: ``"auto"`` (wikitext-2-raw-v1 when the Hub is reachable, else the shipped
    sample), ``"wikitext"`` or ``"shipped"``. Empty lines are kept, as in wikitext.

    >>> ds = load_text_dataset("shipped")
    DATA: shipped sample, Pride and Prejudice ch. 1-23 (public domain) — chosen: source='shipped'
    >>> sorted(ds), ds["train"].column_names
    (['test', 'train'], ['text'])
    """
    if source not in ("auto", "wikitext", "shipped"):
        raise ValueError(f"source must be 'auto', 'wikitext' or 'shipped', not {source!r}.")
    if source == "wikitext" or (source == "auto" and runtime.hub_reachable()):
        from datasets import load_dataset

        # The user's "wikitext" id now lives at Salesforce/wikitext (same data, parquet).
        wiki = load_dataset("Salesforce/wikitext", "wikitext-2-raw-v1")
        runtime.say("DATA: REAL wikitext-2-raw-v1 from the Hub")
        return DatasetDict(train=wiki["train"], test=wiki["test"])
    why = "the Hub is not reachable" if source == "auto" else "chosen: source='shipped'"
    runtime.say(f"DATA: shipped sample, Pride and Prejudice ch. 1-23 (public domain) — {why}")
    return DatasetDict(
        train=Dataset.from_dict({"text": TRAIN_TEXT.read_text(encoding="utf-8").split("\n")}),
        test=Dataset.from_dict({"text": TEST_TEXT.read_text(encoding="utf-8").split("\n")}),
    )


def shipped_tokenizer(model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The shipped 4096-token byte-level BPE, with ``[PAD]`` as its pad token.

    >>> tok = shipped_tokenizer()
    >>> len(tok), tok.pad_token, tok.pad_token_id, tok.eos_token_id
    (4096, '[PAD]', 1, 0)
    """
    return PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER_FILE), bos_token=EOS_TOKEN, eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=model_max_length)


def load_tokenizer(model_name: str | None = None):
    """The model's real tokenizer from the Hub when reachable, else the shipped one.

    A Hub tokenizer without a pad token gets one: ``[PAD]`` added for GPT-2 models, as
    the user did (distilgpt2 then has 50258 tokens), the eos token for the others
    (the usual Llama recipe, which adds no token). Tiny twins and ``None`` always get
    the shipped tokenizer, and so does a model the Hub refuses (gated without a token, or
    missing): it says why and how to get in, and never stops the notebook.

    >>> len(load_tokenizer("tiny-gpt2"))
    TOKENIZER: shipped byte-level BPE, 4096 tokens — tiny twins use it
    4096
    """
    base = str(model_name).removesuffix("+vocab-head") if model_name else None
    if _local_only(base) or not runtime.hub_reachable():
        why = ("no model named" if base is None else "tiny twins use it" if _local_only(base)
               else "the Hub is not reachable")
        tok = shipped_tokenizer()
        runtime.say(f"TOKENIZER: shipped byte-level BPE, {len(tok)} tokens — {why}")
        return tok
    try:
        tok = AutoTokenizer.from_pretrained(base)
    except OSError as exc:  # gated (every Meta Llama needs an accepted licence and a token) or missing
        tok = shipped_tokenizer()
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        runtime.say(f"TOKENIZER: shipped byte-level BPE, {len(tok)} tokens — the Hub refused {base} ({first}); "
                    "memory depends on the shapes, not on which tokens, so the run goes on. For the real one: "
                    "accept the licence on the model's Hub page, then huggingface_hub.login()")
        return tok
    if tok.pad_token is None:
        if "gpt2" in base:
            tok.add_special_tokens({"pad_token": PAD_TOKEN})
        else:
            tok.pad_token = tok.eos_token
    runtime.say(f"TOKENIZER: REAL {base} from the Hub, {len(tok)} tokens, pad {tok.pad_token!r}")
    return tok


def tokenize(dataset, tokenizer, max_length: int = 128, padding=False):
    """Tokenize the ``"text"`` column: drop empty lines, truncate to ``max_length``.

    ``padding=False`` (the default) pads nothing at map time: the collator pads each
    batch. ``padding="max_length"`` is the user's original recipe, kept to compare.
    Works on a ``Dataset`` or a ``DatasetDict``; the text column is removed.

    >>> ds = tokenize(load_text_dataset("shipped"), shipped_tokenizer())  # doctest: +SKIP
    >>> ds["train"].column_names                                        # doctest: +SKIP
    ['input_ids', 'attention_mask']
    """
    if padding not in _PADDINGS:
        raise ValueError(f"padding must be one of {_PADDINGS}, not {padding!r}; the kit's recipe is False.")
    if max_length < 1:
        raise ValueError(f"max_length must be a positive number of tokens, not {max_length!r}.")
    if padding and tokenizer.pad_token is None:
        raise ValueError("padding needs a pad token: use kit.data.load_tokenizer(), which sets one.")

    def one(dataset: Dataset) -> Dataset:
        if "text" not in dataset.column_names:
            raise ValueError(f"expected a 'text' column, found {dataset.column_names}.")
        kept = dataset.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)
        return kept.map(
            lambda batch: tokenizer(batch["text"], truncation=True, max_length=max_length, padding=padding),
            batched=True, remove_columns=dataset.column_names)

    if isinstance(dataset, DatasetDict):
        return DatasetDict({split: one(ds) for split, ds in dataset.items()})
    return one(dataset)


def equal_token_rows(tokenizer, n_tokens: int, n_rows: int) -> list:
    """``n_rows`` text rows of exactly ``n_tokens`` tokens each, cut from the shipped text (offline): chunks that
    re-encode to that length and hold no end-of-text token, so that a batch of them needs no padding."""
    ids = tokenizer(TRAIN_TEXT.read_text(encoding="utf-8"))["input_ids"]
    rows = []
    for start in range(0, len(ids) - n_tokens, n_tokens):
        text = tokenizer.decode(ids[start:start + n_tokens])
        if len(tokenizer(text)["input_ids"]) == n_tokens and tokenizer.eos_token not in text:
            rows.append(text)
        if len(rows) == n_rows:
            return rows
    raise ValueError(f"the shipped text holds only {len(rows)} rows of {n_tokens} tokens; ask for fewer.")


def collator(tokenizer) -> DataCollatorForLanguageModeling:
    """The causal-LM collator: pads each batch to its longest row; labels are the
    input ids with padding set to -100 (ignored by the loss).

    >>> c = collator(shipped_tokenizer())
    >>> c([{"input_ids": [5, 6, 7]}, {"input_ids": [5]}])["input_ids"].shape
    torch.Size([2, 3])
    """
    if tokenizer.pad_token is None:
        raise ValueError("the collator pads, so the tokenizer needs a pad token: use kit.data.load_tokenizer().")
    return DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)


def dataset_bytes(dataset) -> int:
    """Bytes the tokenized data holds in its Arrow tables (all splits of a ``DatasetDict``).

    >>> dataset_bytes(Dataset.from_dict({"input_ids": [[1, 2, 3]]}))  # 3 int32 ids + a 4-byte offset
    16
    """
    if isinstance(dataset, DatasetDict):
        return sum(dataset_bytes(split) for split in dataset.values())
    # A filtered or selected Dataset keeps the whole parent table plus an index
    # mapping; flatten it so only the rows the dataset holds are counted.
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    return int(dataset.data.nbytes)
