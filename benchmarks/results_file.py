"""Where a benchmark writes its table: a new dated file under benchmarks/results/, never over an old one.

>>> import pathlib, tempfile
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> first = dated_path("demo", "cpu", folder=d); _ = first.write_text("x")
>>> second = dated_path("demo", "cpu", folder=d)
>>> first.name.startswith("demo-") and first != second and not second.exists()
True
"""
from __future__ import annotations

import datetime
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def dated_path(name: str, device: str, folder: pathlib.Path = RESULTS) -> pathlib.Path:
    """``<folder>/<name>-<date>-<device>.md``; when that file is there already, the same with the time
    (and a counter if need be) added, so a re-run adds a file and keeps the committed one."""
    now = datetime.datetime.now(datetime.timezone.utc)
    path = folder / f"{name}-{now.date().isoformat()}-{device}.md"
    n = 0
    while path.exists():
        n += 1
        path = folder / f"{name}-{now.date().isoformat()}-{now:%H%M%S}{f'-{n}' if n > 1 else ''}-{device}.md"
    return path


OUT_HELP = "write the table here too (default: a new dated file in benchmarks/results; '' not to write)"


def write_table(text: str, out: str | None, name: str, device: str) -> pathlib.Path | None:
    """Write a benchmark's table where ``--out`` says: a path; '' for nowhere; None (the default) for a new
    dated file (:func:`dated_path`, named once the run is done). Returns where it went.

    >>> import tempfile
    >>> write_table("t", str(pathlib.Path(tempfile.mkdtemp()) / "x" / "t.md"), "demo", "cpu").read_text()
    't'
    >>> write_table("t", "", "demo", "cpu") is None
    True
    """
    path = dated_path(name, device) if out is None else pathlib.Path(out) if out else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path
