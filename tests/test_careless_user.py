"""A careless user's inputs, as a table: each row is an input and the answer the kit must give.

The rows live in ``tests/data/careless/*.json`` (one file per surface). Each row is one of:

- ``{"id", "item", "cli": [argv...], "exit": N, "says": [...]}``: ``python -m kit ARGV`` (run in this process) exits
  with ``N`` and prints each of ``says`` (stdout and stderr together, case-insensitive);
- ``{"id", "item", "python": "code", "raises": "InputError", "code": "...", "says": [...]}``: the code, run with
  ``kit`` imported, raises the kit's own documented exception (its class name, and its ``code`` where given) whose
  message holds each of ``says``;
- ``{"id", "item", "python": "code", "says": [...]}``: the code runs, and what it prints holds each of ``says``.

``item`` names the issue item the row comes from. ``seconds`` (default 60) bounds a row: a hang is a failure. No
answer may be a traceback, or the kit's "please report it": an answer is a sentence for the user.
"""
import contextlib
import io
import json
import signal
from pathlib import Path

import pytest

TABLE_DIR = Path(__file__).parent / "data" / "careless"
KIT_EXCEPTIONS = ("Refusal", "InputError", "UnsupportedModel", "OwnHeadError", "ResultsFileError")


def _rows():
    for path in sorted(TABLE_DIR.glob("*.json")):
        for row in json.loads(path.read_text()):
            yield pytest.param(row, id=f"{path.stem}:{row['id']}")


class _TooSlow(Exception):
    pass


@contextlib.contextmanager
def _bounded(seconds):
    def give_up(signum, frame):
        raise _TooSlow(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _assert_says(text, row):
    lowered = text.lower()
    missing = [s for s in row.get("says", []) if s.lower() not in lowered]
    assert not missing, f"{row['id']}: the answer lacks {missing}:\n{text}"
    assert "Traceback" not in text and "please report" not in lowered, f"{row['id']}: not an answer:\n{text}"


def _run_cli(row, run_kit):
    code, out, err = run_kit(*row["cli"])
    _assert_says(out + err, row)
    assert code == row["exit"], f"{row['id']}: exit {code}, expected {row['exit']}:\n{out}{err}"


def _run_python(row, tmp_path, monkeypatch):
    import kit

    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(row["python"], {"kit": kit, "tmp_path": tmp_path})
    except _TooSlow:
        raise
    except Exception as exc:  # the row says whether this one is the answer
        if "raises" not in row:
            raise
        assert type(exc).__name__ == row["raises"], f"{row['id']}: {type(exc).__name__}: {exc}"
        assert type(exc).__name__ in KIT_EXCEPTIONS, f"{row['id']}: {type(exc).__name__} is no kit exception"
        if "code" in row:
            assert getattr(exc, "code", None) == row["code"], f"{row['id']}: code {getattr(exc, 'code', None)}"
        _assert_says(str(exc), row)
        return
    assert "raises" not in row, f"{row['id']}: raised nothing; expected {row['raises']}"
    _assert_says(printed.getvalue(), row)


@pytest.mark.parametrize("row", list(_rows()))
def test_careless_input_gets_an_answer(row, run_kit, tmp_path, monkeypatch):
    with _bounded(row.get("seconds", 60)):
        if "cli" in row:
            _run_cli(row, run_kit)
        else:
            _run_python(row, tmp_path, monkeypatch)
