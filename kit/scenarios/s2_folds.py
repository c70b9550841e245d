"""Fold splitting and the results file of a cross-validation run.

- :func:`k_fold_indices`: the rows of k folds, by index arithmetic (no sklearn);
  :func:`fold_data`: the tokenized text cut into k (train, eval) pairs.
- :func:`append_result` / :func:`read_results`: one JSON line per finished fold, flushed
  to disk at once, so a crash at fold 4 keeps folds 1-3 and a rerun resumes after them.
  Each line carries a :func:`run_key` of the settings, so a resume never mixes two runs.

>>> [test for _, test in k_fold_indices(5, 2)]
[[0, 1, 2], [3, 4]]
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import data as kdata


def k_fold_indices(n: int, k: int) -> list[tuple[list[int], list[int]]]:
    """(train, test) row indices of k contiguous folds, like sklearn's ``KFold`` without shuffle.

    >>> [test for _, test in k_fold_indices(5, 2)]
    [[0, 1, 2], [3, 4]]
    """
    if k < 2 or n < k:
        raise ValueError(f"k-fold needs 2 <= k <= number of rows; got k={k}, rows={n}. Lower folds or add data.")
    bounds, start = [], 0
    for i in range(k):
        size = n // k + (1 if i < n % k else 0)
        bounds.append((start, start + size))
        start += size
    return [(list(range(0, a)) + list(range(b, n)), list(range(a, b))) for a, b in bounds]


def run_key(model_name: str, p: dict) -> str:
    """A short hash of the settings, stored with each fold so a resume never mixes two runs.

    >>> run_key("tiny-llama", {"folds": 5}) == run_key("tiny-llama", {"folds": 5})
    True
    """
    blob = json.dumps({"model": model_name, **p}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def append_result(path, record: dict) -> None:
    """Append one fold's record to a JSONL file and flush it to disk (``os.fsync``).

    >>> append_result("cv-runs/cv_results.jsonl", {"fold": 1, "eval_loss": 2.5})  # doctest: +SKIP
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_results(path, key: str | None = None) -> dict[int, dict]:
    """Fold number -> record, from a results file (missing file: ``{}``).

    A half-written last line (a crash mid-write) is skipped. With ``key``, a record of
    other settings raises ValueError rather than being mixed into this run.

    >>> read_results("cv-runs/cv_results.jsonl")[1]["eval_loss"]             # doctest: +SKIP
    2.5
    """
    path = Path(path)
    if not path.exists():
        return {}
    done = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if key is not None and rec.get("run_key") != key:
            raise ValueError(f"{path} holds folds of other settings (run_key {rec.get('run_key')} != {key}): "
                             "pass another results_path, or resume=False to start over.")
        done[int(rec["fold"])] = rec
    return done


def fold_data(model_name: str, folds: int, seq_len: int, max_samples: int | None = 200):
    """Tokenizer, collator and one ``(train, eval)`` pair of datasets per fold.

    >>> tok, collate, splits = fold_data("tiny-llama", folds=5, seq_len=64)  # doctest: +SKIP
    """
    tok = kdata.load_tokenizer(model_name)
    ds = kdata.tokenize(kdata.load_text_dataset()["train"], tok, max_length=seq_len)
    if max_samples:
        ds = ds.select(range(min(max_samples, len(ds))))
    return tok, kdata.collator(tok), [(ds.select(tr), ds.select(te)) for tr, te in k_fold_indices(len(ds), folds)]
