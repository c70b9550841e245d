"""The answer first (issue 33, items 1 and 2): kit.check, the advisor, ``python -m kit estimate|fit`` open with the
verdict and the one figure it judged, by name, and the limit; then the biggest cause and the best change. The rest is
one step away (``details=True``, ``--details``), and nothing that was there is lost."""
import contextlib
import io
import json
import tempfile
import warnings

import pytest
from transformers import TrainingArguments

import kit
from kit.advise import advise, costs
from kit.advise.answer import in_short
from kit.cli.parser import main
from kit.estimate import estimate, estimate_from, estimate_trainer
from kit.estimate.reserved import HOW_TO
from kit.presets import PRESETS, verdict
from kit.units import fmt_bytes

warnings.filterwarnings("ignore")
T4 = PRESETS["colab-t4"]
LLAMA_8B = "meta-llama/Meta-Llama-3-8B"


def _printed(fn, *args, **kw) -> list:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kw)
    return out.getvalue().rstrip("\n").splitlines()


@pytest.fixture(scope="module")
def full_8b():
    """An 8B full fine-tune, as a user writes it, judged against a T4."""
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, report_to="none")
    return estimate_from(LLAMA_8B, training_args=args, seq_len=512)


def test_check_of_an_8b_full_fine_tune_on_a_t4_is_the_answer_in_15_lines(full_8b):
    short = _printed(kit.check, full_8b, device="colab-t4")
    full = _printed(kit.check, full_8b, device="colab-t4", details=True)
    a = advise(full_8b, "colab-t4")
    # the verdict names the one figure judged (reserved, modelled) and the limit; the margin is that figure's
    # of what is usable once the 5% margin is kept while the figures are modelled (kit.presets.MODELLED_MARGIN)
    # judged on a T4, the figure is the T4's: bf16 attention takes SDPA's math path below sm80 (kit.estimate.replay.
    # kernels), more than the estimate made for no GPU in particular, and the first line says which kernel
    usable = int(T4.gpu_bytes * 0.95)
    first = " ".join(" ".join(short[:2]).split())
    assert first.startswith(
        f"DOES NOT FIT Colab T4: {fmt_bytes(a.judged_bytes)} reserved (modelled) of {fmt_bytes(usable)} usable "
        f"(14.56 GiB less the 5% margin) ({fmt_bytes(a.judged_bytes - usable)} short)")
    assert a.judged_bytes > full_8b.reserved_bytes and "SDPA math path on sm75" in first
    text = "\n".join(short)
    assert len(short) <= 15
    answer = " ".join(" ".join(short[:5]).split())
    assert f"(peak {fmt_bytes(a.peak_bytes)}: live tensors at their most, max allocated" in answer
    assert "biggest cause: optimizer state" in answer
    best = a.suggestions[0]
    assert "best change: TrainingArguments(activation_checkpointing=True) +3 more" in answer
    assert f"-> {fmt_bytes(best.reserved_bytes)} reserved (+{fmt_bytes(best.margin_bytes)})" in answer
    assert "details=True" in short[-1] and "PEAK" not in text
    # the details keep everything: the table, the sources, every change with its costs and code
    details = "\n".join(full)
    assert full[:4] == short[:4] and len(full) > 3 * len(short)
    for said in ("PEAK (predicted max allocated", "RESERVED (predicted max reserved)", "where each setting was read "
                 "from:", "what makes it fit, cheapest first:", "in your objects: training_args = dataclasses.replace"):
        assert said in details, said
    assert all(s.cli.split(" --")[0] in " ".join(details.split()) for s in a.suggestions[:3])


def test_check_of_an_sft_trainer_on_a_tiny_twin(tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from kit import data, models

    ids = [[5 + (i * 7 + j) % 4000 for j in range(40 if i % 2 else 24)] for i in range(16)]
    args = trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=1,
                         per_device_train_batch_size=4, packing=True, max_length=64)
    tr = trl.SFTTrainer(model=models.build_model("tiny-llama"), args=args, processing_class=data.shipped_tokenizer(),
                        train_dataset=Dataset.from_dict({"input_ids": ids}))
    est = estimate_trainer(tr)
    fits = _printed(kit.check, tr, device="colab-t4")
    assert fits[0] == verdict(est, "colab-t4").text and "reserved (modelled) of 14.56 GiB" in fits[0]
    assert len(fits) <= 15 and "no change needed" in fits
    tight = int(est.reserved_bytes * 0.6)
    short = _printed(kit.check, tr, device=tight)
    a = advise(tr, tight, trainer_estimate=est)
    assert len(short) <= 15 and short[0].startswith(f"DOES NOT FIT a GPU with {fmt_bytes(tight)}: ")
    best = " ".join(" ".join(short[:6]).split())
    assert a.objects and f"best change: {in_short(a.objects[0], a.classes)} -> " in best and a.suggestions[0].fits
    full = " ".join(_printed(kit.check, tr, device=tight, details=True))
    assert "where each setting was read from:" in full and "SFTConfig.packing" in full


