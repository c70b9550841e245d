"""The report writer: Markdown and HTML from one structure, figures where the section puts them."""
from pathlib import Path

from kit.cli import report
from kit.cli.report import Section

PNG = bytes.fromhex("89504e470d0a1a0a")          # enough of a PNG for an <img> data URL


def _sections(tmp_path: Path):
    img = tmp_path / "fig.png"
    img.write_bytes(PNG)
    return [Section("Glance", ["the story"], table=(["a"], [["1"]]), pre=["x" * 300], images=[img],
                    images_first=True),
            Section("Later", ["more"], table=(["b"], [["2"]]), images=[img])]


def test_images_first_puts_the_figure_before_the_table(tmp_path):
    md = report.to_markdown("R", _sections(tmp_path))
    first, later = md.split("## Later")
    assert first.index("![fig](fig.png)") < first.index("| a |") < first.index("```")
    assert later.index("| b |") < later.index("![fig](fig.png)")      # the default order is unchanged
    page = report.to_html("R", _sections(tmp_path))
    glance = page.split("<h2>Later</h2>")[0]
    assert glance.index("<img") < glance.index("<table>") < glance.index("<pre>")


def test_markdown_links_images_by_relative_name(tmp_path):
    report.write(tmp_path, "R", _sections(tmp_path), {"ok": True})
    md = (tmp_path / "report.md").read_text()
    assert "](fig.png)" in md and str(tmp_path) not in md


def test_preformatted_blocks_wrap_instead_of_running_off_the_page(tmp_path):
    page = report.to_html("R", _sections(tmp_path))
    style = page.split("<style>")[1].split("</style>")[0]
    pre = style.split("pre{")[1].split("}")[0]
    assert "white-space:pre-wrap" in pre and "overflow-x:auto" in pre and "font-size" in pre


def test_html_keeps_line_breaks_and_aligns_figures_right():
    page = report.to_html("R", [Section("S", ["GPU: none  \nRAM: 8 GiB"],
                                        table=(["run", "peak"], [["fix (a)", "21.02 MiB"], ["x", "not run"]]))])
    assert "GPU: none<br>" in page
    assert "<td>fix (a)</td><td class='n'>21.02 MiB</td>" in page and "<td class='n'>not run</td>" in page
