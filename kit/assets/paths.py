"""Where the shipped files lie."""
from pathlib import Path

ASSETS_DIR = Path(__file__).parent
TRAIN_TEXT = ASSETS_DIR / "austen_train.txt"
TEST_TEXT = ASSETS_DIR / "austen_test.txt"
TOKENIZER_FILE = ASSETS_DIR / "tokenizer.json"
