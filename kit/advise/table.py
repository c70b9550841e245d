"""The levers, and what each buys on your setup: every change the fit advisor knows, tried alone on the setup as
it is, cheapest first, each with its estimated peak and reserved figure beside the setup's own. Prediction only:
each row is one :func:`kit.estimate.estimate` (the advisor's search, :mod:`kit.advise.search`, combines them).

A searched move is shown at its probe: the smaller micro-batch at batch 1 (with the accumulation that keeps the
effective batch), the shorter sequence at an eighth. A lever that does not apply says why in a word.

>>> t = levers(dict(model="tiny-llama", batch_size=8, seq_len=128, optimizer="adamw"), "colab-t4")
>>> [r.name for r in t.rows][:3]
['allocator: expandable segments', "Liger's kernels", 'fused AdamW']
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.advise.core import limit_for, setup_options
from kit.advise.search import MOVES, Search, cli
from kit.estimate.inventory import modules_read_once
from kit.presets import short_label
from kit.units import GiB, fmt_bytes, wrapped

NAMES = {   # move -> what a practitioner calls it
    "expandable": "allocator: expandable segments", "liger": "Liger's kernels", "fused": "fused AdamW",
    "sdpa": "sdpa attention", "padding-free": "padding-free rows (TRL)", "split": "smaller micro-batch, accumulate",
    "eval": "smaller eval batch", "paged-adam": "paged AdamW (32-bit)", "ckpt": "gradient checkpointing",
    "ckpt-half": "checkpointing every 2nd block", "ckpt-offload": "checkpointing + offload",
    "trl-offload": "TRL's activation offloading",
    "mixed": "mixed precision", "lean": "lean k-bit recipe", "w16": "16-bit weights", "adam8": "8-bit AdamW",
    "paged-adam8": "paged 8-bit AdamW", "seq": "shorter sequences", "head-lora": "LoRA on the outsized layer",
    "lora-all": "LoRA on every linear layer", "lora": "LoRA (peft's targets)", "8bit": "8-bit base weights",
    "4bit": "4-bit base weights (QLoRA)",
}
# A mixture-of-experts model's levers, as the rows above give them: its experts are fused 3-D parameters, no
# nn.Linear, so peft's target_modules (its defaults, or all-linear) reach the attention only and the experts stay
# frozen; every saved tensor of the experts spans tokens x top-k routed rows (kit.estimate.replay.moe), so fewer
# tokens per micro-batch route fewer rows.
MOE_NOTE = ("mixture of experts: the LoRA rows adapt the attention only (the experts are fused parameters, no "
            "Linear: they stay frozen); the smaller micro-batch and shorter sequences route fewer tokens "
            "(tokens x top-k rows) per step")
TIERS = {0: "free", 1: "slower, same result", 2: "slower (recompute)", 3: "numerics", 4: "numerics",
         5: "changes the data", 6: "changes the training", 7: "changes the model", 8: "changes the model"}


@dataclass(frozen=True)
class Row:
    name: str
    cost: str                 # the cost tier in words (the advisor's ranking)
    cli: str                  # the change as estimate CLI options ("" where it does not apply)
    peak_bytes: int | None    # None: the lever does not apply here, or the estimator refuses it
    reserved_bytes: int | None
    fits: bool | None
    why_not: str = ""


@dataclass(frozen=True)
class Levers:
    setup_peak_bytes: int
    setup_reserved_bytes: int
    limit_bytes: int
    label: str
    rows: tuple
    notes: tuple = ()   # what the levers mean for this model (a mixture of experts: :data:`MOE_NOTE`)

    @wrapped
    def __str__(self) -> str:
        unit, div = ("GiB", GiB) if self.limit_bytes >= GiB else ("MiB", 2**20)
        shown = [r for r in self.rows if r.peak_bytes is not None]
        fit = [r.name for r in shown if r.fits]
        answer = (f"alone, {len(fit)} of {len(shown)} levers make it fit: {'; '.join(fit)}" if fit else
                  f"alone, none of the {len(shown)} levers makes it fit: combine them (the fit advisor does)")
        # the reserved figure is the one judged; each Row keeps its peak (peak_bytes) beside it
        out = [f"your setup: reserved {fmt_bytes(self.setup_reserved_bytes, unit)} against "
               f"{short_label(self.label)} (ESTIMATED); {answer}",
               f"  {'lever':<31} {'cost':<20} {'reserved':>8}  change ({unit})"]
        out += [f"  {r.name:<31} {r.cost:<20} {r.reserved_bytes / div:>8.2f}  {r.cli}" for r in shown]
        idle = [r.name for r in self.rows if r.peak_bytes is None]
        if idle:
            out.append(f"not for this setup (already so, or it does not apply): {', '.join(idle)}")
        return "\n".join(out + list(self.notes))


@modules_read_once()
def levers(setup, device="colab-t4") -> Levers:
    """Each lever the advisor knows, alone on ``setup`` (a dict of estimate() options, an Estimate or a Trainer),
    judged against ``device`` as :func:`kit.advise.advise` judges: its reserved figure."""
    lim = limit_for(device)
    s = Search(setup_options(setup, lim)[0], lim)
    be, rows = s.base_est, []
    for name in sorted(MOVES, key=lambda move: (MOVES[move][1], list(MOVES).index(move))):
        move, tier = MOVES[name]
        ch = move(dict(s.base), s)
        e = s.estimate({**s.base, **ch}) if ch else None
        label, cost = NAMES.get(name, name), TIERS[tier]
        if e is None:
            why = "already so, or not for this setup" if ch is None else "the estimator refuses it here"
            rows.append(Row(label, cost, "", None, None, None, why))
            continue
        rows.append(Row(label, cost, cli(s.changes({**s.base, **ch})), e.peak_bytes, s.lim.judged(e), s.fits(e)))
    moe = any(getattr(note, "code", "") == "moe-routing" for note in be.notes)
    return Levers(be.peak_bytes, lim.judged(be), lim.usable_bytes, lim.label, tuple(rows), (MOE_NOTE,) * moe)
