"""Notebook shape: badge first, one install cell with the kit's URL, thin cells after prose.

The notebooks themselves run under nbval (`make test` passes `--nbval-lax notebooks`).
"""
import json
from pathlib import Path

import pytest

import kit

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _cells(path):
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def test_there_are_notebooks():
    assert any(p.name.startswith("00_") for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badge_and_install_cell_use_the_one_repo_url(path):
    cells = _cells(path)
    slug = kit.REPO_URL.split("github.com/")[1]
    assert cells[0][0] == "markdown"
    assert f"colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}" in cells[0][1], (
        f"{path.name}: the badge must point at kit.REPO_URL ({kit.REPO_URL}); update it after changing REPO_URL"
    )
    installs = [src for kind, src in cells if kind == "code" and "%pip install" in src]
    assert len(installs) == 1, "exactly one install cell"
    assert f'KIT_REPO_URL = "{kit.REPO_URL}"' in installs[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_are_short_and_follow_prose(path):
    cells = _cells(path)
    for i, (kind, src) in enumerate(cells):
        if kind != "code":
            continue
        lines = [ln for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(lines) <= 10, f"{path.name} cell {i + 1} has {len(lines)} lines; move logic into kit/"
        assert cells[i - 1][0] == "markdown", f"{path.name} cell {i + 1} has no sentence of prose before it"
