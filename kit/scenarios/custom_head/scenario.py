"""Scenario 1: DistilGPT2 under a trainable vocab-by-vocab head. Predict, test the advice, fix, measure.

The user's ``nn.Linear(V, V)`` head (V = 50258) has 2,525,916,822 parameters, 31x DistilGPT2.
Each public function is one notebook cell (and one step of ``python -m kit demo``). ``size`` is
"real" (DistilGPT2's shapes) or "smoke" (tiny twins); None follows ``kit.runtime.mode()``.

>>> predict_original("real").offender            # an estimate: instant, nothing is allocated
'custom_layer'
>>> print(advice_table("smoke"))                  # doctest: +SKIP

The measured runs of these setups are :mod:`kit.scenarios.custom_head.runs`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from kit import data as kdata
from kit import dtypes, machine, optimizers, runtime
from kit import models as kmodels
from kit.dtypes import run_precision  # noqa: F401 (read as scenario.run_precision too)
from kit.estimate import estimate
from kit.estimate.inventory import UnsupportedModel
from kit.measure.session import session_preset
from kit.presets import PRESETS, Preset, margin_kept, verdict
from kit.training_setup import declared
from kit.units import fmt_bytes, wrapped

NAMES = {"real": "distilgpt2+vocab-head", "smoke": "tiny-gpt2+vocab-head"}
# The user's Trainer: fp16 mixed precision, batch 1, accumulation 16, 128 tokens, Trainer's default AdamW
# (no optim given: adamw_torch_fused in transformers 5); the base is
# frozen and checkpointed (VocabHeadModel does that). Warmup 2500 and lr 0.1 change no tensor size.
USER = declared(batch_size=1, seq_len=128, grad_accum=16, precision="fp16", optimizer="adamw-fused",
                gradient_checkpointing=True)   # the seed user's TrainingArguments, as the kit names them
T4_BYTES = PRESETS["colab-t4"].gpu_bytes
RANK = {"real": 256, "smoke": 16}    # fix (b)'s rank
FIXES = {"a": "drop the head, fine-tune the LM itself", "b": "a low-rank head V->r->V",
         "c": "keep the VxV head: 16-bit weights (bf16 where native, fp16 on a T4), 8-bit AdamW where it is safe"}


def size_name(size: str | None) -> str:
    size = size or runtime.mode()
    if size not in NAMES:
        raise ValueError(f"size must be 'smoke' (tiny twins) or 'real' (DistilGPT2's shapes), not {size!r}.")
    return size


def estimate_user(model, **setup):
    """The estimator on a name or a (meta) module, with the user's settings unless overridden."""
    return estimate(model, **{**USER, **setup})


# -- 1. predict ---------------------------------------------------------------------------
@dataclass
class Prediction:
    """The user's setup, estimated before anything is loaded: the culprit and the verdicts."""

    name: str
    estimate: object          # kit.estimate.Estimate: .components(), .offenders, .table()
    offender: str
    offender_params: int
    cpu_build_bytes: int
    peak_bytes: int
    fits_t4: bool
    fits_ram: bool             # the build fits beside the runtime's own RAM, with the margin kept (no near miss)
    preset: Preset = PRESETS["colab-t4"]   # Colab's T4 runtime, with this session's runtime RAM inside Colab

    @wrapped
    def text(self) -> str:
        return "\n".join([
            f"ESTIMATED for {self.name} (fp16 mixed precision, batch 1 x 128 tokens, accumulation 16, AdamW, "
            "base frozen and checkpointed):",
            f"  the biggest module: {self.offender}, {self.offender_params:,} trainable parameters",
            "  " + ram_said(self.cpu_build_bytes, self.preset),
            f"  GPU peak in training: {fmt_bytes(self.peak_bytes)}",
            "  " + verdict(self.estimate, self.preset).text])

    __str__ = text


