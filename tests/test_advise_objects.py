"""The fit advisor's suggestions in the user's own objects (kit.advise.objects): a suggestion applied to copies of
a Trainer's args, of estimate_from's TrainingArguments / LoraConfig / BitsAndBytesConfig and of an SFTConfig
re-estimates to the suggestion's own peak (the same setup, so the same number), the user's objects stay as they
were, and the printed code, run, makes the same objects as apply()."""
import contextlib
import copy
import io
import warnings

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import Trainer, TrainingArguments
from trl import SFTConfig

import kit
from kit import data, models
from kit.advise import advise
from kit.advise.objects import apply, in_objects
from kit.advise.search import MIN_ROW_TOKENS, Suggestion
from kit.estimate import estimate, estimate_from, estimate_trainer
from kit.inputs import InputError

warnings.filterwarnings("ignore", category=FutureWarning)
MODEL = "tiny-llama"


def _suggestion(changes: dict, cli: str = "", peak: int = 0, options: dict | None = None) -> Suggestion:
    """A suggestion that fits, made by hand: ``changes`` (the CLI's options) and, where given, its peak and setup."""
    return Suggestion(changes=changes, cli=cli, peak_bytes=peak, fits=True, margin_bytes=0, costs=[], tiers=(0,),
                      cpu_build_bytes=0, eval_peak_bytes=0, options=options or {})


def _args(**kw):
    return TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", **kw)


def _sft(**kw):
    return SFTConfig(output_dir="unused", use_cpu=True, report_to="none", bf16=False, **kw)


def _ran(code: str, **objects) -> dict:
    ns = dict(objects)
    exec(code, ns)  # noqa: S102 (the printed code, run as a user pastes it)
    return ns


def _first(a, option: str, value=None):
    """The best-ranked suggestion that changes ``option`` (to ``value``, where given)."""
    return next(s for s in a.suggestions if option in s.changes and value in (None, s.changes[option]))


def test_a_trainer_suggestion_applied_to_its_args(tmp_path):
    tok = data.shipped_tokenizer()
    ids = [[5 + (i * 7 + j) % 4000 for j in range(40)] for i in range(16)]
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 40 for _ in ids]})
    model = models.load_model(MODEL, device="cpu")
    tr = Trainer(model=model, train_dataset=ds, data_collator=data.collator(tok),
                 args=_args(per_device_train_batch_size=8))
    before = copy.deepcopy(tr.args.to_dict())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        est = kit.check(tr, device=40_000_000, details=True)
    s = advise(tr, 40_000_000, trainer_estimate=est).suggestions[0]
    assert s.fits and s.changes == {"batch-size": 1, "grad-accum": 8}
    new = apply(s, trainer=tr)
    assert sorted(new) == ["args"] and type(new["args"]) is TrainingArguments
    assert (new["args"].per_device_train_batch_size, new["args"].gradient_accumulation_steps, new["args"].optim) == \
        (1, 8, tr.args.optim)
    assert tr.args.to_dict() == before and new["args"] is not tr.args          # a copy; the user's args as they were
    again = estimate_trainer(Trainer(model=model, train_dataset=ds, data_collator=data.collator(tok), args=new["args"]))
    assert (again.peak_bytes, again.reserved_bytes) == (s.peak_bytes, s.reserved_bytes)
    plan = in_objects(s, tr)
    line = "args = dataclasses.replace(trainer.args, per_device_train_batch_size=1, gradient_accumulation_steps=8)"
    assert plan.statements() == [line] and f"in your objects: {line}" in " ".join(out.getvalue().split())
    assert _ran(plan.code, trainer=tr)["args"] == new["args"]
    assert in_objects(s, est).code == plan.code                     # the Estimate remembers the Trainer's objects


def test_estimate_from_a_new_lora_and_checkpointing():
    args = _args(per_device_train_batch_size=8)
    est = estimate_from(MODEL, args, seq_len=128, device="cpu")
    limit = int(est.peak_bytes * 0.15)
    s = advise(est, limit, safety=0).suggestions[0]
    assert s.changes == {"batch-size": 1, "grad-accum": 8, "lora-r": 16, "gradient-checkpointing": True,
                         "ckpt-every-n-layers": 2}   # every other block: the cheaper checkpointing is enough
    new = apply(s, training_args=args)
    assert sorted(new) == ["peft_config", "training_args"] and args.per_device_train_batch_size == 8
    assert not args.activation_checkpointing and new["training_args"].activation_checkpointing
    assert new["training_args"].activation_checkpointing_kwargs == {"every_n_layers": 2}
    assert (new["peft_config"].r, new["peft_config"].target_modules) == (16, None)   # peft's default targets
    again = estimate_from(MODEL, seq_len=128, device="cpu", **new)
    assert again.peak_bytes == s.peak_bytes
    got = _ran(in_objects(s, est).code, training_args=args)
    assert got["training_args"] == new["training_args"] and got["peft_config"] == new["peft_config"]


