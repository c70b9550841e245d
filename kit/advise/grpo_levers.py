"""The fit advisor's levers for TRL's GRPOTrainer (:mod:`kit.estimate.grpo`), each a change in the user's own
``GRPOConfig`` (or a ``LoraConfig`` beside it), each estimated by ``estimate_from(..., grpo_config=...)``; and the
same levers for a kind that generates as GRPOTrainer does (RLOOTrainer, :mod:`kit.estimate.rloo`), in its own config
and estimated by its own keyword (the kind's reader names both).

The levers, cheapest first (what each costs is said beside it):

- ``gradient_checkpointing=True`` (GRPOConfig's default) where it is off;
- ``per_device_train_batch_size`` halved against ``steps_per_generation`` (and ``gradient_accumulation_steps``)
  doubled: the same rollouts a generation (``generation_batch_size``, still divisible by ``num_generations``) and the
  same optimizer batch, half the rows a training step;
- ``beta=0.0`` (TRL's default): no reference model and no reference pass;
- a ``LoraConfig`` where there is none: adapters trained, and with ``beta > 0`` the reference is the policy with its
  adapter disabled (no copy);
- ``max_completion_length`` halved: the KV cache, the rollouts and the training rows;
- ``num_generations`` halved with ``per_device_train_batch_size``: half the rows generated at once;
- with vLLM colocate (modelled, not measured): ``vllm_enable_sleep_mode=True`` (vLLM's share is released during
  the training step) and a lower ``vllm_gpu_memory_utilization``.

Liger is not a lever here: TRL 1.16's GRPOTrainer refuses Liger's fused linear cross-entropy (it scores the log-probs
in tiles through its own fused head already) and applies only Liger's layer kernels, which the estimate does not
model (``use_liger_kernel`` is refused by :func:`kit.estimate.grpo.read_grpo_config`).

What is judged: the estimate's peak (the larger of the training step and the generation phase) with the allocator's
modelled gap (:meth:`kit.advise.core.Limit.judged`), plus vLLM colocate's reserved share of the device where it runs
beside training (with sleep mode, only beside the generation phase). Prediction only.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from kit.inputs import InputError

from kit import trainer_kinds
from kit.estimate import estimate_from
from kit.presets import beside_vllm, short_label, vllm_share_bytes
from kit.units import GiB, fmt_bytes, wrap

LORA_RANK = 16   # the rank the LoRA lever suggests (a common first choice; its memory barely depends on it)
MIN_COMPLETION = 64   # the shortest max_completion_length suggested, in tokens


@dataclass
class GrpoChange:
    """One lever: its name, the GRPOConfig fields it sets (``peft`` True: a LoraConfig is added), what it costs,
    its estimate and the figure judged."""
    name: str
    changes: dict
    cost: str
    peft: bool = False
    est: object = None
    judged_bytes: int = 0
    fits: bool = False
    config_name: str = "GRPOConfig"   # the kind's config, as the user writes it

    def code(self) -> str:
        """The change as the user writes it: ``GRPOConfig(field=value, ...)`` and, for LoRA, the LoraConfig."""
        fields = ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        code = f"{self.config_name}({fields}, ...)" if fields else ""
        lora = (f"peft_config=LoraConfig(r={LORA_RANK}, lora_alpha={2 * LORA_RANK}, target_modules=\"all-linear\", "
                "task_type=\"CAUSAL_LM\")")
        return " and ".join(x for x in (code, lora if self.peft else "") if x)


def _batch_against_steps(cfg, est):
    B = cfg.per_device_train_batch_size
    if B < 2 or B % 2:
        return None
    spg = cfg.steps_per_generation
    return {"per_device_train_batch_size": B // 2, "steps_per_generation": spg * 2,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps * 2}


def _fewer_generations(cfg, est):
    n, B = cfg.num_generations, cfg.per_device_train_batch_size
    if n < 4 or n % 2 or B % 2:   # TRL needs at least 2 generations a prompt
        return None
    return {"num_generations": n // 2, "per_device_train_batch_size": B // 2}


def _shorter_completions(cfg, est):
    C = cfg.max_completion_length
    return {"max_completion_length": C // 2} if C // 2 >= MIN_COMPLETION else None


def _no_reference_cost(cfg) -> str:
    default = next(f.default for f in dataclasses.fields(type(cfg)) if f.name == "beta")
    why = "TRL's default, beta=0.0" if default == 0.0 else f"{type(cfg).__name__}'s default is beta={default}"
    return f"no KL penalty towards the reference ({why})"


def _checkpointing(cfg, est):
    return None if est.setup.get("gradient_checkpointing") else {"gradient_checkpointing": True}


def _sleep_mode(cfg, est):
    return {"vllm_enable_sleep_mode": True} if est.setup.get("vllm_reserved_fraction") and \
        not cfg.vllm_enable_sleep_mode else None


def _smaller_vllm_share(cfg, est):
    share = est.setup.get("vllm_reserved_fraction")
    return {"vllm_gpu_memory_utilization": round(share - 0.1, 2)} if share and share > 0.15 else None


# (name, the GRPOConfig changes or None where it does not apply, peft, cost: its text, or made from the config),
# cheapest first
LEVERS = (
    ("gradient checkpointing", _checkpointing, False, "about a third slower: each block's forward runs twice"),
    ("half the batch, twice the steps per generation", _batch_against_steps, False,
     "the same rollouts and optimizer batch, in twice the training steps (slower)"),
    ("no reference model", lambda cfg, est: {"beta": 0.0} if cfg.beta else None, False, _no_reference_cost),
    ("LoRA", lambda cfg, est: {} if not est.setup.get("lora_r") else None, True,
     "trains adapters, not every weight; with beta > 0 the reference is the policy with its adapter disabled"),
    ("vLLM sleep mode (not measured)", _sleep_mode, False,
     "vLLM wakes before each generation (slower); its share is modelled, not measured"),
    ("a smaller vLLM share (not measured)", _smaller_vllm_share, False,
     "less KV cache for vLLM (fewer sequences at once); its share is modelled, not measured"),
    ("shorter completions", _shorter_completions, False, "completions cut at half the length: longer answers lost"),
    ("fewer generations a prompt", _fewer_generations, False,
     "half the completions a prompt: a noisier group baseline"),
)


def reader_of(est):
    """The estimator's reader of the kind ``est`` was read as (GRPO's, or a kind generating as GRPO's)."""
    return trainer_kinds.part_of(getattr(est, "kind", None) or "grpo", "estimate")


