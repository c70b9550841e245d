"""The estimator's answers, held byte for byte over a table of setups, so that a change to how a setup travels
through the estimator (the user's objects, the CLI, the replay and back) can be shown to change no figure.

Each row is a face and its input: ``python -m kit estimate ... --json`` and ``python -m kit fit ... --json`` (run in
this process), ``estimate_from(...)`` with TRL configs, and ``estimate_trainer(...)`` on a built Trainer. The answers
are kept in ``tests/data/spine_golden.json``. A change that moves a figure on purpose regenerates the file in the same
commit, and its message names what moved and why::

    .venv/bin/python tests/test_spine_golden.py --write
"""
import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "data" / "spine_golden.json"
LLAMA_8B, LLAMA_1B, QWEN_05B = "meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B"


def _cli(*words):
    return ["estimate", *words, "--json"]


def _fit(*words):
    return ["fit", *words, "--json"]


# One row per setup: the faces' inputs. Every shipped decoder family, LoRA and QLoRA, the 16-bit precisions, SFT's
# packing and losses, classifiers and encoders, own heads, the multi-GPU strategies, offloading, and the fit advisor.
CLI_ROWS = {
    "gpt2 full fp32": _cli("--model", "gpt2", "--batch-size", "8", "--seq-len", "512"),
    "distilgpt2 fp16": _cli("--model", "distilgpt2", "--batch-size", "8", "--seq-len", "128", "--precision", "fp16"),
    "gpt2 bf16 ckpt": _cli("--model", "gpt2", "--batch-size", "4", "--seq-len", "1024", "--precision", "bf16",
                           "--gradient-checkpointing"),
    "llama-3-8b qlora": _cli("--model", LLAMA_8B, "--batch-size", "2", "--seq-len", "512", "--quantization", "4bit",
                             "--lora-r", "16"),
    "llama-3-8b 8bit lora": _cli("--model", LLAMA_8B, "--batch-size", "1", "--seq-len", "512", "--quantization",
                                 "8bit", "--lora-r", "8", "--lora-targets", "q_proj,v_proj"),
    "llama-3-8b qlora lean fp4": _cli("--model", LLAMA_8B, "--batch-size", "1", "--seq-len", "1024",
                                      "--quantization", "4bit", "--lora-r", "16", "--kbit-recipe", "lean",
                                      "--quant-type", "fp4", "--no-double-quant"),
    "llama-3.2-1b full bf16": _cli("--model", LLAMA_1B, "--batch-size", "1", "--seq-len", "2048", "--load-dtype",
                                   "bf16", "--precision", "bf16"),
    "llama-3.2-1b fp32 no padding": _cli("--model", LLAMA_1B, "--batch-size", "1", "--seq-len", "2048",
                                         "--no-padding"),
    "llama-3.2-3b lora adamw-8bit": _cli("--model", "meta-llama/Llama-3.2-3B", "--batch-size", "2", "--seq-len",
                                         "512", "--lora-r", "16", "--optimizer", "adamw-8bit", "--load-dtype",
                                         "bf16"),
    "mistral-7b qlora paged": _cli("--model", "mistralai/Mistral-7B-v0.3", "--batch-size", "1", "--seq-len", "1024",
                                   "--quantization", "4bit", "--lora-r", "16", "--optimizer", "paged-adamw-8bit"),
    "qwen2.5-0.5b lora": _cli("--model", QWEN_05B, "--batch-size", "4", "--seq-len", "512", "--lora-r", "16"),
    "qwen2.5-0.5b full sgd accum": _cli("--model", QWEN_05B, "--batch-size", "2", "--seq-len", "256", "--optimizer",
                                        "sgd", "--grad-accum", "4"),
    "qwen2.5-7b qlora eval": _cli("--model", "Qwen/Qwen2.5-7B", "--batch-size", "1", "--seq-len", "1024",
                                  "--quantization", "4bit", "--lora-r", "8", "--eval-batch-size", "4",
                                  "--eval-gather", "logits", "--eval-samples", "100"),
    "qwen3-0.6b full bf16 eager": _cli("--model", "Qwen/Qwen3-0.6B", "--batch-size", "2", "--seq-len", "512",
                                       "--precision", "bf16", "--attn", "eager"),
    "qwen3-8b qlora": _cli("--model", "Qwen/Qwen3-8B", "--batch-size", "1", "--seq-len", "2048", "--quantization",
                           "4bit", "--lora-r", "16"),
    "gemma-2-2b lora": _cli("--model", "google/gemma-2-2b", "--batch-size", "2", "--seq-len", "512", "--lora-r",
                            "8", "--load-dtype", "bf16"),
    "gemma-2-9b full adafactor": _cli("--model", "google/gemma-2-9b", "--batch-size", "1", "--seq-len", "512",
                                      "--optimizer", "adafactor", "--load-dtype", "bf16"),
    "gemma-3-1b full": _cli("--model", "google/gemma-3-1b-it", "--batch-size", "2", "--seq-len", "512"),
    "phi-3.5 qlora": _cli("--model", "microsoft/Phi-3.5-mini-instruct", "--batch-size", "1", "--seq-len", "1024",
                          "--quantization", "4bit", "--lora-r", "16", "--lora-targets", "qkv_proj"),
    "smollm2-135m full fp16": _cli("--model", "HuggingFaceTB/SmolLM2-135M", "--batch-size", "8", "--seq-len", "512",
                                   "--precision", "fp16"),
    "smollm2-360m full fp32": _cli("--model", "HuggingFaceTB/SmolLM2-360M-Instruct", "--batch-size", "8",
                                   "--seq-len", "512"),
    "tinyllama liger": _cli("--model", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "--batch-size", "4",
                            "--seq-len", "1024", "--precision", "bf16", "--liger-kernel"),
    "pythia-1b full": _cli("--model", "EleutherAI/pythia-1b", "--batch-size", "2", "--seq-len", "512"),
    "olmo2-7b qlora": _cli("--model", "allenai/OLMo-2-1124-7B", "--batch-size", "1", "--seq-len", "1024",
                           "--quantization", "4bit", "--lora-r", "16", "--lora-targets", "q_proj,v_proj"),
    "sft packing padding-free": _cli("--model", QWEN_05B, "--batch-size", "4", "--seq-len", "1024", "--padding-free",
                                     "--lora-r", "16", "--precision", "bf16"),
    "sft chunked nll": _cli("--model", QWEN_05B, "--batch-size", "4", "--seq-len", "1024", "--loss-type",
                            "chunked_nll", "--precision", "bf16"),
    "bert seq-cls": _cli("--model", "bert-base-uncased", "--batch-size", "16", "--seq-len", "256", "--task",
                         "seq-cls", "--num-labels", "3"),
    "roberta token-cls": _cli("--model", "roberta-base", "--batch-size", "16", "--seq-len", "256", "--task",
                              "token-cls", "--num-labels", "9"),
    "modernbert seq-cls fp16": _cli("--model", "answerdotai/ModernBERT-base", "--batch-size", "16", "--seq-len",
                                    "512", "--task", "seq-cls", "--num-labels", "2", "--precision", "fp16"),
    "distilbert seq-cls lora": _cli("--model", "distilbert-base-uncased", "--batch-size", "32", "--seq-len", "128",
                                    "--task", "seq-cls", "--num-labels", "2", "--lora-r", "8"),
    "deberta-v3 seq-cls": _cli("--model", "microsoft/deberta-v3-base", "--batch-size", "8", "--seq-len", "256",
                               "--task", "seq-cls", "--num-labels", "2"),
    "qwen2.5 seq-cls": _cli("--model", QWEN_05B, "--batch-size", "8", "--seq-len", "256", "--task", "seq-cls",
                            "--num-labels", "4"),
    "scenario 1 vocab head": _cli("--model", "distilgpt2+vocab-head", "--batch-size", "8", "--seq-len", "128"),
    "scenario 1 vocab head fp16": _cli("--model", "distilgpt2+vocab-head", "--batch-size", "4", "--seq-len", "64",
                                       "--precision", "fp16"),
    "llama-3-8b ddp lora": _cli("--model", LLAMA_8B, "--batch-size", "1", "--seq-len", "1024", "--lora-r", "16",
                                "--load-dtype", "bf16", "--strategy", "ddp", "--num-gpus", "2"),
    "llama-3-8b fsdp full": _cli("--model", LLAMA_8B, "--batch-size", "1", "--seq-len", "2048", "--precision",
                                 "bf16", "--strategy", "fsdp", "--num-gpus", "8", "--gradient-checkpointing"),
    "llama-3-8b zero2": _cli("--model", LLAMA_8B, "--batch-size", "1", "--seq-len", "1024", "--precision", "bf16",
                             "--strategy", "zero2", "--num-gpus", "4"),
    "llama-3-8b zero3 offload": _cli("--model", LLAMA_8B, "--batch-size", "1", "--seq-len", "1024", "--precision",
                                     "bf16", "--strategy", "zero3", "--num-gpus", "4", "--cpu-offload"),
    "llama-1b activation offloading": _cli("--model", LLAMA_1B, "--batch-size", "4", "--seq-len", "1024",
                                           "--precision", "bf16", "--gradient-checkpointing",
                                           "--activation-offloading", "--loss-type", "nll"),
    "llama-1b expandable ckpt every 2": _cli("--model", LLAMA_1B, "--batch-size", "4", "--seq-len", "1024",
                                             "--precision", "bf16", "--gradient-checkpointing",
                                             "--ckpt-every-n-layers", "2", "--expandable-segments"),
    "cpu preset gpt2": _cli("--model", "gpt2", "--batch-size", "8", "--seq-len", "1024", "--preset", "cpu"),
    "fit llama-3-8b qlora t4": _fit("--model", LLAMA_8B, "--batch-size", "2", "--seq-len", "512", "--quantization",
                                    "4bit", "--lora-r", "16", "--device", "colab-t4"),
    "fit scenario 1 t4": _fit("--model", "distilgpt2+vocab-head", "--batch-size", "8", "--seq-len", "128",
                              "--device", "colab-t4"),
    "fit llama-3-8b full t4": _fit("--model", LLAMA_8B, "--batch-size", "4", "--seq-len", "1024", "--device",
                                   "colab-t4"),
    "fit qwen2.5-0.5b a100": _fit("--model", QWEN_05B, "--batch-size", "64", "--seq-len", "2048", "--device",
                                  "a100-40"),
    "fit gemma-2-9b l4": _fit("--model", "google/gemma-2-9b", "--batch-size", "4", "--seq-len", "1024", "--lora-r",
                              "16", "--device", "l4"),
}


