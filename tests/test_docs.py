"""README is a front door and docs/ holds the rest: every relative link in README.md and docs/*.md resolves to a
file (and an anchor to a heading of that file), README stays short, and it opens with the two commands and a
Colab badge (issue 33, item 3)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", _outside_code(page.read_text()), re.MULTILINE)}


def _relative_links(page: Path) -> list:
    return [t for t in LINK.findall(_outside_code(page.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves_to_a_file_and_its_anchor_to_a_heading(page):
    broken = []
    for target in _relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in _anchors(file)):
            broken.append(f"{target}: no heading '{anchor}' in {file.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_link_checker_sees_links_and_headings():
    readme = ROOT / "README.md"
    assert "docs/cli-and-api.md#setting-up-and-the-tests" in _relative_links(readme)
    assert _anchor("What `demo` writes") == "what-demo-writes"
    assert "the-caching-allocator-reserved-beside-allocated" in _anchors(ROOT / "docs/how-the-estimate-works.md")


def test_readme_is_at_most_1500_words_outside_code_blocks():
    words = len(_outside_code((ROOT / "README.md").read_text()).split())
    assert words <= 1500, f"README.md has {words} words outside code blocks"


def test_readme_opens_with_the_two_commands_and_a_colab_badge():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:60])
    assert "make demo" in head and "make test" in head
    assert "colab.research.google.com/assets/colab-badge.svg" in head


def test_readme_shows_one_picture_that_is_in_the_repository():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    pictures = [i for i in images if not i.startswith("https://colab.research.google.com/assets/")]   # not the badges
    assert len(pictures) == 1 and pictures[0].endswith(".png") and (ROOT / pictures[0]).is_file()


def _summary(name: str, pattern: str) -> tuple:
    text = (ROOT / "benchmarks/results" / name).read_text()
    return re.search(pattern, text).groups()


def _quoted(page: str, benchmark: str) -> list:
    """The results files of ``benchmark`` that ``page`` links."""
    return sorted(set(re.findall(rf"benchmarks/results/({benchmark}-[\w-]+-cpu\.md)", (ROOT / page).read_text())))


def test_readme_quotes_the_accuracy_its_results_file_holds():
    readme = " ".join((ROOT / "README.md").read_text().split())
    [name] = _quoted("README.md", "estimate_vs_measured")
    median, worst, setups = _summary(name, r"Peak error: median ([\d.]+)%, worst ([\d.]+)% over (\d+)")
    assert f"within {worst}% of the measured one in all {setups} setups" in readme and f"(median {median}%)" in readme


@pytest.mark.parametrize("benchmark, pattern, quoted", [
    ("estimate_vs_measured", r"Peak error: median ([\d.]+)%, worst ([\d.]+)% over (\d+)",
     "median {0}%, worst {1}% over {2} setups"),
    ("families", r"Peak error: median ([\d.]+)%, worst ([\d.]+)% over (\d+)", "median {0}%, worst {1}% over {2} rows"),
    ("multi_gpu", r"Worst error: ([\d.]+)% over (\d+)", "worst error {0}% over {1}"),
])
def test_the_accuracy_page_quotes_its_results_files(benchmark, pattern, quoted):
    page = " ".join((ROOT / "docs/accuracy.md").read_text().split())
    names = _quoted("docs/accuracy.md", benchmark)
    assert names and all(quoted.format(*_summary(name, pattern)) in page for name in names)


# A band the docs quote from the tests, "LOW to HIGH (`tests/a.py`, `tests/b.py`)": each file asserts that band.
BAND = re.compile(r"(\d\.\d+) to (\d\.\d+):? \(((?:`tests/\w+\.py`(?:; [^)]*|, )?)+)\)")


def _quoted_bands():
    for page in PAGES:
        text = " ".join(page.read_text().split())
        for low, high, cited in BAND.findall(text):
            yield page.name, low, high, re.findall(r"`(tests/\w+\.py)`", cited)


def test_every_ratio_band_the_docs_quote_from_a_test_is_the_band_that_test_asserts():
    quoted = list(_quoted_bands())
    assert len(quoted) >= 6, quoted      # accuracy (4), how the estimate works (1), the CLI page (2)
    wrong = [(page, f"{low} to {high}", test) for page, low, high, tests in quoted for test in tests
             if not re.search(rf"\b{re.escape(low)} <= [\w.\[\]\"' ]+ <= {re.escape(high)}\b",
                              (ROOT / test).read_text())]
    assert not wrong, f"quoted bands that the cited test does not assert: {wrong}"


def test_the_band_check_sees_a_band_its_test_does_not_hold():
    text = "the loop at 0.99 to 1.00 (`tests/test_loop.py`)"
    low, high, cited = BAND.findall(text)[0]
    assert (low, high, cited) == ("0.99", "1.00", "`tests/test_loop.py`")
    assert not re.search(rf"\b{low} <= [\w.\[\]\"' ]+ <= {high}\b", (ROOT / "tests/test_loop.py").read_text())


def _pinned_counts(test_file: str) -> set:
    """The model ids a test file pins to a parameter count: ``"id": 1_234_567,`` in a dict of its own."""
    return set(re.findall(r'^\s*"([\w./+-]+)": \d[\d_]{6,},', (ROOT / test_file).read_text(), re.MULTILINE))


def test_every_shipped_id_the_docs_list_is_pinned_where_they_say():
    from kit.model_configs import known_models

    text = " ".join((ROOT / "docs/cli-and-api.md").read_text().split())
    paragraph = re.search(r"Shipped by their exact Hub ids \((.*?)\), so they work offline: (.*?) Any other", text)
    claim, listed = paragraph.groups()
    ids = re.findall(r"`([\w./+-]+)`", listed)
    elsewhere = [i for i in re.findall(r"`([\w./+-]+)`", claim) if i in ids]
    assert len(ids) >= 20 and len(elsewhere) == 4
    published, models = _pinned_counts("tests/test_shipped_configs.py"), _pinned_counts("tests/test_models.py")
    assert "in `tests/test_shipped_configs.py`" in claim and "in `tests/test_models.py`" in claim
    assert [i for i in ids if i not in known_models()] == []
    assert [i for i in ids if i not in (models if i in elsewhere else published)] == []
