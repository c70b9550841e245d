"""Every figure the README and docs/ quote comes from a file in the repository, benchmarks never write over their
results, and what the kit prints names sources that are there (issue 25: items 3, 4, 6, 11, 12, 13)."""
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _table(name):
    """The rows of a results file's table, as lists of stripped cells."""
    results = (ROOT / "benchmarks/results" / name).read_text()
    return [[c.strip() for c in line.split("|")[1:-1]] for line in results.splitlines()
            if line.startswith("| ") and not line.startswith(("| setup", "| case", "| model"))]


def _ms(text):
    return float(re.match(r"\**([\d.]+)", text).group(1))


def test_the_docs_quote_the_advisor_latency_its_results_file_holds():
    page = " ".join((ROOT / "docs/cli-and-api.md").read_text().split())
    rows = _table("advisor_latency-2026-12-03-160548-cpu.md")
    new, again = [_ms(r[7]) for r in rows], [_ms(r[8]) for r in rows]
    cheap = [_ms(r[k]) for r in rows for k in (9, 10)]
    seventy = [_ms(r[7]) for r in rows if r[0].startswith("70B")]
    assert f"cheap path ({min(cheap):g} to {max(cheap):.0f} ms)" in page
    assert f"takes {min(new):.0f} ms (Llama-3-8B QLoRA on a T4) to {max(new):.0f} ms" in page
    assert len(seventy) == 1 and f"{seventy[0]:.0f} ms for a 70B full fine-tune on an H100" in page
    assert f"{min(again):.0f} to {max(again):.0f} ms asked again" in page


def test_the_docs_quote_the_panel_latency_its_results_file_holds():
    name = "panel_latency-2026-12-07-211455-cpu.md"
    every = [r for r in _table(name) if "every change" in r[1]]
    medians, top = [_ms(r[3]) for r in every], max(_ms(r[4]) for r in every)
    assert len(medians) == 4
    for page in ("docs/cli-and-api.md", "docs/accuracy.md"):
        text = " ".join((ROOT / page).read_text().split())
        assert all(f"{m:.1f} ms" in text for m in medians) and f"at most {top:.1f} ms" in text and name in text


RESERVED_RUNS = ("reserved_timing-2026-12-03-195322-cpu.md", "reserved_timing-2026-12-03-200048-cpu.md",
                 "reserved_timing-2026-12-03-200902-cpu.md")


def test_the_docs_quote_the_reserved_timing_its_results_files_hold():
    page = " ".join((ROOT / "docs/accuracy.md").read_text().split())
    runs = [_table(name) for name in RESERVED_RUNS]
    slowest = [max(rows, key=lambda r: float(r[2])) for rows in runs]
    assert {r[0] for r in slowest} == {"google/gemma-2-9b"} and all(float(r[2]) <= 10 for r in slowest)
    assert "the slowest medians {}, {} and {} ms (gemma-2-9b)".format(*(r[2] for r in slowest)) in page
    assert all(name in page for name in RESERVED_RUNS)
    scenario_1 = max(float(r[2]) for rows in runs for r in rows if r[0] == "distilgpt2+vocab-head")
    assert f"scenario 1 at sequence 32 at most {scenario_1:.1f} ms" in page
    earlier = (("reserved_timing-2026-12-03-160249-cpu.md", "(the slowest median {top:.1f} ms"),
               ("reserved_timing-2026-12-03-162836-cpu.md", "(gemma-2-9b's four setups, up to {top:.1f} ms)"))
    for name, which in earlier:
        medians = [float(r[2]) for r in _table(name)]
        over = sum(m > 10 for m in medians)
        assert f"{over} of {len(medians)} " + which.format(top=max(medians)) in page
    for name, quoted in (("reserved_timing_ab-2026-12-03-195334-cpu.md", "{low} to {high} of the time on the 12"),
                         ("reserved_timing_ab-2026-12-03-160415-cpu.md", "{low} to {high} of the time of f2b0903's")):
        ratios = [float(r[4]) for r in _table(name)]
        assert quoted.format(low=f"{min(ratios):.2f}", high=f"{max(ratios):.2f}") in page and name in page


# What a project file may cite: a file of the repository, a library's installed source (read where it is installed), or
# a public document through its URL. Not: the team's own documents that live outside the repository (a design note,
# a brief, the scenario seeds, a workspace path), and not a public writing named without the URL that finds it.
# (names the kit and its benchmarks write; a results file's name pattern, with DATE, ... or -cpu.md, is one too)
WRITTEN_MD = {"report.md": "the demo's report (kit/cli/report.py)", "grid.md": "gpu_check's estimate grid",
              "t.md": "results_file's doctest, in a temporary folder"}
