"""Scenario 1's head on the widget panel: the user's V x V head, or one of the notebook's fixes, as one control.

- ``"vxv"``: the ``Linear(V, V)`` head as the user wrote it (``distilgpt2+vocab-head``);
- ``"low-rank"``: fix (b), a :class:`~kit.scenarios.custom_head.scenario.LowRankHead` ``V -> r -> V``, its rank
  on the ``head_rank`` slider;
- ``"none"``: fix (a), no head: the LM itself fine-tuned;
- ``"vxv-16bit"``: fix (c), the V x V head kept in 16 bits (the chosen device's: fp16 on a T4, bf16 where native)
  with 8-bit AdamW where bitsandbytes can run it. On the real head it cannot (a tensor over 2^31 - 1 elements
  kills the process), so plain AdamW stands, as in notebook 01's table (``fixes_at_real_size``); the reason
  beside the head says what each part costs and what 8-bit AdamW would have left.

The head applies to a ``+vocab-head`` model. The verdict is the model's own on the chosen device (the real one in
smoke mode too); the user's gradient accumulation (16), which no control shows, is kept, as the notebook keeps it.

>>> from kit.presets import PRESETS
>>> head = HeadChoice(lambda kind, label, value, **kw: kind(value=value, description=label, **kw))
>>> head.controls["head"].value = "none"
>>> head.options({"model": "distilgpt2+vocab-head"}, PRESETS["colab-t4"])["model"]
'distilgpt2'
"""
from __future__ import annotations

import functools

from kit import dtypes
from kit.inputs import InputError
from kit import inputs
from kit import models as kmodels
from kit.presets import MODELLED_MARGIN, margin_kept
from kit.scenarios.custom_head import scenario
from kit.units import fmt_bytes

HEADS = [("V×V head, as the user wrote it", "vxv"), ("low-rank head V→r→V: fix (b)", "low-rank"),
         ("no head, the LM fine-tuned itself: fix (a)", "none"), ("V×V head in 16 bits, 8-bit AdamW: fix (c)",
                                                                  "vxv-16bit")]
RANKS = dict(min=8, max=2048, step=8)       # the rank slider; fix (b)'s rank is scenario.RANK["real"]
USER_OPTIONS = {"grad_accum": scenario.USER["grad_accum"]}   # the user's, no control shows it
FORCED = ("precision", "optimizer")          # the controls fix (c) sets (and gives back when left)


@functools.lru_cache(maxsize=8)
def _meta_base(base: str):
    """The base LM on the meta device, its embeddings resized for the pad token (built once per base)."""
    return scenario.LowRankHeadModel(kmodels.build_model(base, device="meta"), 1).gpt2


@functools.lru_cache(maxsize=64)
def low_rank_model(base: str, rank: int):
    """Fix (b)'s model on the meta device (nothing allocated), once per base and rank; the ranks share one meta
    base (a new rank builds only its two thin layers)."""
    gpt2 = _meta_base(base)
    return scenario.LowRankHeadModel(gpt2, rank, vocab_size=gpt2.config.vocab_size)


@functools.lru_cache(maxsize=16)
def sixteen_bit(model: str, dtype: str) -> dict:
    """Fix (c)'s settings for ``model`` in ``dtype``: its optimizer (8-bit AdamW, or plain AdamW where bitsandbytes
    would kill the process), the precision (fp16 weights train without autocast), and why 8-bit was refused."""
    meta = kmodels.build_model(model, device="meta", dtype=kmodels.as_dtype(dtype))
    refused = scenario.bnb_8bit_problem(meta)
    return {"optimizer": "adamw-fused" if refused else "adamw-8bit", "load_dtype": dtype,
            "precision": "bf16" if dtype == "bf16" else "fp32", "refused": refused}