def _trl_rows():
    from peft import LoraConfig
    from trl import DPOConfig, GRPOConfig, SFTConfig

    from kit.estimate import estimate_from

    common = dict(output_dir="unused", use_cpu=True, report_to="none")
    grpo = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16, bf16=False)
    return {
        "dpo full": lambda: estimate_from("tiny-llama", dpo_config=DPOConfig(**common, bf16=False, max_length=51,
                                                                             per_device_train_batch_size=2,
                                                                             gradient_checkpointing=False),
                                          device="cpu"),
        "dpo lora": lambda: estimate_from("tiny-llama", dpo_config=DPOConfig(**common, bf16=False, max_length=51),
                                          peft_config=LoraConfig(r=8, target_modules=["q_proj"]), device="cpu"),
        "dpo 8b qlora cuda": lambda: estimate_from(LLAMA_8B, dpo_config=DPOConfig(**common, max_length=1024),
                                                   peft_config=LoraConfig(r=16, target_modules="all-linear")),
        "grpo beta 0": lambda: estimate_from("tiny-qwen2", grpo_config=GRPOConfig(**common, **grpo), seq_len=12,
                                             device="cpu"),
        "grpo beta 0.04": lambda: estimate_from("tiny-qwen2", grpo_config=GRPOConfig(**common, **grpo, beta=0.04),
                                                seq_len=12, device="cpu"),
        "grpo qwen 0.5b cuda": lambda: estimate_from(QWEN_05B, grpo_config=GRPOConfig(**common,
                                                                                      max_completion_length=256),
                                                     seq_len=128),
        "sft packing": lambda: estimate_from(QWEN_05B, sft_config=SFTConfig(**common, max_length=1024, packing=True,
                                                                            per_device_train_batch_size=4)),
        "sft lora": lambda: estimate_from(LLAMA_1B, sft_config=SFTConfig(**common, max_length=512),
                                          peft_config=LoraConfig(r=16, target_modules=["q_proj", "v_proj"])),
    }


