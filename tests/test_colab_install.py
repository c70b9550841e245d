"""Colab's install, checked without Colab: installing the kit there must upgrade nothing Colab ships.

Colab (August 2026, its published package list) has the versions in
``COLAB`` on Python 3.12 (3.13 on the newest images), and no bitsandbytes. ``pip install`` of the
kit upgrades a package when the kit's specifier excludes Colab's version, so every specifier must
admit it. No network: the files are read and compared with ``packaging``.
"""
from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
COLAB = {"transformers": "5.15", "torch": "2.11.0", "peft": "0.20", "accelerate": "1.14", "datasets": "4.0",
         "ipywidgets": "7.7.1", "matplotlib": "3.10"}
COLAB_PYTHONS = ("3.12", "3.13")
NEVER_UPGRADED = ("torch", "ipywidgets")      # the install cell must leave these two alone, always
NOT_ON_COLAB = ("bitsandbytes",)                  # pip installs it; it must not drag torch along


def _requirements_txt() -> dict[str, Requirement]:
    reqs = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            r = Requirement(line)
            reqs[canonicalize_name(r.name)] = r
    return reqs


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pyproject_requirements() -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, _pyproject()["project"]["dependencies"])}


def test_the_two_files_list_the_same_requirements():
    txt, toml = _requirements_txt(), _pyproject_requirements()
    assert sorted(txt) == sorted(toml), "requirements.txt and pyproject.toml name different packages"
    for name in txt:
        assert txt[name].specifier == toml[name].specifier, (
            f"{name}: requirements.txt says {txt[name].specifier}, pyproject.toml says {toml[name].specifier}")
        assert txt[name].marker == toml[name].marker and txt[name].extras == toml[name].extras, name


@pytest.mark.parametrize("package", sorted(COLAB))
def test_colabs_version_satisfies_the_kits_specifier(package):
    """Installing the kit in Colab keeps Colab's version of every package Colab ships."""
    reqs = _requirements_txt()
    if package not in reqs:
        pytest.skip(f"the kit does not require {package}")
    spec = reqs[package].specifier
    assert spec.contains(Version(COLAB[package]), prereleases=True), (
        f"pip would replace Colab's {package} {COLAB[package]}: the kit asks for {package}{spec}")


def test_torch_and_ipywidgets_are_never_pinned_or_capped_below_colab():
    reqs = _requirements_txt()
    for name in NEVER_UPGRADED:
        spec = reqs[name].specifier
        assert not any(s.operator in ("==", "===", "~=") for s in spec), f"{name} is pinned: {spec}"
        assert spec.contains(Version(COLAB[name])), f"{name}{spec} excludes Colab's {COLAB[name]}"
    # ipywidgets 8 does not render in Colab; the kit works with 7.7 and 8, so both must be admitted.
    assert reqs["ipywidgets"].specifier.contains("8.1.5") and reqs["ipywidgets"].specifier.contains("7.7.1")


def test_colabs_python_is_allowed():
    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    for py in COLAB_PYTHONS:
        assert spec.contains(py), f"requires-python {spec} excludes Colab's Python {py}"
    for name, r in _requirements_txt().items():  # no requirement limited to Pythons Colab lacks
        if r.marker is not None:
            assert any(r.marker.evaluate({"python_version": py, "python_full_version": py + ".0"})
                       for py in COLAB_PYTHONS), f"{name}: its marker {r.marker} excludes Colab's Pythons"


def test_requires_python_is_the_floor_of_the_dependencies_pythons():
    """pyproject's requires-python says the truth: no Python below it can install every dependency (trl 1.16 needs
    3.11), read from the installed dependencies' own Requires-Python metadata."""
    from importlib.metadata import metadata

    floor = Version(re.match(r">=\s*([\d.]+)$", _pyproject()["project"]["requires-python"]).group(1))
    needs = {}
    for line in _pyproject()["project"]["dependencies"]:
        name = Requirement(line).name
        try:
            spec = metadata(name).get("Requires-Python")
        except PackageNotFoundError:
            continue
        lows = [Version(s.version) for s in SpecifierSet(spec or "") if s.operator == ">="]
        needs[name] = max(lows, default=Version("0"))
    assert floor == max(needs.values()), (floor, needs)


