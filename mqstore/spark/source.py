"""The "mqstore" PySpark data source: batch reads of a store directory.

    spark.read.format("mqstore").load("/data/store")
    spark.read.format("mqstore").option("topics", "orders,payments").load(path)

One row per message (``SCHEMA``). What is read is what the store has dispatched when the
query is planned (``mqstore.queue.snapshot.StoreSnapshot``): a store a node is serving is read
consistently, a store that crashed and was not recovered is refused.

Options (all optional):

``topics``               comma-separated topics (default: all)
``queues``               comma-separated queue ids (default: all)
``startingOffsets``      ``earliest`` (default), ``latest`` or JSON ``{"topic/queueId": offset}``;
                         a queue the JSON does not name starts at its earliest offset; an
                         offset below the earliest one still stored is an error naming the
                         queue and the missing range
``endingOffsets``        ``latest`` (default) or JSON as above (exclusive; past the latest
                         offset reads up to the latest)
``startingTimestamp``    epoch ms instead of startingOffsets: each queue starts at the offset
                         the store's time lookup gives (spec §3 getOffsetInQueueByTime: the
                         message whose store time is nearest, the earliest of equal ones)
``endingTimestamp``      epoch ms instead of endingOffsets: each queue ends (exclusive) at the
                         offset the time lookup gives
``mode``                 ``queues`` (default: partitions are (topic, queue) offset ranges,
                         rows in queue order) or ``commitlog`` (a partition per CommitLog
                         file of every log, each one file of one log, every record in log
                         order; topics/queues/offsets do not apply)
``maxRowsPerPartition``  queue offsets per partition (default 1048576); smaller slices are
                         packed together (pack_slices)
``batchRows``            rows per Arrow record batch (default 65536)
``maxBatchBytes``        record bytes per Arrow record batch (default 16 MiB; a single larger
                         record still makes a batch of one): what bounds a batch of big
                         bodies (65,536 rows of 4 KiB bodies are 271 MB, past the direct
                         memory of Spark's default 1 GiB driver)
``failOnDataLoss``       ``true`` (default): messages retention deleted between planning and
                         reading fail the partition, naming the queue and the range;
                         ``false``: the rest is read and the loss logged

A narrower schema (``spark.read.format("mqstore").schema("topic string, body binary")``)
reads only those columns (names and types from ``SCHEMA``); it is the only column pruning
PySpark 4.3 offers, and the body and properties are the costly columns. It may also name
``commitlog_id`` (``COMMITLOG_ID``: the record's CommitLog, not in the default schema).
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqstore.queue._arrow import INT32_COLUMNS, INT64_COLUMNS, NULLABLE_STRING_COLUMNS, STRING_COLUMNS, BatchColumns, cut_units
from mqstore.errors import MQStoreError
from mqstore.layout import CQ_STORE_UNIT_SIZE as UNIT
from mqstore.layout import LOG_SHIFT, log_of
from mqstore.queue.snapshot import QueueRange, StoreSnapshot
from mqstore.spark.pushdown import Pushed, lookup_phys, narrow, push
from mqstore.spark.worker import settle_worker
from mqstore.spark.options import (EARLIEST, LATEST, RANGE_OPTIONS, SELECT_OPTIONS, OptionError, bool_option,
                                   check_options, int_option, list_option, offsets_option, per_queue_json,
                                   traceback_logged)

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()),
    StructField("commitlog_offset", LongType()),
    StructField("store_size", IntegerType()),
    StructField("born_timestamp", TimestampType()),
    StructField("store_timestamp", TimestampType()),
    StructField("born_host", StringType()),
    StructField("store_host", StringType()),
    StructField("tags", StringType()),
    StructField("keys", StringType()),
    StructField("msg_id", StringType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("body", BinaryType()),
    StructField("reconsume_times", IntegerType()),
    StructField("sys_flag", IntegerType()),
])
_TYPES = {f.name: f.dataType for f in SCHEMA.fields}
#: an optional column a user-given schema may name (not in SCHEMA, so the default schema stays
#: what it was): the id of the CommitLog the record is in, commitlog_offset's top byte
#: (layout.log_of; 0 in a store with one CommitLog)
COMMITLOG_ID = StructField("commitlog_id", IntegerType())
#: Kafka's headers column (includeHeaders=true): the properties as (key, value bytes) pairs
HEADERS = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                        StructField("value", BinaryType())])))
#: queue offsets per partition: a partition costs the JVM a Python task (~30 ms of CPU, the
#: worker's socket, its pickled reader, a store snapshot) beside its rows; 2^20 makes most
#: queues one partition, as Kafka's source makes a partition per topic-partition (3M rows of
#: 8 queues counted in 1.1 CPU-s, against 1.4 at 2^18)
DEFAULT_MAX_ROWS_PER_PARTITION = 1 << 20
log = logging.getLogger("mqstore.spark")
DEFAULT_BATCH_ROWS = 65_536
#: each of local[N]'s N tasks holds a batch and its copies (Arrow buffers, the JVM's read of
#: them) in direct memory, which defaults to the driver's heap (spark.driver.memory, 1 GiB)
DEFAULT_BATCH_BYTES = 16 << 20


# -- partitions ---------------------------------------------------------------------------------
@dataclass
class QueueSlice(InputPartition):
    """Queue offsets [start, end) of one ConsumeQueue."""

    topic: str
    queue_id: int
    start: int
    end: int
    #: read only the units whose tag hash is one of these (pushed tags filters); None: all
    tag_codes: tuple[int, ...] | None = None


@dataclass
class QueueSlices(InputPartition):
    """Several small queue slices read by one task, one after the other (pack_slices)."""

    parts: tuple[QueueSlice, ...]


#: a slice of fewer rows than maxRowsPerPartition / SMALL_SHARE is packed with its neighbours
SMALL_SHARE = 8


def pack_slices(pieces: list[QueueSlice], per_partition: int, min_partitions: int = 1) -> list[InputPartition]:
    """pieces with the small ones (under per_partition / SMALL_SHARE rows) packed in order into
    QueueSlices of at most that many rows: a task costs Spark ~30 ms of CPU beside its rows
    (its Python runner, the worker's socket, a store snapshot), and a narrow time range, a
    micro-batch or a tags read is eight small slices of eight queues (as Spark's file sources
    pack small files into one partition). Left as they are when packing would give fewer
    partitions than minPartitions asks for."""
    small = max(1, per_partition // SMALL_SHARE)
    out: list[InputPartition] = []
    group: list[QueueSlice] = []
    rows = 0

    def close() -> None:
        nonlocal rows
        if group:
            out.append(group[0] if len(group) == 1 else QueueSlices(tuple(group)))
            group.clear()
        rows = 0

    for piece in pieces:
        n = piece.end - piece.start
        if n >= small:
            close()
            out.append(piece)
            continue
        if rows + n > small:
            close()
        group.append(piece)
        rows += n
    close()
    return out if len(out) >= min(min_partitions, len(pieces)) else list(pieces)


@dataclass
class PhySlice(InputPartition):
    """The records at these (physical offset, size) pairs, in log order (keys / msg_id lookups)."""

    records: tuple[tuple[int, int], ...]


@dataclass
class LogSlice(InputPartition):
    """CommitLog bytes [start, end): whole records, in log order."""

    start: int
    end: int


# -- options --------------------------------------------------------------------------------
def select_queues(queues: list[QueueRange], options: Mapping[str, str], *, streaming: bool = False) -> list[QueueRange]:
    """The queues the topics (Kafka's subscribe), subscribePattern, assign and queues options
    pick (at most one of the first three; every queue when none is given). A batch read names
    a topic the store does not have as an error; a stream waits for it to appear."""
    topics = list_option(options, "topics")
    pattern_raw = options.get("subscribepattern")
    assign = options.get("assign")
    given = [n for n, v in (("topics", topics), ("subscribePattern", pattern_raw), ("assign", assign)) if v is not None]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(given)} each pick the topics to read; give one")
    queue_ids_raw = list_option(options, "queues")
    try:
        queue_ids = None if queue_ids_raw is None else {int(q) for q in queue_ids_raw}
    except ValueError:
        raise OptionError(f"option queues={options.get('queues')!r} must list queue ids (integers)") from None
    known_topics = {q.topic for q in queues}
    pick: Callable[[QueueRange], bool]
    if topics is not None:
        missing = sorted(set(topics) - known_topics)
        if missing and not streaming:
            raise OptionError(f"option topics names topic(s) the store does not have: {', '.join(missing)}")
        wanted = set(topics)
        pick = lambda q: q.topic in wanted  # noqa: E731
    elif pattern_raw is not None:
        try:
            pattern = re.compile(pattern_raw)
        except re.error as exc:
            raise OptionError(f"option subscribePattern={pattern_raw!r} is not a regular expression: {exc}") from None
        pick = lambda q: pattern.fullmatch(q.topic) is not None  # noqa: E731
    elif assign is not None:
        assigned = _assignment(assign)
        missing = sorted(f"{t}/{i}" for t, ids in assigned.items() for i in ids
                         if not any(q.topic == t and q.queue_id == i for q in queues))
        if missing and not streaming:
            raise OptionError(f"option assign names queue(s) the store does not have: {', '.join(missing)}")
        pick = lambda q: q.queue_id in assigned.get(q.topic, ())  # noqa: E731
    else:
        pick = lambda q: True  # noqa: E731
    return [q for q in queues if pick(q) and (queue_ids is None or q.queue_id in queue_ids)]


def _assignment(raw: str) -> dict[str, set[int]]:
    """Kafka's assign JSON, {"topic": [0, 1]}."""
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
            isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
            for ids in parsed.values()):
        raise OptionError(f'option assign={raw!r}: expected JSON like {{"topicA": [0, 1], "topicB": [2]}}')
    return {topic: set(ids) for topic, ids in parsed.items()}


#: (option, its kind) of each way to say where a read starts / ends, in the order they are named
_STARTS = (("startingOffsets", "offsets"), ("startingTimestamp", "time"), ("startingOffsetsByTimestamp", "times"))
_ENDS = (("endingOffsets", "offsets"), ("endingTimestamp", "time"), ("endingOffsetsByTimestamp", "times"))


def _one_of(options: Mapping[str, str], names: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
    given = [(n, kind) for n, kind in names if n.lower() in options]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(n for n, _ in given)} each say where to "
                          f"{'start' if names is _STARTS else 'end'}; give one")
    return given[0] if given else None


