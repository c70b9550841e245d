"""``python -m kit fit``: what makes a training setup fit a device, cheapest first (docs/cli-and-api.md, "What will
make it fit").

It takes every ``estimate`` option, plus ``--device`` (a preset, ``this`` for this GPU now, or a number of
bytes such as ``16GiB``), ``--safety`` (a fraction of the limit kept free against the allocated peak, in place of
the default: the reserved estimate) and ``--eval``
(the run evaluates, so ``Trainer.evaluate()`` must fit too). Each suggestion's ``changes`` use the estimate
CLI's option names, and its ``cli`` string pastes back: append it to the same command.

>>> # python -m kit fit --model distilgpt2+vocab-head --batch-size 1 --seq-len 128 --precision fp16 \\
>>> #     --grad-accum 16 --device colab-t4 --json
"""
from __future__ import annotations

import argparse
import json
import sys

from kit.training_setup import flag_of, from_arguments

TOP = 5             # the changes the default text lists, one line each (--details: all, with their costs)
_FLAGS: dict = {}   # this command's other options (--device, --safety ...), to name one in an error


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``fit`` subcommand (the estimate options, then ``--device``, ``--safety``, ``--eval``, ``--json``)."""
    from kit.advise import SAFETY
    from kit.cli.estimate import add_setup_options
    from kit.presets import PRESETS

    p = subparsers.add_parser(
        "fit", help="what makes a training setup fit a device: ranked changes, the largest batch and sequence",
        description="Rank the changes that make a training setup fit a device, cheapest first, each with its "
                    "estimated peak, margin and cost; and the largest batch and sequence that fit.")
    add_setup_options(p)
    p.add_argument("--device", default="colab-t4", help=f"a preset ({', '.join(PRESETS)}), 'this' (this GPU's "
                   "memory for torch, now) or a number of bytes (16000000000, 16GiB); default colab-t4")
    p.add_argument("--safety", default=SAFETY, help="a fraction of the limit kept free against the allocated peak, "
                   "in place of the default: the reserved estimate (the allocated peak plus the caching "
                   "allocator's modelled gap, with or without --expandable-segments); 0 judges the allocated peak")
    p.add_argument("--eval", dest="evaluates", action="store_true",
                   help="the run evaluates: Trainer.evaluate()'s peak (at --eval-batch-size) must fit too")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--details", action="store_true", help="each change with what it costs, the notes, and the "
                   "verdict's peak and reserved figures")
    p.set_defaults(func=run)
    _FLAGS.update({a.dest: a.option_strings[0] for a in p._actions if a.option_strings}, setup="--model")
    return p


def setup_of(args: argparse.Namespace) -> dict:
    """estimate()'s keywords from parsed ``estimate``/``fit`` options (the same mapping as ``estimate``'s run), with
    the GPU preset judged on (``--device``, ``--preset``) as ``gpu``.

    >>> from kit.cli import build_parser
    >>> setup_of(build_parser().parse_args(["fit", "--model", "gpt2", "--batch-size", "2", "--seq-len", "64",
    ...                                     "--attn", "eager"]))["attn_implementation"]
    'eager'
    """
    if hasattr(args, "strategy"):
        from kit.cli.estimate import resolve_launch

        resolve_launch(args)
    from kit.presets import GPU_PRESETS

    judged_on = getattr(args, "device", None) or getattr(args, "preset", None)   # its architecture: the SDPA kernel
    return {"model": args.model, **from_arguments(args), **({"gpu": judged_on} if judged_on in GPU_PRESETS else {})}


def run(args: argparse.Namespace) -> int:
    """Run ``fit``: print the verdict and ranked table, or the JSON object.

    Exit code 0 whether or not it fits (``fits`` says); 2 on bad input, 1 when the estimator fails: either
    way one line on stderr, starting ``error:``, never a traceback.
    """
    from kit.cli.estimate import one_line, quiet, traceback_wanted

    try:
        with quiet():
            from kit.advise import advise

            advice = advise(setup_of(args), args.device, safety=args.safety, evaluates=args.evaluates)
    except ValueError as exc:
        name = getattr(exc, "name", None)
        flag = flag_of(name) or _FLAGS.get(name)
        print(f"error: {'argument ' + flag + ': ' if flag else ''}{one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug of the estimator or the advisor: one line, with what to do
        print(f"error: the advisor failed on this setup ({type(exc).__name__}: {one_line(exc)}); please report it "
              "with the command line, or set KIT_TRACEBACK=1 to see where.", file=sys.stderr)
        if traceback_wanted():
            raise
        return 1
    if args.json:
        print(json.dumps(advice.to_json(), indent=2))
    elif args.details:
        print(advice.text(details=True))
    else:
        print(advice.text(top=TOP))
        changes, notes = len(advice.suggestions), len(advice.notes)
        print(f"details: --details ({changes} change{'s' * (changes != 1)}, what each costs"
              + (f", {notes} note{'s' * (notes != 1)})" if notes else ")"))
    return 0
