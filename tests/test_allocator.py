"""The caching-allocator model (kit.estimate.allocator) on CPU: each rule read from CUDACachingAllocator.cpp, with
the byte figure that rule gives, default and ``expandable_segments:True`` side by side."""
from __future__ import annotations

import random
import time
from itertools import pairwise

import pytest

from kit.estimate import allocator
from kit.estimate.allocator import MiB, allocation_size, round_size, simulate

KiB = 1024


def allocs(*sizes, prefix="t"):
    return [("alloc", f"{prefix}{i}", n) for i, n in enumerate(sizes)]


def frees(count, prefix="t"):
    return [("free", f"{prefix}{i}") for i in range(count)]


def both(events, **kw):
    return simulate(events, **kw), simulate(events, expandable=True, **kw)


def growth(steps=5):
    """Three tensors of (20 + 2k) MiB per step, freed at its end: the batch that grows a little each time."""
    events = []
    for k in range(steps):
        events += allocs(*[(20 + 2 * k) * MiB] * 3, prefix=f"s{k}_") + frees(3, prefix=f"s{k}_")
    return events


def test_round_size_and_allocation_size_follow_the_source():
    assert [round_size(n) for n in (1, 511, 512, 513, 1000)] == [512, 512, 512, 1024, 1024]
    assert allocation_size(MiB) == 2 * MiB                      # the largest small request: a 2 MiB segment
    assert allocation_size(MiB + 512) == 20 * MiB               # 1 MiB < size < 10 MiB: 20 MiB
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB                # from 10 MiB: rounded up to 2 MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_a_small_request_is_rounded_to_512_and_reserves_a_2_mib_segment():
    d, e = both(allocs(1000, 1))
    for run in (d, e):                                          # expandable small pages are 2 MiB too
        assert run.peak_reserved_bytes == 2 * MiB
        assert run.peak_allocated_bytes == 1024 + 512
        assert run.segments == 1
    d, e = both(allocs(MiB, MiB, MiB))                          # two 1 MiB blocks fill a small segment
    assert d.reserved_bytes == e.reserved_bytes == 4 * MiB
    assert (d.segments, e.segments) == (2, 1)                   # two cudaMallocs; one mapped range of 2 pages


def test_5_mib_requests_share_one_20_mib_segment():
    run = simulate(allocs(5 * MiB, 5 * MiB))
    assert (run.reserved_bytes, run.allocated_bytes, run.segments) == (20 * MiB, 10 * MiB, 1)
    run = simulate(allocs(*[5 * MiB] * 5))                      # four fill it exactly; the fifth gets its own
    assert (run.reserved_bytes, run.allocated_bytes, run.segments) == (40 * MiB, 25 * MiB, 2)
    assert simulate(allocs(5 * MiB), expandable=True).reserved_bytes == 20 * MiB    # one 20 MiB page


def test_11_mib_reserves_12_mib_and_counts_whole_when_the_rest_is_too_small_to_split():
    d, e = both(allocs(11 * MiB))
    assert d.peak_reserved_bytes == 12 * MiB
    assert d.peak_allocated_bytes == 12 * MiB                   # 1 MiB left is not > 1 MiB: the block stays whole
    assert e.peak_reserved_bytes == 20 * MiB                    # one page; 9 MiB left >= 512 B is split off
    assert e.peak_allocated_bytes == 11 * MiB
    assert e.peak_reserved_bytes - d.peak_reserved_bytes == 8 * MiB     # expandable costs 8 MiB more here
    d, e = both(allocs(21 * MiB))
    assert (d.peak_reserved_bytes, d.peak_allocated_bytes) == (22 * MiB, 22 * MiB)
    assert (e.peak_reserved_bytes, e.peak_allocated_bytes) == (40 * MiB, 21 * MiB)


def test_freeing_and_reallocating_reuses_the_cached_block():
    run = simulate(allocs(11 * MiB) + frees(1) + allocs(11 * MiB))
    assert (run.peak_reserved_bytes, run.reserved_bytes, run.allocated_bytes) == (12 * MiB, 12 * MiB, 12 * MiB)
    run = simulate(allocs(11 * MiB) + frees(1) + allocs(10 * MiB))     # 2 MiB left > 1 MiB: split, 10 MiB counted
    assert (run.reserved_bytes, run.allocated_bytes, run.segments) == (12 * MiB, 10 * MiB, 1)
    assert simulate(allocs(11 * MiB) + frees(1)).allocated_bytes == 0


