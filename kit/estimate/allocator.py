"""PyTorch's CUDA caching allocator, replayed in pure Python: what ``max_memory_reserved()`` will read.

Allocations and frees go in as events; out come the peaks ``torch.cuda`` reports as ``max_memory_allocated()``
and ``max_memory_reserved()``, with or without ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Each rule
was read from ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``, ``ExpandableSegment``), its
constants from ``c10/core/AllocatorConfig.h`` (``kMinBlockSize`` ... ``kRoundLarge``, and
``AcceleratorAllocatorConfig::large_segment_size()``, 20 MiB by default, formerly the constant ``kLargeBuffer``):
pytorch's main of mid 2026 (read in a fork that tracks it, https://github.com/cyyever/pytorch), checked against
the torch 2.13 headers here and pytorch/pytorch's older allocator. Under the
default settings the rules are the same in torch 2.11 to 2.13:

- ``round_size()``: a request becomes a multiple of 512 B, at least 512 B (``roundup_power2_divisions`` off).
- ``get_pool()``: rounded sizes up to 1 MiB go to the small pool, larger ones to the large pool.
- ``get_allocation_size()``: a new segment is 2 MiB for the small pool, 20 MiB for requests under 10 MiB,
  else the request rounded up to 2 MiB.
- ``get_free_block()``: best fit, the first free block at least the request in ``BlockPool::blocks`` order
  (size, then address); ``max_split_size`` is unlimited by default, so no block is "oversize".
- ``should_split()``: the remainder is split off if at least 512 B (small pool, or any pool with expandable
  segments), else only if over 1 MiB; an unsplit block counts whole in ``allocated_bytes``.
- ``free_block()`` / ``try_merge_blocks()``: a freed block merges with the free neighbours of its own segment.
- ``malloc()``: when no cached block fits and ``alloc_block()`` cannot get a new segment,
  ``release_available_cached_blocks()`` does nothing (unlimited ``max_split_size``), ``release_cached_blocks()``
  frees every wholly free segment and ``alloc_block()`` is tried once more; failing that, OOM.
- Expandable segments (``find_expandable_block()``, ``map_block()``, ``try_allocate_expandable_block()``,
  ``unmap_block()``, ``release_blocks()``, ``ExpandableSegment::map()``/``unmap()``): one segment per pool (the
  small pool too) reserves address space and maps pages of 2 MiB (small pool) or 20 MiB (large) on demand. A
  request no free block fits extends the lowest free-and-unmapped run, normally the free block at the end of the
  mapped part, by mapping the pages it lacks; reserved counts mapped pages. ``get_free_block()`` passes over a
  free block bordering unmapped space when the next one fits. Release unmaps only the pages wholly inside free
  blocks; a segment left with none is destroyed.

Across versions only the tie between equal-size free blocks moved: by address in torch 2.11, by an allocation
counter after pytorch PR #178362 (March 2026), by segment creation then address since PR #183591 (May 2026).
The last is modelled; a fresh process's cudaMalloc returning rising addresses makes it 2.11's order too.
``allocate(0)`` never reaches the allocator. Not modelled: several
streams and ``record_stream``, CUDA graph pools, ``max_split_size_mb``, ``roundup_power2_divisions``, garbage
collection, ``per_process_memory_fraction``, and the CUDA context's own memory (``limit_bytes`` excludes it).
"""
from __future__ import annotations

import bisect
import gc
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import dataclass

MiB = 1 << 20
MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_SIZE_BYTES = MiB  # kSmallSize: the largest small-pool request
SMALL_BUFFER_BYTES = 2 * MiB  # kSmallBuffer: a small-pool segment, and an expandable small-pool page
LARGE_BUFFER_BYTES = 20 * MiB  # large_segment_size(): a segment for 1-10 MiB requests, an expandable large page
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 * MiB  # kRoundLarge
VA_BYTES = 1 << 60  # an expandable segment's address space (9/8 of the GPU's memory there): unbounded here


