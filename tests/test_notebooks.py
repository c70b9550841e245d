"""Notebook shape: badge first, one install cell with the kit's URL, thin cells after prose.

The notebooks themselves run under nbval (`make test` passes `--nbval-lax notebooks`).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kit

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))  # the instructor copies
LEARNER = sorted((Path(__file__).parent.parent / "notebooks" / "learner").glob("*.ipynb"))  # made from them


def install_cells(cells):
    """The code cells that install the kit (pip, however it is called)."""
    return [src for kind, src in cells if kind == "code" and ("pip install" in src or '"pip", "install"' in src)]


def _cells(path):
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def test_there_are_notebooks():
    assert any(p.name.startswith("00_") for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS + LEARNER, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_badge_and_install_cell_use_the_one_repo_url(path):
    cells = _cells(path)
    slug = kit.REPO_URL.split("github.com/")[1]
    where = "notebooks/learner" if path.parent.name == "learner" else "notebooks"  # each copy opens itself
    assert cells[0][0] == "markdown"
    assert f"colab.research.google.com/github/{slug}/blob/main/{where}/{path.name})" in cells[0][1], (
        f"{path.name}: the badge must point at kit.REPO_URL ({kit.REPO_URL}) and at {where}/{path.name}; update it "
        "after changing REPO_URL"
    )
    installs = install_cells(cells)
    assert len(installs) == 1, "exactly one install cell"
    assert f'KIT_REPO_URL = "{kit.REPO_URL}"' in installs[0]
    # it finds a checkout from notebooks/ and from notebooks/learner/ alike: it walks up the parents
    assert "pathlib.Path.cwd().parents" in installs[0] and '"../kit"' not in installs[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_are_short_and_follow_prose(path):
    cells = _cells(path)
    for i, (kind, src) in enumerate(cells):
        if kind != "code":
            continue
        lines = [ln for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(lines) <= 10, f"{path.name} cell {i + 1} has {len(lines)} lines; move logic into kit/"
        assert cells[i - 1][0] == "markdown", f"{path.name} cell {i + 1} has no sentence of prose before it"


# -- workshop shape (issue 16): predict before the reveal, words before numbers, an exercise, a recap ----------
def _nb(path):
    return json.loads(path.read_text())["cells"]


def _src(cell):
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_prediction_is_written_before_its_reveal(path):
    import re

    cells = [(c["cell_type"], _src(c)) for c in _nb(path)]
    assigned = {}
    for i, (kind, src) in enumerate(cells):
        for name in re.findall(r"^(my_\w+) = ", src, re.M):
            assigned.setdefault(name, i)
    assert assigned, f"{path.name} has no prediction cell (my_... = None)"
    for name, i in assigned.items():
        uses = [j for j, (kind, src) in enumerate(cells) if j >= i and kind == "code"  # the guess itself is no use
                and re.search(rf"\b{name}\b", re.sub(rf"^{name} = .*$", "", src, flags=re.M))]
        assert uses, f"{path.name}: {name} is never compared with an answer after cell {i + 1}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_glossary_comes_before_the_first_breakdown(path):
    srcs = [_src(c) if c["cell_type"] == "code" else "" for c in _nb(path)]
    glossary = next(i for i, s in enumerate(srcs) if "teach.glossary()" in s)
    first = next(i for i, s in enumerate(srcs) if ".table(" in s or "snapshot()" in s or "print(pred)" in s)
    assert glossary < first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_an_exercise_with_a_collapsed_solution_and_a_recap(path):
    cells = _nb(path)
    solutions = [c for c in cells if c["cell_type"] == "code" and _src(c).startswith("#@title Solution")]
    assert solutions, f"{path.name} has no exercise solution"
    for c in solutions:  # collapsed in Colab (a form) and in JupyterLab
        assert c["metadata"].get("cellView") == "form" and c["metadata"]["jupyter"]["source_hidden"] is True
    assert any(c["cell_type"] == "markdown" and _src(c).startswith("## Recap") for c in cells)
    assert "Disconnect and delete runtime" in _src(cells[-1])


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] in ("01", "02")], ids=lambda p: p.name)
def test_instructor_notes_with_timings_and_a_workshop_preset(path):
    cells = _nb(path)
    notes = next(_src(c) for c in cells if _src(c).startswith("## Instructor notes"))
    assert "**Objectives.**" in notes and "| section | minutes | skip when short |" in notes
    assert "WORKSHOP = True" in notes and any("WORKSHOP = True" in _src(c) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_output_lines_fit_colab(path):
    long = []
    for i, c in enumerate(_nb(path)):
        for out in c.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            long += [(i + 1, len(line)) for line in text.splitlines() if len(line) > 120]
    assert not long, f"{path.name}: output lines over 120 characters (cell, length): {long[:5]}"


def test_readmes_table_opens_the_learner_copies_with_the_instructor_copy_beside():
    """README's notebook table: each row's badge opens the learner copy in Colab (at kit.REPO_URL), and an
    "instructor copy" link beside it opens the instructor copy."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    colab = f"https://colab.research.google.com/github/{kit.REPO_URL.split('github.com/')[1]}/blob/main/notebooks/"
    assert LEARNER, "no learner copies: make learner-notebooks"
    for path in NOTEBOOKS:
        row = next((ln for ln in readme.splitlines() if ln.startswith("| [") and f"learner/{path.name})" in ln), None)
        assert row, f"README's table has no row opening learner/{path.name}"
        assert f"colab-badge.svg)]({colab}learner/{path.name})" in row, \
            f"{path.name}: the badge must open the learner copy"
        assert f"[instructor copy](notebooks/{path.name})" in row and f"({colab}{path.name})" in row, path.name


def test_only_the_optional_bitsandbytes_kernels_trust_line_is_dropped(caplog):
    """With the `kernels` package (transformers >= 5.25 requires it), bitsandbytes' lookup of its optional CPU kernel
    logs, offline, that the publisher trust check is skipped: kit drops that line, and says the same of any other."""
    import logging

    import kit  # noqa: F401  (adds the filter)

    log = logging.getLogger("kernels._internals.hf_hub")
    with caplog.at_level(logging.WARNING, logger="kernels._internals.hf_hub"):
        for repo in ("kernels-community/quantization-bitsandbytes", "someone/their-kernel"):
            log.warning(f"Skipping publisher trust check for '{repo}' because Hugging Face Hub is in offline mode.")
    assert [r.getMessage().split("'")[1] for r in caplog.records] == ["someone/their-kernel"]


def test_a_fresh_kernels_first_kit_cell_writes_nothing_to_stderr():
    # nbval fails a cell with any stderr. bitsandbytes, imported through peft when the kit first loads transformers'
    # Trainer pieces, logs a warning about an optional CPU kernel on machines with AVX512-bf16; notebook 02's first
    # code cell failed nbval alone in a fresh kernel because of it.
    code = "import kit\nfrom kit.scenarios.cross_validation import notebook\nimport peft, bitsandbytes\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
