"""The ``python -m kit estimate`` contract (docs/cli-and-api.md, "Command line"): flags, JSON integer fields, exit
codes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONTRACT = ("params", "trainable_params", "weights_bytes", "gradients_bytes", "optimizer_bytes",
            "activations_bytes", "peak_bytes", "cpu_build_bytes")
ROOT = Path(__file__).resolve().parents[1]


def test_json_has_the_contract_integer_fields(run_kit):
    code, out, err = run_kit("estimate", "--model", "distilgpt2+vocab-head", "--batch-size", "1", "--seq-len", "128",
                             "--precision", "fp16", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    for field in CONTRACT:
        assert type(data[field]) is int, field
    assert data["trainable_params"] == 2_525_916_822
    assert data["offenders"][0]["module"] == "custom_layer"
    assert data["verdict"]["fits"] is False
    assert sum(data["components"].values()) == data["peak_bytes"]


def test_every_flag_of_the_contract(run_kit):
    code, out, _ = run_kit("estimate", "--model", "meta-llama/Meta-Llama-3-8B", "--batch-size", "2",
                           "--seq-len", "512", "--precision", "bf16", "--quantization", "4bit", "--lora-r", "16",
                           "--lora-targets", "q_proj,v_proj", "--optimizer", "paged-adamw-8bit",
                           "--gradient-checkpointing", "--grad-accum", "4", "--load-dtype", "bf16", "--json")
    data = json.loads(out)
    assert code == 0 and data["trainable_params"] == 6_815_744
    assert data["setup"]["optim"] == "paged_adamw_8bit" and data["setup"]["grad_accum"] == 4
    # LoRA matrices are under bitsandbytes' 1e5-element paging threshold: 1 byte a state x 2 + absmax
    assert data["paged_optimizer_bytes"] == 0
    assert data["optimizer_bytes"] == 6_815_744 * 2 + 6_815_744 // 256 * 8


def test_load_dtype_defaults(run_kit):
    _, out, _ = run_kit("estimate", "--model", "gpt2", "--batch-size", "1", "--seq-len", "64", "--json")
    assert json.loads(out)["setup"]["load_dtype"] == "fp32"
    _, out, _ = run_kit("estimate", "--model", "tiny-llama", "--batch-size", "1", "--seq-len", "64",
                        "--quantization", "4bit", "--lora-r", "8", "--json")
    assert json.loads(out)["setup"]["load_dtype"] == "bf16"


def test_the_answer_by_default_and_the_table_with_details(run_kit):
    argv = ["--model", "distilgpt2+vocab-head", "--batch-size", "1", "--seq-len", "128"]
    code, out, _ = run_kit("estimate", *argv)
    assert code == 0 and out.startswith("DOES NOT FIT Colab T4: ") and \
        "reserved (modelled) of 13.83 GiB usable (14.56 GiB less the 5% margin)" in " ".join(out.split())
    assert "biggest cause: custom_layer" in out and "best change: --lora-r 256 --lora-targets custom_layer" in out
    assert "PEAK" not in out and out.rstrip().splitlines()[-1].startswith("details: --details")
    code, out, _ = run_kit("estimate", *argv, "--details")
    assert code == 0 and out.startswith("DOES NOT FIT Colab T4: ")
    for row in ("weights", "gradients", "optimizer state", "activations", "logits & loss", "PEAK",
                "custom_layer", "Colab T4"):
        assert row in out


@pytest.mark.parametrize("argv,needle", [
    (["--model", "no-such-model", "--batch-size", "1", "--seq-len", "8"], "Known names"),
    (["--model", "gpt2", "--batch-size", "0", "--seq-len", "8"], "batch_size"),
    (["--model", "gpt2", "--batch-size", "1", "--seq-len", "4096"], "positions"),
    (["--model", "gpt2", "--batch-size", "1", "--seq-len", "8", "--lora-r", "4", "--lora-targets", "q_proj"],
     "c_attn"),
])
def test_bad_input_exits_2_with_a_message(argv, needle, run_kit):
    code, out, err = run_kit("estimate", *argv)
    assert code == 2 and out == ""
    assert needle in err and "Traceback" not in err


def test_unknown_choice_is_argparse_exit_2(run_kit):
    code, out, err = run_kit("estimate", "--model", "gpt2", "--batch-size", "1", "--seq-len", "8",
                             "--optimizer", "adam9")
    assert code == 2 and out == "" and "invalid choice: 'adam9'" in err


def test_python_m_kit_estimate():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "kit", "estimate", "--model", "distilgpt2", "--batch-size", "2",
           "--seq-len", "64", "--json"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["params"] == 81_912_576
    bad = subprocess.run(cmd[:5] + ["nope", "--batch-size", "1", "--seq-len", "8"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "Known names" in bad.stderr


def test_optimizer_takes_the_trainer_names_help_lists(run_kit):
    for name, kit_name in (("adamw_torch", "adamw"), ("adamw_bnb_8bit", "adamw-8bit"),
                           ("paged_adamw_8bit", "paged-adamw-8bit"), ("adamw", "adamw"),
                           ("adamw_torch_fused", "adamw-fused")):
        code, out, err = run_kit("estimate", "--model", "tiny-gpt2", "--batch-size", "1", "--seq-len", "8",
                                 "--optimizer", name, "--json")
        assert code == 0, err
        assert json.loads(out)["setup"]["optimizer"] == kit_name


def test_the_default_optimizer_is_trainers_and_the_table_names_it(run_kit):
    _, out, _ = run_kit("estimate", "--model", "tiny-gpt2", "--batch-size", "1", "--seq-len", "8", "--details")
    assert "optimizer adamw-fused (optim='adamw_torch_fused')" in out.split("\n\n", 1)[1].splitlines()[1]


def test_the_evaluation_phase_in_json_and_table(run_kit):
    argv = ["--model", "meta-llama/Llama-3.2-1B", "--batch-size", "2", "--seq-len", "512", "--precision", "bf16",
            "--quantization", "4bit", "--lora-r", "8"]
    _, out, _ = run_kit("estimate", *argv, "--eval-gather", "logits", "--eval-samples", "200", "--json")
    data = json.loads(out)
    # compute_metrics gathers 200 rows of fp32 logits on the GPU; torch.cat holds the old, the new and the result
    assert data["eval_moment"] == "gathering predictions (torch.cat)"
    assert data["eval_peak_bytes"] > 2 * 200 * 512 * 128256 * 4 > data["peak_bytes"]
    code, out, _ = run_kit("estimate", *argv, "--eval-gather", "logits", "--eval-samples", "200",
                           "--eval-accumulation-steps", "1", "--details")
    assert code == 0 and "evaluation (batch 8, logits gathered)" in out
    code, _, err = run_kit("estimate", *argv, "--eval-gather", "logits")
    assert code == 2 and err.startswith("error: argument --eval-samples: ")


def test_input_errors_name_the_option(run_kit):
    code, _, err = run_kit("estimate", "--model", "gpt2", "--batch-size", "0", "--seq-len", "8")
    assert code == 2 and err.startswith("error: argument --batch-size: batch_size must be a whole number >= 1")
    code, _, err = run_kit("estimate", "--model", "gpt2", "--batch-size", "1", "--seq-len", "8", "--lora-r", "4",
                           "--lora-targets", "q_proj")
    assert code == 2 and err.startswith("error: argument --lora-targets: ") and "all-linear" in err


def test_an_estimator_bug_is_one_line_and_exit_1(run_kit, monkeypatch):
    import kit.estimate.core

    def broken(*args, **kwargs):
        raise KeyError("intermediate_size")

    monkeypatch.setattr(kit.estimate, "estimate", broken)
    code, out, err = run_kit("estimate", "--model", "gpt2", "--batch-size", "1", "--seq-len", "8")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("error: the estimator failed on this setup (KeyError:") and "KIT_TRACEBACK" in err


def _cli(*argv, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    env.pop("KIT_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "kit", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_python_m_kit_failures_are_one_line_exit_2(tmp_path, run_kit):
    from transformers import T5Config

    T5Config().save_pretrained(tmp_path / "t5")
    cut = tmp_path / "cut" / "config.json"
    cut.parent.mkdir()
    cut.write_text('{"model_type": "llama", "hidden_si')
    size = ["--batch-size", "1", "--seq-len", "8"]
    cases = [
        (["--model", "no-such-model", *size],
         "error: argument --model: Unknown model 'no-such-model': it is no shipped name, and the Hugging Face Hub "
         "cannot be reached from here to fetch its config.json. Known names: distilgpt2"),
        (["--model", str(cut), *size], f"error: argument --model: {cut} is not a readable config.json"),
        (["--model", str(tmp_path / "t5"), *size],
         "error: argument --model: t5 (T5Config) scales the decoder's output"),
        (["--model", "gpt2", "--batch-size", "many", "--seq-len", "8"],
         "error: argument --batch-size: invalid int value: 'many'"),
        (["--model", "gpt2", "--batch-size", "-3", "--seq-len", "8"],
         "error: argument --batch-size: batch_size must be a whole number >= 1, not -3."),
        (["--model", "gpt2", *size, "--optimizer", "adam9"], "error: argument --optimizer: invalid choice: 'adam9'"),
    ]
    for argv, start in cases:
        code, out, err = run_kit("estimate", *argv)
        assert code == 2 and out == "", (argv, err)
        assert err.startswith(start) and err.count("\n") == 1, (argv, err)
    res = _cli(tmp_path=tmp_path)  # no command at all, in a process of its own: its exit status and stderr
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1


# ---- careless command lines: a closed pipe, a pasted space, an edited config.json, no model at all ----------
def test_fit_json_into_a_closed_pipe_exits_quietly():
    """`python -m kit fit --json | head`: the reader closes the pipe; no BrokenPipeError, no 'please report it'."""
    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-m", "kit", "fit", "--model", "tiny-llama", "--batch-size", "1",
                          "--seq-len", "8", "--json"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "KIT_SMOKE": "1"})
    p.stdout.close()                 # closed before the command writes a byte: its first write hits a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0 and err == "", err


def test_a_model_name_with_a_pasted_space_is_the_model(run_kit):
    base = ["--batch-size", "1", "--seq-len", "8", "--json"]
    code, out, err = run_kit("estimate", "--model", " tiny-llama ", *base)
    code2, out2, _ = run_kit("estimate", "--model", "tiny-llama", *base)
    assert (code, err) == (0, "") and out == out2                 # the same bytes as the name typed cleanly


def test_an_edited_config_json_is_read_again(tmp_path):
    from kit.estimate import estimate
    from kit.model_configs import CONFIG_DIR

    path = tmp_path / "config.json"
    cfg = json.loads((CONFIG_DIR / "tiny-llama.json").read_text())
    path.write_text(json.dumps(cfg))
    before = estimate(str(path), batch_size=1, seq_len=32)
    cfg["num_hidden_layers"] *= 2                                  # the same file, twice the layers, at once
    path.write_text(json.dumps(cfg))
    after = estimate(str(path), batch_size=1, seq_len=32)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.json").write_text(json.dumps(cfg))           # the edited file, never seen before
    assert after.params > before.params and after.peak_bytes > before.peak_bytes
    assert (after.params, after.peak_bytes) == (lambda e: (e.params, e.peak_bytes))(
        estimate(str(fresh / "config.json"), batch_size=1, seq_len=32))
    assert estimate(str(tmp_path), batch_size=1, seq_len=32).params == after.params    # its folder: the same file


def test_no_model_at_all_is_one_sentence_named_model():
    from kit.estimate import estimate_from
    from kit.inputs import InputError

    with pytest.raises(InputError, match=r"^model must be a shipped name, a Hub id, a config.json path, a "
                                         r"PretrainedConfig or an nn.Module, not None\.$") as e:
        estimate_from(None, seq_len=32)
    assert e.value.name == "model"


def test_i35_11_the_cpu_preset_estimates_cpu_kernels_so_liger_is_refused_as_the_api_refuses_it(run_kit):
    code, out, err = run_kit("estimate", "--model", "tiny-llama", "--batch-size", "2", "--seq-len", "64",
                             "--liger-kernel", "--preset", "cpu")
    assert code == 2 and out == "", out
    assert err.startswith("error: argument --liger-kernel: Liger's kernels are Triton kernels that run on a CUDA GPU "
                          "only"), err
    code, out, err = run_kit("estimate", "--model", "tiny-llama", "--batch-size", "2", "--seq-len", "64",
                             "--preset", "cpu", "--json")
    from kit.estimate import estimate

    assert code == 0 and json.loads(out)["peak_bytes"] == estimate("tiny-llama", batch_size=2, seq_len=64,
                                                                   device="cpu").peak_bytes
    code, out, err = run_kit("estimate", "--model", "tiny-llama", "--batch-size", "2", "--seq-len", "64",
                             "--preset", "cpu")
    assert code == 0 and "RESERVED" not in out and "fits this machine's CPU and RAM" in out, out


@pytest.mark.parametrize("flags, says", [
    (["--loss-type", "dft"], "loss_type 'dft' is SFTTrainer's loss through its fused LM head"),
    (["--padding-free"], "padding_free flattens a batch into one row of sequences"),
])
def test_i50_17_lm_only_options_on_a_classifier_name_the_flag_given(run_kit, flags, says):
    code, out, err = run_kit("estimate", "--model", "tiny-bert", "--task", "seq-cls", "--batch-size", "2",
                             "--seq-len", "32", *flags)
    assert code == 2 and says in err and f"argument {flags[0]}:" in err, err
    assert "fused_lm_head" not in err   # no option the CLI lacks


@pytest.mark.parametrize("device, says", [
    ("16", "device '16' reads as 16 bytes, smaller than any GPU: give a unit (16GiB, 16GB)"),
    ("1e100", "more than any GPU holds (over 1 PiB)"),
])
def test_i50_17_fit_device_bytes_out_of_any_gpus_range_is_refused(run_kit, device, says):
    code, out, err = run_kit("fit", "--model", "tiny-llama", "--batch-size", "2", "--seq-len", "32",
                             "--device", device)
    assert code == 2 and says in err and len(err) < 200, err
