"""Per-GPU memory beyond one GPU: DDP, FSDP (torch's ``fully_shard``) and DeepSpeed ZeRO 1/2/3.

:func:`per_gpu` turns a one-GPU :class:`~kit.estimate.Estimate` into one rank's, with the states
moved as each engine moves them, and the forward/backward replayed again (``kit.estimate.replay.moments``)
with the engine's extra tensors at each moment:

- **ddp** (``DistributedDataParallel``, as accelerate and Trainer wrap it, ``gradient_as_bucket_view=False``):
  every rank holds the whole model, its grads and optimizer state, plus the reducer's gradient
  buckets: one flat copy of every trainable grad (``bucket_cap_mb=25`` splits it, it does not shrink it;
  frozen parameters get none). No step of it is sharded.
- **fsdp** (FSDP2 ``fully_shard`` on each decoder block, then on the model, accelerate's
  ``TRANSFORMER_BASED_WRAP``): weights, grads and optimizer state in 1/N shards, frozen and 4-bit
  weights too (QLoRA under FSDP stores them as bf16, ``bnb_4bit_quant_storage``). The root (embeddings,
  final norm, lm_head) stays unsharded from its forward till its reduce-scatter; each block is gathered
  for its forward, and again for its backward while the next block's all-gather is prefetched; a block's
  grads are whole until its reduce-scatter, whose input buffer is kept until the next one
  (``reduce_scatter_max_input_buffers=1``). The root's reduce-scatter at the end of backward holds its
  parameters, grads and the reduce-scatter input at once: on small models it sets the peak.
- **fsdp-grad-op** (``reshard_after_forward=False``, FSDP1's SHARD_GRAD_OP): the blocks stay gathered
  from their forward until their backward.
- **zero1/zero2/zero3** (DeepSpeed, mixed precision as accelerate sets it up): half-precision weights
  (whole; 1/N at stage 3, plus the two layers being gathered), half grads (whole at stage 1; 1/N plus
  a reduce bucket of hidden² elements, accelerate's ``auto``, at 2 and 3) and, in 1/N, the fp32 master
  weights, fp32 grads and optimizer state: DeepSpeed's own 2 + 2 + 16 bytes a parameter for trainable
  ones. Frozen parameters get no grad or optimizer state (DeepSpeed's estimator counts them as trainable).
  Not measured by the kit (no DeepSpeed run was attempted on the CPU); its model states are checked
  against DeepSpeed's estimator functions.

``cpu_offload``: FSDP's ``CPUOffloadPolicy`` (weights, grads and optimizer state in RAM, gathered per block);
ZeRO's ``offload_optimizer`` (stage 3 also ``offload_param``). The RAM it takes is ``cpu_offload_bytes``.

>>> from kit.estimate import estimate
>>> one = estimate("tiny-llama", batch_size=2, seq_len=32)
>>> ddp = estimate("tiny-llama", batch_size=2, seq_len=32, strategy="ddp", num_gpus=2)
>>> ddp.peak_bytes - one.peak_bytes == one.gradients_bytes      # the buckets
True
>>> fsdp = estimate("tiny-llama", batch_size=2, seq_len=32, strategy="fsdp", num_gpus=2)
>>> fsdp.weights_bytes < one.weights_bytes, fsdp.peak_moment
(True, 'reduce-scatter (root)')
"""
from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

from kit.estimate import replay
from kit.estimate.result import ShardedEstimate
from kit.inputs import InputError
from kit.presets import optimizer_state_bytes
from kit.training_setup import STRATEGIES  # noqa: F401 (declared with the other options; kit.estimate names it)


def _sh(nbytes: int, num_gpus: int) -> int:
    return math.ceil(nbytes / num_gpus)


