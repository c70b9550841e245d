"""A head of the user's own on a transformers base model: the sentence-transformers pattern, an ``nn.Module`` holding
an ``AutoModel`` (``LlamaModel``, ``Qwen2Model``, ``BertModel``, ...: no LM or classifier head) and, on its last
hidden state, a pooling (the mean over the attention mask, the first token, the last non-pad token), dropout,
``nn.Linear`` layer(s) and a loss.

Such a head is the user's own code, so it is read by running it, not by its names: :func:`read_own_head` calls the
module's forward three times on a few rows, with the base model's forward stood in by a stub that returns a made-up
last hidden state (the base's blocks never run), and records what the head's autograd graph saves
(``torch.autograd.graph.saved_tensors_hooks``: each saved storage once, the parameters and the batch aside). Its
saved bytes grow with the tokens (a mean pooling's expanded mask, a hidden state a view keeps) and with the rows
(the pooled vector, dropout's mask, each Linear's input, the loss); three shapes give both rates. The module is
called as its model is (:func:`calling`): ``model(input_ids=..., attention_mask=..., labels=...)`` as Trainer calls
it, or with one dict of features as sentence-transformers' losses call a ``SentenceTransformer`` (whose output dict's
``sentence_embedding`` is its pooled (rows, hidden) output). The head's logits are (rows, labels): a head that gives
anything else, or whose forward takes neither call, is refused in one sentence naming the module. A forward without
a loss is taken as Trainer's ``compute_loss`` override or a loop computes it: ``cross_entropy(logits, labels)``, said
in a note.

The probe runs where the model is, without autocast, with the random state put back: a GPU estimate of a module
still on the CPU counts dropout's CPU float mask where CUDA keeps a bool one (a few bytes per row). A read changes
nothing of the user's (:func:`as_they_were`): each module's train/eval mode, the head's parameters, buffers and
attributes are as they were.
"""
from __future__ import annotations

import contextlib
import inspect
import weakref
from dataclasses import dataclass

from kit.inputs import Note, Refusal

_SHAPES = ((2, 8), (2, 16), (4, 8))   # (rows, tokens) of the three probes: tokens double, then rows
_READ = weakref.WeakKeyDictionary()   # module -> OwnHead (a module's head is probed once)
CALLED = "a head called as model(input_ids=..., attention_mask=..., labels=...), or with one dict of them as " \
         "sentence-transformers calls its model, that pools to (rows, labels) logits is estimated"


@dataclass(frozen=True)
class OwnHead:
    """What the user's head is made of and what its graph saves (bytes)."""

    base: str              # the base model's name in the module ("encoder")
    labels: int            # the logits' width
    per_token: int         # saved bytes per token (rows x tokens)
    per_row: int           # ... per row
    fixed: int             # ... once (the loss's scalars)
    logits_row: int        # the logits' bytes per row
    dropout: float         # the first Dropout's p among the head's modules (0: none)
    loss_outside: bool     # the forward returns no loss: cross_entropy(logits, labels) is assumed
    eval_token: int = 0    # evaluation (eval mode, no_grad): the most the head's forward holds at once beside the
    eval_row: int = 0      # hidden state, per token and per row

    def eval_bytes(self, rows: int, tokens: int) -> int:
        return self.eval_token * rows * tokens + self.eval_row * rows

    def saved_bytes(self, rows: int, tokens: int) -> int:
        return self.per_token * rows * tokens + self.per_row * rows + self.fixed


class OwnHeadError(Refusal):
    """The user's head could not be read (one sentence naming the module)."""


def inner_base(model):
    """``(name, base)``: the outermost transformers model a plain module holds, or ``(None, None)``."""
    from transformers import PreTrainedModel

    return next(((n, m) for n, m in model.named_modules() if n and isinstance(m, PreTrainedModel)), (None, None))


def read_own_head(model) -> OwnHead | None:
    """The head of a module holding a transformers base model (no LM head), or None when it holds none; refuses
    a head it cannot read in one sentence that names the module."""
    if model in _READ:
        return _READ[model]
    name, base = inner_base(model)
    if base is None or getattr(base, "get_output_embeddings", lambda: None)() is not None:
        return None
    head = _probe_all(model, name, base)
    _READ[model] = head
    return head


