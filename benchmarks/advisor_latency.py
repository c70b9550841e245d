"""How long the fit advisor takes: ``advise()`` in full, and the panel's cheap path (``max_batch_size``).

Run: ``python benchmarks/advisor_latency.py [--repeats 20] [--out benchmarks/results/advisor_latency-DATE-DEVICE.md]``
(the default ``--out`` is that path, with today's date and ``cpu`` or ``cuda``).

The panel never runs the advisor on a change (it runs on a button, or once the controls rest); the targets
(issue 34) are 150 ms for 8B QLoRA on a T4 and 500 ms for a 70B full fine-tune on an H100, warm, in CPU time.
*First*: the first call on the model in this process (it imports the model's transformers classes too).
*Cold*: the model's inventory caches are emptied first, so the call builds the model on the meta device again
(imports already done). *Warm, new*: the model cached, but the kit's caches of allocator replays and parameter
counts emptied before each call, so every estimate and replay is made again (a setup never advised before).
*Warm, again*: the same call again, every cache kept. Each figure is the median CPU time (``time.process_time``;
the machine is shared, so wall time says more about the neighbours) of ``--repeats`` runs (cold: a third as many,
at least 3), on each case's device.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

from results_file import OUT_HELP, write_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import llama70b  # noqa: E402

TARGETS_MS = {"scenario 2": 150.0, "70B": 500.0}   # issue 34's targets, warm CPU time, by the label's start
CASES = [  # (label, estimate() options, advise() keywords, device)
    ("scenario 1: distilgpt2+vocab-head, batch 1, seq 128, fp16, accum 16",
     dict(model="distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16", grad_accum=16), {}, "colab-t4"),
    ("scenario 2: Meta-Llama-3-8B 4-bit, LoRA r8, batch 4, seq 64, fp16, checkpointing",
     dict(model="meta-llama/Meta-Llama-3-8B", quantization="4bit", lora_r=8, batch_size=4, seq_len=64,
          precision="fp16", gradient_checkpointing=True), {}, "colab-t4"),
    ("Qwen2.5-7B full FT, bf16, batch 1, seq 512",
     dict(model="Qwen/Qwen2.5-7B", batch_size=1, seq_len=512, precision="bf16"), {}, "colab-t4"),
    ("Llama-3.2-1B full FT, fp32, batch 8, seq 512",
     dict(model="meta-llama/Llama-3.2-1B", batch_size=8, seq_len=512), {}, "colab-t4"),
    ("gpt2 full FT, batch 16, seq 1024, eager, adamw",
     dict(model="gpt2", batch_size=16, seq_len=1024, attn_implementation="eager", optimizer="adamw"), {}, "colab-t4"),
    ("Llama-3.2-1B LoRA r16 bf16, batch 2, seq 512, eval batch 64 (evaluates)",
     dict(model="meta-llama/Llama-3.2-1B", batch_size=2, seq_len=512, lora_r=16, load_dtype="bf16",
          precision="bf16", eval_batch_size=64), {"evaluates": True}, "colab-t4"),
]


def cases() -> list:
    """CASES, and a 70B full fine-tune (Llama-3.1-70B's shapes: benchmarks/llama70b.py) on an H100."""
    path = llama70b.write(tempfile.mkdtemp())
    return CASES + [("70B full FT (Llama-3.1-70B shapes), bf16, batch 1, seq 512, on an H100",
                     dict(model=path, batch_size=1, seq_len=512, precision="bf16"), {}, "h100")]


def _clear_caches():
    from kit.estimate import inventory

    inventory._cached.cache_clear()
    inventory._CONFIG_CACHE.clear()
    inventory.lora_matches.cache_clear()


def _empty_replays():
    from kit.estimate import counts, reserved

    reserved.RUNS.clear()
    counts.COUNTED.clear()


def _ms(fn, before=None) -> float:
    if before is not None:
        before()
    t = time.process_time()
    fn()
    return 1000 * (time.process_time() - t)


def measure(label, opts, kw, device, repeats) -> dict:
    from kit.advise import advise, max_batch_size, max_seq_len
    from kit.advise import search as advise_search

    cold = []
    for _ in range(1 + max(3, repeats // 3)):   # the first one imports
        _clear_caches()
        _empty_replays()
        cold.append(_ms(lambda: advise(opts, device, **kw)))
    # the estimates made in full: the setup's own (estimate) and each candidate replayed (finished; a candidate
    # whose weights and optimizer state alone are over the limit is planned and counted, not replayed)
    calls, real_estimate, real_finished = [], advise_search.estimate, advise_search.finished
    advise_search.estimate = lambda *a, **k: calls.append(1) or real_estimate(*a, **k)
    advise_search.finished = lambda *a, **k: calls.append(1) or real_finished(*a, **k)
    try:
        a = advise(opts, device, **kw)
    finally:
        advise_search.estimate, advise_search.finished = real_estimate, real_finished
    new = [_ms(lambda: advise(opts, device, **kw), _empty_replays) for _ in range(repeats)]
    warm = [_ms(lambda: advise(opts, device, **kw)) for _ in range(repeats)]
    batch = [_ms(lambda: max_batch_size(opts, device), _empty_replays) for _ in range(repeats)]
    seq = [_ms(lambda: max_seq_len(opts, device), _empty_replays) for _ in range(repeats)]
    return dict(label=label, advice=a, estimates=len(calls), cold=cold, new=new, warm=warm, batch=batch, seq=seq,
                device=device)


def report(rows, repeats) -> str:
    import torch
    import transformers

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Fit advisor latency ({now})", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
             f"{'cuda' if torch.cuda.is_available() else 'cpu'}, Python {platform.python_version()}, torch "
             f"{torch.__version__}, transformers {transformers.__version__}. CPU time (process_time), medians of "
             f"{repeats} warm runs and {max(3, repeats // 3)} cold ones; the reserved figure judged (no safety "
             "fraction). Targets (warm CPU time): 150 ms for 8B QLoRA on a T4, 500 ms for a 70B full fine-tune on "
             "an H100.", "",
             "Command: `python benchmarks/advisor_latency.py`", "",
             "| setup | device | fits | suggestions | estimates per advise() | advise() first ms | advise() cold ms | "
             "advise() warm, new ms (max) | advise() warm, again ms | max_batch_size() ms | max_seq_len() ms | "
             "top suggestion |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        a = r["advice"]
        top = f"`{a.suggestions[0].cli}`" if a.suggestions and a.suggestions[0].fits else \
            ("(fits as it is)" if a.fits else "none fits: " + (a.notes[0].split(":")[0] if a.notes else ""))
        lines.append(f"| {r['label']} | {r['device']} | {'yes' if a.fits else 'no'} | {len(a.suggestions)} | "
                     f"{r['estimates']} | {r['cold'][0]:.0f} | {statistics.median(r['cold'][1:]):.0f} | "
                     f"{statistics.median(r['new']):.1f} ({max(r['new']):.1f}) | {statistics.median(r['warm']):.1f} "
                     f"| {statistics.median(r['batch']):.1f} | {statistics.median(r['seq']):.1f} | {top} |")
    for start, target in TARGETS_MS.items():
        for r in rows:
            if r["label"].startswith(start):
                got = statistics.median(r["new"])
                lines += ["", f"{r['label']}: warm, new, {got:.0f} ms: " + ("within" if got <= target else "OVER")
                          + f" the {target:.0f} ms target."]
    lines += ["", "First includes importing the model's transformers classes; cold, building the model on the meta "
              "device (once per model and process). The panel runs advise() only on its button or once the "
              "controls rest; on a change it runs max_batch_size() alone (benchmarks/panel_latency.py)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None, help=OUT_HELP)
    args = p.parse_args(argv)
    rows = []
    for label, opts, kw, device in cases():
        rows.append(measure(label, opts, kw, device, args.repeats))
        print(f"{label}: warm, new: median {statistics.median(rows[-1]['new']):.1f} ms CPU", flush=True)
    text = report(rows, args.repeats)
    print(text)
    write_table(text, args.out, "advisor_latency", dev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
