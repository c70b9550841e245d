"""Colab's install cell, resolved whole without installing: what `pip install memory-kit` pulls in on Colab's Pythons.

``tests/test_colab_install.py`` compares the kit's own specifiers with Colab's versions. This test follows the whole
requirement tree: pip resolves the kit's requirements for each of Colab's Pythons (``--dry-run --report``,
``--python-version``, ``--only-binary=:all:``, Linux x86-64 wheels), with torch and ipywidgets held at Colab's versions
by a constraints file. It fails if no resolution exists (so torch or ipywidgets would have to change).

pip keeps an installed package unless a requirement excludes its version. So every package of Colab's
(``tests/data/colab-pip-freeze.gpu.txt``, Colab's own published list, with its source in its header) that some
requirement in the resolved tree excludes is one pip upgrades on Colab. Those must be exactly the README's list, in
its install note. The requirements read are those of the versions resolved here, the newest that fit; a package
Colab keeps brings its own, usually looser, requirements, which this cannot see.

It needs PyPI (about a minute per Python); without it, it skips and says so.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FREEZE = ROOT / "tests" / "data" / "colab-pip-freeze.gpu.txt"
COLAB_PYTHONS = ("3.12", "3.13")
NEVER_CHANGED = ("torch", "ipywidgets")
# Colab runs on x86-64 Linux; pip takes one --platform per tag it may accept.
PLATFORMS = ["any", "linux_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 40))]


def colab_versions() -> dict[str, Version]:
    """Colab's installed packages, read from its published ``pip freeze`` (local labels such as +cu128 dropped)."""
    found = {}
    for line in FREEZE.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            found[canonicalize_name(match.group(1))] = Version(match.group(2).split("+")[0])
    return found


def readme_upgrades() -> set[str]:
    """The packages the README's install note says the kit upgrades on Colab."""
    note = re.search(r"<!-- colab-upgrades -->(.*?)<!-- /colab-upgrades -->", (ROOT / "README.md").read_text(), re.S)
    assert note, "README.md has no install note between <!-- colab-upgrades --> markers"
    return {canonicalize_name(name) for name in re.findall(r"`([A-Za-z0-9_.\-]+)`", note.group(1))}


def resolve(python_version: str, tmp_path: Path) -> dict:
    """pip's report of the kit's requirement tree on Colab's Python ``python_version``, torch and ipywidgets held."""
    colab = colab_versions()
    pins = tmp_path / f"pins-{python_version}.txt"
    pins.write_text("".join(f"{name}=={colab[name]}\n" for name in NEVER_CHANGED))
    report = tmp_path / f"report-{python_version}.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--python-version", python_version, "--only-binary=:all:",
               *(arg for tag in PLATFORMS for arg in ("--platform", tag)),
               "-c", str(pins), "-r", str(ROOT / "requirements.txt")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and ("NewConnectionError" in done.stderr or "Network is unreachable" in done.stderr):
        pytest.skip(f"PyPI cannot be reached from here: the resolution was not checked ({done.stderr[-200:]})")
    assert done.returncode == 0, f"no resolution on Python {python_version} keeps torch and ipywidgets:\n" + (
        done.stderr[-3000:])
    return json.loads(report.read_text())


def _environment(python_version: str) -> dict:
    return {"python_version": python_version, "python_full_version": python_version + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def upgraded_on_colab(report: dict, python_version: str) -> dict[str, list[str]]:
    """Colab's packages that pip replaces: {package: [the requirements that exclude Colab's version]}.

    As pip's only-if-needed upgrade does: the kit's own requirements are read, then those of every package pip
    installs (new to Colab, or replacing Colab's), until nothing more changes. A package Colab keeps brings its own
    requirements, which Colab's image already satisfies."""
    colab, environment = colab_versions(), _environment(python_version)
    requires = {canonicalize_name(i["metadata"]["name"]): i["metadata"].get("requires_dist", [])
                for i in report["install"]}
    kit_lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    excluded: dict[str, list[str]] = {}
    while True:
        installed = [name for name in requires if name not in colab or name in excluded]
        lines = [line for line in kit_lines if line] + [line for name in installed for line in requires[name]]
        found = _excluding(lines, colab, environment)
        if found == excluded:
            return excluded
        excluded = found


def _excluding(lines: list[str], colab: dict, environment: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in lines:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if name in colab and not requirement.specifier.contains(colab[name], prereleases=True):
            found.setdefault(name, []).append(str(requirement))
    return found


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("colab-resolution")
    with ThreadPoolExecutor(len(COLAB_PYTHONS)) as pool:
        return dict(zip(COLAB_PYTHONS, pool.map(lambda version: resolve(version, folder), COLAB_PYTHONS)))


@pytest.mark.parametrize("python_version", COLAB_PYTHONS)
def test_the_install_resolves_keeping_torch_and_ipywidgets(reports, python_version):
    resolved = {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"])
                for i in reports[python_version]["install"]}
    colab = colab_versions()
    for name in NEVER_CHANGED:
        assert resolved[name] == colab[name], f"{name} {resolved[name]} would replace Colab's {colab[name]}"
    assert {"trl", "peft", "transformers", "bitsandbytes"} <= set(resolved)


@pytest.mark.parametrize("python_version", COLAB_PYTHONS)
def test_what_the_install_upgrades_on_colab_is_the_readmes_list(reports, python_version):
    upgrades = upgraded_on_colab(reports[python_version], python_version)
    assert not set(upgrades) & set(NEVER_CHANGED), upgrades
    assert set(upgrades) == readme_upgrades(), (
        f"on Python {python_version} the install upgrades {sorted(upgrades)} (because of {upgrades}); the README's "
        f"install note lists {sorted(readme_upgrades())}")
