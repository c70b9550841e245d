"""``make gpu-check``: prove the GPU side in one call of at most 10 minutes; one line where there is no GPU.

Run: ``python benchmarks/gpu_check.py [--work DIR] [--results benchmarks/results]``. On a machine with a
CUDA GPU it runs these stages, each a subprocess with its own time budget (``BUDGETS``), its output
kept in ``WORK/<stage>.log`` whatever happens to a later stage:

1. the GPU-marked tests (``pytest -m gpu``);
2. the GPU grid of ``benchmarks/estimate_vs_measured.py`` (estimated against measured peaks);
3. at once, each in its own process capped at a Colab T4's 14.56 GiB (``KIT_GPU_CAP_BYTES``, which
   ``kit.measure.device`` applies on import with ``torch.cuda.set_per_process_memory_fraction``): the demo at
   real size, one process per scenario (``python -m kit demo --out WORK/demo-sN --size real --scenario N``),
   the user's fold loop at Llama-3-8B size (``gpu_check_crash.py``: notebook 02's predicted crash at fold 2's
   load), and notebooks 00-03, executed with
   ``jupyter nbconvert --execute`` into ``WORK/notebooks`` (never in place). Every reading checked is
   its own process's CUDA allocator, so the others running beside it do not enter it.

Then it reads the two ``summary.json`` files (one per scenario, merged) and checks the predictions
(``gpu_check_verdicts``), and writes ``benchmarks/results/gpu-check-<date>-<device>.md`` and a ``.json`` of
every figure beside it.

>>> # make gpu-check          (on a CPU: "gpu-check: no CUDA GPU on this machine ... nothing to check.")
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GiB = 1024 ** 3
CAP_BYTES = int(14.56 * GiB)      # what a Colab T4 lets torch allocate (kit.presets "colab-t4")
CAP_ENV = "KIT_GPU_CAP_BYTES"     # kit.measure.controls.CAP_ENV
NOTEBOOKS = ("00_check_your_setup", "01_distilgpt2_custom_head", "02_llama3_qlora_cross_validation",
             "03_your_own_setup")
# Seconds per stage, and for the whole run, setup included: 9 minutes, 30 (preflight) + 150 + 80 + 250, plus 10 s of
# stop grace per step = 540 s at most. The capped stages run side by side where the card's free memory holds them
# all; on a smaller card in batches, and what does not fit the time is skipped, with its reason.
TOTAL_S, SETUP_S = 540, 30
BUDGETS = {"gpu tests": 150, "estimate grid": 80, "demo s1": 250, "demo s2": 250, "crash loop": 250,
           **{f"notebook {n[:2]}": 250 for n in NOTEBOOKS}}   # (gpu tests: the allocator's and the levers' GPU tests)
DEMOS = ("demo s1", "demo s2")
NO_GPU = "gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to check."
# A notebook run with nbclient alone (nbconvert is not on every GPU box): python -c RUN_NOTEBOOK IN OUT TIMEOUT
RUN_NOTEBOOK = ("import sys, nbformat, nbclient; nb = nbformat.read(sys.argv[1], as_version=4); "
                "nbclient.NotebookClient(nb, timeout=int(sys.argv[3]), kernel_name='python3').execute(); "
                "nbformat.write(nb, sys.argv[2])")
# Imported at each notebook kernel's start (IPython startup file): applies the cap and writes down what it set.
STARTUP = ("import json, os\nfrom kit.measure import ENV_CAP\nwith open(os.environ['GPU_CHECK_CAP_LOG'], 'a') as f:\n"
           "    f.write(json.dumps({'pid': os.getpid(), 'cap': ENV_CAP}) + '\\n')\n")


@dataclass
class Stage:
    name: str
    cmd: list
    budget_s: float
    env: dict | None = None      # added to this process's environment


@dataclass
class StageResult:
    name: str
    cmd: list
    budget_s: float
    rc: int | None               # None when it was stopped at its budget
    timed_out: bool
    seconds: float
    log: str
    output: str
    skipped: str | None = None   # why it did not run (the preflight's plan)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


def _kill(proc: subprocess.Popen) -> None:
    """Stop a stage and everything it started (a notebook's kernel too): TERM, then KILL."""
    try:
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [proc.pid] + [p.pid for p in family]:
            try:
                os.killpg(pid, sig) if pid == proc.pid else os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
            if sig == signal.SIGTERM and not any(p.is_running() for p in family):
                return
        except subprocess.TimeoutExpired:
            pass


def _start(stage: Stage, log_dir: Path):
    log = log_dir / (re.sub(r"[^A-Za-z0-9]+", "-", stage.name).strip("-") + ".log")
    f = open(log, "w")
    proc = subprocess.Popen([str(c) for c in stage.cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, **(stage.env or {})}, start_new_session=True)
    return stage, proc, f, log, time.monotonic()


def _finish(stage: Stage, proc, f, log: Path, started: float) -> StageResult:
    try:
        rc, timed_out = proc.wait(timeout=max(0.0, started + stage.budget_s - time.monotonic())), False
    except subprocess.TimeoutExpired:
        _kill(proc)
        rc, timed_out = None, True
    f.close()
    seconds = round(time.monotonic() - started, 1)
    output = log.read_text(errors="replace")
    if timed_out:
        output += f"\n[gpu-check: stopped at its budget of {stage.budget_s:g} s]\n"
    return StageResult(stage.name, [str(c) for c in stage.cmd], stage.budget_s, rc, timed_out, seconds, str(log),
                       output)


def run_stages(stages: list[Stage], log_dir: Path, parallel: bool = False) -> list[StageResult]:
    """Run each stage under its own budget, one after the other or (``parallel``) all at once.

    A stage past its budget is stopped; its output so far is kept, and the next stages run.

    >>> r = run_stages([Stage("hi", [sys.executable, "-c", "print('hi')"], 30)], Path(tempfile.mkdtemp()))
    >>> r[0].ok, r[0].output
    (True, 'hi\\n')
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    if parallel:
        started = [_start(s, log_dir) for s in stages]
        return [_finish(*s) for s in started]
    return [_finish(*_start(s, log_dir)) for s in stages]


def stage_verdict(r: StageResult, what: str) -> dict:
    from gpu_check_verdicts import FAILED, PASSED, verdict

    if r.skipped:
        from gpu_check_verdicts import NOT_TAKEN

        return verdict(what, NOT_TAKEN, f"skipped: {r.skipped}")
    if r.timed_out:
        return verdict(what, FAILED, f"timed out after its budget of {r.budget_s:g} s (output kept: {r.log})")
    return verdict(what, PASSED if r.rc == 0 else FAILED, f"exit {r.rc} in {r.seconds:g} s (log: {r.log})")


GRID_ROW = re.compile(r"^(?P<label>.{40}) (?P<model>\S+)\s+predicted\s+(?P<est>[\d,]+) measured\s+(?P<got>[\d,]+) "
                      r"\((?P<err>[+-]?[\d.]+)%\)")


def grid_rows(output: str) -> list[dict]:
    """The grid's printed rows: estimated and measured peak bytes per setup.

    >>> grid_rows(f"{'full FT fp32':40s} distilgpt2               predicted  1,000 measured  1,010 (-0.99%) [3 s]")
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'label': 'full FT fp32', 'model': 'distilgpt2',
      'estimated_peak_bytes': 1000, 'measured_peak_bytes': 1010, 'error_pct': -0.99}]
    """
    rows = []
    for line in output.splitlines():
        m = GRID_ROW.match(line)
        if m:
            rows.append({"label": m["label"].strip(), "model": m["model"],
                         "estimated_peak_bytes": int(m["est"].replace(",", "")),
                         "measured_peak_bytes": int(m["got"].replace(",", "")), "error_pct": float(m["err"])})
    return rows


def device_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``.

    >>> device_slug("Tesla T4 (PCIe)")
    'tesla-t4-pcie'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def cap_seen(demos: list, cap_log: Path) -> dict:
    """Where the cap was confirmed in force: each demo's output line, and one line per notebook kernel."""
    lines = {d.name: next((x for x in d.output.splitlines() if x.startswith(f"{CAP_ENV}=")), None) for d in demos}
    kernels = [json.loads(x) for x in cap_log.read_text().splitlines()] if cap_log.is_file() else []
    return {"demos": lines, "kernels": kernels}


