"""Per-GPU estimates (kit.estimate.strategies): one GPU unchanged, the states divided as each engine divides them,
DeepSpeed's own estimator where it installs, the accelerate config files, and the CLI flags."""
import argparse
import json
import math
from pathlib import Path

import pytest

from kit.estimate import estimate
from kit.estimate.launch import launch_command, read_accelerate_config
from kit.inputs import InputError

DATA = Path(__file__).parent / "data" / "accelerate"
SETUPS = [dict(model="tiny-llama", batch_size=2, seq_len=32),
          dict(model="gpt2", batch_size=4, seq_len=256, precision="bf16"),
          dict(model="meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512, quantization="4bit", lora_r=16),
          dict(model="distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16")]


def _est(kw, **more):
    kw = dict(kw)
    return estimate(kw.pop("model"), **kw, **more)


@pytest.mark.parametrize("kw", SETUPS)
def test_one_gpu_is_the_single_gpu_estimate(kw):
    one = _est(kw)
    same = _est(kw, strategy="single", num_gpus=1, cpu_offload=False)
    assert same.to_json() == one.to_json() and same.table() == one.table()
    assert "strategy" not in one.to_json()  # the one-GPU JSON is unchanged


@pytest.mark.parametrize("N", [2, 4, 8])
def test_fsdp_divides_every_state_by_n_frozen_weights_too(N):
    for kw in SETUPS[:3]:
        one, f = _est(kw), _est(kw, strategy="fsdp", num_gpus=N)
        c = one.context
        params = sum(c.weights.values())
        assert f.weights_bytes == math.ceil(params / N) + c.buffers
        assert f.gradients_bytes == math.ceil(one.gradients_bytes / N)
        assert f.optimizer_bytes == math.ceil(one.optimizer_bytes / N)
        assert sum(f.components().values()) == f.peak_bytes
        # the root (embeddings, lm_head) is gathered from its forward till its reduce-scatter: at least that
        assert f.unsharded_bytes >= c.weights["embed"] + c.weights["head"]
        js = f.to_json()
        assert js["strategy"] == "fsdp" and js["num_gpus"] == N and type(js["peak_bytes"]) is int


def test_ddp_keeps_everything_and_adds_a_bucket_copy_of_the_trainable_grads():
    for kw in SETUPS[:3]:
        one, d = _est(kw), _est(kw, strategy="ddp", num_gpus=8)
        assert (d.weights_bytes, d.gradients_bytes, d.optimizer_bytes) == \
            (one.weights_bytes, one.gradients_bytes, one.optimizer_bytes)
        assert d.comm_buffer_bytes == one.gradients_bytes  # QLoRA: the adapters' grads only, no frozen bucket
        assert d.peak_bytes == one.peak_bytes + one.gradients_bytes
        assert d.eval_peak_bytes == one.eval_peak_bytes + one.gradients_bytes  # the buckets outlive training


def test_zero_stages_divide_what_deepspeed_divides():
    kw = dict(model="meta-llama/Llama-3.2-1B", batch_size=1, seq_len=512, precision="bf16")
    one = _est(kw)
    T, N = one.trainable_params, 8
    z = {s: _est(kw, strategy=f"zero{s}", num_gpus=N) for s in (1, 2, 3)}
    half = sum(one.context.weights.values()) // 2  # DeepSpeed casts the fp32 model to bf16
    assert z[1].weights_bytes - one.context.buffers == half and z[1].gradients_bytes == 2 * T
    assert z[1].optimizer_bytes == math.ceil(16 * T / N)  # fp32 master + fp32 grads + AdamW's two states
    assert z[2].gradients_bytes == math.ceil(2 * T / N) and z[2].weights_bytes == z[1].weights_bytes
    assert z[3].weights_bytes - one.context.buffers == math.ceil(half / N)
    assert z[1].peak_bytes > z[2].peak_bytes > z[3].peak_bytes
    lora = _est(kw, lora_r=16, strategy="zero3", num_gpus=N)  # frozen weights: sharded, no grad or state
    assert lora.optimizer_bytes == math.ceil(16 * lora.trainable_params / N)


def test_zero_model_states_against_deepspeeds_own_estimator():
    """DeepSpeed's estimators count 2 + 18/N bytes a parameter (stage 2) and 4 x the largest layer + 18/N
    (stage 3), all parameters as trainable. Full fine-tuning at stage 2: the kit's model states are the same
    (its reduce bucket is a buffer beside them). LoRA: DeepSpeed counts the frozen base as trainable."""
    s12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    s3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    kw = dict(model="meta-llama/Llama-3.2-1B", batch_size=1, seq_len=512, precision="bf16")
    P, N = _est(kw).params, 8
    z2, z3 = _est(kw, strategy="zero2", num_gpus=N), _est(kw, strategy="zero3", num_gpus=N)
    _, ds2 = s12.estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=N, cpu_offload=False)
    assert z2.model_states_bytes == pytest.approx(ds2, abs=2)  # (ceil vs int of 2/N and 16/N)
    block = max(n for name, n, _ in _est(kw).offenders if ".layers." in name)
    _, ds3, largest = s3.estimate_zero3_model_states_mem_needs(P, block, num_gpus_per_node=N, cpu_offload=False)
    # stage 3: DeepSpeed's function counts 18 bytes a parameter in 1/N where its stage-2 one counts 2 + 18 (the
    # half weights now in 1/N too), so it leaves 2 out; the kit counts half weights and grads, fp32 master
    # weights and grads and AdamW's two states (2 + 2 + 4 + 4 + 8 = 20) at every stage
    assert largest == 4 * block
    assert z3.model_states_bytes - (ds3 - largest) == pytest.approx(2 * P / N, abs=3)
    lora = _est(kw, lora_r=16, strategy="zero2", num_gpus=N)
    _, ds2_lora = s12.estimate_zero2_model_states_mem_needs(lora.params, num_gpus_per_node=N, cpu_offload=False)
    frozen = lora.params - lora.trainable_params
    assert ds2_lora - lora.model_states_bytes == pytest.approx(18 * frozen / N, abs=3)


