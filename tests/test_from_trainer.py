"""estimate_trainer / estimate_from / check: the user's own objects give the same bytes as the matching
estimate(...) call, on tiny twins with real Trainers, peft and bitsandbytes (CPU, offline)."""
import contextlib
import io
import re
import warnings

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import BitsAndBytesConfig, Trainer, TrainingArguments

import kit
from kit import data, models
from kit.advise import check
from kit.estimate import estimate, estimate_from, estimate_trainer
from kit.estimate.quantization import recipe_reentrant
from kit.estimate.read_model import _adapter
from kit.inputs import InputError
from kit.presets import resolve_device, verdict
from kit.units import fmt_bytes

warnings.filterwarnings("ignore", category=FutureWarning)
BYTES = ("params", "trainable_params", "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
         "logits_bytes", "peak_bytes", "cpu_build_bytes", "loaded_weights_bytes", "paged_optimizer_bytes",
         "autocast_copies_bytes", "saved_bytes", "quantized_params", "unquantized_params", "peak_moment",
         "offenders", "components", "first_step_peak_bytes", "eval_peak_bytes", "eval_moment")


def same(got, want):
    a, b = got.to_json(), want.to_json()
    diff = {k: (a[k], b[k]) for k in BYTES if a[k] != b[k]}
    assert not diff, diff


def first_trainable_outside_lora(model) -> str:
    """The first trainable parameter outside the LoRA adapters, named as the kit's refusal names it. Which modules
    modules_to_save=["norm"] copies is peft's: every name ending in "norm" before 0.22, model.norm alone since."""
    return next(n for n, p in model.get_base_model().named_parameters() if p.requires_grad and not _adapter(n))


@pytest.fixture(scope="module")
def tok():
    return data.shipped_tokenizer()


@pytest.fixture(scope="module")
def ds(tok):
    # rows of 3..40 tokens, the longest (40) in row 37: the collator pads each batch to its longest row
    ids = [[5 + (i * 7 + j) % 4000 for j in range(3 + (i * 11) % 35)] for i in range(80)]
    ids[37] = list(range(5, 45))
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids],
                              "text": ["x"] * len(ids)})  # Trainer drops "text" before collating


def trainer(model, ds, tok, **kw):
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", **kw)
    return Trainer(model=model, args=args, train_dataset=ds, data_collator=data.collator(tok))


@pytest.mark.parametrize("metrics,preprocess,loss_only,gather", [
    (None, None, False, "loss"),
    (lambda p: {}, None, False, "logits"),
    (lambda p: {}, lambda logits, labels: logits.argmax(-1), False, "preprocessed"),
    (lambda p: {}, None, True, "loss"),            # prediction_loss_only wins over compute_metrics
])
def test_the_evaluation_is_read_from_the_trainer(ds, tok, metrics, preprocess, loss_only, gather):
    model = models.build_model("tiny-gpt2")
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", per_device_train_batch_size=4,
                             per_device_eval_batch_size=16, eval_accumulation_steps=3, prediction_loss_only=loss_only)
    tr = Trainer(model=model, args=args, train_dataset=ds, eval_dataset=ds.select(range(50)),
                 data_collator=data.collator(tok), compute_metrics=metrics, preprocess_logits_for_metrics=preprocess)
    est = estimate_trainer(tr)
    assert est.sources["eval_gather"][0] == gather and est.sources["eval_samples"][0] == 50
    assert est.sources["eval_batch_size"] == (16, "TrainingArguments.per_device_eval_batch_size")
    same(est, estimate("tiny-gpt2", batch_size=4, seq_len=40, gradient_checkpointing=False, eval_batch_size=16,
                       eval_gather=gather, eval_samples=50, eval_accumulation_steps=3))


def test_full_fine_tune_fp32_reads_everything(ds, tok):
    model = models.load_model("tiny-llama", device="cpu")
    est = estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=4, optim="adamw_torch"))
    same(est, estimate("tiny-llama", batch_size=4, seq_len=40, gradient_checkpointing=False, optimizer="adamw"))
    s = est.sources
    assert s["batch_size"] == (4, "TrainingArguments.per_device_train_batch_size")
    assert s["optimizer"] == ("adamw", "TrainingArguments.optim='adamw_torch'")
    assert s["seq_len"][0] == 40 and "data_collator" in s["seq_len"][1] and s["padded"][0] is True
    assert s["load_dtype"][0] == "fp32" and s["quantization"][0] == "none" and s["tied_weights"][0] is False
    assert s["trainable_params"][0] == est.trainable_params == sum(p.numel() for p in model.parameters())


