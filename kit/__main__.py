"""The kit's command line: ``python -m kit {info,estimate,demo} ...``.

>>> # python -m kit info
>>> # python -m kit estimate --model distilgpt2+vocab-head --batch-size 1 --seq-len 128 --precision fp16
>>> # python -m kit demo --out report/
"""
from __future__ import annotations

import argparse
import sys


def _info(args: argparse.Namespace) -> int:
    from . import device, runtime

    print(runtime.describe())
    print("Reading now:", device.snapshot().text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kit",
        description="Predict, measure and fix memory when fine-tuning language models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    info = sub.add_parser("info", help="what this runtime has: GPU, RAM, libraries, Hub, smoke or real sizes")
    info.set_defaults(func=_info)
    from . import demo, estimate_cli

    estimate_cli.register(sub)
    demo.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
