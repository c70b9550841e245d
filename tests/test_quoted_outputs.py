"""Every output the README and docs/ quote is what the kit prints today (issue 50, item 20): each quoted command is
run and its output compared, line by line, figures included.

How a page marks a quoted output, so that this test finds it (a fenced block with no language is an output, and
must be one of these two):
- a block whose first line is ``$ python -m kit ...`` (continued by lines ending in ``\\``): the command, then what
  it prints;
- a block right after the line ``<!-- output of the python block above -->``: what the page's previous ``python``
  block prints, run as it is written (so it must be whole: its imports included).

A line ``...`` in a quote stands for lines left out. Every other line must be printed, in the quote's order.
"""
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- output of the python block above -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


def _blocks(text: str):
    """(language, body, the text just before the fence) of each fenced block."""
    for m in FENCE.finditer(text):
        yield m.group(1), m.group(2), text[:m.start()]


def _command(body: str) -> tuple:
    """A ``$ python -m kit`` block: (the argv after ``python -m kit``, the quoted output lines)."""
    lines = body.splitlines()
    command = [lines[0][2:]]
    while command[-1].endswith("\\"):
        command[-1] = command[-1][:-1]
        command.append(lines[len(command)])
    argv = shlex.split(" ".join(command))
    assert argv[:3] == ["python", "-m", "kit"], argv
    return argv[3:], lines[len(command):]


def quoted_outputs():
    """(page:line, "cli" or "python", the argv or the code, the quoted lines) for every quoted output."""
    found = []
    for page in PAGES:
        text = page.read_text()
        last_python = None
        for language, body, before in _blocks(text):
            where = f"{page.name}:{before.count(chr(10)) + 1}"
            if language == "python":
                last_python = body
            elif language == "" and body.startswith("$ python -m kit "):
                argv, lines = _command(body)
                found.append((where, "cli", argv, lines))
            elif language == "" and before.rstrip().endswith(MARKER):
                assert last_python is not None, f"{where}: the marker follows no python block"
                found.append((where, "python", last_python, body.splitlines()))
            elif language == "":
                found.append((where, "unmarked", None, body.splitlines()))
    return found


QUOTED = quoted_outputs()


def missing_lines(quoted: list, printed: str) -> list:
    """The quoted lines (but ``...``) not printed in the quote's order; trailing spaces do not count.

    >>> missing_lines(["a", "...", "c"], "a\\nb\\nc\\n")
    []
    >>> missing_lines(["c", "a"], "a\\nb\\nc\\n")
    ['a']
    """
    lines, at, missing = [line.rstrip() for line in printed.splitlines()], 0, []
    for line in (q.rstrip() for q in quoted):
        if line == "...":
            continue
        try:
            at = lines.index(line, at) + 1
        except ValueError:
            missing.append(line)
    return missing


def test_every_output_block_is_marked_so_that_it_is_checked():
    unmarked = [where for where, kind, _, _ in QUOTED if kind == "unmarked"]
    assert unmarked == [], f"output blocks with no command: mark them (this file's docstring says how): {unmarked}"
    assert {kind for _, kind, _, _ in QUOTED} == {"cli", "python"} and len(QUOTED) >= 3


@pytest.mark.parametrize("where, kind, source, quoted", [q for q in QUOTED if q[1] != "unmarked"],
                         ids=[q[0] for q in QUOTED if q[1] != "unmarked"])
def test_a_quoted_output_is_what_the_kit_prints_today(where, kind, source, quoted, run_kit, monkeypatch):
    monkeypatch.chdir(ROOT)                    # the commands name files of the repository by relative paths
    if kind == "cli":
        _, printed, err = run_kit(*source)
        printed += err
    else:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(source, where, "exec"), {"__name__": "__docs__"})
        printed = buffer.getvalue()
    assert missing_lines(quoted, printed) == [], f"{where} quotes lines that are not printed today:\n{printed}"


def test_the_finder_reads_a_command_its_continuation_and_a_marked_python_output():
    page = ("```python\nprint('hi')\n```\n\n" + MARKER + "\n```\nhi\n```\n\n"
            "```\n$ python -m kit fit --model gpt2 \\\n    --device colab-t4\nDOES NOT FIT\n```\n")
    blocks = list(_blocks(page))
    assert [language for language, _, _ in blocks] == ["python", "", ""]
    assert blocks[1][2].rstrip().endswith(MARKER)
    assert _command(blocks[2][1]) == (["fit", "--model", "gpt2", "--device", "colab-t4"], ["DOES NOT FIT"])
