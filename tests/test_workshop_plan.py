"""The workshop's plan counts the day (issue 33, item 7): each notebook's runtime start, its install cell (the wheels'
sizes as PyPI serves them) and its downloads (sizes from the shipped configs), every assumption named; README and
the teacher's guide quote the minutes the plans compute."""
from pathlib import Path

import pytest

from kit.scenarios import plan
from kit.scenarios.cross_validation import workshop as w2
from kit.scenarios.custom_head import workshop as w1

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def minutes():
    return {"01": w1.workshop_minutes(), "02": w2.workshop_minutes()}


def test_the_setup_counts_the_runtime_start_the_install_and_the_downloads():
    work = plan.setup_work({"a checkpoint": 300_000_000})
    items = [i for items in work.values() for i in items]
    assert ("wait", plan.RUNTIME_START_S) in items and ("wait", plan.INSTALL_OVERHEAD_S) in items
    assert ("download", sum(plan.INSTALL_WHEELS.values())) in items and ("download", 300_000_000) in items
    assert ("download", plan.SMALL_FILES_BYTES) in items
    seconds = plan.RUNTIME_START_S + plan.INSTALL_OVERHEAD_S + \
        (sum(plan.INSTALL_WHEELS.values()) + 300_000_000 + plan.SMALL_FILES_BYTES) / plan.LOAD_BYTES_PER_S
    assert plan.compute_minutes(items) == pytest.approx(seconds / 60)
    labels = " ".join(work)
    assert labels.count("(assumed)") == 3 and "PyPI's sizes" in labels   # every figure says where it came from


def test_the_wheels_counted_are_the_versions_the_kit_requires():
    from packaging.requirements import Requirement

    required = {Requirement(line).name: Requirement(line).specifier for line in
                (ROOT / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")}
    for wheel in plan.INSTALL_WHEELS:
        name, version = wheel.split("-")[:2]
        assert version in required[name], wheel


def test_notebook_01s_plan_starts_with_its_setup_and_downloads_distilgpt2s_checkpoint():
    from kit.estimate import estimate

    setup = w1.setup_work()
    checkpoint = estimate("distilgpt2", batch_size=1, seq_len=1, load_dtype="fp32")
    assert checkpoint.params == 81_912_576                       # the shipped config's, pinned elsewhere too
    assert [("download", checkpoint.params * 4)] in setup.values()
    _, sections = w1.planned_sections()
    assert sections[0][0] == w1.SETUP and sections[0][1] == 0 and sections[0][2][0] == ("wait", plan.RUNTIME_START_S)


def test_notebook_02s_plan_counts_its_setup_among_the_core_sections(minutes):
    core, skipped = w2.planned_sections()
    assert core[0][0] == w2.SETUP and ("wait", plan.RUNTIME_START_S) in core[0][2]
    assert all(name != w2.SETUP for name, _, _ in skipped)
    assert f"{minutes['02']:.1f} min of the {w2.SLOT_MINUTES}-minute slot" in w2.workshop_plan()


def test_the_plans_fit_their_slots_and_the_slots_fit_the_90_minute_workshop(minutes):
    assert minutes["01"] <= w1.WORKSHOP_MINUTES and minutes["02"] <= w2.SLOT_MINUTES
    assert w1.WORKSHOP_MINUTES + w2.SLOT_MINUTES <= 90


def test_readme_and_the_teachers_guide_quote_the_plans_minutes(minutes):
    readme = " ".join((ROOT / "README.md").read_text().split())
    guide = " ".join((ROOT / "docs/teachers-guide.md").read_text().split())
    one, two = round(minutes["01"]), round(minutes["02"])
    assert f"notebook 01 at about {one} minutes and notebook 02 at about {two}" in readme
    assert (f"notebook 01 takes about {one} minutes of its {w1.WORKSHOP_MINUTES}, notebook 02 about {two} of its "
            f"{w2.SLOT_MINUTES}") in guide
    wheels = sum(plan.INSTALL_WHEELS.values()) / 1e6
    assert f"{wheels:.1f} MB" in guide
    assert f"{plan.RUNTIME_START_S} s" in guide and f"{plan.INSTALL_OVERHEAD_S} s" in guide


@pytest.mark.parametrize("notebook, slot", [("01_distilgpt2_custom_head.ipynb", w1.WORKSHOP_MINUTES),
                                            ("02_llama3_qlora_cross_validation.ipynb", w2.SLOT_MINUTES)])
def test_the_instructor_notes_state_the_slot_the_plan_uses_and_what_it_counts(notebook, slot):
    import json

    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    notes = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
                     and "".join(c["source"]).startswith(("## Instructor notes", "**Instructor notes")))
    assert f"{slot} minutes" in notes, f"{notebook}: the notes do not state the plan's {slot} minutes"
    assert "does not count" not in notes, f"{notebook}: the notes say the plan leaves something out"