def test_seq_len_is_the_longest_padded_batch(ds, tok):
    model = models.load_model("tiny-gpt2", device="cpu")
    tr = trainer(model, ds, tok, per_device_train_batch_size=3)
    rows = [{"input_ids": r} for r in ds["input_ids"][:64]]
    longest = max(tr.data_collator(rows[i:i + 3])["input_ids"].shape[1] for i in range(0, 64, 3))
    est = estimate_trainer(tr)
    assert est.setup["seq_len"] == longest == 40
    # rows of one length: no padding, so no attention mask is built
    flat = Dataset.from_dict({"input_ids": [list(range(5, 37))] * 16, "attention_mask": [[1] * 32] * 16})
    est = estimate_trainer(trainer(model, flat, tok, per_device_train_batch_size=4))
    assert (est.setup["seq_len"], est.sources["padded"][0]) == (32, False)
    same(est, estimate("tiny-gpt2", batch_size=4, seq_len=32, padded=False, gradient_checkpointing=False))
    given = estimate_trainer(tr, seq_len=16)
    assert given.setup["seq_len"] == 16 and given.sources["seq_len"][1] == "estimate_trainer(seq_len=...)"


@pytest.mark.parametrize("name,targets", [("tiny-llama", ("q_proj", "v_proj")), ("tiny-gpt2", ("c_attn",))])
def test_lora_grad_accum_and_an_explicit_optim(ds, tok, name, targets):
    model = get_peft_model(models.load_model(name, device="cpu"), LoraConfig(r=8, lora_dropout=0.1,
                                                                            task_type="CAUSAL_LM"))
    est = estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=2, gradient_accumulation_steps=4,
                                   optim="adamw_bnb_8bit"))
    same(est, estimate(name, batch_size=2, seq_len=40, lora_r=8, lora_targets=targets, lora_dropout=0.1,
                       grad_accum=4, optimizer="adamw-8bit", gradient_checkpointing=False))
    assert est.sources["lora_targets"][0] == targets and est.sources["grad_accum"][0] == 4


def test_qlora_4bit_with_prepare_model_for_kbit_training(ds, tok):
    model = prepare_model_for_kbit_training(models.load_model("tiny-llama", quantization="4bit", device="cpu"))
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    tr = trainer(model, ds, tok, per_device_train_batch_size=2, bf16=True, optim="paged_adamw_8bit")
    est = estimate_trainer(tr)
    want = estimate("tiny-llama", batch_size=2, seq_len=40, lora_r=4, lora_targets="all-linear", quantization="4bit",
                    load_dtype="bf16", precision="bf16", optimizer="paged-adamw-8bit", gradient_checkpointing=True,
                    checkpoint_reentrant=recipe_reentrant())  # the recipe's own checkpointing, as peft runs it
    same(est, want)
    s = est.sources
    assert (s["quantization"][0], s["kbit_recipe"][0], s["gradient_checkpointing"][0]) == ("4bit", "standard", True)
    # the same setup written before loading anything
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    same(estimate_from("tiny-llama", tr.args, bnb, LoraConfig(r=4, target_modules="all-linear"), seq_len=40,
                       load_dtype=torch.bfloat16), want)


def test_8bit_lora(ds, tok):
    model = get_peft_model(prepare_model_for_kbit_training(models.load_model("tiny-gpt2", quantization="8bit",
                                                                             device="cpu")),
                           LoraConfig(r=4, target_modules=["c_attn", "c_fc"], task_type="CAUSAL_LM"))
    est = estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=2))
    same(est, estimate("tiny-gpt2", batch_size=2, seq_len=40, quantization="8bit", lora_r=4,
                       lora_targets=["c_attn", "c_fc"], load_dtype="bf16", gradient_checkpointing=True,
                       checkpoint_reentrant=recipe_reentrant()))
    # prepare_model_for_kbit_training's, read off the layers: reentrant before peft 0.22, non-reentrant since
    assert est.sources["checkpoint_reentrant"][0] is recipe_reentrant()


def test_gradient_checkpointing_from_the_args_or_the_model(ds, tok):
    model = models.load_model("tiny-llama", device="cpu")
    est = estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=2, activation_checkpointing=True))
    same(est, estimate("tiny-llama", batch_size=2, seq_len=40, gradient_checkpointing=True))
    assert est.sources["gradient_checkpointing"] == (True, "TrainingArguments.activation_checkpointing")
    model = models.load_model("tiny-gpt2", device="cpu")
    model.gradient_checkpointing_enable()
    est = estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=2, optim="sgd",
                                   optim_args="momentum=0.9"))
    same(est, estimate("tiny-gpt2", batch_size=2, seq_len=40, gradient_checkpointing=True, optimizer="sgd"))
    assert "model's layers" in est.sources["gradient_checkpointing"][1]


