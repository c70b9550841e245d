"""The fit advisor's last resort: "shard over N GPUs", the fewest GPUs that fit when no change on one does.

FSDP (torch's ``fully_shard``, accelerate's ``fsdp_version: 2``) shards weights, grads and optimizer state,
frozen and 4-bit weights too, so it is the strategy offered (:mod:`kit.estimate.strategies` has the per-GPU bytes);
where no count up to :data:`GPU_COUNTS`' last fits, its CPU offload is tried. The setup is otherwise kept
as the user wrote it, then as each of the closest single-GPU suggestions left it (QLoRA fits over fewer GPUs
than full fine-tuning): the shard adds the hardware and the launch to those changes.

>>> from kit.advise import advise
>>> a = advise(dict(model="mistralai/Mistral-7B-v0.3", batch_size=1, seq_len=512), 4_000_000_000, safety=0)
>>> a.fits, any(x.fits for x in a.suggestions[:-1]), a.suggestions[-1].changes["num-gpus"], a.suggestions[-1].fits
(False, False, 2, True)
"""
from __future__ import annotations

from kit.advise.search import Suggestion, cli
from kit.units import fmt_bytes

GPU_COUNTS = (2, 4, 8, 16, 32, 64)   # the counts tried, in order (one node, then several)
TIER = 9                             # after 4-bit (8): more hardware, and a multi-process launch


def shard_suggestion(search, closest=()):
    """The smallest ``num_gpus`` (FSDP, then FSDP with CPU offload) at which a setup fits each GPU, as a
    :class:`kit.advise.search.Suggestion`; None when none of :data:`GPU_COUNTS` does. ``search``: the Search;
    the setups tried are ``s.base`` as it is, then each of ``closest`` (the suggestions that came nearest on
    one GPU); the fewest GPUs win, then the setup tried first."""

    have = search.base.get("num_gpus", 1) or 1
    for offload in (False, True):
        for n in (n for n in GPU_COUNTS if n > have or offload and n >= have):
            for near in (None, *closest):
                o = {**(near.options if near else search.base), "strategy": "fsdp", "num_gpus": n,
                     **({"cpu_offload": True} if offload else {})}
                e = search.estimate(o)
                if not search.fits(e):
                    continue
                changes = {**(near.changes if near else {}), "strategy": "fsdp", "num-gpus": n,
                           **({"cpu-offload": True} if offload else {})}
                cost = (f"hardware: {n} GPUs instead of {have}, launched with accelerate (distributed_type: FSDP, "
                        f"fsdp_version: 2, num_processes: {n}); each holds 1/{n} of the weights, grads and optimizer "
                        f"state ({fmt_bytes(e.weights_bytes + e.gradients_bytes + e.optimizer_bytes)} per GPU) and "
                        "all-gathers each block in turn: every step waits on the network" +
                        (f"; the shards live in RAM ({fmt_bytes(e.cpu_offload_bytes)} per process), slower still"
                         if offload else ""))
                tiers = (TIER, *(near.tiers if near else ()))
                return Suggestion(changes=changes, cli=cli(changes), peak_bytes=e.peak_bytes, fits=True,
                                  margin_bytes=search.margin(e), costs=[*(near.costs if near else []), cost],
                                  tiers=tiers, cpu_build_bytes=e.cpu_build_bytes, eval_peak_bytes=e.eval_peak_bytes,
                                  options=o, rank=(False, tiers), largest=lambda: search.largest(o))
    return None
