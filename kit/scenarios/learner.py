"""Learner copies of the workshop notebooks, made from the instructor copies: ``python -m kit.scenarios.learner``
(``make learner-notebooks``) rewrites ``notebooks/learner/<name>.ipynb`` for each ``notebooks/0*.ipynb``, the
solutions file ``kit/assets/solutions.json`` and the cheat sheet ``docs/cheatsheet.md``. No kernel runs: it takes a
second.

The instructor copy keeps its outputs, its instructor notes and its solutions. The learner copy, cell by cell:

- **outputs** and execution counts are cleared, with each cell's execution timings and the notebook's saved widget
  state; the nbval markers ``# NBVAL_CHECK_OUTPUT`` and ``# NBVAL_IGNORE_OUTPUT`` are dropped (there is no output
  to check);
- **instructor cells** are removed: a markdown cell whose source starts with ``## Instructor notes`` or
  ``**Instructor notes`` (a continuation), any cell whose metadata carries ``"tags": ["instructor"]``, and any
  code cell whose first line starts with ``# Instructor`` or ``#@title Instructor``. A code cell that belongs to
  the notes (the cell after them that prints the workshop's plan) needs one of the last two markers;
- each **solution cell** (a code cell whose first line starts with ``#@title Solution``) becomes a cell that
  reveals it when run, ``teach.solution("<key>")``: it prints the code and runs it in the notebook's namespace, so
  the cells below find its variables. The key is the notebook's two-digit number and a slug of the title
  (``#@title Solution: let the estimator search`` in 03 is ``03-let-the-estimator-search``), or the
  ``# solution: <key>`` line in the cell where one is written (the line is not part of the shown code). Keys must
  be unique across the notebooks: a clash is an error, never a silent suffix. The sentence before a solution
  ("A solution, collapsed (...)") says how to reveal it instead;
- the **Colab badge** points at the learner copy (``.../blob/main/notebooks/learner/<name>``).

>>> learner_key("03_your_own_setup.ipynb", "#@title Solution: let the estimator search\\nbest = 1")
'03-let-the-estimator-search'
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

from kit.scenarios.teach import SOLUTIONS_FILE, cheatsheet_markdown

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTOR_DIR = ROOT / "notebooks"
LEARNER_DIR = INSTRUCTOR_DIR / "learner"
CHEATSHEET_FILE = ROOT / "docs" / "cheatsheet.md"
SOLUTION_TITLE = "#@title Solution"
NBVAL_MARKERS = ("# NBVAL_CHECK_OUTPUT", "# NBVAL_IGNORE_OUTPUT")
REVEAL_CELL = ("# Solution: run this cell to reveal it. It prints the code, then runs it, so the cells below work.\n"
               "from kit.scenarios import teach\n"
               'teach.solution("{key}")')


def _src(cell) -> str:
    return "".join(cell["source"])


def _lines(text: str) -> list[str]:
    """A cell's source as nbformat stores it: lines with their newlines, the last without."""
    return text.splitlines(keepends=True)


def is_instructor_cell(cell: dict) -> bool:
    """Does this cell belong to the instructor copy only (the notes, or a cell tagged or titled for them)?

    >>> is_instructor_cell({"cell_type": "markdown", "metadata": {}, "source": ["## Instructor notes\\n", "..."]})
    True
    >>> is_instructor_cell({"cell_type": "code", "metadata": {"tags": ["instructor"]}, "source": ["print(1)"]})
    True
    >>> is_instructor_cell({"cell_type": "code", "metadata": {}, "source": ["print(1)"]})
    False
    """
    src, first = _src(cell), (_src(cell).splitlines() or [""])[0]
    return ("instructor" in cell.get("metadata", {}).get("tags", [])
            or (cell["cell_type"] == "markdown" and src.startswith(("## Instructor notes", "**Instructor notes")))
            or (cell["cell_type"] == "code" and first.startswith(("# Instructor", "#@title Instructor"))))


def learner_key(notebook: str, source: str) -> str | None:
    """The solution key of a code cell (None when it is no solution): ``# solution: <key>`` where written, else the
    notebook's two-digit number and a slug of the ``#@title Solution: ...`` line.

    >>> learner_key("00_check_your_setup.ipynb", "#@title Solution: 2 bytes per number\\n# solution: bf16\\nx = 1")
    'bf16'
    >>> learner_key("00_check_your_setup.ipynb", "x = 1") is None
    True
    """
    lines = source.splitlines()
    if not lines or not lines[0].startswith(SOLUTION_TITLE):
        return None
    for line in lines[1:]:
        if m := re.fullmatch(r"#\s*solution:\s*(\S+)\s*", line):
            return m.group(1)
    title = lines[0][len(SOLUTION_TITLE):].lstrip(":").strip()
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return f"{notebook[:2]}-{slug}" if slug else notebook[:2]


def _solution_code(source: str) -> str:
    """The code a learner sees: the cell without its title, ``# solution:`` and nbval marker lines."""
    lines = source.splitlines()[1:]
    return "\n".join(ln for ln in lines if not re.fullmatch(r"#\s*solution:\s*(\S+)\s*", ln)
                     and ln.strip() not in NBVAL_MARKERS).strip("\n")