def test_scenario_1_vocab_head_module(ds, tok):
    model = models.load_model("tiny-gpt2+vocab-head", device="cpu")
    est = estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=2))
    same(est, estimate("tiny-gpt2+vocab-head", batch_size=2, seq_len=40))


def test_estimate_from_real_objects():
    args = TrainingArguments(output_dir="unused", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             optim="adamw_8bit", fp16=True)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float16)
    lora = LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.05)
    est = estimate_from("meta-llama/Meta-Llama-3-8B", args, bnb, lora, seq_len=512)
    same(est, estimate("meta-llama/Meta-Llama-3-8B", batch_size=4, seq_len=512, grad_accum=2, precision="fp16",
                       optimizer="adamw-8bit", quantization="4bit", load_dtype="bf16", lora_r=16,
                       lora_targets="q_proj,k_proj,v_proj,o_proj", lora_dropout=0.05))
    assert est.sources["load_dtype"][0] == "bf16" and "config's dtype" in est.sources["load_dtype"][1]
    assert est.sources["lora_targets"][0] == ("k_proj", "o_proj", "q_proj", "v_proj")
    # no arguments: TrainingArguments() defaults (batch 8, adamw_torch_fused: the estimate's default too)
    est = estimate_from("tiny-gpt2", seq_len=64)
    same(est, estimate("tiny-gpt2", batch_size=8, seq_len=64, gradient_checkpointing=False))
    assert est.sources["optimizer"] == ("adamw-fused", "TrainingArguments().optim='adamw_torch_fused'")
    # LoRA on the first block only: exact module names, and a note on the replay
    est = estimate_from("tiny-llama", args, peft_config=LoraConfig(r=4, target_modules=["q_proj"],
                                                                    layers_to_transform=[0]), seq_len=32)
    assert est.sources["lora_targets"][0] == ("model.layers.0.self_attn.q_proj",)
    assert any("differ between blocks" in n for n in est.notes)


@pytest.mark.parametrize("kw,match", [
    (dict(args=dict(optim="adagrad")), "optim='adagrad' is not modeled"),
    (dict(args=dict(optim="sgd")), "without a momentum"),
    (dict(args=dict(torch_compile=True)), "torch_compile"),
    (dict(bnb=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float64)), "compute_dtype"),
    (dict(lora=LoraConfig(r=4, lora_bias=True)), "LoraConfig.lora_bias=True"),
    (dict(lora=LoraConfig(r=4, modules_to_save=["norm"])), "modules_to_save names 'norm'"),
    (dict(lora=LoraConfig(r=4, target_modules=["embed_tokens"])), "not a Linear layer"),
    (dict(model="t5"), "scales the decoder's output"),   # (T5 v1.0's config; Flan-T5's is replayed)
])
def test_estimate_from_refuses_in_one_sentence(kw, match):
    from transformers import T5Config

    args = TrainingArguments(output_dir="unused", use_cpu=True, **kw.get("args", {}))
    model = T5Config(num_layers=2, d_model=32, num_heads=2, d_ff=64) if kw.get("model") else "tiny-llama"
    with pytest.raises(ValueError, match=match) as exc:
        estimate_from(model, args, kw.get("bnb"), kw.get("lora"), seq_len=32)
    msg = str(exc.value)
    assert "\n" not in msg and msg.endswith(".")


def test_estimate_trainer_refuses_in_one_sentence(ds, tok):
    from transformers import GPT2ForSequenceClassification

    cls = GPT2ForSequenceClassification(models.get_config("tiny-gpt2"))
    labelled = ds.remove_columns("text").add_column("labels", [0] * len(ds))
    est = estimate_trainer(trainer(cls, labelled, tok, per_device_train_batch_size=2))   # a classifier: modeled
    assert est.sources["task"][0] == "seq-cls" and est.setup["num_labels"] == 2
    model = get_peft_model(models.load_model("tiny-llama", device="cpu"),
                           LoraConfig(r=4, modules_to_save=["norm"], task_type="CAUSAL_LM"))
    found = re.escape(f"outside the LoRA adapters are trainable ({first_trainable_outside_lora(model)}")
    with pytest.raises(ValueError, match=rf"{found}.*does not model.*: freeze them, or measure"):
        estimate_trainer(trainer(model, ds, tok))
    with pytest.raises(ValueError, match="not a Trainer|reads a transformers Trainer"):
        estimate_trainer(model)