def per_gpu(est, strategy: str = "single", num_gpus: int = 1, cpu_offload: bool = False):
    """One rank's estimate under ``strategy`` over ``num_gpus`` GPUs; ``est`` itself for one GPU.

    >>> from kit.estimate import estimate
    >>> one = estimate("tiny-gpt2", batch_size=1, seq_len=16)
    >>> per_gpu(one) is one, per_gpu(one, "fsdp", 4).num_gpus
    (True, 4)
    """
    if strategy == "single":
        if num_gpus != 1 or cpu_offload:
            raise InputError("strategy", f"strategy 'single' is one GPU without offload: for num_gpus={num_gpus}"
                             f"{' and cpu_offload' if cpu_offload else ''} choose ddp, fsdp, fsdp-grad-op or zero1-3.")
        return est
    if cpu_offload and strategy in ("ddp", "fsdp-grad-op"):
        raise InputError("cpu_offload", f"{strategy} has no CPU offload: use fsdp (CPUOffloadPolicy) or zero1-3 "
                         "(offload_optimizer_device: cpu).")
    fn = {"ddp": _ddp, "fsdp": _fsdp, "fsdp-grad-op": _fsdp}.get(strategy, _zero)
    parts, moment, states, extra = fn(est, est.context, strategy, num_gpus, cpu_offload)
    peak = sum(parts.values())
    notes = list(est.notes) + extra.pop("notes", [])
    setup = dict(est.setup, strategy=strategy, num_gpus=num_gpus, cpu_offload=cpu_offload)
    # evaluation: one GPU's, with this engine's states (DDP's buckets stay allocated; FSDP gathers as in training)
    held = extra.get("comm_buffer_bytes", 0) if strategy == "ddp" else extra.get("unsharded_bytes", 0)
    return ShardedEstimate(**{**{f.name: getattr(est, f.name) for f in dataclasses.fields(est)},
                              **dict(weights_bytes=states[0], gradients_bytes=states[1], optimizer_bytes=states[2],
                                     peak_bytes=peak, first_step_peak_bytes=max(
                                         peak - states[2] if moment != "optimizer step" else peak, extra.pop("step")),
                                     peak_phase="optimizer step" if moment == "optimizer step" else "forward/backward",
                                     peak_moment=moment, notes=notes, setup=setup, _parts=parts, strategy=strategy,
                                     num_gpus=num_gpus, cpu_offload=cpu_offload, **extra),
                              "eval_peak_bytes": max(0, est.eval_peak_bytes - est.weights_bytes - est.optimizer_bytes
                                                     + states[0] + states[2] + held)})


def _states(est, context):
    """Bytes of weights (params only), grads and optimizer state on the device, one GPU."""
    return sum(context.weights.values()), est.gradients_bytes, est.optimizer_bytes - est.paged_optimizer_bytes


def _base_parts(moment, inputs) -> dict:
    return {"activations": moment.activations, "logits & loss": moment.logits, "autocast weight copies": moment.copies,
            "temporaries": moment.temporaries + inputs}


def _ddp(est, context, strategy, num_gpus, offload):
    W, G, O = _states(est, context)
    parts = OrderedDict((k, v) for k, v in est._parts.items())
    parts["communication buffers"] = G
    states = (est.weights_bytes, G, est.optimizer_bytes)
    return parts, est.peak_moment, states, dict(
        comm_buffer_bytes=G, model_states_bytes=W + context.buffers + 2 * G + O, step=est.first_step_peak_bytes + G,
        notes=[f"ddp: every GPU holds the whole model; the reducer's buckets copy every trainable grad "
               f"(gradient_as_bucket_view=False, accelerate's and Trainer's default)"])


