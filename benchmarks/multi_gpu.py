"""Per-rank memory of real multi-process training against the per-GPU estimate (DDP, FSDP2).

Run: ``python benchmarks/multi_gpu.py [--out benchmarks/results/multi_gpu-DATE-cpu.md] [--nproc 2]``.

Each row launches ``torchrun --nproc_per_node N`` (gloo on the CPU) on a tiny twin and trains three steps.
``ddp-trainer`` goes **through Trainer** (``use_cpu=True``: accelerate's MULTI_CPU, which wraps the model in
DistributedDataParallel). The others go **through torch directly** (``DistributedDataParallel``, or FSDP2
``fully_shard`` on each decoder block and then on the model, as accelerate's ``TRANSFORMER_BASED_WRAP`` does),
with the step Trainer takes (forward with labels, backward, fused AdamW, ``zero_grad(set_to_none=True)``):
on a CPU, Trainer given ``fsdp=...`` still runs MULTI_CPU's DDP (checked with transformers 5.24 and
accelerate 1.15: its FSDP path is for accelerators), so FSDP cannot go through it here. Each rank measures its own
peak with :class:`kit.measure.tensor_peak.TensorPeak`, entered before the model is built (so DDP's buckets,
made in C++, are seen), and the steady-state step (the third) is compared with ``estimate(...,
strategy=..., num_gpus=N, device="cpu")``.

With ``--worker`` this file is the per-rank program (torchrun runs it); each rank writes its JSON to a file.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import subprocess
import sys

from results_file import OUT_HELP, write_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# (model, strategy, estimate kwargs[, config overrides]): the same setup is built, wrapped and trained on every rank
SMALL_VOCAB = {"vocab_size": 256, "num_hidden_layers": 4, "n_layer": 4}  # a block's backward sets the peak
GRID = [
    ("tiny-llama", "ddp-trainer", dict(batch_size=2, seq_len=32)),
    ("tiny-llama", "ddp", dict(batch_size=2, seq_len=32)),
    ("tiny-llama", "fsdp", dict(batch_size=2, seq_len=32)),
    ("tiny-llama", "fsdp-grad-op", dict(batch_size=2, seq_len=32)),
    ("tiny-llama", "ddp", dict(batch_size=8, seq_len=128)),
    ("tiny-llama", "fsdp", dict(batch_size=8, seq_len=128)),
    ("tiny-llama", "fsdp-grad-op", dict(batch_size=8, seq_len=128)),
    ("tiny-llama", "fsdp", dict(batch_size=4, seq_len=128, gradient_checkpointing=True)),
    ("tiny-llama", "fsdp", dict(batch_size=4, seq_len=64, lora_r=8, lora_targets=["q_proj", "v_proj"])),
    ("tiny-llama", "fsdp", dict(batch_size=2, seq_len=256, attn_implementation="eager", padded=False), SMALL_VOCAB),
    ("tiny-llama", "fsdp-grad-op", dict(batch_size=2, seq_len=256, attn_implementation="eager", padded=False),
     SMALL_VOCAB),
    ("tiny-gpt2", "ddp", dict(batch_size=4, seq_len=64)),
    ("tiny-gpt2", "fsdp", dict(batch_size=4, seq_len=64)),
]


def blocks_of(model):
    """The decoder blocks: the model's ModuleList of layers (``layers`` or ``h``), under peft too."""
    import torch

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h"):
            return list(mod)
    raise ValueError("no decoder blocks found")


