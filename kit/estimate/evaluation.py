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

from kit.estimate.replay import BOOL, gpt_oss, modernbert, promote
from kit.training_setup import GATHER  # noqa: F401 (loss: no compute_metrics; logits; preprocess_logits_for_metrics)

@dataclass(frozen=True)
class EvalPeak:
    """The evaluation loop's peak (bytes) and the moment it happens."""

    peak_bytes: int
    moment: str
    gathered_bytes: int       # gathered predictions and labels on the device at that moment


def _llama_loop(setup, tokens: int, hidden, mlp) -> int:
    """Llama's loop (LlamaModel.forward, LlamaDecoderLayer, LlamaMLP), at block 2's (or 1's) MLP:
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` holds the activation, the up projection and their product,
    three (B, S, F) tensors, beside four hidden states: ``inputs_embeds`` (a local of ``LlamaModel.forward`` till it
    returns), the block's input (the loop's ``hidden_states``), the residual after attention and the MLP's normed
    input (three where block 1 is the only one: its input is ``inputs_embeds``)."""
    return tokens * ((4 if setup.L > 1 else 3) * setup.H * hidden + 3 * setup.F * mlp)


def _bert_loop(setup, tokens: int, hidden, mlp) -> int:
    """BERT's loop (BertModel.forward, BertLayer.feed_forward_chunk), at block 2's (or 1's) feed-forward: beside
    ``embedding_output`` (a local of ``BertModel.forward``), the block's input and ``attention_output``, either the
    dense layer's and GELU's (B, S, F) outputs, or GELU's output with ``LayerNorm(dense(h) + attention_output)``'s
    three hidden states (the dense output, the sum, the norm's output)."""
    hold = (3 if setup.L > 1 else 2) * setup.H * hidden
    return tokens * max(hold + 2 * setup.F * mlp, hold + setup.H * (2 * hidden + mlp) + setup.F * mlp)


def _distilbert_loop(setup, tokens: int, hidden, mlp) -> int:
    """DistilBERT's loop (DistilBertModel.forward, TransformerBlock, FFN.ff_chunk): beside ``embeddings`` (a local of
    ``DistilBertModel.forward``), the block's input and ``attention_output``, the larger of lin1's and the
    activation's (B, S, F) outputs, the activation's output with lin2's, or, once ``ff_chunk`` has returned,
    ``output_layer_norm(ffn_output + attention_output)``'s three hidden states."""
    hold = (3 if setup.L > 1 else 2) * setup.H * hidden
    return tokens * (hold + max(2 * setup.F * mlp, setup.F * mlp + setup.H * hidden, 3 * setup.H * hidden))


def _deberta_loop(setup, tokens: int, hidden, mlp) -> int:
    """DeBERTa-v2's loop (DebertaV2Model.forward, DebertaV2Encoder.forward, DisentangledSelfAttention) at the last
    layer. The encoder keeps every layer's output (``all_hidden_states``: it always asks for them) beside
    ``embedding_output``, the zero ``token_type_ids`` (B, S) int64, the (B, 1, S, S) int64 mask it multiplies out,
    the (S, S) int64 ``relative_pos`` and the normed (2 span, H) table. In the attention: q, k and v, the content
    scores, and, at the last disentangled term's ``gather``, its (B * nh, S, 2 span) input and (B * nh, S, S)
    output, the earlier terms' results and their running sum, the repeated position projections and each term's
    (S, S) int64 positions; else the MLP's two (B, S, F) tensors beside the attention's output."""
    B, S, span2, terms = tokens // setup.S, setup.S, 2 * setup.rel_span, len(setup.rel_att)
    square = B * setup.nh * S * S
    table = S * S * 8 + span2 * setup.H * hidden if terms else 0   # relative positions and the normed table
    fixed = tokens * 8 + B * S * S * 8 + table + setup.L * tokens * setup.H * hidden
    attn = 3 * tokens * setup.H * mlp + square * mlp * (2 * terms if terms else 1)
    if terms:
        attn += (B * setup.nh * S * span2 + terms * B * span2 * setup.H) * mlp + terms * S * S * 8
    return fixed + max(attn, tokens * setup.H * hidden + 2 * tokens * setup.F * mlp)


# The families whose no_grad forward's largest moment the kit knows (block_forward_bytes), by model loop.
NO_GRAD_LOOPS = {"llama": _llama_loop, "mistral": _llama_loop, "qwen2": _llama_loop, "qwen3": _llama_loop,
                 "bert": _bert_loop, "roberta": _bert_loop, "distilbert": _distilbert_loop,
                 "deberta-v2": _deberta_loop}
NO_GRAD_LOOPS["modernbert"] = modernbert.no_grad_loop
NO_GRAD_LOOPS["gpt_oss"] = gpt_oss.no_grad_loop


def block_forward_bytes(setup, eval_batch: int) -> int | None:
    """The largest a no_grad forward holds inside the blocks at eval batch ``eval_batch``, for the :data:`NO_GRAD_LOOPS`
    families in plain weights (None elsewhere: :func:`eval_peak` then takes one block's saved bytes, a bound):
    the loop's tensors at its largest moment, the rotary cos/sin and the attention mask the model made. LoRA on an
    MLP projection adds temporaries there (None too).
    """
    loop = NO_GRAD_LOOPS.get(setup.family)
    mlp_lora = any(k.startswith(("mlp.", "intermediate.", "output.", "ffn.")) for k in setup.lora)
    if loop is None or setup.quant != "none" or mlp_lora:
        return None
    # the residual stream (half + fp32 -> fp32)
    hidden = promote(setup.w_other, setup.ac) if setup.ac else setup.w_other
    mlp = setup.ac or promote(hidden, setup.w)
    cos_sin = 2 * setup.S * (setup.rotary or setup.hd) * setup.w_other if loop is _llama_loop else 0
    mask_element = setup.w_other if setup.eager else BOOL
    mask = eval_batch * setup.S * setup.S * mask_element if setup.padded or setup.eager else 0
    # DeBERTa's own int64 mask, made whether padded or not; gpt-oss's eager masks, in its loop
    mask = 0 if loop is _deberta_loop or getattr(loop, "masks_included", False) else mask
    return loop(setup, eval_batch * setup.S, hidden, mlp) + cos_sin + mask


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
    loss = int(scale * (replay.logits_live + replay.ls + replay.hidden))  # logits, fp32 copy, log-softmax, hidden
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
