"""Activations, logits and the backward timeline, replayed op by op from the real forward.

What autograd keeps for backward depends on what each op saves. :func:`replay` walks the
training forward of a GPT-2 or Llama block, of the head and of the loss, op by op, in the
order and with the dtypes of transformers' code (``GPT2Block``, ``LlamaDecoderLayer``,
``ForCausalLMLoss``) and of torch's kernels, and adds up the tensors each op saves, as
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
family shares (linear with quantization and LoRA, the norms, activations, dropout,
attention, rotary embeddings, autocast casts); :mod:`.core` runs embeddings, blocks, head
and loss and finds the backward peak; one module per family describes its block.

Adding a family: write ``kit/replay/<family>.py`` with one function ``block(tp, x)`` that
replays one decoder layer with the tape's op rules, in the order of the transformers
class it follows (name that class in the module docstring), and mark it with
``@around(final_norm=..., positions=..., embd_dropout=...)`` for what the model does
outside its blocks; then add one line to :data:`FAMILIES`. (The estimator picks
``Setup.family`` from the config's ``model_type`` in ``kit.inventory.family_of``.) Check it
against autograd on a tiny CPU twin as ``tests/test_estimate.py`` does for GPT-2 and Llama.
"""
from __future__ import annotations

from . import gpt2, llama
from .core import Moment, Replay, peak_moment, replay
from .tape import BOOL, F32, HALF, I64, Setup, Tape, around

FAMILIES = {"gpt2": gpt2.block, "llama": llama.block}  # Setup.family -> block replay

__all__ = ["FAMILIES", "Setup", "Tape", "around", "replay", "Replay", "Moment", "peak_moment",
           "F32", "HALF", "BOOL", "I64"]
