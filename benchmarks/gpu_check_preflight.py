"""``make gpu-check``'s preflight and plan: what this GPU box holds, what it lacks, and which stages run how.

Pure where it can be (:func:`plan` takes plain figures, so a test can plan for any card); the readings are
:func:`read_box` (torch, the driver, the GPU, its free memory, the packages) and :func:`nvidia_smi_gpus`.

- **Packages.** The box is assumed to hold a CUDA torch, transformers, peft, accelerate, matplotlib, psutil,
  nvidia-ml-py and pytest. What a stage needs beyond that (``NEEDS``) is installed from a folder of wheels when
  one is there (``make gpu-wheels`` fills it where a registry is reachable): ``pip install --no-index
  --find-links WHEELS --target SITE``, never from a registry, never into a new venv. A stage whose packages are
  still missing is skipped, and says which.
- **Side by side only where it fits.** Each capped stage may reserve ``cap_bytes`` plus its CUDA context; they
  run side by side in batches of as many as the free memory holds, and batches that do not fit the time left
  are skipped, each with its reason, never scored as a cap verdict.

>>> p = plan({"a": 60, "b": 60}, {"c1": 100, "c2": 100, "c3": 100}, {}, set(), free_bytes=40 * GiB,
...          cap_bytes=15 * GiB, total_s=300, setup_s=20)
>>> p["batches"], list(p["skipped"])
([['c1', 'c2']], ['c3'])
>>> print(p["skipped"]["c3"])
no time left: a card with 40.00 GiB free holds 2 capped stage(s) at once, and the 300 s budget is spent
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

GiB = 1024 ** 3
ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "wheels"                 # make gpu-wheels downloads into it (git-ignored)
SITE = ROOT / ".gpu-check-site"          # where the wheels are installed (git-ignored), put on PYTHONPATH
CONTEXT_BYTES = 1 * GiB                  # a CUDA context and torch's kernels, per process (about 0.5-1 GiB)
# import name -> distribution name, for what the box is assumed to hold and what a stage may need beyond it
BOX = {"torch": "torch", "transformers": "transformers", "peft": "peft", "accelerate": "accelerate",
       "matplotlib": "matplotlib", "psutil": "psutil", "pynvml": "nvidia-ml-py", "pytest": "pytest"}
EXTRA = {"bitsandbytes": "bitsandbytes", "datasets": "datasets", "ipywidgets": "ipywidgets", "nbval": "nbval",
         "nbclient": "nbclient", "ipykernel": "ipykernel", "trl": "trl", "liger_kernel": "liger-kernel"}
_KIT = ["torch", "transformers", "peft", "accelerate", "matplotlib", "psutil", "datasets"]   # kit/ imports these
_NB = _KIT + ["nbclient", "ipykernel", "ipywidgets"]
NEEDS = {"gpu tests": _KIT + ["pytest", "ipywidgets"], "estimate grid": _KIT, "demo s1": _KIT,
         "demo s2": _KIT + ["bitsandbytes"], "crash loop": _KIT + ["bitsandbytes"],
         "notebook 00": _NB, "notebook 01": _NB, "notebook 02": _NB + ["bitsandbytes"], "notebook 03": _NB}


def packages(names) -> dict:
    """import name -> installed version (None: missing), looked up on ``sys.path`` as it is now.

    >>> packages(["sys_no_such_package"])
    {'sys_no_such_package': None}
    """
    importlib.invalidate_caches()
    out = {}
    for name in names:
        if importlib.util.find_spec(name) is None:
            out[name] = None
            continue
        try:
            out[name] = md.version({**BOX, **EXTRA}.get(name, name))
        except md.PackageNotFoundError:
            out[name] = "?"
    return out


def nvidia_smi_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (``[]`` without nvidia-smi, or when it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def torch_blind_reason(torch_mod, gpus: list[str]) -> str:
    """One sentence: nvidia-smi sees ``gpus`` and this torch does not, and what to do."""
    cuda = torch_mod.version.cuda
    why = ("this torch is a CPU build: run make gpu-check with the Python that holds a CUDA torch "
           "(make gpu-check GPU_PY=/path/to/python)") if cuda is None else (
        f"this torch was built for CUDA {cuda}, which may need a newer driver than this box has: install a torch "
        "built for the box's CUDA version (nvidia-smi's header names it), or update the driver")
    return (f"gpu-check: FAILED: nvidia-smi lists {len(gpus)} GPU(s) ({'; '.join(gpus)}), but torch "
            f"{torch_mod.__version__} ({sys.executable}) cannot see them (torch.cuda.is_available() is False): {why}.")


def read_box(torch_mod) -> dict:
    """torch's and CUDA's versions, the driver, the GPU, its free and total memory, and the packages."""
    info = {"python": sys.executable, "torch": torch_mod.__version__, "cuda": torch_mod.version.cuda,
            "driver": None, "gpu": torch_mod.cuda.get_device_name(0), "free_bytes": None, "total_bytes": None}
    try:
        info["free_bytes"], info["total_bytes"] = torch_mod.cuda.mem_get_info(0)
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        pass
    return info


def install_missing(missing: list[str], wheels: Path = WHEELS, site: Path = SITE) -> str:
    """Install every wheel in ``wheels`` into ``site`` (``--no-index --no-deps``: the folder holds what the box
    lacks, dependencies included) when something is missing and the folder is there; says what it did."""
    if not missing:
        return "nothing missing"
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        return (f"missing {', '.join(missing)}, and no wheels in {wheels} "
                "(make gpu-wheels fills it where a registry is reachable)")
    site.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links",
                        str(wheels), "--target", str(site), "--upgrade", *map(str, files)],
                       capture_output=True, text=True, timeout=180)
    last = (p.stderr.strip().splitlines() or [""])[-1][:200]
    return (f"installed {len(files)} wheels from {wheels} into {site}" if p.returncode == 0
            else f"pip could not install from {wheels} (exit {p.returncode}: {last})")


def plan(first: dict, capped: dict, needs: dict, missing: set, *, free_bytes: int | None, cap_bytes: int,
         total_s: float, setup_s: float, context_bytes: int = CONTEXT_BYTES, grace_s: float = 10) -> dict:
    """Which stages run, and how: ``{"first": [names], "batches": [[names run side by side]], "skipped":
    {name: why}, "at_once": n, "seconds": the planned worst case}``. ``first`` and ``capped`` map each stage
    to its budget in seconds, in priority order; ``needs`` maps a stage to the packages it imports."""
    skipped = {n: f"needs {', '.join(sorted(set(needs.get(n, [])) & missing))}, missing here"
               for n in [*first, *capped] if set(needs.get(n, [])) & missing}
    run_first = [n for n in first if n not in skipped]
    left = total_s - setup_s - sum(first[n] + grace_s for n in run_first)
    per = cap_bytes + context_bytes
    at_once = max(1, int(free_bytes // per)) if free_bytes else 1
    queue, batches = [n for n in capped if n not in skipped], []
    while queue:
        batch = queue[:at_once]
        cost = max(capped[n] for n in batch) + grace_s
        if cost > left:
            break
        batches.append(batch)
        queue, left = queue[at_once:], left - cost
    free = "an unknown amount" if free_bytes is None else f"{free_bytes / GiB:.2f} GiB"
    for n in queue:
        skipped[n] = (f"no time left: a card with {free} free holds {at_once} capped stage(s) at once, "
                      f"and the {total_s:g} s budget is spent")
    seconds = setup_s + sum(first[n] + grace_s for n in run_first) + sum(
        max(capped[n] for n in b) + grace_s for b in batches)
    return {"first": run_first, "batches": batches, "skipped": skipped, "at_once": at_once, "seconds": seconds}


def plan_text(box: dict, have: dict, p: dict, first: dict, capped: dict) -> str:
    """The preflight, printed: the box, the packages, and the plan with each stage's budget."""
    gib = lambda n: "?" if n is None else f"{n / GiB:.2f} GiB"   # noqa: E731
    lines = [f"gpu-check preflight: torch {box['torch']} (CUDA {box['cuda']}), driver {box['driver'] or '?'}, "
             f"{box['gpu']}: {gib(box['free_bytes'])} free of {gib(box['total_bytes'])}; python {box['python']}",
             "  packages: " + ", ".join(f"{k} {v}" if v else f"{k} MISSING" for k, v in have.items())]
    lines.append("  plan: " + "; then ".join(
        [", ".join(f"{n} ({first[n]:g} s)" for n in p["first"])] +
        [" + ".join(f"{n}" for n in b) + f" side by side ({max(capped[n] for n in b):g} s)" for b in p["batches"]]
    ) + f"; at most {p['seconds']:g} s in all")
    lines += [f"  skipped: {n}: {why}" for n, why in p["skipped"].items()]
    return "\n".join(lines)


def site_env() -> dict:
    """The environment that puts the installed wheels (``SITE``) on the stages' path."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(SITE), os.environ.get("PYTHONPATH")]))}
