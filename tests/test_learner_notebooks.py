"""The learner copies (notebooks/learner/) and what ships with them: made from the instructor copies by
``python -m kit.scenarios.learner`` (``make learner-notebooks``), with no outputs, no instructor notes and no
solution code, each solution revealed by ``teach.solution(key)``; and the cheat sheet, rendered by the kit."""
import json
import re
from pathlib import Path

import pytest

from kit.scenarios import learner, teach

ROOT = Path(__file__).resolve().parent.parent
LEARNER = sorted((ROOT / "notebooks" / "learner").glob("*.ipynb"))
INSTRUCTOR = sorted((ROOT / "notebooks").glob("0*.ipynb"))
REGENERATE = "regenerate them: make learner-notebooks (python -m kit.scenarios.learner)"


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell):
    return "".join(cell["source"])


def test_every_instructor_copy_has_a_learner_copy():
    assert [p.name for p in LEARNER] == [p.name for p in INSTRUCTOR], REGENERATE


def test_regenerating_gives_the_committed_copies(tmp_path):
    """The committed learner copies, solutions file and cheat sheet agree with the instructor copies of today."""
    learner.build(out_dir=tmp_path / "learner", solutions_file=tmp_path / "solutions.json",
                  cheatsheet_file=tmp_path / "cheatsheet.md")
    made = sorted(p.name for p in (tmp_path / "learner").glob("*.ipynb"))
    assert made == [p.name for p in LEARNER], REGENERATE
    for name in made:
        assert (tmp_path / "learner" / name).read_text(encoding="utf-8") == \
            (ROOT / "notebooks" / "learner" / name).read_text(encoding="utf-8"), \
            f"learner/{name} is stale: {REGENERATE}"
    assert (tmp_path / "solutions.json").read_text(encoding="utf-8") == \
        teach.SOLUTIONS_FILE.read_text(encoding="utf-8"), f"kit/assets/solutions.json is stale: {REGENERATE}"


def test_the_committed_cheat_sheet_is_the_kits_own():
    """No figure in docs/cheatsheet.md is typed by hand: the file is teach.cheatsheet_markdown()'s text."""
    assert (ROOT / "docs" / "cheatsheet.md").read_text(encoding="utf-8") == teach.cheatsheet_markdown(), REGENERATE


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.name)
def test_a_learner_copy_has_no_outputs_no_notes_and_no_solution_code(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert "widgets" not in nb["metadata"]
    for i, c in enumerate(nb["cells"]):
        src = _src(c)
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None, f"cell {i + 1} keeps its outputs"
            assert not src.startswith(learner.SOLUTION_TITLE), f"cell {i + 1} is a solution"
            assert "NBVAL_CHECK_OUTPUT" not in src, f"cell {i + 1}: nbval would compare it with no output"
        assert "execution" not in c["metadata"]
        assert not learner.is_instructor_cell(c) and "Instructor notes" not in src, f"cell {i + 1}: instructor notes"
        assert "workshop_plan(" not in src, f"cell {i + 1} prints the workshop's plan: tag it `instructor`"
    solutions = [code for code in teach.load_solutions().values() if code["notebook"] == path.name]
    text = "\n".join(_src(c) for c in nb["cells"])
    for entry in solutions:  # no solution's code is in the copy (a line that is no mere import or a comment)
        body = [ln for ln in entry["code"].splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "import"))]
        assert not all(ln in text for ln in body), f"{entry['title']}: its code is in the learner copy"


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.name)
def test_every_solution_of_the_instructor_copy_is_revealed_by_a_key_that_exists(path):
    shipped = teach.load_solutions()
    keys = [k for c in _cells(path) if c["cell_type"] == "code"
            for k in re.findall(r'teach\.solution\("([^"]+)"\)', _src(c))]
    titles = [_src(c).splitlines()[0] for c in _cells(ROOT / "notebooks" / path.name)
              if c["cell_type"] == "code" and _src(c).startswith(learner.SOLUTION_TITLE)]
    assert len(keys) == len(titles) > 0
    for key in keys:
        assert key in shipped and shipped[key]["notebook"] == path.name, key