def test_what_colab_lacks_needs_no_other_torch():
    """bitsandbytes is not on Colab, so pip installs it; its own torch requirement must admit Colab's torch.

    Read from the installed distribution's metadata (the version pip picks here), without a network.
    """
    colab_torch = Version(COLAB["torch"])
    for name in NOT_ON_COLAB:
        assert name in _requirements_txt(), f"{name} is no longer required: drop it from NOT_ON_COLAB"
        try:
            declared = requires(name) or []
        except PackageNotFoundError:
            pytest.skip(f"{name} is not installed here")
        for line in declared:
            r = Requirement(line)
            if canonicalize_name(r.name) in NEVER_UPGRADED and (r.marker is None or r.marker.evaluate({"extra": ""})):
                assert r.specifier.contains(colab_torch if r.name == "torch" else Version(COLAB[r.name])), (
                    f"{name} requires {line}: pip would replace Colab's {r.name}")


def test_transformers_5_floor_is_needed():
    """Keep ``transformers>=5.0`` only while the kit uses names transformers 4 lacks; this finds them."""
    v5_only = {  # import -> why transformers 4.x fails it
        "from transformers.quantizers.quantizers_utils import should_convert_module": "added in 5.0",
        "from transformers.trainer_optimizer import _parse_optim_args": "module added in 5.0",
    }
    source = "\n".join(p.read_text() for p in (ROOT / "kit").rglob("*.py"))
    used = [imp for imp in v5_only if imp in source]
    floor = _requirements_txt()["transformers"].specifier
    if used:
        assert not floor.contains("4.57.0"), f"the kit uses {used}, transformers 5 only; the floor {floor} admits 4.x"
    else:
        pytest.fail(f"no transformers-5-only import is left in kit/: lower the floor {floor} if nothing else needs 5.x")


def test_each_floor_is_a_plain_lower_bound_or_a_range():
    """Only ``>=`` floors and ``<`` caps: an exact pin anywhere would fight whatever Colab has."""
    for name, r in _requirements_txt().items():
        for s in r.specifier:
            assert s.operator in (">=", "<", "!="), f"{name}{r.specifier}: use >= floors (and < caps) only"
            assert re.fullmatch(r"[0-9.]+", s.version), f"{name}{r.specifier}"


# -- the notebooks' install cell (instructor and learner copies alike) -------------------------------------------
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))


def _install_cell(path: Path) -> str:
    import json

    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    found = [src for src in cells if "pip install" in src or '"pip", "install"' in src]
    assert len(found) == 1, f"{path.name}: exactly one install cell, not {len(found)}"
    return found[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_the_install_cell_installs_the_kit_and_upgrades_nothing(path):
    """Only the kit, from its URL, with no flag that would upgrade or reinstall what Colab ships (torch, ipywidgets
    stay Colab's: the kit's specifiers admit them, above); a failed install says so instead of raising."""
    src = _install_cell(path)
    assert 'f"memory-kit @ git+{KIT_REPO_URL}"' in src
    for line in (ln for ln in src.splitlines() if "pip" in ln and "install" in ln and not ln.lstrip().startswith("#")):
        assert not re.search(r'(?<![\w-])(-U|-I|--upgrade|--upgrade-strategy|--force-reinstall|--ignore-installed)\b',
                             line), f"{path.name}: {line.strip()}"
        for name in NEVER_UPGRADED:
            assert name not in line, f"{path.name}: the install cell names {name}: {line.strip()}"
    assert "returncode != 0" in src and "could not be reached" in src


def test_every_notebook_has_the_same_install_cell():
    cells = {str(p.relative_to(ROOT)): _install_cell(p) for p in NOTEBOOKS}
    first = next(iter(cells.values()))
    assert [p for p, src in cells.items() if src != first] == [], "the install cells differ: copy one into all"


def test_the_install_address_is_one_constant_and_the_readme_names_it():
    """Every install cell's KIT_REPO_URL is kit.REPO_URL, and the README says where the install cell points."""
    import kit

    for path in NOTEBOOKS:
        address = re.search(r'KIT_REPO_URL = "([^"]+)"', _install_cell(path))
        assert address and address.group(1) == kit.REPO_URL, f"{path.name}: {address and address.group(1)}"
    assert f"installs the kit from `{kit.REPO_URL}`" in (ROOT / "README.md").read_text().replace("\n", " ")
