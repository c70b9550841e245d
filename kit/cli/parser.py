"""The kit's command line: ``python -m kit {info,estimate,fit,demo} ...``.

>>> # python -m kit info
>>> # python -m kit estimate --model distilgpt2+vocab-head --batch-size 1 --seq-len 128 --precision fp16
>>> # python -m kit fit --model distilgpt2+vocab-head --batch-size 1 --seq-len 128 --precision fp16 --device colab-t4
>>> # python -m kit demo --out report/

Every failure ends with one line on stderr that starts ``error:``: exit status 2 for bad
input (argparse's own errors included), 1 for a run that failed. No traceback, unless
``KIT_TRACEBACK=1`` is set.
"""
from __future__ import annotations

import argparse
import os
import sys


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (``error: ...``) instead of a usage block. Subcommand
    parsers are made of the same class (``add_subparsers`` uses the parent's type)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _info(args: argparse.Namespace) -> int:
    from kit import runtime
    from kit.measure import device

    print(runtime.describe())
    print("Reading now:", device.snapshot().text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m kit",
        description="Predict, measure and fix memory when fine-tuning language models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    info = sub.add_parser("info", help="what this runtime has: GPU, RAM, libraries, Hub, smoke or real sizes")
    info.set_defaults(func=_info)
    from kit.cli import demo
    from kit.cli import estimate as estimate_cli
    from kit.cli import fit as fit_cli

    estimate_cli.register(sub)
    fit_cli.register(sub)
    demo.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit status (0 ok, 1 a failed run, 2 bad input)."""
    try:
        parser = build_parser()    # imports kit.measure, which reads KIT_GPU_CAP_BYTES: a bad value is said here
    except Exception as exc:
        return _failed(exc, "")
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()   # a closed pipe shows here, not at exit (where Python would print its own error)
        return code
    except BrokenPipeError:  # `python -m kit fit --json | head`: the reader has what it wanted
        _stdout_to_devnull()
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return _failed(exc, args.command)


def _failed(exc: Exception, command: str) -> int:
    """Say a failure in one line on stderr; its exit status (2 bad input, 1 a failed run)."""
    if os.environ.get("KIT_TRACEBACK", "").strip().lower() in ("1", "true", "yes"):
        raise exc
    from kit.inputs import InputError

    what = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, InputError):
        print(f"error: {what}", file=sys.stderr)
        return 2
    prog = f"python -m kit {command}".strip()
    print(f"error: `{prog}` failed ({type(exc).__name__}: {what}); set "
          "KIT_TRACEBACK=1 to see where, and report it if it looks like the kit's fault.", file=sys.stderr)
    return 1


def _stdout_to_devnull() -> None:
    """After a closed pipe, point stdout at /dev/null, so that Python's flush at exit finds nothing to complain
    about (the recipe of Python's own documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # a stdout without a file descriptor (a notebook, a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
