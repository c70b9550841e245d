"""Scenario 1's logic: the culprit, the advice put to numbers, the fixes measured, the original run safely."""
import pytest
import torch
import transformers

from kit import machine, models
from kit.scenarios.custom_head import runs as s1_runs
from kit.scenarios.custom_head import scenario as ch


def test_the_original_names_custom_layer_and_misses_a_t4():
    for size in ("smoke", "real"):
        assert ch.predict_original(size).offender == "custom_layer"
    real = ch.predict_original("real")
    assert real.offender_params == 50258 * 50258 + 50258
    assert not real.fits_t4 and real.peak_bytes > 4 * real.offender_params * 4   # AdamW: 16 bytes a param
    assert "custom_layer" in real.text() and "DOES NOT FIT" in real.text()


def test_each_fix_is_far_below_the_original_at_real_size():
    original = ch.predict_original("real").peak_bytes
    a, b, c = (ch.estimate_fix(w, "real").peak_bytes for w in "abc")
    assert a < original / 10 and b < original / 10
    assert a < ch.T4_BYTES and b < ch.T4_BYTES
    # (c) keeps the VxV head: it shrinks (bf16, no fp32 state) but honestly still misses a T4.
    assert c < original / 2 and c > ch.T4_BYTES


def test_the_advice_changes_the_peak_by_little_and_the_head_by_a_lot():
    adv = ch.advice_table("smoke")
    rows = {r["advice"].split(" (")[0].split(":")[0]: r for r in adv.rows}
    pad = [r for r in adv.rows if r["advice"].startswith("pad to longest")]
    assert pad and all(r["modelled"] and r["change_bytes"] <= 0 for r in pad)
    assert all(abs(r["change_bytes"]) < 0.05 * adv.base_peak_bytes for r in pad)
    assert rows["call torch.cuda.empty_cache()"]["change_bytes"] == 0
    assert not rows["call torch.cuda.empty_cache()"]["modelled"]
    head = [r for r in adv.rows if r["advice"].startswith("(for scale)")][0]
    assert -head["change_bytes"] > 10 * max(abs(r["change_bytes"]) for r in pad)
    assert adv.data["max_length_bytes"] > adv.data["dynamic_bytes"] > 0
    assert adv.data["max_len"] <= 128 and "empty_cache" in adv.text()


def test_the_8bit_guard_refuses_the_real_head_and_allows_the_tiny_one():
    real = models.build_model("distilgpt2+vocab-head", device="meta")
    assert "custom_layer.weight" in ch.bnb_8bit_problem(real)
    assert ch.bnb_8bit_problem(models.build_model("tiny-gpt2+vocab-head", device="meta")) is None
    assert ch.fix_setup("c", "real")["optimizer"] == "adamw-fused"          # never 8-bit on the big head
    assert ch.fix_setup("c", "smoke")["optimizer"] == "adamw-8bit"


def test_low_rank_head_keeps_the_models_interface():
    model = ch.LowRankHeadModel(models.build_model("tiny-gpt2"), rank=4)
    ids = torch.randint(2, 4000, (1, 8))
    out = model(input_ids=ids, labels=ids)
    assert out["logits"].shape == (1, 8, 4097) and out["loss"].requires_grad
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "custom_layer.down.weight", "custom_layer.up.weight", "custom_layer.up.bias"}
    with pytest.raises(ValueError, match="rank"):
        ch.LowRankHead(10, 10)


def test_a_fix_run_measures_its_estimate_and_returns_memory():
    record, tracker = s1_runs.run_fix("b", "smoke", steps=2, grad_accum=2)
    # the estimate of the same setup (as run here), at the same step: from the second, AdamW's state is alive
    assert 0.98 <= record["measured_peak_bytes"] / record["estimate_peak_bytes"] <= 1.02, record
    assert (record["steps"], record["grad_accum"]) == (2, 2)
    assert record["returned"] is True
    assert [r.name for r in tracker.records] == ["tokenize", "build", "Trainer init", "train", "cleanup"]
    assert tracker.records[-1].end_bytes <= tracker.records[0].start_bytes + 2**20


