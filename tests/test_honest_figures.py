"""Every figure the README and docs/ quote comes from a file in the repository, benchmarks never write over their
results, and what the kit prints names sources that are there (issue 25: items 3, 4, 6, 11, 12, 13)."""
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _latency(name):
    """(warm advise() medians, cheap-path medians) of an advisor_latency results file."""
    results = (ROOT / "benchmarks/results" / name).read_text()
    rows = [line.split("|") for line in results.splitlines() if line.startswith("| ") and "ms" not in line[:12]]
    warm = [float(re.match(r"\s*([\d.]+)", r[7]).group(1)) for r in rows if re.match(r"\s*[\d.]+ \(", r[7])]
    cheap = [float(r[k]) for r in rows if re.match(r"\s*[\d.]+ \(", r[7]) for k in (8, 9)]
    assert len(warm) == 6
    return warm, cheap


def test_the_docs_quote_the_advisor_latency_its_results_files_hold():
    readme = " ".join((ROOT / "docs/cli-and-api.md").read_text().split())     # moved there from the README
    warm, cheap = _latency("advisor_latency-2026-12-01-175436-cpu.md")   # with the allocator's model
    assert (f"cheap path ({min(cheap):.0f} to {max(cheap):.0f} ms warm; a full `advise()` takes {min(warm):.0f} ms "
            f"to {max(warm) / 1000:.1f} s warm") in readme
    before, _ = _latency("advisor_latency-2026-12-01-cpu.md")            # the same search before it
    assert f"the same search took {min(before):g} to {max(before):g} ms" in readme


def test_no_project_file_cites_a_document_outside_the_repository():
    files = [*ROOT.joinpath("kit").rglob("*.py"), *ROOT.joinpath("benchmarks").glob("*.py"),
             *ROOT.joinpath("notebooks").glob("*.ipynb"), ROOT / "README.md", *ROOT.joinpath("docs").glob("*.md")]
    cited = [str(f.relative_to(ROOT)) for f in files if "DESIGN.md" in f.read_text()]
    assert cited == []


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
    from kit.estimate import estimate

    table = estimate("meta-llama/Llama-3.2-1B", batch_size=1, seq_len=256, strategy="fsdp", num_gpus=4).table("a100-40")
    shares = [int(m) for m in re.findall(r"\((\d+)%\)", table)]
    assert shares and max(shares) <= 100 and "the whole model's before sharding" in table


def test_the_demo_sets_fold_two_beside_the_estimates_of_the_same_moments():
    from kit.cli.demo import _second_fold

    folds = [{"start_bytes": 100, "load_peak_bytes": 150, "loaded_bytes": 140, "models_alive_after_load": 1},
             {"start_bytes": 140, "load_peak_bytes": 260, "loaded_bytes": 240, "models_alive_after_load": 2}]
    text = _second_fold(folds, {"loaded_bytes": 140, "load_peak_bytes": 160})
    assert "fold 2 loaded: MEASURED 140 B, ESTIMATED 140 B (1.0000x)" in text
    assert "its load peak: MEASURED 160 B, ESTIMATED 160 B (1.0000x)" in text
