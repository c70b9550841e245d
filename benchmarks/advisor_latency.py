"""How long the fit advisor takes: ``advise()`` in full, and the panel's cheap path (``max_batch_size``).

Run: ``python benchmarks/advisor_latency.py [--repeats 20] [--out benchmarks/results/advisor_latency-DATE-DEVICE.md]``
(the default ``--out`` is that path, with today's date and ``cpu`` or ``cuda``).

The panel's budget is 50 ms per change. *First*: the first call on the model in this process (it imports
the model's transformers classes too). *Cold*: the model's inventory caches are emptied first, so the
call builds the model on the meta device again (imports already done). *Warm*: the same call again, the model cached; every call redoes all its estimates (the
advisor caches them within one call only). Each figure is the median of ``--repeats`` runs
(cold: a third as many, at least 3), on colab-t4.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

from results_file import OUT_HELP, write_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BUDGET_MS = 50.0
DEVICE = "colab-t4"
CASES = [  # (label, estimate() options, advise() keywords)
    ("scenario 1: distilgpt2+vocab-head, batch 1, seq 128, fp16, accum 16",
     dict(model="distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16", grad_accum=16), {}),
    ("scenario 2: Meta-Llama-3-8B 4-bit, LoRA r8, batch 4, seq 64, fp16, checkpointing",
     dict(model="meta-llama/Meta-Llama-3-8B", quantization="4bit", lora_r=8, batch_size=4, seq_len=64,
          precision="fp16", gradient_checkpointing=True), {}),
    ("Qwen2.5-7B full FT, bf16, batch 1, seq 512",
     dict(model="Qwen/Qwen2.5-7B", batch_size=1, seq_len=512, precision="bf16"), {}),
    ("Llama-3.2-1B full FT, fp32, batch 8, seq 512",
     dict(model="meta-llama/Llama-3.2-1B", batch_size=8, seq_len=512), {}),
    ("gpt2 full FT, batch 16, seq 1024, eager, adamw",
     dict(model="gpt2", batch_size=16, seq_len=1024, attn_implementation="eager", optimizer="adamw"), {}),
    ("Llama-3.2-1B LoRA r16 bf16, batch 2, seq 512, eval batch 64 (evaluates)",
     dict(model="meta-llama/Llama-3.2-1B", batch_size=2, seq_len=512, lora_r=16, load_dtype="bf16",
          precision="bf16", eval_batch_size=64), {"evaluates": True}),
]


def _clear_caches():
    from kit.estimate import inventory

    inventory._cached.cache_clear()
    inventory._CONFIG_CACHE.clear()
    inventory.lora_matches.cache_clear()


def _ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t)


def measure(label, opts, kw, repeats) -> dict:
    from kit.advise import advise, max_batch_size, max_seq_len
    from kit.advise import search as advise_search

    cold = []
    for _ in range(1 + max(3, repeats // 3)):   # the first one imports
        _clear_caches()
        cold.append(_ms(lambda: advise(opts, DEVICE, **kw)))
    calls, real = [], advise_search.estimate
    advise_search.estimate = lambda **k: calls.append(1) or real(**k)
    try:
        a = advise(opts, DEVICE, **kw)
    finally:
        advise_search.estimate = real
    warm = [_ms(lambda: advise(opts, DEVICE, **kw)) for _ in range(repeats)]
    batch = [_ms(lambda: max_batch_size(opts, DEVICE)) for _ in range(repeats)]
    seq = [_ms(lambda: max_seq_len(opts, DEVICE)) for _ in range(repeats)]
    return dict(label=label, advice=a, estimates=len(calls), cold=cold, warm=warm, batch=batch, seq=seq)


def report(rows, repeats) -> str:
    import torch
    import transformers

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Fit advisor latency ({now})", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
             f"{'cuda' if torch.cuda.is_available() else 'cpu'}, Python {platform.python_version()}, torch "
             f"{torch.__version__}, transformers {transformers.__version__}. Device judged: {DEVICE}, safety 5%. "
             f"Medians of {repeats} warm runs and {max(3, repeats // 3)} cold ones; budget {BUDGET_MS:.0f} ms per "
             "panel change.", "",
             "Command: `python benchmarks/advisor_latency.py`", "",
             "| setup | fits | suggestions | estimates per advise() | advise() first ms | advise() cold ms | "
             "advise() warm ms (max) | max_batch_size() ms | max_seq_len() ms | top suggestion |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        a = r["advice"]
        top = f"`{a.suggestions[0].cli}`" if a.suggestions and a.suggestions[0].fits else \
            ("(fits as it is)" if a.fits else "none fits: " + (a.notes[0].split(":")[0] if a.notes else ""))
        lines.append(f"| {r['label']} | {'yes' if a.fits else 'no'} | {len(a.suggestions)} | {r['estimates']} | "
                     f"{r['cold'][0]:.0f} | {statistics.median(r['cold'][1:]):.0f} | {statistics.median(r['warm']):.1f} ({max(r['warm']):.1f}) "
                     f"| {statistics.median(r['batch']):.1f} | {statistics.median(r['seq']):.1f} | {top} |")
    worst = max(statistics.median(r["warm"]) for r in rows)
    cheap = max(statistics.median(r["batch"] + r["seq"]) for r in rows)
    lines += ["", f"Warm advise(): worst median {worst:.1f} ms, " + ("within" if worst <= BUDGET_MS else "OVER")
              + f" the {BUDGET_MS:.0f} ms budget; the cheap path (max_batch_size / max_seq_len): worst median "
              f"{cheap:.1f} ms, " + ("within." if cheap <= BUDGET_MS else "OVER."),
              "First includes importing the model's transformers classes; cold, building the model on the meta "
              "device (once per model and process). Warm is what the panel pays on each change."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None, help=OUT_HELP)
    args = p.parse_args(argv)
    rows = []
    for label, opts, kw in CASES:
        rows.append(measure(label, opts, kw, args.repeats))
        print(f"{label}: warm median {statistics.median(rows[-1]['warm']):.1f} ms", flush=True)
    text = report(rows, args.repeats)
    print(text)
    write_table(text, args.out, "advisor_latency", dev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
