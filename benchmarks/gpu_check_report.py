"""``make gpu-check``'s results: a readable Markdown table of verdicts and figures, and a JSON of every figure.

Every figure is labelled: MEASURED (a CUDA allocator reading), ESTIMATED (``kit.estimate``), or SET (the cap).

>>> from gpu_check_verdicts import fig, verdict
>>> print(figures_text({"peak": fig(2**30, "measured"), "cap": fig(None, "set")}))
peak 1.00 GiB (measured); cap not taken (set)
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict
from pathlib import Path

GiB = 1024 ** 3


def _gib(n) -> str:
    return "not taken" if n is None else f"{n / GiB:.2f} GiB"


def figures_text(figures: dict) -> str:
    return "; ".join(f"{k} {_gib(v['bytes'])} ({v['kind']})" for k, v in figures.items())


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(device: str, date: str, verdicts: list, results: list, grid: list, seen: dict, cap_bytes: int,
             work) -> str:
    """The report a person reads: the cap, the verdicts, the stages, the grid."""
    lines = [f"# gpu-check, {date}, {device}", "",
             f"GPU capped at **{cap_bytes:,} bytes ({cap_bytes / GiB:.2f} GiB)**, what a Colab T4 lets torch "
             "allocate, for the demo and the notebooks (`KIT_GPU_CAP_BYTES`, applied with "
             "`torch.cuda.set_per_process_memory_fraction`; reserved memory counts). The GPU tests and the grid "
             "ran uncapped. The demo and notebooks ran side by side, each in its own process; every reading "
             "checked is its process's own CUDA allocator (`cuda_allocated`).", "",
             f"Hub: `HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')}` (when 1, the real-size runs use the "
             "kit's architecture twins: random weights, the real shapes, so the real memory).", "",
             f"Scratch folder (logs, demo report, executed notebooks): `{work}`", "",
             "| check | verdict | figures | detail |", "|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {_cell(v['check'])} | **{v['status']}** | {_cell(figures_text(v['figures']))} | "
                     f"{_cell(v['detail'])} |")
    lines += ["", "## Stages", "", "| stage | budget | seconds | exit | command |", "|---|---:|---:|---|---|"]
    for r in results:
        exit_ = "timed out" if r.timed_out else r.rc
        lines.append(f"| {r.name} | {r.budget_s:g} | {r.seconds:g} | {exit_} | `{_cell(' '.join(r.cmd))}` |")
    if grid:
        lines += ["", "## Estimate against measured (the GPU grid, uncapped)", "",
                  "| setup | model | estimated peak | measured peak | error |", "|---|---|---:|---:|---:|"]
        for g in grid:
            lines.append(f"| {g['label']} | {g['model']} | {_gib(g['estimated_peak_bytes'])} (estimated) | "
                         f"{_gib(g['measured_peak_bytes'])} (measured) | {g['error_pct']:+.2f}% |")
    lines += ["", "## Cap confirmations", ""]
    lines += [f"- {d}: {line or 'no line'}" for d, line in seen.get("demos", {}).items()]
    lines += [f"- notebook kernel pid {k.get('pid')}: {k.get('cap')}" for k in seen.get("kernels", [])]
    failed = [r for r in results if not r.ok]
    if failed:
        lines += ["", "## Output of the stages that failed (last 40 lines each)"]
        for r in failed:
            tail = "\n".join(r.output.splitlines()[-40:])
            lines += ["", f"### {r.name}", "", "```", tail, "```"]
    return "\n".join(lines) + "\n"


def write(results_dir: Path, device: str, slug: str, verdicts: list, results: list, summary, grid: list,
          seen: dict, cap_bytes: int, work) -> tuple[Path, Path]:
    """Write ``gpu-check-<date>-<slug>.md`` and ``.json`` into ``results_dir``; returns both paths."""
    date = datetime.date.today().isoformat()
    results_dir.mkdir(parents=True, exist_ok=True)
    md, js = results_dir / f"gpu-check-{date}-{slug}.md", results_dir / f"gpu-check-{date}-{slug}.json"
    md.write_text(markdown(device, date, verdicts, results, grid, seen, cap_bytes, work))
    stages = [{k: v for k, v in asdict(r).items() if k != "output"} | {"output_tail": r.output[-4000:]}
              for r in results]
    js.write_text(json.dumps({"date": date, "device": device, "cap_bytes": cap_bytes, "verdicts": verdicts,
                              "stages": stages, "grid": grid, "cap_seen": seen, "summary": summary},
                             indent=1, default=str))
    return md, js
