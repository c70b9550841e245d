"""``make gpu-wheels``: download the wheels a GPU box without a package registry lacks, for ``make gpu-check``.

Run where a registry is reachable: ``python benchmarks/gpu_check_wheels.py --python-version 3.12 --out wheels``.
pip resolves, for that Python on manylinux x86_64 (binary wheels only), what the box holds
(``gpu_check_preflight.BOX``) and what it holds plus what gpu-check's stages need (``EXTRA``); the wheels of the
difference are downloaded with ``--no-deps``, so nothing the box already has (torch above all) is fetched.
It prints each wheel and the folder's size.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_preflight import BOX, EXTRA  # noqa: E402

PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64")


def _target(python_version: str) -> list[str]:
    return ["--python-version", python_version, "--implementation", "cp", "--only-binary=:all:",
            *[x for p in PLATFORMS for x in ("--platform", p)]]


def resolve(dists: list[str], python_version: str) -> dict:
    """distribution name (lower case) -> wheel URL of what pip would install for ``dists`` on that target."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--target",
                        str(Path(tmp) / "t"), *_target(python_version), "--report", str(report), *dists], check=True)
        return {i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"]
                for i in json.loads(report.read_text())["install"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python-version", default="3.12")
    p.add_argument("--out", default="wheels")
    a = p.parse_args(argv)
    box = resolve(list(BOX.values()), a.python_version)
    need = resolve([*BOX.values(), *EXTRA.values()], a.python_version)
    lacking = sorted(set(need) - set(box))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *_target(a.python_version), "-d",
                    str(out), *(need[n] for n in lacking)], check=True)
    files = sorted(out.glob("*.whl"))
    for f in files:
        print(f"{f.stat().st_size:>12,}  {f.name}")
    total = sum(f.stat().st_size for f in files)
    print(f"gpu-wheels: {len(files)} wheels, {total:,} bytes ({total / 2**20:.1f} MiB) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
