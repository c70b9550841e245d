"""Fold splitting and the results file of a cross-validation run.

- :func:`k_fold_indices`: the rows of k folds, by index arithmetic (no sklearn);
  :func:`fold_data`: the tokenized text cut into k (train, eval) pairs.
- :func:`append_result` / :func:`read_results`: one JSON line per finished fold, flushed
  to disk at once, so a crash at fold 4 keeps folds 1-3 and a rerun resumes after them.
  Each line carries a :func:`run_key` of the settings, so a resume never mixes two runs.
  A last line cut short by a crash is dropped before the next append (it holds no finished
  fold); any other unreadable line is refused by its number, never skipped, and
  :func:`repair_results` keeps every readable fold while setting the rest aside.

>>> [test for _, test in k_fold_indices(5, 2)]
[[0, 1, 2], [3, 4]]
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kit import data as kdata


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


class ResultsFileError(ValueError):
    """A results file this run cannot resume from; the message names the file, the line and what to do."""


def append_result(path, record: dict) -> None:
    """Append one fold's record to a JSONL file and flush it to disk (``os.fsync``).

    A last line without its newline is a write a crash cut short: it is cut off first
    (a whole record that only lacks its newline gets the newline instead), so the new
    record starts a line of its own and every finished fold stays readable.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "cv_results.jsonl"
    >>> append_result(path, {"fold": 1, "eval_loss": 2.5})
    >>> _ = path.open("a").write('{"fold": 2, "eval_lo')            # the runtime died mid-write
    >>> append_result(path, {"fold": 2, "eval_loss": 2.4})          # doctest: +ELLIPSIS
    /...cv_results.jsonl: dropped a half-written last line ...
    >>> sorted(read_results(path))
    [1, 2]
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _end_torn_line(path)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _end_torn_line(path: Path) -> None:
    if not path.exists():
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        if _problem(data[start:].decode("utf-8", "replace"), None)[1] is None:
            f.write(b"\n")  # a whole record, only its newline is missing
        else:
            f.truncate(start)
            print(f"{path}: dropped a half-written last line ({len(data) - start} bytes, a write cut short by a "
                  f"crash); the finished folds before it are kept.", flush=True)
        f.flush()
        os.fsync(f.fileno())


def _problem(line: str, folds: int | None) -> tuple[dict | None, str | None]:
    """(record, None) for a readable fold record, else (None, what is wrong with the line)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None, "it is not valid JSON"
    if not isinstance(rec, dict):
        return None, f"it holds a JSON {type(rec).__name__}, not a fold record (an object with a \"fold\" number)"
    fold = rec.get("fold")
    if isinstance(fold, bool) or not isinstance(fold, int):
        return None, f"its \"fold\" is {fold!r}, not a whole number"
    if fold < 1 or (folds is not None and fold > folds):
        return None, f"fold {fold} is outside this run's folds 1..{folds}" if folds else f"fold {fold} is below 1"
    return rec, None


def _lines(path: Path) -> tuple[list[str], bool]:
    """The file's lines, and whether the last one is torn (no newline: a crash cut the write short)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.splitlines(), bool(text) and not text.endswith(("\n", "\r"))


def read_results(path, key: str | None = None, folds: int | None = None) -> dict[int, dict]:
    """Fold number -> record, from a results file (missing file: ``{}``).

    A half-written last line (a crash mid-write) is skipped; :func:`append_result` cuts it
    off before the next record. Any other line that is not a fold record, or (with
    ``folds``) a fold beyond ``folds``, raises :class:`ResultsFileError` naming the line
    and the remedy that keeps the good folds (:func:`repair_results`). With ``key``, a
    record of other settings raises it too, rather than being mixed into this run; the
    file is never touched.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "cv_results.jsonl"
    >>> append_result(path, {"fold": 1, "run_key": "k", "eval_loss": 2.5})
    >>> read_results(path, "k")[1]["eval_loss"]
    2.5
    """
    path = Path(path)
    if not path.exists():
        return {}
    lines, torn = _lines(path)
    done = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec, problem = _problem(line, folds)
        if problem and torn and number == len(lines):
            continue  # the crash this file exists for: that fold never finished
        if problem:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise ResultsFileError(
                f"{path}, line {number}: {problem} ({shown!r}), so this run cannot tell which folds are done. "
                f"Delete that line, or run kit.scenarios.cross_validation.folds.repair_results({str(path)!r}"
                f"{', folds=' + str(folds) if folds else ''}), which keeps every readable fold and sets the "
                f"rest aside; then run again.")
        if key is not None and rec.get("run_key") != key:
            raise ResultsFileError(
                f"{path}, line {number}, holds fold {rec['fold']} of other settings (run_key "
                f"{rec.get('run_key')!r}; this run's is {key!r}). The file is left as it is, so no finished fold "
                "is lost: give this run its own file with another output_dir (or results_path), or rerun with "
                "the earlier settings to resume that run.")
        done[rec["fold"]] = rec
    return done


def repair_results(path, folds: int | None = None) -> dict:
    """Keep every readable fold record of a results file, in order, and move the unreadable
    lines (and, with ``folds``, folds beyond it) to ``<file>.unreadable`` beside it, so that
    nothing is deleted. Returns ``{"kept", "set_aside", "aside_path"}``.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "cv_results.jsonl"
    >>> _ = path.write_text('{"fold": 1}\\n[1, 2]\\n{"fold": 2}\\n')
    >>> repair_results(path)["kept"], sorted(read_results(path))
    (2, [1, 2])
    """
    path = Path(path)
    if not path.exists():
        raise ResultsFileError(f"{path} does not exist: there is nothing to repair (check the path).")
    lines, _ = _lines(path)
    keep, aside = [], []
    for line in lines:
        if line.strip():
            (keep if _problem(line, folds)[1] is None else aside).append(line)
    aside_path = path.with_name(path.name + ".unreadable")
    if aside:
        with open(aside_path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in aside))
            f.flush()
            os.fsync(f.fileno())
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    os.replace(tmp, path)
    return {"kept": len(keep), "set_aside": len(aside), "aside_path": str(aside_path) if aside else None}


def set_aside(path) -> Path | None:
    """Move a results file out of the way (to ``<stem>.before-N<suffix>``, the first free N) so
    that a fresh run can start one, and return the new path (None when there was no file, or
    an empty one). Nothing is deleted: the finished folds stay on disk.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "cv_results.jsonl"
    >>> append_result(path, {"fold": 1})
    >>> set_aside(path).name, path.exists()
    ('cv_results.before-1.jsonl', False)
    """
    path = Path(path)
    if not path.exists():
        return None
    if path.stat().st_size == 0:
        path.unlink()
        return None
    n = 1
    while (new := path.with_name(f"{path.stem}.before-{n}{path.suffix}")).exists():
        n += 1
    path.rename(new)
    return new


def fold_data(model_name: str, folds: int, seq_len: int, max_samples: int | None = 200):
    """Tokenizer, collator and one ``(train, eval)`` pair of datasets per fold.

    >>> tok, collate, splits = fold_data("tiny-llama", folds=5, seq_len=64)  # doctest: +SKIP
    """
    tok = kdata.load_tokenizer(model_name)
    ds = kdata.tokenize(kdata.load_text_dataset()["train"], tok, max_length=seq_len)
    if max_samples:
        ds = ds.select(range(min(max_samples, len(ds))))
    return tok, kdata.collator(tok), [(ds.select(tr), ds.select(te)) for tr, te in k_fold_indices(len(ds), folds)]