def test_check_prints_the_table_the_verdict_and_the_sources(ds, tok):
    model = models.load_model("tiny-gpt2", device="cpu")
    tr = trainer(model, ds, tok, per_device_train_batch_size=2)
    out, full = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out):
        est = kit.check(tr)
    with contextlib.redirect_stdout(full):
        kit.check(tr, details=True)
    text, details = out.getvalue(), full.getvalue()
    # the answer first, in at most 15 lines: the verdict names the figure judged (reserved) and the limit
    v = verdict(est, resolve_device(None)[0])
    assert text.startswith(v.text.split(":")[0] + f": {fmt_bytes(est.reserved_bytes)} reserved (modelled) of ")
    assert len(text.splitlines()) <= 15 and "PEAK" not in text and "details=True" in text
    # the details: the table, where each setting was read from
    assert est.peak_bytes > 0 and "PEAK" in details and "where each setting was read from" in details
    assert "TrainingArguments.per_device_train_batch_size" in details
    if not torch.cuda.is_available():
        assert "no GPU was found here, so this was judged against the colab-t4 preset" in text
    for device, label in (("l4", "L4"), (est.peak_bytes - 1, "DOES NOT FIT a GPU with")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert check(est, device=device) is est
        assert label in out.getvalue()
    with pytest.raises(ValueError, match="device must be"):
        check(est, device="tpu")


def test_check_judges_against_this_gpu(monkeypatch):
    """Faked readings: what torch can have is the driver's free memory plus what this torch reserved."""
    from kit import machine
    from kit.presets import resolve_device

    GiB = 1024**3
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    monkeypatch.setattr(machine, "compute_capability", lambda: (7, 5))
    monkeypatch.setattr(machine, "hardware", lambda: {"gpu_name": "Tesla T4", "gpu_total_bytes": 15 * GiB,
                                                      "ram_total_bytes": 12 * GiB})
    monkeypatch.setattr(machine, "gpu_bytes_for_torch", lambda: 14 * GiB)   # 1 GiB used outside this torch
    preset, why = resolve_device(None)
    assert (preset.gpu_bytes, preset.ram_bytes, preset.capability, why) == (14 * GiB, 12 * GiB, (7, 5), None)
    assert "this GPU (Tesla T4: 14.00 GiB for torch of 15.00 GiB" in preset.label
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(estimate_from("tiny-gpt2", seq_len=32))
    assert out.getvalue().startswith("fits this GPU: ") and "of 14.00 GiB" in out.getvalue().splitlines()[0]


def test_seq_len_reads_the_longest_row_of_the_whole_dataset(tok):
    """Issue 25 item 21: a 250-token row at index 150, past the first 64 rows, sets the longest batch."""
    ids = [[5 + (i + j) % 4000 for j in range(10)] for i in range(200)]
    ids[150] = [7] * 250
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})
    est = estimate_trainer(trainer(models.load_model("tiny-gpt2", device="cpu"), ds, tok,
                                   per_device_train_batch_size=4))
    assert est.setup["seq_len"] == 250 and est.sources["padded"][0] is True and "of all 200 rows" in \
        est.sources["seq_len"][1]


@pytest.mark.parametrize("make,kind", [
    (lambda: __import__("peft").IA3Config(task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj", "down_proj"],
                                          feedforward_modules=["down_proj"]), "IA3"),
    (lambda: __import__("peft").PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8), "PROMPT_TUNING"),
])
def test_other_peft_methods_are_refused_for_what_they_are(ds, tok, make, kind):
    """Issue 25 item 19: IA3 was refused as 'a peft Linear adapter', prompt tuning estimated as a frozen model."""
    model = get_peft_model(models.load_model("tiny-llama", device="cpu"), make())
    with pytest.raises(kit.inputs.InputError) as e:
        estimate_trainer(trainer(model, ds, tok, per_device_train_batch_size=2))
    assert kind in str(e.value) and "LoRA" in str(e.value) and e.value.code == "peft-not-lora"


def test_each_source_names_what_really_set_it():
    """Issue 25 item 9: a setting the user did not pass is credited to an assumption, never to their argument."""
    assumed = estimate_from("tiny-gpt2", seq_len=64)
    assert assumed.sources["padded"][1].startswith("assumed")
    assert estimate_from("tiny-gpt2", seq_len=64, padded=False).sources["padded"] \
        == (False, "estimate_from(padded=...)")
    from kit.estimate.read_model import read_model
    from kit.models import build_model

    model = build_model("tiny-gpt2", device="meta")
    src = read_model(model)[2]
    assert src["attn_implementation"] == (model.config._attn_implementation, "model.config._attn_implementation")
    model.config._attn_implementation = None      # a config that names no attention
    src = read_model(model)[2]
    assert src["attn_implementation"][0] == "sdpa" and src["attn_implementation"][1].startswith("assumed")


