"""The kit's ZeRO model states beside DeepSpeed's own estimator functions, per GPU.

DeepSpeed ships `estimate_zero2_model_states_mem_needs` (2 + 18/N bytes a parameter, every parameter counted
as trainable) and `estimate_zero3_model_states_mem_needs` (18/N bytes a parameter, plus 4 x the largest
layer). This prints the kit's `model_states_bytes` beside them for full fine-tuning and LoRA, and writes a
new dated file under benchmarks/results/. It needs deepspeed, which the kit does not depend on: install it
beside the kit's torch (`pip install --no-build-isolation deepspeed` keeps pip from fetching another torch).

    python benchmarks/zero_vs_deepspeed.py [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys

from results_file import OUT_HELP, write_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL = "meta-llama/Llama-3.2-1B"
SETUP = dict(batch_size=1, seq_len=512, precision="bf16")


def rows(num_gpus=(2, 4, 8)) -> list[dict]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from kit.estimate import estimate

    one = estimate(MODEL, **SETUP)

    block = max(n for name, n, _ in one.offenders if ".layers." in name)   # the largest layer's parameters
    out = []
    for N in num_gpus:
        for label, lora in (("full fine-tuning", 0), ("LoRA r16", 16)):
            z2 = estimate(MODEL, **SETUP, lora_r=lora, strategy="zero2", num_gpus=N)
            z3 = estimate(MODEL, **SETUP, lora_r=lora, strategy="zero3", num_gpus=N)
            _, ds2 = estimate_zero2_model_states_mem_needs(z2.params, num_gpus_per_node=N, cpu_offload=False)
            _, ds3, largest = estimate_zero3_model_states_mem_needs(z3.params, block, num_gpus_per_node=N,
                                                                     cpu_offload=False)
            out.append(dict(N=N, label=label, P=z2.params, trainable=z2.trainable_params, kit2=z2.model_states_bytes,
                            ds2=ds2, kit3=z3.model_states_bytes, ds3=ds3 - largest, largest=largest))
    return out


def report(rs: list[dict]) -> str:
    import deepspeed
    import torch

    lines = [f"# The kit's ZeRO model states beside DeepSpeed's estimators ({MODEL}, bf16)", "",
             f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, on the CPU (arithmetic only: no "
             "DeepSpeed run). Bytes per GPU; DeepSpeed's stage-3 figure is shown without its 4 x largest-layer "
             "term. Command: `python benchmarks/zero_vs_deepspeed.py`.", "",
             "| GPUs | setup | params | trainable | stage 2: kit | stage 2: DeepSpeed | kit - DS | stage 3: kit "
             "| stage 3: DeepSpeed | kit - DS |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        lines.append(f"| {r['N']} | {r['label']} | {r['P']:,} | {r['trainable']:,} | {r['kit2']:,} | {int(r['ds2']):,} "
                     f"| {r['kit2'] - int(r['ds2']):,} | {r['kit3']:,} | {int(r['ds3']):,} "
                     f"| {r['kit3'] - int(r['ds3']):,} |")
    lines += ["", "Full fine-tuning, stage 2: the same bytes (to rounding: the kit rounds each shard up). Stage 3: "
              "the kit counts 2 bytes a parameter more in 1/N (DeepSpeed's stage-3 function leaves the half "
              "weights' 2 bytes out, where its stage-2 one counts them). LoRA: DeepSpeed counts the frozen base "
              "as trainable (18 bytes a parameter), the kit counts its half weights only."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help=OUT_HELP)
    args = p.parse_args(argv)
    text = report(rows())
    print(text)
    write_table(text, args.out, "zero_vs_deepspeed", "cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
