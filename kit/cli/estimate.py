"""``python -m kit estimate``: predict one training setup's memory (DESIGN.md, "Contracts").

>>> # python -m kit estimate --model distilgpt2+vocab-head --batch-size 1 --seq-len 128 --precision fp16
>>> # python -m kit estimate --model meta-llama/Meta-Llama-3-8B --batch-size 1 --seq-len 512 \\
>>> #     --quantization 4bit --lora-r 16 --json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys

from kit.presets import DTYPES, OPTIMIZERS, QUANTIZATIONS
from kit.model_configs import known_models
from kit.presets import ALIASES
from kit.estimate.strategies import STRATEGIES

QUANT_OPTIONS = ("quant_type", "double_quant", "compute_dtype")  # estimate()'s 4-bit keywords, from their options
_FLAGS: dict = {}  # estimate()'s keyword -> this command's option, to name the option in an error


def _optimizer(value: str) -> str:
    """``--optimizer``: the kit's names, or the ``TrainingArguments.optim`` names ``--help`` lists."""
    return ALIASES.get(value, value)


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``estimate`` subcommand to an argparse ``subparsers`` object; sets ``func=run``."""
    from kit.presets import PRESETS

    p = subparsers.add_parser(
        "estimate", help="predict training memory before anything is loaded, and name who eats it",
        description="Predict the peak memory (torch.cuda.max_memory_allocated) of a Trainer step, "
                    "broken into weights, gradients, optimizer state, activations and logits.")
    add_setup_options(p)
    p.add_argument("--preset", choices=list(PRESETS), default="colab-t4", help="device for the verdict")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)
    _FLAGS.update({a.dest: a.option_strings[0] for a in p._actions if a.option_strings})
    _FLAGS.update(padded="--no-padding", gradient_checkpointing="--gradient-checkpointing")
    return p


def add_setup_options(p: argparse.ArgumentParser) -> None:
    """The options that describe one training setup: ``estimate`` and ``fit`` (:mod:`kit.cli.fit`) add them."""
    p.add_argument("--model", required=True, help="a shipped name (" + ", ".join(known_models()) + "), any "
                   "Hub id such as Qwen/Qwen2.5-3B (only its config.json is fetched, when the Hub is reachable), "
                   "or a path to a config.json")
    p.add_argument("--batch-size", type=int, required=True, help="per-device train batch size")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--precision", choices=list(DTYPES), default=None,
                   help="fp16/bf16 = Trainer mixed precision (weights stay in --load-dtype); default fp32, or the "
                        "--accelerate-config file's mixed_precision")
    p.add_argument("--quantization", choices=list(QUANTIZATIONS), default="none",
                   help="bitsandbytes; 4bit = NF4 + double quant, bf16 compute (see the three 4-bit options below)")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: no LoRA)")
    p.add_argument("--lora-targets", default=None, help="comma-separated module names, e.g. q_proj,v_proj "
                   "(default: peft's for the architecture)")
    p.add_argument("--optimizer", type=_optimizer, choices=list(OPTIMIZERS), default="adamw-fused",
                   help="adamw-fused (adamw_torch_fused, Trainer's default), adamw (adamw_torch), adamw-8bit (adamw_bnb_8bit), paged-adamw-8bit (paged_adamw_8bit), "
                        "sgd (with momentum); the TrainingArguments.optim names in brackets work too")
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
    p.add_argument("--eval-batch-size", type=int, default=8,
                   help="per_device_eval_batch_size, for the evaluation phase (default 8, as TrainingArguments)")
    p.add_argument("--eval-gather", choices=["loss", "logits", "preprocessed"], default="loss",
                   help="what evaluate() keeps: loss (no compute_metrics), logits (compute_metrics), preprocessed "
                        "(preprocess_logits_for_metrics returning one id per token)")
    p.add_argument("--eval-samples", type=int, default=None, help="len(eval_dataset): gathered logits grow with it")
    p.add_argument("--eval-accumulation-steps", type=int, default=None,
                   help="move gathered predictions off the GPU every N eval steps")
    # more than one GPU (kit.estimate.strategies): the bytes become per GPU
    p.add_argument("--strategy", choices=list(STRATEGIES), default=None,
                   help="single (default), ddp, fsdp (FULL_SHARD / reshard_after_forward), fsdp-grad-op "
                        "(SHARD_GRAD_OP), zero1, zero2, zero3 (DeepSpeed)")
    p.add_argument("--num-gpus", type=int, default=None, help="GPUs the run is spread over (default 1)")
    p.add_argument("--cpu-offload", action="store_true", default=None,
                   help="fsdp: offload parameters (CPUOffloadPolicy); zero: offload the optimizer (zero3: and params)")
    p.add_argument("--accelerate-config", default=None, metavar="PATH",
                   help="the YAML `accelerate config` wrote: its distributed_type, num_processes, fsdp/deepspeed "
                        "config and mixed_precision set the options above (flags given here win)")
    # 4-bit only (BitsAndBytesConfig's bnb_4bit_*): the defaults are the kit's 4bit, the QLoRA recipe
    p.add_argument("--quant-type", choices=["nf4", "fp4"], default="nf4",
                   help="4-bit: bnb_4bit_quant_type (the same bytes; BitsAndBytesConfig's own default is fp4)")
    p.add_argument("--no-double-quant", dest="double_quant", action="store_false",
                   help="4-bit: bnb_4bit_use_double_quant=False (each block's scale in 4 bytes, not 1)")
    p.add_argument("--compute-dtype", choices=list(DTYPES), default="bf16",
                   help="4-bit: bnb_4bit_compute_dtype (BitsAndBytesConfig's own default is fp32)")


def resolve_launch(args: argparse.Namespace) -> argparse.Namespace:
    """Fill ``strategy``/``num_gpus``/``cpu_offload``/``precision`` (and what else the file sets) from
    ``--accelerate-config``, where the flags left them unset; then the defaults. Idempotent.

    >>> from kit.__main__ import build_parser
    >>> a = resolve_launch(build_parser().parse_args(["estimate", "--model", "gpt2", "--batch-size", "1",
    ...                                               "--seq-len", "8", "--strategy", "ddp", "--num-gpus", "2"]))
    >>> a.strategy, a.num_gpus, a.cpu_offload, a.precision
    ('ddp', 2, False, 'fp32')
    """
    if getattr(args, "accelerate_config", None):
        from kit.estimate.launch import read_accelerate_config

        for k, v in read_accelerate_config(args.accelerate_config).items():
            if getattr(args, k, None) is None or (k == "grad_accum" and args.grad_accum == 1):
                setattr(args, k, v)
    for k, default in (("strategy", None), ("num_gpus", None), ("cpu_offload", False), ("precision", "fp32")):
        if getattr(args, k, None) is None:
            setattr(args, k, default)
    if args.strategy is None:
        args.strategy = "single" if (args.num_gpus or 1) == 1 and not args.cpu_offload else \
            "fsdp" if args.cpu_offload else "ddp"  # accelerate launch --num_processes N alone: DDP
    if args.num_gpus is None:
        args.num_gpus = 1
    return args


def run(args: argparse.Namespace) -> int:
    """Run ``estimate`` for parsed arguments; print the table or JSON.

    Exit code 0; 2 on bad input, 1 when the estimator itself fails: either way one line on
    stderr, starting ``error:``, never a traceback.
    """
    from kit.presets import verdict

    try:
        resolve_launch(args)
        with quiet():
            from kit.estimate import estimate

            est = estimate(
                args.model, batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision,
                quantization=args.quantization, lora_r=args.lora_r, lora_targets=args.lora_targets,
                optimizer=args.optimizer, gradient_checkpointing=args.gradient_checkpointing,
                grad_accum=args.grad_accum, load_dtype=args.load_dtype,
                attn_implementation=args.attn_implementation, kbit_recipe=args.kbit_recipe,
                padded=getattr(args, "padded", True), eval_batch_size=args.eval_batch_size,
                eval_gather=args.eval_gather, eval_samples=args.eval_samples,
                eval_accumulation_steps=args.eval_accumulation_steps, strategy=args.strategy,
                num_gpus=args.num_gpus, cpu_offload=args.cpu_offload,
                **{k: getattr(args, k) for k in QUANT_OPTIONS if hasattr(args, k)})
    except ValueError as exc:
        flag = _FLAGS.get(getattr(exc, "name", None))
        print(f"error: {'argument ' + flag + ': ' if flag else ''}{one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug of the estimator: say so in one line, with what to do
        print(f"error: the estimator failed on this setup ({type(exc).__name__}: {one_line(exc)}); please report "
              "it with the command line, or set KIT_TRACEBACK=1 to see where.", file=sys.stderr)
        if traceback_wanted():
            raise
        return 1
    preset = getattr(args, "preset", "colab-t4")
    if args.json:
        out = est.to_json()
        v = verdict(est, preset)
        out["verdict"] = {"preset": v.preset.name, "fits": v.fits, "gpu_margin_bytes": v.gpu_margin_bytes,
                          "ram_margin_bytes": v.ram_margin_bytes, "text": v.text}
        print(json.dumps(out, indent=2))
    else:
        print(est.table(preset))
        if args.accelerate_config:
            from kit.estimate.launch import launch_command

            print(f"\nPer GPU, for: {launch_command(args.accelerate_config)}")
    return 0


@contextlib.contextmanager
def quiet():
    """Library chatter on stderr would bury the one line that matters. The estimate builds on the
    meta device only, so bitsandbytes' CPU-kernel notice and transformers' warnings are noise here."""
    import transformers

    bnb, level = logging.getLogger("bitsandbytes"), transformers.logging.get_verbosity()
    old = bnb.level
    bnb.setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        bnb.setLevel(old)
        transformers.logging.set_verbosity(level)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def traceback_wanted() -> bool:
    import os

    return os.environ.get("KIT_TRACEBACK", "").strip().lower() in ("1", "true", "yes")
