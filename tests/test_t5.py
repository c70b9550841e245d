"""Flan-T5 (an encoder-decoder, replayed whole) fine-tuned with transformers' Seq2SeqTrainer: the replay's saved bytes
against autograd's saved-tensor hooks, estimate_trainer against the independent meter of benchmarks/real_clients.py
over real Seq2SeqTrainer steps (step 1, the steady step, evaluate() with and without generation) on the tiny twin,
full fine-tuning and LoRA on q and v; `kit fit` on google/flan-t5-base; what is refused, by name."""
import dataclasses
import json
import os
import sys
import warnings

import pytest
import torch
from transformers import AutoConfig, Seq2SeqTrainingArguments, T5ForConditionalGeneration, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

import clients_t5  # noqa: E402
import real_clients as rc  # noqa: E402

from kit import inputs  # noqa: E402
from kit.estimate import estimate, seq2seq  # noqa: E402
from kit.estimate.replay import Setup, replay  # noqa: E402
from kit.estimate.replay.t5 import shapes  # noqa: E402
from kit.model_configs import CONFIG_DIR  # noqa: E402
from fit_answer import fit_answer  # noqa: E402

warnings.filterwarnings("ignore")
BAND = (0.98, 1.02)
# LoRA on q and v: the leaves' names inside a block, encoder's and decoder's (self- and cross-attention)
LORA_QV = {f"layer.{i}.{m}.{p}": 8 for i, m in ((0, "SelfAttention"), (1, "EncDecAttention")) for p in "qv"}


@pytest.mark.parametrize("lora", [False, True])
def test_replay_saves_what_autograd_saves(lora):
    """One training forward of the tiny twin (B 4, source 48, target 24, dropout 0.1, sdpa's math path on the CPU):
    the replay's saved bytes are the unique storages the saved-tensor hooks see (parameters and inputs aside), but for
    CrossEntropyLoss's 4-byte total weight."""
    from peft import LoraConfig, get_peft_model

    cfg = AutoConfig.from_pretrained(CONFIG_DIR / "tiny-flan-t5.json")
    B, source, target = 4, 48, 24
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg).train()
    if lora:
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q", "v"], lora_dropout=0.05,
                                                 task_type="SEQ_2_SEQ_LM"))
    ids, labels, dec = (torch.randint(2, cfg.vocab_size, (B, n)) for n in (source, target, target))
    outside = {t.untyped_storage().data_ptr() for t in (*model.parameters(), ids, labels, dec)}
    seen = {}

    def pack(t):   # (returns a detached view: a saved output that packed itself would leak in a reference cycle
        if t.untyped_storage().data_ptr() not in outside:   # through its own grad_fn, as torch's docs warn)
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=labels, decoder_input_ids=dec)
    st = Setup(family="t5", B=B, S=source, S_dec=target, V=cfg.vocab_size, device="cpu", padded=False,
               base_trainable=not lora, lora=LORA_QV if lora else {}, lora_dropout=0.05 if lora else 0.0,
               **shapes(cfg))
    assert sum(seen.values()) - replay(st).saved_bytes() == 4


@pytest.mark.parametrize("kind,generate,vocab", [("full-eval", False, None), ("lora-eval", False, None),
                                                 ("full-pad-eval", False, None), ("full-eval", True, None),
                                                 ("lora-eval", True, None), ("full-eval", False, 256),
                                                 ("lora-eval", False, 256)])
