"""Free a finished run: the Trainer, the optimizer, the gradients, and the errors that hold frames.

>>> from kit.measure import leaks
>>> base = leaks.take_baseline()                 # before the run
>>> release(trainer, namespace=globals())        # doctest: +SKIP
>>> print(leaks.check_returned(base))            # doctest: +ELLIPSIS
Memory returned. ...

Proving that the memory came back is :mod:`kit.measure.leaks`'s; surviving an out-of-memory error
is :mod:`kit.measure.oom`'s.

**Why a namespace.** A function cannot delete its caller's variables, and while a call
runs the caller still holds its arguments. So ``release`` empties the heavy parts *in
place* (the Trainer's model, optimizer and accelerator lists, the optimizer's state,
the gradients, and with ``free_model=True`` the weights themselves, moved to the
``meta`` device), and then deletes every name bound to a released object from the
``namespace`` you pass: ``globals()`` in a notebook. Inside a function, rebind instead:
``trainer = release(trainer)`` (it returns None).
"""
from __future__ import annotations

import ctypes
import gc
import re
import sys
import traceback
import types
import weakref

import torch

from kit.inputs import InputError
from kit.measure import device


# -- release --------------------------------------------------------------------------
def forget_exceptions() -> int:
    """Drop stored exceptions and the frames their tracebacks keep alive; returns how many.

    Python keeps the last uncaught error in ``sys.last_traceback`` (and ``last_value``,
    ``last_type``, ``last_exc``); IPython keeps it in ``last_execution_result`` too. Each
    traceback holds the frames of the failed call, with every tensor they referenced.
    """
    n = 0
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        obj = getattr(sys, name, None)
        if obj is not None:
            if isinstance(obj, BaseException):
                scrub(obj)
            elif isinstance(obj, types.TracebackType):
                traceback.clear_frames(obj)
            n += 1
        if hasattr(sys, name):
            delattr(sys, name)
    ip = _ipython()
    res = getattr(ip, "last_execution_result", None) if ip else None
    for attr in ("error_in_exec", "error_before_exec"):
        if getattr(res, attr, None) is not None:
            scrub(getattr(res, attr))
            setattr(res, attr, None)
            n += 1
    tb_holder = getattr(ip, "InteractiveTB", None)
    if getattr(tb_holder, "tb", None) is not None:  # ultratb keeps the last traceback for %debug
        tb_holder.tb = None
        n += 1
    return n


def scrub(exc: BaseException) -> None:
    """Clear the frames of an exception's traceback, its cause and context included."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # skips frames still running
            exc.__traceback__ = None
        nxt = exc.__cause__ or exc.__context__
        exc.__cause__ = exc.__context__ = None
        exc = nxt


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


_HEAVY = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.utils.data.DataLoader)


def _strip(obj, names=()) -> None:
    """Set attributes holding modules, optimizers, schedulers, tensors or data loaders to None."""
    for k, v in list(getattr(obj, "__dict__", {}).items()):
        if k in names or isinstance(v, _HEAVY) or type(v).__name__.endswith(("Scheduler", "LR")):
            setattr(obj, k, None)


def _clear_optimizer(opt) -> None:
    for o in (opt, getattr(opt, "optimizer", None)):   # accelerate's AcceleratedOptimizer wraps one
        if isinstance(o, torch.optim.Optimizer):
            o.state.clear()                            # Adam's moments: 2x the trainable weights
            for g in o.param_groups:
                g["params"] = []                       # else the optimizer keeps the weights alive


def _free_weights(model) -> None:
    """Move a model's weights to the meta device, so no leftover reference can hold them."""
    try:
        model.to("meta")
    except Exception:  # quantized layers may refuse .to(); empty their storage instead
        for t in list(model.parameters()) + list(model.buffers()):
            try:
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            except Exception:
                pass