def round_size(nbytes: int) -> int:
    """``round_size()``: the bytes a request occupies. ``round_size(1) == 512``, ``round_size(1000) == 1024``."""
    return MIN_BLOCK_BYTES * max(1, -(-nbytes // MIN_BLOCK_BYTES))


def allocation_size(size_bytes: int) -> int:
    """``get_allocation_size()``: the segment a rounded request that fits no cached block makes cudaMalloc."""
    if size_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return ROUND_LARGE_BYTES * -(-size_bytes // ROUND_LARGE_BYTES)


@dataclass(frozen=True)
class AllocatorRun:
    """What the caching allocator's stats read after the events (``torch.cuda.memory_stats()``' names).

    ``peak_allocated_bytes`` counts blocks as handed out (rounded, and whole when not split), as
    ``max_memory_allocated()`` does. ``segments`` is the count at the peak of reserved: cudaMalloc'd segments,
    or with expandable segments the contiguous mapped ranges (as ``memory_snapshot()`` lists them).
    ``gap_at_peak_bytes`` is reserved minus allocated right after the event that set the reserved peak: what
    the cache held beyond live blocks then. ``retries`` counts the release-and-retry passes
    (``num_alloc_retries``). After an OOM (``oom_at``, the event's index) no later event is replayed.
    """

    peak_reserved_bytes: int
    peak_allocated_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    segments: int
    expandable: bool
    oom_at: int | None = None
    gap_at_peak_bytes: int = 0
    retries: int = 0


_Segment = namedtuple("_Segment", "seq small page_bytes")  # seq: creation order; page_bytes: expandable only
NONE = -1   # no neighbour: the segment's end
BlockView = namedtuple("BlockView", "seg off size mapped allocated prev next")   # one block, read (tests, debugging)


class _Pool:
    """``BlockPool``: free blocks by (size, segment, offset); unmapped ones by (segment, offset). Entries end with
    the block's index."""

    def __init__(self, small: bool):
        self.small = small
        self.blocks: list = []
        self.unmapped: list = []


class _Allocator:
    """The allocator's state. Blocks are indices into parallel lists (segment, offset, size, mapped, allocated, and
    the previous and next block of the segment, ``NONE`` at its ends), not objects linked both ways: a replay makes
    no reference cycles for Python's cycle collector to walk. A segment is its number; its pool and page size are
    listed by that number."""

    def __init__(self, expandable: bool, limit_bytes: int | None):
        self.expandable, self.limit = expandable, limit_bytes
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.reserved = self.allocated = self.peak_reserved = self.peak_allocated = 0
        self.segments = self.seq = self.retries = 0
        self.at_peak = (0, 0)  # (segments, reserved - allocated) when the reserved peak was set
        self.fresh_peak = False
        self.seg, self.off, self.size, self.mapped, self.used, self.prev, self.next = [], [], [], [], [], [], []
        self.seg_small, self.seg_page = [None], [0]   # per segment, by its number (from 1): pool, page size

    def _segment(self, small: bool, page_bytes: int) -> int:
        """A new segment's number (``seq``: creation order, which breaks ties between equal free blocks)."""
        self.seq += 1
        self.seg_small.append(small)
        self.seg_page.append(page_bytes)
        return self.seq

    def view(self, block: int) -> BlockView:
        """Block ``block``'s fields."""
        seq = self.seg[block]
        return BlockView(_Segment(seq, self.seg_small[seq], self.seg_page[seq]), self.off[block], self.size[block],
                         self.mapped[block], self.used[block], self.prev[block], self.next[block])

    def _new(self, seg: int, off: int, size: int, mapped: bool = True) -> int:
        self.seg.append(seg)
        self.off.append(off)
        self.size.append(size)
        self.mapped.append(mapped)
        self.used.append(False)
        self.prev.append(NONE)
        self.next.append(NONE)
        return len(self.off) - 1

    def _link(self, first: int, second: int) -> None:
        """Make ``first`` and ``second`` neighbours in their segment (``Block::splice()``); either may be ``NONE``."""
        if first != NONE:
            self.next[first] = second
        if second != NONE:
            self.prev[second] = first

    def _add(self, pool: _Pool, block: int) -> None:  # insert_into_blocks(), or unmapped.insert()
        if self.mapped[block]:
            bisect.insort(pool.blocks, (self.size[block], self.seg[block], self.off[block], block))
        else:
            bisect.insort(pool.unmapped, (self.seg[block], self.off[block], block))

    def _drop(self, pool: _Pool, block: int) -> None:  # erase_from_blocks(), or unmapped.erase()
        if self.mapped[block]:
            del pool.blocks[bisect.bisect_left(pool.blocks, (self.size[block], self.seg[block], self.off[block]))]
        else:
            del pool.unmapped[bisect.bisect_left(pool.unmapped, (self.seg[block], self.off[block]))]

    def _grow(self, nbytes: int) -> None:  # reserved_bytes.increase()
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved, self.fresh_peak = self.reserved, True
            self.at_peak = (self.segments, self.reserved - self.allocated)

    def malloc(self, nbytes: int) -> int | None:  # DeviceCachingAllocator::malloc(): a block's index, or None
        # (the hot path of a replay: the helpers' steps written out in place, with the lists as locals)
        size = (nbytes + MIN_BLOCK_BYTES - 1) // MIN_BLOCK_BYTES * MIN_BLOCK_BYTES or MIN_BLOCK_BYTES  # round_size()
        small = size <= SMALL_SIZE_BYTES
        pool = self.pools[small]  # get_pool()
        blocks = pool.blocks
        i = bisect.bisect_left(blocks, (size,))
        if i == len(blocks) and self.limit is None and not self.expandable:   # no cached block fits
            return self._take_new_segment(blocks, small, size)
        if i < len(blocks) and not self.expandable:   # get_free_block(): best fit
            block = blocks.pop(i)[3]
        else:
            block = self._get_free_block(pool, size, i) if i < len(blocks) else None
            if block is None:
                block = self._alloc_block(pool, size)
                if block is None:  # release_available_cached_blocks() is a no-op at the default max_split_size
                    self.release_cached_blocks()
                    self.retries += 1
                    block = self._alloc_block(pool, size)
                    if block is None:
                        return None
        sizes = self.size
        remaining = sizes[block] - size  # should_split()
        if (remaining >= MIN_BLOCK_BYTES) if small or self.expandable else (remaining > SMALL_SIZE_BYTES):
            seg, off, after = self.seg[block], self.off[block] + size, self.next[block]   # alloc_found_block():
            rest = len(sizes)                                                             # the tail, free
            self.seg.append(seg)
            self.off.append(off)
            sizes.append(remaining)
            self.mapped.append(True)
            self.used.append(False)
            self.prev.append(block)
            self.next.append(after)
            if after != NONE:
                self.prev[after] = rest
            self.next[block] = rest
            sizes[block] = size
            bisect.insort(blocks, (remaining, seg, off, rest))
        self.used[block] = True
        self.allocated += sizes[block]
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        if self.fresh_peak:   # the reserved peak this request set: what the cache held beyond live blocks then
            if self.reserved == self.peak_reserved:
                self.at_peak = (self.segments, self.reserved - self.allocated)
            self.fresh_peak = False
        return block

    def _take_new_segment(self, blocks: list, small: bool, size: int) -> int:
        """:meth:`malloc`'s steps where no cached block fits and nothing limits cudaMalloc, without expandable
        segments: ``alloc_block()`` makes a segment, ``alloc_found_block()`` takes its head and leaves its tail (if
        split off) free. The same blocks, by index and field, and the same stats, in one step: as each weight and
        optimizer state of a large model is allocated."""
        seg_bytes = allocation_size(size)
        self.segments += 1
        seg = self._segment(small, seg_bytes)
        remaining = seg_bytes - size   # should_split()
        split = (remaining >= MIN_BLOCK_BYTES) if small else (remaining > SMALL_SIZE_BYTES)
        held = size if split else seg_bytes
        block = len(self.off)
        if split:   # the head, taken, and the tail, free
            self.seg += (seg, seg)
            self.off += (0, size)
            self.size += (held, remaining)
            self.mapped += (True, True)
            self.used += (True, False)
            self.prev += (NONE, block)
            self.next += (block + 1, NONE)
            bisect.insort(blocks, (remaining, seg, size, block + 1))
        else:
            self.seg.append(seg)
            self.off.append(0)
            self.size.append(held)
            self.mapped.append(True)
            self.used.append(True)
            self.prev.append(NONE)
            self.next.append(NONE)
        self.reserved += seg_bytes
        self.allocated += held
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.at_peak = (self.segments, self.reserved - self.allocated)
        return block

    def _get_free_block(self, pool: _Pool, size: int, first: int) -> int | None:  # get_free_block()
        i = self._best_fit(pool, size, first)
        return None if i is None else pool.blocks.pop(i)[3]

    def _best_fit(self, pool: _Pool, size: int, first: int | None = None) -> int | None:
        """Where in ``pool.blocks`` the block :meth:`_get_free_block` takes is, or None. ``first``: the first
        entry of at least ``size``, where the caller has looked it up already."""
        blocks = pool.blocks
        i = bisect.bisect_left(blocks, (size,)) if first is None else first
        if i == len(blocks):
            return None
        if self.expandable:  # best fit by the size a block can grow to: pass over one bordering unmapped space
            sizes, nexts, mapped, last = self.size, self.next, self.mapped, len(blocks) - 1
            after = nexts[blocks[i][3]]
            grows = blocks[i][0] + (sizes[after] if after != NONE and not mapped[after] else 0)
            while i < last and blocks[i + 1][0] < grows:   # (a block at least ``grows`` grows to no less)
                after = nexts[blocks[i + 1][3]]
                grows_next = blocks[i + 1][0] + (sizes[after] if after != NONE and not mapped[after] else 0)
                if grows_next >= grows:
                    break
                i, grows = i + 1, grows_next
        return i

    def malloc_free(self, nbytes: int) -> None:
        """:meth:`malloc`, then :meth:`free` of that block, at once. Where a cached block serves the request the
        cache is left as it was (no free block borders another, so its split-off rest merges back and nothing
        else): only the allocated peak moves. Else a segment is made, as :meth:`malloc` makes it."""
        size = (nbytes + MIN_BLOCK_BYTES - 1) // MIN_BLOCK_BYTES * MIN_BLOCK_BYTES or MIN_BLOCK_BYTES
        small = size <= SMALL_SIZE_BYTES
        pool = self.pools[small]
        i = self._best_fit(pool, size)
        if i is None:
            block = self.malloc(nbytes)
            if block is not None:
                self.free(block)
            return
        remaining = pool.blocks[i][0] - size   # should_split(): a block not split counts whole
        held = size if ((remaining >= MIN_BLOCK_BYTES) if small or self.expandable else
                        (remaining > SMALL_SIZE_BYTES)) else pool.blocks[i][0]
        self.peak_allocated = max(self.peak_allocated, self.allocated + held)

    def malloc_all(self, sizes) -> list:
        """:meth:`malloc` of each of ``sizes`` (requests as :func:`round_size` gives them), in order: their blocks.
        The same blocks, fields and stats as one by one (under a limit, where a request may fail, it is
        :meth:`malloc` one by one). :meth:`malloc`'s steps are written out here once for the run, with the lists
        and counters as locals: a replay's forward asks for thousands of saved tensors in a row, and Python's cost
        per request is mostly its lookups."""
        if self.limit is not None:   # a request may fail, and the cache be released: one by one
            return [self.malloc(size) for size in sizes]
        expandable, best_fit, pools = self.expandable, self._best_fit, self.pools
        segs, offs, lengths, mapped, used, prevs, nexts = (self.seg, self.off, self.size, self.mapped, self.used,
                                                           self.prev, self.next)
        small_blocks, large_blocks = pools[True].blocks, pools[False].blocks
        allocated, peak = self.allocated, self.peak_allocated
        bisect_left, insort, out = bisect.bisect_left, bisect.insort, []
        add_seg, add_off, add_length, add_mapped, add_used, add_prev, add_next = (
            segs.append, offs.append, lengths.append, mapped.append, used.append, prevs.append, nexts.append)
        small_max, min_block, none = SMALL_SIZE_BYTES, MIN_BLOCK_BYTES, NONE
        for size in sizes:
            small = size <= small_max
            blocks = small_blocks if small else large_blocks   # get_pool()
            i = bisect_left(blocks, (size,))
            if i < len(blocks):
                if expandable:   # get_free_block(): the first fit, unless it borders unmapped space (_best_fit)
                    after = nexts[blocks[i][3]]
                    if after != none and not mapped[after]:
                        i = best_fit(pools[small], size, i)
                block = blocks.pop(i)[3]
            elif expandable:   # alloc_block(): pages mapped (no limit: it cannot fail), then split as a cached block
                self.allocated = allocated
                block = self._try_allocate_expandable_block(pools[small], size)
            else:   # a new segment, its tail split off
                self.allocated, self.peak_allocated = allocated, peak
                out.append(self._take_new_segment(blocks, small, size))
                allocated, peak = self.allocated, self.peak_allocated
                continue
            remaining = lengths[block] - size   # should_split()
            if (remaining >= min_block) if small or expandable else (remaining > small_max):
                seg, off, after = segs[block], offs[block] + size, nexts[block]   # alloc_found_block(): the
                rest = len(lengths)                                               # tail, free
                add_seg(seg)
                add_off(off)
                add_length(remaining)
                add_mapped(True)
                add_used(False)
                add_prev(block)
                add_next(after)
                if after != none:
                    prevs[after] = rest
                nexts[block] = rest
                lengths[block] = size
                insort(blocks, (remaining, seg, off, rest))
                allocated += size
            else:
                allocated += lengths[block]
            used[block] = True
            if allocated > peak:
                peak = allocated
            if expandable and self.fresh_peak:   # the reserved peak the pages set: the cache beyond live blocks
                if self.reserved == self.peak_reserved:
                    self.at_peak = (self.segments, self.reserved - allocated)
                self.fresh_peak = False
            out.append(block)
        self.allocated, self.peak_allocated = allocated, peak
        return out

    def _alloc_block(self, pool: _Pool, size: int) -> int | None:  # alloc_block()
        if self.expandable:
            return self._try_allocate_expandable_block(pool, size)
        nbytes = allocation_size(size)
        if self.limit is not None and self.reserved + nbytes > self.limit:  # cudaMalloc fails
            return None
        self.segments += 1
        self._grow(nbytes)
        return self._new(self._segment(pool.small, nbytes), 0, nbytes)

    def _merge(self, pool: _Pool, dst: int, src: int) -> None:  # try_merge_blocks()
        if src == NONE or self.used[src] or self.mapped[src] != self.mapped[dst]:
            return
        if src == self.prev[dst]:
            self.off[dst] = self.off[src]
            self._link(self.prev[src], dst)
        else:
            self._link(dst, self.next[src])
        self.size[dst] += self.size[src]
        self._drop(pool, src)

    def free(self, block: int) -> None:  # free() -> free_block(): the block merges with its free neighbours
        used, sizes, offs, prevs, nexts = self.used, self.size, self.off, self.prev, self.next
        used[block] = False
        self.allocated -= sizes[block]
        seg = self.seg[block]
        blocks = self.pools[self.seg_small[seg]].blocks
        before = prevs[block]   # (a live block is mapped: only a mapped neighbour merges with it)
        if before != NONE and not used[before] and self.mapped[before]:   # try_merge_blocks()
            del blocks[bisect.bisect_left(blocks, (sizes[before], seg, offs[before]))]
            offs[block] = offs[before]
            sizes[block] += sizes[before]
            before = prevs[block] = prevs[before]
            if before != NONE:
                nexts[before] = block
        after = nexts[block]
        if after != NONE and not used[after] and self.mapped[after]:
            del blocks[bisect.bisect_left(blocks, (sizes[after], seg, offs[after]))]
            sizes[block] += sizes[after]
            after = nexts[block] = nexts[after]
            if after != NONE:
                prevs[after] = block
        bisect.insort(blocks, (sizes[block], seg, offs[block], block))

    def free_all(self, blocks) -> None:
        """:meth:`free` of each of ``blocks``, at once: freed blocks merge into runs, as in any order, and each run
        enters the free list once. (Frees raise no peak, and the free blocks they leave are the same in any order.)
        While it runs, a block of ``blocks`` not yet merged is marked ``None`` in ``used`` (falsy, as free)."""
        used, sizes, offs, prevs, nexts, mapped = self.used, self.size, self.off, self.prev, self.next, self.mapped
        segs, seg_small = self.seg, self.seg_small
        free_lists = (self.pools[False].blocks, self.pools[True].blocks)   # indexed by a segment's seg_small
        bisect_left, insort, freed, none = bisect.bisect_left, bisect.insort, 0, NONE
        for block in blocks:
            used[block] = None
            freed += sizes[block]
        self.allocated -= freed
        for block in blocks:
            if used[block] is not None:   # merged into another of the run already
                continue
            used[block] = False
            seg = segs[block]
            pool = free_lists[seg_small[seg]]
            size, start = sizes[block], offs[block]
            before = prevs[block]
            while before != none and not used[before] and mapped[before]:
                if used[before] is None:   # one of the run: merged, not listed yet
                    used[before] = False
                else:
                    del pool[bisect_left(pool, (sizes[before], seg, offs[before]))]
                start = offs[before]
                size += sizes[before]
                before = prevs[before]
            prevs[block] = before
            if before != none:
                nexts[before] = block
            after = nexts[block]
            while after != none and not used[after] and mapped[after]:
                if used[after] is None:
                    used[after] = False
                else:
                    del pool[bisect_left(pool, (sizes[after], seg, offs[after]))]
                size += sizes[after]
                after = nexts[after]
            nexts[block] = after
            if after != none:
                prevs[after] = block
            sizes[block], offs[block] = size, start
            insort(pool, (size, seg, start, block))

    def _find_expandable_block(self, pool: _Pool, size: int) -> int:  # find_expandable_block()
        for _, _, u in pool.unmapped:  # lowest address first; a free block just before counts too
            before = self.prev[u]
            c = before if before != NONE and not self.used[before] else u
            room, b = 0, c
            while room < size and b != NONE and not self.used[b]:
                room, b = room + self.size[b], self.next[b]
            if room >= size:
                return c
        # a new ExpandableSegment: 2 MiB pages for the small pool, 20 MiB for the large
        seg = self._segment(pool.small, SMALL_BUFFER_BYTES if pool.small else LARGE_BUFFER_BYTES)
        u = self._new(seg, 0, VA_BYTES, mapped=False)
        self._add(pool, u)
        return u

    def _map_block(self, pool: _Pool, block: int, size: int) -> bool:  # map_block(), ExpandableSegment::map()
        page, off = self.seg_page[self.seg[block]], self.off[block]
        end = -(-(off + size) // page) * page
        nbytes = end - off  # whole pages: the offset is page-aligned
        if self.limit is not None and self.reserved + nbytes > self.limit:  # cuMemCreate fails: none is kept
            return False
        self._drop(pool, block)
        left = self.prev[block] != NONE  # an unmapped block's neighbours are mapped: mapped ranges join
        right = False
        if nbytes < self.size[block]:
            rest = self._new(self.seg[block], end, self.size[block] - nbytes, mapped=False)
            self._link(rest, self.next[block])
            self._link(block, rest)
            self._add(pool, rest)
        else:
            right = self.next[block] != NONE
        self.size[block], self.mapped[block] = nbytes, True
        self.segments += 1 - left - right
        self._merge(pool, block, self.prev[block])
        self._merge(pool, block, self.next[block])
        self._add(pool, block)
        self._grow(nbytes)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> int | None:
        c = self._find_expandable_block(pool, size)  # try_allocate_expandable_block()
        after = self.next[c]
        if (self.mapped[c] and after != NONE and not self.mapped[after]
                and self.size[c] < size <= self.size[c] + self.size[after]):
            return self._map_after(pool, c, after, size)
        return self._map_run(pool, c, size)

    def _map_after(self, pool: _Pool, free: int, unmapped: int, size: int) -> int | None:
        """:meth:`_map_run` where the run is a free block and the unmapped block after it, which holds the pages
        missing: a segment's tail growing, as each weight, gradient and optimizer state does the first time. The
        same steps, the same state after them, with ``_map_block``'s calls written out and its listing of the
        block (taken at once) left out."""
        sizes, offs, nexts, prevs, seg = self.size, self.off, self.next, self.prev, self.seg[unmapped]
        page, off = self.seg_page[seg], offs[unmapped]
        end = -(-(off + size - sizes[free]) // page) * page
        nbytes = end - off
        if self.limit is not None and self.reserved + nbytes > self.limit:  # cuMemCreate fails: none is kept
            return None
        del pool.unmapped[bisect.bisect_left(pool.unmapped, (seg, off))]   # _drop()
        spanned = nbytes >= sizes[unmapped]   # no unmapped rest: the mapped range after, if any, joins
        if not spanned:   # _new(), _link() on both sides and _add() of the unmapped rest
            rest, after = len(sizes), nexts[unmapped]
            self.seg.append(seg)
            offs.append(end)
            sizes.append(sizes[unmapped] - nbytes)
            self.mapped.append(False)
            self.used.append(False)
            prevs.append(unmapped)
            nexts.append(after)
            if after != NONE:
                prevs[after] = rest
            nexts[unmapped] = rest
            bisect.insort(pool.unmapped, (seg, end, rest))
        self.mapped[unmapped] = True
        self.segments -= spanned and nexts[unmapped] != NONE
        offs[unmapped] = offs[free]   # try_merge_blocks() with the free block before: _link() and _drop()
        before = prevs[unmapped] = prevs[free]
        if before != NONE:
            nexts[before] = unmapped
        sizes[unmapped] = nbytes + sizes[free]
        del pool.blocks[bisect.bisect_left(pool.blocks, (sizes[free], seg, offs[free]))]
        if spanned:
            self._merge(pool, unmapped, nexts[unmapped])
        self._grow(nbytes)
        return unmapped

    def _map_run(self, pool: _Pool, block: int, size: int) -> int | None:
        """Map what ``block`` and the free or unmapped blocks after it lack of ``size``; the block, taken."""
        if not self.mapped[block] and not self._map_block(pool, block, min(self.size[block], size)):
            return None
        while self.size[block] < size:  # free -> unmapped: map what is missing; it merges with block
            after = self.next[block]
            if not self._map_block(pool, after, min(size - self.size[block], self.size[after])):
                return None
            block = after
        self._drop(pool, block)
        return block

    def _unmap_block(self, pool: _Pool, block: int) -> None:  # unmap_block(), ExpandableSegment::unmap()
        page, off, size = self.seg_page[self.seg[block]], self.off[block], self.size[block]
        begin, end = -(-off // page) * page, (off + size) // page * page
        if begin >= end:  # no whole page inside this free block
            return
        self._drop(pool, block)
        before, after = self.prev[block], self.next[block]
        left = begin > off or (before != NONE and self.mapped[before])
        right = end < off + size or (after != NONE and self.mapped[after])
        if begin > off:  # a partial page at either end stays mapped, a free block of its own
            head = self._new(self.seg[block], off, begin - off)
            self._link(before, head)
            self._link(head, block)
            self._add(pool, head)
        if end < off + size:
            tail = self._new(self.seg[block], end, off + size - end)
            self._link(tail, after)
            self._link(block, tail)
            self._add(pool, tail)
        self.off[block], self.size[block], self.mapped[block] = begin, end - begin, False
        self.segments += left + right - 1
        self._merge(pool, block, self.prev[block])
        self._merge(pool, block, self.next[block])
        self._add(pool, block)
        self.reserved -= end - begin

    def run(self, oom_at: int | None) -> AllocatorRun:
        """The stats so far."""
        return AllocatorRun(peak_reserved_bytes=self.peak_reserved, peak_allocated_bytes=self.peak_allocated,
                            reserved_bytes=self.reserved, allocated_bytes=self.allocated, segments=self.at_peak[0],
                            expandable=self.expandable, oom_at=oom_at, gap_at_peak_bytes=self.at_peak[1],
                            retries=self.retries)

    def release_cached_blocks(self) -> None:  # release_cached_blocks() -> release_blocks(), large pool first
        for pool in (self.pools[False], self.pools[True]):
            to_unmap = []
            for _, _, _, b in list(pool.blocks):
                if self.expandable:
                    to_unmap.append(b)
                elif self.prev[b] == NONE and self.next[b] == NONE:  # release_block(): cudaFree a free segment
                    self._drop(pool, b)
                    self.reserved -= self.size[b]
                    self.segments -= 1
            for b in to_unmap:
                self._unmap_block(pool, b)
                if self.prev[b] == NONE and self.next[b] == NONE:  # release_expandable_segment()
                    self._drop(pool, b)


def simulate(events, *, expandable: bool = False, limit_bytes: int | None = None) -> AllocatorRun:
    """Replay ``events`` through the caching allocator of one device and one stream.

    ``events``: ``("alloc", key, nbytes)`` and ``("free", key)`` (also ``("empty_cache",)``, as
    ``torch.cuda.empty_cache()``). ``limit_bytes`` is the memory the GPU lets torch reserve: a segment (or a
    page run) that would take reserved past it fails, as cudaMalloc would; then the cache is released and the
    request retried once, and if that fails too the run stops there with ``oom_at`` set (nothing is raised).

    >>> run = simulate([("alloc", "a", 5 * MiB), ("alloc", "b", 5 * MiB), ("free", "a")])
    >>> run.peak_reserved_bytes // MiB, run.peak_allocated_bytes // MiB, run.allocated_bytes // MiB
    (20, 10, 5)
    >>> simulate([("alloc", "a", 11 * MiB)]).peak_reserved_bytes // MiB
    12
    >>> simulate([("alloc", "a", 11 * MiB)], expandable=True).peak_reserved_bytes // MiB
    20
    """
    with no_collector():
        return _replay(events, expandable, limit_bytes)


@contextmanager
def no_collector():
    """Python's cycle collector off for the block: a replay makes no cycles, and the collector's passes over every
    object in the process (a full one takes hundreds of ms beside transformers) wait till it ends."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _replay(events, expandable: bool, limit_bytes: int | None) -> AllocatorRun:
    a = _Allocator(expandable, limit_bytes)
    live: dict = {}
    oom_at = None
    for i, event in enumerate(events):
        op = event[0]
        if op == "alloc":
            _, key, nbytes = event
            if key in live or nbytes < 0:
                raise ValueError(f"event {i}: {event!r}: the key is live already, or the size is negative")
            block = a.malloc(nbytes) if nbytes else None  # allocate(0) returns a null pointer, no block
            if nbytes and block is None:
                oom_at = i
                break
            live[key] = block
        elif op == "free":
            if event[1] not in live:
                raise ValueError(f"event {i}: {event[1]!r} is not allocated")
            block = live.pop(event[1])
            if block is not None:
                a.free(block)
        elif op == "empty_cache":
            a.release_cached_blocks()
        else:
            raise ValueError(f"event {i}: unknown operation {op!r}")
    return a.run(oom_at)


class Replayer:
    """The allocator fed one request at a time, as a layout makes them (:mod:`kit.estimate.reserved`), with no
    event list between: ``alloc(key, nbytes)``, ``free(key)``, ``passing(key, nbytes)`` (a temporary), and
    ``alloc_group(name, sizes)`` / ``free_group(name)`` for tensors made in a row and freed together; then
    :meth:`run`. An ``alloc`` of no bytes or of a live key or group, and a ``free`` of one not live, are passed
    over. No limit: nothing runs out. Call it with the cycle collector off (:func:`no_collector`), as
    :func:`simulate` runs.

    >>> r = Replayer()
    >>> r.alloc("a", 5 * MiB); r.alloc("b", 5 * MiB); r.free("a"); r.free("a")
    >>> r.run() == simulate([("alloc", "a", 5 * MiB), ("alloc", "b", 5 * MiB), ("free", "a")])
    True
    """

    def __init__(self, expandable: bool = False):
        self.allocator = _Allocator(expandable, None)
        self.live: dict = {}
        self.groups: dict = {}   # a group's name -> its blocks, in the order made
        self.rounded: dict = {}   # a group's sizes (a tuple) -> its requests, rounded

    def alloc(self, key, nbytes: int) -> None:
        if nbytes > 0 and key not in self.live:
            self.live[key] = self.allocator.malloc(nbytes)

    def free(self, key) -> None:
        block = self.live.pop(key, None)
        if block is not None:
            self.allocator.free(block)

    def alloc_group(self, name: tuple, sizes: tuple) -> None:
        """``alloc`` of the keys ``name + (0,)``, ``name + (1,)``, ... at ``sizes``, in order, in one
        :meth:`_Allocator.malloc_all`: tensors made in a row and freed together (a block's saved tensors, a part's
        grads), kept as one list of blocks rather than a key each."""
        if name not in self.groups:
            self.groups[name] = self.allocator.malloc_all(self._rounded(sizes))

    def _rounded(self, sizes: tuple) -> list:
        """The requests of ``sizes`` above 0, as :func:`round_size` gives them (kept per tuple: a layout asks for
        each layer's saved tensors at the same sizes)."""
        rounded = self.rounded.get(sizes)
        if rounded is None:
            rounded = self.rounded[sizes] = [round_size(nbytes) for nbytes in sizes if nbytes > 0]
        return rounded

    def free_group(self, name: tuple) -> None:
        """``free_all`` of a group's keys, the last made first."""
        blocks = self.groups.pop(name, None)
        if blocks:
            self.allocator.free_all(blocks[::-1])

    def passing(self, key, nbytes: int) -> None:
        """``alloc`` and at once ``free``: a temporary (:meth:`_Allocator.malloc_free`)."""
        if nbytes > 0 and key not in self.live:
            self.allocator.malloc_free(nbytes)

    def run(self) -> AllocatorRun:
        return self.allocator.run(None)