PATTERN_MD = re.compile(r"DATE|DEVICE|\.\.\.|^-")
WORKSPACE = re.compile(r"/work/|\bseeds/|\.library\b")
WRITING = re.compile(r"\b([Dd]ev ?logs?|[Bb]log|[Dd]ata ?sheet|[Ff]ork|[Ww]hite ?paper|arXiv|[Ff]orum|mailing list)\b")
URL = re.compile(r"https?://\S+")


def _project_texts():
    """(path, text) of every file the project ships: code, tests, notebooks' sources (not their outputs), docs."""
    import json

    files = [*ROOT.joinpath("kit").rglob("*.py"), *ROOT.joinpath("kit").rglob("*.md"),
             *ROOT.joinpath("benchmarks").glob("*.py"), *ROOT.joinpath("tests").glob("*.py"),
             *ROOT.joinpath("tests").glob("*.sh"), *ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md",
             ROOT / "Makefile", ROOT / "pyproject.toml"]
    for f in files:
        if f != pathlib.Path(__file__).resolve():
            yield str(f.relative_to(ROOT)), f.read_text()
    for nb in ROOT.joinpath("notebooks").rglob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        yield str(nb.relative_to(ROOT)), "\n".join("".join(c["source"]) for c in cells)


def _outside_citations(path, text, repo_md):
    """The citations in ``text`` of documents outside the repository: an unknown ``*.md`` or a named public writing
    (a devlog, a datasheet, a fork, ...) with no URL within two lines of it (its repository's, say), or a workspace
    path."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        bare = URL.sub("", line)
        located = any(URL.search(x) for x in lines[max(0, i - 2):i + 3])
        for md in re.findall(r"[\w.-]+\.md\b", bare):
            if md not in repo_md and md not in WRITTEN_MD and not PATTERN_MD.search(md) and not located:
                yield f"{path}:{i + 1}: {md} is not in the repository"
        if WORKSPACE.search(bare):
            yield f"{path}:{i + 1}: a workspace path: {line.strip()[:80]}"
        if WRITING.search(bare) and not located:
            yield f"{path}:{i + 1}: {WRITING.search(bare).group(0)!r} named without its URL: {line.strip()[:80]}"


def test_no_project_file_cites_a_document_outside_the_repository():
    repo_md = {f.name for f in ROOT.rglob("*.md") if ".venv" not in f.parts}
    found = [c for path, text in _project_texts() for c in _outside_citations(path, text, repo_md)]
    assert found == []


@pytest.mark.parametrize("text, why", [
    ("# the rule, as DESIGN.md says", "is not in the repository"),
    ("# see /work/shared/notes.txt", "a workspace path"),
    ("# from ezyang's devlog post on fragmentation", "named without its URL"),
    ("# NVIDIA T4 datasheet (nvidia.com/en-us/data-center/tesla-t4/)", "named without its URL"),
    ("# read in a fork that tracks it, github.com/someone/pytorch", "named without its URL"),
])
def test_the_citation_check_catches_internal_documents_and_unlinked_writings(text, why):
    found = list(_outside_citations("x.py", text, {"README.md"}))
    assert len(found) == 1 and why in found[0]
    linked = "# NVIDIA T4 datasheet (https://www.nvidia.com/en-us/data-center/tesla-t4/)"
    assert list(_outside_citations("x.py", linked, {"README.md"})) == []
    located = "# copied from https://github.com/someone/notes,\n# its models/config.md, commit 52e20df"
    assert list(_outside_citations("x.py", located, {"README.md"})) == []


def test_a_benchmark_never_writes_over_an_earlier_result(tmp_path):
    from results_file import dated_path

    first = dated_path("bench", "cpu", folder=tmp_path)
    first.write_text("committed")
    second = dated_path("bench", "cpu", folder=tmp_path)
    assert second != first and not second.exists() and second.name.startswith("bench-")
    assert first.read_text() == "committed"


@pytest.mark.parametrize("setup, cost", [
    (dict(model="gpt2", batch_size=8, seq_len=1024), "+33%"),                       # every weight trained
    (dict(model="meta-llama/Llama-3.2-1B", batch_size=1, seq_len=4096, lora_r=16, precision="bf16", load_dtype="bf16",
          gradient_checkpointing=False), "+50%"),                                   # LoRA: the blocks frozen
])
def test_checkpointing_is_costed_as_the_rule_of_thumb_it_is(setup, cost):
    from kit.advise import advise

    a = advise(setup, "colab-t4")
    costs = [c for s in a.suggestions for c in s.costs if "forward-costs" in c]
    assert costs and all("rule of thumb (not measured)" in c and cost in c for c in costs)


def test_a_per_gpu_table_gives_each_module_its_share_of_the_whole_model():
    """Under FSDP on 4 GPUs each module row is the whole model's (its bytes before sharding), and its share is of the
    whole model's weights + grads + optimizer state, the one-GPU estimate's: not of one GPU's quarter of them."""
    from kit.estimate import estimate

    setup = dict(batch_size=1, seq_len=256)
    sharded = estimate("meta-llama/Llama-3.2-1B", **setup, strategy="fsdp", num_gpus=4)
    whole = estimate("meta-llama/Llama-3.2-1B", **setup)
    table = sharded.table("a100-40")
    rows = re.findall(r"^  (\S+)\s+([\d,]+) params\s+[\d.]+ GiB \((\d+)%\)$", table, re.M)
    whole_state = whole.weights_bytes + whole.gradients_bytes + whole.optimizer_bytes
    per_gpu_state = sharded.weights_bytes + sharded.gradients_bytes + sharded.optimizer_bytes
    assert per_gpu_state < whole_state / 3   # (so a share of one GPU's would read four times as much)
    assert "the whole model's before sharding" in table and len(rows) == 3   # the three biggest
    for (name, params, share), (want_name, want_params, want_bytes) in zip(rows, whole.offenders):
        assert (name, int(params.replace(",", ""))) == (want_name, want_params)
        assert int(share) == round(100 * want_bytes / whole_state), (name, share, want_bytes, whole_state)
    assert int(rows[0][2]) == 21   # the embedding: 4,202,692,608 of 19,773,030,656 bytes