def release(trainer=None, model=None, optimizer=None, *, free_model: bool = False,
            namespace: dict | None = None) -> None:
    """Free a finished run: Trainer, accelerator references, optimizer, gradients, stored errors.

    - ``trainer``: its model, optimizer, scheduler, data loaders and callback handler's
      references are dropped, and ``trainer.accelerator.free_memory()`` empties the
      accelerator's lists. The Trainer cannot train again afterwards.
    - ``optimizer``: its state and parameter lists are emptied.
    - ``model``: its gradients are dropped; with ``free_model=True`` (also for the
      Trainer's model) its weights are moved to the meta device. Do not do that to a
      base model you will reuse (scenario 2 reuses one across folds).
    - ``namespace``: every name in it bound to the trainer, the optimizer or a freed model
      is deleted; pass ``globals()`` in a notebook. IPython's output cache (``Out``, ``_``)
      is cleaned of them in any case.

    Then stored exceptions are dropped (:func:`forget_exceptions`), ``gc.collect()`` runs,
    the CUDA cache is emptied and the C heap is trimmed. Returns None:
    ``trainer = release(trainer)``.

    >>> release(trainer, namespace=globals())          # doctest: +SKIP
    """
    models = [m for m in (model, getattr(trainer, "model", None), getattr(trainer, "model_wrapped", None))
              if isinstance(m, torch.nn.Module)]
    optimizers = [o for o in (optimizer, getattr(trainer, "optimizer", None)) if o is not None]
    forget = [o for o in (trainer, optimizer) if o is not None] + (models if free_model else [])
    if trainer is not None:
        acc = getattr(trainer, "accelerator", None)
        if acc is not None and hasattr(acc, "free_memory"):
            # Empties the accelerator's _models/_optimizers/_schedulers/_dataloaders (and a
            # DeepSpeed engine). Its own gc.collect() runs before it empties them, so ours
            # below is still needed.
            acc.free_memory()
        del acc
        _strip(getattr(trainer, "callback_handler", None), ("train_dataloader", "eval_dataloader"))
        _strip(trainer, ("model", "model_wrapped", "optimizer", "lr_scheduler", "deepspeed"))
    for o in optimizers:
        _clear_optimizer(o)
    for m in models:
        m.zero_grad(set_to_none=True)
        if free_model:
            _free_weights(m)
    _forget_names(forget, namespace)
    del trainer, model, optimizer, models, optimizers, forget
    forget_exceptions()
    gc.collect()
    device.empty_cache()
    malloc_trim()


def free(namespace: dict) -> str:
    """Release everything in ``namespace`` that holds memory, delete those names, and say what came back:
    ``print(kit.free(globals()))`` at the end of a notebook, or after an out-of-memory error.

    Each name bound to a Trainer, a model (``nn.Module``: its weights go to the meta device), an optimizer or a
    tensor of the run (on a GPU, or with a graph or gradients) is released (:func:`release`) and deleted; names
    starting with ``_`` are left alone. Nothing still referenced elsewhere is destroyed: a model, Trainer or
    optimizer that something outside the names freed also holds (a ``best_models`` dict) is kept as it is, and said;
    so are CPU tensors without a graph (your data, a best loss). A tensor that something else still holds (a
    function's local variable: ``locals()`` is a copy) is named apart, with its bytes. The text gives the names,
    and the best reading (:func:`kit.measure.device.best_reading`) and the live-tensor bytes before and after,
    MEASURED.

    >>> ns = {"w": torch.zeros(1024, 1024, requires_grad=True), "data": torch.zeros(4), "note": "kept"}
    >>> text = free(ns)
    >>> "freed 1 name (w)" in text, "kept data: your data on the CPU" in text, sorted(ns)
    (True, True, ['data', 'note'])
    """
    if not isinstance(namespace, dict):
        given = "None" if namespace is None else f"a {type(namespace).__name__}"
        raise InputError("namespace", f"kit.free takes the dict of names that hold the memory, not {given}: call "
                                      f"print(kit.free(globals())) in a notebook.")
    before, live_before = device.snapshot().best_bytes, device.live_tensor_bytes("cpu") + _cuda_live()
    released, kept = _release_names(namespace)
    forget_exceptions()
    gc.collect()
    device.empty_cache()
    malloc_trim()
    held = {name: _held_bytes(ref()) for name, ref in released.items()}
    held = {name: n for name, n in held.items() if n}
    freed = [name for name in released if name not in held]
    after, live_after = device.snapshot().best_bytes, device.live_tensor_bytes("cpu") + _cuda_live()
    shown = _listed(freed) or ("" if held else "none held memory")
    return (f"freed {len(freed)} name{'' if len(freed) == 1 else 's'}{f' ({shown})' if shown else ''}; "
            + "".join(f"kept {name}: {why}; " for name, why in kept.items())
            + _held_text(held)
            + f"MEASURED {device.best_reading()}: {before:,} -> {after:,} bytes; live tensors {live_before:,} -> "
              f"{live_after:,} bytes")


def _release_names(namespace: dict) -> tuple[dict, dict]:
    """Release and delete each name bound to a Trainer, model, optimizer or a tensor of the run (on a GPU, or
    holding a graph or gradients); weak references to them. Kept, with why: an object still referenced elsewhere
    (never destroyed: a model also in ``best_models`` keeps its weights) and a CPU tensor without a graph (the
    user's data, a figure kept)."""
    from transformers import Trainer  # here: `kit.measure` stays importable without transformers' Trainer

    kinds = (Trainer, torch.nn.Module, torch.optim.Optimizer, torch.Tensor)
    names = [n for n, v in namespace.items() if not n.startswith("_") and isinstance(v, kinds)]
    kept = {n: "your data on the CPU (no graph, no gradient): del it yourself to free "
               f"{namespace[n].untyped_storage().nbytes():,} bytes of RAM" for n in names
            if isinstance(namespace[n], torch.Tensor) and _is_data(namespace[n])}
    names = [n for n in names if n not in kept]
    kept.update(_held_elsewhere(namespace, names))
    released = {}
    for name in [n for n in names if n not in kept]:
        value = namespace[name]
        if isinstance(value, Trainer):
            release(value, free_model=True)
        elif isinstance(value, torch.nn.Module):
            release(model=value, free_model=True)
        elif isinstance(value, torch.optim.Optimizer):
            release(optimizer=value)
        released[name] = _weak(value)
        del namespace[name], value
    return released, kept