class HeadChoice:
    """The head control (``controls["head"]``) and fix (b)'s rank (``controls["head_rank"]``), made with the panel's
    ``control`` factory; :meth:`options` turns the panel's setup into the estimate's, :meth:`adjust` fits the
    other controls to the head and says why."""

    def __init__(self, control, head: str = "vxv", head_rank: int = scenario.RANK["real"]):
        import ipywidgets as W

        head = inputs.choice("head", head, [v for _, v in HEADS])
        rank = inputs.whole_number("head_rank", head_rank, minimum=RANKS["min"])
        if rank > RANKS["max"]:
            raise InputError("head_rank", f"head_rank {rank:,} is beyond the panel's slider ({RANKS['max']:,}): "
                                              "estimate a larger rank with kit.scenarios.custom_head.scenario."
                                              "estimate_fix('b', rank=...).")
        self.controls = {"head": control(W.Dropdown, "head", head, options=HEADS),
                         "head_rank": control(W.IntSlider, "head rank r", rank, **RANKS)}
        self._saved: dict = {}    # the forced controls' values before fix (c) set them

    def applies(self, model: str) -> bool:
        return model.endswith(kmodels.VOCAB_HEAD)

    def _sixteen_bit(self, model: str, preset) -> dict:
        dtype = dtypes.run_dtype(preset.capability)[0] if preset.gpu_bytes is not None else "bf16"
        return sixteen_bit(model, dtype)

    def options(self, setup: dict, preset) -> dict:
        """The estimate's options for the panel's ``setup`` under the chosen head: the model (a name, or fix (b)'s
        module), the user's gradient accumulation, and fix (c)'s dtype, precision and optimizer."""
        model, head = setup["model"], self.controls["head"].value
        if not self.applies(model):
            return {}
        base = model.removesuffix(kmodels.VOCAB_HEAD)
        if head == "none":
            return {**USER_OPTIONS, "model": base}
        if head == "low-rank":
            return {**USER_OPTIONS, "model": low_rank_model(base, self.controls["head_rank"].value)}
        if head == "vxv-16bit":
            fix = self._sixteen_bit(model, preset)
            return {**USER_OPTIONS, **{k: fix[k] for k in ("optimizer", "load_dtype", "precision")}}
        return dict(USER_OPTIONS)

    def run_model(self, model: str) -> str | None:
        """The model a Run trains for this head (a name), or None where the panel's Run cannot build it."""
        head = self.controls["head"].value
        if not self.applies(model) or head == "vxv":
            return model
        return model.removesuffix(kmodels.VOCAB_HEAD) if head == "none" else None

    def run_problem(self, model: str) -> str | None:
        """Why the panel's Run cannot train this head, or None."""
        if self.run_model(model) is not None:
            return None
        return ("the panel's Run trains the V×V head or no head; notebook 01 measures fix (b) and fix (c) "
                "(nb.live_fix('b'), nb.live_fix('c'))")

    def html(self, est, preset) -> str:
        return ""

    def adjust(self, controls: dict, why: dict, preset, model: str) -> None:
        """Enable the head where the model has one; fix (c) sets precision and optimizer (given back when left)."""
        head, applies = self.controls["head"].value, self.applies(model)
        controls["head"].disabled = not applies
        controls["head_rank"].disabled = not applies or head != "low-rank"
        if not applies:
            why["head"] = "this model has no V×V head: pick a +vocab-head model to change it"
        forced = self._sixteen_bit(model, preset) if applies and head == "vxv-16bit" else None
        for key in FORCED:
            if forced is not None:
                self._saved.setdefault(key, controls[key].value)
                controls[key].value, controls[key].disabled = forced[key], True
                why[key] = "set by fix (c)" + (": 16-bit weights train without autocast (GradScaler refuses fp16 "
                                               "gradients)" if key == "precision" else "")
            elif key in self._saved:
                controls[key].value, controls[key].disabled = self._saved.pop(key), False
        if applies:
            why["head"] = self.head_reason(model, preset, forced)
        if applies and head == "low-rank":
            why["head_rank"] = f"fix (b) in notebook 01 takes r = {scenario.RANK['real']}"

    def head_reason(self, model: str, preset, forced: dict | None) -> str:
        head = self.controls["head"].value
        v = kmodels.get_config(model.removesuffix(kmodels.VOCAB_HEAD)).vocab_size + 1
        if head == "vxv":
            return f"Linear({v:,}, {v:,}): {v * v + v:,} trainable parameters, each with fp32 weight, grad and " \
                   "two AdamW moments"
        if head == "none":
            return "no head: the LM's own output layer gives the logits, and every weight of the LM trains"
        if head == "low-rank":
            r = self.controls["head_rank"].value
            return f"Linear({v:,}, {r}) then Linear({r}, {v:,}): {2 * v * r + v:,} trainable parameters"
        n, dtype = v * v + v, forced["load_dtype"]   # the head's parameters, 2 bytes each in 16 bits
        if not forced["refused"]:
            return f"{dtype} weights and grads {fmt_bytes(4 * n)}; 8-bit AdamW's two moments {fmt_bytes(2 * n)}"
        limit = preset.gpu_bytes or preset.ram_bytes
        return (f"{dtype} weights and grads {fmt_bytes(4 * n)}; AdamW's two moments in {dtype} {fmt_bytes(4 * n)}. "
                f"8-bit AdamW is refused here: {forced['refused']} Even it would keep {fmt_bytes(6 * n)} of weights, "
                f"grads and state for the head alone, against the {fmt_bytes(limit - margin_kept(limit))} usable of "
                f"{fmt_bytes(limit)} (less the {MODELLED_MARGIN:.0%} margin kept while the figures are modelled)")
