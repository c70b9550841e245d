"""``python -m kit estimate``: predict one training setup's memory (DESIGN.md, "Contracts").

>>> # python -m kit estimate --model distilgpt2+vocab-head --batch-size 1 --seq-len 128 --precision fp16
>>> # python -m kit estimate --model meta-llama/Meta-Llama-3-8B --batch-size 1 --seq-len 512 \\
>>> #     --quantization 4bit --lora-r 16 --json
"""
from __future__ import annotations

import argparse
import json
import sys

from .estimate import DTYPES, OPTIMIZERS, QUANTIZATIONS


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``estimate`` subcommand to an argparse ``subparsers`` object; sets ``func=run``."""
    from .presets import PRESETS

    p = subparsers.add_parser(
        "estimate", help="predict training memory before anything is loaded, and name who eats it",
        description="Predict the peak memory (torch.cuda.max_memory_allocated) of a Trainer step, "
                    "broken into weights, gradients, optimizer state, activations and logits.")
    p.add_argument("--model", required=True, help="a registry name (distilgpt2, meta-llama/Meta-Llama-3-8B, "
                   "distilgpt2+vocab-head, ...) or a path to a config.json")
    p.add_argument("--batch-size", type=int, required=True, help="per-device train batch size")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--precision", choices=list(DTYPES), default="fp32",
                   help="fp16/bf16 = Trainer mixed precision (weights stay in --load-dtype)")
    p.add_argument("--quantization", choices=list(QUANTIZATIONS), default="none",
                   help="bitsandbytes; 4bit = NF4 + double quant, bf16 compute")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: no LoRA)")
    p.add_argument("--lora-targets", default=None, help="comma-separated module names, e.g. q_proj,v_proj "
                   "(default: peft's for the architecture)")
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), default="adamw",
                   help="adamw_torch, adamw_bnb_8bit, paged_adamw_8bit, sgd (with momentum)")
    p.add_argument("--gradient-checkpointing", dest="gradient_checkpointing", action="store_true",
                   default=None, help="checkpoint the blocks (default: the model's own default)")
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                   help="turn it off even where the model's default is on")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--load-dtype", choices=list(DTYPES), default=None,
                   help="dtype the weights load in (default fp32; bf16 for the unquantized parts with "
                        "quantization)")
    p.add_argument("--attn", dest="attn_implementation", choices=["sdpa", "eager"], default="sdpa",
                   help="attention implementation")
    p.add_argument("--kbit-recipe", choices=["standard", "lean"], default="standard",
                   help="standard: peft's prepare_model_for_kbit_training (fp32 upcast); lean: no upcast")
    p.add_argument("--no-padding", dest="padded", action="store_false",
                   help="batches have no padding (no attention mask is built)")
    p.add_argument("--preset", choices=list(PRESETS), default="colab-t4", help="device for the verdict")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``estimate`` for parsed arguments; print the table or JSON. Exit code 0, or 2 on bad input."""
    from .estimate import estimate
    from .presets import verdict

    try:
        est = estimate(
            args.model, batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision,
            quantization=args.quantization, lora_r=args.lora_r, lora_targets=args.lora_targets,
            optimizer=args.optimizer, gradient_checkpointing=args.gradient_checkpointing,
            grad_accum=args.grad_accum, load_dtype=args.load_dtype,
            attn_implementation=args.attn_implementation, kbit_recipe=args.kbit_recipe,
            padded=getattr(args, "padded", True))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    preset = getattr(args, "preset", "colab-t4")
    if args.json:
        out = est.to_json()
        v = verdict(est, preset)
        out["verdict"] = {"preset": v.preset.name, "fits": v.fits, "gpu_margin_bytes": v.gpu_margin_bytes,
                          "ram_margin_bytes": v.ram_margin_bytes, "text": v.text}
        print(json.dumps(out, indent=2))
    else:
        print(est.table(preset))
    return 0
