"""Activations, logits and the backward timeline, replayed op by op from the real forward.

What autograd keeps for backward depends on what each op saves. :func:`replay` walks the
training forward of a decoder block (one module per family: GPT-2, Llama, Mistral, Qwen2,
Qwen3, OLMo-2, Phi-3, Gemma-2, Gemma-3, GPT-NeoX; the mixture-of-experts Qwen3-MoE, Mixtral and OLMoE, whose
router and experts are :mod:`.moe`), of the head and of the loss, op by op, in
the order and with the dtypes of transformers' code (``GPT2Block``, ``LlamaDecoderLayer``,
..., ``ForCausalLMLoss``) and of torch's kernels, and adds up the tensors each op saves, as
``torch.autograd.graph.saved_tensors_hooks`` counts them: unique storages, parameters
excluded, and only what the grads that are needed use. Autocast follows the CUDA op lists
(``linear``/``matmul``/sdpa in half; ``layer_norm``/``softmax``/``pow``/``rsqrt``/
``cross_entropy`` in fp32). ``device="cpu"`` switches the two kernel choices that differ
on a CPU (dropout keeps a float mask, not a bool one; sdpa with dropout takes the math
path), so the tests can check the replay against autograd on tiny CPU twins.
Korthikanti et al. 2022 count the same way for GELU MLPs without GQA; here GQA, SwiGLU,
the vocab and the dtypes all come from the config.

>>> s = Setup(family="llama", B=1, S=8, H=64, F=176, nh=4, kvh=2, hd=16, V=1000, L=2)
>>> replay(s).saved_bytes() > 0
True

Layout: :mod:`.tape` holds :class:`Setup`, the :class:`~.tape.Tape` and the op rules every
family shares (linear with quantization and LoRA, the norms (LayerNorm; RMSNorm as Llama,
OLMo-2 or Gemma apply the weight, over the hidden size or a head for q/k norms), the gated
and GELU MLPs, dropout, attention (sdpa or eager, soft-capped), rotary embeddings (partial
too), fused projections as views, autocast casts); :mod:`.core` runs embeddings, blocks
(one replay per kind: masked or not, with sliding windows), head (final-logit soft-capping)
and loss and finds the backward peak; one module per family declares that family
(:mod:`.families`), and :mod:`.registry` imports them all and reads what every config shares besides the shapes
(:func:`config_shapes`). :mod:`.liger` holds Liger's kernels' rules (``use_liger_kernel``: its RMSNorm, SwiGLU,
RoPE and fused linear cross-entropy), read from its source.

Adding a family (the way peft registers a method: one module, one registration; nothing else names it):

1. Write ``kit/estimate/replay/<family>.py`` with one function ``block(tp, x)`` that replays one decoder layer with
   the tape's op rules, in the order of the transformers class it follows (name that class in the module
   docstring), and mark it with ``@around(covers=Covers(...), final_norm=..., positions=..., embd_dropout=...,
   embed_scale=...)`` for the transformers classes it follows op for op (a model whose blocks hold any other is
   refused) and what the model does outside its blocks. Reuse the tape's rules; a new kind of op goes into
   :mod:`.tape` (or :mod:`.core`, outside the blocks), not into the family module.
2. End the module with one ``register_family("<model_type>", block=block, ...)`` call
   (:func:`~kit.estimate.replay.families.register_family`), declaring only what differs from the defaults:
   ``model_types=``/``aliases=`` (other ``config.model_type`` values that are these blocks op for op),
   ``config_fields=`` (a function of the config: the :class:`Setup` fields it decides besides the shapes, such as
   dropouts), ``shapes=`` (a config that names its shapes its own way), ``lora_targets=`` (where peft has no
   default), ``no_grad_loop=`` (:class:`~kit.estimate.replay.families.NoGradLoop`: the evaluation's exact
   no-grad peak; without it, one block's saved bytes bound it), ``liger=True`` (Liger's patch of it modeled),
   ``positional_mask=``/``dropout_modules=`` (checkpoint offload, TRL's ``disable_dropout``), ``task_head=`` (an
   encoder's classifier head), ``refusal=`` (config settings its replay does not have), ``notes=``, ``moe=True``.
3. Add its module to the import list in :mod:`.registry`. Every other module asks the registry
   (``family(key).no_grad_loop``, ``lookup(model_type).encoder``, ...): no module but the family's own names it,
   which ``tests/test_layout.py`` checks.
4. Ship its config (``kit/configs/``, a name line in ``kit/model_configs.py``) and a tiny twin
   (``kit/configs/tiny-<family>.json``), and check it against autograd and a real Trainer step on that twin, as
   ``tests/test_families.py`` does for every family.
"""
from __future__ import annotations

from kit.estimate.replay.core import Moment, Replay, moments, peak_moment, replay
from kit.estimate.replay.offload import cpu_figures, host_peak, step_moments
from kit.estimate.replay.registry import (Family, NoGradLoop, config_shapes, declared, family, key_of, lookup,
                                          register_family)
from kit.estimate.replay.setup import BF16, BOOL, F32, FP16, FP32, I64, Dt, Setup, around, dtype, promote
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.towers import tower_moments

__all__ = ["Family", "NoGradLoop", "register_family", "family", "lookup", "key_of", "declared", "Setup", "Tape",
           "around", "replay", "Replay", "Moment", "moments", "peak_moment", "config_shapes", "Dt", "dtype", "promote",
           "F32", "FP32", "BF16", "FP16", "BOOL", "I64", "host_peak", "cpu_figures", "step_moments",
           "tower_moments"]