def test_cpu_offload_moves_the_shards_to_ram():
    kw = dict(model="meta-llama/Llama-3.2-1B", batch_size=1, seq_len=512, precision="bf16")
    on, off = _est(kw, strategy="fsdp", num_gpus=4), _est(kw, strategy="fsdp", num_gpus=4, cpu_offload=True)
    assert off.optimizer_bytes == 0 and off.gradients_bytes == 0 and off.peak_bytes < on.peak_bytes
    assert off.cpu_offload_bytes == on.weights_bytes - on.context.buffers + on.gradients_bytes + on.optimizer_bytes
    z = _est(kw, strategy="zero2", num_gpus=4, cpu_offload=True)
    assert z.optimizer_bytes == 0 and z.cpu_offload_bytes > 0
    with pytest.raises(InputError, match="offload"):
        _est(kw, strategy="ddp", num_gpus=2, cpu_offload=True)
    with pytest.raises(InputError, match="single"):
        _est(kw, num_gpus=2)
    with pytest.raises(InputError, match="fsdp"):
        _est(kw, strategy="tp", num_gpus=2)


def test_fsdp_grad_op_keeps_the_blocks_gathered():
    kw = dict(model="meta-llama/Llama-3.2-1B", batch_size=1, seq_len=512, precision="bf16")
    full, op = _est(kw, strategy="fsdp", num_gpus=8), _est(kw, strategy="fsdp-grad-op", num_gpus=8)
    assert op.peak_bytes > full.peak_bytes and op.unsharded_bytes > full.unsharded_bytes
    assert "PER GPU: fsdp-grad-op over 8 GPUs" in op.table()


# ---- accelerate config files (as `accelerate config` writes them) ------------------------------------
@pytest.mark.parametrize("name,expected", [
    ("fsdp2.yaml", dict(strategy="fsdp", num_gpus=4, cpu_offload=False, precision="bf16")),
    ("fsdp1_grad_op.yaml", dict(strategy="fsdp-grad-op", num_gpus=2, cpu_offload=False, precision="fp16",
                                gradient_checkpointing=True)),
    ("deepspeed_zero3_offload.yaml", dict(strategy="zero3", num_gpus=8, cpu_offload=True, precision="bf16",
                                          grad_accum=4)),
    ("ddp.yaml", dict(strategy="ddp", num_gpus=2, cpu_offload=False, precision="fp16")),
    ("deepspeed_file.yaml", dict(strategy="zero2", num_gpus=4, cpu_offload=False)),  # its ds_zero2.json
])
def test_reads_real_accelerate_config_files(name, expected):
    from accelerate.commands.config.config_args import load_config_from_file

    load_config_from_file(str(DATA / name))  # accelerate itself reads each file
    assert read_accelerate_config(DATA / name) == expected


