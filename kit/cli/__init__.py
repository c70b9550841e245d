"""The command line, ``python -m kit {info,estimate,fit,demo}``: ``parser`` (the commands and their errors),
``estimate``, ``fit``, ``demo`` and ``report`` (the demo's report), one module per command.
"""
from kit.cli.parser import build_parser, main

__all__ = ["main", "build_parser"]
