"""kit.inputs: what users naturally pass is read; the rest is refused in one sentence naming the control."""
from pathlib import Path

import numpy as np
import pytest

from kit import inputs
from kit.inputs import InputError


def test_whole_number_reads_numpy_whole_floats_and_digit_strings():
    assert inputs.whole_number("steps", np.int64(3)) == 3 and type(inputs.whole_number("steps", np.int32(3))) is int
    assert inputs.whole_number("steps", 8.0) == 8 and inputs.whole_number("steps", " 12 ") == 12
    assert inputs.whole_number("seed", 0, minimum=0) == 0
    assert inputs.whole_number("folds", 5, minimum=2, maximum=10) == 5


@pytest.mark.parametrize("value", [0, -1, 2.5, True, np.bool_(True), "ten", "", None, float("nan"), [4]])
def test_whole_number_refuses_by_name(value):
    with pytest.raises(InputError, match=r"^steps must be a whole number >= 1, not ") as exc:
        inputs.whole_number("steps", value)
    assert exc.value.name == "steps" and isinstance(exc.value, ValueError)


def test_whole_number_bounds_in_the_message():
    with pytest.raises(InputError, match="from 2 to 10, not 11"):
        inputs.whole_number("folds", 11, minimum=2, maximum=10)


@pytest.mark.parametrize("value,expected", [
    (True, True), (False, False), ("no", False), ("No", False), ("false", False), ("0", False), ("off", False),
    ("yes", True), ("TRUE", True), ("1", True), ("on", True), (1, True), (0, False), (np.bool_(False), False),
    (np.int64(1), True),
])
def test_flag_reads_the_usual_spellings(value, expected):
    assert inputs.flag("padded", value) is expected


@pytest.mark.parametrize("value", ["maybe", "", 2, -1, 0.5, None, [True]])
def test_flag_refuses_the_rest(value):
    with pytest.raises(InputError, match="^padded must be True or False"):
        inputs.flag("padded", value)


def test_flag_none_only_when_allowed():
    assert inputs.flag("gradient_checkpointing", None, allow_none=True) is None


def test_fraction():
    assert inputs.fraction("lora_dropout", 0) == 0.0 and inputs.fraction("lora_dropout", np.float32(0.5)) == 0.5
    assert inputs.fraction("lora_dropout", "0.1") == 0.1
    for bad in (5, -0.1, 1.5, "lots", True, None, float("inf")):
        with pytest.raises(InputError, match="^lora_dropout must be a number from 0 to 1"):
            inputs.fraction("lora_dropout", bad)


def test_choice_with_aliases_and_any_case():
    opts = ("adamw", "sgd")
    assert inputs.choice("optimizer", " SGD ", opts) == "sgd"
    assert inputs.choice("optimizer", "adamw_torch", opts, {"adamw_torch": "adamw"}) == "adamw"
    with pytest.raises(InputError, match="^optimizer must be one of adamw, sgd, not 'adam9'"):
        inputs.choice("optimizer", "adam9", opts)
    with pytest.raises(InputError, match="not 3"):
        inputs.choice("optimizer", 3, opts)


def test_targets_reads_strings_lists_and_all_linear():
    assert inputs.targets("q_proj,v_proj") == inputs.targets("q_proj, v_proj") == ("q_proj", "v_proj")
    assert inputs.targets("q_proj v_proj") == inputs.targets(["q_proj", "v_proj"]) == ("q_proj", "v_proj")
    assert inputs.targets(("q_proj",)) == ("q_proj",) and inputs.targets({"v_proj", "q_proj"}) == ("q_proj", "v_proj")
    assert inputs.targets("all-linear") == inputs.targets(["All-Linear"]) == inputs.ALL_LINEAR
    assert inputs.targets(None) is None and inputs.targets("") is None and inputs.targets([]) is None


@pytest.mark.parametrize("value,match", [
    ([1, 2], "must be module names"), (5, "must be module names"), (Path("q_proj"), "must be module names"),
    ("all-linear,q_proj", "pass it alone"),
])
def test_targets_refuses(value, match):
    with pytest.raises(InputError, match=match) as exc:
        inputs.targets(value)
    assert exc.value.name == "lora_targets"


def test_byte_count_reads_numpy_and_refuses_infinity():
    import numpy as np

    from kit.inputs import InputError, byte_count

    assert byte_count("cap_bytes", np.int64(2**30)) == 2**30 and byte_count("cap_bytes", 1.5e9) == 1_500_000_000
    assert byte_count("cap_bytes", None, "no cap") is None
    for bad in (float("inf"), float("-inf"), float("nan"), 0, -1, 1.5, True, "1GiB", None):
        with pytest.raises(InputError, match=r"^cap_bytes must be a positive whole number of bytes"):
            byte_count("cap_bytes", bad)


def test_a_dict_of_training_arguments_is_read_and_a_wrong_keyword_named():
    from transformers import TrainingArguments

    from kit.inputs import InputError, training_arguments

    args = training_arguments("training_args", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2})
    assert isinstance(args, TrainingArguments) \
        and (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2)
    with pytest.raises(InputError, match=r"^training_args: TrainingArguments takes no keyword 'batch_size'") as e:
        training_arguments("training_args", {"batch_size": 4})
    assert e.value.name == "training_args"
    with pytest.raises(InputError, match=r"^training_args must be a transformers TrainingArguments .*not list\.$"):
        training_arguments("training_args", [4])
