"""TRL's RewardTrainer (the behaviour of TRL 1.16, issue 47.1): estimate_trainer within 2% of the profiler meter of
``benchmarks/real_clients.py`` at step 1 and the steady step, as its docs' quick start builds it (a model path, a
one-label sequence classifier), full and with ``LoraConfig(modules_to_save=["score"])``; every RewardConfig field
modeled, listed as having no memory effect, or refused by name; ``kit.check`` answers first."""
import contextlib
import functools
import io
import warnings

import pytest

trl = pytest.importorskip("trl")
from trl import RewardConfig  # noqa: E402

from kind_checks import assert_fields_in_one_table, assert_within_2_percent, cpu_config, step_ratios  # noqa: E402

import real_clients as rc  # noqa: E402

import kit  # noqa: E402
from kit import inputs  # noqa: E402
from kit.estimate import estimate_trainer  # noqa: E402
from kit.estimate import reward  # noqa: E402
from kit.presets import resolve_device, verdict  # noqa: E402
from kit.units import fmt_bytes  # noqa: E402

warnings.filterwarnings("ignore")

_config = functools.partial(cpu_config, RewardConfig)


@pytest.mark.parametrize("lora,bf16", [(False, False), (True, False), (False, True), (True, True)])
def test_i47_1_reward_trainer_within_2_percent(tmp_path, lora, bf16):
    """Refused before ("not RewardTrainer, whose own forward passes, generation and losses ..."). bf16: RewardConfig's
    default, bf16 autocast."""
    _, setup, est, peaks = rc.run_trainer_client(rc.client_reward(str(tmp_path), lora, bf16=bf16), rc.ProfilerMeter)
    assert (est.setup["task"], est.setup["num_labels"], est.setup["batch_size"]) == ("seq-cls", 1, 4)
    assert est.setup["precision"] == ("bf16" if bf16 else "fp32")
    assert est.setup.get("train_head", False) is lora    # peft's modules_to_save copy of score
    assert_within_2_percent(setup, step_ratios(est, peaks), peaks)


def test_every_reward_config_field_is_modeled_listed_or_refused():
    assert_fields_in_one_table(RewardConfig, reward)


def test_a_refused_field_gets_one_sentence_naming_it():
    with pytest.raises(inputs.InputError) as e:
        reward.read_reward_config(_config(activation_offloading=True))
    msg = str(e.value)
    assert "RewardConfig.activation_offloading " in msg and msg.endswith("estimate without it.")
    assert (e.value.name, e.value.code) == ("activation_offloading", "reward-activation-offloading")


def test_the_default_config_reads_and_names_every_field():
    _, src, _ = reward.read_reward_config(_config())
    assert all(k in src for k in (*reward.MODELED, *reward.NO_MEMORY))
    assert "no memory of its own" in src["center_rewards_coefficient"][1]


def test_a_head_other_than_one_label_is_refused():
    with pytest.raises(inputs.InputError, match="num_labels=1") as e:
        reward.refuse_other_head({"task": "seq-cls", "num_labels": 3})
    assert e.value.code == "reward-head"


def test_check_and_estimate_trainer_read_a_reward_trainer(tmp_path):
    trainer = next(rc.client_reward(str(tmp_path), lora=True))[2]
    est = estimate_trainer(trainer, device="cpu")
    assert est.sources["batch_size"][0] == 4 and "chosen and the rejected rows" in est.sources["batch_size"][1]
    assert est.sources["seq_len"][0] == 51 and est.sources["padded"][0] is True   # chosen 51 tokens, rejected 41
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        judged = kit.check(trainer)
    text = out.getvalue()   # the answer first: the verdict and the figure it judged, the model read as 4 x 51 rows
    v = verdict(judged, resolve_device(None)[0])
    assert text.startswith(v.text.split(":")[0] + f": {fmt_bytes(judged.reserved_bytes)} reserved (modelled) of "), text
    assert "batch 4 x seq 51" in text and "LoRA r8" in text, text
