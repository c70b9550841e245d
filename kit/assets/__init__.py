"""Files the kit ships so it runs offline: a public-domain English text sample
(``austen_train.txt``, ``austen_test.txt``, see ``SOURCE.md``) and a byte-level BPE
tokenizer trained from it (``tokenizer.json``; rebuild: ``python -m kit.assets.build_tokenizer``).
"""
from pathlib import Path

ASSETS_DIR = Path(__file__).parent
TRAIN_TEXT = ASSETS_DIR / "austen_train.txt"
TEST_TEXT = ASSETS_DIR / "austen_test.txt"
TOKENIZER_FILE = ASSETS_DIR / "tokenizer.json"