def test_the_original_recovers_from_an_oom(monkeypatch):
    def boom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.41 GiB")

    monkeypatch.setattr(transformers.Trainer, "training_step", boom)
    record, tracker = s1_runs.run_original_safely("smoke", grad_accum=2)
    assert record["oom"] is True and record["measured_peak_bytes"] is None
    assert "OutOfMemoryError" in record["error"]
    assert record["returned"] is True
    train = [r for r in tracker.records if r.name == "train"][0]
    assert "OutOfMemoryError" in train.error and tracker.records[-1].name == "cleanup"


def test_the_original_at_real_size_is_refused_where_ram_is_short():
    est = ch.estimate_fix("a", "real")  # warm the estimator's cache
    record, _ = s1_runs.run_original_safely("real")
    if machine.has_cuda():
        pytest.skip("on a GPU the original runs (or its OOM is caught)")
    assert est.peak_bytes > 0 and record["refused"] and record["measured_peak_bytes"] is None
    assert not record["oom"]


def test_find_culprit_ranks_the_head_first():
    text = ch.find_culprit("tiny-gpt2+vocab-head")
    by_params, by_bytes = text.split("By estimated training bytes")
    assert by_params.splitlines()[1].split()[0] == "custom_layer"
    assert by_bytes.splitlines()[1].split()[0] == "custom_layer"


@pytest.mark.gpu
def test_on_a_gpu_the_real_size_runs_measure_close_to_their_estimates():
    # Tolerance not yet checked on a GPU: a failure here is a finding about the estimator or the run.
    record, _ = s1_runs.run_original_safely("real", grad_accum=2)
    assert record["returned"] and record["refused"] is None
    if not record["oom"]:
        assert 0.75 < record["measured_peak_bytes"] / record["estimate_peak_bytes"] < 1.25
    for which in "ab":
        rec, _ = s1_runs.run_fix(which, "real", grad_accum=2)
        assert rec["returned"] and 0.75 < rec["measured_peak_bytes"] / rec["estimate_peak_bytes"] < 1.25


def test_the_advice_tables_data_bytes_are_those_of_the_users_rows():
    small, big = ch.advice_table("smoke", rows=20), ch.advice_table("smoke", rows=60)
    assert small.data["rows"] < big.data["rows"]
    per_row = [a.data["max_length_bytes"] / a.data["rows"] for a in (small, big)]
    assert per_row[0] == pytest.approx(per_row[1], rel=0.02)    # every row padded to 128 tokens
    assert f"the user's {small.data['rows']} non-empty rows" in small.text()


def test_one_accumulation_rule_for_the_notebook_and_the_demo(monkeypatch):
    monkeypatch.setattr(s1_runs.machine, "has_cuda", lambda: False)
    assert [s1_runs.grad_accum_for(w) for w in (None, "a", "b", "c")] == [2, 2, 2, 1]
    monkeypatch.setattr(s1_runs.machine, "has_cuda", lambda: True)
    assert s1_runs.grad_accum_for("c") == ch.USER["grad_accum"] == 16
    assert s1_runs.grad_accum_for("c", 3) == 3
    with pytest.raises(ValueError, match="grad_accum"):
        s1_runs.grad_accum_for("a", 0)



@pytest.mark.parametrize("bad", [0, -1, "one"])
def test_steps_below_one_are_refused_not_run(bad):
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        s1_runs.run_fix("a", "smoke", steps=bad)
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        s1_runs.run_original_safely("smoke", steps=bad)


