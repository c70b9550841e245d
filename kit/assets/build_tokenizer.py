"""Rebuild ``kit/assets/tokenizer.json``: byte-level BPE (like GPT-2) trained on the shipped text.

The vocabulary has 4096 entries, special tokens included: ``<|endoftext|>`` (id 0:
bos, eos and unk, as in GPT-2) and ``[PAD]`` (id 1, the user's pad token), trained
in so that ``len(tokenizer) == 4096 ==`` the tiny twins' ``vocab_size``.
Training is deterministic, so the file comes out the same every time.

    python -m kit.assets.build_tokenizer
"""
from __future__ import annotations

import json
import os
import sys

from kit.assets import TOKENIZER_FILE, TRAIN_TEXT

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "[PAD]"]  # ids 0 and 1, in this order


def build():
    """Train the tokenizer from ``austen_train.txt`` and return it (a ``tokenizers.Tokenizer``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = [line for line in TRAIN_TEXT.read_text(encoding="utf-8").splitlines() if line.strip()]
    tok.train_from_iterator(lines, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}: the text is too small")
    return tok


def main() -> None:
    tok = build()
    # Compact JSON with sorted keys: small, and the same bytes on every rebuild.
    text = json.dumps(json.loads(tok.to_str()), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    TOKENIZER_FILE.write_text(text + "\n", encoding="utf-8")
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    print(f"wrote {TOKENIZER_FILE} ({TOKENIZER_FILE.stat().st_size} bytes, {tok.get_vocab_size()} tokens, {ids})")


if __name__ == "__main__":
    sys.exit(main())