def _fsdp(est, context, strategy, num_gpus, offload):

    rp, L, g, w = context.rp, context.L, context.grads, context.weights
    W, G, O = _states(est, context)
    Wr, Wb, Gr, Gb = w["embed"] + w["head"], w["block"] // L, g["embed"] + g["head"], g["block"] // L
    Ws, Gs, Os = (0, 0, 0) if offload else (_sh(W, num_gpus), _sh(G, num_gpus), _sh(O, num_gpus))
    held = Ws + context.buffers + Os + context.inputs  # always on the GPU during forward/backward
    grad_op = strategy == "fsdp-grad-op"
    gb_sh = 0 if offload else _sh(Gb, num_gpus)
    cands = []
    for m in replay.moments(rp, grads_embed=g["embed"], grads_block=gb_sh, grads_head=g["head"],
                            wtemp_block=context.wtemp["block"], wtemp_head=context.wtemp["head"],
                            head_half=context.wtemp["head"], tied=context.moved):
        i = int(m.where.split()[-1].rstrip(")")) if "block" in m.where else (0 if "embeddings" in m.where else L + 1)
        # gathered blocks: grad-op keeps blocks 1..i from the forward on; fsdp has block i and the next one's
        # all-gather (prefetched) in flight; the last block's reduce-scatter input is kept until the next one
        if m.where.startswith("forward"):
            blocks, ag = (L if grad_op else 0), 0
        else:
            blocks = min(i, L) if grad_op else (1 if 0 < i <= L else 0)
            ag = 0 if grad_op or i in (0, 1) else Wb
        rs = Gb if 0 < i < L else 0
        cands.append((m.where, dict(weights=held - Os - context.inputs, **{"optimizer state": Os},
                                    gradients=m.gradients, **_base_parts(m, context.inputs),
                                    **{"unsharded parameters": Wr + blocks * Wb, "communication buffers": ag + rs})))
    # a block's reduce-scatter (the last one's: the most activations below it): its grads, whole, and the
    # reduce-scatter input beside them, the next block gathered (grad-op: all below it still are)
    below = rp.embed + rp.shared + (L - 1) * (rp.block_in if rp.ckpt else rp.block) + rp.kept()
    cands.append((f"reduce-scatter (block {L})", dict(
        weights=held - Os - context.inputs, **{"optimizer state": Os}, gradients=g["head"] + Gb,
        activations=below, temporaries=context.inputs,
        **{"unsharded parameters": Wr + (L - 1 if grad_op else 1) * Wb * (L > 1), "communication buffers": Gb})))
    # the root's reduce-scatter, when backward ends: its parameters, grads and the reduce-scatter input
    cands.append(("reduce-scatter (root)", dict(
        weights=held - Os - context.inputs, **{"optimizer state": Os}, gradients=Gr + L * gb_sh,
        temporaries=context.inputs, **{"unsharded parameters": Wr, "communication buffers": Gr})))
    step = dict(weights=Ws + context.buffers, gradients=Gs, **{"optimizer state": Os},
                temporaries=_sh(context.step_temp, num_gpus) if not offload else 0)
    cands.append(("optimizer step", step))
    where, parts = max(cands, key=lambda candidate: sum(candidate[1].values()))
    fwd = max(sum(p.values()) - Os for w_, p in cands if w_ != "optimizer step")
    off = _sh(W, num_gpus) + _sh(G, num_gpus) + _sh(O, num_gpus) if offload else 0
    paged = _sh(est.paged_optimizer_bytes, num_gpus) if not offload else 0
    return parts, where, (Ws + context.buffers, Gs, Os + paged), dict(
        unsharded_bytes=parts.get("unsharded parameters", 0), comm_buffer_bytes=parts.get("communication buffers", 0),
        model_states_bytes=Ws + context.buffers + Gs + Os, cpu_offload_bytes=off, step=max(fwd, sum(step.values())),
        notes=[f"{strategy}: 1/{num_gpus} of the weights, grads and optimizer state per GPU (frozen weights too); "
               "each parameter's first dimension is padded to a multiple of the GPUs (not counted: under "
               f"{num_gpus} rows a parameter)"] + ([
                   "fsdp with mixed precision: the gathered weights are counted in the load dtype and autocast "
                   "as on one GPU; accelerate's MixedPrecisionPolicy gathers them in 16 bits instead (not modelled: "
                   "an over-estimate of the gathered blocks)"] if est.setup["precision"] != "fp32"
                   and est.setup["load_dtype"] == "fp32" else []) + ([
                   "QLoRA under FSDP (peft's guide): bnb_4bit_quant_storage=torch.bfloat16 lets FSDP shard the 4-bit "
                   "weights (counted so); the guide loads the rest in bf16 (--kbit-recipe lean), where the standard "
                   "recipe's fp32 upcast keeps fp32 embeddings and lm_head gathered in the root"]
                   if est.setup["quantization"] == "4bit" else []) + ([
                   "cpu offload: the shards live in RAM (cpu_offload_bytes per rank); "
                   "the GPU holds gathered blocks, grads and activations"] if offload else []))


