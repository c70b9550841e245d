"""`python -m kit ...`: the command line (see :mod:`kit.cli.parser`)."""
import sys

from kit.cli.parser import main

if __name__ == "__main__":
    sys.exit(main())
