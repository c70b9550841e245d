"""TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``, TRL 1.16): the log-probabilities of the labels,
their entropy and whether each is the top-1 token, computed by ``trl.kernels.chunked_logprob.ChunkedLogProbFunction``
in tiles of ``[min(N, 4096), min(V, 32768)]`` tokens x vocabulary (views of one ``[min(N, 4096), 32768]``
buffer, whatever the vocabulary), so the ``(B, S, V)`` logits are never built.

``N`` is the number of scored positions: the ``B * (S - 1)`` shifted positions where the kernel runs in torch (a
CPU), at most that where it runs in Triton (CUDA scores only the labelled ones, ``hidden_states[mask]``: the
estimate counts every position, the most it can be). What each part holds, as the installed code does it:

- saved for backward: the hidden states it was given (a view of the final norm's output for one row, a copy
  ``reshape(-1, H)`` makes of ``[:, :-1]`` for several, or the ``[mask]`` copy on CUDA), the ``N`` int64 targets,
  and ``log_z`` and the entropy (fp32, ``N`` each);
- forward: seven fp32 ``N``-vectors of running statistics, the ``[n, 32768]`` tile buffer in the compute dtype (the
  autocast dtype, else the hidden states'), the cast of the hidden chunk where its dtype differs, and the largest
  of: the weight slice's cast (a temporary of the ``torch.mm``), in torch (CPU) the fold's temporaries
  (:data:`CPU_FOLD_FWD` bytes per tile element), and the next token chunk's hidden cast;
- backward: ``grad_hidden`` (fp32, ``N x H``), ``grad_weight`` (fp32, ``V x H``, when the head is trained), a new
  tile buffer, the same casts (the weight slice's now held for the whole tile), and the largest of: in torch the
  backward fold's temporaries (:data:`CPU_FOLD_BWD`), off CUDA with a half compute dtype the fp32 copies
  ``_addmm_fp32`` makes of the tile and of the weight slice (or of the hidden chunk), and the next vocabulary
  chunk's (or token chunk's) cast made while the last is held; then the grads cast back to the hidden states'
  and the weight's dtypes, and the slice's backward (``[B, S, H]``).
"""
from __future__ import annotations

from kit.estimate.replay.setup import BOOL, F32, I64

TOKEN_CHUNK, VOCAB_CHUNK = 4096, 32768   # TOKEN_CHUNK_SIZE (chunked_logprob.py), _CHUNKED_LOGPROB_CHUNK_SIZE (utils.py)
# torch's fold (``_forward_tile``) at its largest, per tile element beyond the tile: z (fp32) and the mask of the
# positions before the target (bool), with ``z - max`` and its ``exp`` (fp32 each) at once (or ``e`` and ``e * z``).
# A half tile's ``tile.float()`` (the argument of ``_torch_transform``) is freed when it returns: with ``z * scale``
# and ``* inv_t`` it is 3 fp32 at most, under this, so a bf16/fp16 tile costs no more here than an fp32 one.
CPU_FOLD_FWD = F32 + BOOL + F32 + F32
# ``_backward_tile``: y, z, log_p, p and grad (fp32 each) and is_target (bool) held, while
# ``is_target.float() - p`` and its product with the incoming grad (fp32 each) are made
CPU_FOLD_BWD = 5 * F32 + BOOL + 2 * F32