def test_estimate_from_lora_and_an_8bit_suggestion():
    """Llama 3 8B with LoRA in bf16 does not fit a T4: a BitsAndBytesConfig is made, the LoraConfig is copied."""
    name = "meta-llama/Meta-Llama-3-8B"
    args, lora = _args(per_device_train_batch_size=1), LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.05)
    est = estimate_from(name, args, peft_config=lora, seq_len=512)
    s = _first(advise(est, "colab-t4"), "quantization")
    assert s.fits and s.changes["quantization"] == "8bit"
    new = apply(s, training_args=args, peft_config=lora)
    q = new["quantization_config"]
    assert q.load_in_8bit and not q.load_in_4bit and new["peft_config"] == lora and new["peft_config"] is not lora
    again = estimate_from(name, seq_len=512, **new)
    assert again.peak_bytes == s.peak_bytes
    assert lora.r == 16 and est.inputs["quantization_config"] is None
    got = _ran(in_objects(s, est).code, training_args=args, peft_config=lora)
    assert got["quantization_config"] == q and got["training_args"] == new["training_args"]
    # with the 5% margin kept (kit.presets.MODELLED_MARGIN), 8-bit weights need the checkpoints offloaded too
    assert s.changes["gradient-checkpointing"] and in_objects(s, est).fields["training_args"] == {
        "activation_checkpointing": True, "activation_checkpointing_kwargs": {"offload": True}}


def test_estimate_from_a_4bit_suggestion_with_checkpointing():
    args = _args(per_device_train_batch_size=4, activation_checkpointing=True)
    est = estimate_from(MODEL, args, seq_len=128, device="cpu")
    s = _first(advise(est, int(est.peak_bytes * 0.25), safety=0), "quantization", "4bit")
    assert s.changes["lora-targets"] == "all-linear" and s.changes["gradient-checkpointing"]
    new = apply(s, training_args=args)
    q = new["quantization_config"]
    assert (q.load_in_4bit, q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant, str(q.bnb_4bit_compute_dtype)) == \
        (True, "nf4", True, "torch.bfloat16")
    again = estimate_from(MODEL, device="cpu", **{"seq_len": 128, **new})   # (a Trainer's rows: no object holds them)
    assert again.peak_bytes == s.peak_bytes
    got = _ran(in_objects(s, est).code, training_args=args)
    assert {k: got[k] for k in new} == new


def test_an_sft_config_gets_a_shorter_max_length():
    cfg = _sft(per_device_train_batch_size=4, max_length=128)
    est = estimate_from(MODEL, sft_config=cfg, device="cpu")
    s = advise(est, int(est.peak_bytes * 0.35), safety=0).suggestions[0]
    assert list(s.changes) == ["seq-len"]
    new = apply(s, sft_config=cfg)
    assert type(new["sft_config"]) is SFTConfig and new["sft_config"].max_length == s.changes["seq-len"]
    assert cfg.max_length == 128
    assert estimate_from(MODEL, device="cpu", **new).peak_bytes == s.peak_bytes
    assert _ran(in_objects(s, est).code, sft_config=cfg)["sft_config"] == new["sft_config"]


def test_a_padding_free_sft_config_holds_rows_of_max_length():
    """One flattened row of per_device_train_batch_size x max_length tokens: a shorter row is a shorter
    max_length, rounded down to whole rows (said), and re-estimated at those tokens."""
    cfg = _sft(per_device_train_batch_size=2, max_length=128, padding_free=True)
    est = estimate_from(MODEL, sft_config=cfg, device="cpu")
    assert est.setup["seq_len"] == 256
    s = _first(advise(est, int(est.peak_bytes * 0.5), safety=0), "seq-len")
    rows = s.changes["seq-len"] // 2
    assert rows >= MIN_ROW_TOKENS                      # no row is cut below a useful length
    new = apply(s, sft_config=cfg)
    assert new["sft_config"].max_length == rows and new["sft_config"].padding_free
    again = estimate_from(MODEL, device="cpu", **new)
    assert again.peak_bytes == estimate(**{**s.options, "seq_len": 2 * rows}).peak_bytes
    plan = in_objects(s, est)
    assert any(f"= 2 x {rows} = {2 * rows} tokens" in n for n in plan.notes) == bool(s.changes["seq-len"] % 2)