def ram_said(build_bytes: int, preset: Preset) -> str:
    """The RAM the build needs beside the runtime's own, against the machine's RAM: fits, a near miss (under the
    margin kept while figures are modelled) or a crash.

    >>> print(ram_said(int(9.71 * 2**30), PRESETS["colab-t4"]))  # doctest: +ELLIPSIS
    CPU RAM to build the model: 9.71 GiB, beside the runtime's own 3.09 GiB (...): 12.80 GiB of Colab's 12.70 GiB, ...
    """
    need, ram = build_bytes + preset.runtime_ram_bytes, preset.ram_bytes
    how = ("does NOT fit: the session dies of RAM while the model is built, on a GPU runtime as on a CPU one"
           if need > ram else f"a near miss, {fmt_bytes(ram - need)} to spare" if ram - need < margin_kept(ram)
           else "fits")
    return (f"CPU RAM to build the model: {fmt_bytes(build_bytes)}, beside the runtime's own "
            f"{fmt_bytes(preset.runtime_ram_bytes)} ({preset.runtime_said}): {fmt_bytes(need)} of Colab's "
            f"{fmt_bytes(ram)}, {how}")


def predict_original(size: str | None = None) -> Prediction:
    """Estimate the user's setup and name the culprit (no weights are made: instant at any size). The RAM verdict
    counts the runtime's own RAM: the Colab preset's figure, or inside Colab this session's, measured.

    >>> p = predict_original("real")
    >>> p.offender, p.offender_params, p.fits_t4, p.fits_ram
    ('custom_layer', 2525916822, False, False)
    """
    name = NAMES[size_name(size)]
    est = estimate_user(name)
    top, params, _ = est.offenders[0]
    preset = session_preset("colab-t4")
    preset = preset if isinstance(preset, Preset) else PRESETS["colab-t4"]
    v = verdict(est, preset)
    return Prediction(name=name, estimate=est, offender=top, offender_params=params,
                      cpu_build_bytes=est.cpu_build_bytes, peak_bytes=est.peak_bytes, fits_t4=v.gpu_margin_bytes >= 0,
                      fits_ram=v.ram_margin_bytes >= margin_kept(preset.ram_bytes), preset=preset)


# -- 2. the usual advice ------------------------------------------------------------------
_NO_EFFECT = {
    "fix warmup (2500 -> 5) and lr (0.1 -> 5e-5)": "two floats in the scheduler: no tensor changes size",
    "turn off evaluation and wandb":
        "the user's Trainer never evaluates (eval_strategy defaults to 'no'); wandb logs floats from the CPU",
    "move CrossEntropyLoss() into __init__":
        "the loss module has no parameters or buffers: building it each step makes no tensor",
    "call torch.cuda.empty_cache()":
        "it returns cached blocks no tensor uses; the allocated peak, which decides the OOM, is unchanged",
}


@dataclass
class Advice:
    """Each popular suggestion with its effect on the estimated peak, plus the data-side claim."""

    base_peak_bytes: int
    rows: list            # {"advice", "peak_bytes", "change_bytes", "modelled", "why"}
    data: dict            # {"max_length_bytes", "dynamic_bytes", "rows", "mean_len", "max_len"}

    @wrapped
    def text(self) -> str:
        out = [f"ESTIMATED peak of the user's setup: {fmt_bytes(self.base_peak_bytes)}. Each change:"]
        for r in self.rows:
            pct = 100 * r["change_bytes"] / self.base_peak_bytes
            out.append(f"  {r['advice']:<40} {fmt_bytes(r['change_bytes']):>11} ({pct:+.3f}%)  "
                       f"{'estimated' if r['modelled'] else 'no modelled effect'}: {r['why']}")
        d = self.data
        out.append(f"Tokenized data of the user's {d['rows']} non-empty rows, MEASURED (Arrow tables in CPU RAM, "
                   "never on the GPU): "
                   f"{fmt_bytes(d['max_length_bytes'])} padded to max_length, {fmt_bytes(d['dynamic_bytes'])} "
                   "unpadded (the collator pads each batch)")
        return "\n".join(out)

    __str__ = text


