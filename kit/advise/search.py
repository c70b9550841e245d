"""The fit advisor's search space and search (:mod:`kit.advise` is its API): the moves, what each costs,
the bounded search over them, and the largest batch and sequence under a limit.

A move maps options (estimate()'s keywords) to the options it changes, or None where it does not apply. The
searched moves (shorter sequences, a smaller micro-batch) are probed at their extreme, then refined to the least.

>>> cli({"batch-size": 1, "grad-accum": 32, "gradient-checkpointing": True})
'--batch-size 1 --grad-accum 32 --gradient-checkpointing'
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

from kit.inputs import ALL_LINEAR

from kit import inputs
from kit import optimizers
from kit.estimate import Estimate, estimate
from kit.estimate.core import Planned, finished, planned
from kit.advise import levers
from kit.advise.costs import LORA_R, cost, trains_weights
from kit.advise.edge import largest_fitting, largest_judged, largest_replayed
from kit.estimate.inventory import info_for
from kit.training_setup import DEFAULTS, KEYWORDS, SUGGESTED, flag_of

BATCH_CAP, SEQ_CAP = 65536, 1 << 20   # max_batch_size / max_seq_len search no further
MIN_ROW_TOKENS = 32   # the shortest training row the advisor suggests (scenario 2's user trains rows of 30)
# estimate() keyword -> the estimate CLI's option (its long name without the dashes), as `changes` names it
CLI = {k: flag_of(k).lstrip("-") for k in SUGGESTED}
KW = ("model",) + KEYWORDS   # what a setup dict holds: estimate()'s keywords


# -- the moves ----------------------------------------------------------------------------------------------
def _liger(setup, search):   # Liger's kernels, where a GPU runs them (the estimate refuses a family they do not patch)
    return None if setup.get("liger_kernel") or search.lim.kernels != "cuda" else {"liger_kernel": True}


def _ckpt_half(setup, search):   # checkpointing every other block: about half the recompute, part of the saving
    return None if setup["gradient_checkpointing"] or search.base["seq_len"] != setup["seq_len"] else \
        {"gradient_checkpointing": True, "ckpt_every_n_layers": 2}


def _offload(key):   # what checkpointing keeps, to pinned RAM: transformers' save_on_cpu, or TRL's offloader
    def move(setup, search):
        if setup.get(key) or (key == "activation_offloading" and not setup.get("fused_lm_head")) or \
                setup.get("ckpt_every_n_layers", 1) != 1 or \
                (key == "checkpoint_offload" and setup.get("activation_offloading")):
            return None
        return {"gradient_checkpointing": True, key: True}
    return move


def _paged32(setup, search):   # the same AdamW in 32 bits, its state paged off the allocator (bitsandbytes)
    if setup["optimizer"] not in ("adamw", "adamw-fused"):
        return None
    if search.too_big and trains_weights(setup):   # bitsandbytes 0.50 backends/cuda/ops.py: ct.c_int32(g.numel())
        search.notes.add(f"paged AdamW (bitsandbytes) is not suggested: {search.too_big} has more than 2^31 - 1 "
                         "elements, "
                    "and bitsandbytes passes its 32-bit optimizer kernel the element count as a C int32")
        return None
    return {"optimizer": "paged-adamw"}


def _adam8(paged):
    def move(setup, search):
        if setup["optimizer"] not in ("adamw", "adamw-fused"):   # 8-bit AdamW replaces a 32-bit AdamW only
            return None
        if search.too_big and trains_weights(setup):
            search.notes.add(f"8-bit AdamW is not suggested: {search.too_big} has more than 2^31 - 1 elements, and "
                        "bitsandbytes' 8-bit optimizer kills the process on it (no exception; seen on an H200: "
                        "docs/known-failures.md)")
            return None
        return {"optimizer": "paged-adamw-8bit" if paged else "adamw-8bit"}
    return move


def _lora(targets):
    return lambda setup, search: \
        None if setup["lora_r"] or search.info.vocab_head or setup["quantization"] != "none" else \
        {"lora_r": LORA_R, "lora_targets": targets}


def _quant(bits):
    def move(setup, search):
        if setup["quantization"] != "none":
            return None
        lora = {} if setup["lora_r"] or search.info.vocab_head else {"lora_r": LORA_R, "lora_targets": ALL_LINEAR}
        trl = {"kbit_recipe": "lean", "adapter_dtype": "bf16"} if setup.get("fused_lm_head") else {}  # as SFTTrainer
        load = search.lim.half if setup["lora_r"] or lora else setup["load_dtype"]
        return {"quantization": bits, **lora, **trl, "load_dtype": load}
    return move


def _w16(setup, search):
    if setup["load_dtype"] != "fp32" or setup["quantization"] != "none":
        return None
    if trains_weights(setup):  # fp16 trained weights under fp16 autocast: Trainer's grad scaler refuses them
        return {"load_dtype": "bf16", **({"precision": "bf16"} if setup["precision"] == "fp16" else {})}
    return {"load_dtype": search.lim.half}


def _eval(setup, search):   # probed at eval batch 1; the gathered logits leave the GPU every step
    if not search.evaluates or setup["eval_batch_size"] == 1 and (setup["eval_gather"] == "loss"
                                                                 or setup["eval_accumulation_steps"]):
        return None
    return {"eval_batch_size": 1, **({"eval_accumulation_steps": 1} if setup["eval_gather"] != "loss"
                                     and not setup["eval_accumulation_steps"] else {})}


def _head(setup, search):
    if setup["lora_r"] or not search.outsized:
        return None
    name, fin, fout = search.outsized
    return {"lora_r": max(8, min(256, min(fin, fout) // 64)), "lora_targets": (name,)}


def _expandable(setup, search):   # judged on reserved, on a GPU: the setting changes nothing else
    if setup.get("expandable_segments") or search.lim.kernels != "cuda" or search.lim.safety_fraction is not None:
        return None
    return {"expandable_segments": True}


# name -> (move, tier). Moves apply in this order (structure, dtypes, optimizer, shapes); within a tier, the
# earlier one ranks first.
MOVES = {
    "expandable": (_expandable, 0),   # the allocator setting: no tensor changes, only what is reserved
    "liger": (_liger, 0),             # a chunked loss and fused layer kernels: the same math
    "head-lora": (_head, 6), "lora-all": (_lora(ALL_LINEAR), 6), "lora": (_lora(None), 6),
    "8bit": (_quant("8bit"), 7), "4bit": (_quant("4bit"), 8),
    "mixed": (lambda setup, search: {"precision": search.lim.half} if setup["precision"] == "fp32" else None, 3),
    "lean": (lambda setup, search: {"kbit_recipe": "lean"}
             if setup["quantization"] != "none" and setup["kbit_recipe"] == "standard"
             else None, 3),
    "w16": (_w16, 3), "adam8": (_adam8(False), 3), "paged-adam8": (_adam8(True), 3),
    "fused": (lambda setup, search: {"optimizer": "adamw-fused"} if setup["optimizer"] == "adamw" else None, 0),
    "sdpa": (lambda setup, search: {"attn_implementation": "sdpa"} if setup["attn_implementation"] == "eager" else None,
             0),
    "ckpt-half": (_ckpt_half, 2),   # before full checkpointing: less recompute where it is enough
    "ckpt": (lambda setup, search: None if setup["gradient_checkpointing"] else {"gradient_checkpointing": True}, 2),
    "ckpt-offload": (_offload("checkpoint_offload"), 2), "trl-offload": (_offload("activation_offloading"), 2),
    "eval": (_eval, 1),
    # probed at their extreme (1/8 of the sequence, batch 1), then refined to the least change that fits
    "seq": (lambda setup, search: {"seq_len": max(1, setup["seq_len"] // 8)}
            if setup["seq_len"] > search.min_seq_len else None, 5),
    "split": (lambda setup, search: {"batch_size": 1, "grad_accum": setup["grad_accum"] * setup["batch_size"]}
              if setup["batch_size"] > 1 else None, 1),
    "paged-adam": (_paged32, 1),   # after the split: it needs bitsandbytes, which Colab lacks
    "padding-free": (levers.padding_free, 0),   # where TRL runs: the same tokens in one row (kit.advise.levers)
}


def _tier(move, setup) -> int:
    return 4 if move == "w16" and trains_weights(setup) else MOVES[move][1]


@dataclass
class Suggestion:
    """One way to fit: ``changes`` (the estimate CLI's options), its peak and margin, what it costs."""

    changes: dict
    cli: str
    peak_bytes: int
    fits: bool
    margin_bytes: int
    costs: list
    tiers: tuple               # the cost tier of each change, costliest first (the module doc's order)
    cpu_build_bytes: int
    eval_peak_bytes: int
    options: dict = field(repr=False, default_factory=dict)   # estimate()'s keywords, in full
    rank: tuple = field(repr=False, default=())
    reserved_bytes: int = 0    # its predicted max_memory_reserved() (kit.estimate.reserved)
    tight: bool = False        # within the limit but not its margin kept (kit.advise.core.Limit.usable_bytes)
    # () -> (the largest batch, the longest sequence) that fit with this change. Found on first read, not by the
    # search: only --json reads them, and finding them runs the allocator's model a few times a suggestion (two
    # thirds of a 70B advise() where they were found for every suggestion). None: (0, 0).
    largest: Callable[[], tuple] | None = field(repr=False, compare=False, default=None)

    @functools.cached_property
    def _largest(self) -> tuple:
        return self.largest() if self.largest else (0, 0)

    @property
    def max_batch_size(self) -> int:
        """The largest batch that fits with this change (0: none)."""
        return self._largest[0]

    @property
    def max_seq_len(self) -> int:
        """The longest sequence that fits with this change (0: none)."""
        return self._largest[1]

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("changes", "cli", "peak_bytes", "reserved_bytes", "fits", "tight",
                                           "margin_bytes", "costs",
                                           "max_batch_size", "max_seq_len", "cpu_build_bytes", "eval_peak_bytes")}
        return d | {"tiers": list(self.tiers)}


