"""The kit's CUDA estimate against the fake-CUDA meter, over a grid of small setups and four GPU architectures.

    python benchmarks/fake_cuda_grid.py            # 96 setups, about 15 minutes on a 2-core CPU
    python benchmarks/fake_cuda_grid.py --quick    # 8 setups

Families: tiny-llama (grouped-query attention, 4 query heads over 2 key/value heads) and tiny-gpt2 (multi-head),
batch 4 x 64, x fp32/fp16/bf16 x checkpointing off/on x unpadded/padded x T4 (sm75), L4 (sm89), A100 (sm80),
H100 (sm90). The meter (benchmarks/fake_cuda, in one child process) runs 3 real Trainer steps on a fake cuda:0
with SDPA's kernel chosen for that architecture; the kit's figure is ``estimate(..., device="cuda", gpu=...)`` with
the GPU preset of that architecture, whose kernel rules are the kit's own code. kit / meter is printed for the steady
step (the peak of steps 2-3) and for step 1. A fake-CUDA meter is not a GPU: PyTorch's meta kernels say what each
kernel keeps; which kernel a GPU picks is read from source.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import pathlib
import platform
import subprocess
import sys

import torch
import transformers

from results_file import OUT_HELP, write_table

from kit.estimate.core import estimate

METER = pathlib.Path(__file__).resolve().parent / "fake_cuda" / "trainer_steps.py"
FAMILIES = ("tiny-llama", "tiny-gpt2")
PRECISIONS = ("fp32", "fp16", "bf16")
GPUS = ("T4", "L4", "A100", "H100")
PRESET_OF = {"T4": "colab-t4", "L4": "l4", "A100": "a100-80", "H100": "h100"}   # the kit's preset per GPU
BATCH, SEQ = 4, 64


def grid(quick: bool) -> list:
    setups = [dict(config=config, precision=precision, checkpointing=checkpointing, padded=padded, gpu=gpu,
                   batch=BATCH, seq=SEQ)
              for config, precision, checkpointing, padded, gpu in itertools.product(
                  FAMILIES, PRECISIONS, (False, True), (False, True), GPUS)]
    return [s for s in setups if s["gpu"] in ("T4", "H100") and s["precision"] != "fp16"
            and not s["checkpointing"]] if quick else setups


def metered(setups: list) -> list:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(METER), "--setups", json.dumps(setups)], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the fake-CUDA meter failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"config"')]  # not Trainer's


def kit_figures(setup: dict):
    result = estimate(setup["config"], batch_size=setup["batch"], seq_len=setup["seq"], precision=setup["precision"],
                      gradient_checkpointing=setup["checkpointing"], padded=setup["padded"], device="cuda",
                      gpu=PRESET_OF[setup["gpu"]])
    return result.peak_bytes, result.first_step_peak_bytes


def table(rows: list, seconds: float) -> str:
    lines = [f"# The kit's CUDA estimate against the fake-CUDA meter ({datetime.date.today().isoformat()})", "",
             "Fake-CUDA (PyTorch's meta kernels), not a GPU. Command: `python benchmarks/fake_cuda_grid.py`. "
             f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.machine()} CPU; "
             f"{len(rows)} setups in {seconds:.0f} s. Batch {BATCH} x {SEQ}, 3 Trainer steps, adamw_torch_fused. "
             "kit = `estimate(..., device=\"cuda\", gpu=<the GPU's preset>)`; "
             "meter = the peak of live fake CUDA storages (512 B rounding); "
             "steady = steps 2-3, first = step 1.", "",
             "| family | precision | ckpt | padded | GPU | SDPA kernel (meter) | kit steady | meter steady "
             "| kit/meter steady | kit/meter step 1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['config']} | {row['precision']} | {'on' if row['checkpointing'] else 'off'} | "
                     f"{'yes' if row['padded'] else 'no'} | {row['gpu']} | {', '.join(row['sdpa_backends'])} | "
                     f"{row['kit_peak']:,} | {row['meter_peak']:,} | {row['ratio']:.4f} | {row['ratio_first']:.4f} |")
    off = [row for row in rows if abs(row["ratio"] - 1) > 0.01 or abs(row["ratio_first"] - 1) > 0.01]
    lines += ["", f"Outside 1%: {len(off)} of {len(rows)} setups."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 setups (T4 and H100, fp32 and bf16, no ckpt)")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    setups = grid(options.quick)
    started = datetime.datetime.now()
    rows = []
    for setup, meter in zip(setups, metered(setups)):
        kit_peak, kit_first = kit_figures(setup)
        rows.append({**meter, "kit_peak": kit_peak, "meter_peak": meter["peak_bytes"],
                     "ratio": kit_peak / meter["peak_bytes"], "ratio_first": kit_first / meter["step_peaks"][0]})
        print(f"{setup['config']:10s} {setup['precision']} ckpt={setup['checkpointing']!s:5s} "
              f"padded={setup['padded']!s:5s} {setup['gpu']:4s} {','.join(meter['sdpa_backends']):9s} "
              f"kit/meter steady {rows[-1]['ratio']:.4f} step 1 {rows[-1]['ratio_first']:.4f}")
    seconds = (datetime.datetime.now() - started).total_seconds()
    path = write_table(table(rows, seconds), options.out, "fake_cuda_grid", "cpu")
    if path is not None:
        print(f"written: {path}")


if __name__ == "__main__":
    main()
