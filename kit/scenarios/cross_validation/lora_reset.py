"""Resetting a LoRA adapter between folds, and proving the reset happened.

Three resets, side by side:

- :func:`advice_reset` is the popular advice, quoted as written. Its guard,
  ``'lora' in model.named_modules()``, compares the string ``'lora'`` with the
  ``(name, module)`` tuples the generator yields, so it is never true and nothing
  is reset: fold 2 trains on from fold 1's adapter.
- :func:`restore_adapter` copies a saved initial state back (the kit's reset).
- peft's ``LoraLayer.reset_lora_parameters(adapter, True)`` re-draws A and zeroes B;
  with ``False`` as the second argument it silently does nothing. Since it re-draws A,
  :func:`verify_adapter_reset` (which wants A back at its saved init) reports
  ``equals_init=False`` for it: the kit restores the saved state instead.

:func:`verify_adapter_reset` checks the result instead of trusting it: every
``lora_B`` is zero and every adapter tensor equals its saved initial value.

>>> init = save_adapter_init(peft_model)                    # doctest: +SKIP
>>> restore_adapter(peft_model, init)                       # doctest: +SKIP
>>> verify_adapter_reset(peft_model, init).ok               # doctest: +SKIP
True
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict

from kit.inputs import ALL_LINEAR, InputError

from kit import inputs

# The advice's reset, character for character as it appears in the write-up
# (the answer the user was given). Shown in the notebook; run by advice_reset() below.
ADVICE_RESET_CODE = """\
if 'lora' in model.named_modules():
    for name, module in model.named_modules():
        if 'lora' in name:
            module.reset_parameters()"""


def lora_config(rank: int = 8, targets=("q_proj", "v_proj")) -> LoraConfig:
    """The LoRA settings of both loops (peft's default init: A random, B zero). ``targets`` is a
    list of module names, a comma string, or peft's ``"all-linear"`` (every linear layer but lm_head).

    >>> lora_config(16, ["q_proj", "k_proj", "v_proj", "o_proj"]).r
    16
    >>> sorted(lora_config(8, "q_proj,v_proj").target_modules), lora_config(8, "all-linear").target_modules
    (['q_proj', 'v_proj'], 'all-linear')
    """
    rank, names = inputs.whole_number("lora_r", rank), inputs.targets(targets)
    if names is None:
        raise InputError("lora_targets", "lora_targets names no module: pass names such as 'q_proj,v_proj', "
                                             "or 'all-linear'.")
    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.05, task_type="CAUSAL_LM",
                      target_modules=names if names == ALL_LINEAR else list(names))


def advice_reset(model) -> None:
    """Run the advice's reset exactly as written. It changes nothing.

    ``model.named_modules()`` is a generator of ``(name, module)`` tuples, and
    ``'lora' in generator`` tests ``'lora' == (name, module)`` for each one: never
    true. (Without the guard it would not work either: the first module whose name
    holds 'lora' is a ``ModuleDict`` (``lora_dropout``) with no ``reset_parameters``,
    so it raises ``AttributeError``; and ``nn.Linear.reset_parameters`` on
    ``lora_B`` would make B random instead of zero.)

    >>> advice_reset(peft_model)                               # doctest: +SKIP
    """
    if 'lora' in model.named_modules():
        for name, module in model.named_modules():
            if 'lora' in name:
                module.reset_parameters()


def adapter_state(model, adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """A detached copy of the adapter's weights (``get_peft_model_state_dict``, cloned).

    peft's state dict shares memory with the live weights, so without ``.clone()``
    a "saved" state silently follows training.

    >>> before = adapter_state(peft_model)                     # doctest: +SKIP
    """
    state = get_peft_model_state_dict(model, adapter_name=adapter_name)
    if not state:
        raise ValueError("the model holds no adapter weights: wrap it with peft.get_peft_model first.")
    return {name: t.detach().clone() for name, t in state.items()}


def save_adapter_init(model, adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The adapter's initial state, to restore at every fold start. Call it right after
    ``get_peft_model``, before any training.

    >>> init = save_adapter_init(peft_model)                   # doctest: +SKIP
    """
    return adapter_state(model, adapter_name)


def restore_adapter(model, init_state: dict[str, torch.Tensor], adapter_name: str = "default") -> None:
    """Copy the saved initial state back into the adapter, in place (peft's
    ``set_peft_model_state_dict``). The parameters stay the same objects.

    >>> restore_adapter(peft_model, init)                      # doctest: +SKIP
    """
    result = set_peft_model_state_dict(model, init_state, adapter_name=adapter_name)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"the saved state does not fit this adapter (unexpected keys: {unexpected[:3]}...).")


def states_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    """True when two adapter states hold the same names and bit-identical tensors (``torch.equal``).

    >>> states_equal({"w": torch.ones(2)}, {"w": torch.ones(2)})
    True
    """
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k].to(first[k].device)) for k in first)


@dataclass
class ResetCheck:
    """What :func:`verify_adapter_reset` found. ``ok`` is the verdict."""

    ok: bool
    lora_b_all_zero: bool
    equals_init: bool
    n_tensors: int
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        if self.ok:
            return f"adapter reset OK: {self.n_tensors} tensors equal their saved init, every lora_B is zero"
        return "adapter NOT reset: " + "; ".join(self.problems[:3]) + (" ..." if len(self.problems) > 3 else "")


def verify_adapter_reset(model, init_state: dict[str, torch.Tensor], adapter_name: str = "default") -> ResetCheck:
    """Check that the adapter is really at its initial state: every ``lora_B`` is zero,
    every ``lora_A`` (and any other adapter tensor) equals its saved init.

    Catches a reset that does nothing (the advice's), and peft's
    ``reset_lora_parameters(adapter, False)``, which silently does nothing too.

    >>> verify_adapter_reset(peft_model, init).ok              # doctest: +SKIP
    True
    """
    now = get_peft_model_state_dict(model, adapter_name=adapter_name)
    problems = []
    if not any("lora_A" in k for k in now):
        problems.append("no lora_A weights found: is this a LoRA model?")
    if now.keys() != init_state.keys():
        problems.append("the adapter's tensor names differ from the saved init")
    b_zero = True
    for name, t in now.items():
        if "lora_B" in name and torch.count_nonzero(t).item() != 0:
            b_zero = False
            problems.append(f"{name} is not zero (max |B| = {t.abs().max().item():.3g})")
    equal = True
    for name in now.keys() & init_state.keys():
        if not torch.equal(now[name].detach(), init_state[name].to(now[name].device)):
            equal = False
            if "lora_B" not in name:  # B's problem is already named above
                problems.append(f"{name} differs from its saved init")
    return ResetCheck(ok=not problems and b_zero and equal, lora_b_all_zero=b_zero,
                      equals_init=equal, n_tensors=len(now), problems=problems)
