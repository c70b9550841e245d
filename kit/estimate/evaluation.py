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

from kit.estimate.replay import BOOL, promote
from kit.training_setup import GATHER  # noqa: F401 (loss: no compute_metrics; logits; preprocess_logits_for_metrics)

@dataclass(frozen=True)
class EvalPeak:
    """The evaluation loop's peak (bytes) and the moment it happens."""

    peak_bytes: int
    moment: str
    gathered_bytes: int       # gathered predictions and labels on the device at that moment


def _llama_loop(st, T: int, hidden, mlp) -> int:
    """Llama's loop (LlamaModel.forward, LlamaDecoderLayer, LlamaMLP), at block 2's (or 1's) MLP:
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` holds the activation, the up projection and their product,
    three (B, S, F) tensors, beside four hidden states: ``inputs_embeds`` (a local of ``LlamaModel.forward`` till it
    returns), the block's input (the loop's ``hidden_states``), the residual after attention and the MLP's normed
    input (three where block 1 is the only one: its input is ``inputs_embeds``)."""
    return T * ((4 if st.L > 1 else 3) * st.H * hidden + 3 * st.F * mlp)


def _bert_loop(st, T: int, hidden, mlp) -> int:
    """BERT's loop (BertModel.forward, BertLayer.feed_forward_chunk), at block 2's (or 1's) feed-forward: beside
    ``embedding_output`` (a local of ``BertModel.forward``), the block's input and ``attention_output``, either the
    dense layer's and GELU's (B, S, F) outputs, or GELU's output with ``LayerNorm(dense(h) + attention_output)``'s
    three hidden states (the dense output, the sum, the norm's output)."""
    hold = (3 if st.L > 1 else 2) * st.H * hidden
    return T * max(hold + 2 * st.F * mlp, hold + st.H * (2 * hidden + mlp) + st.F * mlp)


# The families whose no_grad forward's largest moment the kit knows (block_forward_bytes), by model loop.
NO_GRAD_LOOPS = {"llama": _llama_loop, "mistral": _llama_loop, "qwen2": _llama_loop, "qwen3": _llama_loop,
                 "bert": _bert_loop, "roberta": _bert_loop}


def block_forward_bytes(st, Be: int) -> int | None:
    """The largest a no_grad forward holds inside the blocks at eval batch ``Be``, for the :data:`NO_GRAD_LOOPS`
    families in plain weights (None elsewhere: :func:`eval_peak` then takes one block's saved bytes, a bound):
    the loop's tensors at its largest moment, the rotary cos/sin and the attention mask the model made. LoRA on an
    MLP projection adds temporaries there (None too).
    """
    loop = NO_GRAD_LOOPS.get(st.family)
    if loop is None or st.quant != "none" or any(k.startswith(("mlp.", "intermediate.", "output.")) for k in st.lora):
        return None
    hidden = promote(st.w_other, st.ac) if st.ac else st.w_other   # the residual stream (half + fp32 -> fp32)
    mlp = st.ac or promote(hidden, st.w)
    cos_sin = 2 * st.S * (st.rotary or st.hd) * st.w_other if loop is _llama_loop else 0
    mask = Be * st.S * st.S * (st.w_other if st.eager else BOOL) if st.padded or st.eager else 0
    return loop(st, Be * st.S, hidden, mlp) + cos_sin + mask


def eval_peak(rp, *, B: int, Be: int, S: int, V: int, held: int, copies: int, inputs_per_row: int,
              gather: str, samples: int | None, accumulation: int | None, device: str,
              mixed: bool, pooled: bool = False, blocks: int | None = None, head: int = 0,
              kv_cache: int = 0) -> EvalPeak:
    """The peak of ``Trainer.evaluate()`` at eval batch ``Be``, from the training replay ``rp`` at batch ``B``.

    ``held``: weights (+ optimizer state during training); ``copies``: autocast's cached half
    copies of the trainable weights. ``gather`` is one of :data:`GATHER` ("preprocessed"
    counts one int64 per token, as an ``argmax`` gives). ``samples``: the eval set's rows.
    ``mixed``: fp16/bf16 mixed precision. ``V``: the logits' width (a classifier's labels); ``pooled``: one row
    of logits and one label per sequence (sequence classification), not one per token. ``blocks``: the blocks'
    no_grad peak at ``Be`` where it is known (:func:`block_forward_bytes`); else one block's saved bytes bound it.
    ``head``: the most a head of the user's own holds at once beside the hidden state at ``Be`` (its pooling's
    temporaries: :class:`kit.estimate.own_head.OwnHead`), 0 for a transformers head; ``kv_cache``: the KV cache the
    forward fills and holds till it returns (a base model under such a head keeps its config's ``use_cache``).
    """
    scale = Be / B    # the replay's activations and logits are linear in the batch at a fixed length
    # accelerate wraps a mixed-precision model's forward in convert_outputs_to_fp32: the logits the
    # loop gathers are fp32 then, whatever dtype the lm_head computed them in.
    logits_dt = 4 if mixed or not rp.last_logits else rp.last_logits // (B * S * V)
    loss = int(scale * (rp.logits_live + rp.ls + rp.hidden))   # logits, fp32 copy, log-softmax, hidden state
    loss = max(loss, int(scale * rp.hidden) + head) if head else loss
    body = int(scale * max(rp.block, rp.block_in)) if blocks is None else blocks   # else a bound: one block's saved
    per_seq = 1 if pooled else S   # positions gathered per sequence
    per_row = per_seq * 8 + (per_seq * V * logits_dt if gather == "logits" else per_seq * 8
                             if gather == "preprocessed" else 0)
    steps = -(-samples // Be) if samples else None
    window = min(accumulation, steps) if accumulation and steps else accumulation or steps or 1
    if gather == "loss":
        before = last = 0
    else:
        rows = window * Be if not samples else min(window * Be, samples)
        moved = samples - rows if (device == "cpu" and samples) else 0     # the CPU keeps what was moved
        last = moved * per_row + 2 * rows * per_row if rows > Be else moved * per_row + rows * per_row
        before = moved * per_row + (rows - Be) * per_row
    base = held + Be * inputs_per_row
    fwd = max(("loss", loss + kv_cache), ("blocks", body + kv_cache), key=lambda t: t[1])
    at_loss = base + copies + before + fwd[1]
    at_cat = base + last   # after the forward: autocast has let go of its copies
    if gather != "loss" and at_cat > at_loss:
        return EvalPeak(at_cat, "gathering predictions (torch.cat)", last)
    where = "at the loss" if fwd[0] == "loss" else "a block" if blocks is None else "a block's MLP"
    return EvalPeak(at_loss, f"forward ({where})", before)