def advice_table(size: str | None = None, rows: int = 100) -> Advice:
    """Put each popular suggestion to the estimator, and measure the data-side claim.

    >>> adv = advice_table("smoke")                  # doctest: +SKIP
    >>> [r["change_bytes"] for r in adv.rows]        # doctest: +SKIP
    """
    size = size_name(size)
    name = NAMES[size]
    base = estimate_user(name).peak_bytes
    tok, train = kdata.load_tokenizer(name), kdata.load_text_dataset()["train"]
    user_text = train.select(range(min(rows, len(train))))   # the user's rows, and only those, below too
    # Empty lines dropped: with batch 1, "pad to longest" pads each batch to its one row.
    user_rows = kdata.tokenize(user_text, tok, USER["seq_len"])
    lengths = [len(ids) for ids in user_rows["input_ids"]]
    longest, mean = max(lengths), round(sum(lengths) / len(lengths))
    modelled = [("pad to longest: the longest batch", estimate_user(name, seq_len=longest).peak_bytes,
                 f"the peak comes from the longest batch: {longest} of 128 tokens"),
                ("pad to longest: a mean batch", estimate_user(name, seq_len=mean).peak_bytes,
                 f"a typical step ({mean} tokens); the peak still comes from the longest"),
                ("(for scale) drop the VxV head: fix (a)", estimate_fix("a", size).peak_bytes, "the head is the cost")]
    table = [{"advice": a, "peak_bytes": p, "change_bytes": p - base, "modelled": True, "why": w}
             for a, p, w in modelled]
    table[2:2] = [{"advice": a, "peak_bytes": base, "change_bytes": 0, "modelled": False, "why": w}
                  for a, w in _NO_EFFECT.items()]
    padded = kdata.tokenize(user_text, tok, max_length=USER["seq_len"], padding="max_length")
    dynamic = kdata.tokenize(user_text, tok, max_length=USER["seq_len"])
    return Advice(base_peak_bytes=base, rows=table,
                  data={"max_length_bytes": kdata.dataset_bytes(padded), "rows": len(lengths),
                        "dynamic_bytes": kdata.dataset_bytes(dynamic), "mean_len": mean, "max_len": longest})


# -- 3. fixes -----------------------------------------------------------------------------
class LowRankHead(nn.Module):
    """``V -> r -> V``: two thin linears in place of ``Linear(V, V)`` (about 2 * V * r params, not V * V).

    >>> sum(p.numel() for p in LowRankHead(50258, 256, device="meta").parameters())
    25782354
    """

    def __init__(self, vocab_size: int, rank: int, device=None, dtype=None):
        super().__init__()
        if not 0 < rank < vocab_size:
            raise ValueError(f"rank must be between 1 and vocab_size - 1 ({vocab_size - 1}), not {rank!r}.")
        self.down = nn.Linear(vocab_size, rank, bias=False, device=device, dtype=dtype)
        self.up = nn.Linear(rank, vocab_size, device=device, dtype=dtype)

    def forward(self, logits):
        return self.up(self.down(logits))


class LowRankHeadModel(kmodels.VocabHeadModel):
    """The user's model with a :class:`LowRankHead` as ``custom_layer`` (forward, saving, checkpointing reused).

    Why ``__init__`` is redone: ``VocabHeadModel.__init__`` always makes the ``Linear(V, V)``; at
    real size that is 10 GB allocated and filled before it could be swapped out.

    >>> LowRankHeadModel(kmodels.build_model("tiny-gpt2", device="meta"), 16).custom_layer.up.out_features
    4097
    """

    def __init__(self, gpt2: nn.Module, rank: int, vocab_size: int | None = None):
        nn.Module.__init__(self)
        self.gpt2 = gpt2
        on_meta = gpt2.get_input_embeddings().weight.is_meta
        gpt2.resize_token_embeddings(vocab_size or gpt2.config.vocab_size + 1,
                                     **({"mean_resizing": False} if on_meta else {}))
        gpt2.requires_grad_(False)
        self.gradient_checkpointing_enable()
        w = gpt2.get_input_embeddings().weight
        self.custom_layer = LowRankHead(gpt2.config.vocab_size, rank, device=w.device, dtype=w.dtype)
        self.config = gpt2.config
        tied = gpt2.get_output_embeddings().weight is w
        self._keys_to_ignore_on_save = ["gpt2.lm_head.weight"] if tied else None


