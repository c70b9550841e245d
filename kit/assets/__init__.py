"""Files the kit ships so it runs offline: a public-domain English text sample
(``austen_train.txt``, ``austen_test.txt``, see ``SOURCE.md``) and a byte-level BPE
tokenizer trained from it (``tokenizer.json``; rebuild: ``python -m kit.assets.build_tokenizer``).
"""
from kit.assets.paths import ASSETS_DIR, TEST_TEXT, TOKENIZER_FILE, TRAIN_TEXT

__all__ = ["ASSETS_DIR", "TRAIN_TEXT", "TEST_TEXT", "TOKENIZER_FILE"]