def merged_summary(paths: list) -> dict | None:
    """The demo runs' summary.json files as one: each scenario from the run that has it, errors joined.

    >>> merged_summary([]) is None
    True
    """
    parts = [json.loads(Path(p).read_text()) for p in paths if Path(p).is_file()]
    if not parts:
        return None
    out = {**parts[0], "errors": [e for p in parts for e in p.get("errors") or []]}
    for p in parts[1:]:
        out.update({k: p[k] for k in ("scenario1", "scenario2") if k in p})
        out["errors"] += [f"{k} differs between the demo runs: {out.get(k)!r} and {p.get(k)!r}"
                          for k in ("size", "reading", "device") if p.get(k) != out.get(k)]
    return out


def stages_for(work: Path, py: str) -> tuple[list[Stage], list[Stage]]:
    """The uncapped stages, run one after the other, and the capped ones, run side by side."""
    from gpu_check_preflight import site_env

    capped_env = {CAP_ENV: str(CAP_BYTES), "KIT_SMOKE": "0", "KIT_CACHE": str(work / "twins"), **site_env(),
                  "IPYTHONDIR": str(work / "ipython"), "GPU_CHECK_CAP_LOG": str(work / "kernel-caps.jsonl")}
    gpu_files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                       if "mark.gpu" in p.read_text())   # only these: the others may import what the box lacks
    first = [Stage("gpu tests", [py, "-m", "pytest", *gpu_files, "-m", "gpu", "-p", "no:cacheprovider", "-q"],
                   BUDGETS["gpu tests"], site_env()),
             Stage("estimate grid", [py, "benchmarks/estimate_vs_measured.py", "--out", work / "grid.md"],
                   BUDGETS["estimate grid"], site_env())]
    side = [Stage(d, [py, "-m", "kit", "demo", "--out", work / d.replace(" ", "-"), "--size", "real", "--scenario",
                      d[-1]], BUDGETS[d], capped_env) for d in DEMOS]
    side.append(Stage("crash loop", [py, "benchmarks/gpu_check_crash.py", work / "crash.json"], BUDGETS["crash loop"],
                      capped_env))
    for n in NOTEBOOKS:
        name = f"notebook {n[:2]}"
        (work / "notebooks").mkdir(parents=True, exist_ok=True)
        side.append(Stage(name, [py, "-c", RUN_NOTEBOOK, ROOT / "notebooks" / f"{n}.ipynb",
                                 work / "notebooks" / f"{n}.ipynb", BUDGETS[name]], BUDGETS[name], capped_env))
    return first, side