def bnb_8bit_problem(model: nn.Module) -> str | None:
    """Why bitsandbytes' 8-bit optimizer must not train ``model``, or None when it is safe.

    On scenario 1's head it printed ``Error invalid argument ... ops.cu`` and killed the process when this
    project tried it on an H200 (docs/known-failures.md): no exception, so no ``try`` helps. Works on meta
    models.

    >>> bnb_8bit_problem(kmodels.build_model("distilgpt2+vocab-head", device="meta")).split(" elements")[0]
    'custom_layer.weight has 2,525,866,564'
    """
    for pname, p in model.named_parameters():
        if p.requires_grad and optimizers.over_int32(p.numel()):
            return (f"{pname} has {p.numel():,} elements, over 2**31 - 1: bitsandbytes' 8-bit optimizer "
                    "would kill the process (not raise). Refused.")
    return None


def _checkpointed(model):
    # On the model, not TrainingArguments: transformers 5 renamed that flag, and Colab may have 4.x.
    return kmodels.set_checkpointing(model)


def fix_setup(which: str, size: str | None = None, rank: int | None = None, dtype: str | None = None) -> dict:
    """Fix ``which`` ("a", "b", "c"): its name, estimator settings and ``make(device)``. ``rank``: fix (b)'s
    rank (default ``RANK[size]``). ``dtype``: fix (c)'s 16-bit dtype, by default :mod:`kit.dtypes`' rule for
    this device (bf16 where native, fp16 on a T4). fp16 weights train without autocast: Trainer's
    ``fp16=True`` would try to unscale their fp16 gradients, which its GradScaler refuses.

    >>> fix_setup("c", "real")["optimizer"]        # 8-bit AdamW refused on the 2.5e9-element head
    'adamw-fused'
    """
    size = size_name(size)
    if which not in FIXES:
        raise ValueError(f"fix must be one of {sorted(FIXES)} ({FIXES}), not {which!r}.")
    head, base, r = NAMES[size], NAMES[size].removesuffix(kmodels.VOCAB_HEAD), RANK[size] if rank is None else rank

    def gpt2(dev):
        return kmodels.build_model(base, device="meta") if dev == "meta" else kmodels.load_model(base)

    if which == "a":
        return dict(name=f"(a) {FIXES['a']}", model=base, optimizer="adamw-fused", precision="fp16",
                    load_dtype="fp32", make=lambda dev: _checkpointed(gpt2(dev)))
    if which == "b":
        return dict(name=f"(b) low-rank head V->{r}->V", model=None, optimizer="adamw-fused", precision="fp16",
                    load_dtype="fp32", make=lambda dev: LowRankHeadModel(gpt2(dev), r))
    dtype = dtype or dtypes.for_this_device()[0]
    make = (lambda dev: kmodels.build_model(head, device="meta", dtype=kmodels.as_dtype(dtype)) if dev == "meta"
            else kmodels.load_model(head, load_dtype=dtype))
    problem = bnb_8bit_problem(make("meta"))
    opt = "AdamW (8-bit refused)" if problem else "8-bit AdamW"
    return dict(name=f"(c) VxV head, {dtype} weights, {opt}", model=head, optimizer="adamw-fused" if problem
                else "adamw-8bit", precision="bf16" if dtype == "bf16" else "fp32", load_dtype=dtype, make=make,
                refused=problem)


