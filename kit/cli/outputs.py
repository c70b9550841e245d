"""The demo's output folder: never write over, or lose, anything the user made.

``python -m kit demo --out DIR`` writes only into a folder that is new, empty, or holds an earlier demo run
(recognised by the list of files it wrote, ``DIR/.kit-demo.json``). An earlier run is moved into
``DIR/earlier-N/`` (the first free N, nothing deleted), so that ``--scenario 2`` after ``--scenario 1`` keeps
scenario 1's report and plots. A folder holding any file the kit did not write is refused before the run,
and so is a folder that cannot be written: a refusal costs nothing, a blocked write at the end would cost
the run.

>>> import tempfile; out = Path(tempfile.mkdtemp()) / "report"
>>> prepare(out) is None, claim(out, "s1.png").name, written(out)
(True, 's1.png', ['s1.png'])
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from kit.inputs import InputError

MANIFEST = ".kit-demo.json"
IGNORED = {".DS_Store", ".ipynb_checkpoints", "Thumbs.db"}   # what file browsers and Jupyter leave in any folder


def _manifest(out: Path) -> list[str] | None:
    """The names an earlier demo wrote into ``out`` (None: no readable list, so not the kit's folder)."""
    try:
        data = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else None


def _earlier(path: Path) -> bool:
    return path.is_dir() and path.name.startswith("earlier-") and (path / MANIFEST).is_file()


def written(out) -> list[str]:
    """The names this folder's demo run has written so far (its manifest)."""
    return _manifest(Path(out)) or []


def _save_manifest(out: Path, files: list[str]) -> None:
    tmp = out / f"{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"written_by": "python -m kit demo", "files": files}, indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, out / MANIFEST)


def prepare(out) -> str | None:
    """Make ``out`` ready for a demo run, or raise :class:`kit.inputs.InputError` (named ``out``) before anything
    runs. Returns a line to print when an earlier run was moved aside, else None."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise InputError("out", f"{out} is a file, not a folder: pass --out with a new or empty folder "
                                f"(e.g. --out {out.parent / 'kit-demo'}).")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".kit-write-test-"):
            pass
    except OSError as e:
        raise InputError("out", f"cannot write the report into {out}: {e.strerror or e}. Pass --out with a folder "
                                "you can write to, e.g. --out report/") from None
    listed = _manifest(out)
    mine = set(listed or ()) | {MANIFEST}
    entries = [p for p in out.iterdir() if p.name in mine]
    foreign = sorted(p.name for p in out.iterdir() if p.name not in mine and p.name not in IGNORED and not _earlier(p))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError("out", f"{out} holds files the kit did not write ({shown}); the demo never writes over "
                                f"them. Pass --out with a new or empty folder (e.g. --out {out / 'kit-demo'}).")
    note = None
    if listed is not None and entries:
        n = 1
        while (aside := out / f"earlier-{n}").exists():
            n += 1
        aside.mkdir()
        for p in entries:
            shutil.move(str(p), str(aside / p.name))
        note = f"{out} held an earlier demo run: moved it to {aside} (nothing deleted); this run writes into {out}."
    _save_manifest(out, [])
    return note


def claim(out, name: str) -> Path:
    """``out / name``, listed in the folder's manifest before it is written (so a later run knows it is the kit's)."""
    out = Path(out)
    files = written(out)
    if name not in files:
        _save_manifest(out, files + [name])
    return out / name
