"""The evaluation loop's peak: what ``Trainer.evaluate()`` holds at once, from the training replay.

Trainer's ``evaluation_loop`` (transformers 5) runs ``prediction_step`` on each batch of
``per_device_eval_batch_size`` rows under ``torch.no_grad()`` and the training autocast, so no
activation is kept and no grad is made. What it holds:

- the weights, and during training the optimizer state (the eval runs after ``optimizer.step()``
  and ``zero_grad(set_to_none=True)``: no grads), and autocast's half copies of the trainable
  weights during the forward (autocast caches a cast of every leaf that requires grad, ``no_grad``
  or not, until the forward's autocast ends);
- at the loss: the logits, their fp32 copy (``ForCausalLMLoss`` upcasts) and the
  log-softmax, all (batch, seq, vocab); in the blocks, one block's tensors at a time;
- what it gathers for ``compute_metrics`` (``prediction_loss_only`` is True without it): each
  step's logits (or what ``preprocess_logits_for_metrics`` returns) and labels, concatenated on
  the device (``EvalLoopContainer.add``: ``torch.cat`` holds the old, the new and the result at
  once). ``eval_accumulation_steps`` moves them off the device every N steps; without it they
  stay until the loop ends, which is the classic OOM at the first evaluation. On the CPU the
  moved tensors stay alive (``.numpy()`` shares their memory).
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.estimate.replay import BOOL, family, promote
from kit.training_setup import GATHER  # noqa: F401 (loss: no compute_metrics; logits; preprocess_logits_for_metrics)

@dataclass(frozen=True)
class EvalPeak:
    """The evaluation loop's peak (bytes) and the moment it happens."""

    peak_bytes: int
    moment: str
    gathered_bytes: int       # gathered predictions and labels on the device at that moment


def block_forward_bytes(setup, eval_batch: int) -> int | None:
    """The largest a no_grad forward holds inside the blocks at eval batch ``eval_batch``, for the families declared
    with a :class:`~kit.estimate.replay.families.NoGradLoop`, in plain weights (None elsewhere: :func:`eval_peak` then
    takes one block's saved bytes, a bound): the loop's tensors at its largest moment, the rotary cos/sin and the
    attention mask the model made. LoRA on an MLP projection adds temporaries there (None too).
    """
    loop = family(setup.family).no_grad_loop
    mlp_lora = any(k.startswith(("mlp.", "intermediate.", "output.", "ffn.")) for k in setup.lora)
    if loop is None or setup.quant != "none" or mlp_lora:
        return None
    # the residual stream (half + fp32 -> fp32)
    hidden = promote(setup.w_other, setup.ac) if setup.ac else setup.w_other
    mlp = setup.ac or promote(hidden, setup.w)
    cos_sin = 2 * setup.S * (setup.rotary or setup.hd) * setup.w_other if loop.rotary else 0
    mask_element = setup.w_other if setup.eager else BOOL
    mask = eval_batch * setup.S * setup.S * mask_element if setup.padded or setup.eager else 0
    mask = 0 if loop.own_mask else mask   # (a loop that counts its own mask: DeBERTa's int64 one)
    return loop.bytes(setup, eval_batch * setup.S, hidden, mlp) + cos_sin + mask


def eval_peak(replay, *, batch: int, eval_batch: int, seq_len: int, vocab: int, held: int, copies: int,
              inputs_per_row: int,
              gather: str, samples: int | None, accumulation: int | None, device: str,
              mixed: bool, pooled: bool = False, blocks: int | None = None, head: int = 0,
              kv_cache: int = 0) -> EvalPeak:
    """The peak of ``Trainer.evaluate()`` at eval batch ``eval_batch``, from the training replay ``replay`` at
    batch ``batch``.

    ``held``: weights (+ optimizer state during training); ``copies``: autocast's cached half
    copies of the trainable weights. ``gather`` is one of :data:`GATHER` ("preprocessed"
    counts one int64 per token, as an ``argmax`` gives). ``samples``: the eval set's rows.
    ``mixed``: fp16/bf16 mixed precision. ``vocab``: the logits' width (a classifier's labels); ``pooled``: one row
    of logits and one label per sequence (sequence classification), not one per token. ``blocks``: the blocks'
    no_grad peak at ``eval_batch`` where it is known (:func:`block_forward_bytes`); else one block's saved bytes
    bound it.
    ``head``: the most a head of the user's own holds at once beside the hidden state at ``eval_batch`` (its
    pooling's temporaries: :class:`kit.estimate.own_head.OwnHead`), 0 for a transformers head; ``kv_cache``: the KV
    cache the forward fills and holds till it returns (a base model under such a head keeps its config's
    ``use_cache``).
    """
    scale = eval_batch / batch    # the replay's activations and logits are linear in the batch at a fixed length
    # accelerate wraps a mixed-precision model's forward in convert_outputs_to_fp32: the logits the
    # loop gathers are fp32 then, whatever dtype the lm_head computed them in.
    logits_dt = 4 if mixed or not replay.last_logits else replay.last_logits // (batch * seq_len * vocab)
    # logits, fp32 copy, log-softmax, hidden (and an encoder-decoder's encoder output and KV cache: Replay.forward_held)
    loss = int(scale * (replay.logits_live + replay.ls + replay.hidden + replay.forward_held))
    loss = max(loss, int(scale * replay.hidden) + head) if head else loss
    body = int(scale * max(replay.block, replay.block_in)) if blocks is None else blocks  # else a bound: one block's
    per_seq = 1 if pooled else seq_len   # positions gathered per sequence
    per_row = per_seq * 8 + (per_seq * vocab * logits_dt if gather == "logits" else per_seq * 8
                             if gather == "preprocessed" else 0)
    steps = -(-samples // eval_batch) if samples else None
    window = min(accumulation, steps) if accumulation and steps else accumulation or steps or 1
    if gather == "loss":
        before = last = 0
    else:
        rows = window * eval_batch if not samples else min(window * eval_batch, samples)
        moved = samples - rows if (device == "cpu" and samples) else 0     # the CPU keeps what was moved
        last = moved * per_row + 2 * rows * per_row if rows > eval_batch else moved * per_row + rows * per_row
        before = moved * per_row + (rows - eval_batch) * per_row
    base = held + eval_batch * inputs_per_row
    fwd = max(("loss", loss + kv_cache), ("blocks", body + kv_cache), key=lambda candidate: candidate[1])
    at_loss = base + copies + before + fwd[1]
    at_cat = base + last   # after the forward: autocast has let go of its copies
    if gather != "loss" and at_cat > at_loss:
        return EvalPeak(at_cat, "gathering predictions (torch.cat)", last)
    where = "at the loss" if fwd[0] == "loss" else "a block" if blocks is None else "a block's MLP"
    return EvalPeak(at_loss, f"forward ({where})", before)