def chunked_head(*, B: int, S: int, H: int, V: int, hidden_dt: int, weight_dt: int, compute_dt: int,
                 head_trainable: bool, hidden_grad: bool, device: str) -> dict:
    """Bytes of TRL's fused LM head at batch ``B`` x length ``S``: ``saved`` (kept for backward), ``forward`` (alive
    at the forward's largest moment beyond what is saved) and ``backward`` (its backward's largest moment, beyond
    what it saved and the head weight's own grad in its dtype).

    >>> h = chunked_head(B=1, S=9, H=4, V=10, hidden_dt=4, weight_dt=4, compute_dt=4, head_trainable=False,
    ...                  hidden_grad=True, device="cpu")
    >>> h["saved"] == 9 * 4 * 4 + 8 * (8 + 4 + 4)   # the hidden states (a view: all 9 rows), targets, log_z, entropy
    True

    With bf16 hidden states and weight on a CPU, the backward's largest moment can be ``_addmm_fp32``'s fp32
    copies of the ``[8, 10]`` tile and the ``[10, 512]`` weight slice, not the fold:

    >>> b = chunked_head(B=1, S=9, H=512, V=10, hidden_dt=2, weight_dt=2, compute_dt=2, head_trainable=False,
    ...                  hidden_grad=True, device="cpu")["backward"]
    >>> b == 8 * 512 * 4 + 8 * 32768 * 2 + 8 * 10 * 4 + 10 * 512 * 4   # grad_hidden, the buffer, the two copies
    True
    """
    T, N = B * S, B * (S - 1)
    n, c = min(N, TOKEN_CHUNK), min(V, VOCAB_CHUNK)
    n2 = min(N - n, TOKEN_CHUNK)            # the second token chunk (0: one chunk)
    c2, c_last = min(V - c, VOCAB_CHUNK), V - (V - 1) // VOCAB_CHUNK * VOCAB_CHUNK   # second and last vocab chunks
    torch_fold = device != "cuda"
    half = compute_dt != F32
    copied = B > 1 or not torch_fold   # reshape(-1, H) of [:, :-1] copies for several rows; [mask] always copies
    hidden = (N if copied else T) * H * hidden_dt
    saved = hidden + N * (I64 + F32 + F32)
    # forward and backward: hidden_chunk = hidden[...].to(compute_dtype), [n, H], a copy where the dtypes differ;
    # w_chunk = weight[start:end].to(compute_dtype), [c, H], likewise
    h_cast = (lambda rows: rows * H * compute_dt if hidden_dt != compute_dt else 0)
    w_cast = (lambda cols: cols * H * compute_dt if weight_dt != compute_dt else 0)
    tile = n * VOCAB_CHUNK * compute_dt   # the buffer is [n, chunk_size] whatever V; each tile a view of its first c
    outer = (T * H * hidden_dt if copied else 0) + N * BOOL   # the final norm's output (copied from), the label mask
    stats = 7 * N * F32                                        # running max, sums, target logit, ...
    # forward: the weight slice's cast is a temporary of torch.mm(..., out=tile), freed before the fold runs; the next
    # token chunk's hidden cast is made while the last one is still bound
    forward = outer + stats + tile + h_cast(n) + max(w_cast(c), n * c * CPU_FOLD_FWD if torch_fold else 0,
                                                     h_cast(n2))
    g_hidden = N * H * F32 if hidden_grad else 0
    g_weight = V * H * F32 if head_trainable else 0
    held = g_hidden + g_weight + tile + h_cast(n)
    # backward (ChunkedLogProbFunction.backward): w_chunk is bound for the whole tile, so each moment below has it
    moments = [w_cast(c) + (n * c * CPU_FOLD_BWD if torch_fold else 0),
               w_cast(c) + w_cast(c2),                          # the next vocab chunk's cast beside the last
               w_cast(c_last) + h_cast(n2)]                     # the next token chunk's, beside the last chunk's
    if torch_fold and half:  # _addmm_fp32 off CUDA: acc.addmm_(a.float(), b.float()), fp32 copies of bf16/fp16 inputs
        if hidden_grad:      # grad_hidden += tile @ w_chunk: [n, c] and [c, H]
            moments.append(w_cast(c) + n * c * F32 + c * H * F32)
        if head_trainable:   # grad_weight += tile.t() @ hidden_chunk: [c, n] and [n, H]
            moments.append(w_cast(c) + n * c * F32 + n * H * F32)
    back = (N * H * hidden_dt if hidden_grad and hidden_dt != F32 else 0) + \
        (V * H * weight_dt if head_trainable and weight_dt != F32 else 0)   # .to(hidden.dtype), .to(weight.dtype)
    own = V * H * weight_dt if head_trainable else 0   # the weight's grad, counted as the head's grads
    backward = max(held + max(moments), g_hidden + g_weight + back) - own
    if hidden_grad:  # the slice's (and the index's) backward: zeros [B, S, H] filled from grad_hidden's cast
        backward = max(backward, (N * H * hidden_dt if hidden_dt != F32 else g_hidden) + T * H * hidden_dt)
    return dict(saved=saved, forward=forward, backward=backward, hidden=T * H * hidden_dt)