def _probe_all(model, name: str, base) -> OwnHead:
    import torch

    what = f"{type(model).__name__}'s head on its {type(base).__name__} ({name})"
    call = calling(model, what)
    with torch.random.fork_rng(devices=[]), as_they_were(model, name):
        model.train()
        runs = [_probe(model, base, what, rows, tokens, call) for rows, tokens in _SHAPES]
        model.eval()
        with torch.no_grad():
            evals = [_probe(model, base, what, rows, tokens, call) for rows, tokens in _SHAPES]
    labels, row1, outside = runs[0][1:4]
    per_token, per_row, fixed = _rates([r[0] for r in runs])
    eval_token, eval_row, eval_fixed = _rates([r[4] for r in evals])
    drop = next((m.p for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout)
                 and not (n == name or n.startswith(name + "."))), 0.0)
    return OwnHead(base=name, labels=labels, per_token=per_token, per_row=per_row, fixed=max(fixed, 0),
                   logits_row=row1, dropout=float(drop), loss_outside=outside, eval_token=eval_token,
                   eval_row=eval_row + max(eval_fixed, 0) // _SHAPES[0][0])


@contextlib.contextmanager
def as_they_were(model, base: str):
    """Put back what the probe's forward calls change in the user's module: each submodule's train/eval mode, the
    values of the head's parameters and buffers (BatchNorm's running statistics and its count), and the head's
    attributes (a forward that keeps its input as ``self.last`` keeps the probe's tensor). The base model never runs
    (its forward is stubbed), so only the modules outside it are copied: the head, a few small tensors."""
    import torch

    outside = [m for n, m in model.named_modules() if not (n == base or n.startswith(base + "."))]
    modes = [(m, m.training) for m in model.modules()]
    attributes = [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in outside]
    with torch.no_grad():
        values = [(t, t.clone()) for m in outside for t in (*m._parameters.values(), *m._buffers.values())
                  if isinstance(t, torch.Tensor)]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in values:
                tensor.copy_(value)
        for m, kept, parameters, buffers, modules in attributes:
            for key in set(m.__dict__) - set(kept):
                del m.__dict__[key]
            m.__dict__.update({k: v for k, v in kept.items() if m.__dict__.get(k) is not v})
            for now, before in ((m._parameters, parameters), (m._buffers, buffers), (m._modules, modules)):
                now.clear()
                now.update(before)
        for m, training in modes:
            m.training = training


def calling(model, what: str = "the model") -> str:
    """How the user's model is called, read from its forward's signature: ``"keywords"``,
    ``model(input_ids=..., attention_mask=..., labels=...)`` (Trainer's ``model(**batch)``; labels only where the
    forward takes them: ``"keywords+labels"``), or ``"features"``, ``model({"input_ids": ..., "attention_mask": ...})``:
    one dict of the batch's tensors in its one required positional parameter, as sentence-transformers' losses call
    a ``SentenceTransformer`` (``forward(self, input, **kwargs)``). Refuses a forward that takes neither."""
    signature = inspect.signature(model.forward).parameters
    required = [k for k, p in signature.items() if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and k not in ("input_ids", "attention_mask")]
    if len(required) == 1 and not {"input_ids", "attention_mask"} & set(signature):
        return "features"
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in signature.values())
    missing = [k for k in ("input_ids", "attention_mask") if k not in signature]
    if required or (missing and not var_keyword):
        takes = f"requires {', '.join(required)}" if required else f"takes no {' or '.join(missing)}"
        raise OwnHeadError(f"{what} cannot be read: its forward {takes}.", instead=CALLED)
    return "keywords+labels" if "labels" in signature or var_keyword else "keywords"


def call_model(model, call: str, ids, mask, labels):
    """``model.forward`` called as :func:`calling` read it (forward, not ``__call__``: hooks on the module, kit.watch's
    or the user's, must not see the probe)."""
    if call == "features":
        return model.forward({"input_ids": ids, "attention_mask": mask})
    return model.forward(input_ids=ids, attention_mask=mask, **({"labels": labels} if call.endswith("labels") else {}))


def _rates(sizes) -> tuple:
    """(per token, per row, once) from figures at the :data:`_SHAPES`: tokens doubled, then rows doubled."""
    (b1, s1), (_, s2), (b3, _) = _SHAPES
    per_token = (sizes[1] - sizes[0]) // ((s2 - s1) * b1)
    per_row = (sizes[2] - sizes[0] - per_token * (b3 - b1) * s1) // (b3 - b1)
    return per_token, per_row, sizes[0] - per_token * b1 * s1 - per_row * b1