def test_reads_what_accelerates_own_writer_writes(tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import ComputeEnvironment, DistributedType

    path = tmp_path / "default_config.yaml"
    ClusterConfig(compute_environment=ComputeEnvironment.LOCAL_MACHINE, distributed_type=DistributedType.FSDP,
                  mixed_precision="bf16", use_cpu=False, debug=False, num_processes=8,
                  fsdp_config={"fsdp_version": 2, "fsdp_reshard_after_forward": False,
                               "fsdp_offload_params": False}).to_yaml_file(str(path))
    assert read_accelerate_config(path) == dict(strategy="fsdp-grad-op", num_gpus=8, cpu_offload=False,
                                                precision="bf16")
    assert launch_command(path).startswith("accelerate launch --config_file ")


def test_unreadable_or_unmodelled_files_say_so(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_accelerate_config(tmp_path / "missing.yaml")
    (tmp_path / "tpu.yaml").write_text("distributed_type: XLA\nnum_processes: 8\n")
    with pytest.raises(InputError, match="XLA"):
        read_accelerate_config(tmp_path / "tpu.yaml")
    (tmp_path / "bad.yaml").write_text("distributed_type: [FSDP\n")
    with pytest.raises(InputError, match="YAML"):
        read_accelerate_config(tmp_path / "bad.yaml")


# ---- the CLI -------------------------------------------------------------------------------------------
BASE = ["--model", "tiny-llama", "--batch-size", "2", "--seq-len", "32"]


def test_cli_strategy_flags_give_per_gpu_json(run_kit):
    code, out, err = run_kit("estimate", *BASE, "--strategy", "fsdp", "--num-gpus", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["strategy"] == "fsdp" and data["num_gpus"] == 2
    assert data["peak_bytes"] == estimate("tiny-llama", batch_size=2, seq_len=32, strategy="fsdp",
                                          num_gpus=2).peak_bytes
    assert sum(data["components"].values()) == data["peak_bytes"]
    for k in ("unsharded_bytes", "comm_buffer_bytes", "model_states_bytes", "cpu_offload_bytes"):
        assert type(data[k]) is int


def test_cli_accelerate_config_sets_the_launch_and_flags_win(run_kit):
    code, out, _ = run_kit("estimate", *BASE, "--accelerate-config", str(DATA / "fsdp2.yaml"), "--json")
    data = json.loads(out)
    assert (data["strategy"], data["num_gpus"], data["setup"]["precision"]) == ("fsdp", 4, "bf16")
    code, out, _ = run_kit("estimate", *BASE, "--accelerate-config", str(DATA / "fsdp2.yaml"), "--num-gpus", "2",
                           "--precision", "fp32", "--json")
    data = json.loads(out)
    assert (data["num_gpus"], data["setup"]["precision"]) == (2, "fp32")
    code, out, _ = run_kit("estimate", *BASE, "--accelerate-config", str(DATA / "ddp.yaml"))
    assert "reserved (modelled) per GPU (ddp over 2 GPUs) of" in out.splitlines()[0]   # the answer says it
    assert f"accelerate launch --config_file {DATA / 'ddp.yaml'}" in out
    code, out, _ = run_kit("estimate", *BASE, "--accelerate-config", str(DATA / "ddp.yaml"), "--details")
    assert "PER GPU: ddp over 2 GPUs" in out


def test_cli_errors_name_the_flag(run_kit):
    code, _, err = run_kit("estimate", *BASE, "--strategy", "ddp", "--num-gpus", "2", "--cpu-offload")
    assert code == 2 and err.startswith("error: argument --cpu-offload")
    code, _, err = run_kit("estimate", *BASE, "--accelerate-config", "/no/such.yaml")
    assert code == 2 and "--accelerate-config" in err


# ---- the fit advisor: "shard over N GPUs" -------------------------------------------------------------
def test_the_advisor_offers_the_fewest_gpus_only_when_nothing_fits_one():
    from kit.advise import advise
    from kit.advise.gpus import GPU_COUNTS

    a = advise(dict(model="mistralai/Mistral-7B-v0.3", batch_size=1, seq_len=512), 4_000_000_000, safety=0)
    *single, shard = a.suggestions
    assert not a.fits and single and not any(x.fits for x in single)
    n = shard.changes["num-gpus"]
    assert shard.fits and shard.changes["strategy"] == "fsdp" and shard.cli.endswith(f"--strategy fsdp --num-gpus {n}")
    assert shard.peak_bytes == estimate(**shard.options).peak_bytes <= 4_000_000_000
    fewer = [c for c in GPU_COUNTS if c < n]
    for near in [None, *single]:  # at fewer GPUs, neither the setup nor any of the closest single-GPU changes fits
        o = dict(near.options) if near else dict(model="mistralai/Mistral-7B-v0.3", batch_size=1, seq_len=512)
        for c in fewer:
            assert estimate(**{**o, "strategy": "fsdp", "num_gpus": c}).peak_bytes > 4_000_000_000
    fits = advise(dict(model="tiny-llama", batch_size=8, seq_len=128, device="cpu"), 80_000_000, safety=0)
    assert fits.suggestions and all("num-gpus" not in x.changes for x in fits.suggestions)


def test_fit_cli_takes_the_launch_options(capsys):
    from kit.cli.fit import register as register_fit

    parser = argparse.ArgumentParser(prog="kit")
    register_fit(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["fit", "--model", "meta-llama/Llama-3.2-1B", "--batch-size", "1", "--seq-len", "512",
                              "--accelerate-config", str(DATA / "fsdp2.yaml"), "--device", "a100-40", "--json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    per_gpu = estimate("meta-llama/Llama-3.2-1B", batch_size=1, seq_len=512, precision="bf16", strategy="fsdp",
                       num_gpus=4).peak_bytes
    assert data["peak_bytes"] == per_gpu and data["fits"]


def test_training_arguments_fsdp_and_deepspeed_make_the_estimate_per_gpu(monkeypatch, tmp_path):
    """estimate_from / estimate_trainer read TrainingArguments' fsdp_config and deepspeed (they were refused)."""
    from transformers import TrainingArguments

    from kit.estimate import estimate_from

    monkeypatch.setenv("WORLD_SIZE", "4")   # what torchrun / accelerate launch set in each rank
    out = str(tmp_path / "out")
    fsdp = TrainingArguments(output_dir=out, report_to=[], per_device_train_batch_size=2, fsdp=True,
                             fsdp_config={"version": 2, "reshard_after_forward": False, "cpu_offload": False})
    e = estimate_from("tiny-llama", training_args=fsdp, seq_len=64)
    assert (e.strategy, e.num_gpus) == ("fsdp-grad-op", 4)
    assert e.peak_bytes == estimate("tiny-llama", batch_size=2, seq_len=64, strategy="fsdp-grad-op",
                                    num_gpus=4).peak_bytes
    assert e.sources["num_gpus"] == (4, "TrainingArguments.fsdp_config and WORLD_SIZE")
    pytest.importorskip("deepspeed")   # TrainingArguments(deepspeed=...) needs it installed
    ds = TrainingArguments(output_dir=out, report_to=[], per_device_train_batch_size=2, deepspeed={
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_micro_batch_size_per_gpu": 2})
    e = estimate_from("tiny-llama", training_args=ds, seq_len=64)
    assert (e.strategy, e.num_gpus, e.cpu_offload) == ("zero2", 4, True)


# ---- launch fields a careless user gets wrong: one sentence each, named, never a raw error ------------------
@pytest.mark.parametrize("text,match", [
    ("distributed_type: FSDP\nnum_processes: 2\nfsdp_config: full_shard\n", r"fsdp_config must be a mapping"),
    ("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 9\n",
     r"fsdp sharding strategy 9: expected one of FULL_SHARD"),
    ("distributed_type: MULTI_GPU\nnum_processes: four\n", r"num_processes must be a whole number >= 0, not 'four'"),
    ("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 7\n",
     r"ZeRO stage 7 is not one DeepSpeed has"),
    ("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: torn.json\n",
     r"torn.json' is not valid JSON"),
    ("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: gone.json\n",
     r"cannot read the DeepSpeed config .*gone.json' \(No such file"),
    ("name: my-env\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n",   # a conda environment file
     r"is not an accelerate config: it has none of"),
])
def test_a_bad_accelerate_config_field_is_one_sentence_named_accelerate_config(tmp_path, text, match):
    (tmp_path / "torn.json").write_text('{"zero_optimization": {"st')
    path = tmp_path / "launch.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=match) as e:
        read_accelerate_config(path)
    assert e.value.name == "accelerate_config"


def test_a_bad_zero_stage_is_blamed_on_the_file_not_on_strategy(tmp_path, run_kit):
    path = tmp_path / "ds.yaml"
    path.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 7\n")
    code, _, err = run_kit("estimate", *BASE, "--accelerate-config", str(path))
    assert code == 2 and err.startswith("error: argument --accelerate-config: ") and "--strategy" not in err
    assert "ZeRO stage 7" in err and "Traceback" not in err


def test_training_arguments_launch_fields_are_read_or_refused_by_name(monkeypatch, tmp_path):
    from types import SimpleNamespace as NS

    from kit.estimate.launch import read_training_launch

    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(InputError, match=r"WORLD_SIZE is 'abc', not a number of processes") as e:
        read_training_launch(NS(fsdp=True, fsdp_config={}, deepspeed=None, world_size=1))
    assert e.value.name == "WORLD_SIZE"
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match=r"fsdp_config must be a dict") as e:
        read_training_launch(NS(fsdp=True, fsdp_config="full_shard", deepspeed=None))
    assert e.value.name == "fsdp_config"
    with pytest.raises(InputError, match=r"ZeRO stage 7 is not one DeepSpeed has") as e:
        read_training_launch(NS(fsdp=None, deepspeed={"zero_optimization": {"stage": 7}}))
    assert e.value.name == "deepspeed"
    (tmp_path / "torn.json").write_text("{")
    for bad, match in ((tmp_path / "torn.json", "is not valid JSON"), (tmp_path / "gone.json", "cannot read")):
        with pytest.raises(InputError, match=match) as e:
            read_training_launch(NS(fsdp=None, deepspeed=str(bad)))
        assert e.value.name == "deepspeed"