def test_a_freed_block_merges_with_its_free_neighbours():
    small = allocs(768 * KiB, 768 * KiB) + frees(2) + allocs(MiB, MiB, prefix="u")
    assert simulate(small).reserved_bytes == 2 * MiB            # unmerged holes (768, 768, 512 KiB) would need 4
    large = allocs(5 * MiB, 5 * MiB, 5 * MiB) + [("free", "t1"), ("free", "t0")] + allocs(10 * MiB, prefix="u")
    run = simulate(large)                                       # t0 + t1 merge into 10 MiB at the segment's start
    assert (run.reserved_bytes, run.segments) == (20 * MiB, 1)


def test_blocks_of_different_segments_never_merge():
    d, e = both(allocs(12 * MiB, 12 * MiB) + frees(2) + allocs(24 * MiB, prefix="u"))
    assert (d.reserved_bytes, d.segments) == (48 * MiB, 3)      # two free 12 MiB segments cannot serve 24 MiB
    assert (e.reserved_bytes, e.segments) == (40 * MiB, 1)      # one address range: 40 MiB mapped, merged
    assert d.reserved_bytes - e.reserved_bytes == 8 * MiB


def test_growing_requests_fragment_the_default_but_not_expandable_segments():
    d, e = both(growth())
    assert (d.peak_reserved_bytes, d.segments) == (360 * MiB, 15)       # 3 x (20+22+24+26+28) MiB, all cached
    assert (e.peak_reserved_bytes, e.segments) == (100 * MiB, 1)        # five 20 MiB pages, reused each step
    assert d.peak_reserved_bytes - e.peak_reserved_bytes == 260 * MiB
    assert d.peak_allocated_bytes == e.peak_allocated_bytes == 84 * MiB
    assert (d.gap_at_peak_bytes, e.gap_at_peak_bytes) == (276 * MiB, 16 * MiB)


def test_the_devlog_example_of_8x16_then_4x32_mib():
    """pytorch/devlogs 2026-06-01 (ezyang), "When does fragmentation occur in the CUDA caching allocator?",
    https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/."""
    first = allocs(*[16 * MiB] * 8)
    then = first + frees(8) + allocs(*[32 * MiB] * 4, prefix="u")
    d, e = both(first)
    assert (d.reserved_bytes, e.reserved_bytes) == (128 * MiB, 140 * MiB)   # 8 segments; 7 pages of 20 MiB
    d, e = both(then)
    assert (d.reserved_bytes, e.reserved_bytes) == (256 * MiB, 140 * MiB)   # no new page for 4 x 32 MiB


def test_expandable_passes_over_a_free_block_bordering_unmapped_space():
    # x [0,12) y [12,20) z [20,35) free [35,40); x freed: free [0,12) and [35,40) (which borders the tail).
    events = allocs(12 * MiB, 8 * MiB, 15 * MiB) + [("free", "t0")] + allocs(5 * MiB, 12 * MiB, prefix="u")
    run = simulate(events, expandable=True)
    assert run.reserved_bytes == 60 * MiB   # 5 MiB went to [0,12), so 12 MiB maps a page; best fit alone: 40 MiB
    assert run.allocated_bytes == 40 * MiB


def test_a_limit_releases_the_cache_and_retries():
    events = allocs(40 * MiB) + frees(1) + allocs(50 * MiB, prefix="u")
    assert simulate(events).peak_reserved_bytes == 90 * MiB     # no limit: the cached 40 MiB stays
    run = simulate(events, limit_bytes=64 * MiB)                # 40 + 50 > 64: cudaFree the free 40, retry
    assert (run.peak_reserved_bytes, run.reserved_bytes, run.retries, run.oom_at) == (50 * MiB, 50 * MiB, 1, None)
    run = simulate(events, expandable=True, limit_bytes=64 * MiB)   # the free 40 MiB grows by one page instead
    assert (run.peak_reserved_bytes, run.allocated_bytes, run.retries) == (60 * MiB, 50 * MiB, 0)
    d, e = both(growth(), limit_bytes=128 * MiB)
    assert (d.peak_reserved_bytes, d.retries, d.oom_at) == (126 * MiB, 3, None)
    assert (e.peak_reserved_bytes, e.retries, e.oom_at) == (100 * MiB, 0, None)