def test_keys_are_unique_and_stable():
    assert learner.learner_key("01_x.ipynb", "#@title Solution: rank the modules, read the top line\nx = 1") == \
        "01-rank-the-modules-read-the-top-line"
    assert learner.learner_key("01_x.ipynb", "#@title Solution: anything\n# solution: mine\nx = 1") == "mine"
    twice = {"metadata": {}, "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                        "source": ["#@title Solution: same\n", f"x = {i}"]} for i in (1, 2)]}
    with pytest.raises(ValueError, match="two solutions"):
        learner.learner_copy(twice, "09_demo.ipynb")


def test_notes_and_a_tagged_plan_cell_are_removed_and_the_badge_points_at_the_copy():
    nb = {"metadata": {"widgets": {}}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": [
            "[![Open In Colab](b.svg)]"
            "(https://colab.research.google.com/github/o/r/blob/main/notebooks/09_demo.ipynb)"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["## Instructor notes\n", "Timings"]},
        {"cell_type": "code", "metadata": {"tags": ["instructor"]}, "outputs": [], "execution_count": 1,
         "source": ["print(plan)"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 2,
         "source": ["# Instructor: the workshop's plan\n", "print(plan)"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["A solution, collapsed (double-click it):"]},
        {"cell_type": "code", "metadata": {"cellView": "form", "jupyter": {"source_hidden": True}}, "outputs": [],
         "execution_count": 3, "source": ["#@title Solution: add\n", "# NBVAL_CHECK_OUTPUT\n", "x = 1 + 1"]},
    ]}
    out, solutions = learner.learner_copy(nb, "09_demo.ipynb")
    srcs = [_src(c) for c in out["cells"]]
    assert len(srcs) == 3 and "blob/main/notebooks/learner/09_demo.ipynb" in srcs[0]
    assert srcs[1] == "A solution, hidden until you run the next cell:"
    assert srcs[2].endswith('teach.solution("09-add")') and out["cells"][2]["metadata"] == {}
    assert solutions == {"09-add": {"notebook": "09_demo.ipynb", "title": "Solution: add",
                                    "code": "x = 1 + 1"}}


def test_solution_prints_a_fake_solution_and_defines_its_variables_in_the_callers_namespace(capsys):
    fake = {"fake-key": {"notebook": "09_demo.ipynb", "title": "Solution: a fake",
                         "code": "def twice(v):\n    return 2 * v\nanswer = twice(21)\nprint('answer', answer)"}}
    ns = {"teach": teach, "fake": fake}
    exec('teach.solution("fake-key", solutions=fake)', ns)  # noqa: S102 - as a notebook cell calls it
    out = capsys.readouterr().out
    assert "Solution: a fake" in out and "def twice(v):" in out and out.rstrip().endswith("answer 42")
    assert ns["answer"] == 42 and ns["twice"](2) == 4
    with pytest.raises(KeyError, match="no solution 'missing'"):
        teach.solution("missing", {}, solutions=fake)


# The learner copies whose cells before their solutions run in about half a minute each here; 01's take 349 s and
# 02's 189 s on this machine (two shared cores), so their solutions run in `make test`'s nbval of notebooks/learner.
QUICK = ("00_check_your_setup.ipynb", "03_your_own_setup.ipynb")


def _run_to_the_last_solution(name, site, work):
    """Run a learner copy's cells, up to its last solution cell, in a fresh kernel whose ``kit`` is the copy
    installed in ``site``; return the outputs of the solution cells and the kernel's ``kit.__file__``."""
    import os

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / "learner" / name, as_version=4)
    calls = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "teach.solution(" in c.source]
    nb.cells = nb.cells[:calls[-1] + 1] + [nbformat.v4.new_code_cell("import kit; print(kit.__file__)")]
    env = {"PYTHONPATH": str(site), "KIT_SMOKE": "1", "HF_HUB_OFFLINE": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)   # (the kernel inherits this process's environment)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    text = ["".join(o.get("text", "") for o in nb.cells[i].outputs) for i in calls]
    errors = [o for i in calls for o in nb.cells[i].outputs if o.output_type == "error"]
    assert not errors, errors
    return text, "".join(o.get("text", "") for o in nb.cells[-1].outputs).strip()


def test_the_shipped_solutions_run_where_the_kit_is_installed(tmp_path):
    """The kit installed as a user installs it (pip, not this checkout): its solutions.json (package-data
    assets/*) holds every solution a learner copy calls, the same code as the instructor copies; and the learner
    copies 00 and 03, run up to their solutions in a fresh kernel with that installed kit, run each solution (its
    code printed, then run without an error). (01's and 02's run in make test's nbval: see QUICK.)"""
    import subprocess
    import sys

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(ROOT)], check=True, capture_output=True)
    shipped = json.loads((site / "kit" / "assets" / "solutions.json").read_text())
    assert shipped == teach.load_solutions()
    sources = ["".join(c["source"]) for nb in LEARNER for c in json.loads(nb.read_text())["cells"]]
    called = {m for src in sources for m in re.findall(r'teach\.solution\("([^"]+)"\)', src)}
    assert called == set(shipped)
    for name in QUICK:
        outputs, kit_file = _run_to_the_last_solution(name, site, tmp_path)
        assert kit_file.startswith(str(site)), kit_file
        keys = [k for k, v in shipped.items() if v["notebook"] == name]
        assert len(outputs) == len(keys) >= 1
        for text in outputs:
            code, run = text.split("----- its run -----")
            assert "----- its code -----" in code and run.strip(), text