def test_no_flattened_row_is_cut_below_a_useful_length():
    """Notebook 02's fold 2 (4 rows of 30 tokens in one row): the advisor once suggested max_length=3. No row is
    cut below MIN_ROW_TOKENS: here no sequence cut is suggested at all."""
    cfg = _sft(per_device_train_batch_size=4, max_length=30, padding_free=True)
    est = estimate_from(MODEL, sft_config=cfg, device="cpu")
    a = advise(est, int(est.peak_bytes * 0.5), safety=0)
    assert a.suggestions and not any("seq-len" in s.changes for s in a.suggestions)
    assert all("max_length" not in o.code for o in a.objects)


def test_padding_free_turned_on_is_the_sft_config_field():
    """SFTConfig(padding_free=True): the advisor's flattened row (batch 1, B x S tokens) is the same rows."""
    cfg = _sft(per_device_train_batch_size=4, max_length=64)
    est = estimate_from(MODEL, sft_config=cfg, device="cpu")
    base = advise(est, est.peak_bytes * 2).options
    options = {**base, "batch_size": 1, "seq_len": 256, "padding_free": True}
    peak = estimate(**options).peak_bytes
    s = _suggestion({"batch-size": 1, "seq-len": 256, "padding-free": True}, peak=peak, options=options)
    new = apply(s, sft_config=cfg)
    assert (new["sft_config"].padding_free, new["sft_config"].max_length,
            new["sft_config"].per_device_train_batch_size) == (True, 64, 4)
    assert estimate_from(MODEL, device="cpu", **new).peak_bytes == peak
    assert in_objects(s, est).statements() == ["sft_config = dataclasses.replace(sft_config, padding_free=True)"]


def test_what_no_object_holds_is_said_and_the_cli_json_is_unchanged():
    args = _args(per_device_train_batch_size=4)
    est = estimate_from(MODEL, args, seq_len=128, device="cpu")
    s = _suggestion({"kbit-recipe": "lean", "num-gpus": 2, "strategy": "fsdp", "loss-type": "dft"})
    plan = in_objects(s, est)
    assert plan.fields == {} and len(plan.notes) == 3
    assert plan.notes[0].startswith("--kbit-recipe lean: no object field: skip prepare_model_for_kbit_training")
    assert "launch on 2 GPUs" in plan.notes[1] and "loss_type is TRL's SFTConfig's" in plan.notes[2]
    assert apply(s, training_args=args) == {"training_args": args}
    cli = advise({"model": MODEL, "batch_size": 8, "seq_len": 128, "device": "cpu"}, 80_000_000, safety=0)
    objs = advise(est, 80_000_000, safety=0)
    assert cli.objects == [] and all("objects" not in d for d in cli.to_json()["suggestions"])
    assert [d["objects"]["code"] for d in objs.to_json()["suggestions"]] == [o.code for o in objs.objects]
    with pytest.raises(InputError, match="pass the Trainer alone"):
        apply(s, trainer=object(), training_args=args)
    with pytest.raises(InputError, match="not a trl SFTConfig"):
        apply(s, sft_config=args)
    with pytest.raises(InputError, match="was not read from your objects"):
        in_objects(s, estimate(MODEL, batch_size=1, seq_len=8))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU accepts bf16=True")
def test_a_change_this_machine_refuses_is_one_sentence_not_transformers_error():
    from types import SimpleNamespace

    from kit.inputs import InputError

    args = TrainingArguments("/tmp/kit-objects", per_device_train_batch_size=8, report_to="none")
    with pytest.raises(InputError, match=r"^training_args refuses \{'bf16': True\} on this machine .* apply the change "
                                         r"where the run will happen"):
        apply(SimpleNamespace(changes={"precision": "bf16"}, options={}), training_args=args)
    assert args.bf16 is False                      # the user's object is untouched