def wrap(model, strategy: str):
    """Wrap ``model`` as accelerate would for ``strategy``: DDP, or fully_shard per block and then the root."""
    if strategy == "single":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    reshard = strategy == "fsdp"
    for block in blocks_of(model):
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def trainer_worker(spec: dict) -> dict:
    """One rank of ``ddp-trainer``: Trainer under torchrun with ``use_cpu=True`` (accelerate's MULTI_CPU: it wraps
    the model in DistributedDataParallel itself). TensorPeak is entered before ``train()`` wraps the model."""
    from estimate_vs_measured import _Batches, _ckpt_kw, _config, build
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from kit.measure.tensor_peak import TensorPeak

    kw, name, overrides = spec["kw"], spec["model"], spec.get("overrides")
    B, S, V = kw["batch_size"], kw["seq_len"], _config(name, overrides).vocab_size
    steps, tp = [], TensorPeak()

    class Meter(TrainerCallback):
        def on_step_begin(self, *a, **k):
            tp.peak_bytes = self.start = tp.current_bytes

        def on_step_end(self, *a, **k):
            steps.append({"start": self.start, "peak": tp.peak_bytes, "end": tp.current_bytes})

    args = TrainingArguments(output_dir=os.path.join(spec["out"], "trainer"), per_device_train_batch_size=B,
                             max_steps=3, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             optim="adamw_torch_fused", learning_rate=1e-4, dataloader_num_workers=0,
                             disable_tqdm=True, **_ckpt_kw(bool(kw.get("gradient_checkpointing"))))
    import torch

    torch.manual_seed(0)
    trainer = Trainer(model=build(name, kw, overrides=overrides), args=args, callbacks=[Meter()],
                      train_dataset=_Batches(3 * B * 2, S, V, padded=kw.get("padded", True)))
    with tp:
        trainer.train()
    wrapped = type(trainer.model_wrapped).__name__
    if wrapped != "DistributedDataParallel":
        raise RuntimeError(f"Trainer did not wrap the model in DDP (it made a {wrapped})")
    result = {"rank": int(os.environ["RANK"]), "steps": steps}
    _publish_rank(spec, result)
    if torch.distributed.is_initialized():  # accelerate made the group: without this, gloo's threads can
        torch.distributed.barrier()            # abort the exit ("terminate called without an active exception");
        torch.distributed.destroy_process_group()  # both ranks reach it together, so neither waits on a gone peer
    return result


def _publish_rank(spec: dict, result: dict) -> None:
    """Write a rank's readings before the process group is torn down: the measurement is then complete
    whatever gloo's threads do at the exit."""
    with open(os.path.join(spec["out"], f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)


def worker(spec: dict) -> dict:
    """One rank: build, wrap, train three steps under TensorPeak; the peak of each step."""
    import torch
    import torch.distributed as dist

    if spec["strategy"] == "ddp-trainer":
        return trainer_worker(spec)

    from estimate_vs_measured import _Batches, _config, build

    from kit.measure.tensor_peak import TensorPeak

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kw, name, overrides = spec["kw"], spec["model"], spec.get("overrides")
    B, S, V = kw["batch_size"], kw["seq_len"], _config(name, overrides).vocab_size
    data = _Batches(3 * B, S, V, padded=kw.get("padded", True), seed=rank)
    with TensorPeak() as tp:  # from before the model: DDP's buckets are made in C++ at wrap time
        torch.manual_seed(0)
        model = build(name, kw, overrides=overrides)
        if kw.get("gradient_checkpointing"):  # what Trainer does for gradient_checkpointing=True
            model.gradient_checkpointing_enable()
        model = wrap(model, spec["strategy"])
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
        steps = []
        for step in range(3):
            batch = {k: torch.stack([data[step * B + i][k] for i in range(B)]) for k in ("input_ids", "attention_mask",
                                                                                      "labels")}
            tp.peak_bytes = start = tp.current_bytes  # this step's peak, from what is alive as it begins
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, batch
            dist.barrier()  # both ranks done with the step: no collective of it still holds its tensors
            gc.collect()  # FSDP2's last reduce-scatter input can sit in a reference cycle: read what is held
            steps.append({"start": start, "peak": tp.peak_bytes, "end": tp.current_bytes})
    result = {"rank": rank, "steps": steps}
    _publish_rank(spec, result)
    dist.barrier()   # both ranks tear down together (a lone rank's gloo threads can abort its exit)
    dist.destroy_process_group()
    return result


def run_row(model: str, strategy: str, kw: dict, overrides: dict | None = None, nproc: int = 2,
            timeout: int = 300) -> list:
    """Launch one row under torchrun; each rank's result, with the estimate and the error."""
    import tempfile

    from estimate_vs_measured import _config

    from kit.estimate import estimate
    from kit.estimate.strategies import model_states

    outdir = tempfile.mkdtemp(prefix="kit-multi-gpu-")
    spec = json.dumps({"model": model, "strategy": strategy, "kw": kw, "overrides": overrides, "out": outdir})
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(29500 + os.getpid() % 1000), os.path.abspath(__file__), "--worker", spec]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    files = sorted(f for f in os.listdir(outdir) if f.startswith("rank"))
    ranks = [json.load(open(os.path.join(outdir, f))) for f in files]
    # gloo's background threads can abort a rank's exit after its readings are written ("terminate called
    # without an active exception", a teardown race in gloo on the CPU): complete readings from every rank stand
    teardown_only = out.returncode and "terminate called without an active exception" in out.stderr
    if (out.returncode and not teardown_only) or len(ranks) != nproc:
        raise RuntimeError(f"torchrun failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    est = estimate(_config(model, overrides) if overrides else model, **kw,
                   strategy=strategy.replace("-trainer", ""), num_gpus=1 if strategy == "single" else nproc,
                   device="cpu")
    rows = []
    for r in sorted(ranks, key=lambda r: r["rank"]):
        measured = r["steps"][-1]["peak"]
        rows.append(dict(model=model + (" (vocab 256, 4 layers)" if overrides else ""), strategy=strategy,
                         num_gpus=nproc, rank=r["rank"], setup=kw,
                         estimate=est.peak_bytes, measured=measured, error=est.peak_bytes / measured - 1,
                         moment=est.peak_moment, held_after=r["steps"][-1]["end"], states=model_states(est),
                         kept=est.weights_bytes + est.optimizer_bytes))
    return rows