def test_a_dict_of_training_arguments_is_read_and_a_wrong_keyword_is_named():
    """Issue 25 item 20: a dict as TrainingArguments was an AttributeError from deep inside the reader."""
    est = estimate_from("tiny-gpt2", {"per_device_train_batch_size": 2}, seq_len=64)
    assert est.sources["batch_size"][0] == 2 and est.setup["batch_size"] == 2
    with pytest.raises(InputError, match="batch_size") as exc:
        estimate_from("tiny-gpt2", {"batch_size": 2}, seq_len=64)
    assert exc.value.name == "training_args"


def test_4bit_weights_stored_as_bf16_are_read_as_4bit(tmp_path):
    """Issue 25 item 19: with bnb_4bit_quant_storage=bfloat16 (peft's FSDP-QLoRA recipe) the packed weights are
    bf16 tensors; they are still 4-bit layers, counted as such, not unquantized parameters of mixed dtypes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from kit.estimate import estimate
    from kit.estimate.read_model import read_model
    from kit.models import build_model

    build_model("tiny-llama").save_pretrained(tmp_path)
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    base = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=q, dtype=torch.bfloat16, device_map="cpu")
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    target, opts, src, _ = read_model(model)
    assert opts["quantization"] == "4bit"
    mine = estimate(target, batch_size=1, seq_len=32, **opts)
    shipped = estimate("tiny-llama", batch_size=1, seq_len=32, quantization="4bit", lora_r=8,
                       lora_targets="q_proj,v_proj", load_dtype="bf16")
    assert (mine.quantized_params, mine.trainable_params) == (shipped.quantized_params, shipped.trainable_params)


def test_i35_14_a_4bit_model_read_before_a_step_is_read_the_same_after_it(ds, tok):
    """bitsandbytes' Linear4bit casts its fp32 bias (prepare_model_for_kbit_training's upcast) to the compute dtype
    in place at its first forward: the model is read the same before and after a training step, never refused."""
    model = prepare_model_for_kbit_training(models.load_model("tiny-qwen2", quantization="4bit", device="cpu"))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    tr = trainer(model, ds, tok, per_device_train_batch_size=2, bf16=True)
    before = estimate_trainer(tr, seq_len=40)
    biases = [m.bias for m in model.modules() if type(m).__name__ == "Linear4bit" and m.bias is not None]
    assert biases and {b.dtype for b in biases} == {torch.float32}
    ids = torch.randint(5, 100, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert {b.dtype for b in biases} == {torch.bfloat16}          # bitsandbytes cast them in place
    after = estimate_trainer(tr, seq_len=40)
    assert after.sources["kbit_recipe"][0] == "standard" and after.peak_bytes == before.peak_bytes


def test_i35_15_the_padded_source_says_what_was_seen(ds, tok):
    """Rows of one length and no 0 in the mask: the source says so, not the words for a padded batch."""
    full = Dataset.from_dict({"input_ids": [[5 + (i + j) % 90 for j in range(16)] for i in range(8)],
                              "attention_mask": [[1] * 16 for _ in range(8)]})
    est = estimate_trainer(trainer(models.load_model("tiny-llama", device="cpu"), full, tok,
                                   per_device_train_batch_size=2))
    assert est.sources["padded"] == (False, "every row of a batch the same length, no 0 in its attention_mask")
    est = estimate_trainer(trainer(models.load_model("tiny-llama", device="cpu"), ds, tok,
                                   per_device_train_batch_size=2))
    assert est.sources["padded"] == (True, "rows of different lengths in a batch, or a 0 in its attention_mask")


def test_i35_15_a_trainable_head_beside_lora_is_refused_without_wrong_advice():
    from kit.estimate.read_model import read_model

    model = get_peft_model(models.load_model("tiny-llama", device="cpu"),
                           LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["norm"],
                                      task_type="CAUSAL_LM"))
    with pytest.raises(ValueError) as e:
        read_model(model)
    text = str(e.value)
    found = f"outside the LoRA adapters are trainable ({first_trainable_outside_lora(model)}"
    assert "train the adapters alone" not in text and "freeze them" in text and found in text, text
    assert "does not model" in text, text