def test_expandable_release_unmaps_only_whole_free_pages():
    # x [0,20) y [20,50) z [50,55) free [55,60); y freed. w 60 MiB needs 3 more pages: 60 + 60 > 100 MiB.
    events = allocs(20 * MiB, 30 * MiB, 5 * MiB) + [("free", "t1")] + allocs(60 * MiB, prefix="u")
    e = simulate(events, expandable=True, limit_bytes=100 * MiB)
    # The release unmaps [20,40) only (page 2 is shared with [40,50) free and z); w then maps [60,120).
    assert (e.peak_reserved_bytes, e.reserved_bytes, e.allocated_bytes) == (100 * MiB, 100 * MiB, 85 * MiB)
    assert (e.retries, e.segments) == (1, 2)                    # mapped ranges [0,20) and [40,120)
    d = simulate(events, limit_bytes=100 * MiB)                 # cudaFree of y's 30 MiB segment, then 60 MiB
    assert (d.peak_reserved_bytes, d.allocated_bytes, d.retries, d.segments) == (100 * MiB, 85 * MiB, 1, 3)


def test_an_oom_is_reported_at_its_event_and_stops_the_replay():
    events = allocs(40 * MiB, 30 * MiB, 1)
    for run in both(events, limit_bytes=64 * MiB):
        assert run.oom_at == 1                                  # 40 + 30 (or 40 + 40 in pages) > 64 MiB
        assert (run.reserved_bytes, run.allocated_bytes, run.retries) == (40 * MiB, 40 * MiB, 1)


def test_empty_cache_returns_every_free_segment():
    events = allocs(5 * MiB, 30 * MiB, 1000) + [("free", "t1"), ("empty_cache",)]
    d, e = both(events)
    assert (d.reserved_bytes, d.peak_reserved_bytes) == (22 * MiB, 52 * MiB)   # the 30 MiB segment goes
    assert (e.reserved_bytes, e.peak_reserved_bytes) == (22 * MiB, 42 * MiB)   # page [20,40) is unmapped
    d, e = both(events + [("free", "t0"), ("free", "t2"), ("empty_cache",)])
    assert d.reserved_bytes == e.reserved_bytes == 0


def test_zero_bytes_never_reach_the_allocator_and_bad_events_are_refused():
    run = simulate([("alloc", "z", 0), ("free", "z")])
    assert (run.peak_reserved_bytes, run.peak_allocated_bytes) == (0, 0)
    for events in ([("alloc", "a", 1), ("alloc", "a", 1)], [("free", "a")], [("alloc", "a", -1)], [("grow", 1)]):
        with pytest.raises(ValueError):
            simulate(events)


def random_events(n, seed=0, max_live=2000):
    rng, events, live, k = random.Random(seed), [], [], 0
    while len(events) < n:
        if live and (rng.random() < 0.5 or len(live) > max_live):
            j = rng.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            events.append(("free", live.pop()))
        else:
            top = rng.choice([4 * KiB, MiB, 12 * MiB, 200 * MiB])
            events.append(("alloc", k, rng.randrange(1, top)))
            live.append(k)
            k += 1
    return events


def walk(a, live):
    """Every block of every segment (as ``BlockView``s), from the live blocks and the free lists, each segment's
    list head first."""
    heads = set()
    for b in list(live.values()) + [t[-1] for p in a.pools.values() for t in p.blocks + p.unmapped]:
        while a.prev[b] != allocator.NONE:
            b = a.prev[b]
        heads.add(b)
    out = []
    for b in heads:
        seg = []
        while b != allocator.NONE:
            seg.append(a.view(b))
            b = a.next[b]
        out.append(seg)
    return out


