"""One verdict for one setup on one device, whichever face asks: kit.check of an Estimate, the CLI, the user's
objects and the advisor judge a CPU on CPU kernels, with Trainer's fp16 rule (kit.dtypes.trainer_precision)."""
import contextlib
import io
import json

from transformers import TrainingArguments

import kit
from kit import inputs
from kit.advise import advise
from kit.dtypes import trainer_precision
from kit.estimate import estimate, estimate_from

SETUP = dict(batch_size=8, seq_len=1024)


def _first_line(fn, *args, **kw) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kw)
    return out.getvalue().splitlines()[0]


def _cli(run_kit, *more) -> dict:
    code, out, _ = run_kit("estimate", "--model", "gpt2", "--batch-size", "8", "--seq-len", "1024", "--preset", "cpu",
                           "--json", *more)
    assert code == 0
    return json.loads(out)


def test_gpt2_8x1024_on_the_cpu_gets_one_verdict_from_every_face(run_kit):
    cli = _cli(run_kit)
    line = _first_line(kit.check, estimate("gpt2", **SETUP), device="cpu")   # an Estimate made for CUDA's kernels
    same = _first_line(kit.check, estimate("gpt2", **SETUP, device="cpu"), device="cpu")
    objects = estimate_from("gpt2", TrainingArguments(per_device_train_batch_size=8), seq_len=1024, device="cpu")
    assert line == same and line.startswith("DOES NOT FIT") == (not cli["verdict"]["fits"])
    assert f"{cli['peak_bytes'] / 2**30:.2f} GiB" in line
    assert objects.peak_bytes == cli["peak_bytes"]
    assert advise(estimate("gpt2", **SETUP), "cpu").peak_bytes == cli["peak_bytes"]


def test_fp16_on_a_cpu_is_the_fp32_run_in_every_face(run_kit):
    fp32, fp16 = _cli(run_kit), _cli(run_kit, "--precision", "fp16")
    assert fp16["peak_bytes"] == fp32["peak_bytes"]
    assert any("Trainer ignores it on a CPU" in n for n in fp16["notes"])
    objects = estimate_from("gpt2", TrainingArguments(per_device_train_batch_size=8, fp16=True, use_cpu=True),
                            seq_len=1024, device="cpu")
    assert objects.peak_bytes == fp16["peak_bytes"] and inputs.has_note(objects.notes, "cpu-ignores-fp16")
    line = _first_line(kit.check, estimate("gpt2", **SETUP, precision="fp16", device="cpu"), device="cpu")
    assert f"{fp16['peak_bytes'] / 2**30:.2f} GiB" in line
    assert advise(dict(model="gpt2", **SETUP, precision="fp16"), "cpu").peak_bytes == fp16["peak_bytes"]
    assert trainer_precision("fp16", "cuda") == ("fp16", None)
