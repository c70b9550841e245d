"""Fold splitting and the results file of a cross-validation run.

- :func:`k_fold_indices`: the rows of k folds, by index arithmetic; :class:`KFold`: sklearn's ``KFold(n_splits)``
  (no shuffle) on them, for where scikit-learn is not installed (Colab has it);
  :func:`user_data`: the text as the user's loop reads it, a pandas ``DataFrame`` with a ``"text"`` column;
  :func:`fold_texts`: the tokenizer and that text cut into k (train, eval) ``Dataset`` pairs.
- :func:`append_result` / :func:`read_results`: one JSON line per finished fold, flushed
  to disk at once, so a crash at fold 4 keeps folds 1-3 and a rerun resumes after them.
  Each line carries a :func:`run_key` of the settings, so a resume never mixes two runs.
  A last line cut short by a crash is dropped before the next append (it holds no finished
  fold); any other unreadable line is refused by its number, never skipped, and
  :func:`repair_results` keeps every readable fold while setting the rest aside. A fold
  record of a run (one with a ``run_key``) must carry the measured figures the table and the
  plot read (``start_bytes``, ``peak_bytes``, ``end_bytes`` as whole numbers of bytes, and a
  numeric ``eval_loss``), and a fold may appear once; a run checks that it can write the file
  before its first fold trains.

>>> [test for _, test in k_fold_indices(5, 2)]
[[0, 1, 2], [3, 4]]
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kit import data as kdata
from kit.inputs import InputError

# what a finished fold of a run must carry (the table, the plot and summary.json read them): field -> kind
RUN_FIELDS = {"start_bytes": "bytes", "peak_bytes": "bytes", "end_bytes": "bytes", "eval_loss": "number"}
_NUMBERS = {"train_loss": "number", "baseline_bytes": "bytes"}   # read when present


def k_fold_indices(count: int, folds: int) -> list[tuple[list[int], list[int]]]:
    """(train, test) row indices of k contiguous folds, like sklearn's ``KFold`` without shuffle.

    >>> [test for _, test in k_fold_indices(5, 2)]
    [[0, 1, 2], [3, 4]]
    """
    if folds < 2 or count < folds:
        raise ValueError(f"k-fold needs 2 <= k <= number of rows; got k={folds}, rows={count}. "
                         "Lower folds or add data.")
    bounds, start = [], 0
    for i in range(folds):
        size = count // folds + (1 if i < count % folds else 0)
        bounds.append((start, start + size))
        start += size
    return [(list(range(0, a)) + list(range(b, count)), list(range(a, b))) for a, b in bounds]


class KFold:
    """``sklearn.model_selection.KFold(n_splits)`` without shuffling: the same contiguous folds, as numpy arrays.
    The notebook imports scikit-learn's where it is installed (Colab has it), and this one where it is not.

    >>> [test.tolist() for _, test in KFold(n_splits=2).split(list(range(5)))]
    [[0, 1, 2], [3, 4]]
    """

    def __init__(self, n_splits: int = 5):
        self.n_splits = n_splits

    def split(self, data):
        import numpy as np

        for train, test in k_fold_indices(len(data), self.n_splits):
            yield np.array(train, dtype=int), np.array(test, dtype=int)


def user_data(max_samples: int | None = 200):
    """The text the user's loop splits: a pandas ``DataFrame`` with one non-empty line per row in ``"text"``
    (wikitext-2 with the Hub, else the shipped sample), the first ``max_samples`` rows.

    >>> user_data(10).shape                                              # doctest: +SKIP
    (10, 1)
    """
    import pandas as pd

    lines = [t for t in kdata.load_text_dataset()["train"]["text"] if t.strip()]
    return pd.DataFrame({"text": lines[:max_samples] if max_samples else lines})


def fold_texts(model_name: str, folds: int, max_samples: int | None = 200):
    """The tokenizer, and one ``(train, eval)`` pair of text ``Dataset`` objects per fold, for SFTTrainer.

    >>> tok, splits = fold_texts("tiny-llama", folds=5)                 # doctest: +SKIP
    """
    from datasets import Dataset

    tok, data = kdata.load_tokenizer(model_name), user_data(max_samples)
    ds = Dataset.from_pandas(data)
    return tok, [(ds.select(tr), ds.select(te)) for tr, te in k_fold_indices(len(ds), folds)]


def run_key(model_name: str, settings: dict) -> str:
    """A short hash of the settings, stored with each fold so a resume never mixes two runs.

    >>> run_key("tiny-llama", {"folds": 5}) == run_key("tiny-llama", {"folds": 5})
    True
    """
    blob = json.dumps({"model": model_name, **settings}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


class ResultsFileError(InputError):
    """A results file this run cannot resume from or write to; the message names the file, the line and what to
    do. An :class:`kit.inputs.InputError` named ``results_path`` (a ``ValueError``)."""

    def __init__(self, message: str, name: str = "results_path", code: str = "results-file"):
        super().__init__(name, message, code)


def _not_a_folder(path: Path) -> None:
    if path.is_dir():
        raise ResultsFileError(f"{path} is a folder, not a results file: pass the file's path "
                               f"(such as {path / 'cv_results.jsonl'}).")


def check_writable(path) -> None:
    """Raise :class:`ResultsFileError` now, before any fold trains, if ``path`` cannot take a fold's line: a
    folder, a read-only file or folder. A missing file is created empty (and removed again), so the check is
    the write itself, also where permissions are not what decides (root, read-only mounts).

    >>> import tempfile; check_writable(Path(tempfile.mkdtemp()) / "cv_results.jsonl")
    """
    path = Path(path)
    _not_a_folder(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ResultsFileError(f"cannot write the results file {path} ({exc.strerror or type(exc).__name__}), "
                               "so no finished fold could be kept: make it writable, or pass another "
                               "output_dir (or results_path); nothing was trained.") from None
    if not existed:
        path.unlink(missing_ok=True)


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
    line = json.dumps(record)
    try:
        _not_a_folder(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _end_torn_line(path)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
    except (OSError, ResultsFileError) as exc:   # the fold's figures are in the message: never lost
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ResultsFileError(f"cannot write fold {record.get('fold')}'s record to {path} ({why}). Its figures, "
                               f"to paste into the file as one line once it is writable: {line}") from None


def _end_torn_line(path: Path) -> None:
    if not path.exists():
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        if _whole_json(data[start:].decode("utf-8", "replace")):
            f.write(b"\n")  # a whole line, only its newline is missing: kept (read_results judges it)
        else:
            f.truncate(start)
            print(f"{path}: dropped a half-written last line ({len(data) - start} bytes, a write cut short by a "
                  f"crash); the finished folds before it are kept.", flush=True)
        f.flush()
        os.fsync(f.fileno())


def _whole_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


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
    missing = [k for k in RUN_FIELDS if k not in rec] if "run_key" in rec else []
    if missing:
        return None, f"fold {fold} lacks {', '.join(missing)}, so it is no finished fold of a run"
    for k, kind in {**RUN_FIELDS, **_NUMBERS}.items():
        if k in rec and not _is(rec[k], kind):
            wanted = "a whole number of bytes" if kind == "bytes" else "a number"
            return None, f"fold {fold}'s {k} is {rec[k]!r}, not {wanted}"
    return rec, None


def _is(value, kind: str) -> bool:
    if value is None and kind == "number":   # a run that did not evaluate
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) and value >= 0) if kind == "bytes" else value == value and abs(value) != float("inf")


def _lines(path: Path) -> tuple[list[str], bool]:
    """The file's lines, and whether the last one is torn (no newline: a crash cut the write short)."""
    _not_a_folder(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ResultsFileError(f"cannot read the results file {path} ({exc.strerror or type(exc).__name__}): make "
                               "it readable, or pass another output_dir (or results_path).") from None
    return text.splitlines(), bool(text) and not text.endswith(("\n", "\r"))


def read_results(path, key: str | None = None, folds: int | None = None) -> dict[int, dict]:
    """Fold number -> record, from a results file (missing file: ``{}``).

    A half-written last line (a crash mid-write) is skipped; :func:`append_result` cuts it
    off before the next record. Any other line that is not a fold record, or (with
    ``folds``) a fold beyond ``folds``, or a fold a second time, raises :class:`ResultsFileError`
    naming the line and the remedy that keeps the good folds (:func:`repair_results`). With
    ``key`` (a run that will append its folds here), a record of other settings raises it too,
    rather than being mixed into this run, and so does a file (or folder) it cannot write
    (:func:`check_writable`); the file's content is never touched.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "cv_results.jsonl"
    >>> append_result(path, {"fold": 1, "run_key": "k", "start_bytes": 10, "peak_bytes": 30, "end_bytes": 10,
    ...                      "eval_loss": 2.5})
    >>> read_results(path, "k")[1]["eval_loss"]
    2.5
    """
    path = Path(path)
    if key is not None:
        check_writable(path)
    _not_a_folder(path)
    if not path.exists():
        return {}
    lines, torn = _lines(path)
    done, first = {}, {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec, problem = _problem(line, folds)
        if problem and torn and number == len(lines):
            continue  # the crash this file exists for: that fold never finished
        if rec is not None and rec["fold"] in first:
            problem = f"fold {rec['fold']} is there a second time (first at line {first[rec['fold']]})"
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
        first[rec["fold"]] = number
    return done


def repair_results(path, folds: int | None = None) -> dict:
    """Keep every readable fold record of a results file, in order, and move the unreadable
    lines (and, with ``folds``, folds beyond it; and a fold's later repeats) to ``<file>.unreadable``
    beside it, so that nothing is deleted. Returns ``{"kept", "set_aside", "aside_path"}``.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "cv_results.jsonl"
    >>> _ = path.write_text('{"fold": 1}\\n[1, 2]\\n{"fold": 2}\\n')
    >>> repair_results(path)["kept"], sorted(read_results(path))
    (2, [1, 2])
    """
    path = Path(path)
    if not path.exists():
        raise ResultsFileError(f"{path} does not exist: there is nothing to repair (check the path).")
    lines, _ = _lines(path)
    keep, aside, seen = [], [], set()
    for line in lines:
        if line.strip():
            rec, problem = _problem(line, folds)
            (keep if problem is None and rec["fold"] not in seen else aside).append(line)
            seen |= {rec["fold"]} if problem is None else set()
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
    _not_a_folder(path)
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
