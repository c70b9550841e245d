"""What was alive when a run failed, read while the failed call's frames still hold it: :func:`read_alive` (ints and
strings only; it keeps no tensor). Tensors are named by what they are (a weight, its gradient, its optimizer state),
else by the failed frame's local that held them, else by the garbage collector's referrers (:mod:`kit.measure.leaks`).
"""
from __future__ import annotations

import gc
import re
import sys
import weakref

import torch

from kit import machine
from kit.measure import device, leaks
from kit.units import fmt_bytes


def _optimizers(trainer) -> list:
    opt = getattr(trainer, "optimizer", None)
    return [o for o in (opt, getattr(opt, "optimizer", None)) if isinstance(o, torch.optim.Optimizer)]


def _named(trainer, device_type: str) -> tuple[dict, dict]:
    """(storage ptr -> (component, label)) for weights, gradients and optimizer state on ``device_type``, and
    their bytes."""
    names, sizes = {}, {"weights": 0, "gradients": 0, "optimizer state": 0}
    model = getattr(trainer, "model", None)

    def add(tensor, comp, label):
        if isinstance(tensor, torch.Tensor) and tensor.device.type == device_type and not tensor.is_meta:
            st = tensor.untyped_storage()
            if st.data_ptr() not in names and st.nbytes():
                names[st.data_ptr()] = (comp, label)
                sizes[comp] += st.nbytes()

    pname = {}
    if isinstance(model, torch.nn.Module):
        for n, p in model.named_parameters(remove_duplicate=True):
            pname[id(p)] = n
            add(p, "weights", f"weight {n}")
        for n, b in model.named_buffers():
            add(b, "weights", f"buffer {n}")
        for n, p in model.named_parameters():
            add(p.grad, "gradients", f"gradient of {n}")
    for o in _optimizers(trainer):
        for p, st in o.state.items():
            for k, v in st.items():
                add(v, "optimizer state", f"optimizer state {k!r} of {pname.get(id(p), 'a parameter')}")
    return names, sizes


def _frame_locals(exc, modules: dict) -> dict:
    """storage ptr -> "local `x` of f() (file:line)" for tensors the failed call's frames held (one level into
    lists, tuples and dicts). ``modules``: id(submodule) -> its name, to say whose forward a frame ran."""
    found = {}
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        f = tb.tb_frame
        where = f"{f.f_code.co_name}() ({f.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno})"
        me = modules.get(id(f.f_locals.get("self")))
        if me is not None:
            where = f"{where[:-1]}, in {me or 'the model'}'s call)"
        for name, v in f.f_locals.items():
            vals = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
            for t in list(vals)[:64]:
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    try:
                        found.setdefault(t.untyped_storage().data_ptr(), f"local `{name}` of {where}")
                    except Exception:
                        pass
        tb = tb.tb_next
    return found


def read_alive(trainer, exc, *, top: int = 5, holders: int = 3) -> tuple[dict, dict, list]:
    """What was alive while ``exc`` still holds the failed frames: (measured components, CUDA readings,
    lines for the ``top`` largest live tensors with what held them). Keeps no tensor.

    Tensors are named by what they are (a weight, its gradient, its optimizer state), else by the failed
    frame's local that held them, else (for the ``holders`` largest left) by climbing the garbage
    collector's referrers with :mod:`kit.measure.leaks`.
    """

    on = "cuda" if machine.has_cuda() else "cpu"
    gc.collect()
    snap = device.snapshot(live_tensors=False)
    stores = leaks._storages()                     # (device, ptr) -> [nbytes, [weakrefs]]
    names, sizes = _named(trainer, on)
    model = getattr(trainer, "model", None)
    mods = {id(m): n for n, m in model.named_modules()} if isinstance(model, torch.nn.Module) else {}
    local = _frame_locals(exc, mods)
    del model, mods
    mine = {k: v for k, v in stores.items() if k[0].startswith(on)}
    total = snap.cuda_allocated_bytes if on == "cuda" else sum(v[0] for v in mine.values())
    measured = dict(sizes, total=total)
    measured["the rest"] = max(0, total - sum(sizes.values()))
    cuda = {}
    if on == "cuda":
        cuda = {"allocated": snap.cuda_allocated_bytes, "reserved": snap.cuda_reserved_bytes,
                "fragmentation": snap.cuda_reserved_bytes - snap.cuda_allocated_bytes,
                "peak_allocated": snap.cuda_peak_allocated_bytes}
        m = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", str(exc))
        if m:
            cuda["tried"] = m[1]
    lines, unnamed = [], []
    for key, (nbytes, refs) in sorted(mine.items(), key=lambda item: -item[1][0])[:top]:
        ts = [t for t in (w() for w in refs) if t is not None]
        if not ts:
            continue
        t = max(ts, key=lambda tensor: tensor.numel())
        desc = f"{fmt_bytes(nbytes):>11}  {str(t.dtype).replace('torch.', '')}{list(t.shape)}"
        who = names.get(key[1], (None, None))[1] or local.get(key[1])
        if who is None and len(unnamed) < holders:
            unnamed.append((len(lines), [weakref.ref(x) for x in ts]))
        lines.append(f"{desc}  {who or ''}")
        del t, ts
    if unnamed:
        groups = [[x for x in (w() for w in refs) if x is not None] for _, refs in unnamed]
        found = leaks._holders(groups, 8, 2, sys._getframe(1)) if all(groups) else []
        for (i, _), held in zip(unnamed, found):
            lines[i] += "held by: " + ("; ".join(held) if held else "no holder found through the garbage collector")
        del groups
    stores.clear()
    del stores, mine
    return measured, cuda, [ln.rstrip() for ln in lines]
