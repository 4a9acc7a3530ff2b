"""Filters a batch read hands to the store's indexes (``pushFilters``, PySpark 4.1+).

Spark gives the reader the conjunction of a query's simple filters; what is taken here narrows
the partitions before anything is read:

- ``topic`` and ``queue_id`` (=, IN): only those queues are planned. Exact: Spark drops them.
- ``queue_offset`` ranges (<, <=, >, >=, =): each queue's [start, end) is cut. Exact.
- ``commitlog_offset`` ranges: cut by a binary search of each queue's units (physical offsets
  grow along a queue). Exact.
- ``store_timestamp`` ranges: cut through the time lookup (StoreSnapshot.first_offset_at, exact
  at the edges while store times grow along a queue, as the store makes them); Spark still
  checks the rows, so the answer is Spark's own even on a store whose clock stepped back.
- ``tags`` (=, IN): the ConsumeQueue units whose tag hash matches are read, the rest skipped
  unread; Spark checks the rows (two tags can share a hash).
- ``commitlog_id`` (=, IN): only the queues bound to those CommitLogs are planned (in
  mode=commitlog, only those logs' files); Spark checks the rows.
- ``keys`` and ``msg_id`` (=, IN): the records come from the IndexFile (``topic#key`` of each
  planned topic) and from the offset message id (its physical offset), not from a scan; every
  filter goes back to Spark, which checks the few rows found.

What is taken is listed in ``Pushed.described`` (the reader logs it; docs/spark.md shows where
Spark's plan names it). Any other filter stays with Spark.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pyspark.sql.datasource import (EqualNullSafe, EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan,
                                    LessThanOrEqual)

from mqstore.log._codec import tags_code
from mqstore.queue.snapshot import first_where
from mqstore.layout import index_dir, log_of

log = logging.getLogger("mqstore.spark")

#: no bound
_HIGH = 1 << 62
_RANGED = ("queue_offset", "commitlog_offset", "store_timestamp")


@dataclass
class Pushed:
    """What the store does of a query's filters (None: no restriction)."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    #: [low, high) of queue_offset, commitlog_offset and store_timestamp (ms)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    tag_codes: frozenset[int] | None = None
    #: the CommitLogs (commitlog_id) whose queues / files are read
    logs: frozenset[int] | None = None
    keys: frozenset[str] | None = None
    msg_ids: frozenset[str] | None = None
    #: the filters taken, as text
    described: list[str] = field(default_factory=list)
    #: no row can match (an empty IN, disjoint ranges)
    empty: bool = False

    @property
    def lookup(self) -> bool:
        """Whether the rows come from the IndexFile / message ids rather than from queue scans."""
        return self.keys is not None or self.msg_ids is not None

    def restrict(self, name: str, values: frozenset[Any]) -> None:
        current = getattr(self, name)
        merged = values if current is None else current & values
        setattr(self, name, merged)
        if not merged:
            self.empty = True

    def bound(self, column: str, low: int, high: int) -> None:
        lo, hi = self.ranges.get(column, (-_HIGH, _HIGH))
        lo, hi = max(lo, low), min(hi, high)
        self.ranges[column] = (lo, hi)
        if lo >= hi:
            self.empty = True


def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    return attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None


