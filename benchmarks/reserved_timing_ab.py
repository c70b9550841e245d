"""The reserved figure's CPU time, this tree's layout and allocator model against another revision's, alternately.

On a shared machine the time of a run swings by more than a change to the allocator saves, so
``reserved_timing.py`` run twice, an hour apart, compares the machine's load. Here both versions of
``kit/estimate/reserved.py`` and ``kit/estimate/allocator.py`` (this tree's and ``--against``'s, read with
``git show``) lay out and replay the same setups in one process, one after the other, ``--rounds`` times per
setup: the median CPU time (``process_time``) of each, with the replay cache emptied before each run. The
estimate the layout reads is this tree's for both. Setups: the slowest of ``reserved_timing.py`` (``--setups`` of
them, by their median in ``--ranked``, a results file it wrote).

Run (a minute):
``python benchmarks/reserved_timing_ab.py --against main --ranked benchmarks/results/reserved_timing-DATE-cpu.md``
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

from results_file import OUT_HELP, write_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kit import model_configs  # noqa: E402
from kit.estimate import estimate  # noqa: E402
from kit.estimate import reserved as kr  # noqa: E402
from reserved_timing import SETUPS  # noqa: E402


def _module_at(revision: str, path: str, name: str, rewrite=lambda source: source):
    """``path`` as it is at ``revision``, loaded as a module of its own called ``name``."""
    source = subprocess.run(["git", "-C", ROOT, "show", f"{revision}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(rewrite(source))
    spec = importlib.util.spec_from_file_location(name, file.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # (dataclasses look their module up while the class is made)
    spec.loader.exec_module(module)
    os.unlink(file.name)
    return module


def layout_at(revision: str):
    """``kit/estimate/reserved.py`` as it is at ``revision``, on that revision's ``allocator.py``."""
    tag = "".join(ch if ch.isalnum() else "_" for ch in revision)
    _module_at(revision, "kit/estimate/allocator.py", f"allocator_at_{tag}")
    return _module_at(revision, "kit/estimate/reserved.py", f"reserved_at_{tag}", lambda source: source.replace(
        "from kit.estimate.allocator import", f"from allocator_at_{tag} import"))


def slowest(ranked: str, count: int) -> list:
    """(model, setup label) of the ``count`` slowest medians in a ``reserved_timing.py`` results file, of the
    setups it times by name (``SETUPS``)."""
    rows = []
    with open(ranked) as file:
        for line in file:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if len(cells) == 4 and cells[1] in SETUPS:
                rows.append((float(cells[2]), cells[0], cells[1]))
    return [(model, label) for _, model, label in sorted(rows, reverse=True)[:count]]


def compared(model: str, label: str, modules: dict, rounds: int) -> dict:
    """CPU ms of the reserved figure of one setup per module, ``rounds`` runs each, the modules taken in turn."""
    options = dict(SETUPS[label], task="seq-cls") if model in model_configs.ENCODERS else SETUPS[label]
    est = estimate(model, device="cuda", **options)
    times = {name: [] for name in modules}
    this_layout = kr.step_trace, kr.Replayer
    for _ in range(rounds):
        for name, module in modules.items():
            kr.step_trace, kr.Replayer = module.step_trace, module.Replayer
            kr.RUNS.clear()
            start = time.process_time()
            est.context.reserve(est.peak_bytes)
            times[name].append(1000 * (time.process_time() - start))
    kr.step_trace, kr.Replayer = this_layout
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default="main", help="the git revision to compare with (default: main)")
    parser.add_argument("--ranked", required=True, help="a results file of reserved_timing.py: which setups")
    parser.add_argument("--setups", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None, help=OUT_HELP)
    args = parser.parse_args()
    this_tree = types.SimpleNamespace(step_trace=kr.step_trace, Replayer=kr.Replayer)
    modules = {args.against: layout_at(args.against), "this tree": this_tree}
    lines = [f"# Reserved figure: this tree's layout and allocator model against {args.against}'s, CPU time", "",
             f"Both lay out and replay the same setups in one process, alternately, {args.rounds} runs each per setup "
             f"(the replay cache emptied before each); setups: the {args.setups} slowest medians of "
             f"{os.path.basename(args.ranked)}.", "",
             f"Command: `python benchmarks/reserved_timing_ab.py --against {args.against} --ranked {args.ranked}`", "",
             f"| model | setup | {args.against} median ms | this tree median ms | ratio |", "|---|---|---:|---:|---:|"]
    for model, label in slowest(args.ranked, args.setups):
        times = compared(model, label, modules, args.rounds)
        before, after = statistics.median(times[args.against]), statistics.median(times["this tree"])
        lines.append(f"| {model} | {label} | {before:.1f} | {after:.1f} | {after / before:.2f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    path = write_table(text, args.out, "reserved_timing_ab", "cpu")
    if path:
        print(f"written to {path}")


if __name__ == "__main__":
    main()