def test_the_demo_sets_fold_two_beside_the_estimates_of_the_same_moments():
    from kit.cli.demo_folds import second_fold_text

    folds = [{"start_bytes": 100, "load_peak_bytes": 150, "loaded_bytes": 140, "models_alive_after_load": 1},
             {"start_bytes": 140, "load_peak_bytes": 260, "loaded_bytes": 240, "models_alive_after_load": 2}]
    text = second_fold_text(folds, {"from_pretrained_bytes": 140})   # both moments: right after from_pretrained
    assert "fold 2 loaded: MEASURED 140 B, ESTIMATED 140 B (1.0000x)" in text
    assert "its load peak: MEASURED 160 B, ESTIMATED 140 B (1.1429x)" in text

# ---- a quoted results file's estimates are today's (issue 50, item 24) ---------------------------------------------
# A results file is a dated record, never edited: the docs quote the newest run of its benchmark, and each figure of
# it that is an estimate (made without a run) must still be what the estimator gives for that row's setup.
def quoted_results_files(page: str, benchmark: str) -> list:
    """The results files of ``benchmark`` (``estimate_vs_measured``, ``families``) that ``page`` links, oldest first."""
    return sorted(set(re.findall(rf"benchmarks/results/({benchmark}-[\w-]+-cpu\.md)", (ROOT / page).read_text())))


def _grid_estimate(name, kw, overrides, device=None):
    import estimate_vs_measured as bench

    from kit.estimate import estimate
    from kit.units import fmt_bytes

    where = {"device": device} if device else {}
    return fmt_bytes(estimate(bench._config(name, overrides) if overrides else name, **kw, **where).peak_bytes)


def stale_estimates(file: str) -> list:
    """The rows of an ``estimate_vs_measured.py`` results file whose predicted peak is not today's estimate."""
    import estimate_vs_measured as bench

    cpu = {(label, name): (kw, over[0] if over else None) for label, name, kw, *over in bench.CPU_GRID}
    gpu = {(label, name): kw for label, name, kw in bench.GPU_GRID}
    stale, seen = [], 0
    for row in _table(file):
        if len(row) == 8:      # measured on the CPU: the model cell names the config's overrides after the name
            key = next(k for k in cpu if k[0] == row[0] and row[1].split(" (")[0] == k[1])
            today = _grid_estimate(key[1], *cpu[key], device="cpu")
        else:                  # the GPU grid, predicted only
            today = _grid_estimate(row[1], gpu[(row[0], row[1])], None)
        seen += 1
        if today != row[2]:
            stale.append(f"{row[0]} ({row[1]}): {row[2]} in the file, {today} today")
    assert seen == len(cpu) + len(gpu), (file, seen)
    return stale


