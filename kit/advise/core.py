"""The fit advisor: which changes make a training setup fit a device, cheapest first, and the largest
batch and sequence that fit. Prediction only: every number is an :func:`kit.estimate.estimate` call,
nothing is loaded, and kit.measure.device is imported only for ``device="this"``. The moves and the search are
:mod:`kit.advise.search`'s.

Cost order (tiers; a suggestion of several changes ranks by its costliest change, then the next; within a
tier, in the order below; then fewer changed options, then the lower peak):

0. free: the allocator's ``expandable_segments`` (an environment variable set before CUDA starts: only what is
   reserved changes, judged on a GPU); fused AdamW in place of the foreach step, sdpa in place of eager
   attention (the same math); where
   TRL runs (``loss_type`` or its fused head) on padded rows, padding-free: the same rows and loss in one row of
   the same tokens, estimated at those tokens (the padding the rows really carry is saved on top, unknown to
   the estimate; at equal tokens its block-diagonal mask usually makes it no saving, and a note says so).
   TRL's ``loss_type="chunked_nll"`` is never a change: TRL 1.16 makes it "nll", already computed in tiles
   (a note says so; :mod:`kit.advise.levers`);
1. slower, same result: a smaller per-device batch with more accumulation (the effective batch is kept); paged
   32-bit AdamW (bitsandbytes): the same update, its state in CUDA managed memory, paged to RAM under pressure;
2. gradient checkpointing, slower by a rule of thumb (not measured): the checkpointed blocks run their forward
   again in the backward. With every weight trained a backward costs about two forwards, so a step goes from
   about 3 forward-costs to 4 (+33%); with the blocks frozen (LoRA, a head on top) it makes no weight grads
   there, about one forward, so 2 to 3 (+50%);
3. numerics: fp16/bf16 mixed precision, the lean k-bit recipe, 16-bit frozen weights, 8-bit AdamW, paged
   8-bit AdamW (never where a trainable tensor has more than 2^31 - 1 elements: bitsandbytes kills the
   process there);
4. 16-bit trained weights (no fp32 master copy);
5. shorter sequences: what the model sees changes;
6. a changed model or training: LoRA on an outsized trainable layer (more than half the trainable
   parameters in one Linear, as scenario 1's V x V head: ``--lora-r 256 --lora-targets custom_layer``),
   LoRA (rank 16) on every linear layer or on peft's default targets in place of full fine-tuning;
7. and 8. 8-bit, then 4-bit base weights with LoRA.
9. where no change on one GPU fits: the fewest GPUs that do, sharded with FSDP (:mod:`kit.advise.gpus`).

Single changes are tried first. Only when none fits: every pair, then a third change on the
:data:`BEAM` pairs of lowest peak: a few hundred estimates at most, cached within the call.

The limit is what torch can allocate (a preset, this GPU now, or a number of bytes), less the margin that "fits"
keeps while a figure is modelled and not measured on a GPU (:data:`kit.presets.MODELLED_MARGIN`, 5% of the limit):
the *usable* bytes. A setup or change within the limit but over the usable bytes is *tight*, never "fits", and the
search goes on for changes that leave the margin. What must fit is the estimate's *reserved* figure
(``Estimate.reserved_bytes``): the allocated peak plus what the caching allocator holds beyond it (requests
rounded up to 512 B, large ones carved from 2 MiB or 20 MiB segments, freed blocks a
new size cannot reuse), modelled on the step laid out as tensors (:mod:`kit.estimate.reserved`), with or without
``expandable_segments`` as the setup says. ``safety=F`` replaces that model with a flat fraction F of the limit
kept free against the allocated peak, in place of the margin (``safety=0``: the allocated peak alone, against the
whole limit). The model's CPU build must fit in
RAM as well (it does not depend on batch or sequence).

>>> a = advise(dict(model="tiny-llama", batch_size=8, seq_len=128, device="cpu"), 80_000_000, safety=0)
>>> a.fits, a.suggestions[0].cli, a.max_batch_size
(False, '--batch-size 4 --grad-accum 2', 6)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit.inputs import InputError

from kit import inputs
from kit import trainer_kinds
from kit.advise.gpus import shard_suggestion
from kit.advise import said
from kit.advise.answer import biggest_cause, classes_of
from kit.advise.objects import in_objects
from kit.advise.edge import largest_fitting, largest_replayed
from kit.advise.search import BATCH_CAP, KW, MOVES, SEQ_CAP, Search
from kit.dtypes import run_dtype, trainer_precision
from kit.estimate import Estimate, estimate
from kit.estimate.from_objects import estimate_trainer
from kit.estimate.inventory import info_for, modules_read_once
from kit.estimate.read_model import read_model
from kit.presets import GPU_PRESETS, MODELLED_MARGIN, kernel_said, resolve_device
from kit.units import fmt_bytes, wrapped

SAFETY = None            # None: judge the modelled reserved figure; a fraction: keep it free instead (see the doc)
BEAM, MAX_CHANGES, MAX_SUGGESTIONS = 4, 3, 5   # triples grow from the BEAM pairs of lowest peak


@dataclass(frozen=True)
class Limit:
    """What a setup must fit: ``limit_bytes`` torch can allocate (RAM on the cpu preset; less the safety
    fraction where one is given, else judged against the reserved estimate), and ``ram_bytes`` for building the
    model. ``half``: the 16-bit type to suggest there."""

    name: str
    label: str
    limit_bytes: int
    ram_bytes: int
    safety_fraction: float | None = SAFETY
    half: str = "bf16"
    kernels: str = "cuda"   # estimate(device=...): "cpu" on the cpu preset
    runtime_ram_bytes: int = 0   # what the runtime holds in RAM before the model (kit.presets.Preset's)

    @property
    def ram_for_model_bytes(self) -> int:
        """The RAM left to build the model once the runtime holds its own."""
        return self.ram_bytes - self.runtime_ram_bytes

    @property
    def margin_fraction(self) -> float:
        """The share of the limit kept free: the safety fraction where one is given, else the modelled margin."""
        return MODELLED_MARGIN if self.safety_fraction is None else self.safety_fraction

    @property
    def usable_bytes(self) -> int:
        """The limit less the share kept free (:attr:`margin_fraction`): what a setup that fits may use."""
        return int(self.limit_bytes * (1 - self.margin_fraction))

    def judged(self, est, evaluates: bool = False, exact: bool = True) -> int:
        """What of estimate ``est`` must fit :attr:`usable_bytes`: its reserved figure (the allocated peak plus the
        allocator's modelled gap), or the allocated peak where a safety fraction stands in for the gap; the
        evaluation's where it is judged and higher. ``exact=False``: a peak over the limit already is returned
        without the gap (it fails either way, and the allocator's model is not run: the search's shortcut)."""
        peak = max(est.peak_bytes, est.eval_peak_bytes if evaluates else 0)
        if self.safety_fraction is not None or not exact and peak > self.usable_bytes:
            return peak
        return peak + est.reserved_gap_bytes


def limit_for(device="colab-t4", safety=SAFETY) -> Limit:
    """A preset name, ``"this"`` (this GPU, now), a number of bytes (``16e9``, ``"16GiB"``) or a Preset
    (read by :func:`kit.presets.resolve_device`). The 16-bit type to suggest comes from the GPU's compute
    capability (:func:`kit.dtypes.run_dtype`).

    >>> round(limit_for("colab-t4").usable_bytes / 2**30, 2), round(limit_for("colab-t4", 0).usable_bytes / 2**30, 2)
    (13.83, 14.56)
    """
    safety = None if safety is None else inputs.fraction("safety", safety, maximum=0.5)
    if isinstance(device, Limit):
        return device
    p, _ = resolve_device("this" if isinstance(device, str) and device.strip().lower() == "this gpu" else device)
    if p.gpu_bytes is None:   # training itself runs in the RAM the runtime leaves
        return Limit(p.name, p.label, p.ram_for_model_bytes, p.ram_bytes, safety, "bf16", "cpu", p.runtime_ram_bytes)
    return Limit(p.name, p.label, p.gpu_bytes, p.ram_bytes, safety,
                 run_dtype(p.capability)[0] if p.capability else "bf16", "cuda", p.runtime_ram_bytes)


@dataclass
class Advice:
    """The verdict for a setup and device, the largest batch and sequence that fit, and the ranked suggestions."""

    fits: bool
    peak_bytes: int
    limit: Limit
    margin_bytes: int          # usable_bytes - Limit.judged(the estimate) (reserved, or the peak); < 0: short
    cpu_build_bytes: int
    max_batch_size: int        # 0: not even 1 fits (the peak judged; RAM does not depend on it)
    max_seq_len: int
    suggestions: list          # kit.advise.search.Suggestion, cheapest first
    notes: list
    evaluates: bool = False    # evaluate()'s peak is judged too (in ``fits``)
    eval_peak_bytes: int = 0   # Trainer.evaluate() at the eval batch
    max_eval_batch_size: int = 0   # 0: not computed (evaluates False and the eval peak fits) or none fits
    options: dict = field(repr=False, default_factory=dict)
    # each suggestion in the user's objects (kit.advise.objects.InObjects), where the setup was a Trainer or an
    # Estimate read from objects; [] for options
    objects: list = field(repr=False, default_factory=list)
    reserved_bytes: int = 0    # the setup's predicted max_memory_reserved() (kit.estimate.reserved)
    expandable_segments: bool = False   # the allocator setting it assumes
    cause: str = ""            # the setup's biggest cause, in one line (kit.advise.answer.biggest_cause)
    classes: dict = field(repr=False, default_factory=dict)   # object name -> the user's class (answer.classes_of)
    kernel: str = ""           # the attention kernel the figure assumes, where the GPU changed it (presets.kernel_said)

    def to_json(self) -> dict:
        """The ``python -m kit fit --json`` object (docs/cli-and-api.md's "What will make it fit" lists its fields); a
        suggestion of an object input has ``"objects"`` too (:meth:`kit.advise.objects.InObjects.to_json`)."""
        lim = self.limit
        sug = [s.to_json() for s in self.suggestions]
        for d, o in zip(sug, self.objects):
            d["objects"] = o.to_json()
        return {"fits": self.fits, "peak_bytes": self.peak_bytes, "limit_bytes": lim.limit_bytes,
                "safety_fraction": lim.safety_fraction, "margin_fraction": lim.margin_fraction,
                "usable_bytes": lim.usable_bytes, "tight": self.tight,
                "reserved_bytes": self.reserved_bytes, "expandable_segments": self.expandable_segments,
                "judged": "peak_bytes" if lim.safety_fraction is not None else "reserved_bytes",
                "margin_bytes": self.margin_bytes, "cpu_build_bytes": self.cpu_build_bytes,
                "ram_bytes": lim.ram_bytes, "runtime_ram_bytes": lim.runtime_ram_bytes,
                "ram_fits": self.cpu_build_bytes <= lim.ram_for_model_bytes,
                "device": lim.name, "device_label": lim.label, "max_batch_size": self.max_batch_size,
                "max_seq_len": self.max_seq_len, "evaluates": self.evaluates, "eval_peak_bytes": self.eval_peak_bytes,
                "max_eval_batch_size": self.max_eval_batch_size,
                "suggestions": sug, "notes": self.notes}

    @property
    def tight(self) -> bool:
        """Within the limit, but not the margin kept (:attr:`Limit.margin_fraction`): never "fits"."""
        return not self.fits and self.judged_bytes <= self.limit.limit_bytes and \
            self.cpu_build_bytes <= self.limit.ram_for_model_bytes

    @property
    def judged_bytes(self) -> int:
        """The figure judged against the usable limit (reserved, or the peak under a safety fraction)."""
        return self.limit.usable_bytes - self.margin_bytes

    def judged_name(self) -> str:
        """The name of the figure judged, as the text says it ("reserved (modelled)", "peak (allocated)")."""
        return said.judged_name(self)

    def answer(self) -> list:
        """At most 5 lines: the verdict, what the peak and reserved figures are (where both are shown), the
        biggest cause, and the single best change (in the user's objects where there are some)."""
        return said.answer(self)

    @wrapped
    def text(self, top: int | None = None, details: bool = False) -> str:
        """The answer (:meth:`answer`), then the ranked changes (``top`` rows) one line each and the largest batch
        and sequence that fit; ``details``: each change with its costs and in the user's objects, and the notes."""
        if not details:
            return "\n".join(self.answer() + said.short_rows(self, top))
        return "\n".join(self.answer() + [""] + self.details(top))

    def details(self, top: int | None = None) -> list:
        """The full text: the verdict with both figures, each change with its costs and in the user's objects."""
        return said.details(self, top)

    __str__ = text


def setup_options(setup, lim: Limit, trainer_estimate=None) -> tuple[dict, list]:
    """estimate()'s keywords for an options dict, an Estimate or a Trainer, as the device judged runs them (the CPU
    preset on CPU kernels; a dict's own device where it names one, an Estimate's own on a GPU), in Trainer's
    precision there (:func:`kit.dtypes.trainer_precision`); and notes."""
    if isinstance(setup, dict):
        bad = sorted(set(setup) - set(KW))
        if bad:
            raise InputError("setup", f"setup has keys estimate() does not take ({', '.join(bad)}): use "
                                          f"{', '.join(KW)}.")
        return _as_run({"device": lim.kernels, **setup}, [], lim.kernels if setup.get("device") is None else None,
                       lim)
    if _is_trainer(setup):   # a Trainer
        est = trainer_estimate or estimate_trainer(setup)
        return _as_run({**_from_estimate(est, model=False), "model": read_model(setup.model)[0]}, [],
                       _judged_kernels(lim), lim)
    if not isinstance(setup, Estimate):
        raise InputError("setup", f"setup must be an Estimate, a dict of estimate() options or a Trainer, "
                                      f"not {type(setup).__name__}.")
    return _as_run(_from_estimate(setup), [], _judged_kernels(lim), lim)


def _judged_kernels(lim: Limit) -> str | None:
    """The CPU preset is judged on CPU kernels; a GPU (a preset, or a number of bytes) on the estimate's own."""
    return "cpu" if lim.kernels == "cpu" else None


def _as_run(options: dict, notes: list, device: str | None, lim: Limit) -> tuple[dict, list]:
    """``options`` on ``device`` (None: the device they name, a dict's own), in the precision Trainer runs there,
    with the attention kernel ``lim``'s GPU picks (its preset's architecture; else the options' own ``gpu``)."""
    device = device or options.get("device") or "cuda"
    precision, note = trainer_precision(options.get("precision", "fp32"), device)
    gpu = (lim.name if lim.name in GPU_PRESETS else options.get("gpu")) if device == "cuda" else None
    options = {k: v for k, v in options.items() if k != "gpu"} | ({"gpu": gpu} if gpu else {})
    return {**options, "device": device, "precision": precision}, notes + [note] * bool(note)


def _from_estimate(est, model: bool = True) -> dict:
    """estimate()'s keywords that make ``est`` again: the options it was made from, and with ``model``, its model by
    the name it gives (refused where that name cannot be built again: a module's class)."""
    o = {k: v for k, v in est.options.items() if k in KW}
    if not model:
        return o
    o["model"] = est.setup["model"]
    try:
        info_for(o)
    except ValueError:
        raise InputError("setup", f"this Estimate's model ({o['model']!r}) cannot be rebuilt by name: pass a dict "
                                      "of estimate() options (model=<the config or module>, ...) or the Trainer.")
    return o


@modules_read_once()
def advise(setup, device="colab-t4", *, safety=SAFETY, evaluates=None, trainer_estimate=None,
           cancelled=None) -> Advice:
    """Rank the changes that make ``setup`` fit ``device``, cheapest first (the module doc has the order).

    ``setup``: a dict of :func:`kit.estimate.estimate` options, an Estimate (its ``.setup``) or a Trainer
    (read by ``estimate_trainer``; ``trainer_estimate``: its estimate, when already made). ``device``: a
    preset name, ``"this"`` (this GPU's memory for torch, now), a number of bytes or a :class:`Limit`.
    ``safety``: the fraction of the limit kept free (0 turns it off). ``evaluates``: the run calls
    ``Trainer.evaluate()``, so its peak (at ``eval_batch_size``) must fit too; None: a Trainer's
    ``eval_strategy`` says, else False (the eval peak is then a note). ``cancelled``: a callable asked before each
    estimate of the search; once it returns True, :class:`kit.advise.search.Cancelled` is raised (the panel calls a
    search off when a control moves). A trainer kind with levers of its own (its ``"advise"`` part in
    :mod:`kit.trainer_kinds`: GRPO's, each a change in its config, :func:`kit.advise.grpo_levers.advise_grpo`) gets
    them, for a trainer of that kind or its estimate.

    >>> a = advise(dict(model="distilgpt2+vocab-head", batch_size=1, seq_len=128, grad_accum=16, precision="fp16"))
    >>> a.fits, a.suggestions[0].changes
    (False, {'lora-r': 256, 'lora-targets': 'custom_layer', 'load-dtype': 'fp16'})
    """
    lim = limit_for(device, safety)
    if _is_trainer(setup) and trainer_estimate is None:
        trainer_estimate = estimate_trainer(setup)
    read = trainer_estimate if _is_trainer(setup) else setup if isinstance(setup, Estimate) else None
    levers = trainer_kinds.part_of(read.kind, "advise") if read is not None else None
    if levers is not None:   # a trainer kind with levers of its own (kit.trainer_kinds), in its own config
        return levers(read, lim, setup.model.config if _is_trainer(setup) else None)
    opts, notes = setup_options(setup, lim, trainer_estimate)
    if evaluates is None:
        strategy = getattr(getattr(setup, "args", None), "eval_strategy", "no")
        evaluates = getattr(setup, "eval_dataset", None) is not None and \
            str(getattr(strategy, "value", strategy)) != "no"
    s = Search(opts, lim, inputs.flag("evaluates", evaluates), flattened_rows(read), cancelled)
    be, found, level, frontier, seen = s.base_est, [], [], [frozenset()], set()
    # the CPU build depends on the load dtype, and on k-bit weights (loaded straight onto the GPU)
    builds = [s.estimate({**s.base, "load_dtype": "bf16"}),
              s.estimate({**s.base, **(MOVES["4bit"][0](s.base, s) or {})})]
    impossible = min(e.cpu_build_bytes for e in [be, *builds] if e is not None) > lim.ram_for_model_bytes
    for size in range(1, MAX_CHANGES + 1) if not s.fits(be) and not impossible else ():
        sets = {names | {m} for names in frontier for m in MOVES if m not in names} - seen
        seen |= sets
        level = s.level(sets, MAX_SUGGESTIONS)
        found = [n for n in level if s.fits(n[2])]
        if found:
            break   # every pair of single moves is tried; then the BEAM pairs of lowest peak grow a third
        frontier = [n[0] for n in sorted(level, key=lambda node: node[2].peak_bytes)[:None if size == 1 else BEAM]]
    if impossible:
        notes.append(f"building the model on the CPU needs {fmt_bytes(be.cpu_build_bytes)} of the "
                     f"{fmt_bytes(lim.ram_for_model_bytes)} of RAM the runtime leaves, and neither 16-bit nor 4-bit "
                     "weights fit there: no change the advisor tries helps")
    out = _suggestions(s, found)
    if not out:   # nothing fits (with rows of a useful length): the closest tried, to show how far it is
        out = _suggestions(s, sorted((n for n in s.completed(level) if not s.too_short(n)),
                                     key=lambda node: node[2].peak_bytes)[:3])
    if not s.fits(be) and not impossible and not any(x.fits for x in out):   # nothing fits one GPU: how many do
        out += [x for x in [shard_suggestion(s, out)] if x]
    ev, mev, b = be.eval_peak_bytes, 0, s.base
    acc = {"eval_accumulation_steps": 1} if b["eval_gather"] != "loss" and not b["eval_accumulation_steps"] else {}
    if evaluates or ev > lim.usable_bytes:   # the largest eval batch (gathered logits moved off the GPU)
        mev = largest_fitting(lambda size: s.peak({**b, **acc, "eval_batch_size": size}, "eval_peak_bytes"), 1,
                              b["eval_batch_size"], lim.usable_bytes)
    if not s.evaluates and ev > lim.usable_bytes and s.fits(be):   # not judged: say it
        notes.append(f"if the Trainer evaluates (judge it with evaluates=True, or --eval), evaluate() needs "
                     f"{fmt_bytes(ev)} at eval batch {b['eval_batch_size']}: " + (
                         f"use --eval-batch-size {mev}{' --eval-accumulation-steps 1' if acc else ''}" if mev else
                         "no eval batch fits"))
    mb, ms = s.largest(s.base)
    given = setup if isinstance(setup, Estimate) else trainer_estimate if _is_trainer(setup) else None
    return Advice(fits=s.fits(be), peak_bytes=be.peak_bytes, limit=lim, margin_bytes=s.margin(be),
                  cpu_build_bytes=be.cpu_build_bytes, max_batch_size=mb, max_seq_len=ms,
                  suggestions=out, notes=inputs.assumed(be.notes) + notes + sorted(s.notes),
                  evaluates=s.evaluates, eval_peak_bytes=ev, max_eval_batch_size=mev, options=s.base,
                  objects=[in_objects(x, given) for x in out] if given is not None and given.inputs else [],
                  reserved_bytes=be.reserved_bytes, expandable_segments=be.expandable_segments, cause=biggest_cause(be),
                  classes=classes_of(given.inputs if given is not None else None), kernel=kernel_said(be))


def _suggestions(search: Search, nodes: list) -> list:
    """The cheapest :data:`MAX_SUGGESTIONS` of ``nodes``, each refined, none cutting rows below a useful length."""
    out = []
    for node in sorted(nodes, key=search.rank):
        node = search.refine(*node)
        out += [] if search.too_short(node) else [search.suggestion(*node)]
        if len(out) == MAX_SUGGESTIONS:
            break
    return sorted(out, key=lambda suggestion: suggestion.rank)


def flattened_rows(est) -> int:
    """The examples one micro-batch row holds: per_device_train_batch_size where it is flattened (padding-free),
    else 1. The advisor cuts no row below MIN_ROW_TOKENS tokens (:mod:`kit.advise.search`)."""
    inputs = getattr(est, "inputs", None) or {}
    if not inputs.get("padding_free"):
        return 1
    args = next((inputs[k] for k in ("args", "sft_config", "training_args") if inputs.get(k) is not None), None)
    rows = getattr(args, "per_device_train_batch_size", 1)
    return rows if isinstance(rows, int) and rows > 0 else 1


def _is_trainer(setup) -> bool:
    return hasattr(setup, "args") and hasattr(setup, "model") and not isinstance(setup, (Estimate, dict))


@modules_read_once()
def max_batch_size(setup, device="colab-t4", *, safety=SAFETY) -> int:
    """The largest per-device batch whose peak fits the usable limit, the rest as in ``setup`` (0: not even 1).
    The panel's cheap path: a handful of estimates, no search, the allocator's model run about once
    (:func:`kit.advise.edge.largest_replayed`). RAM does not depend on the batch: not judged.

    >>> max_batch_size(dict(model="tiny-llama", seq_len=128, device="cpu"), 80_000_000, safety=0)
    6
    """
    lim = limit_for(device, safety)
    o = setup_options({"batch_size": 1, **setup} if isinstance(setup, dict) else setup, lim)[0]
    return largest_replayed(_cached(o, "batch_size"), lim, 1, BATCH_CAP, o["batch_size"])


@modules_read_once()
def max_seq_len(setup, device="colab-t4", *, safety=SAFETY) -> int:
    """The longest sequence whose peak fits, at most the model's positions, the rest as in ``setup`` (0: none).

    >>> max_seq_len(dict(model="tiny-llama", batch_size=8, device="cpu"), 80_000_000, safety=0)
    101
    """
    lim = limit_for(device, safety)
    o = setup_options({"seq_len": 1, **setup} if isinstance(setup, dict) else setup, lim)[0]
    top = min(info_for(o).max_positions or SEQ_CAP, SEQ_CAP)
    return largest_replayed(_cached(o, "seq_len"), lim, 1, top, o["seq_len"])


def _cached(setup: dict, key: str):
    """value -> estimate() of ``setup`` with ``key`` at that value, each made once (the search reads one twice)."""
    made = {}
    return lambda value: made[value] if value in made else made.setdefault(value, estimate(**{**setup, key: value}))
