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
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    table: tuple[list[str], list[list[str]]] | None = None
    pre: list[str] = field(default_factory=list)        # preformatted blocks (the kit's text tables)
    images: list[Path] = field(default_factory=list)


def to_markdown(title: str, sections: list[Section]) -> str:
    """The report as Markdown; images are linked by file name (they sit beside report.md)."""
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for p in s.paragraphs:
            out += [p, ""]
        if s.table:
            head, rows = s.table
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
            out.append("")
        for block in s.pre:
            out += ["```", block, "```", ""]
        for img in s.images:
            out += [f"![{Path(img).stem}]({Path(img).name})", ""]
    return "\n".join(out)


def _inline(text: str) -> str:
    """Escape, then turn Markdown's `code` and **bold** into HTML (the only markup the report uses)."""
    parts = html.escape(text).split("`")
    text = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def to_html(title: str, sections: list[Section]) -> str:
    """The report as one self-contained HTML page, PNGs embedded as data URLs."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        body.append(f"<h2>{html.escape(s.title)}</h2>")
        body += [f"<p>{_inline(p)}</p>" for p in s.paragraphs]
        if s.table:
            head, rows = s.table
            body.append("<table><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in head) + "</tr>")
            body += ["<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in r) + "</tr>" for r in rows]
            body.append("</table>")
        body += [f"<pre>{html.escape(block)}</pre>" for block in s.pre]
        for img in s.images:
            data = base64.b64encode(Path(img).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(Path(img).stem)}" src="data:image/png;base64,{data}">')
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.45}"
             "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}"
             "td:first-child,th:first-child{text-align:left}img{max-width:100%;margin:1em 0}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def write(out_dir: str | Path, title: str, sections: list[Section], summary: dict) -> list[Path]:
    """Write report.md, report.html and summary.json into ``out_dir``; return their paths."""
    out = Path(out_dir)
    paths = [out / "summary.json", out / "report.md", out / "report.html"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(to_markdown(title, sections))
    paths[2].write_text(to_html(title, sections))
    return paths
