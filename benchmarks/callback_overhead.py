"""How much does the memory callback slow training? Step time with and without it (and with kit.watch),
and what `%load_ext kit` costs each notebook cell.

Runs Trainer.train() on a tiny twin in one process, with the variants interleaved
(ABC, CBA, ABC, ...) so drift in the machine's load hits them alike. A step is timed
from on_step_begin to on_step_end, which contains the callback's sampling; the mean
(not the median) is compared, so rare expensive samples count. Prints a Markdown table.

    python benchmarks/callback_overhead.py                       # ~1-2 min on 2 CPU cores
    python benchmarks/callback_overhead.py --out benchmarks/results/callback_overhead-$(date +%F)-cpu.md
    python benchmarks/callback_overhead.py --cells-only          # the per-cell cost of `%load_ext kit` alone

The cell table runs `pass` cells in a real IPython shell (InteractiveShell), with transformers loaded, as
in a notebook: without the extension, with its default readings, and with `%kit_cells live`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402
from results_file import OUT_HELP, write_table  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from kit import data, machine
from kit.measure.track import Tracker  # noqa: E402
from kit.models import build_model  # noqa: E402
from kit.plot.live import LivePlot  # noqa: E402


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times, self._t = [], None

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self._t)


def _with_live_plot(tracker, folder):
    LivePlot(tracker, folder=folder)        # redraws on the tracker's samples, within the callback's budget
    return [tracker.callback()]


class _Timed:
    """Counts the time spent in the watch's phase callback (it sets two attributes per event)."""

    def __init__(self, cb):
        self.spent_s = 0.0
        for name in ("on_train_begin", "on_step_begin", "on_pre_optimizer_step", "on_optimizer_step",
                     "on_step_end", "on_train_end"):
            setattr(cb, name, self._wrap(getattr(cb, name)))

    def _wrap(self, fn):
        def timed(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            self.spent_s += time.perf_counter() - t
            return out
        return timed


def _watch(plot):
    # kit.watch attaches to the built Trainer: run() calls this with it (the estimate is made here, before train())
    def attach(trainer, folder):
        import kit

        w = kit.watch(trainer, plot=folder if plot else False)
        return w, [w.callback, _Timed(w.phases)]
    return lambda t, d: attach


VARIANTS = {
    "no callback": lambda t, d: [],
    "callback (default: adaptive, 1% budget)": lambda t, d: [t.callback()],
    "callback + LivePlot (PNG, headless)": _with_live_plot,
    "kit.watch(trainer, plot=False): phases + callback": _watch(False),
    "kit.watch(trainer, plot=folder): + LivePlot (PNG, headless)": _watch(True),
    "every 10 steps with the live-tensor walk (not a default)": lambda t, d: [t.callback(10, live_tensors=True)],
}


def run(model, ds, tok, variant, steps, bs, out_dir):
    tracker = Tracker()
    timer = StepTimer()
    args = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=bs,
                             use_cpu=not machine.has_cuda(), report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    extra = VARIANTS[variant](tracker, Path(out_dir) / "live")
    attach = extra if callable(extra) else None
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=data.collator(tok),
                      callbacks=[timer] + ([] if attach else extra))
    if attach:
        w, extra = attach(trainer, Path(out_dir) / "live")
        tracker = w.tracker
    t, c = time.perf_counter(), time.process_time()
    trainer.train()
    total, cpu = time.perf_counter() - t, time.process_time() - c
    samples = [s for s in tracker.samples if s.event == "step"]
    return {"steps": timer.times[1:], "total": total, "cpu": cpu,   # the first step warms caches
            "inside": sum(cb.spent_s for cb in extra),               # measured by the callback itself
            "samples": len(samples), "live": sum(s.has_live for s in samples)}


