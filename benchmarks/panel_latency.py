"""How long the widget panel takes to answer one control change, at real size: wall and CPU time, per control.

Run: ``python benchmarks/panel_latency.py [--repeats 3] [--out benchmarks/results/panel_latency-DATE-DEVICE.md]``

The panel's change budget is 50 ms median and 200 ms at worst of CPU time per change, at
real size. For each case the panel is built once (that builds the model on the meta device and caches its
inventory), then each control is moved through its values, one change at a time, and the wall time and the CPU
time of ``control.value = v`` are recorded: the observer recomputes the estimate, the verdict (the reserved figure:
the allocator's model replayed over the step), the largest batch that fits (a bisection on the allocated estimate,
then one replay at the answer), the reasons, and renders the HTML. A change runs no search and no advisor (those
run on the button, or once the controls rest; ``benchmarks/advisor_latency.py`` times them): the rest timer is
off here, so that nothing but the change is timed. Before every change the kit's caches of replays and parameter
counts are emptied (outside the timed part), so each change is timed as a setup never seen; moving back to a value
seen before costs less. A change during which Python's cycle collector made a full pass (generation 2: it walks
every object in the process, hundreds of ms beside transformers, and falls on whichever allocation comes when it
is due) is counted apart, with the max of the other changes beside it. CPU time is the panel thread's own
(``time.thread_time``): on a shared machine the wall time also counts the time others held the CPU. No frontend
is attached, so this is the kernel side of a change; the browser adds one websocket round trip.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import tempfile
import time

from results_file import OUT_HELP, write_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KIT_SMOKE", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import llama70b  # noqa: E402

from kit import machine  # noqa: E402

BUDGET_MEDIAN_MS, BUDGET_MAX_MS = 50.0, 200.0
MOVES = {  # control -> values to step through (each a change from the previous one)
    "batch_size": [2, 4, 8, 16, 32, 1],
    "seq_len": [32, 64, 256, 512, 1024, 128],
    "quantization": ["8bit", "4bit", "none"],
    "precision": ["fp32", "bf16", "fp16"],
    "gradient_checkpointing": [False, True],
    "lora_r": [16, 64, 8],
    "optimizer": ["sgd", "adamw-8bit", "adamw"],
    "preset": ["h100", "this", "colab-t4"],
    # each scenario's story: scenario 1's head (ending on the low-rank head, so that its rank moves next), scenario
    # 2's fold loop
    "head": ["none", "vxv-16bit", "vxv", "low-rank"],
    "head_rank": [64, 512, 1024, 256],
    "folds": [3, 10, 5],
    "load": ["once", "each"],
    "trainer": ["released", "kept"],
    "recipe": ["lean", "2024"],
}
# a vision-language model's: its image controls, and sequence lengths that hold 1,377 image tokens (SmolVLM-Instruct's
# default image: 16 crops and a global view of 81 tokens each)
VISION_MOVES = {**MOVES, "seq_len": [1536, 2048, 1448, 4096], "images_per_row": [2, 1],
                "image_size": [768, 1024, 1536], "image_splitting": [False, True]}


def cases() -> list:
    """(label, scenario, model, panel options, moves): both scenarios at real size, a 70B config and a
    vision-language model."""
    path_70b = llama70b.write(tempfile.mkdtemp())
    return [("scenario 1 (distilgpt2+vocab-head)", 1, "distilgpt2+vocab-head", {}, MOVES),
            ("scenario 2 (Meta-Llama-3-8B, QLoRA)", 2, "meta-llama/Meta-Llama-3-8B", {}, MOVES),
            ("Llama-3.1-70B shapes, full fine-tune, bf16", 2, path_70b,
             dict(quantization="none", lora_r=0, precision="bf16", gradient_checkpointing=True, batch_size=1,
                  seq_len=512), MOVES),
            ("SmolVLM-Instruct, LoRA r16, its images", 2, "HuggingFaceTB/SmolVLM-Instruct",
             dict(quantization="none", lora_r=16, batch_size=1, seq_len=2048), VISION_MOVES)]


def _empty_caches() -> None:
    from kit.estimate import counts, reserved
    from kit.scenarios.custom_head import panel_head

    reserved.RUNS.clear()
    counts.COUNTED.clear()
    panel_head.low_rank_model.cache_clear()     # fix (b)'s model per rank (a new rank is a new model on the slider)
    panel_head.sixteen_bit.cache_clear()        # fix (c)'s settings per dtype


def measure(scenario: int, model: str, options: dict, repeats: int, moves: dict) -> dict:
    from kit import panel

    t = time.perf_counter()
    p = panel(scenario, model=model, **options)
    build_s = time.perf_counter() - t
    p.advice_view.rest_s = None   # the advisor on the button only: nothing but the change is timed
    p.advice_view.wait()
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    full: dict[str, list[float]] = {}   # the CPU time of changes during which a full collection ran
    passes = []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            passes.append(1)
    gc.callbacks.append(seen)
    for _ in range(repeats):
        for key, values in moves.items():
            w = p.controls.get(key)
            if w is None or w.disabled:   # a control of the other scenario, or one its setup turns off
                continue
            for v in values:
                v = min(v, w.max) if key == "seq_len" else v
                if v == w.value:
                    continue
                _empty_caches()
                passes.clear()
                t, c = time.perf_counter(), time.thread_time()
                w.value = v
                cpu.setdefault(key, []).append(1000 * (time.thread_time() - c))
                wall.setdefault(key, []).append(1000 * (time.perf_counter() - t))
                if passes:
                    full.setdefault(key, []).append(cpu[key][-1])
    gc.callbacks.remove(seen)
    return {"scenario": scenario, "model": model, "build_s": build_s, "wall": wall, "cpu": cpu, "full": full}


def report(labelled: list, repeats: int) -> str:
    import ipywidgets

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Panel latency at real size: one control change -> verdict and largest batch redrawn ({now})", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), device {machine.device_name()}, "
             f"Python {platform.python_version()}, ipywidgets {ipywidgets.__version__}. Budget: median "
             f"{BUDGET_MEDIAN_MS:.0f} ms and max {BUDGET_MAX_MS:.0f} ms of CPU time per change. Each control stepped "
             f"through its values {repeats} times; the kit's caches emptied before every change (a setup never "
             "seen); the advisor's rest timer off (a change never runs it).", "",
             "Command: `python benchmarks/panel_latency.py`", "",
             "| case | control | changes | CPU median ms | CPU max ms | wall median ms | wall max ms | "
             "changes with a full GC pass (their max CPU ms) | CPU max ms of the others |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for label, r in labelled:
        for key in r["cpu"]:
            c, w, f = r["cpu"][key], r["wall"][key], r["full"].get(key, [])
            lines.append(f"| {label} | {key} | {len(c)} | {statistics.median(c):.1f} | {max(c):.1f} | "
                         f"{statistics.median(w):.1f} | {max(w):.1f} | {_full(f)} | {_others(c, f)} |")
        every_cpu = [x for xs in r["cpu"].values() for x in xs]
        every_wall = [x for xs in r["wall"].values() for x in xs]
        every_full = [x for xs in r["full"].values() for x in xs]
        med, top = statistics.median(every_cpu), max(every_cpu)
        ok = med <= BUDGET_MEDIAN_MS and top <= BUDGET_MAX_MS
        verdicts.append(ok)
        lines.append(f"| **{label}** | **every change** (first build {r['build_s']:.1f} s) | {len(every_cpu)} | "
                     f"**{med:.1f}** | **{top:.1f}** | {statistics.median(every_wall):.1f} | {max(every_wall):.1f} | "
                     f"{_full(every_full)} | {_others(every_cpu, every_full)} |")
    lines += ["", "Per case, CPU time: " + ("every case within" if all(verdicts) else "NOT every case within")
              + f" the budget (median {BUDGET_MEDIAN_MS:.0f} ms, max {BUDGET_MAX_MS:.0f} ms).",
              "First build includes importing transformers and building the model on the meta device "
              "(once per model and process)."]
    return "\n".join(lines) + "\n"


def _full(full: list) -> str:
    return f"{len(full)} ({max(full):.1f})" if full else "0"


def _others(cpu: list, full: list) -> str:
    rest = list(cpu)
    for x in full:
        rest.remove(x)
    return f"{max(rest):.1f}" if rest else "-"


def main(argv=None) -> int:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--out", default=None, help=OUT_HELP)
    a.add_argument("--repeats", type=int, default=3)
    args = a.parse_args(argv)
    labelled = []
    for label, scenario, model, options, moves in cases():
        r = measure(scenario, model, options, args.repeats, moves)
        every = [x for xs in r["cpu"].values() for x in xs]
        print(f"{label}: CPU median {statistics.median(every):.1f} ms, max {max(every):.1f} ms over "
              f"{len(every)} changes", flush=True)
        labelled.append((label, r))
    text = report(labelled, args.repeats)
    print(text)
    write_table(text, args.out, "panel_latency", "cuda" if machine.has_cuda() else "cpu")
    ok = all(statistics.median(c := [x for xs in r["cpu"].values() for x in xs]) <= BUDGET_MEDIAN_MS
             and max(c) <= BUDGET_MAX_MS for _, r in labelled)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