def _trainer_rows():
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    from kit import data, models
    from kit.estimate import estimate_trainer

    ids = [[5 + (i * 7 + j) % 4000 for j in range(3 + (i * 11) % 35)] for i in range(40)]
    rows = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})

    def built(model, **args):
        targs = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", **args)
        collator = data.collator(data.shipped_tokenizer())
        return estimate_trainer(Trainer(model=model, args=targs, train_dataset=rows, data_collator=collator))

    def lora(name):
        return get_peft_model(models.build_model(name), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))

    return {
        "trainer tiny-llama full": lambda: built(models.build_model("tiny-llama"), per_device_train_batch_size=4),
        "trainer tiny-qwen2 lora": lambda: built(lora("tiny-qwen2"), per_device_train_batch_size=2,
                                                 gradient_checkpointing=True),
        "trainer tiny-gpt2 accum": lambda: built(models.build_model("tiny-gpt2"), per_device_train_batch_size=2,
                                                 gradient_accumulation_steps=4),
    }


def _run_cli(argv):
    from kit.cli.parser import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    assert out.getvalue(), f"python -m kit {' '.join(argv)} exited {code}: {err.getvalue()}"
    return {"exit": code, "json": json.loads(out.getvalue())}


def answers() -> dict:
    """Every row's answer, as the golden file keeps it."""
    warnings.filterwarnings("ignore")
    table = {name: _run_cli(argv) for name, argv in CLI_ROWS.items()}
    for name, make in {**_trl_rows(), **_trainer_rows()}.items():
        table[name] = json.loads(json.dumps(make().to_json()))
    return table


@pytest.fixture(scope="module")
def today():
    return answers()


def _names():
    return [*CLI_ROWS, *_trl_rows(), *_trainer_rows()]


def test_the_table_covers_at_least_40_setups():
    golden = json.loads(GOLDEN.read_text())
    assert len(golden) >= 40 and set(golden) == set(_names())


@pytest.mark.parametrize("name", _names())
def test_each_answer_is_byte_identical_to_the_golden_table(name, today):
    golden = json.loads(GOLDEN.read_text())
    assert name in golden, f"{name}: no golden answer yet: python tests/test_spine_golden.py --write"
    assert json.dumps(today[name], sort_keys=True) == json.dumps(golden[name], sort_keys=True), (
        f"{name}: the answer moved. If on purpose, regenerate: python tests/test_spine_golden.py --write")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("KIT_SMOKE", "1")
    GOLDEN.write_text(json.dumps(answers(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(json.loads(GOLDEN.read_text()))} setups)")
