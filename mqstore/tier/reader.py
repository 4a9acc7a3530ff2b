"""The tier reader (tiered-storage spec §6.4, §7.1, §7.2): reads of segments in the bucket with
the fewest GETs, for one process.

``TierReader(root, config)`` reads ``ROOT/tier/manifest.log`` (``load_state``, reloaded when the
log or the snapshot changes) and the tier queue indexes, and answers:

==================================  ===============================================  ==========
read                                what it does                                     GETs cold
==================================  ===============================================  ==========
``get_messages(t, q, o, n)``        queue index → segment; footer (cached); one      1 + 1
                                    ranged GET from the time sample at or below o
``look_message_by_offset(phy)``     manifest → segment; phy fences (cached) → one    1 + 2
                                    GET of ≤ 4096 phy index entries → the record
``offset_by_time(t, q, ts)``        queue index min store ts → segment → group's     1 + 0..1
                                    time samples → one GET of ≤ 64 records (the
                                    store's nearest-record rule, not just "first at
                                    or after": see the method)
``min_offset``, ``earliest_time``   queue index, manifest                            0
==================================  ===============================================  ==========

Warm (the segment's footer in the cache) each read takes one GET fewer.

Footer cache (§7.1): per segment key the trailer and the parsed footer *without* its phy index
(directory, time samples, phy fences), LRU by an estimate of their bytes, 64 MiB by default.
A cold footer is one GET of the object's last ``FOOTER_GUESS`` bytes (a second GET for the rest
when the footer is longer); the trailer and footer CRCs are always checked, and with
``tiered_store_crc_check_enable`` they must also equal the CRCs the manifest recorded at
COPY_FINISHED (an object replaced under its key is refused).

Request coalescing (§7.2): concurrent reads of the same (key, start, length) share one GET
(a dict of in-flight futures under a lock); ``gets`` counts the GETs this reader sent.

With ``tiered_store_crc_check_enable`` every record returned has passed its body CRC check; as
locally (``check_crc_on_read``) a batch ends before a damaged record, and a read that starts at
one raises :class:`CorruptSegmentError` naming the segment key, the queue (or physical) offset
and the data position; a damaged record's bytes are never returned.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from mqstore.config import StoreConfig
from mqstore.errors import CorruptSegmentError, TierError
from mqstore.log._codec import check_record
from mqstore.segformat import PHY_ENTRY_SIZE, TRAILER_SIZE, Footer, Trailer
from mqstore.tier._segment import (find_queue_offset, parse_footer, parse_trailer, phy_entries_range,
                                   phy_lookup, queue_offset_range, time_range)
from mqstore.tier.manifest import COPY_FINISHED, MANIFEST_NAME, SNAPSHOT_NAME, ManifestState, Segment, load_state, \
    tier_dir
from mqstore.tier.objects import ObjectStore
from mqstore.tier.queues import QueueEntry, TierQueueIndex

__all__ = ["FOOTER_CACHE_BYTES", "FOOTER_GUESS", "FooterCache", "TierMessages", "TierReader",
           "TierRecord"]

FOOTER_CACHE_BYTES = 64 * 1024 * 1024   # §7.1
FOOTER_GUESS = 256 * 1024               # the tail a cold footer read asks for first
_LONG = struct.Struct(">q")             # QUEUEOFFSET at 20, PHYSICALOFFSET at 28 of a record
_TOTALSIZE = _INT = struct.Struct(">i")  # TOTALSIZE at 0, SYSFLAG at 36
_BORNHOST_V6 = 0x10                      # STORETIMESTAMP at 56, or 68 after an IPv6 born host


@dataclass(frozen=True)
class _CachedFooter:
    trailer: Trailer
    footer: Footer   # phy_index emptied: the phy index is never cached whole (§7.1)
    cost: int


class FooterCache:
    """Segment key → trailer and footer (without its phy index), LRU by estimated bytes."""

    def __init__(self, max_bytes: int = FOOTER_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._lock = threading.Lock()
        self._items: OrderedDict[str, _CachedFooter] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> _CachedFooter | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, item: _CachedFooter) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old.cost
            if item.cost > self.max_bytes:
                return
            self._items[key] = item
            self.bytes += item.cost
            while self.bytes > self.max_bytes:
                _key, dropped = self._items.popitem(last=False)
                self.bytes -= dropped.cost

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old.cost


@dataclass
class TierMessages:
    """One get_messages answer: records of one queue from one segment, in queue-offset order.
    ``first_offset`` is the queue offset of the first record (above the offset asked for when
    the tier holds nothing there: below its min offset or in a hole); ``next_offset`` is where
    the caller continues. ``records`` are memoryviews of the fetched range, each a whole
    CommitLog record byte for byte."""

    first_offset: int
    next_offset: int
    key: str
    records: list[memoryview] = field(default_factory=list)
    physical_offsets: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)


@dataclass(frozen=True)
class TierRecord:
    """look_message_by_offset's answer: the record (a whole CommitLog record) and where it is."""

    physical_offset: int
    key: str
    data_pos: int
    record: memoryview