def estimate_fix(which: str, size: str | None = None, *, as_run: bool = False, rank: int | None = None,
                 dtype: str | None = None, **setup):
    """The estimate of fix ``which``: the Colab recipe, or (``as_run``) what this device runs.

    >>> estimate_fix("a", "real").peak_bytes < predict_original("real").peak_bytes / 10
    True
    """
    s = fix_setup(which, size, rank, dtype)
    precision = run_precision(s["precision"]) if as_run else s["precision"]
    where = {"device": machine.device_name()} if as_run else {}  # CPU kernels save a little differently
    return estimate_user(s["model"] or s["make"]("meta"), **{"precision": precision, "optimizer": s["optimizer"],
                                                         "load_dtype": s["load_dtype"], **where, **setup})


# -- 4. the user's own Trainer ---------------------------------------------------------------
# estimate()'s keywords that an estimate of a built Trainer records in .setup (the rest: names and readings)
_SETTINGS = ("batch_size", "seq_len", "precision", "optimizer", "gradient_checkpointing", "grad_accum", "load_dtype",
             "attn_implementation", "device", "checkpoint_reentrant", "eval_batch_size", "eval_gather",
             "eval_samples", "eval_accumulation_steps")


def same_size_registry(trainer, est_user):
    """The kit's own model of the user's setup, at the size of the model in ``trainer``: ``VocabHeadModel`` on the
    registry base of that width (DistilGPT2, or the tiny twin) with the same vocabulary V, estimated in
    ``est_user``'s settings (what ``kit.check(trainer)`` read). Built on meta: instant, nothing allocated.

    >>> est = same_size_registry(trainer, kit.check(trainer))          # doctest: +SKIP
    """
    width, v = trainer.model.gpt2.config.n_embd, trainer.model.custom_layer.out_features
    name = next(n for n in NAMES.values() if kmodels.get_config(n).n_embd == width)
    base = kmodels.build_model(name.removesuffix(kmodels.VOCAB_HEAD), device="meta")
    est = estimate(kmodels.VocabHeadModel(base, v), **{k: est_user.setup[k] for k in _SETTINGS if k in est_user.setup})
    est.setup["model"] = f"{name} (V = {v:,})"
    return est


# -- 5. find your own culprit -------------------------------------------------------------
CHECKLIST = """Find your own culprit:
1. Rank modules by trainable parameters (find_culprit(model)): one far above the rest is the suspect.
2. Multiply: trainable params x 16 bytes (fp32 weight, grad, 2 AdamW moments) is the floor to train them.
3. Estimate before you load: python -m kit estimate --model ... names the biggest modules in bytes.
4. Check output widths: a layer over the vocabulary makes (batch x seq x vocab) tensors every step.
5. Test advice against the estimate: if it changes no tensor size (lr, warmup, logging, empty_cache),
   it will not fix an out-of-memory error."""


@wrapped
def find_culprit(model, top: int = 5, **setup) -> str:
    """Modules ranked by trainable parameters, and by estimated training bytes (the estimator's offenders).

    ``model``: an ``nn.Module`` (meta is fine) or a registry name; ``setup`` overrides the user's settings.

    >>> print(find_culprit("distilgpt2+vocab-head").splitlines()[1])   # doctest: +NORMALIZE_WHITESPACE
    custom_layer 2,525,916,822
    """
    module = kmodels.build_model(model, device="meta") if isinstance(model, str) else model
    own = [(n or "(top)", sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad))
           for n, m in module.named_modules()]
    lines = ["By trainable parameters:"] + [f"  {n:<40} {c:>15,}" for n, c in sorted(
        (x for x in own if x[1]), key=lambda part: -part[1])[:top]]
    lines += ["By estimated training bytes (weights, grads, optimizer state):"]
    try:
        lines += [f"  {n:<40} {fmt_bytes(b):>15}" for n, _, b in estimate_user(model, **setup).offenders[:top]]
    except UnsupportedModel as exc:  # a plain nn.Module: the ranking above still stands
        lines.append(f"  not estimated: {exc}")
    return "\n".join(lines)