def run_planned(first: list[Stage], side: list[Stage], work: Path, torch_mod) -> list[StageResult]:
    """The preflight (printed), the wheels installed where something is missing, then the stages as planned:
    the first ones in turn, the capped ones in batches side by side; a skipped stage gets a result saying why."""
    import gpu_check_preflight as pf

    box = read_box(torch_mod)
    names = [*pf.BOX, *pf.EXTRA]
    have = pf.packages(names)
    missing = [n for n, v in have.items() if v is None]
    if missing:
        done = pf.install_missing(missing)
        sys.path.insert(0, str(pf.SITE))
        have = pf.packages(names)
        print(f"gpu-check: {done}", flush=True)
    p = pf.plan({s.name: s.budget_s for s in first}, {s.name: s.budget_s for s in side}, pf.NEEDS,
                {n for n, v in have.items() if v is None}, free_bytes=box["free_bytes"], cap_bytes=CAP_BYTES,
                total_s=TOTAL_S, setup_s=SETUP_S)
    print(pf.plan_text(box, have, p, {s.name: s.budget_s for s in first}, {s.name: s.budget_s for s in side}),
          flush=True)
    print(f"gpu-check: logs in {work}", flush=True)
    stages = {s.name: s for s in [*first, *side]}
    results = run_stages([stages[n] for n in p["first"]], work)
    print("gpu-check: " + ", ".join(f"{r.name} {'ok' if r.ok else 'FAILED'}" for r in results), flush=True)
    for batch in p["batches"]:
        results += run_stages([stages[n] for n in batch], work, parallel=True)
    for n, why in p["skipped"].items():
        print(f"gpu-check: skipped {n}: {why}", flush=True)
        results.append(StageResult(n, [str(c) for c in stages[n].cmd], stages[n].budget_s, None, False, 0.0, "",
                                   "", skipped=why))
    order = list(stages)
    return sorted(results, key=lambda r: order.index(r.name))


