"""Free a finished run, prove that the memory came back, and survive out-of-memory errors.

>>> base = take_baseline()                       # before the run
>>> release(trainer, namespace=globals())        # doctest: +SKIP
>>> print(check_returned(base))                  # doctest: +ELLIPSIS
Memory returned. ...

``check_returned`` raises :class:`MemoryNotReturnedError` when memory did not come back,
naming what holds the tensors still alive.

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
import inspect
import re
import sys
import time
import traceback
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from . import device
from .device import Snapshot
from .units import MiB, fmt_bytes


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
                _scrub(obj)
            elif isinstance(obj, types.TracebackType):
                traceback.clear_frames(obj)
            n += 1
        if hasattr(sys, name):
            delattr(sys, name)
    ip = _ipython()
    res = getattr(ip, "last_execution_result", None) if ip else None
    for attr in ("error_in_exec", "error_before_exec"):
        if getattr(res, attr, None) is not None:
            _scrub(getattr(res, attr))
            setattr(res, attr, None)
            n += 1
    tb_holder = getattr(ip, "InteractiveTB", None)
    if getattr(tb_holder, "tb", None) is not None:  # ultratb keeps the last traceback for %debug
        tb_holder.tb = None
        n += 1
    return n


def _scrub(exc: BaseException) -> None:
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
    _malloc_trim()


def _forget_names(objs: list, namespace: dict | None) -> None:
    ids = {id(o) for o in objs}

    def drop(ns: dict, only=None) -> None:
        for k in [k for k, v in ns.items() if id(v) in ids and (only is None or re.fullmatch(only, str(k)))]:
            del ns[k]

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


def _malloc_trim() -> None:
    # glibc keeps freed heap pages; malloc_trim gives them back, so RSS (Colab's RAM gauge) drops.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# -- the check ------------------------------------------------------------------------
@dataclass
class Baseline:
    """A reading plus the tensors alive when it was taken (so new ones can be told apart)."""

    snapshot: Snapshot
    storages: frozenset


def take_baseline() -> Baseline:
    """Collect garbage and read memory: the level a run must come back to.

    >>> base = take_baseline()
    >>> base.snapshot.rss_bytes > 0
    True
    """
    gc.collect()
    snap, stores = _read()
    return Baseline(snap, frozenset(stores))


def _read() -> tuple[Snapshot, dict]:
    """A snapshot and the live storages from one gc walk (the walk is the slow part)."""
    stores = _storages()
    snap = device.snapshot(live_tensors=False)
    for (dev, _), (nbytes, _) in stores.items():   # the same sum as device.live_tensor_bytes()
        snap.live_tensor_bytes[dev] = snap.live_tensor_bytes.get(dev, 0) + nbytes
    return snap, stores


def _storages() -> dict:
    """(device, data_ptr) -> [nbytes, [weakrefs to tensors]] for live tensors, views grouped by storage."""
    found: dict = {}
    for obj in gc.get_objects():
        try:
            # type(), not isinstance(): isinstance reads __class__, which warns on some lazy objects
            if not issubclass(type(obj), torch.Tensor) or obj.is_meta:
                continue
            st = obj.untyped_storage()
            key, nbytes = (str(obj.device), st.data_ptr()), st.nbytes()
        except Exception:
            continue
        if nbytes:
            found.setdefault(key, [nbytes, []])[1].append(weakref.ref(obj))  # weak: not a holder
    return found


@dataclass
class TensorInfo:
    nbytes: int
    device: str
    desc: str                     # e.g. "float32[4096, 4096]"
    holders: list = field(default_factory=list)

    def text(self) -> str:
        held = "; ".join(self.holders) if self.holders else "no holder found through the garbage collector"
        return f"{fmt_bytes(self.nbytes):>11}  {self.desc} on {self.device}  held by: {held}"


@dataclass
class ReturnReport:
    """Did memory come back to the baseline? ``text()`` / ``str()`` read it aloud."""

    ok: bool
    reading: str
    baseline_bytes: int
    now_bytes: int
    allowed_bytes: int
    tensors: list = field(default_factory=list)

    @property
    def excess_bytes(self) -> int:
        return self.now_bytes - self.baseline_bytes

    def text(self) -> str:
        head = (f"{self.reading}: baseline {fmt_bytes(self.baseline_bytes)}, now {fmt_bytes(self.now_bytes)}, "
                f"difference {fmt_bytes(self.excess_bytes)} (allowed {fmt_bytes(self.allowed_bytes)})")
        if self.ok:
            return "Memory returned. " + head
        lines = ["Memory NOT returned. " + head, "Largest tensors alive that were not there at the baseline:"]
        return "\n".join(lines + (["  " + t.text() for t in self.tensors] or ["  (none found)"]))

    __str__ = text


class MemoryNotReturnedError(RuntimeError):
    """Raised by :func:`check_returned`; ``.report`` holds the :class:`ReturnReport`."""

    def __init__(self, report: ReturnReport):
        super().__init__(report.text())
        self.report = report


def check_returned(baseline, *, tolerance_bytes: int = MiB, tolerance_frac: float = 0.01,
                   raise_on_leak: bool = True, top: int = 5) -> ReturnReport:
    """Check that memory came back to ``baseline`` (a :class:`Baseline`, a Snapshot or bytes).

    Compares the best reading (CUDA allocated, else CPU live tensors), after
    ``gc.collect()``. It passes within ``max(tolerance_bytes, tolerance_frac * baseline)``.
    Otherwise the report lists the largest tensors alive (new since the baseline when it
    is a :class:`Baseline`), with the names of what holds them, e.g.
    ``__main__.trainer.model.lm_head.weight``; and it raises unless ``raise_on_leak=False``.

    >>> check_returned(take_baseline()).ok
    True
    """
    if isinstance(baseline, Baseline):
        base_bytes, known = baseline.snapshot.best_bytes, baseline.storages
    elif isinstance(baseline, Snapshot):
        base_bytes, known = baseline.best_bytes, frozenset()
    elif isinstance(baseline, int) and baseline >= 0:
        base_bytes, known = baseline, frozenset()
    else:
        raise ValueError(f"baseline must be take_baseline(), a Snapshot or a byte count, not {baseline!r}")
    gc.collect()
    device.empty_cache()
    now, stores = _read()
    allowed = max(int(tolerance_bytes), int(tolerance_frac * base_bytes))
    report = ReturnReport(now.best_bytes - base_bytes <= allowed, device.best_reading(), base_bytes,
                          now.best_bytes, allowed)
    if not report.ok:
        on = "cuda" if device.has_cuda() else "cpu"
        biggest = sorted((k for k in stores if k not in known and k[0].startswith(on)), key=lambda k: -stores[k][0])[:top]
        groups = [[t for t in (w() for w in stores[k][1]) if t is not None] for k in biggest]
        biggest, groups = [k for k, g in zip(biggest, groups) if g], [g for g in groups if g]
        names = _holders(groups, 12, 3, sys._getframe(1)) if groups else []
        t = tensors = None
        for k, tensors, held in zip(biggest, groups, names):
            t = max(tensors, key=lambda x: x.numel())
            desc = f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
            report.tensors.append(TensorInfo(stores[k][0], k[0], desc, held))
        del groups, tensors, t
    del stores
    if not report.ok and raise_on_leak:
        raise MemoryNotReturnedError(report)
    return report


def _module_map() -> dict:
    """id(submodule) -> (weakref to its top-level module, dotted name) for every live nn.Module."""
    mods = [o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)]
    inner = {id(c) for m in mods for c in m.children()}
    found = {}
    for top in mods:
        if id(top) not in inner:
            for name, sub in top.named_modules():
                if sub is not top:
                    found.setdefault(id(sub), (weakref.ref(top), name))   # weak: not a holder
    return found


def holders_of(objs: list, *, max_depth: int = 12, max_paths: int = 3) -> list[str]:
    """Names of what keeps ``objs`` alive, found by climbing ``gc.get_referrers``.

    Each name is a path from a root (a module global, a running function's local, a
    class) down to the object: ``__main__.KEEP['x']``, ``holder.big (a local variable of f())``,
    ``__main__.trainer.model.transformer.wte.weight``. Pass several objects (views of one
    storage) to search from all of them.

    >>> KEEP = {"x": torch.zeros(10)}
    >>> holders_of([KEEP["x"]])                                     # doctest: +SKIP
    ["__main__.KEEP['x']"]
    """
    return _holders([list(objs)], max_depth, max_paths, sys._getframe(1))[0]


def _stack_roots(f) -> dict:
    """id(value) -> root name, for the locals of every running function from frame ``f`` up."""
    stack = {}
    while f is not None:
        if f.f_code.co_filename != __file__:
            module_level = f.f_code.co_name == "<module>"
            local_vars = f.f_locals
            for name, v in local_vars.items():
                stack.setdefault(id(v), f"{f.f_globals.get('__name__', '?')}.{name}" if module_level
                                 else (name, f.f_code.co_name))
            if f.f_code.co_flags & inspect.CO_OPTIMIZED and sys.version_info < (3, 13):
                # Before 3.13, f_locals is a snapshot dict cached on the frame; left filled, it
                # would keep alive whatever the function deletes later (even a tensor we report).
                local_vars.clear()
            del local_vars
        f = f.f_back
    return stack


def _holders(groups: list, max_depth: int, max_paths: int, frame, max_nodes: int = 400) -> list[list[str]]:
    """Holder paths for several groups of objects at once: one pass over all objects per level.

    A submodule is named through its top-level module (one jump instead of two levels
    per module), so even deep weights are found in a few passes.
    """
    modules = _module_map()
    mods = {id(vars(m)): name for name, m in list(sys.modules.items()) if m is not None and hasattr(m, "__dict__")}
    stack = _stack_roots(frame)
    came = [{id(o): None for o in g} for g in groups]   # per group: id -> (child id, label of the reference)
    paths: list[list[str]] = [[] for _ in groups]

    def path_from(g: int, node_id: int, root) -> str:
        parts = [root if isinstance(root, str) else root[0]]
        while came[g].get(node_id):
            node_id, label = came[g][node_id]
            parts.append(label)
        return _pretty("".join(parts)) + ("" if isinstance(root, str) else f" (a local variable of {root[1]}())")

    frontier: dict = {}                                  # id -> [object, {groups}]
    for g, objs in enumerate(groups):
        for o in objs:
            if id(o) in stack:
                paths[g].append(path_from(g, id(o), stack[id(o)]))
            frontier.setdefault(id(o), [o, set()])[1].add(g)
    first = [0 if p else None for p in paths]           # level of a group's first path: search 2 more
    for level in range(max_depth):
        for g, p in enumerate(paths):
            first[g] = level if first[g] is None and p else first[g]
        busy = {g for g, p in enumerate(paths) if len(p) < max_paths and (first[g] is None or level - first[g] < 2)}
        live = [v[0] for v in frontier.values() if v[1] & busy]
        if not live:
            break
        nxt: dict = {}
        r = None
        mine = {id(x) for x in (groups, frontier, nxt, live, came, paths, *groups, *frontier.values())}
        for r in gc.get_referrers(*live):
            if id(r) in mine or (type(r) is tuple and len(r) == len(live) and r[0] is live[0]):
                continue                                 # our own containers and the call's argument tuple
            if isinstance(r, types.FrameType) and r.f_code.co_filename == __file__:
                continue
            for child in gc.get_referents(r):
                entry = frontier.get(id(child))
                if entry is None or entry[0] is not child:
                    continue
                label, root = _edge(r, child, mods)
                top, name = modules.get(id(r), (lambda: None, ""))
                top = top() if root is None else None
                for g in entry[1] & busy:
                    if id(r) in came[g] or len(paths[g]) >= max_paths:
                        continue
                    came[g][id(r)] = (id(child), label)
                    node = r
                    if top is not None and id(top) not in came[g]:
                        came[g][id(top)] = (id(r), "." + name)   # jump up the module tree at once
                        node = top
                    where = root or stack.get(id(node))
                    if where is not None:
                        paths[g].append(path_from(g, id(node), where))
                    elif len(nxt) < max_nodes:
                        nxt.setdefault(id(node), [node, set()])[1].add(g)
                    del node
                del top, entry
        del r, live
        frontier = nxt
        mine.clear()
    for g, objs in enumerate(groups):
        if not paths[g]:
            last = [v[0] for v in frontier.values() if g in v[1]]
            paths[g] = [path_from(g, id(last[0]), f"<{type(last[0]).__name__} object>") + " (root not found)"] \
                if last else []
    frontier.clear()
    return [sorted(set(p), key=len)[:max_paths] for p in paths]


def _edge(r, child, mods: dict) -> tuple[str, str | None]:
    """Label of the reference r -> child, and the root name when r is a root."""
    if isinstance(r, dict):
        key = next((k for k, v in r.items() if v is child), None)
        if key is None:                     # the child is a key, e.g. a parameter in optimizer.state
            return "{key}", None
        if id(r) in mods:
            return "", f"{mods[id(r)]}.{key}"
        if isinstance(key, torch.Tensor):   # optimizer state is keyed by parameter
            return f"[<{type(key).__name__} {'x'.join(map(str, key.shape))}>]", None
        return (f"[{key!r}]" if isinstance(key, (str, int)) else f"[<{type(key).__name__}>]"), None
    if isinstance(r, (list, tuple)):
        return f"[{next((i for i, v in enumerate(r) if v is child), '?')}]", None
    if isinstance(r, types.FrameType):
        name = next((k for k, v in r.f_locals.items() if v is child), "?")
        return f".f_locals[{name!r}]", None
    if isinstance(r, types.TracebackType):
        return (".tb_frame" if r.tb_frame is child else ".tb_next"), None
    if isinstance(r, BaseException):
        return ".__traceback__", None
    if isinstance(r, type):                   # child is the class's attribute dict
        return "", f"class {r.__qualname__}"
    d = getattr(r, "__dict__", None)
    if d is child:
        return ".__dict__", None
    if isinstance(d, dict):
        key = next((k for k, v in d.items() if v is child), None)
        if key is not None:
            return f".{key}", None
    if isinstance(r, torch.Tensor) and r.grad is child:
        return ".grad", None
    return f".<{type(child).__name__}>", None


def _pretty(path: str) -> str:
    """``._modules['h']._modules['0']._parameters['weight']`` -> ``.h.0.weight``."""
    path = re.sub(r"\.__dict__\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\.(_modules|_parameters|_buffers)\['([^']+)'\]", r".\2", path)
    path = re.sub(r"^(class [\w.]+)\['([^']+)'\]", r"\1.\2", path)
    return re.sub(r"\.f_locals\['([^']+)'\]", r"<local \1>", path)


# -- out-of-memory-safe runs ----------------------------------------------------------
@dataclass
class RunResult:
    """What :func:`oom_safe` saw: ``ok``, or ``oom`` with the error text and the setup."""

    ok: bool
    oom: bool = False
    value: Any = None
    error: str | None = None
    setup: dict = field(default_factory=dict)
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.ok

    def text(self) -> str:
        setup = ", ".join(f"{k}={v}" for k, v in self.setup.items()) or "no setup given"
        if self.ok:
            return f"ran ({setup}) in {self.seconds:.1f} s"
        return f"OUT OF MEMORY ({setup}) after {self.seconds:.1f} s: {self.error}"


def oom_safe(fn, *args, setup: dict | None = None, tracker=None, stage: str | None = None, **kwargs) -> RunResult:
    """Run ``fn(*args, **kwargs)``; on an out-of-memory error, free its memory and return a result.

    Catches ``torch.OutOfMemoryError``, CUDA's "out of memory" RuntimeError and
    ``MemoryError`` (other errors propagate untouched). The failed call's frames are
    cleared (the exception's traceback keeps every tensor they held), stored exceptions
    are dropped, gradients of modules passed as arguments are dropped, then gc and the
    CUDA cache run. The kernel stays usable. With ``tracker``, the call is a stage.

    >>> r = oom_safe(train, setup={"batch_size": 64})              # doctest: +SKIP
    >>> r.oom, r.error                                               # doctest: +SKIP
    (True, 'OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')
    """
    return _guarded(fn, args, kwargs, setup, tracker, stage, collect=True)


def _guarded(fn, args, kwargs, setup, tracker, stage, collect: bool) -> RunResult:
    setup = dict(setup or {})
    t = time.perf_counter()
    try:
        if tracker is not None:
            with tracker.stage(stage or getattr(fn, "__name__", "run")):
                value = fn(*args, **kwargs)
        else:
            value = fn(*args, **kwargs)
        return RunResult(True, value=value, setup=setup, seconds=time.perf_counter() - t)
    except BaseException as exc:
        if not device.is_oom(exc):
            raise
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]
        _scrub(exc)
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.nn.Module):
            a.zero_grad(set_to_none=True)
    forget_exceptions()
    if collect:
        gc.collect()
        device.empty_cache()
    return RunResult(False, oom=True, error=error, setup=setup, seconds=time.perf_counter() - t)


class SweepPoint(NamedTuple):
    size: int
    peak_bytes: int | None
    oom: bool


@dataclass
class BatchSizeSearch:
    best: int | None                      # the largest batch size that ran, None if none did
    points: list                          # SweepPoint per attempt, by size: ready for plot.sweep
    results: list                         # RunResult per attempt, in the order tried

    def text(self) -> str:
        tried = ", ".join(f"{p.size}{' OOM' if p.oom else ''}" for p in self.points)
        return f"largest batch size that fits: {self.best} (tried {tried})"


def largest_batch_size(train_fn, start: int, *, min_size: int = 1, refine: bool = True,
                       precision: int | None = None, tracker=None, reset_peak: bool = True) -> BatchSizeSearch:
    """Find the largest batch size for which ``train_fn(batch_size)`` runs without OOM.

    Halves from ``start`` with accelerate's ``find_executable_batch_size`` until a size
    fits, then (``refine``) bisects between it and the smallest failure, to within
    ``precision`` (default: a tenth of the size that fits). Each attempt runs as an
    :func:`oom_safe` stage of ``tracker``, with the peak counters reset at its start
    (``reset_peak``): this sweep owns the peak while it runs. Peaks are CUDA max
    allocated on a GPU, else the process's peak RSS.

    >>> search = largest_batch_size(lambda bs: trainer_at(bs).train(), start=64)   # doctest: +SKIP
    >>> plot.sweep(search.points, "batch size")                                   # doctest: +SKIP
    """
    from accelerate.utils import find_executable_batch_size

    from .track import Tracker

    if not isinstance(start, int) or start < min_size or min_size < 1:
        raise ValueError(f"need integers start >= min_size >= 1, got start={start!r}, min_size={min_size!r}")
    tracker = tracker or Tracker()
    results: list[RunResult] = []
    points: dict[int, SweepPoint] = {}

    def attempt(bs: int, collect: bool = True) -> RunResult:
        r = _guarded(_run_stage, (tracker, f"batch size {bs}", reset_peak, train_fn, bs), {}, {"batch_size": bs},
                     None, None, collect)
        rec = tracker.records[-1]
        peak = rec.cuda_peak_bytes if rec.on_cuda else rec.rss_peak_bytes
        points[bs] = SweepPoint(bs, None if r.oom else peak, r.oom)
        results.append(r)
        return r

    def probe(batch_size: int) -> int:
        if attempt(batch_size, collect=False).oom:      # accelerate collects after a failure
            # accelerate retries only RuntimeErrors whose text has " out of memory.". Raise a
            # fresh one: the failed run's frames are already cleared, so accelerate's gc.collect
            # inside its except-block can free them (the original exception would keep them).
            raise RuntimeError(f"kit: out of memory. at batch size {batch_size}")
        return batch_size

    size = [start]

    def halve() -> int:
        size[0] = size[0] // 2 if size[0] // 2 >= min_size else 0   # 0 makes accelerate stop
        return size[0]

    try:
        best = find_executable_batch_size(probe, starting_batch_size=start, reduce_batch_size_fn=halve)()
    except RuntimeError as exc:
        if "reached zero" not in str(exc):
            raise
        best = None
    if best is not None and refine:
        fails = [p.size for p in points.values() if p.oom and p.size > best]
        hi, step = (min(fails) if fails else best), precision or max(1, best // 10)
        while hi - best > step:
            mid = (best + hi) // 2
            if attempt(mid).oom:
                hi = mid
            else:
                best = mid
    return BatchSizeSearch(best, sorted(points.values()), results)


def _run_stage(tracker, name, reset_peak, fn, bs):
    # no gc walks: a sweep reads the peak counters, and oom_safe collects after a failure
    with tracker.stage(name, reset_peak=reset_peak, collect=False, live_tensors=False):
        return fn(bs)