def _zero(est, context, strategy, num_gpus, offload):
    """DeepSpeed ZeRO: model states as DeepSpeed keeps them; activations as one GPU's forward/backward."""

    stage = int(strategy[-1])
    w, L, rp = context.weights, context.L, context.rp
    mixed = est.setup["precision"] != "fp32" and est.setup["quantization"] == "none"
    halved = mixed and est.setup["load_dtype"] == "fp32"

    def scale(nbytes):
        return nbytes // 2 if halved else nbytes
    W = sum(scale(v) for v in w.values())  # DeepSpeed casts the module to fp16/bf16 under mixed precision
    T = est.trainable_params
    p = 2 if mixed or est.setup["load_dtype"] != "fp32" else 4
    G = p * T
    o32, paged = optimizer_state_bytes(est.setup["optimizer"], T, 4)
    O = _sh(o32 + paged + 4 * T + 4 * T, num_gpus)  # + fp32 master weights + fp32 grads, in 1/N
    bucket = min(T, context.H * context.H) * p if stage >= 2 else 0
    Wg = _sh(W, num_gpus) if stage == 3 else W
    Gg = _sh(G, num_gpus) if stage >= 2 else G
    unsh = 2 * scale(w["block"] // L) if stage == 3 else 0
    if offload:
        O, Wg = 0, (0 if stage == 3 else Wg)
    m = max(replay.moments(rp, grads_embed=0, grads_block=0, grads_head=0, wtemp_block=context.wtemp["block"],
                           wtemp_head=context.wtemp["head"], head_half=context.wtemp["head"], tied=0),
            key=lambda moment: moment.total)
    fb = dict(weights=Wg + context.buffers, gradients=Gg, **{"optimizer state": O}, **_base_parts(m, context.inputs),
              **{"unsharded parameters": unsh, "communication buffers": bucket})
    step = dict(weights=Wg + context.buffers, gradients=Gg, **{"optimizer state": O})
    where, parts = max((m.where, fb), ("optimizer step", step), key=lambda candidate: sum(candidate[1].values()))
    off = _sh(o32 + paged + 8 * T, num_gpus) + (_sh(W, num_gpus) if stage == 3 else 0) if offload else 0
    return parts, where, (Wg + context.buffers, Gg, O), dict(
        unsharded_bytes=parts.get("unsharded parameters", 0), comm_buffer_bytes=parts.get("communication buffers", 0),
        model_states_bytes=Wg + Gg + O, cpu_offload_bytes=off, step=max(sum(fb.values()) - O, sum(step.values())),
        notes=[f"zero{stage}: DeepSpeed's model states (fp32 master weights, fp32 grads and optimizer state in "
               f"1/{num_gpus}); not measured by the kit: activations follow one GPU's forward/backward"])


def model_states(est) -> int:
    """Weights + grads + optimizer state one GPU holds for ``est`` (the part DeepSpeed's estimators count).

    >>> from kit.estimate import estimate
    >>> e = estimate("tiny-llama", batch_size=1, seq_len=8, strategy="zero2", num_gpus=4, precision="bf16")
    >>> model_states(e) == e.model_states_bytes
    True
    """
    return getattr(est, "model_states_bytes", 0) or est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