def _check_named(queues: list[QueueRange], name: str, given: object) -> None:
    known = {q.key for q in queues}
    if isinstance(given, dict) and set(given) - known:
        raise OptionError(f"option {name} names queue(s) the store does not have: "
                          f"{', '.join(sorted(set(given) - known))}")


def _bounds(queues: list[QueueRange], options: Mapping[str, str], which: tuple[tuple[str, str], ...],
            time_lookup: Callable[[QueueRange, int], int] | None, known: list[QueueRange],
            *, streaming: bool) -> dict[str, int]:
    """{queue key: offset} where each queue starts (which=_STARTS) or ends (_ENDS)."""
    starting = which is _STARTS
    given = _one_of(options, which)
    fallback = {q.key: (q.min_offset if starting else q.max_offset) for q in queues}
    if given is None:
        return fallback
    name, kind = given
    if not starting and streaming:
        raise OptionError(f"option {name} does not apply to streaming reads (a stream reads on as messages come; "
                          "trigger(availableNow=True) reads what is there and stops)")
    if kind == "offsets":
        value = offsets_option(options, name, "earliest" if starting else "latest",
                               allow=("earliest", "latest") if starting else ("latest",))
        if value == "earliest":
            return fallback
        if value == "latest":
            return {q.key: q.max_offset for q in queues}
        assert isinstance(value, dict)  # offsets_option gives earliest, latest or the JSON's offsets
        _check_named(known, name, value)
        out = {}
        for q in queues:
            at = value.get(q.key)
            if at is None:
                out[q.key] = fallback[q.key]
            elif at == EARLIEST:
                out[q.key] = q.min_offset
            elif at == LATEST:
                out[q.key] = q.max_offset
            else:
                if starting and at < q.min_offset:
                    raise OptionError(f"queue {q.key}: {name} asks for offset {at}, but offsets [{at}, "
                                      f"{q.min_offset}) are no longer stored (the earliest is {q.min_offset})")
                out[q.key] = at if starting else min(at, q.max_offset)
        return out
    if time_lookup is None:
        raise OptionError("timestamp options need the store's time lookup")
    if kind == "time":
        ms = int_option(options, name, 0, low=0)
        return {q.key: time_lookup(q, ms) for q in queues}
    times = per_queue_json(options, name, "1700000000000")
    assert times is not None
    _check_named(known, name, times)
    return {q.key: time_lookup(q, times[q.key]) if q.key in times else fallback[q.key] for q in queues}