# ---- the learner copies read as a learner reads them --------------------------------------------------------------
DEVELOPER = re.compile(r"`make\b|\bmake (?:demo|test|notebooks|learner-notebooks|gpu-check|gpu-wheels)\b|gpu[-_]check"
                       r"|benchmarks/|results/|\bpytest\b|\bnbval\b|\.venv\b", re.IGNORECASE)
SAVED_OUTPUTS = re.compile(r"outputs? saved|saved with (?:it|this notebook)|the saved outputs", re.IGNORECASE)
LONGEST_SENTENCE = 50   # words
LONGEST_OUTPUT = 25     # lines a cell may print


def sentences(markdown: str) -> list[str]:
    """A markdown cell's sentences: code blocks and table rows left out, list items and paragraphs apart, and a
    full stop inside brackets not taken for a sentence's end.

    >>> [len(s.split()) for s in sentences("One two. Three (four. five) six!\\n\\n- seven\\n- eight nine")]
    [2, 4, 1, 2]
    """
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"^\s*\|.*\|\s*$", " ", text, flags=re.MULTILINE)
    text = re.sub(r"\([^()]*\)", lambda m: m.group(0).replace(". ", "; "), text)
    parts = re.split(r"(?<=[.!?:])\s+(?=[A-Z*`\"'(\[])|\n\s*\n|\n(?=\s*(?:[-*]|\d+\.)\s)", text)
    # a list item's marker is no word
    return [re.sub(r"^(?:[-*]|\d+\.)\s+", "", p.strip()) for p in parts if p.strip()]


def _markdown(path):
    return [(i + 1, _src(c)) for i, c in enumerate(_cells(path)) if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.name)
def test_a_learner_copy_names_no_developer_command_or_file(path):
    found = [(n, m.group(0)) for n, text in _markdown(path) for m in DEVELOPER.finditer(text)]
    assert found == [], f"developer commands or files in the prose (cell, text): {found}"


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.name)
def test_a_learner_copy_has_no_sentence_over_50_words_and_presumes_no_saved_outputs(path):
    long = [(n, len(s.split()), s[:80]) for n, text in _markdown(path) for s in sentences(text)
            if len(s.split()) > LONGEST_SENTENCE]
    assert long == [], f"sentences over {LONGEST_SENTENCE} words (cell, words, start): {long}"
    saved = [n for n, text in _markdown(path) if SAVED_OUTPUTS.search(text)]
    assert saved == [], f"cells that speak of saved outputs, which a learner copy has none of: {saved}"


def _output_lines(output: dict) -> int:
    """Lines a cell's output shows: a stream's or a result's text; a Markdown result's non-blank lines, where a
    collapsed ``<details>`` part shows one line (its summary); a figure or a widget, none."""
    if output.get("output_type") == "stream":
        return len("".join(output["text"]).splitlines())
    data = output.get("data", {})
    if "image/png" in data or "application/vnd.jupyter.widget-view+json" in data:
        return 0
    if "text/markdown" in data:
        shown = re.sub(r"<details><summary>.*?</details>", "(collapsed)", "".join(data["text/markdown"]),
                       flags=re.DOTALL)
        return sum(1 for line in shown.splitlines() if line.strip())
    return len("".join(data.get("text/plain", "")).splitlines())


@pytest.mark.parametrize("path", INSTRUCTOR, ids=lambda p: p.name)
def test_no_cell_a_learner_runs_prints_over_25_lines(path):
    """The instructor copies hold the outputs of a smoke run (make notebooks): each code cell the learner copy keeps
    prints at most 25 lines (a widget's or a figure's output is no text). A listing of the user's code
    (``inspect.getsource``) is code to read, not output, and is not counted."""
    kept = {_src(c).replace("# NBVAL_CHECK_OUTPUT\n", "").replace("# NBVAL_IGNORE_OUTPUT\n", "")
            for c in _cells(ROOT / "notebooks" / "learner" / path.name) if c["cell_type"] == "code"}
    over = []
    for i, c in enumerate(_cells(path)):
        if c["cell_type"] != "code" or learner.is_instructor_cell(c) or _src(c).startswith(learner.SOLUTION_TITLE) \
                or "getsource(" in _src(c) or "_source()" in _src(c):
            continue
        lines = sum(_output_lines(o) for o in c["outputs"])
        src = _src(c).replace("# NBVAL_CHECK_OUTPUT\n", "").replace("# NBVAL_IGNORE_OUTPUT\n", "")
        if lines > LONGEST_OUTPUT and src in kept:
            over.append((i + 1, lines, src.splitlines()[0][:60]))
    assert over == [], f"cells printing over {LONGEST_OUTPUT} lines (cell, lines, first line): {over}"
