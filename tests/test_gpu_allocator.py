"""The allocator model (kit.estimate.allocator) against the real CUDA caching allocator, on a GPU.

A fixed script of ``torch.empty(n, dtype=torch.uint8, device="cuda")`` and ``del`` runs in a fresh process per
mode (so ``PYTORCH_CUDA_ALLOC_CONF`` is read when CUDA initialises), printing ``memory_reserved()``,
``memory_allocated()``, ``max_memory_reserved()`` and ``max_memory_allocated()`` after every event; each must
equal the model's figure for the events so far, exactly: both sides count the bytes of the allocator's blocks and
segments, the process allocates nothing else through it, ``torch.empty(n, uint8)`` asks for n bytes, and a fresh
process starts at 0. A GPU must confirm, among the rest (MiB):

- basics: 1000 B and 300 KiB share one 2 MiB small segment; two 5 MiB share one 20 MiB segment (reserved 22);
  11 MiB adds a 12 MiB segment counted whole, 12 allocated (reserved 34), or with expandable segments one more
  20 MiB page, 11 allocated (reserved 42); freed and asked for again, it reuses the cache. Peaks 34 and 42.
- growth (3 x (20 + 2k) MiB, k = 0..4, each freed): peak reserved 360 by default, 100 with expandable segments.
- the example of ezyang's devlog post on allocator fragmentation (2026-06-01,
  https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/): 8 x 16 MiB reserve 128 (default) and
  140 (expandable, 7 pages); after freeing them, 4 x 32 MiB take the default to 256, expandable stays at 140.
- pass-over (expandable): 12, 8, 15 MiB, free the 12, then 5 and 12 MiB: 60 reserved (48 by default).
- limit (default, ``set_per_process_memory_fraction`` = 64 MiB): 40 MiB freed, 50 MiB reserves 50 after one
  release-and-retry; a further 30 MiB is an OOM at event 3.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kit.estimate.allocator import MiB, simulate

pytestmark = pytest.mark.gpu

KiB = 1024

SCRIPT = r"""
import json, sys
import torch
events, limit_bytes = json.loads(sys.argv[1]), int(sys.argv[2])
torch.cuda.init()
if limit_bytes:
    torch.cuda.set_per_process_memory_fraction(limit_bytes / torch.cuda.get_device_properties(0).total_memory)
def reading():
    return [torch.cuda.memory_reserved(), torch.cuda.memory_allocated(),
            torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()]
live, rows, oom_at, start = {}, [], None, reading()
for i, event in enumerate(events):
    if event[0] == "alloc":
        try:
            live[event[1]] = torch.empty(event[2], dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            oom_at = i
            break
    elif event[0] == "free":
        del live[event[1]]
    else:
        torch.cuda.empty_cache()
    rows.append(reading())
expandable = sorted({bool(s.get("is_expandable", False)) for s in torch.cuda.memory_snapshot()})
print(json.dumps({"start": start, "rows": rows, "oom_at": oom_at, "expandable": expandable,
                  "torch": torch.__version__}))
"""


def part(name, *steps):
    """Events from ``(key, nbytes)`` (alloc) and ``key`` (free) steps, keys prefixed with the part's name."""
    return [("alloc", f"{name}.{s[0]}", s[1]) if isinstance(s, tuple) else ("free", f"{name}.{s}") for s in steps]


BASICS = part("b", ("a", 1000), ("b", 300 * KiB), ("c", 5 * MiB), ("d", 5 * MiB), ("e", 11 * MiB), "e",
              ("f", 11 * MiB), "b", "a", ("g", MiB), ("h", MiB), ("i", 10 * MiB), "c", "d", ("j", 8 * MiB),
              "f", "g", "h", "i", "j")
GROWTH = [e for k in range(5) for e in part(f"g{k}", *[(j, (20 + 2 * k) * MiB) for j in range(3)], 0, 1, 2)]
DEVLOG = part("v", *[(j, 16 * MiB) for j in range(8)], *range(8), *[(f"L{j}", 32 * MiB) for j in range(4)],
              *[f"L{j}" for j in range(4)])
PASS_OVER = part("p", ("x", 12 * MiB), ("y", 8 * MiB), ("z", 15 * MiB), "x", ("s", 5 * MiB), ("t", 12 * MiB))
EMPTY = [("empty_cache",)]
EVENTS = BASICS + EMPTY + GROWTH + EMPTY + DEVLOG + EMPTY + PASS_OVER
LIMIT_BYTES = 64 * MiB
LIMITED = part("l", ("x", 40 * MiB), "x", ("y", 50 * MiB), ("z", 30 * MiB), ("w", MiB))


def measure(events, expandable: bool, limit_bytes: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(events), str(limit_bytes)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def modelled(events, expandable: bool, limit_bytes: int | None = None) -> list[list[int]]:
    """The model's four readings after each event, from the run of the events so far."""
    out = []
    for k in range(1, len(events) + 1):
        run = simulate(events[:k], expandable=expandable, limit_bytes=limit_bytes)
        if run.oom_at is not None:
            break
        out.append([run.reserved_bytes, run.allocated_bytes, run.peak_reserved_bytes, run.peak_allocated_bytes])
    return out


def compare(events, got: dict, want: list[list[int]]) -> None:
    assert got["start"] == [0, 0, 0, 0], got["start"]
    wrong = [f"event {i} {events[i]}: measured {[n / MiB for n in g]} MiB, model {[n / MiB for n in w]} MiB"
             for i, (g, w) in enumerate(zip(got["rows"], want)) if g != w]
    assert not wrong, f"torch {got['torch']}:\n" + "\n".join(wrong[:10])
    assert len(got["rows"]) == len(want)


@pytest.mark.parametrize("expandable", [False, True], ids=["default", "expandable_segments"])
def test_every_reading_matches_the_model_after_every_event(expandable):
    got = measure(EVENTS, expandable)
    assert got["expandable"] == [expandable]                    # the setting took: the segments say so
    assert got["oom_at"] is None
    compare(EVENTS, got, modelled(EVENTS, expandable))
    growth_end = len(BASICS) + len(GROWTH)                      # the row of the last growth event
    devlog_8x16, devlog_4x32 = growth_end + 9, growth_end + 21
    assert EVENTS[devlog_8x16] == ("alloc", "v.7", 16 * MiB) and EVENTS[devlog_4x32] == ("alloc", "v.L3", 32 * MiB)
    rows = got["rows"]
    assert rows[len(BASICS) - 1][2] == (42 if expandable else 34) * MiB
    assert rows[growth_end][2] == (100 if expandable else 360) * MiB
    want_mib = (140, 140) if expandable else (128, 256)
    assert (rows[devlog_8x16][0], rows[devlog_4x32][0]) == (want_mib[0] * MiB, want_mib[1] * MiB)
    assert rows[-1][0] == (60 if expandable else 48) * MiB


def test_a_limit_releases_and_retries_then_ooms_where_the_model_says():
    got = measure(LIMITED, expandable=False, limit_bytes=LIMIT_BYTES)
    run = simulate(LIMITED, limit_bytes=LIMIT_BYTES)
    assert got["oom_at"] == run.oom_at == 3
    assert (run.peak_reserved_bytes, run.retries) == (50 * MiB, 2)   # y's retry succeeds, z's fails
    compare(LIMITED, got, modelled(LIMITED, expandable=False, limit_bytes=LIMIT_BYTES))
