"""``python -m kit estimate``: predict one training setup's memory (docs/cli-and-api.md, "Command line").

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

from kit.dtypes import trainer_precision
from kit.model_configs import known_models
from kit.presets import ALIASES
from kit.training_setup import add_arguments, flag_of, from_arguments

_FLAGS: dict = {}  # this command's other options (--model, --preset ...), to name one in an error



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
    p.add_argument("--details", action="store_true", help="after the answer, the full table: every component, the "
                   "phases a run meets, the biggest modules and the notes")
    p.set_defaults(func=run)
    _FLAGS.update({a.dest: a.option_strings[0] for a in p._actions if a.option_strings})
    return p


def add_setup_options(parser: argparse.ArgumentParser) -> None:
    """The options that describe one training setup (:mod:`kit.training_setup` declares them): ``estimate`` and
    ``fit`` (:mod:`kit.cli.fit`) add them."""
    parser.add_argument("--model", required=True, type=str.strip,
                        help="a shipped name (" + ", ".join(known_models()) + "), any "
                        "Hub id such as Qwen/Qwen2.5-3B (only its config.json is fetched, when the Hub is reachable), "
                        "or a path to a config.json")
    add_arguments(parser, optimizer_type=_optimizer)
    parser.add_argument("--accelerate-config", default=None, metavar="PATH",
                        help="the YAML `accelerate config` wrote: its distributed_type, num_processes, fsdp/deepspeed "
                             "config and mixed_precision set the options above (flags given here win)")


def resolve_launch(args: argparse.Namespace) -> argparse.Namespace:
    """Fill ``strategy``/``num_gpus``/``cpu_offload``/``precision`` (and what else the file sets) from
    ``--accelerate-config``, where the flags left them unset; then the defaults. Idempotent.

    >>> from kit.cli import build_parser
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
    from kit.presets import GPU_PRESETS, PRESETS, verdict

    preset = getattr(args, "preset", "colab-t4")
    try:
        resolve_launch(args)
        with quiet():
            from kit.estimate import estimate

            # a preset without a GPU (cpu) is judged on CPU kernels: the estimate refuses what runs on CUDA only
            device = "cpu" if PRESETS[preset].gpu_bytes is None else "cuda"
            precision, note = trainer_precision(args.precision, device)   # Trainer ignores fp16 on a CPU
            gpu = preset if preset in GPU_PRESETS else None   # its architecture picks the attention kernel
            est = estimate(args.model, **{**from_arguments(args), "precision": precision}, device=device, gpu=gpu)
            est.notes.extend([note] * bool(note))
    except ValueError as exc:
        flag = flag_of(getattr(exc, "name", None)) or _FLAGS.get(getattr(exc, "name", None))
        print(f"error: {'argument ' + flag + ': ' if flag else ''}{one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug of the estimator: say so in one line, with what to do
        print(f"error: the estimator failed on this setup ({type(exc).__name__}: {one_line(exc)}); please report "
              "it with the command line, or set KIT_TRACEBACK=1 to see where.", file=sys.stderr)
        if traceback_wanted():
            raise
        return 1
    if args.json:
        v = verdict(est, preset)   # (first: a verdict may add its note to est.notes)
        out = est.to_json()
        out["verdict"] = {"preset": v.preset.name, "fits": v.fits, "gpu_margin_bytes": v.gpu_margin_bytes,
                          "ram_margin_bytes": v.ram_margin_bytes, "text": v.text, "judged": v.judged_name,
                          "judged_bytes": v.judged_bytes, "limit_bytes": v.limit_bytes}
        print(json.dumps(out, indent=2))
    else:
        print(face(est, preset, {"model": args.model, **from_arguments(args)}, getattr(args, "details", False)))
        if args.accelerate_config:
            from kit.estimate.launch import launch_command

            print(f"\nPer GPU, for: {launch_command(args.accelerate_config)}")
    return 0


def face(est, preset: str, setup: dict, details: bool = False) -> str:
    """The answer first (the verdict with the figure judged, the biggest cause, and where it does not fit the fit
    advisor's best change for ``setup``, estimate()'s keywords), then the setup in brief, or with ``details`` the
    full table."""
    from kit.advise.check import answer, brief
    from kit.presets import verdict
    from kit.units import wrap

    v, advice, problem = verdict(est, preset), None, []
    if not v.fits:
        try:
            with quiet():
                from kit.advise import advise

                advice = advise(setup, preset)
        except ValueError as exc:
            problem = [f"(no advice: {one_line(exc)})"]
    if details:
        return wrap("\n".join(answer(est, v, advice) + problem)) + "\n\n" + est.table(preset, answer=False)
    return wrap("\n".join(answer(est, v, advice) + problem + brief(est) + [
        "details: --details (the full table); what else fits: python -m kit fit with the same options"]))


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