def stale_family_estimates(files: list) -> list:
    """The rows of ``--families`` results files whose estimated peak is not today's estimate: each row as its newest
    run gives it (``files`` oldest first; a later run of some rows, ``--only``, replaces those rows). Setups added to
    the grid since a file was made are not in it; a row of a setup no longer in the grid is an error."""
    import estimate_vs_measured as bench

    setups = {(twin, label): (kw, over[0] if over else None) for twin in bench.FAMILY_TWINS
              for label, kw, *over in bench.FAMILY_SETUPS + (bench.QWEN3_SETUPS if twin == "tiny-qwen3" else [])}
    newest = {(r[1], r[2]): r[3] for file in files for r in _table(file) if len(r) == 8 and r[1].startswith("tiny-")}
    assert newest and set(newest) <= set(setups), (files, set(newest) - set(setups))
    return [f"{twin} {label}: {peak} in the file, {today} today" for (twin, label), peak in newest.items()
            if (today := _grid_estimate(twin, *setups[(twin, label)], device="cpu")) != peak]


def test_the_results_files_the_docs_quote_hold_todays_estimates():
    files = quoted_results_files("README.md", "estimate_vs_measured")
    assert len(files) == 1 and quoted_results_files("docs/accuracy.md", "estimate_vs_measured") == files
    assert stale_estimates(files[0]) == []
    assert stale_family_estimates(quoted_results_files("docs/accuracy.md", "families")) == []


def test_the_staleness_check_finds_the_lora_rows_of_the_first_of_december():
    """2026-12-01-cpu.md predicted 22.46 MiB for LoRA r8 q,v on tiny-llama; the estimator says 22.34 MiB since. The
    family grid of that day is stale in its LoRA rows alone."""
    assert stale_estimates("2026-12-01-cpu.md")[0].startswith("LoRA r8 q,v (tiny-llama): 22.46 MiB in the file, ")
    stale = stale_family_estimates(["families-2026-12-01-cpu.md"])
    assert stale and all(" LoRA r8 " in row for row in stale), stale


def test_the_multi_gpu_page_quotes_todays_estimates_of_its_example():
    """Llama-3.1-8B in bf16 with checkpointing (the page's example; its FSDP-on-4 output is checked by
    tests/test_quoted_outputs.py): one GPU, DDP on 4 and FSDP over 8, as the estimator gives them today."""
    from kit.estimate import estimate
    from kit.units import fmt_bytes

    setup = dict(batch_size=1, seq_len=2048, load_dtype="bf16", precision="bf16", gradient_checkpointing=True)
    one, ddp, fsdp = (fmt_bytes(estimate("meta-llama/Llama-3.1-8B", **setup, **launch).peak_bytes)
                      for launch in ({}, dict(strategy="ddp", num_gpus=4), dict(strategy="fsdp", num_gpus=8)))
    page = " ".join((ROOT / "docs/multi-gpu.md").read_text().split())
    assert f"One GPU would need {one}; DDP on 4 needs {ddp} on each" in page and f"FSDP over 8, {fsdp}." in page


def test_the_committed_demo_report_is_what_the_demo_makes_today():
    """benchmarks/results/demo-smoke, cited as what `make demo` makes (issue 50, item 21): its cap, its estimates and
    its verdicts are today's, and every change either measured or shown run out of memory under the cap."""
    import json

    from kit.cli.demo import scenario1_cap
    from kit.scenarios.custom_head import scenario as s1

    folder = ROOT / "benchmarks/results/demo-smoke"
    s = json.loads((folder / "summary.json").read_text())
    assert s["size"] == "smoke" and s["device"] == "cpu" and s["errors"] == []
    cap = scenario1_cap("smoke", s1.predict_original("smoke"), s1.predict_original("real"))
    assert s["scenario1"]["cap"]["cap_bytes"] == cap["cap_bytes"] and s["scenario1"]["cap"]["text"] == cap["text"]
    original = s["scenario1"]["original"]
    as_run = s1.estimate_user(s1.NAMES["smoke"], precision=original["precision"], device="cpu",
                              grad_accum=original["grad_accum"])
    assert original["estimate_peak_bytes"] == pytest.approx(as_run.peak_bytes, rel=0.001)
    assert original["oom"] is (original["estimate_peak_bytes"] > cap["cap_bytes"])
    for which, fix in zip(s1.FIXES, s["scenario1"]["fixes"], strict=True):
        today = s1.estimate_fix(which, "smoke", as_run=True, grad_accum=fix["grad_accum"]).peak_bytes
        assert fix["estimate_peak_bytes"] == today, (which, fix)
        assert fix["oom"] is (today > cap["cap_bytes"]) and (fix["measured_peak_bytes"] is None) is fix["oom"]
    md = (folder / "report.md").read_text()
    assert "the VxV head kept, which still does not fit a T4" in md
    assert all((folder / line[line.index("(") + 1:-1]).is_file() for line in md.splitlines() if line.startswith("!["))