@pytest.mark.parametrize("expandable", [False, True])
def test_the_books_balance_on_a_random_workload(expandable):
    """Blocks tile their segment, free neighbours are merged, the free lists hold exactly the free blocks in
    order, and reserved, allocated and the segment count equal what the blocks add up to."""
    limit_bytes = 1024 * MiB                                    # tight enough for OOMs and release-and-retry
    a = allocator._Allocator(expandable, limit_bytes)
    live, failed = {}, set()
    for i, (op, key, *n) in enumerate(random_events(6000, seed=1, max_live=300)):
        if op == "alloc":
            block = a.malloc(n[0])
            if block is None:
                failed.add(key)
            else:
                live[key] = block
        elif key not in failed:
            a.free(live.pop(key))
        if i % 500 == 0:
            a.release_cached_blocks()
        segs = walk(a, live)
        for seg in segs:
            assert seg[0].off == 0 and all(x.off + x.size == y.off for x, y in pairwise(seg))
            assert not any(x.mapped == y.mapped and not x.allocated and not y.allocated for x, y in pairwise(seg))
        blocks = [b for seg in segs for b in seg]
        listed = sorted(t[:3] for p in a.pools.values() for t in p.blocks)
        assert sorted((b.size, b.seg.seq, b.off) for b in blocks if not b.allocated and b.mapped) == listed
        assert sorted((b.seg.seq, b.off) for b in blocks if not b.mapped) == sorted(
            t[:2] for p in a.pools.values() for t in p.unmapped)
        for p in a.pools.values():
            assert p.blocks == sorted(p.blocks, key=lambda t: t[:3]) and all(a.view(t[-1]).seg.small == p.small
                                                                             for t in p.blocks + p.unmapped)
        assert a.allocated == sum(a.size[b] for b in live.values())
        assert a.reserved == sum(b.size for seg in segs for b in seg if b.mapped) <= limit_bytes
        ranges = sum(1 for seg in segs for j, b in enumerate(seg) if b.mapped and (j == 0 or not seg[j - 1].mapped))
        assert a.segments == ranges
    assert failed and a.retries > len(failed)                   # some OOMs, and retries that saved the request


def test_200k_events_replay_in_well_under_2_seconds():
    events = random_events(200_000)
    for expandable in (False, True):
        t0 = time.perf_counter()
        run = simulate(events, expandable=expandable)
        elapsed = time.perf_counter() - t0
        assert run.oom_at is None and run.allocated_bytes > 0
        assert elapsed < 2.0, f"{elapsed:.2f} s for 200,000 events (expandable={expandable})"


@pytest.mark.parametrize("expandable", [False, True])
def test_freeing_blocks_at_once_leaves_what_freeing_them_one_by_one_leaves(expandable):
    """``free_all`` (the reserved layout frees a block's saved tensors so) against ``free`` one at a time: the same
    free blocks (size, segment, offset), the same allocated and reserved bytes, after every batch and at the end."""
    rng = random.Random(3)
    one, many = allocator._Allocator(expandable, None), allocator._Allocator(expandable, None)
    live_one, live_many = {}, {}
    for key in range(4000):
        if live_one and rng.random() < 0.2:
            batch = rng.sample(sorted(live_one), min(len(live_one), rng.randrange(1, 40)))
            for k in batch:
                one.free(live_one.pop(k))
            many.free_all([live_many.pop(k) for k in batch])
            for a, b in ((one, many),):
                assert sorted(t[:3] for p in a.pools.values() for t in p.blocks) == sorted(
                    t[:3] for p in b.pools.values() for t in p.blocks)
                assert (a.allocated, a.reserved) == (b.allocated, b.reserved)
        else:
            n = rng.randrange(1, rng.choice([4 * KiB, MiB, 12 * MiB, 200 * MiB]))
            live_one[key], live_many[key] = one.malloc(n), many.malloc(n)
    assert one.run(None) == many.run(None)


@pytest.mark.parametrize("expandable", [False, True])
def test_a_temporary_made_and_freed_at_once_leaves_what_malloc_then_free_leaves(expandable):
    """``malloc_free`` (the reserved layout's temporaries) against ``malloc`` and ``free``: the same free blocks,
    reserved bytes and allocated peak, on a random workload."""
    rng = random.Random(5)
    apart, together = allocator._Allocator(expandable, None), allocator._Allocator(expandable, None)
    live_apart, live_together = {}, {}
    for key in range(4000):
        n = rng.randrange(1, rng.choice([4 * KiB, MiB, 12 * MiB, 200 * MiB]))
        roll = rng.random()
        if roll < 0.3:
            apart.free(apart.malloc(n))
            together.malloc_free(n)
        elif roll < 0.5 and live_apart:
            k = rng.choice(sorted(live_apart))
            apart.free(live_apart.pop(k))
            together.free(live_together.pop(k))
        else:
            live_apart[key], live_together[key] = apart.malloc(n), together.malloc(n)
        assert sorted(t[:3] for p in apart.pools.values() for t in p.blocks) == sorted(
            t[:3] for p in together.pools.values() for t in p.blocks)
        assert (apart.allocated, apart.reserved, apart.peak_allocated) == (
            together.allocated, together.reserved, together.peak_allocated)
    assert apart.run(None) == together.run(None)