def test_kit_fit_prints_at_most_20_lines_and_the_details_keep_the_costs():
    argv = ["fit", "--model", LLAMA_8B, "--batch-size", "4", "--seq-len", "512", "--device", "colab-t4"]
    short = _printed(main, argv)
    full = " ".join(" ".join(_printed(main, argv + ["--details"])).split())
    js = json.loads("\n".join(_printed(main, argv + ["--json"])))
    assert len(short) <= 20 and short[0].startswith("DOES NOT FIT Colab T4: ")
    assert f"{fmt_bytes(js['reserved_bytes'])} reserved (modelled) of 13.83 GiB usable" in short[0]
    assert js["margin_bytes"] == js["usable_bytes"] - js["reserved_bytes"]   # the figure shown is the figure judged
    assert any(ln.startswith("best change: --quantization 4bit") for ln in short)
    assert short[-1].startswith("details: --details") and "cost:" not in "\n".join(short)
    assert "cost: changes the model: base weights in NF4 4-bit" in full
    assert all(s["cli"] in full for s in js["suggestions"])
    assert {"fits", "peak_bytes", "limit_bytes", "margin_bytes", "max_batch_size", "max_seq_len",
            "suggestions"} <= set(js)


def test_kit_estimate_opens_with_the_answer_and_details_give_the_table():
    argv = ["estimate", "--model", "distilgpt2", "--batch-size", "2", "--seq-len", "128"]
    est = estimate("distilgpt2", batch_size=2, seq_len=128)
    short, full = _printed(main, argv), _printed(main, argv + ["--details"])
    assert short[0] == verdict(est, "colab-t4").text and short[3] == "no change needed"
    assert len(short) <= 10 and "PEAK" not in "\n".join(short) and short[-1].startswith("details: --details")
    assert full[:4] == short[:4] and any("PEAK (predicted max allocated" in ln for ln in full)
    said = json.loads("\n".join(_printed(main, argv + ["--json"])))["verdict"]   # new fields: the figure judged
    assert (said["judged"], said["judged_bytes"], said["limit_bytes"]) == ("reserved (modelled)", est.reserved_bytes,
                                                                           T4.gpu_bytes)
    assert said["gpu_margin_bytes"] == T4.gpu_bytes - est.reserved_bytes


def test_one_number_per_verdict_the_reserved_figure_by_name():
    """The demo's "37.61 GiB over" (the peak) beside "38.04 GiB short" (reserved): the verdict, the chart's text and
    the demo's glance now judge and show the same figure, by name."""
    from kit import plot
    from kit.cli.demo import real_size_figure
    from kit.scenarios.custom_head import scenario as s1

    real = s1.predict_original("real")
    est, short = real.estimate, real.estimate.reserved_bytes - T4.gpu_bytes
    v = verdict(est, "colab-t4")
    assert (v.judged_bytes, v.judged_name, v.limit_bytes) == (est.reserved_bytes, "reserved (modelled)", T4.gpu_bytes)
    assert f"{fmt_bytes(est.reserved_bytes)} reserved (modelled) of 14.56 GiB ({fmt_bytes(short)} short)" in v.text
    chart = " ".join(real_size_figure(real).axes[0].texts[-1].get_text().split())
    assert f"reserved (modelled) {fmt_bytes(est.reserved_bytes)} is {fmt_bytes(short)} over" in chart
    assert plot.limit_text(est.reserved_bytes, T4.gpu_bytes, "Colab T4", "reserved (modelled)").endswith(
        f"is {fmt_bytes(short)} over ({est.reserved_bytes / T4.gpu_bytes:.1f}x the limit)")


def test_the_advisor_never_calls_an_installed_package_missing(monkeypatch):
    setup = dict(model="tiny-llama", batch_size=8, seq_len=128)
    limit = int(estimate(**setup).peak_bytes * 0.3)
    for here in (True, False):
        monkeypatch.setattr(costs, "installed", lambda package, here=here: here)
        said = " ".join(c for s in advise(setup, limit).suggestions for c in s.costs)
        assert "bitsandbytes" in " ".join(s.cli for s in advise(setup, limit).suggestions) or "4-bit" in said
        assert ("pip install bitsandbytes" in said) is (not here) and "Colab lacks" not in said


def test_the_expandable_segments_how_to_is_said_once_per_change():
    est = estimate_from("tiny-llama", {"per_device_train_batch_size": 8, "report_to": "none"}, seq_len=128)
    usable = est.peak_bytes + 0.95 * (est.reserved_bytes - est.peak_bytes)   # the allocator's gap, with the 5% margin
    a = advise(est, int(usable / 0.95))
    rows = [s for s in a.suggestions if "expandable-segments" in s.changes]
    assert rows, [s.cli for s in a.suggestions]
    assert a.answer()[-1].startswith("best change: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (before CUDA")
    text = "".join(a.text(details=True).split())
    assert text.count("".join(HOW_TO.split())) == len(rows)
