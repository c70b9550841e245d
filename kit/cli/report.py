"""The demo's report: ``report.md``, ``report.html`` (images inline) and ``summary.json``.

A report is a list of :class:`Section`: a title, paragraphs, an optional table and
optional PNG figures. Markdown and HTML are both rendered from that structure, so
they always say the same thing.

>>> s = Section("Scenario 1", ["The head holds 97% of the memory."], table=(["a"], [["1"]]))
>>> "## Scenario 1" in to_markdown("Report", [s])
True
"""
from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    table: tuple[list[str], list[list[str]]] | None = None
    pre: list[str] = field(default_factory=list)        # preformatted blocks (the kit's text tables)
    images: list[Path] = field(default_factory=list)
    images_first: bool = False   # figures right after the paragraphs, before the table and blocks


def _order(section: Section, parts: dict) -> list:
    """The rendered parts of a section in reading order: paragraphs, then table, blocks, figures."""
    order = ["paragraphs", "images", "table", "pre"] if section.images_first else \
        ["paragraphs", "table", "pre", "images"]
    return [x for k in order for x in parts[k]]


def to_markdown(title: str, sections: list[Section]) -> str:
    """The report as Markdown; images are linked by file name (they sit beside report.md)."""
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        table = []
        if s.table:
            head, rows = s.table
            table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            table += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]
        out += _order(s, {"paragraphs": [x for p in s.paragraphs for x in (p, "")], "table": table,
                          "pre": [x for b in s.pre for x in ("```", b, "```", "")],
                          "images": [x for i in s.images for x in (f"![{Path(i).stem}]({Path(i).name})", "")]})
    return "\n".join(out)


def _inline(text: str) -> str:
    """Escape, then turn Markdown's `code` and **bold** into HTML (the only markup the report uses)."""
    parts = html.escape(text).split("`")
    text = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("**")
    text = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))
    return text.replace("  \n", "<br>\n")        # Markdown's hard line break


def _cell(cell) -> str:
    """A table cell: figures (bytes, ratios) right-aligned, words left-aligned."""
    figure = re.fullmatch(r"[-+]?[\d.,]+( ?%| ?[KMG]iB| B|x)?|n/a|not run", str(cell).strip())
    return f"<td class='n'>{_inline(str(cell))}</td>" if figure else f"<td>{_inline(str(cell))}</td>"


def to_html(title: str, sections: list[Section]) -> str:
    """The report as one self-contained HTML page, PNGs embedded as data URLs."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        body.append(f"<h2>{html.escape(s.title)}</h2>")
        table = []
        if s.table:
            head, rows = s.table
            table = ["<table><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in head) + "</tr>"]
            table += ["<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows]
            table.append("</table>")
        images = [f'<img alt="{html.escape(Path(i).stem)}" '
                  f'src="data:image/png;base64,{base64.b64encode(Path(i).read_bytes()).decode()}">' for i in s.images]
        body += _order(s, {"paragraphs": [f"<p>{_inline(p)}</p>" for p in s.paragraphs], "table": table,
                           "pre": [f"<pre>{html.escape(b)}</pre>" for b in s.pre], "images": images})
    style = ("body{font-family:sans-serif;max-width:64em;margin:2em auto;padding:0 1em;line-height:1.45}"
             "table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:left;vertical-align:top}"
             "td.n{text-align:right;white-space:nowrap}img{max-width:100%;margin:1em 0}"
             # the kit's text tables: wrap long lines instead of running off the page, scroll if still too wide
             "pre{white-space:pre-wrap;overflow-wrap:anywhere;overflow-x:auto;font-size:.8em;"
             "background:#f6f6f6;padding:.6em .8em;border-radius:4px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


NAMES = ("summary.json", "report.md", "report.html")   # what write() writes


def write(out_dir: str | Path, title: str, sections: list[Section], summary: dict) -> list[Path]:
    """Write report.md, report.html and summary.json into ``out_dir``; return their paths."""
    out = Path(out_dir)
    paths = [out / n for n in NAMES]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(to_markdown(title, sections))
    paths[2].write_text(to_html(title, sections))
    return paths