def assert_same_state(first, second, besides=("pools",)):
    """Two allocators in the same state: the same fields (``besides`` not compared), so the same blocks by index and
    field and the same counters, and the same free lists, entry by entry."""
    assert vars(first).keys() == vars(second).keys()
    assert {k: v for k, v in vars(first).items() if k not in besides} == {
        k: v for k, v in vars(second).items() if k not in besides}
    assert [(p.blocks, p.unmapped) for p in first.pools.values()] == [
        (p.blocks, p.unmapped) for p in second.pools.values()]


class _MapsRunsOnly(allocator._Allocator):
    """The allocator with expandable segments' general path only: no ``_map_after`` shortcut."""

    def _map_after(self, pool, free, unmapped, size):
        return self._map_run(pool, free, size)


def test_a_growing_tail_mapped_at_once_leaves_what_the_general_path_leaves():
    """``_map_after`` (a free block and the unmapped one after it, mapped in one go) against ``_map_run``: the same
    blocks, by index and field, the same free lists and counters, after every event of a random workload with a
    limit (failed maps, release and retry) and ``empty_cache``."""
    fast, general = allocator._Allocator(True, 1024 * MiB), _MapsRunsOnly(True, 1024 * MiB)
    live, failed = {}, set()
    for i, (op, key, *n) in enumerate(random_events(6000, seed=7, max_live=300)):
        if op == "alloc":
            block = fast.malloc(n[0])
            assert general.malloc(n[0]) == block
            if block is None:
                failed.add(key)
            else:
                live[key] = block
        elif key not in failed:
            block = live.pop(key)
            fast.free(block)
            general.free(block)
        if i % 700 == 0:
            fast.release_cached_blocks()
            general.release_cached_blocks()
        assert_same_state(fast, general)
    assert fast.run(None) == general.run(None)


def test_a_new_segment_taken_at_once_leaves_what_the_general_path_leaves():
    """``_take_new_segment`` (no limit, no expandable segments: the reserved layout's replays) against the general
    path (taken under a limit never reached): the same blocks, by index and field, the same free lists and
    counters, after every event of a random workload with ``empty_cache``."""
    fast, general = allocator._Allocator(False, None), allocator._Allocator(False, 1 << 62)
    live = {}
    for i, (op, key, *n) in enumerate(random_events(6000, seed=11, max_live=300)):
        if op == "alloc":
            live[key] = fast.malloc(n[0])
            assert general.malloc(n[0]) == live[key]
        else:
            block = live.pop(key)
            fast.free(block)
            general.free(block)
        if i % 700 == 0:
            fast.release_cached_blocks()
            general.release_cached_blocks()
        assert_same_state(fast, general, besides=("pools", "limit"))
    assert fast.run(None) == general.run(None)


@pytest.mark.parametrize("expandable", [False, True])
def test_a_run_of_requests_at_once_leaves_what_malloc_one_by_one_leaves(expandable):
    """``malloc_all`` (a block's saved tensors, the weights, the grads: the reserved layout's runs, rounded) against
    ``malloc`` one request at a time: the same blocks, by index and field, the same free lists and counters, the
    same peaks and the state at the reserved peak, after every run and every free of a random workload."""
    one, run = allocator._Allocator(expandable, None), allocator._Allocator(expandable, None)
    live, pending = {}, []

    def flush():
        blocks = run.malloc_all([allocator.round_size(n) for _, n in pending])
        assert blocks == [one.malloc(n) for _, n in pending]
        live.update((key, block) for (key, _), block in zip(pending, blocks))
        pending.clear()
        assert_same_state(one, run)

    for op, key, *n in random_events(6000, seed=13, max_live=300):
        if op == "alloc":
            pending.append((key, n[0]))
            continue
        if pending:
            flush()
        if key in live:
            block = live.pop(key)
            one.free(block)
            run.free(block)
    if pending:
        flush()
    assert one.run(None) == run.run(None)