# -- the user's own code (kit/scenarios/custom_head/user_code.py) -------------------------------------------------
USERS_LINES = """\
class Custom_GPT2_Model(nn.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.gpt2 = AutoModelForCausalLM.from_pretrained(model_name)
        self.gpt2.resize_token_embeddings(len(tokenizer))
        for param in self.gpt2.parameters():
            param.requires_grad = False
        self.gpt2.gradient_checkpointing_enable()
        self.custom_layer = nn.Linear(self.gpt2.config.vocab_size, self.gpt2.config.vocab_size)

    def forward(self, input_ids, attention_mask=None, labels=None):
        outputs = self.gpt2(input_ids=input_ids, attention_mask=attention_mask)
        logits = self.custom_layer(outputs.logits)
        loss = None
        if labels is not None:
            loss_func = nn.CrossEntropyLoss()
            # loss = loss_func(logits, labels)
            loss = loss_func(logits.view(-1, logits.size(-1)), labels.view(-1))
        return {'loss': loss, 'logits': logits}
"""


def test_the_printed_class_and_tokenize_func_are_the_users_verbatim():
    import inspect

    from kit.scenarios.custom_head import user_code

    assert inspect.getsource(user_code.Custom_GPT2_Model) == USERS_LINES
    assert "return tokenizer(examples['text'], padding='max_length', truncation=True, max_length=128, " \
           "return_tensors='pt')" in inspect.getsource(user_code.tokenize_func)
    args = inspect.getsource(user_code.user_training_args)
    for line in ("output_dir='./results'", "num_train_epochs=0.5", "per_device_train_batch_size=1",
                 "gradient_accumulation_steps=16", "fp16=True", "warmup_steps=2500", "learning_rate=0.1",
                 "weight_decay=0.01", "logging_steps=5000"):
        assert f"        {line}," in args, line
    # each line that differs says why
    assert "# logging_dir='./logs',  # ADAPTED: transformers 5 refuses logging_dir (TypeError)" in args
    assert 'save_strategy="no",  # ADAPTED: safetensors refuses' in args
    theirs = user_code.user_training_args()
    assert (theirs.gradient_accumulation_steps, theirs.num_train_epochs, theirs.save_strategy) == (16, 0.5, "no")


@pytest.fixture(scope="module")
def users_trainer():
    trainer, workshop = s1_runs.user_trainer("smoke", steps=2, grad_accum=2)
    yield trainer, workshop
    from kit.measure import cleanup

    cleanup.release(trainer, trainer.model, free_model=True)


def test_the_users_trainer_estimates_to_the_byte_of_the_registry_model_at_the_same_size(users_trainer):
    from kit.estimate import estimate_trainer

    trainer, workshop = users_trainer
    from kit.scenarios.custom_head import user_code

    assert type(trainer.model) is user_code.Custom_GPT2_Model
    assert workshop["max_steps"] == 2 and trainer.args.gradient_accumulation_steps == 2
    est = estimate_trainer(trainer)
    same = ch.same_size_registry(trainer, est)
    assert (est.peak_bytes, est.trainable_params, est.peak_moment) == \
        (same.peak_bytes, same.trainable_params, same.peak_moment)
    assert est.offenders[0][0] == "custom_layer"
    # the same V: the shipped tokenizer has its [PAD] already, so the user's resize keeps the twin's 4096
    assert trainer.model.custom_layer.out_features == len(trainer.data_collator.tokenizer) == 4096


def test_a_run_of_the_users_code_measures_its_estimate_within_2_percent():
    for steps in (1, 2):   # one step: its backward runs before AdamW's state exists, and the estimate says so
        record, tracker = s1_runs.run_original_safely("smoke", steps=steps, grad_accum=1)
        assert record["seq_len"] == 128 and record["steps"] == steps
        assert 0.98 <= record["measured_peak_bytes"] / record["estimate_peak_bytes"] <= 1.02, record
        assert record["returned"] is True
        assert [r.name for r in tracker.records] == ["the user's code", "train", "cleanup"]


def test_a_one_step_fix_run_is_set_beside_the_first_steps_estimate():
    record, _ = s1_runs.run_fix("a", "smoke", steps=1, grad_accum=1)
    est = ch.estimate_fix("a", "smoke", as_run=True, grad_accum=1, seq_len=record["seq_len"])
    assert record["estimate_peak_bytes"] == est.first_step_peak_bytes < est.peak_bytes
    assert 0.98 <= record["measured_peak_bytes"] / record["estimate_peak_bytes"] <= 1.02, record