def test_i48_seq2seq_trainer_within_2_percent(tmp_path, kind, generate, vocab):
    """Refused before ("an encoder-decoder model, not a causal language model"). Step 1, the steady step and
    evaluate() (with generation: predict_with_generate, generation_max_length 12, a compute_metrics), each at the
    source and target lengths the collator really made. With the twin's vocabulary cut to 256, the blocks set the
    peaks (the forward at the loss with the KV cache; the no-grad loop's feed-forward), not the logits."""
    _, setup, est, peaks = rc.run_trainer_client(clients_t5.client_t5(str(tmp_path), kind, generate, vocab),
                                                 rc.ProfilerMeter)
    assert (est.setup["seq_len"], est.sources["target_len"][0]) == (clients_t5.SOURCE, clients_t5.TARGET)
    assert est.kind == "seq2seq" and bool(est.setup["lora_r"]) == kind.startswith("lora")
    first, steady, ev = rc.step_ratios(est, peaks)
    print(f"{setup}: estimate/measured step 1 {first:.4f}, steady {steady:.4f}, evaluate {ev:.4f}")
    assert all(BAND[0] <= r <= BAND[1] for r in (first, steady, ev)), (first, steady, ev, peaks, peaks.evaluate)


def test_fit_answers_flan_t5_base_in_five_lines(capsys):
    """`python -m kit fit --model google/flan-t5-base --batch-size 8 --seq-len 512 --device colab-t4`: the answer
    (the lines before the other changes, a wrapped line counted with its own) in at most 5 lines."""
    from kit.cli import main

    main(["fit", "--model", "google/flan-t5-base", "--batch-size", "8", "--seq-len", "512", "--device", "colab-t4"])
    said, answer = fit_answer(capsys.readouterr().out)
    assert said[0].startswith(("fits Colab T4", "DOES NOT FIT Colab T4")) and len(answer) <= 5
    assert said[-1].startswith("details: --details")


def test_the_target_length_is_read_given_or_said_assumed():
    given = estimate("tiny-flan-t5", batch_size=2, seq_len=64, target_len=16)
    assumed = estimate("tiny-flan-t5", batch_size=2, seq_len=64)
    assert given.peak_bytes < assumed.peak_bytes
    assert [n.code for n in assumed.notes if n.code == "target-len-assumed"] and not \
        [n for n in given.notes if n.code == "target-len-assumed"]
    with pytest.raises(inputs.InputError) as e:
        estimate("tiny-llama", batch_size=2, seq_len=64, target_len=16)
    assert e.value.name == "target_len" and str(e.value).count(". ") == 0


@pytest.mark.parametrize("option,value,said", [("gradient_checkpointing", True, "gradient checkpointing"),
                                               ("load_dtype", "bf16", "half precision"),
                                               ("liger_kernel", True, "Liger")])
def test_what_the_replay_does_not_follow_is_refused_by_name(option, value, said):
    with pytest.raises(inputs.InputError) as e:
        estimate("tiny-flan-t5", batch_size=2, seq_len=32, **{option: value})
    assert said in str(e.value) and str(e.value).count(". ") == 0


def test_t5_v1_0s_scaled_decoder_output_is_refused_by_name(tmp_path):
    """transformers 5.25's T5Config ties the LM head to ``shared`` always, and scales the decoder's output unless the
    config says ``tie_word_embeddings: false`` (Flan-T5's does): a T5 v1.0 config is refused, naming it."""
    raw = json.loads((CONFIG_DIR / "tiny-flan-t5.json").read_text())
    del raw["tie_word_embeddings"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="scale_decoder_outputs"):
        estimate(str(path), batch_size=2, seq_len=32)


def test_every_seq2seq_argument_is_modeled_or_listed():
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)} - base
    assert own == set(seq2seq.MODELED) | set(seq2seq.NO_MEMORY) and not set(seq2seq.MODELED) & set(seq2seq.NO_MEMORY)


def test_beams_are_refused_by_name(tmp_path):
    trainer = clients_t5.trainer_of(str(tmp_path), "full-eval", generate=True)
    trainer.args.generation_num_beams = 4
    with pytest.raises(inputs.InputError) as e:
        from kit.estimate import estimate_trainer
        estimate_trainer(trainer, device="cpu")
    assert e.value.name == "generation_num_beams" and "generation_num_beams=4" in str(e.value)