def read_box(torch_mod) -> dict:
    """What the preflight reads of this box (a test replaces it to plan for another card)."""
    from gpu_check_preflight import read_box as read

    return read(torch_mod)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=None, help="scratch folder for logs, the demo and the executed notebooks")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"), help="where the report goes")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        from gpu_check_preflight import nvidia_smi_gpus, torch_blind_reason

        gpus = nvidia_smi_gpus()
        print(torch_blind_reason(torch, gpus) if gpus else NO_GPU)
        return 2 if gpus else 0
    from gpu_check_verdicts import NOT_TAKEN, crash_verdict, verdicts

    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # without a network each Hub attempt hangs; real-size twins
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(a.work or tempfile.mkdtemp(prefix="gpu-check-"))
    (work / "ipython" / "profile_default" / "startup").mkdir(parents=True, exist_ok=True)
    (work / "ipython" / "profile_default" / "startup" / "00-kit-gpu-cap.py").write_text(STARTUP)
    device = torch.cuda.get_device_name(0)
    first, side = stages_for(work, sys.executable)
    results = run_planned(first, side, work, torch)
    by = {r.name: r for r in results}
    from gpu_check_verdicts import grid_verdict, notebook_verdict

    def ran(r):  # (exit code, or None where the stage did not finish; its detail)
        v = stage_verdict(r, "")
        return (None if r.skipped or r.timed_out else r.rc), v["detail"]

    out = [stage_verdict(by["gpu tests"], "the GPU-marked tests pass"),
           grid_verdict(*(lambda rc, d: (rc, grid_rows(by["estimate grid"].output), d))(*ran(by["estimate grid"])))]
    for n in NOTEBOOKS:   # each verdict checks its subject: the executed notebook's outputs say REAL sizes
        executed = work / "notebooks" / f"{n}.ipynb"
        rc, detail = ran(by[f"notebook {n[:2]}"])
        out.append(notebook_verdict(n, rc, executed.read_text() if executed.is_file() else None, detail))
    out += [stage_verdict(by[d], f"the demo's scenario {d[-1]} runs at real size under the cap") for d in DEMOS]
    summary = merged_summary([work / d.replace(" ", "-") / "summary.json" for d in DEMOS])
    out += verdicts(summary, CAP_BYTES, "no summary.json: " + "; ".join(
        f"{d}: {stage_verdict(by[d], '')['detail']}" for d in DEMOS))
    crash = work / "crash.json"
    out.append(crash_verdict(json.loads(crash.read_text()) if crash.is_file() else None, CAP_BYTES,
                             stage_verdict(by["crash loop"], "")["detail"]))
    seen = cap_seen([by[d] for d in DEMOS], work / "kernel-caps.jsonl")
    from gpu_check_verdicts import FAILED, PASSED, verdict

    capped = all(line and "capped" in line for line in seen["demos"].values())
    kernels = sum(1 for k in seen["kernels"] if "capped" in str(k.get("cap")))
    out[2:2] = [verdict("the T4 cap is in force in both demo runs", PASSED if capped else FAILED,
                        "; ".join(f"{d}: {line or f'no {CAP_ENV}= line in its output'}"
                                  for d, line in seen["demos"].items())),
                verdict("the T4 cap is in force in every notebook kernel",
                        PASSED if kernels >= len(NOTEBOOKS) else FAILED,
                        f"{kernels} of {len(NOTEBOOKS)} kernels wrote that they were capped "
                        f"({work / 'kernel-caps.jsonl'})")]
    from gpu_check_report import write

    md, js = write(Path(a.results), device, device_slug(device), out, results, summary, grid_rows(
        by["estimate grid"].output), seen, CAP_BYTES, work)
    failed = [v for v in out if v["status"] in (FAILED, NOT_TAKEN)]
    print(f"gpu-check: {len(out) - len(failed)} of {len(out)} verdicts passed or not checkable; wrote {md} and {js}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