def _is_data(tensor) -> bool:
    return tensor.device.type == "cpu" and not tensor.requires_grad and tensor.grad_fn is None


def _held_elsewhere(namespace: dict, names: list) -> dict:
    """{name: why} for each Trainer, model or optimizer among ``names`` that something outside them and the
    namespace still references (a dict of best models, a list, a closure): releasing it would destroy what that
    reference holds. A tensor is never destroyed (its name is deleted: another reference keeps it)."""
    heavy = [namespace[n] for n in names if not isinstance(namespace[n], torch.Tensor)]
    inside = _reachable(heavy, namespace) | {id(namespace), id(heavy)}
    ip = _ipython()
    if ip is not None:   # IPython's output cache is cleaned by release (_forget_names), not a holder
        inside |= {id(ip.user_ns.get("Out")), id(getattr(ip.displayhook, "__dict__", None))}
    holders = {id(v): n for n, v in namespace.items()} | {id(getattr(v, "__dict__", None)): n
                                                           for n, v in namespace.items()}
    out = {}
    for name in names:
        value = namespace[name]
        if isinstance(value, torch.Tensor):
            continue
        others = [r for r in gc.get_referrers(value) if id(r) not in inside and not isinstance(
            r, (types.FrameType, weakref.ReferenceType))]
        if others:
            by = next((holders[id(r)] for r in others if id(r) in holders), None)
            out[name] = (f"also held by {by}" if by else f"also held by a {type(others[0]).__name__} outside "
                         "the names given") + ": kept as it is (releasing it would destroy what that holds)"
    return out


def _reachable(roots: list, namespace: dict) -> set:
    """ids of the containers and objects reachable from ``roots`` through dicts, lists, tuples, sets and objects'
    ``__dict__`` (not through tensors, types, modules or functions, which lead everywhere); never ``namespace``."""
    seen, stack = set(), list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is namespace:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            stack += list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif not isinstance(obj, (torch.Tensor, type, types.ModuleType, types.FunctionType, str, bytes)) and \
                isinstance(getattr(obj, "__dict__", None), dict):
            stack.append(obj.__dict__)
    return seen


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:               # no weak reference to it: judged gone, as before
        return lambda: None


def _held_bytes(obj) -> int:
    """Bytes a released object still holds: a tensor kept alive elsewhere, or a model whose weights stayed."""
    if isinstance(obj, torch.Tensor):
        return 0 if obj.is_meta else obj.untyped_storage().nbytes()
    if isinstance(obj, torch.nn.Module):
        tensors = [t for t in list(obj.parameters()) + list(obj.buffers()) if not t.is_meta]
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    return 0


def _listed(names) -> str:
    names = list(names)
    return ", ".join(names[:8]) + (f", and {len(names) - 8} more" if len(names) > 8 else "")


def _held_text(held: dict) -> str:
    if not held:
        return ""
    shown = _listed(f"{name} ({n:,} bytes)" for name, n in held.items())
    first = next(iter(held))
    return (f"still held elsewhere: {shown}, so that memory did not come back: deleting a name does not free what "
            f"another reference holds, and inside a function locals() is a copy (write {first} = None there, "
            f"or free at the notebook's top level with kit.free(globals())); ")


def _cuda_live() -> int:
    return sum(n for dev, n in device.live_tensor_bytes().items() if dev.startswith("cuda"))


def _forget_names(objs: list, namespace: dict | None) -> None:
    ids = {id(o) for o in objs}

    def drop(scope: dict, only=None) -> None:
        for k in [k for k, v in scope.items() if id(v) in ids and (only is None or re.fullmatch(only, str(k)))]:
            del scope[k]

    if namespace is not None:
        drop(namespace)
    ip = _ipython()
    if ip is not None:      # IPython's output cache: Out[n], _n, _, __, ___ (what %xdel cleans)
        if isinstance(ip.user_ns.get("Out"), dict):
            drop(ip.user_ns["Out"])
        drop(ip.user_ns, r"_+|_\d+")
        for name in ("_", "__", "___"):
            if id(getattr(ip.displayhook, name, None)) in ids:
                setattr(ip.displayhook, name, None)
        res = getattr(ip, "last_execution_result", None)
        if id(getattr(res, "result", None)) in ids:
            res.result = None


def malloc_trim() -> None:
    # glibc keeps freed heap pages; malloc_trim gives them back, so RSS (Colab's RAM gauge) drops.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