class TierReader:
    """Reads of the tier for one process (spec §6.4): see the module docstring. Thread-safe."""

    def __init__(self, root: str, config: StoreConfig, objects: ObjectStore | None = None, *,
                 footer_cache_bytes: int = FOOTER_CACHE_BYTES, footer_guess: int = FOOTER_GUESS) -> None:
        self.root = root
        self.config = config
        self.objects = objects if objects is not None else ObjectStore(config)
        self.crc_check: bool = config.tiered_store_crc_check_enable
        self.max_count: int = config.read_ahead_message_count_threshold
        self.max_bytes: int = config.read_ahead_message_size_threshold
        self.footers = FooterCache(footer_cache_bytes)
        self.footer_guess = max(TRAILER_SIZE, footer_guess)
        self.gets = 0  # GETs sent (coalesced reads count once)
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int, int], Future[bytes]] = {}
        self._state_sig: tuple[tuple[int, int, int], ...] | None = None
        self._state = ManifestState()
        self._by_file: dict[int, tuple[list[int], list[Segment]]] = {}
        self._state_lock = threading.Lock()
        self._indexes: dict[tuple[str, int], TierQueueIndex] = {}
        self._index_lock = threading.Lock()

    def close(self) -> None:
        with self._index_lock:
            for index in self._indexes.values():
                index.close()
            self._indexes.clear()

    def __enter__(self) -> TierReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata ------------------------------------------------------------------------------

    def _signature(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for name in (MANIFEST_NAME, SNAPSHOT_NAME):
            try:
                st = os.stat(os.path.join(tier_dir(self.root), name))
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                out.append((0, -1, 0))
        return tuple(out)

    def state(self) -> ManifestState:
        """The manifest's state, reloaded when manifest.log or manifest.snapshot changed."""
        with self._state_lock:
            sig = self._signature()
            if sig != self._state_sig:
                state = load_state(self.root)
                by_file: dict[int, tuple[list[int], list[Segment]]] = {}
                for log in state.logs():
                    segs = state.copied_segments(log)
                    by_file[log] = ([s.file_start for s in segs], segs)
                self._state, self._by_file, self._state_sig = state, by_file, sig
            return self._state

    def _segment(self, log: int, file_start: int) -> Segment:
        seg = self.state().segments(log).get(file_start)
        if seg is None or seg.state != COPY_FINISHED:
            raise TierError(f"the tier queue index names segment {file_start} of log {log}, but the manifest "
                            f"has {'no copy of it' if seg is None else 'it ' + seg.state}")
        return seg

    def segment_of(self, phy: int) -> Segment | None:
        """The COPY_FINISHED segment whose file holds physical offset phy, or None."""
        self.state()
        with self._state_lock:
            for starts, segs in self._by_file.values():
                i = bisect.bisect_right(starts, phy) - 1
                if i >= 0 and phy < segs[i].file_end:
                    return segs[i]
        return None

    def _index(self, topic: str, queue_id: int) -> TierQueueIndex:
        index = self._indexes.get((topic, queue_id))
        if index is None:
            index = self._indexes.setdefault((topic, queue_id), TierQueueIndex(self.root, topic, queue_id))
        return index

    def _with_index(self, topic: str, queue_id: int, call: Callable[[TierQueueIndex], QueueEntry | int | None]
                    ) -> QueueEntry | int | None:
        with self._index_lock:  # a TierQueueIndex reopens its fd on a rewrite: one thread at a time
            return call(self._index(topic, queue_id))

    def min_offset(self, topic: str, queue_id: int) -> int | None:
        """The first queue offset the tier holds for the queue, or None (0 GETs)."""
        got = self._with_index(topic, queue_id, lambda ix: ix.min_offset())
        assert got is None or isinstance(got, int)
        return got

    def max_offset(self, topic: str, queue_id: int) -> int | None:
        """One past the last queue offset the tier holds for the queue, or None (0 GETs)."""
        got = self._with_index(topic, queue_id, lambda ix: ix.max_offset())
        assert got is None or isinstance(got, int)
        return got

    def earliest_time(self) -> int:
        """The store timestamp of the tier's oldest record (the manifest's first_store_ts), -1
        when the tier holds nothing (0 GETs)."""
        state = self.state()
        times = [s.first_store_ts for log in state.logs() for s in state.copied_segments(log)
                 if s.first_store_ts is not None]
        return min(times) if times else -1

    # -- GETs ----------------------------------------------------------------------------------

    def _get(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of key; concurrent calls for the same range share one GET."""
        slot = (key, start, length)
        with self._lock:
            fut = self._inflight.get(slot)
            owner = fut is None
            if fut is None:
                fut = self._inflight[slot] = Future()
                self.gets += 1
        if not owner:
            return fut.result()
        try:
            data = self.objects.get_range(key, start, length)
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        else:
            fut.set_result(data)
            return data
        finally:
            with self._lock:
                del self._inflight[slot]

    def _group_of(self, entry: QueueEntry, topic: str, queue_id: int) -> tuple[Segment, Footer, int]:
        """The segment a tier queue index entry names, its footer (cached) and the queue's group in
        it; CorruptSegmentError when the footer has no such group."""
        seg = self._segment(entry.log, entry.file_start)
        _trailer, footer = self.footer(seg)
        g = footer.group(topic.encode(), queue_id)
        if g < 0:
            raise CorruptSegmentError(f"segment {seg.key} has no group of {topic!r} queue {queue_id}, which the "
                                      "tier queue index says it holds")
        return seg, footer, g

    def footer(self, seg: Segment) -> tuple[Trailer, Footer]:
        """The segment's trailer and footer (its phy index left out), from the cache or with one
        GET of the object's tail (two when the footer is longer than footer_guess)."""
        cached = self.footers.get(seg.key)
        if cached is not None:
            return cached.trailer, cached.footer
        size = seg.size
        if size is None or size < TRAILER_SIZE:
            raise CorruptSegmentError(f"segment {seg.key}: the manifest records size {size!r}")
        take = min(size, self.footer_guess)
        tail = self._get(seg.key, size - take, take)
        try:
            trailer = parse_trailer(tail[-TRAILER_SIZE:])
        except CorruptSegmentError as exc:
            raise CorruptSegmentError(f"segment {seg.key}: {exc.args[0]}") from None
        if trailer.object_size != size:
            raise CorruptSegmentError(f"segment {seg.key} is {size} bytes in the manifest, its trailer says "
                                      f"{trailer.object_size}")
        if self.crc_check and (trailer.data_crc != seg.data_crc32 or trailer.footer_crc != seg.footer_crc32):
            raise CorruptSegmentError(f"segment {seg.key}: the trailer's CRCs (data {trailer.data_crc:#010x}, footer "
                                      f"{trailer.footer_crc:#010x}) are not the manifest's (data "
                                      f"{seg.data_crc32 or 0:#010x}, footer {seg.footer_crc32 or 0:#010x}): "
                                      "not the object that was copied")
        need = trailer.footer_len + TRAILER_SIZE
        if need <= take:
            footer_bytes = tail[take - need:take - TRAILER_SIZE]
        else:
            rest = self._get(seg.key, trailer.data_len, need - take)
            footer_bytes = rest + tail[:take - TRAILER_SIZE]
        try:
            footer = parse_footer(footer_bytes, trailer)
        except CorruptSegmentError as exc:
            raise CorruptSegmentError(f"segment {seg.key}: {exc.args[0]}") from None
        phy_bytes = len(footer.phy_index)
        footer = footer._replace(phy_index=b"")
        cost = trailer.footer_len - phy_bytes + 256 + 160 * (len(footer.groups) + len(footer.samples))
        self.footers.put(seg.key, _CachedFooter(trailer, footer, cost))
        return trailer, footer

    # -- records -------------------------------------------------------------------------------

    def _check(self, window: bytes, pos: int, seg: Segment, base: int, what: str) -> int:
        """The size of the whole record at window position pos, or CorruptSegmentError naming it."""
        size, ok = check_record(window, pos, check_crc=self.crc_check)
        if not ok or size <= 0 or pos + size > len(window):
            crc_only = self.crc_check and check_record(window, pos, check_crc=False)[1]
            why = "fails its body CRC" if crc_only else "does not parse as a whole record"
            raise CorruptSegmentError(f"segment {seg.key}: the record of {what} at data position {base + pos} {why}")
        return int(size)

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int | None = None
                     ) -> TierMessages | None:
        """Records of a queue from offset, from one segment: at most min(max_count,
        read_ahead_message_count_threshold) records and read_ahead_message_size_threshold bytes
        (at least one record). None when the tier holds nothing at or after offset."""
        if type(offset) is not int or offset < 0:
            raise TierError(f"get_messages of {topic!r} queue {queue_id}: offset must be an int >= 0, got {offset!r}")
        limit = self.max_count if max_count is None else min(max_count, self.max_count)
        if limit < 1:
            raise TierError(f"get_messages of {topic!r} queue {queue_id}: max_count must be >= 1, got {max_count!r}")

        def locate(ix: TierQueueIndex) -> QueueEntry | None:
            return ix.find(offset) or ix.find_after(offset)

        entry = self._with_index(topic, queue_id, locate)
        if not isinstance(entry, QueueEntry):
            return None
        offset = max(offset, entry.first_queue_offset)
        seg, footer, g = self._group_of(entry, topic, queue_id)
        group = footer.groups[g]
        span = queue_offset_range(footer, g, offset)
        if span is None:
            raise CorruptSegmentError(f"segment {seg.key}: {topic!r} queue {queue_id} offset {offset} is not in its "
                                      f"group ({group.first_queue_offset} + {group.record_count})")
        start = span[0]
        samples = footer.samples[group.first_sample:group.first_sample + group.sample_count]
        end = group.data_start + group.data_length
        for s in samples:  # the first sample past the batch (or past the byte budget) ends the window
            if s.queue_offset > offset and s.data_pos > start and (
                    s.queue_offset >= offset + limit or s.data_pos - start >= self.max_bytes):
                end = s.data_pos
                break
        window = self._get(seg.key, start, end - start)
        view = memoryview(window)
        what = f"{topic!r} queue {queue_id} offset {offset}"
        found = find_queue_offset(window, offset)
        if found is None:
            raise CorruptSegmentError(f"segment {seg.key}: no record of {what} in data bytes {start}..{end}")
        pos = found[0]
        out = TierMessages(first_offset=found[2], next_offset=found[2], key=seg.key)
        taken = 0
        expect = found[2]
        while pos < len(window) and len(out.records) < limit:
            try:
                size = self._check(window, pos, seg, start, f"{topic!r} queue {queue_id} offset {expect}")
            except CorruptSegmentError:
                if out.records:
                    break  # as locally: the batch ends before a damaged record
                raise
            if out.records and taken + size > self.max_bytes:
                break
            qo = _LONG.unpack_from(window, pos + 20)[0]
            if qo < expect:  # a group is in queue-offset order (a gap, as a ConsumeQueue may hold, is read over)
                raise CorruptSegmentError(f"segment {seg.key}: the record at data position {start + pos} has queue "
                                          f"offset {qo}, expected {expect} or later ({topic!r} queue {queue_id})")
            expect = qo
            out.records.append(view[pos:pos + size])
            out.physical_offsets.append(_LONG.unpack_from(window, pos + 28)[0])
            taken += size
            pos += size
            expect += 1
        out.next_offset = expect
        return out

    def look_message_by_offset(self, phy: int) -> TierRecord | None:
        """The record at physical offset phy, or None when no tiered segment holds a record there."""
        seg = self.segment_of(phy)
        if seg is None:
            return None
        trailer, footer = self.footer(seg)
        file_pos = phy - seg.file_start
        rng = phy_entries_range(trailer, footer.fences, file_pos)
        if rng is None:
            return None
        entries = self._get(seg.key, rng[0], rng[1] - rng[0])
        data_pos = phy_lookup(entries, file_pos)
        if data_pos < 0:
            return None
        # the record's size: the next entry's file position (records are contiguous in the file)
        k = bisect.bisect_left([struct.unpack_from(">I", entries, i)[0]
                                for i in range(0, len(entries), PHY_ENTRY_SIZE)], file_pos)
        if (k + 1) * PHY_ENTRY_SIZE < len(entries):
            size = struct.unpack_from(">I", entries, (k + 1) * PHY_ENTRY_SIZE)[0] - file_pos
        else:
            fence_k = bisect.bisect_right(footer.fences, file_pos)  # the next block's first record, or the end
            size = (footer.fences[fence_k] if fence_k < len(footer.fences) else trailer.valid_len) - file_pos
        size = min(size, trailer.data_len - data_pos)
        if size <= 0:
            raise CorruptSegmentError(f"segment {seg.key}: the phy index gives physical offset {phy} no room")
        window = self._get(seg.key, data_pos, size)
        total = _TOTALSIZE.unpack_from(window, 0)[0] if len(window) >= 4 else -1
        if total != size:
            raise CorruptSegmentError(f"segment {seg.key}: the record of physical offset {phy} at data position "
                                      f"{data_pos} says TOTALSIZE {total}, the phy index leaves {size} bytes")
        self._check(window, 0, seg, data_pos, f"physical offset {phy}")
        if _LONG.unpack_from(window, 28)[0] != phy:
            raise CorruptSegmentError(f"segment {seg.key}: the record at data position {data_pos} does not say "
                                      f"physical offset {phy}")
        return TierRecord(phy, seg.key, data_pos, memoryview(window))

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int, *, next_store_ts: int | None = None
                       ) -> int | None:
        """get_offset_in_queue_by_time over the tier's records of the queue, with the store's rule
        (RocketMQ 4.9.7): the earliest record stored exactly at timestamp, else the nearer of the
        last record stored before it and the first after it (a tie to the older). The record
        after the tier's last one (the local store's first) takes part when its store timestamp
        is passed as next_store_ts. None when the tier holds nothing of the queue.

        GETs: the footer when cold, then at most one of the ≤ 64 records between two time samples."""
        entry = self._with_index(topic, queue_id, lambda ix: ix.find_by_time(timestamp))
        if not isinstance(entry, QueueEntry):
            return None
        seg, footer, g = self._group_of(entry, topic, queue_id)
        group = footer.groups[g]
        left: tuple[int, int] | None = None    # (queue offset, store timestamp) of the last record before
        right: tuple[int, int] | None = None   # ... of the first at or after
        for s in footer.samples[group.first_sample:group.first_sample + group.sample_count]:
            if s.store_timestamp >= timestamp:
                break
            left = (s.queue_offset, s.store_timestamp)
        start, stop, after = time_range(footer, g, timestamp)
        if start < stop:
            window = self._get(seg.key, start, stop - start)
            pos = 0
            while pos < len(window):
                size = self._check(window, pos, seg, start, f"{topic!r} queue {queue_id} near time {timestamp}")
                sys_flag = _INT.unpack_from(window, pos + 36)[0]
                ts = _LONG.unpack_from(window, pos + (68 if sys_flag & _BORNHOST_V6 else 56))[0]
                qo = _LONG.unpack_from(window, pos + 20)[0]
                if ts >= timestamp:
                    right = (qo, ts)
                    break
                left = (qo, ts)
                pos += size
        if right is None:  # past the group: the queue's next record is in the next segment, or local
            nxt = after if left is None else left[0] + 1
            following = self._with_index(topic, queue_id, lambda ix: ix.find(nxt))
            if isinstance(following, QueueEntry):
                right = (nxt, following.min_store_ts)
            elif next_store_ts is not None:
                right = (nxt, next_store_ts)
        if right is not None and right[1] == timestamp:
            return right[0]
        if left is not None and (right is None or timestamp - left[1] <= right[1] - timestamp):
            return left[0]
        return right[0] if right is not None else after
