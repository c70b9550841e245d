"""Classifier heads in place of the LM head: what they save, and the tensors alive at their loss.

Read from transformers 5's ``GenericForSequenceClassification`` and ``GenericForTokenClassification``
(``transformers/modeling_layers.py``, the classes Llama, Qwen2, Mistral, ... inherit) and their losses
(``transformers/loss/loss_utils.py``):

- sequence classification: ``logits = score(hidden)`` on every position, (B, S, labels), then
  ``pooled = logits[arange(B), last_non_pad_token]`` (B, labels), which keeps its two (B,) int64 indices, and
  ``cross_entropy(pooled, labels)`` with no upcast (autocast's fp32 list makes it fp32 under mixed precision);
- token classification: ``score(dropout(hidden))`` (the dropout is ``classifier_dropout``, else
  ``hidden_dropout``, else 0.1), (B, S, labels); its loss upcasts (``logits.float()``) as the causal LM's does.

Encoders (a family declared with a ``task_head``: :func:`pooler_head` here, or its module's own) pool otherwise,
read from their ``...ForSequenceClassification``: BERT's pooler, ``tanh(dense(hidden[:, 0]))`` (the first token
is a view, so the dense layer keeps the whole (B, S, H) hidden state), then dropout and ``classifier``; RoBERTa's
``out_proj(dropout(tanh(dense(dropout(hidden[:, 0])))))`` (its first dropout makes a (B, H) tensor: the
hidden state is not kept); DistilBERT's ``classifier(dropout(relu(pre_classifier(hidden[:, 0]))))`` (BERT's pooler
with ReLU, which keeps its output as tanh does, and ``seq_classif_dropout``); DeBERTa's ``ContextPooler``,
``gelu(dense(hidden[:, 0]))`` with ``pooler_dropout`` 0 (BERT's pooler with GELU, which keeps its input: the same
bytes); their token
classification is ``classifier(dropout(hidden))``. Their losses are ``CrossEntropyLoss`` on the logits as they are.

The labels the loss keeps are the batch's own tensor (counted with the inputs), not a shifted copy. No
vocabulary logits exist.

>>> from kit.estimate.replay.tape import Tape
>>> st = Setup(family="llama", B=2, S=8, H=64, F=176, nh=4, kvh=2, hd=16, V=1000, L=2, task="seq-cls", labels=3,
...            head_trains=True)
>>> tp = Tape(st)
>>> classifier_head(tp, tp.new(2 * 8 * 64, F32, True)).last
192
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.estimate.replay.setup import F32, I64, Setup  # noqa: F401 (Setup: the doctest's)
from kit.estimate.replay.tape import Tape


@dataclass(frozen=True)
class Head:
    """What a classifier head leaves on the tape (bytes)."""

    loss: int    # saved by the pooling and the loss (indices, log-softmax output)
    live: int    # alive at the loss but not saved: the logits, the pooled logits, an fp32 copy
    last: int    # the (B, S, labels) logits in their dtype (its grad has this size)
    ls: int      # the log-softmax output alone


def classifier_head(tp: Tape, h, encoder_head=None) -> Head:
    """Replay ``st.task``'s head on the final hidden state ``h`` (after the final norm); the head's own saved
    bytes stay on ``tp`` (the score Linear's input, token classification's dropout mask). ``encoder_head``: an
    encoder family's head (its declaration's ``task_head``), None for a decoder's ``score``."""
    st = tp.st
    if st.own:
        return own_head(tp, h)
    if encoder_head:
        return encoder_head(tp, h)
    if st.task == "token-cls":
        h = tp.dropout(h, st.p_head)
    logits = tp.linear(h, st.H, st.labels, "score", trainable=st.head_trains, w=st.w_other, quant="none")
    live = logits.n * logits.dt
    if st.task == "seq-cls":
        pooled = st.B * st.labels
        index = 2 * st.B * I64 if logits.rg else 0      # arange(B) and last_non_pad_token, kept by the index
        ls = pooled * (F32 if st.ac else logits.dt)
        return Head(index + ls, live + pooled * logits.dt + (pooled * F32 if st.ac and logits.dt != F32 else 0),
                    live, ls)
    ls = logits.n * F32                                  # logits.float(), then log_softmax keeps its fp32 output
    return Head(ls, live + (logits.n * F32 if logits.dt != F32 else 0), live, ls)


def pooler_head(tp: Tape, h, dense: str = "dense") -> Head:
    """BERT's classifier heads (see the module doc): for sequence classification, the pooler on the first token (its
    Linear named ``dense``; DistilBERT's ``pre_classifier``), then dropout and ``classifier``; for token
    classification, dropout and ``classifier`` on every token."""
    st = tp.st
    if st.task == "seq-cls":
        first = tp.split(h, st.S)[0]     # hidden[:, 0]: a view, (B, H), of the whole hidden state
        pooled = tp.linear(first, st.H, st.H, dense, trainable=st.base_trainable, w=st.w_other, quant="none")
        h = tp.new(pooled.n, pooled.dt, pooled.rg)    # tanh (DistilBERT: ReLU): a new output, which it keeps
        tp.save(h, when=h.rg)
    return encoder_logits(tp, h, "classifier")


def encoder_logits(tp: Tape, h, name: str) -> Head:
    """An encoder head's end: dropout, the Linear ``name`` to the labels, and ``CrossEntropyLoss`` on its logits."""
    st = tp.st
    h = tp.dropout(h, st.p_head)
    logits = tp.linear(h, st.H, st.labels, name, trainable=st.head_trains, w=st.w_other, quant="none")
    ls = logits.n * (F32 if st.ac else logits.dt)        # cross_entropy: autocast's fp32 list, else as it is
    live = logits.n * logits.dt + (logits.n * F32 if st.ac and logits.dt != F32 else 0)
    return Head(ls, live, logits.n * logits.dt, ls)


def own_head(tp: Tape, h) -> Head:
    """A head of the user's own (:mod:`kit.estimate.own_head`), as its probe read it: what its graph keeps per token
    (a mean pooling's expanded mask, a hidden state a view keeps) stays on ``tp`` beside the hidden state's grad in
    the head's backward; what it keeps per row (pooled vector, dropout's mask, each Linear's input, the loss's) is
    freed there; its (B, labels) logits are alive at the loss, and the loss's log-softmax is fp32 (B, labels)."""
    st = tp.st
    per_token, per_row, fixed, logits_row = st.own
    tp.save(tp.new(per_token * st.B * st.S, 1, False))
    logits = logits_row * st.B
    return Head(per_row * st.B + fixed, logits, logits, st.B * st.labels * F32)