def kind_label(est) -> str:
    """``"GRPO"`` for a GRPOTrainer's estimate: its trainer's name, without "Trainer"."""
    return reader_of(est).trainer_name.removesuffix("Trainer")


def grpo_config_of(est):
    """The GRPOConfig an estimate was made from (``estimate_from(grpo_config=...)`` or a GRPOTrainer's args); for
    another generating kind, its config, by its own keyword."""
    inputs, reader = getattr(est, "inputs", None) or {}, reader_of(est)
    cfg = inputs.get(reader.config_keyword) or inputs.get("args")
    if cfg is None:
        raise InputError("setup", f"this {kind_label(est)} estimate holds no {reader.config_name}: pass the "
                                  f"{reader.trainer_name}, or the Estimate that estimate_from(..., "
                                  f"{reader.config_keyword}=...) returned.", code="grpo-no-config")
    return cfg


def changed_config(cfg, changes: dict):
    """A copy of ``cfg`` with ``changes`` set, its derived ``generation_batch_size`` recomputed as TRL's
    ``__post_init__`` does (a copy, not ``dataclasses.replace``: TRL refuses both batch fields set at once); None
    where TRL would refuse it (the generation batch not divisible by ``num_generations``)."""
    new = copy.copy(cfg)
    for k, v in changes.items():
        setattr(new, k, v)
        if k == "gradient_checkpointing" and hasattr(new, "activation_checkpointing"):   # transformers 5's name
            new.activation_checkpointing = v
    new.generation_batch_size = new.per_device_train_batch_size * new.world_size * new.steps_per_generation
    return new if new.generation_batch_size % new.num_generations == 0 else None


def judged(est, limit) -> int:
    """The figure judged against the device: the allocated peak with the allocator's modelled gap, plus vLLM
    colocate's share beside it (with sleep mode, beside the generation phase only)."""
    return beside_vllm(est, limit.judged(est), limit.limit_bytes)