def cells(n: int) -> list[str]:
    """The per-cell cost of `%load_ext kit`: run_cell wall time, and the extension's own readings."""
    from IPython.core.interactiveshell import InteractiveShell

    from kit.measure import cells as cell_memory

    ip = InteractiveShell.instance()
    ip.run_cell("import torch")
    rows = []
    for mode in ("not loaded", "cheap", "live"):
        if mode != "not loaded":
            ip.run_line_magic("load_ext", "kit")
            ip.run_line_magic("kit_cells", mode)
        cm = cell_memory.current(ip)
        wall, own = [], []
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            for _ in range(n):
                t = time.perf_counter()
                ip.run_cell("pass")
                wall.append(time.perf_counter() - t)
                own.append(cm.cost_s if cm else 0.0)
        rows.append(f"| {mode} | {statistics.median(wall) * 1e3:.2f} | {statistics.mean(wall) * 1e3:.2f} | "
                    f"{statistics.median(own) * 1e3:.2f} | {max(own) * 1e3:.2f} |")
        if mode != "not loaded":
            ip.run_line_magic("unload_ext", "kit")
    InteractiveShell.clear_instance()
    return ["", f"## `%load_ext kit`: the cost per cell ({n} `pass` cells per mode, transformers loaded)", "",
            "Wall time of `run_cell` and the extension's own readings (pre_run_cell + post_run_cell), in ms.", "",
            "| readings | run_cell median | run_cell mean | readings median | readings max |",
            "|---|---:|---:|---:|---:|"] + rows


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-gpt2")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--reps", type=int, default=4, help="runs per variant, interleaved")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads; 1 keeps step times steady on a shared machine (0: torch's default)")
    p.add_argument("--out", default=None, help=OUT_HELP)
    p.add_argument("--cells", type=int, default=200, help="`pass` cells per mode for the %%load_ext kit table")
    p.add_argument("--cells-only", action="store_true", help="only the %%load_ext kit table")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.cells_only:
        table = "\n".join(cells(a.cells)[1:]) + "\n"
        print(table)
        return table

    tok = data.load_tokenizer(a.model)
    ds = data.tokenize(data.load_text_dataset(), tok, max_length=a.seq_len)["train"]
    model = build_model(a.model, device=machine.device_name())
    names = list(VARIANTS)
    res = {n: {"steps": [], "total": [], "cpu": [], "inside": [], "samples": 0, "live": 0} for n in names}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        run(model, ds, tok, names[0], 3, a.batch_size, tmp)   # warm-up, not counted
        for rep in range(a.reps):
            for n in (names if rep % 2 == 0 else names[::-1]):
                r = run(model, ds, tok, n, a.steps, a.batch_size, tmp)
                res[n]["steps"] += r["steps"]
                for k in ("total", "cpu", "inside"):
                    res[n][k].append(r[k])
                res[n]["samples"] += r["samples"]
                res[n]["live"] += r["live"]
                print(f"  rep {rep + 1}/{a.reps} {n}: mean step {statistics.mean(r['steps']) * 1e3:.1f} ms",
                      file=sys.stderr)
    load1 = os.getloadavg()[0]
    base = statistics.mean(res[names[0]]["steps"])
    base_cpu = statistics.mean(res[names[0]]["cpu"])
    hw = machine.hardware()
    lines = [
        f"# Callback overhead: {a.model}, batch {a.batch_size} x {a.seq_len} tokens, fp32, "
        f"{'CUDA ' + str(hw['gpu_name']) if machine.has_cuda() else 'CPU'}",
        "",
        f"`python benchmarks/callback_overhead.py --steps {a.steps} --reps {a.reps} --batch-size {a.batch_size} "
        f"--seq-len {a.seq_len} --threads {a.threads}` on {time.strftime('%Y-%m-%d')}: {hw['cpu_cores']} CPU cores "
        f"({torch.get_num_threads()} torch threads), "
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}; "
        f"load average {load0:.1f} at start, {load1:.1f} at end.",
        f"{a.reps} interleaved runs of {a.steps} steps per variant; the first step of each run is left out.",
        "",
        "Columns: mean wall time per step and its ratio to no callback; the ratio of the CPU time of",
        "`train()` (steadier than wall time when other jobs share the machine); and the time spent",
        "inside the callback (its readings and the LivePlot redraws it triggers) as a share of `train()`,",
        "measured directly, so machine noise does not blur it.",
        "",
        "| variant | mean step (ms) | stdev (ms) | step ratio | train() CPU ratio | inside callback "
        "| step samples / with live walk |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in names:
        st, r = res[n]["steps"], res[n]
        inside = sum(r["inside"]) / sum(r["total"])
        lines.append(f"| {n} | {statistics.mean(st) * 1e3:.1f} | {statistics.stdev(st) * 1e3:.1f} | "
                     f"{statistics.mean(st) / base:.3f} | {statistics.mean(r['cpu']) / base_cpu:.3f} | "
                     f"{inside * 100:.2f}% | {r['samples']} / {r['live']} |")
    d = res[names[1]]
    inside = sum(d["inside"]) / sum(d["total"]) * 100
    over = statistics.mean(d["steps"]) / base - 1
    lines += ["", f"Default callback: {inside:.2f}% of train() spent inside it (measured directly); "
              f"step time {over * 100:+.1f}% against no callback (includes machine noise). Target: at most 3%."]
    wn = [n for n in names if n.startswith("kit.watch")]
    lines += [f"{n.split(':')[0]}: {sum(res[n]['inside']) / sum(res[n]['total']) * 100:.2f}% of train() inside its "
              f"callbacks (the tracker's, with the redraws, and the phase markers)." for n in wn]
    lines += cells(a.cells)
    table = "\n".join(lines) + "\n"
    print(table)
    write_table(table, a.out, "callback_overhead", "cuda" if machine.has_cuda() else "cpu")
    return table


if __name__ == "__main__":
    main()
