"""What an estimate returns: :class:`Estimate`, a named breakdown, and :class:`ShardedEstimate`, one rank's.

A leaf: it imports nothing of the estimator, so :mod:`kit.estimate.core` makes an ``Estimate`` and
:mod:`kit.estimate.strategies` an ``ShardedEstimate`` from it without either importing the other.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from functools import cached_property

from kit.presets import render
from kit.units import fmt_bytes

COMPONENTS = ("weights", "gradients", "optimizer state", "activations", "logits & loss",
              "autocast weight copies", "temporaries")
EXTRA = ("unsharded parameters", "communication buffers")  # a ShardedEstimate's components beside these


@dataclass
class Context:
    """What :mod:`kit.estimate.strategies` needs of a one-GPU estimate to move its states between GPUs and
    replay its moments. Not part of the JSON. Bytes per part (``"embed"``, ``"block"``, ``"head"``) are dicts."""

    rp: object              # the replay (kit.estimate.replay.Replay) of the forward and backward
    grads: dict             # gradient bytes per part
    wtemp: dict             # backward temporaries per part (autocast's half grads)
    moved: int              # bytes of a tied weight whose grad the head makes first
    inputs: int             # input_ids, attention_mask and labels (int64)
    step_temp: int          # the optimizer step's temporaries
    L: int                  # layers
    weights: dict           # weight bytes per part
    opt: dict               # optimizer-state bytes per part
    trainable: dict         # trainable parameters per part
    buffers: int            # the model's buffers
    H: int                  # hidden size
    fwdbwd: int             # the forward/backward phase's peak
    step: int               # the optimizer step's peak
    reserve: object = None  # peak bytes -> kit.estimate.reserved.Reserved (the allocator's model over this step)
    tensors: list = field(default_factory=list)  # per leaf: (part, weight bytes, [(grad, state bytes)]), laid out
    wnew: dict = field(default_factory=dict)     # per part: a new grad's bytes where the grads are already alive


@dataclass(frozen=True)
class Estimate:
    """A named breakdown of one training setup's memory. Bytes are ints. Frozen: what a trainer kind adds (a
    reference model, a generation phase) is composed before it is built (``dataclasses.replace`` of a draft).

    ``weights_bytes`` .. ``optimizer_bytes`` are totals. ``activations_bytes`` is what the
    forward saves for backward, without the logits and loss; ``logits_bytes`` is beside
    it: the loss's log-softmax, the logits the model returns and their fp32 copy (and
    scenario 1's head input). :meth:`components` is the breakdown at the peak moment.
    """

    params: int
    trainable_params: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    peak_bytes: int
    first_step_peak_bytes: int          # the first optimizer step: no optimizer state yet during its backward
    eval_peak_bytes: int                # Trainer.evaluate() during training (optimizer state alive)
    eval_moment: str                    # e.g. "gathering predictions (torch.cat)"
    cpu_build_bytes: int
    peak_phase: str                     # "forward/backward" or "optimizer step"
    peak_moment: str                    # e.g. "backward (loss)"
    loaded_weights_bytes: int           # as from_pretrained leaves them, before the k-bit recipe
    paged_optimizer_bytes: int          # outside the allocator (paged 8-bit AdamW)
    autocast_copies_bytes: int
    saved_bytes: int                    # all autograd saves in the forward (what saved_tensors_hooks count)
    quantized_params: int
    unquantized_params: int
    offloaded_bytes: int = 0            # pinned host RAM holding saved activations at once (checkpoint / TRL offload)
    offenders: list = field(default_factory=list)   # (module, params, training_bytes), by training bytes
    notes: list = field(default_factory=list)
    setup: dict = field(default_factory=dict)
    _parts: dict = field(default_factory=dict, repr=False)
    context: Context | None = field(default=None, repr=False, compare=False)  # for kit.estimate.strategies
    # the user's objects it was read from (estimate_trainer / estimate_from; {} for estimate()): kit.advise.objects
    inputs: dict = field(default_factory=dict, repr=False, compare=False)
    expandable_segments: bool = False   # the allocator setting reserved_bytes assumes
    # where each option was read (estimate_trainer / estimate_from: {option: (value, where)}; {} for estimate())
    sources: dict = field(default_factory=dict, repr=False, compare=False)
    # the trainer kind it was read as (kit.trainer_kinds: "trainer", "sft", ...; None for estimate())
    kind: str | None = field(default=None, repr=False, compare=False)
    # every option as estimate() read it (kit.training_setup.read), the model aside: ``setup`` shows what decided
    # the figures, this is what makes the same estimate again (the fit advisor starts from it)
    options: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def reserved(self):
        """The predicted ``max_memory_reserved()`` and how it was found (a :class:`kit.estimate.reserved.Reserved`):
        modelled on first use, as it runs the allocator's model over the step laid out as tensors."""
        return self.context.reserve(self.peak_bytes)

    @property
    def reserved_bytes(self) -> int:
        """The predicted ``max_memory_reserved()``: ``peak_bytes`` plus the caching allocator's gap (the peak
        on the CPU, which has no caching allocator)."""
        return self.reserved.reserved_bytes

    @property
    def reserved_gap_bytes(self) -> int:
        return self.reserved.gap_bytes

    def components(self) -> "OrderedDict[str, int]":
        """Bytes per component at the peak moment, in :data:`COMPONENTS` order; sums to peak_bytes."""
        return OrderedDict((k, self._parts.get(k, 0)) for k in COMPONENTS)

    def biggest(self, ranked_by: str = "training_bytes", count: int = 5) -> list:
        """The ``count`` biggest modules by ``"training_bytes"`` or ``"params"``: (name, params, training_bytes)."""
        key = {"training_bytes": lambda offender: offender[2], "params": lambda offender: offender[1]}[ranked_by]
        return sorted(self.offenders, key=key, reverse=True)[:count]

    def to_json(self) -> dict:
        """The CLI's ``--json`` object: the contract's integer fields first, then more."""
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)
             if f.name not in ("_parts", "context", "inputs", "sources", "kind", "options")}
        d["reserved_bytes"], d["reserved_gap_bytes"] = self.reserved_bytes, self.reserved_gap_bytes
        d["offenders"] = [{"module": n, "params": p, "training_bytes": b} for n, p, b in self.offenders]
        d["components"] = dict(self.components())
        return d

    def table(self, preset: str = "colab-t4", answer: bool = True) -> str:
        """A readable table, answer first (the verdict; ``answer=False`` leaves it out): one row per component, the
        phases, the offenders and the notes."""

        return render(self, preset, answer)


@dataclass(frozen=True)
class ShardedEstimate(Estimate):
    """One rank's :class:`Estimate` under a multi-GPU strategy: the byte fields are per GPU;
    ``components()`` adds the unsharded parameters and the communication buffers."""

    strategy: str = "single"
    num_gpus: int = 1
    cpu_offload: bool = False
    cpu_offload_bytes: int = 0          # RAM per rank holding what was offloaded
    unsharded_bytes: int = 0            # gathered parameters alive at the peak
    comm_buffer_bytes: int = 0          # all-gather / reduce-scatter buffers, DDP buckets, at the peak
    model_states_bytes: int = 0         # weights + grads + optimizer state held per GPU (sharded)

    def components(self) -> "OrderedDict[str, int]":
        return OrderedDict((k, self._parts.get(k, 0)) for k in COMPONENTS + EXTRA)

    def table(self, preset: str = "colab-t4", answer: bool = True) -> str:
        off = f", CPU RAM for the offloaded shards {fmt_bytes(self.cpu_offload_bytes)} per rank" \
            if self.cpu_offload else ""
        return (f"PER GPU: {self.strategy} over {self.num_gpus} GPUs{off} (every byte below is one GPU's)\n"
                + super().table(preset, answer))