def learner_copy(notebook: dict, name: str) -> tuple[dict, dict[str, dict]]:
    """The learner copy of one instructor notebook (``notebook``, as JSON), and its solutions ``key -> {"notebook",
    "title", "code"}``.

    >>> nb = {"metadata": {}, "cells": [
    ...     {"cell_type": "markdown", "metadata": {}, "source": ["## Instructor notes"]},
    ...     {"cell_type": "code", "metadata": {}, "execution_count": 3, "outputs": [{"output_type": "stream"}],
    ...      "source": ["#@title Solution: add\\n", "x = 1 + 1"]}]}
    >>> copy_, solutions = learner_copy(nb, "09_demo.ipynb")
    >>> [_src(c) for c in copy_["cells"]][0].splitlines()[-1], solutions["09-add"]["code"]
    ('teach.solution("09-add")', 'x = 1 + 1')
    """
    out = copy.deepcopy(notebook)
    out["metadata"].pop("widgets", None)
    cells, solutions = [], {}
    for cell in out["cells"]:
        if is_instructor_cell(cell):
            continue
        cell["metadata"].pop("execution", None)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            src = _src(cell)
            key = learner_key(name, src)
            if key is not None:
                if key in solutions:
                    raise ValueError(f"{name}: two solutions have the key {key!r}; write `# solution: <key>` in one")
                solutions[key] = {"notebook": name, "title": src.splitlines()[0].removeprefix("#@title ").strip(),
                                  "code": _solution_code(src)}
                for k in ("cellView", "jupyter"):  # the revealing cell is visible: nothing is hidden in it
                    cell["metadata"].pop(k, None)
                src = REVEAL_CELL.format(key=key)
                if cells and cells[-1]["cell_type"] == "markdown":
                    before = re.sub(r"A solution, collapsed( \([^)]*\))?", "A solution, hidden until you run the "
                                    "next cell", _src(cells[-1]), count=1)
                    cells[-1]["source"] = _lines(before)
            src = "\n".join(ln for ln in src.split("\n") if ln.strip() not in NBVAL_MARKERS)
            cell["source"] = _lines(src)
        cells.append(cell)
    if cells and cells[0]["cell_type"] == "markdown":
        cells[0]["source"] = _lines(_src(cells[0]).replace(f"/blob/main/notebooks/{name}",
                                                           f"/blob/main/notebooks/learner/{name}"))
    out["cells"] = cells
    return out, solutions


def dumps(notebook: dict) -> str:
    """A notebook as nbformat writes it (1-space indents, sorted keys, a final newline), so a rerun changes nothing.

    >>> dumps({"cells": [], "metadata": {}})
    '{\\n "cells": [],\\n "metadata": {}\\n}\\n'
    """
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def build(src_dir=INSTRUCTOR_DIR, out_dir=LEARNER_DIR, solutions_file=SOLUTIONS_FILE,
          cheatsheet_file=CHEATSHEET_FILE) -> list[Path]:
    """Write the learner copy of every ``src_dir/0*.ipynb`` into ``out_dir``, every solution into
    ``solutions_file`` and the cheat sheet into ``cheatsheet_file`` (None: skip it); returns the files written.
    Learner copies in ``out_dir`` whose instructor copy is gone are removed.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [p.name for p in build(out_dir=Path(tmp), solutions_file=Path(tmp) / "s.json", cheatsheet_file=None)][-1]
    's.json'
    """
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, solutions = [], {}
    names = sorted(p.name for p in src_dir.glob("0*.ipynb"))
    for name in names:
        nb, found = learner_copy(json.loads((src_dir / name).read_text(encoding="utf-8")), name)
        if clash := sorted(set(found) & set(solutions)):
            raise ValueError(f"{name}: solution keys {clash} are already used by another notebook")
        solutions |= found
        (out_dir / name).write_text(dumps(nb), encoding="utf-8")
        written.append(out_dir / name)
    for stale in out_dir.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink()
    Path(solutions_file).write_text(json.dumps(solutions, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    written.append(Path(solutions_file))
    if cheatsheet_file is not None:
        Path(cheatsheet_file).parent.mkdir(parents=True, exist_ok=True)
        Path(cheatsheet_file).write_text(cheatsheet_markdown(), encoding="utf-8")
        written.append(Path(cheatsheet_file))
    return written


def main(argv=None) -> int:
    """``python -m kit.scenarios.learner [--src notebooks] [--out notebooks/learner]``: rewrite the learner copies,
    the solutions file and the cheat sheet, and list them.

    >>> main(["--help"])                          # doctest: +SKIP
    """
    ap = argparse.ArgumentParser(prog="python -m kit.scenarios.learner", description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=INSTRUCTOR_DIR, help="the instructor copies' folder")
    ap.add_argument("--out", type=Path, default=LEARNER_DIR, help="the learner copies' folder")
    ap.add_argument("--solutions", type=Path, default=SOLUTIONS_FILE, help="the solutions file the kit ships")
    ap.add_argument("--cheatsheet", type=Path, default=CHEATSHEET_FILE, help="the cheat sheet's Markdown file")
    a = ap.parse_args(argv)
    for p in build(a.src, a.out, a.solutions, a.cheatsheet):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