def table(rows: list) -> str:
    from kit.units import fmt_bytes

    head = ("| model | setup | strategy | N | rank | estimate | measured | error | peak moment (estimate) |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['model']} | {', '.join(f'{k}={v}' for k, v in r['setup'].items())} | {r['strategy']} | {r['num_gpus']} "
        f"| {r['rank']} | {fmt_bytes(r['estimate'])} ({r['estimate']:,}) | {fmt_bytes(r['measured'])} "
        f"({r['measured']:,}) | {100 * r['error']:+.2f}% | {r['moment']} |\n" for r in rows)
    return head + body


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        worker(spec)   # each rank writes its own file (ranks print at once)
        return 0
    import torch

    rows = []
    for model, strategy, kw, *over in GRID:
        rows += run_row(model, strategy, kw, *over, nproc=args.nproc)
        print(table(rows[-args.nproc:]).splitlines()[-1], flush=True)
    worst = max(abs(r["error"]) for r in rows)
    md = (f"# Per-rank peak, predicted and measured: {args.nproc} processes, gloo on the CPU "
          f"({datetime.date.today()}, torch {torch.__version__})\n\n"
          "Measured: each rank's exact tensor peak (kit.measure.tensor_peak.TensorPeak) over its third training step, "
          "driven through Trainer for `ddp-trainer` (use_cpu=True under torchrun: accelerate MULTI_CPU wraps the "
          "model in DistributedDataParallel) and through torch directly for the others (DistributedDataParallel; "
          "FSDP2 fully_shard per block, then the model; "
          "fsdp-grad-op = reshard_after_forward=False), fused AdamW. Estimate: "
          "`estimate(model, ..., strategy=S, num_gpus=N, device=\"cpu\")`.\n"
          "Reproduce: `python benchmarks/multi_gpu.py --out <file>`. FSDP cannot go through Trainer here: on a CPU, "
          "Trainer given fsdp=... still runs DDP. ZeRO is not measured (a DeepSpeed training run on this CPU was not "
          "attempted); its model states are checked against DeepSpeed's estimator in tests/test_strategies.py.\n\n"
          f"{table(rows)}\n"
          f"Worst error: {100 * worst:.2f}% over {len(rows)} rank rows.\n")
    print(md)
    write_table(md, args.out, "multi_gpu", "cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
