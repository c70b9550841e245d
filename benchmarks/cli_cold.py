"""What ``kit fit`` costs over ``kit estimate``, each run cold: a fresh Python process per command.

Issue 34's target: ``python -m kit fit``, cold, costs at most 1 s more than ``python -m kit estimate`` of the same
setup, cold. Both commands import the kit and transformers, build the model's inventory on the meta device and
estimate; ``fit`` then runs the advisor. The two are run in turn, ``--rounds`` times per setup, so the machine's
load falls on both alike; each figure is the median of the rounds, in wall time and in the CPU time of the child
process (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``), and the difference is taken round by round.

Run: ``python benchmarks/cli_cold.py [--rounds 5] [--out FILE]`` (a few minutes here).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from results_file import OUT_HELP, write_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 1.0
SETUPS = [   # (label, the estimate options both commands take)
    ("scenario 1: distilgpt2+vocab-head, batch 1, seq 128, fp16, accum 16",
     ["--model", "distilgpt2+vocab-head", "--batch-size", "1", "--seq-len", "128", "--precision", "fp16",
      "--grad-accum", "16"]),
    ("scenario 2: Meta-Llama-3-8B 4-bit, LoRA r8, batch 4, seq 64, fp16, checkpointing",
     ["--model", "meta-llama/Meta-Llama-3-8B", "--quantization", "4bit", "--lora-r", "8", "--batch-size", "4",
      "--seq-len", "64", "--precision", "fp16", "--gradient-checkpointing"]),
    ("gpt2, batch 16, seq 1024", ["--model", "gpt2", "--batch-size", "16", "--seq-len", "1024"]),
]
DEVICE = "colab-t4"


def timed(command: list) -> tuple:
    """(wall s, CPU s) of one command in a fresh process; it must succeed (a fit that does not fit exits 0 too)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kit", *command], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"`kit {' '.join(command)}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measured(options: list, rounds: int) -> dict:
    """Per command, the rounds' (wall, CPU) seconds, the two commands taken in turn."""
    runs = {"estimate": [], "fit": []}
    for _ in range(rounds):
        runs["estimate"].append(timed(["estimate", *options]))
        runs["fit"].append(timed(["fit", *options, "--device", DEVICE]))
    return runs


def report(table: list, rounds: int) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# `kit fit` against `kit estimate`, cold ({now})", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), Python {platform.python_version()}. "
             f"Each command in a fresh process, the two in turn, {rounds} rounds per setup; medians. CPU: the child "
             f"process's user + system time. `fit` judges against {DEVICE}. Target: `fit` at most "
             f"{TARGET_S:.0f} s over `estimate` (issue 34).", "",
             "Command: `python benchmarks/cli_cold.py`", "",
             "| setup | estimate wall s | fit wall s | fit - estimate wall s | estimate CPU s | fit CPU s | "
             "fit - estimate CPU s |", "|---|---:|---:|---:|---:|---:|---:|"]
    worst = 0.0
    for label, runs in table:
        est, fit = runs["estimate"], runs["fit"]
        extra_wall = statistics.median(f[0] - e[0] for e, f in zip(est, fit))
        extra_cpu = statistics.median(f[1] - e[1] for e, f in zip(est, fit))
        worst = max(worst, extra_wall, extra_cpu)
        lines.append(f"| {label} | {statistics.median(e[0] for e in est):.2f} | "
                     f"{statistics.median(f[0] for f in fit):.2f} | {extra_wall:+.2f} | "
                     f"{statistics.median(e[1] for e in est):.2f} | {statistics.median(f[1] for f in fit):.2f} | "
                     f"{extra_cpu:+.2f} |")
    lines += ["", f"Largest extra (wall or CPU): {worst:+.2f} s: "
              + ("within" if worst <= TARGET_S else "OVER") + f" the {TARGET_S:.0f} s target.", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help=OUT_HELP)
    args = parser.parse_args()
    table = []
    for label, options in SETUPS:
        table.append((label, measured(options, args.rounds)))
        print(f"{label}: done", flush=True)
    text = report(table, args.rounds)
    print(text)
    path = write_table(text, args.out, "cli_cold", "cpu")
    if path:
        print(f"written to {path}")


if __name__ == "__main__":
    main()