def starting_offsets(queues: list[QueueRange], options: Mapping[str, str],
                     time_lookup: Callable[[QueueRange, int], int] | None,
                     known: list[QueueRange] | None = None, *, streaming: bool = False) -> dict[str, int]:
    """{queue key: first offset to read} of queues by startingOffsets, startingTimestamp or
    startingOffsetsByTimestamp (time_lookup(queue, ms): the first offset whose store time is
    >= ms); an explicit offset below the earliest one still stored is an error naming the
    queue and the range, and so is JSON naming a queue not in known (default: queues)."""
    return _bounds(queues, options, _STARTS, time_lookup, queues if known is None else known, streaming=streaming)


def slices(q: QueueRange, start: int, end: int, per_partition: int) -> list[QueueSlice]:
    return [QueueSlice(q.topic, q.queue_id, at, min(end, at + per_partition)) for at in range(start, end, per_partition)]


def split_for(total_rows: int, options: Mapping[str, str]) -> int:
    """Queue offsets per partition: maxRowsPerPartition, made smaller when minPartitions asks
    for more partitions than that gives (as Kafka splits offset ranges)."""
    per_partition = int_option(options, "maxRowsPerPartition", DEFAULT_MAX_ROWS_PER_PARTITION)
    min_parts = int_option(options, "minPartitions", 1)
    if min_parts > 1 and total_rows > 0:
        per_partition = min(per_partition, max(1, -(-total_rows // min_parts)))
    return per_partition


def plan_queue_ranges(queues: list[QueueRange], options: Mapping[str, str],
                      time_lookup: Callable[[QueueRange, int], int] | None = None
                      ) -> list[tuple[QueueRange, int, int]]:
    """(queue, start, end) of a batch read in queue mode: the chosen queues and their
    [start, end) by the offset or timestamp options (time_lookup(queue, ms): the first offset
    whose store time is >= ms)."""
    chosen = select_queues(queues, options)
    starts = starting_offsets(chosen, options, time_lookup, known=queues)
    ends = _bounds(chosen, options, _ENDS, time_lookup, queues, streaming=False)
    return [(q, starts[q.key], min(ends[q.key], q.max_offset)) for q in chosen]


def cut_ranges(ranges: list[tuple[QueueRange, int, int]], options: Mapping[str, str],
               tag_codes: tuple[int, ...] | None = None) -> list[QueueSlice]:
    """The ranges cut into maxRowsPerPartition pieces (smaller when minPartitions asks)."""
    per_partition = split_for(sum(max(0, e - s) for _, s, e in ranges), options)
    return [QueueSlice(q.topic, q.queue_id, at, min(e, at + per_partition), tag_codes)
            for q, s, e in ranges for at in range(s, e, per_partition)]


def packed(pieces: list[QueueSlice], options: Mapping[str, str]) -> list[InputPartition]:
    """The partitions of pieces (from cut_ranges or slices, by the same options): the small
    ones packed together (pack_slices)."""
    per_partition = split_for(sum(p.end - p.start for p in pieces), options)
    return pack_slices(pieces, per_partition, int_option(options, "minPartitions", 1))


def plan_queue_slices(queues: list[QueueRange], options: Mapping[str, str],
                      time_lookup: Callable[[QueueRange, int], int] | None = None) -> list[QueueSlice]:
    """The slices of a batch read in queue mode: plan_queue_ranges cut by cut_ranges (the
    reader's partitions pack the small ones: packed)."""
    return cut_ranges(plan_queue_ranges(queues, options, time_lookup), options)


def _columns(schema: StructType, *, include_headers: bool = False) -> list[str]:
    """The columns a (possibly narrower, user-given) schema asks for; each must be one of
    SCHEMA's or ``commitlog_id``, with its type (``headers`` too with includeHeaders)."""
    types = {**_TYPES, COMMITLOG_ID.name: COMMITLOG_ID.dataType}
    if include_headers:
        types[HEADERS.name] = HEADERS.dataType
    names = []
    for field in schema.fields:
        expected = types.get(field.name)
        if expected is None:
            hint = " (headers needs option includeHeaders=true)" if field.name == HEADERS.name else ""
            raise OptionError(f"column {field.name!r} is not an mqstore column; the columns are "
                              f"{', '.join(types)}{hint}")
        if field.dataType != expected:
            raise OptionError(f"column {field.name!r} is {expected.simpleString()}, not "
                              f"{field.dataType.simpleString()}")
        names.append(field.name)
    return names


def read_schema(options: Mapping[str, str]) -> StructType:
    """SCHEMA, with the headers column when option includeHeaders is true (Kafka's)."""
    if bool_option({k.lower(): v for k, v in options.items()}, "includeHeaders", False):
        return StructType(SCHEMA.fields + [HEADERS])
    return SCHEMA


# -- Arrow ----------------------------------------------------------------------------------
def record_batch(cols: BatchColumns, arrow_schema: pa.Schema) -> pa.RecordBatch:
    """The kernel's buffers as a record batch of arrow_schema (no copy of the buffers; the
    headers column is made from the properties' arrays, commitlog_id from commitlog_offset)."""
    n = cols.rows
    buffers = cols.buffers()
    arrays = []
    maps: dict[str, pa.MapArray] = {}

    def properties(map_type: pa.DataType) -> pa.MapArray:
        if "map" not in maps:
            list_offsets, key_offsets, key_data, value_offsets, value_data = buffers["properties"]
            pairs = int.from_bytes(bytes(memoryview(list_offsets)[-4:]), "little")
            keys = pa.Array.from_buffers(pa.string(), pairs, [None, pa.py_buffer(key_offsets), pa.py_buffer(key_data)])
            values = pa.Array.from_buffers(pa.string(), pairs,
                                           [None, pa.py_buffer(value_offsets), pa.py_buffer(value_data)])
            offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(list_offsets)])
            maps["map"] = pa.MapArray.from_arrays(offsets, keys, values, type=map_type)
        return maps["map"]

    for field in arrow_schema:
        name = field.name
        bufs = buffers.get(name, ())  # headers has none of its own: it is made from the properties
        if name in INT32_COLUMNS or name in INT64_COLUMNS:
            arrays.append(pa.Array.from_buffers(field.type, n, [None, pa.py_buffer(bufs[0])]))
        elif name in STRING_COLUMNS:
            arrays.append(pa.Array.from_buffers(field.type, n, [None, pa.py_buffer(bufs[0]), pa.py_buffer(bufs[1])]))
        elif name in NULLABLE_STRING_COLUMNS:
            validity, offsets, data, nulls = bufs
            arrays.append(pa.Array.from_buffers(field.type, n, [None if validity is None else pa.py_buffer(validity),
                                                                pa.py_buffer(offsets), pa.py_buffer(data)],
                                                null_count=nulls))
        elif name == "properties":
            arrays.append(properties(field.type))
        elif name == COMMITLOG_ID.name:  # from commitlog_offset (_batch_columns asks for it)
            import pyarrow.compute as pc

            phys = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(buffers["commitlog_offset"][0])])
            arrays.append(pc.shift_right(phys, pa.scalar(LOG_SHIFT, pa.int64())).cast(pa.int32()))
        else:  # headers: the properties as a list of (key, value bytes)
            props = properties(pa.map_(pa.string(), pa.string()))
            entry = field.type.value_type
            pairs = pa.StructArray.from_arrays([props.keys, props.items.cast(pa.binary())], fields=list(entry))
            arrays.append(pa.ListArray.from_arrays(props.offsets, pairs, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def units_with_tags(units: bytes, codes: tuple[int, ...]) -> bytes:
    """The 20-byte ConsumeQueue units whose tag hash (the last 8 bytes) is one of codes (Arrow's
    compute kernels: no Python loop over the units)."""
    n = len(units) // UNIT
    if n == 0:
        return units
    import pyarrow.compute as pc

    arr = pa.Array.from_buffers(pa.binary(UNIT), n, [None, pa.py_buffer(units)])
    wanted = pa.array([c.to_bytes(8, "big", signed=True) for c in codes], pa.binary(8))
    kept = pc.filter(arr, pc.is_in(pc.binary_slice(arr, 12, 20), value_set=wanted))
    return kept.buffers()[1].to_pybytes()[kept.offset * UNIT:(kept.offset + len(kept)) * UNIT] if len(kept) else b""


class Reading:
    """What batch and stream readers share: the store, the columns and how a partition is read."""

    def __init__(self, options: Mapping[str, str], schema: StructType, kind: str = "read") -> None:
        self.take_options(options, kind, schema)
        root = self.options.get("path")
        if not root:
            raise OptionError('no store directory: spark.read.format("mqstore").load("/path/to/store") '
                              '(or option("namesrv", "host:9876") to read a cluster over the network)')
        self.root: str = root
        self.schema = schema

    def take_options(self, options: Mapping[str, str], kind: str, kernel_schema: StructType) -> None:
        """The options every reader checks and keeps (the network reader's too), and the columns
        the kernel fills for kernel_schema."""
        self.options = check_options(options, kind)
        self.columns = _columns(kernel_schema, include_headers=bool_option(self.options, "includeHeaders", False))
        self.batch_rows = int_option(self.options, "batchRows", DEFAULT_BATCH_ROWS)
        self.batch_bytes = int_option(self.options, "maxBatchBytes", DEFAULT_BATCH_BYTES, low=1024)
        self.fail_on_data_loss = bool_option(self.options, "failOnDataLoss", True)
        self.raw_body = bool_option(self.options, "rawBody", False)

    def _batch_columns(self) -> BatchColumns:
        names = [c for c in self.columns if c not in ("headers", COMMITLOG_ID.name)]
        if "headers" in self.columns and "properties" not in names:
            names.append("properties")
        if COMMITLOG_ID.name in self.columns and "commitlog_offset" not in names:
            names.append("commitlog_offset")
        return BatchColumns(names, decompress=not self.raw_body)

    def read_slices(self, partition: InputPartition) -> Iterator[Any]:
        with traceback_logged(f"reading {partition}"):
            yield from self._read_slices(partition)

    def _read_slices(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        with StoreSnapshot(self.root) as snap:
            sources: dict[int, Any] = {}

            def source_of(k: int) -> Any:
                """CommitLog k's files for the kernel (a store with several: a queue's log)."""
                if k not in sources:
                    sources[k] = snap.record_source(k)
                return sources[k]

            if isinstance(partition, (QueueSlice, QueueSlices)):
                for part in partition.parts if isinstance(partition, QueueSlices) else (partition,):
                    k = snap.log_of(part.topic, part.queue_id)
                    yield from self._read_queue_slice(snap, source_of(k), part, arrow_schema, snap.min_phys[k])
            elif isinstance(partition, PhySlice):
                # records in log order: those of one CommitLog after the other's
                by_log: dict[int, list[tuple[int, int]]] = {}
                for phy, size in partition.records:
                    by_log.setdefault(log_of(phy), []).append((phy, size))
                for k, records in by_log.items():
                    units = b"".join(struct.pack(">qiq", phy, size, 0) for phy, size in records)
                    for at in range(0, len(records), self.batch_rows):
                        cols = self._batch_columns()
                        cols.add_units(source_of(k), units[at * UNIT:(at + self.batch_rows) * UNIT], snap.min_phys[k])
                        if cols.rows:
                            yield record_batch(cols, arrow_schema)
            elif isinstance(partition, LogSlice):
                source = source_of(log_of(partition.start))  # a span never crosses CommitLogs
                at = partition.start
                while at < partition.end:
                    cols = self._batch_columns()
                    added, at = cols.add_span(source, at, partition.end, self.batch_rows, self.batch_bytes)
                    if not added:
                        break
                    yield record_batch(cols, arrow_schema)

    def _read_queue_slice(self, snap: StoreSnapshot, source: Any, partition: QueueSlice,
                          arrow_schema: pa.Schema, min_phy: int) -> Iterator[pa.RecordBatch]:
        first, units = snap.units_at(partition.topic, partition.queue_id, partition.start, partition.end)
        self._deleted(partition, partition.end - partition.start - len(units) // UNIT)
        if partition.tag_codes is not None:
            units, first = units_with_tags(units, partition.tag_codes), -1
        # columns the units alone say (a count, a groupBy on the queue) do not touch the
        # CommitLog: no record is read, no page of it faulted in
        queue_only = first >= 0 and self._batch_columns().queue_only
        at, n = 0, len(units) // UNIT
        while at < n:
            end = cut_units(units, at, self.batch_rows, 0 if queue_only else self.batch_bytes)
            cols = self._batch_columns()
            if queue_only:
                cols.add_queue_units(units[at * UNIT:end * UNIT], partition.topic, partition.queue_id,
                                     first + at, min_phy)
            else:
                cols.add_units(source, units[at * UNIT:end * UNIT], min_phy)
            at = end
            self._deleted(partition, cols.below_min)
            if cols.rows:
                yield record_batch(cols, arrow_schema)

    def _deleted(self, partition: QueueSlice, count: int) -> None:
        """Retention deleted count messages of the partition after it was planned: fail
        (failOnDataLoss, the default) or log them."""
        if count <= 0:
            return
        self.data_lost(f"queue {partition.topic}/{partition.queue_id}: {count} message(s) of offsets "
                       f"[{partition.start}, {partition.end}) were deleted by retention after the query planned to "
                       "read them")

    def data_lost(self, what: str) -> None:
        """Messages a partition was planned to read are gone: fail (failOnDataLoss, the
        default) or log what and read on."""
        if self.fail_on_data_loss:
            raise DataLossError(what)
        log.warning("%s; skipped (failOnDataLoss=false)", what)


def record_sizes(snap: StoreSnapshot, phys: list[int]) -> list[int]:
    from mqstore.queue._reads import view_at

    return [view_at(snap.log_map(log_of(phy)), phy).total_size for phy in phys]  # type: ignore[union-attr]


class DataLossError(MQStoreError, RuntimeError):
    """Offsets a query must read were deleted by retention."""

    hint = "read from the queue's earliest offset, or set option failOnDataLoss=false to skip them (reported)"


#: the options that mean nothing to mode=commitlog
_QUEUE_MODE_ONLY = frozenset(o.lower() for o in SELECT_OPTIONS + RANGE_OPTIONS + ("maxRowsPerPartition", "minPartitions"))


class MQStoreBatchReader(Reading, DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema, "read")
        self.mode = self.options.get("mode", "queues")
        if self.mode not in ("queues", "commitlog"):
            raise OptionError(f"option mode={self.mode!r}: expected queues or commitlog")
        if self.mode == "commitlog":
            moot = sorted(k for k in self.options if k in _QUEUE_MODE_ONLY)
            if moot:
                raise OptionError(f"option(s) {', '.join(moot)} pick queues or offsets, which mode=commitlog does not "
                                  "read by (it reads every record of the CommitLog in log order)")

    #: what pushFilters took (MQStorePushdownReader); None: nothing
    pushed: Pushed | None = None

    def partitions(self) -> list[InputPartition]:
        with StoreSnapshot(self.root) as snap:
            pushed = self.pushed
            if self.mode == "commitlog":  # a partition per CommitLog file (of the logs commitlog_id picks)
                logs = None if pushed is None else pushed.logs
                return [LogSlice(start, end) for start, end in snap.log_spans()
                        if logs is None or log_of(start) in logs]
            ranges = plan_queue_ranges(snap.queues(), self.options, snap.first_offset_at)
            if pushed is None:
                return packed(cut_ranges(ranges, self.options), self.options)
            if pushed.empty:
                return []
            ranges = [(q, *narrow(snap, q, s, e, pushed)) for q, s, e in ranges
                      if (pushed.topics is None or q.topic in pushed.topics)
                      and (pushed.queue_ids is None or q.queue_id in pushed.queue_ids)
                      and (pushed.logs is None or snap.log_of(q.topic, q.queue_id) in pushed.logs)]
            if pushed.described:
                log.info("mqstore read of %s: pushed %s", self.root, ", ".join(pushed.described))
            if pushed.lookup:
                spans = {q.key: (s, e) for q, s, e in ranges}
                phys = lookup_phys(snap, self.root, spans, {q.topic for q, _, _ in ranges}, pushed)
                sizes = record_sizes(snap, phys)
                records = tuple(zip(phys, sizes))
                return [PhySlice(records[at:at + self.batch_rows]) for at in range(0, len(records), self.batch_rows)]
            codes = None if pushed.tag_codes is None else tuple(sorted(pushed.tag_codes))
            return packed(cut_ranges(ranges, self.options, codes), self.options)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.read_slices(partition)


class MQStorePushdownReader(MQStoreBatchReader):
    """The batch reader with pushFilters (mqstore.spark.pushdown): used when the session has
    spark.sql.python.filterPushdown.enabled (mqstore.spark.session() and register() set it)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        if self.mode != "queues":  # commitlog_id alone picks files; Spark checks every filter
            self.pushed, _ = push([f for f in filters if getattr(f, "attribute", None) == (COMMITLOG_ID.name,)])
            return filters
        self.pushed, keep = push(list(filters))
        return keep