def _key(setup: dict) -> tuple:
    """A setup's cache key: its options, an object by identity."""
    return tuple((k, v if isinstance(v, (str, int, float, tuple, type(None))) else id(v)) for k, v in setup.items())


class Cancelled(Exception):
    """The search was called off (``advise(..., cancelled=...)`` said so): its caller no longer wants it."""


class Search:
    """One advise() call: the base options, the limit, and every estimate made (cached by options).
    ``rows``: the examples one flattened (padding-free) row holds; ``cancelled``: a callable asked before each new
    estimate; when it returns True, :class:`Cancelled` is raised."""

    def __init__(self, base: dict, lim, evaluates: bool = False, rows: int = 1, cancelled=None):
        self.lim, self.cache, self.plans, self.notes, self.evaluates = lim, {}, {}, set(), evaluates
        self.waiting = []   # the last level's nodes not yet estimated (level, completed)
        self.min_seq_len = MIN_ROW_TOKENS * rows
        self.cancelled = cancelled
        base = {**DEFAULTS, "lora_targets": None, "lora_dropout": 0.0, "padded": True, "padding_free": False, **base}
        b = estimate(**base)   # the setup itself: its errors are the user's, raised as they are
        base["lora_targets"] = inputs.targets(base["lora_targets"])
        self.info = info_for(base)
        self.base = {**base, **{k: b.setup[k] for k in KW if k in b.setup and k not in ("model",
                                                                                        "checkpoint_reentrant")}}
        self.base_est = b
        big = [l for l in self.info.leaves if l.kind == "linear" and l.trainable]
        top = max(big, key=lambda leaf: leaf.weight, default=None)
        self.outsized = (top.name, top.fin, top.fout) if top and not self.base["lora_r"] and \
            top.weight > b.trainable_params / 2 else None
        self.too_big = next((l.name + ".weight" for l in self.info.leaves
                             if l.trainable and optimizers.over_int32(l.weight)),
                            None)
        self.maxpos = min(self.info.max_positions or SEQ_CAP, SEQ_CAP)
        self.notes |= levers.notes(self)   # TRL's chunked_nll and padding-free, where they do not help

    def estimate(self, setup: dict) -> Estimate | None:
        key = _key(setup)
        if key not in self.cache:
            if self.cancelled is not None and self.cancelled():
                raise Cancelled
            try:
                plan = self._planned(setup, key)
                self.cache[key] = None if plan is None else finished(plan)
            except ValueError:   # a combination the estimator refuses (e.g. targets that match nothing)
                self.cache[key] = None
        return self.cache[key]

    def _planned(self, setup: dict, key: tuple) -> Planned | None:
        if key not in self.plans:
            try:
                self.plans[key] = planned(**setup)
            except ValueError:
                self.plans[key] = None
        return self.plans[key]

    def cannot_fit(self, setup: dict) -> bool:
        """Known before its replay: the weights and optimizer state alone are over the usable bytes (a 70B
        model's candidates that keep 16-bit weights on one GPU), so its replay can wait until it is shown."""
        key = _key(setup)
        if key in self.cache:
            return False
        plan = self._planned(setup, key)
        return plan is not None and plan.floor_bytes > self.lim.usable_bytes

    def peak(self, setup: dict, what: str = "judged") -> float:
        """The peak ``fits`` judges (training's; evaluation's too where it is judged), or one field."""
        e = self.estimate(setup)
        if e is None:
            return float("inf")
        return self.lim.judged(e, self.evaluates, exact=False) if what == "judged" else getattr(e, what)

    def fits(self, est) -> bool:
        """The judged peak fits the device, the CPU build its RAM, and what training keeps in that RAM fits it
        too: optimizer state paged out of the GPU's allocator (bitsandbytes' managed memory, paged to RAM under
        pressure) and offloaded activations (pinned)."""
        return est is not None and self.lim.judged(est, self.evaluates, exact=False) <= self.lim.usable_bytes \
            and max(est.cpu_build_bytes, est.paged_optimizer_bytes + est.offloaded_bytes) \
            <= self.lim.ram_for_model_bytes

    def apply(self, names) -> dict | None:
        o = dict(self.base)
        for m in (m for m in MOVES if m in names):
            ch = MOVES[m][0](o, self)
            if ch is None:
                return None
            o.update(ch)
        return o

    def level(self, sets, enough: int) -> list:
        """The nodes (names, options, estimate) of these move sets, the searched moves at their probe. They are
        estimated cheapest first (the cost is known before the estimate); once ``enough`` fit, the costlier
        ones are not estimated at all."""
        todo = {}
        for names in sorted(sets, key=lambda move_set: tuple(i for i, m in enumerate(MOVES) if m in move_set)):
            o = self.apply(names)
            if o is not None:   # the same options reached by two sets of moves: once
                todo.setdefault(tuple(sorted((k, str(v)) for k, v in o.items() if k != "model")), (names, o))
        out, fitting, self.waiting = [], [], []
        for names, o in sorted(todo.values(), key=lambda node: self.prefix(*node)):
            if len(fitting) >= enough and self.prefix(names, o) > fitting[enough - 1]:
                break
            if self.cannot_fit(o):   # estimated only if it is shown (completed)
                self.waiting.append((len(out) + len(self.waiting), names, o))
                continue
            e = self.estimate(o)
            if e is not None:
                out.append((names, o, e))
                fitting += [self.prefix(names, o)] if self.fits(e) else []
        return out if fitting else self.completed(out)

    def completed(self, nodes: list) -> list:
        """``nodes`` (a :meth:`level`'s) with the ones it left unestimated (:meth:`cannot_fit`), estimated, in the
        order the level took them: where nothing fits, every node is shown by how close it comes."""
        out, refused = list(nodes), 0
        for place, names, o in self.waiting:
            e = self.estimate(o)
            if e is None:   # (refused: it takes no place)
                refused += 1
            else:
                out.insert(place - refused, (names, o, e))
        self.waiting = []
        return out

    def refine(self, names, setup, est):
        """The probed moves of a node that fits, taken back to the least change that still fits."""
        if not self.fits(est) or not {"seq", "split", "eval"} & names:
            return names, setup, est
        use, b, setup = self.lim.usable_bytes, self.base, dict(setup)   # (use: the eval batch's limit, as allocated)
        if "seq" in names:   # costlier than the split: keep as much of the sequence as fits
            setup["seq_len"] = largest_judged(lambda size: self.estimate({**setup, "seq_len": size}), self.lim,
                                              setup["seq_len"],
                                          b["seq_len"] - 1, evaluates=self.evaluates)
        if "split" in names:
            divs = [d for d in divisors(b["batch_size"]) if d < b["batch_size"]]
            setup["batch_size"] = divs[largest_judged(lambda index: self.estimate({**setup, "batch_size": divs[index]}),
                                                      self.lim, 0,
                                                  len(divs) - 1, evaluates=self.evaluates)]
            setup["grad_accum"] = b["grad_accum"] * b["batch_size"] // setup["batch_size"]
        if "eval" in names:
            setup["eval_batch_size"] = largest_fitting(lambda size: self.peak({**setup, "eval_batch_size": size},
                                                                               "eval_peak_bytes"),
                                                   1, b["eval_batch_size"], use)
        return names, setup, self.estimate(setup)

    def too_short(self, node) -> bool:
        """A node whose rows are cut below :data:`MIN_ROW_TOKENS` (after :meth:`refine`): never suggested."""
        o = node[1]
        return o["seq_len"] != self.base["seq_len"] and o["seq_len"] < self.min_seq_len

    def changes(self, setup) -> dict:
        b = self.base
        changes = {CLI[k]: cli_value(setup[k]) for k in CLI if setup[k] != b[k]}
        if {"quantization", "kbit-recipe"} & set(changes):   # they change checkpointing's default: say it
            changes["gradient-checkpointing"] = setup["gradient_checkpointing"]
        return changes

    def prefix(self, names, setup) -> tuple:
        """The cost rank known before estimating: the tiers, costliest first; the moves' order; the options."""
        return (tuple(sorted((_tier(m, setup) for m in names), reverse=True)),
                tuple(i for i, m in enumerate(MOVES) if m in names), len(self.changes(setup)))

    def rank(self, node) -> tuple:
        """Cheapest first: fits, then the costliest change's tier (then the next), fewer options, lower peak."""
        names, o, e = node
        return (not self.fits(e),) + self.prefix(names, o) + (e.peak_bytes,)

    def suggestion(self, names, setup, est) -> Suggestion:
        costs = [cost(m, self.base, setup, self.base_est, est) for m in MOVES if m in names]
        changes, rank = self.changes(setup), self.rank((names, setup, est))
        fits, margin = self.fits(est), self.margin(est)
        tight = not fits and self.lim.judged(est, self.evaluates) <= self.lim.limit_bytes and \
            est.cpu_build_bytes <= self.lim.ram_for_model_bytes
        return Suggestion(changes=changes, cli=cli(changes), peak_bytes=est.peak_bytes, fits=fits, margin_bytes=margin,
                          costs=costs, tiers=rank[1], cpu_build_bytes=est.cpu_build_bytes,
                          eval_peak_bytes=est.eval_peak_bytes, options=setup, rank=rank,
                          reserved_bytes=est.reserved_bytes, tight=tight, largest=lambda: self.largest(setup))

    def margin(self, est) -> int:
        """The usable limit less what is judged (:meth:`kit.advise.core.Limit.judged`)."""
        return self.lim.usable_bytes - self.lim.judged(est, self.evaluates)

    def largest(self, setup) -> tuple[int, int]:
        return tuple(largest_replayed(lambda size, key=k: self.estimate({**setup, key: size}), self.lim, 1, top,
                                      setup[k], self.evaluates)
                     for k, top in (("batch_size", BATCH_CAP), ("seq_len", self.maxpos)))


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, smallest first, in about sqrt(n) steps (a batch of 10**10 answers at once).

    >>> divisors(12), divisors(1), divisors(10**10)[-3:]
    ([1, 2, 3, 4, 6, 12], [1], [2500000000, 5000000000, 10000000000])
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def cli_value(value):
    return ",".join(value) if isinstance(value, tuple) else value


def cli(changes: dict) -> str:
    """The changes as options to append to ``python -m kit estimate`` / ``fit`` (argparse: the last one wins).

    >>> cli({"batch-size": 1, "grad-accum": 32, "gradient-checkpointing": True})
    '--batch-size 1 --grad-accum 32 --gradient-checkpointing'
    """
    return " ".join((f"--{k}" if v else "--no-" + k) if isinstance(v, bool) else f"--{k} {v}"
                    for k, v in changes.items())