def _micros(value: Any) -> int | None:
    """A timestamp filter's value in µs since the epoch (Spark's own unit)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None


def _ms_bounds(op: type, micros: int) -> tuple[int, int]:
    """[low, high) in store ms of the rows whose store_timestamp (ms * 1000 µs) passes op micros."""
    floor_ms, ceil_ms = micros // 1000, -(-micros // 1000)
    if op in (GreaterThan, LessThanOrEqual):  # ms * 1000 > micros is ms > floor; <= is ms <= floor
        return _int_bounds(op, floor_ms)
    if op in (GreaterThanOrEqual, LessThan):  # >= is ms >= ceil; < is ms < ceil
        return _int_bounds(op, ceil_ms)
    return ceil_ms, floor_ms + 1  # equality: empty unless micros is whole ms


def _int_bounds(op: type, value: int) -> tuple[int, int]:
    if op is GreaterThanOrEqual:
        return value, _HIGH
    if op is GreaterThan:
        return value + 1, _HIGH
    if op is LessThan:
        return -_HIGH, value
    if op is LessThanOrEqual:
        return -_HIGH, value + 1
    return value, value + 1


def push(filters: list[Filter]) -> tuple[Pushed, list[Filter]]:
    """What the store does of filters, and the filters Spark must still evaluate (the same
    objects, as PySpark asks)."""
    pushed = Pushed()
    keep: list[Filter] = []
    for f in filters:
        column, op = _column(f), type(f)
        value = getattr(f, "value", None)
        equal = op in (EqualTo, EqualNullSafe) and value is not None
        values = tuple(value) if op is In and isinstance(value, tuple) else ((value,) if equal else None)
        taken = False
        if column in ("topic", "tags", "keys", "msg_id") and values is not None \
                and all(isinstance(v, str) for v in values):
            if column == "topic":
                pushed.restrict("topics", frozenset(values))
            elif column == "tags":
                pushed.restrict("tag_codes", frozenset(tags_code(v) for v in values))
                keep.append(f)
            else:
                pushed.restrict("keys" if column == "keys" else "msg_ids", frozenset(values))
                keep.append(f)
            taken = True
        elif column == "queue_id" and values is not None and all(isinstance(v, int) for v in values):
            pushed.restrict("queue_ids", frozenset(values))
            taken = True
        elif column == "commitlog_id" and values is not None and all(isinstance(v, int) for v in values):
            pushed.restrict("logs", frozenset(values))
            keep.append(f)
            taken = True
        elif column in _RANGED and op in (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan,
                                          LessThanOrEqual) and value is not None:
            if column == "store_timestamp":
                micros = _micros(value)
                if micros is not None:
                    pushed.bound(column, *_ms_bounds(op, micros))
                    keep.append(f)
                    taken = True
            elif isinstance(value, int) and not isinstance(value, bool):
                pushed.bound(column, *_int_bounds(op, value))
                taken = True
        if taken:
            pushed.described.append(f"{op.__name__}({column}, {value!r})")
        else:
            keep.append(f)
    if pushed.lookup:  # the few rows found are checked by Spark against every filter
        keep = list(filters)
    return pushed, keep


# -- planning ---------------------------------------------------------------------------------
def narrow(snap: Any, q: Any, start: int, end: int, pushed: Pushed) -> tuple[int, int]:
    """[start, end) of queue q cut by the pushed queue_offset, commitlog_offset and store_timestamp
    ranges."""
    if "queue_offset" in pushed.ranges:
        lo, hi = pushed.ranges["queue_offset"]
        start, end = max(start, lo), min(end, hi)
    if start < end and "commitlog_offset" in pushed.ranges:
        lo, hi = pushed.ranges["commitlog_offset"]

        def phy_at_least(bound: int) -> Any:
            def passes(offset: int) -> bool:
                unit = snap.units(q.topic, q.queue_id, offset, offset + 1)
                return len(unit) < 8 or int.from_bytes(unit[:8], "big", signed=True) >= bound
            return passes

        if lo > -_HIGH:
            start = first_where(start, end, phy_at_least(lo))
        if hi < _HIGH:
            end = first_where(start, end, phy_at_least(hi))
    if start < end and "store_timestamp" in pushed.ranges:
        lo, hi = pushed.ranges["store_timestamp"]
        if lo > -_HIGH:
            start = max(start, snap.first_offset_at(q, lo))
        if hi < _HIGH:
            end = min(end, snap.first_offset_at(q, hi))
    return start, max(start, end)


def lookup_phys(snap: Any, root: str, ranges: dict[str, tuple[int, int]], topics: set[str], pushed: Pushed) -> list[int]:
    """The physical offsets of the records the keys and msg_id filters name, within the planned
    [start, end) of their queue (ranges by "topic/queueId"), in log order."""
    from mqstore.queue._reads import view_at

    candidates: set[int] = set()
    if pushed.msg_ids is not None:
        for msg_id in pushed.msg_ids:
            phy = offset_of_msg_id(msg_id)
            if phy is not None:
                candidates.add(phy)
    if pushed.keys is not None:
        found = set()
        for k in range(snap.log_count):  # every CommitLog's index (docs/parallel-commitlogs.md)
            found |= _index_lookup(root, topics, pushed.keys, k)
        candidates = found if pushed.msg_ids is None else candidates & found
    out = []
    for phy in sorted(candidates):
        if not snap.readable(phy):
            continue
        view = view_at(snap.log_map(log_of(phy)), phy)
        if view is None or bytes(view.buffer[28:36]) != phy.to_bytes(8, "big", signed=True):
            continue  # not the start of a record (an id from elsewhere)
        span = ranges.get(f"{view.topic}/{view.queue_id}")
        if span is not None and span[0] <= view.queue_offset < span[1]:
            out.append(phy)
    return out


def offset_of_msg_id(msg_id: str) -> int | None:
    """The physical offset in an offset message id (store host, then the offset, in hex: 32
    characters for IPv4, 56 for IPv6); None when it is not one."""
    if len(msg_id) not in (32, 56):
        return None
    try:
        return int(msg_id[-16:], 16)
    except ValueError:
        return None


def _index_lookup(root: str, topics: set[str], keys: frozenset[str], log_id: int = 0) -> set[int]:
    """Physical offsets the IndexFiles (of CommitLog log_id) give for topic#key, every planned
    topic and each key a keys value holds (its first; Spark checks the rest)."""
    from mqstore.queue._index import IndexFile, index_file_size
    from mqstore.log._mapped import MappedFile
    from mqstore.geometry import saved_sizes

    directory = index_dir(root, log_id)
    names = sorted(n for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []
    sizes = saved_sizes(root)
    if not names or sizes is None:
        return set()
    slots, entries = sizes["max_hash_slot_num"], sizes["max_index_num"]
    file_size = index_file_size(slots, entries)
    found: set[int] = set()
    lookups = {value.split(" ")[0] for value in keys if value}
    for name in names:
        path = os.path.join(directory, name)
        if os.path.getsize(path) != file_size:
            log.warning("index file %s is not %d bytes; keys are looked for in the others", path, file_size)
            continue
        mapped = MappedFile.open(path, file_size, readonly=True, file_from=0)
        try:
            index = IndexFile.load(mapped, slots, entries)
            for topic in topics:
                for key in lookups:
                    found.update(index.select_phy_offset(f"{topic}#{key}", entries, 0, _HIGH))
        finally:
            mapped.close()
    return found