@dataclass
class GrpoAdvice:
    """The GRPO levers tried on one setup: the verdict, the biggest cause and the best change first
    (:meth:`answer`), every lever in :meth:`details`."""
    est: object
    limit: object
    judged_bytes: int
    changes: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.judged_bytes <= self.limit.usable_bytes

    @property
    def suggestions(self) -> list:
        """The levers that fit, cheapest first, or (none fits) the tried ones by their figure, lowest first."""
        fit = [c for c in self.changes if c.fits]
        return fit or sorted(self.changes, key=lambda c: c.judged_bytes)

    def _f(self, n: int) -> str:
        return fmt_bytes(n, "GiB" if self.limit.limit_bytes >= GiB else None)

    def cause(self) -> str:
        """The phase at the peak and what is held there, by name."""
        s, est = self.est.setup, self.est
        ref = {"none": "no reference model", "model": f"the reference copy {self._f(s['reference_weights_bytes'])}",
               "adapter-disabled": "the reference = the policy, adapter disabled"}[s["reference"]]
        if est.peak_phase == "generation":
            where = f"the generation phase ({s['generation_rows']} rows x {s['prompt_len']} + {s['completion_len']}" \
                    f" tokens, at {s['generation_moment']})"
        else:
            where = f"the training step (batch {s['batch_size']} x {s['seq_len']} tokens)"
        return f"biggest cause: {where}; {ref}"

    def answer(self) -> list:
        """At most five lines: the verdict with the figure judged and the limit, the cause, the best change."""
        lim, margin = self.limit, self.limit.usable_bytes - self.judged_bytes
        tight = not self.fits and self.judged_bytes <= lim.limit_bytes
        verdict, spare = ("fits", "to spare") if self.fits else ("TIGHT" if tight else "DOES NOT FIT", "short")
        share = vllm_share_bytes(self.est, lim.limit_bytes)
        vllm = f" + vLLM's share {self._f(share)}" if share else ""
        usable = f"{self._f(lim.limit_bytes)} less {lim.margin_fraction:.0%}" if lim.margin_fraction else \
            self._f(lim.limit_bytes)   # (the margin kept, in few words: the answer keeps to five lines)
        out = [f"{verdict} {short_label(lim.label)}: {self._f(self.judged_bytes)} peak + allocator gap{vllm} "
               f"({kind_label(self.est)}, modelled) of {usable} ({self._f(abs(margin))} {spare})", self.cause()]
        if self.fits:
            return out + ["no change needed"]
        if not self.changes:
            return out + [f"no {kind_label(self.est)} lever applies to this setup"]
        best = self.suggestions[0]
        head = "best change" if best.fits else "closest change (still short)"
        return out + [f"{head}: {best.code()} -> {self._f(best.judged_bytes)} "
                      "(its cost, and the other levers: details=True)"]

    def details(self, top: int | None = None) -> list:
        """Every lever tried, cheapest first: its figure, whether it fits, its code and its cost; then the notes."""
        out = [f"each {kind_label(self.est)} lever alone, cheapest first (peak + allocator gap, ESTIMATED, of "
               f"{self._f(self.limit.usable_bytes)}):"]
        for c in self.changes[:top]:
            out.append(f"  {self._f(c.judged_bytes):>10} {'fits' if c.fits else 'short':<5}  {c.name}: {c.code()}")
            out.append(f"{'':19}cost: {c.cost}")
        return out + [f"note: {n}" for n in self.notes]

    def text(self, top: int | None = None, details: bool = False) -> str:
        return wrap("\n".join(self.answer() + ([""] + self.details(top) if details else [])))

    def __str__(self) -> str:
        return self.text()


def rebuild(est, cfg, peft_config, model):
    """The estimate of ``cfg`` (and ``peft_config``), made as ``est`` was: ``estimate_from`` with its inputs."""
    inputs, config = est.inputs, {reader_of(est).config_keyword: cfg}
    if inputs.get("source") == "estimate_from":
        return estimate_from(model, **config, peft_config=peft_config, seq_len=inputs["seq_len"],
                             load_dtype=inputs.get("load_dtype"), attn_implementation=inputs.get("attn_implementation"),
                             device=inputs.get("device", "cuda"))
    return estimate_from(model, **config, peft_config=peft_config, seq_len=est.setup["prompt_len"],
                         load_dtype=est.setup["load_dtype"], device=inputs.get("device", "cuda"))


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules="all-linear", task_type="CAUSAL_LM")


def _try(out, cfg, name, changes, peft, cost, model, peft_config) -> None:
    """Estimate one change (skipped where TRL would refuse the config) and add it to ``out``."""
    new = changed_config(cfg, changes)
    if new is not None:
        cand = rebuild(out.est, new, lora_config() if peft else peft_config, model)
        figure = judged(cand, out.limit)
        out.changes.append(GrpoChange(name, changes, cost, peft, cand, figure, figure <= out.limit.usable_bytes,
                                      type(cfg).__name__))


def advise_grpo(est, limit, model=None) -> GrpoAdvice:
    """Each GRPO lever (:data:`LEVERS`) tried alone on ``est`` (a GRPO estimate), estimated and judged against
    ``limit`` (a :class:`kit.advise.core.Limit`). ``model``: what to re-estimate (None: the estimate's model by
    name; a GRPOTrainer's ``model.config`` for a trainer's estimate)."""
    cfg = grpo_config_of(est)
    model = model if model is not None else est.sources["model"][0]
    peft_config = est.inputs.get("peft_config")
    out = GrpoAdvice(est, limit, judged(est, limit))
    tried = [(name, changes, peft, cost(cfg) if callable(cost) else cost) for name, make, peft, cost in LEVERS
             if (changes := make(cfg, est)) is not None]
    for name, changes, peft, cost in tried:
        _try(out, cfg, name, changes, peft, cost, model, peft_config)
    if not out.fits and not any(c.fits for c in out.changes):   # none alone: each pair that sets no field twice
        for i, (name, changes, peft, cost) in enumerate(tried):
            for name2, changes2, peft2, cost2 in tried[i + 1:]:
                if not set(changes) & set(changes2):
                    _try(out, cfg, f"{name} + {name2}", {**changes, **changes2}, peft or peft2, f"{cost}; {cost2}",
                         model, peft_config)
    out.notes.append(f"Liger is no lever here: TRL 1.16's {reader_of(est).trainer_name} refuses its fused linear "
                     "cross-entropy (its own fused head already scores in tiles); its layer kernels are not estimated")
    if est.setup.get("vllm_reserved_fraction"):
        out.notes.append("vLLM's share is modelled from vllm_gpu_memory_utilization, not measured")
    return out


trainer_kinds.register_part("grpo", "advise", advise_grpo)
trainer_kinds.register_part("rloo", "advise", advise_grpo)   # RLOOTrainer generates as GRPOTrainer: the same levers
