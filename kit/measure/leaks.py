"""Did the memory come back? A baseline, the check against it, and what holds what is left.

>>> base = take_baseline()                       # before the run
>>> print(check_returned(base))                  # doctest: +ELLIPSIS
Memory returned. ...

``check_returned`` raises :class:`MemoryNotReturnedError` when memory did not come back,
naming what holds the tensors still alive (``__main__.trainer.model.lm_head.weight``).
"""
from __future__ import annotations

import gc
import inspect
import re
import sys
import types
import weakref
from dataclasses import dataclass, field

import torch

from kit import machine
from kit.measure import device
from kit.measure.device import Snapshot
from kit.units import MiB, fmt_bytes


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
    clear_cublas_workspaces()
    snap, stores = _read()
    return Baseline(snap, frozenset(stores))


def clear_cublas_workspaces() -> bool:
    """Free the cuBLAS workspaces, as PyTorch's own leak check does before it compares
    (``torch._C._cuda_clearCublasWorkspaces()``). The first matmul on each thread allocates one through
    the caching allocator and keeps it for the life of the process (8,519,680 B on a T4, 32 MiB on sm90;
    one for the forward thread, one for autograd's), so without this the first run in a process would
    show a false leak. The next matmul makes a new one. True when they were cleared; False without CUDA.

    >>> clear_cublas_workspaces() in (True, False)
    True
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if not machine.has_cuda() or clear is None:
        return False
    clear()
    return True


def _read() -> tuple[Snapshot, dict]:
    """A snapshot and the live storages from one gc walk (the walk is the slow part)."""
    stores = _storages()
    snap = device.snapshot(live_tensors=False)
    snap.live_tensor_bytes = {}
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
    clear_cublas_workspaces()
    device.empty_cache()
    now, stores = _read()
    allowed = max(int(tolerance_bytes), int(tolerance_frac * base_bytes))
    report = ReturnReport(now.best_bytes - base_bytes <= allowed, device.best_reading(), base_bytes,
                          now.best_bytes, allowed)
    if not report.ok:
        on = "cuda" if machine.has_cuda() else "cpu"
        biggest = sorted((k for k in stores if k not in known and k[0].startswith(on)),
                         key=lambda key: -stores[key][0])[:top]
        groups = [[t for t in (w() for w in stores[k][1]) if t is not None] for k in biggest]
        biggest, groups = [k for k, g in zip(biggest, groups) if g], [g for g in groups if g]
        names = _holders(groups, 12, 3, sys._getframe(1)) if groups else []
        t = tensors = None
        for k, tensors, held in zip(biggest, groups, names):
            t = max(tensors, key=lambda tensor: tensor.numel())
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


def _stack_roots(frame) -> dict:
    """id(value) -> root name, for the locals of every running function from frame ``frame`` up."""
    stack = {}
    while frame is not None:
        if frame.f_code.co_filename != __file__:
            module_level = frame.f_code.co_name == "<module>"
            local_vars = frame.f_locals
            for name, v in local_vars.items():
                stack.setdefault(id(v), f"{frame.f_globals.get('__name__', '?')}.{name}" if module_level
                                 else (name, frame.f_code.co_name))
            if frame.f_code.co_flags & inspect.CO_OPTIMIZED and sys.version_info < (3, 13):
                # Before 3.13, f_locals is a snapshot dict cached on the frame; left filled, it
                # would keep alive whatever the function deletes later (even a tensor we report).
                local_vars.clear()
            del local_vars
        frame = frame.f_back
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

    def path_from(graph: int, node_id: int, root) -> str:
        parts = [root if isinstance(root, str) else root[0]]
        while came[graph].get(node_id):
            node_id, label = came[graph][node_id]
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


def _edge(referrer, child, mods: dict) -> tuple[str, str | None]:
    """Label of the reference r -> child, and the root name when r is a root."""
    if isinstance(referrer, dict):
        key = next((k for k, v in referrer.items() if v is child), None)
        if key is None:                     # the child is a key, e.g. a parameter in optimizer.state
            return "{key}", None
        if id(referrer) in mods:
            return "", f"{mods[id(referrer)]}.{key}"
        if isinstance(key, torch.Tensor):   # optimizer state is keyed by parameter
            return f"[<{type(key).__name__} {'x'.join(map(str, key.shape))}>]", None
        return (f"[{key!r}]" if isinstance(key, (str, int)) else f"[<{type(key).__name__}>]"), None
    if isinstance(referrer, (list, tuple)):
        return f"[{next((i for i, v in enumerate(referrer) if v is child), '?')}]", None
    if isinstance(referrer, types.FrameType):
        name = next((k for k, v in referrer.f_locals.items() if v is child), "?")
        return f".f_locals[{name!r}]", None
    if isinstance(referrer, types.TracebackType):
        return (".tb_frame" if referrer.tb_frame is child else ".tb_next"), None
    if isinstance(referrer, BaseException):
        return ".__traceback__", None
    if isinstance(referrer, type):                   # child is the class's attribute dict
        return "", f"class {referrer.__qualname__}"
    d = getattr(referrer, "__dict__", None)
    if d is child:
        return ".__dict__", None
    if isinstance(d, dict):
        key = next((k for k, v in d.items() if v is child), None)
        if key is not None:
            return f".{key}", None
    if isinstance(referrer, torch.Tensor) and referrer.grad is child:
        return ".grad", None
    return f".<{type(child).__name__}>", None


def _pretty(path: str) -> str:
    """``._modules['h']._modules['0']._parameters['weight']`` -> ``.h.0.weight``."""
    path = re.sub(r"\.__dict__\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\.(_modules|_parameters|_buffers)\['([^']+)'\]", r".\2", path)
    path = re.sub(r"^(class [\w.]+)\['([^']+)'\]", r"\1.\2", path)
    return re.sub(r"\.f_locals\['([^']+)'\]", r"<local \1>", path)
