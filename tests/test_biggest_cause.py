"""The biggest cause named is the biggest part: never a module smaller than a component the breakdown shows."""
import pytest

from kit.advise.answer import biggest_cause
from kit.estimate import estimate
from kit.units import fmt_bytes


@pytest.mark.parametrize("model, options, expected", [
    ("tiny-bert", dict(task="token-cls", num_labels=30_000), "logits & loss"),   # the classifier holds 59 MiB
    ("tiny-gpt2", {}, "logits & loss"),                                         # wte holds 8 MiB
    ("distilgpt2+vocab-head", {}, "custom_layer"),                              # scenario 1's head: 37.6 GiB
])
def test_the_biggest_cause_is_never_smaller_than_a_part_beside_it(model, options, expected):
    est = estimate(model, batch_size=8, seq_len=128, **options)
    cause, parts = biggest_cause(est), est.components()
    assert cause.startswith(f"biggest cause: {expected}, "), cause
    named, _, held = est.offenders[0]
    if expected == named:
        assert held >= max(parts.values())
    else:
        assert f"{fmt_bytes(max(parts.values()))} of the" in cause and held < max(parts.values())
