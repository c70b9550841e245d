"""The reserved estimate's layout against a real step's own allocation sequence, through the same allocator model.

``kit.estimate.reserved`` lays a training step out as tensors (weights, each block's saved tensors, the logits,
the grads, the optimizer state) and runs them through ``kit.estimate.allocator``, PyTorch's CUDA caching
allocator replayed. Whether that layout is a fair stand-in for a real step cannot be read from the estimate
itself. This benchmark takes real Trainer steps on the CPU (architecture twins, random weights), records the
order and size of every storage they allocate and free (``kit.measure.tensor_peak.TensorPeak``: a
``TorchDispatchMode`` that sees each op's outputs, and a ``weakref.finalize`` on each storage), and runs that
sequence through the same allocator model, with and without expandable segments. Beside it: the kit's layout of
the same setup. The CPU's kernels are not CUDA's (other temporaries, other orders), so the two sequences differ
in detail; what it checks is that the layout's gap is of the real sequence's size.

Run: ``python benchmarks/reserved_layout.py [--out FILE]`` (about two minutes here). Nothing here measures a
GPU: tests/test_gpu_reserved.py holds the figures a GPU must confirm.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from results_file import OUT_HELP, write_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.estimate import estimate  # noqa: E402
from kit.estimate import reserved as kr  # noqa: E402
from kit.estimate.allocator import simulate  # noqa: E402
from kit.measure.tensor_peak import TensorPeak  # noqa: E402

MiB = 2**20
SETUPS = [   # (label, model, batch, seq, Trainer keywords, estimate keywords)
    ("SmolLM2-135M full FT", "HuggingFaceTB/SmolLM2-135M", 4, 256, {}, {}),
    ("SmolLM2-135M full FT, checkpointing", "HuggingFaceTB/SmolLM2-135M", 4, 256,
     {"gradient_checkpointing": True}, {"gradient_checkpointing": True}),
    ("SmolLM2-135M LoRA r16", "HuggingFaceTB/SmolLM2-135M", 8, 256, {}, {"lora_r": 16}),
    ("Qwen2.5-0.5B full FT", "Qwen/Qwen2.5-0.5B", 2, 128, {}, {}),
]


class Recorder(TensorPeak):
    """TensorPeak that also keeps the sequence: ``("alloc", key, bytes)`` / ``("free", key)``, tensors alive at
    entry first (the weights)."""

    def __init__(self):
        super().__init__()
        self.events, self._n = [], 0
        self._keys = {}

    def _add(self, storage) -> None:
        sid, n = id(storage), storage.nbytes()
        old = self._sizes.get(sid)
        super()._add(storage)
        if old is None or n != old:
            if old is not None:
                self.events.append(("free", self._keys[sid]))
            self._n += 1
            self._keys[sid] = self._n
            if n:
                self.events.append(("alloc", self._n, n))

    def _free(self, key: int) -> None:
        if key in self._keys:
            self.events.append(("free", self._keys.pop(key)))
        super()._free(key)


def real_sequence(model_name, B, S, trainer_kw, lora_r):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from kit import models

    model = models.build_model(model_name)
    if lora_r:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_r, task_type="CAUSAL_LM"))
    V = model.config.vocab_size
    ids = [[1 + (i * 7 + j) % (V - 1) for j in range(S)] for i in range(3 * B)]
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * S] * len(ids), "labels": ids})
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=B, max_steps=3,
                             report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             use_cpu=True, **trainer_kw)
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    with Recorder() as rec:
        trainer.train()
    # the frees that run when the Trainer and its model go come after the recorder stops: keep what ran
    return rec.events


def row(label, model, B, S, trainer_kw, est_kw):
    events = real_sequence(model, B, S, trainer_kw, est_kw.get("lora_r", 0))
    e = estimate(model, batch_size=B, seq_len=S, device="cpu", **est_kw)
    c = e.context
    out = [label]
    for x in (False, True):
        real = simulate(events, expandable=x)
        laid = kr.reserved(c.tensors, c.rp, e.peak_bytes, inputs=c.inputs, step_temp=c.step_temp, expandable=x)
        real_gap = real.peak_reserved_bytes - real.peak_allocated_bytes
        out += [f"{real.peak_allocated_bytes / MiB:,.0f}", f"{real_gap / MiB:,.1f}", f"{laid.gap_bytes / MiB:,.1f}",
                f"{100 * real_gap / real.peak_allocated_bytes:.1f}% / {100 * laid.gap_bytes / e.peak_bytes:.1f}%"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help=OUT_HELP)
    a = p.parse_args()
    head = ["setup (CPU, 3 Trainer steps)", "real peak MiB", "real gap MiB", "layout gap MiB", "gap/peak real / layout",
            "real peak MiB (exp.)", "real gap MiB (exp.)", "layout gap MiB (exp.)", "gap/peak (exp.)"]
    rows = [row(*s) for s in SETUPS]
    text = ("# The reserved estimate's layout against real steps' allocation sequences (the same allocator model)\n\n"
            "The default caching allocator, then expandable segments (exp.). 'real': the sequence of storages a real "
            "CPU Trainer run allocated and freed, through kit.estimate.allocator; 'layout': kit.estimate.reserved's "
            "laid-out step of the same setup. Computed, not measured on a GPU.\n\n"
            "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
            + "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n")
    print(text)
    path = write_table(text, a.out, "reserved_layout", "cpu")
    if path:
        print(f"written to {path}")


if __name__ == "__main__":
    main()