def _probe(model, base, what: str, rows: int, tokens: int, call: str):
    """(saved bytes, labels, logits bytes per row, loss computed outside) of one forward at ``rows`` x ``tokens``."""
    import torch
    import torch.nn.functional as F
    from transformers.modeling_outputs import BaseModelOutput

    param = next(base.parameters())
    hidden = torch.zeros(rows, tokens, base.config.hidden_size, dtype=param.dtype, device=param.device,
                         requires_grad=any(p.requires_grad for p in base.parameters()))
    ids = torch.ones(rows, tokens, dtype=torch.long, device=param.device)
    mask = torch.ones_like(ids)
    mask[0, tokens // 2:] = 0                      # one padded row: a pooling over the mask sees a real mask
    labels = torch.zeros(rows, dtype=torch.long, device=param.device)
    aside = {_key(t) for t in (*model.parameters(), *model.buffers(), ids, mask, labels)}
    saved, live = {}, _Live(aside)

    held = []   # the saved tensors, alive till the probe ends: no freed storage's address is counted twice

    def pack(tensor):
        if _key(tensor) not in aside:
            saved[_key(tensor)] = tensor.untyped_storage().nbytes()
        held.append(tensor)
        # The graph keeps nothing: a saved tensor kept by its own graph is a reference cycle through C++, which
        # Python's gc cannot see, so each probe would leak its graph and the tensors it saved.
        return None

    def unpack(_packed):
        raise RuntimeError("the kit's head probe only counts what a forward saves; it never runs backward")

    base.forward = lambda *a, **k: BaseModelOutput(last_hidden_state=hidden)   # an instance attribute: the stub
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), live:
            out = call_model(model, call, ids, mask, labels)
            loss, logits = _loss_and_logits(out)
            if logits is None or logits.dim() != 2 or logits.shape[0] != rows:
                shape = "no logits" if logits is None else f"logits of shape {tuple(logits.shape)}"
                raise OwnHeadError(f"{what} gives {shape}, and the kit reads a pooled head's (rows, labels) "
                                   "logits only.", instead=CALLED)
            if loss is None:
                loss = F.cross_entropy(logits, labels)
    except OwnHeadError:
        raise
    except Exception as exc:   # the user's forward, on a made-up hidden state: any failure is a refusal
        raise OwnHeadError(f"{what} cannot be read: its forward failed on a stand-in hidden state "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}).",
                           instead=CALLED) from None
    finally:
        del base.forward
    result = (sum(saved.values()), int(logits.shape[1]), logits[0].numel() * logits.element_size(),
              _loss_and_logits(out)[0] is None, live.peak)
    held.clear()
    return result


class _Live:
    """The most bytes the tensors made inside it held at once (each storage once, freed when its first tensor
    goes): a dispatch mode, as torch's own memory tracker reads ops."""

    def __init__(self, aside: set):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                outer.made(out)
                return out

        self.aside, self.seen, self.now, self.peak, self.mode = aside, set(), 0, 0, Mode()

    def made(self, out) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and _key(t) not in self.aside and _key(t) not in self.seen:
                key, size = _key(t), t.untyped_storage().nbytes()
                self.seen.add(key)
                self.now += size
                self.peak = max(self.peak, self.now)
                weakref.finalize(t, self.freed, key, size)

    def freed(self, key, size) -> None:
        self.seen.discard(key)
        self.now -= size

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _loss_and_logits(out):
    import torch

    if isinstance(out, torch.Tensor):
        return None, out
    if isinstance(out, dict):   # a sentence-transformers model's features: its pooled "sentence_embedding"
        return out.get("loss"), out.get("logits", out.get("sentence_embedding"))
    if isinstance(out, (tuple, list)) and out:
        tensors = [t for t in out if isinstance(t, torch.Tensor)]
        if len(tensors) >= 2 and tensors[0].dim() == 0:
            return tensors[0], tensors[1]
        return None, tensors[0] if tensors else None
    return None, None


def _key(t) -> int:
    """A storage's identity (its StorageImpl), for views and on the meta device alike."""
    return t.untyped_storage()._cdata


def own_head_notes(model, head: OwnHead) -> list:
    """What the estimate of a head of one's own assumed, as notes."""


    notes = [Note(f"{type(model).__name__}'s own head on its {head.base} was read by running it on a stand-in "
                  f"hidden state: it keeps {head.per_token:,} bytes per token and {head.per_row:,} per row for "
                  f"backward, and gives {head.labels} logits per row", field="task", code="own-head")]
    if head.loss_outside:
        notes.append(Note(f"{type(model).__name__}'s forward returns no loss: the loss is taken as "
                          "cross_entropy(logits, labels) (a compute_loss override or the loop's)", field="task",
                          code="own-head-loss"))
    return notes