def test_the_free_levers_in_your_objects_liger_applied_and_the_allocator_said():
    """Liger's kernels are a field of TrainingArguments (use_liger_kernel): applied, the copy re-estimates to the
    suggestion's own peak. The allocator setting lives in no object: said in a note, and apply(strict=True)
    refuses it."""
    lora = LoraConfig(r=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = TrainingArguments(output_dir="unused", report_to="none", per_device_train_batch_size=8)
    est = estimate_from("meta-llama/Llama-3.2-1B", args, peft_config=lora, seq_len=1024, load_dtype="bf16")
    a = advise(est, "l4")
    s = _first(a, "liger-kernel")
    assert s is a.suggestions[0] and s.fits and s.tiers == (0,)
    new = apply(s, training_args=args, peft_config=lora)
    assert new["training_args"].use_liger_kernel and not args.use_liger_kernel
    again = estimate_from("meta-llama/Llama-3.2-1B", new["training_args"], peft_config=new["peft_config"],
                          seq_len=1024, load_dtype="bf16")
    assert (again.peak_bytes, again.reserved_bytes) == (s.peak_bytes, s.reserved_bytes)
    assert in_objects(s, est).statements() == [
        "training_args = dataclasses.replace(training_args, use_liger_kernel=True)"]
    grown = _suggestion({"expandable-segments": True}, "--expandable-segments")
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in n for n in in_objects(grown, est).notes)
    with pytest.raises(InputError, match="no object of yours holds the change --expandable-segments"):
        apply(grown, training_args=args, strict=True)


# -- issue 35: objects of the wrong kind, and no objects at all ---------------------------------------------------
_BATCH = _suggestion({"batch-size": 2}, "--batch-size 2")


@pytest.mark.parametrize("keyword, given, says", [
    ("training_args", lambda: LoraConfig(r=8), "training_args is a LoraConfig, not a transformers TrainingArguments: "
                                               "pass it as peft_config="),
    ("peft_config", lambda: _args(learning_rate=3e-5), "peft_config is a TrainingArguments, not a peft LoraConfig: "
                                                       "pass it as training_args="),
    ("quantization_config", lambda: LoraConfig(r=8), "quantization_config is a LoraConfig, not a transformers "
                                                     "BitsAndBytesConfig: pass it as peft_config="),
    ("sft_config", lambda: LoraConfig(r=8), "sft_config is a LoraConfig, not a trl SFTConfig: pass it as "
                                            "peft_config="),
])
def test_i35_2_an_object_of_the_wrong_kind_is_refused_in_one_sentence(keyword, given, says):
    with pytest.raises(InputError) as e:
        apply(_BATCH, **{keyword: given()})
    assert str(e.value).startswith(says) and e.value.name == keyword, str(e.value)


def test_i35_6_apply_without_your_args_refuses_rather_than_make_new_defaults():
    """A suggestion that changes a TrainingArguments field, with no args given: new defaults would drop the user's
    learning rate, epochs and output_dir, so apply() says what to pass instead."""
    with pytest.raises(InputError) as e:
        apply(_BATCH)
    text = str(e.value)
    assert e.value.name == "training_args" and e.value.code == "missing-object", text
    assert "per_device_train_batch_size=2" in text and "apply(suggestion, training_args=your_args)" in text, text
    mine = _args(learning_rate=3e-5, num_train_epochs=7, per_device_train_batch_size=8)
    new = apply(_BATCH, training_args=mine)["training_args"]
    assert (new.learning_rate, new.num_train_epochs, new.output_dir, new.per_device_train_batch_size) == \
        (3e-5, 7, "unused", 2)
    lora_only = _suggestion({"lora-r": 8}, "--lora-r 8")
    assert sorted(apply(lora_only)) == ["peft_config"]       # no args changed: nothing of the user's is dropped


def test_i35_5_check_on_the_cpu_judges_the_cpu_estimate():
    """kit.check(trainer, device="cpu") estimates CPU kernels (estimate_trainer's device), never the CUDA estimate."""
    tok = data.shipped_tokenizer()
    ids = [[5 + (i * 7 + j) % 4000 for j in range(40)] for i in range(16)]
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 40 for _ in ids]})
    tr = Trainer(model=models.load_model(MODEL, device="cpu"), train_dataset=ds, data_collator=data.collator(tok),
                 args=_args(per_device_train_batch_size=4))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        est = kit.check(tr, device="cpu")
    cpu = estimate_trainer(tr, device="cpu")
    assert est.setup["device"] == "cpu" and (est.peak_bytes, est.reserved_bytes) == (cpu.peak_bytes, cpu.reserved_bytes)
    assert "RESERVED" not in out.getvalue()
