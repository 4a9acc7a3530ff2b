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
                         file, every record in log order; topics/queues/offsets do not apply)
``maxRowsPerPartition``  queue offsets per partition (default 262144)
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
PySpark 4.3 offers, and the body and properties are the costly columns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqstore._arrow import INT32_COLUMNS, INT64_COLUMNS, NULLABLE_STRING_COLUMNS, STRING_COLUMNS, BatchColumns, cut_units
from mqstore.errors import MQStoreError
from mqstore.layout import CQ_STORE_UNIT_SIZE as UNIT
from mqstore.queue.snapshot import QueueRange, StoreSnapshot

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
DEFAULT_MAX_ROWS_PER_PARTITION = 262_144
log = logging.getLogger("mqstore.spark")
DEFAULT_BATCH_ROWS = 65_536
#: each of local[N]'s N tasks holds a batch and its copies (Arrow buffers, the JVM's read of
#: them) in direct memory, which defaults to the driver's heap (spark.driver.memory, 1 GiB)
DEFAULT_BATCH_BYTES = 16 << 20


class OptionError(MQStoreError, ValueError):
    """A read option that is not understood or asks for what the store does not hold."""

    hint = "see the options in the docstring of mqstore.spark.source (or docs/spark.md)"


# -- partitions ---------------------------------------------------------------------------------
@dataclass
class QueueSlice(InputPartition):
    """Queue offsets [start, end) of one ConsumeQueue."""

    topic: str
    queue_id: int
    start: int
    end: int


@dataclass
class LogSlice(InputPartition):
    """CommitLog bytes [start, end): whole records, in log order."""

    start: int
    end: int


# -- options --------------------------------------------------------------------------------
def int_option(options: dict[str, str], name: str, default: int, low: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if value < low:
        raise OptionError(f"option {name}={value} must be >= {low}")
    return value


def _offsets(options: dict[str, str], name: str, default: str) -> str | dict[str, int]:
    raw = options.get(name.lower(), default).strip()
    if raw in ("earliest", "latest"):
        return raw
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(k, str) and "/" in k and isinstance(v, int)
                                               and not isinstance(v, bool) for k, v in parsed.items()):
        raise OptionError(f'option {name}={raw!r}: expected earliest, latest or JSON like {{"topic/0": 42}}')
    return parsed


def _list_option(options: dict[str, str], name: str) -> list[str] | None:
    raw = options.get(name.lower())
    if raw is None or not raw.strip():
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def select_queues(queues: list[QueueRange], options: dict[str, str]) -> list[QueueRange]:
    """The queues the topics and queues options pick."""
    topics = _list_option(options, "topics")
    queue_ids_raw = _list_option(options, "queues")
    try:
        queue_ids = None if queue_ids_raw is None else {int(q) for q in queue_ids_raw}
    except ValueError:
        raise OptionError(f"option queues={options.get('queues')!r} must list queue ids (integers)") from None
    return [q for q in queues if (topics is None or q.topic in topics) and (queue_ids is None or q.queue_id in queue_ids)]


def _times(options: dict[str, str]) -> dict[str, int]:
    times = {}
    for name, offsets_name in (("startingTimestamp", "startingOffsets"), ("endingTimestamp", "endingOffsets")):
        if name.lower() in options:
            if offsets_name.lower() in options:
                raise OptionError(f"options {name} and {offsets_name} both say where to {name[:-9]}; give one")
            times[name] = int_option(options, name, 0, low=0)
    return times


def _check_named(queues: list[QueueRange], name: str, given: str | dict[str, int]) -> None:
    known = {q.key for q in queues}
    if isinstance(given, dict) and set(given) - known:
        raise OptionError(f"option {name} names queue(s) the store does not have: "
                          f"{', '.join(sorted(set(given) - known))}")


def starting_offsets(queues: list[QueueRange], options: dict[str, str],
                     offset_by_time: Callable[[QueueRange, int], int] | None,
                     known: list[QueueRange] | None = None) -> dict[str, int]:
    """{queue key: first offset to read} of queues by startingOffsets / startingTimestamp; an
    explicit offset below the earliest one still stored is an error naming the queue and the
    range, and so is JSON naming a queue not in known (default: queues)."""
    starting = _offsets(options, "startingOffsets", "earliest")
    times = _times(options)
    _check_named(queues if known is None else known, "startingOffsets", starting)
    out = {}
    for q in queues:
        if "startingTimestamp" in times:
            if offset_by_time is None:
                raise OptionError("timestamp options need the store's time lookup")
            start = offset_by_time(q, times["startingTimestamp"])
        elif starting == "latest":
            start = q.max_offset
        elif isinstance(starting, dict) and q.key in starting:
            start = starting[q.key]
            if start < q.min_offset:
                raise OptionError(f"queue {q.key}: startingOffsets asks for offset {start}, but offsets "
                                  f"[{start}, {q.min_offset}) are no longer stored (the earliest is {q.min_offset})")
        else:
            start = q.min_offset
        out[q.key] = start
    return out


def slices(q: QueueRange, start: int, end: int, per_partition: int) -> list[QueueSlice]:
    return [QueueSlice(q.topic, q.queue_id, at, min(end, at + per_partition)) for at in range(start, end, per_partition)]


def plan_queue_slices(queues: list[QueueRange], options: dict[str, str],
                      offset_by_time: Callable[[QueueRange, int], int] | None = None) -> list[QueueSlice]:
    """The partitions of a batch read in queue mode: the chosen queues, their [start, end) by
    the offset (or timestamp: offset_by_time(queue, ms), the store's time lookup) options,
    cut into maxRowsPerPartition pieces."""
    chosen = select_queues(queues, options)
    ending = _offsets(options, "endingOffsets", "latest")
    _check_named(queues, "endingOffsets", ending)
    times = _times(options)
    per_partition = int_option(options, "maxRowsPerPartition", DEFAULT_MAX_ROWS_PER_PARTITION)
    starts = starting_offsets(chosen, options, offset_by_time, known=queues)
    out = []
    for q in chosen:
        end = ending[q.key] if isinstance(ending, dict) and q.key in ending else q.max_offset
        if "endingTimestamp" in times:
            if offset_by_time is None:
                raise OptionError("timestamp options need the store's time lookup")
            end = offset_by_time(q, times["endingTimestamp"])
        out += slices(q, starts[q.key], min(end, q.max_offset), per_partition)
    return out


def _columns(schema: StructType) -> list[str]:
    """The columns a (possibly narrower, user-given) schema asks for; each must be one of
    SCHEMA's, with its type."""
    names = []
    for field in schema.fields:
        expected = _TYPES.get(field.name)
        if expected is None:
            raise OptionError(f"column {field.name!r} is not an mqstore column; the columns are "
                              f"{', '.join(_TYPES)}")
        if field.dataType != expected:
            raise OptionError(f"column {field.name!r} is {expected.simpleString()}, not "
                              f"{field.dataType.simpleString()}")
        names.append(field.name)
    return names


# -- Arrow ----------------------------------------------------------------------------------
def record_batch(cols: BatchColumns, arrow_schema: pa.Schema) -> pa.RecordBatch:
    """The kernel's buffers as a record batch of arrow_schema (no copy of the buffers)."""
    n = cols.rows
    buffers = cols.buffers()
    arrays = []
    for field in arrow_schema:
        bufs = buffers[field.name]
        name = field.name
        if name in INT32_COLUMNS or name in INT64_COLUMNS:
            arrays.append(pa.Array.from_buffers(field.type, n, [None, pa.py_buffer(bufs[0])]))
        elif name in STRING_COLUMNS:
            arrays.append(pa.Array.from_buffers(field.type, n, [None, pa.py_buffer(bufs[0]), pa.py_buffer(bufs[1])]))
        elif name in NULLABLE_STRING_COLUMNS:
            validity, offsets, data, nulls = bufs
            arrays.append(pa.Array.from_buffers(field.type, n, [None if validity is None else pa.py_buffer(validity),
                                                                pa.py_buffer(offsets), pa.py_buffer(data)],
                                                null_count=nulls))
        else:  # properties
            list_offsets, key_offsets, key_data, value_offsets, value_data = bufs
            pairs = int.from_bytes(bytes(memoryview(list_offsets)[-4:]), "little")
            keys = pa.Array.from_buffers(pa.string(), pairs, [None, pa.py_buffer(key_offsets), pa.py_buffer(key_data)])
            values = pa.Array.from_buffers(pa.string(), pairs,
                                           [None, pa.py_buffer(value_offsets), pa.py_buffer(value_data)])
            offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(list_offsets)])
            arrays.append(pa.MapArray.from_arrays(offsets, keys, values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


class Reading:
    """What batch and stream readers share: the store, the columns and how a partition is read."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = {k.lower(): v for k, v in options.items()}
        root = self.options.get("path")
        if not root:
            raise OptionError('no store directory: spark.read.format("mqstore").load("/path/to/store")')
        self.root: str = root
        self.columns = _columns(schema)
        self.schema = schema
        self.batch_rows = int_option(self.options, "batchRows", DEFAULT_BATCH_ROWS)
        self.batch_bytes = int_option(self.options, "maxBatchBytes", DEFAULT_BATCH_BYTES, low=1024)
        self.fail_on_data_loss = self.options.get("failondataloss", "true").lower() != "false"

    def read_slices(self, partition: InputPartition) -> Iterator[Any]:
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        with StoreSnapshot(self.root) as snap:
            source = snap.record_source()
            if isinstance(partition, QueueSlice):
                units = snap.units(partition.topic, partition.queue_id, partition.start, partition.end)
                self._deleted(partition, partition.end - partition.start - len(units) // UNIT)
                at, n = 0, len(units) // UNIT
                while at < n:
                    end = cut_units(units, at, self.batch_rows, self.batch_bytes)
                    cols = BatchColumns(self.columns)
                    cols.add_units(source, units[at * UNIT:end * UNIT], snap.min_phy)
                    at = end
                    self._deleted(partition, cols.below_min)
                    if cols.rows:
                        yield record_batch(cols, arrow_schema)
            elif isinstance(partition, LogSlice):
                at = partition.start
                while at < partition.end:
                    cols = BatchColumns(self.columns)
                    added, at = cols.add_span(source, at, partition.end, self.batch_rows, self.batch_bytes)
                    if not added:
                        break
                    yield record_batch(cols, arrow_schema)

    def _deleted(self, partition: QueueSlice, count: int) -> None:
        """Retention deleted count messages of the partition after it was planned: fail
        (failOnDataLoss, the default) or log them."""
        if count <= 0:
            return
        what = (f"queue {partition.topic}/{partition.queue_id}: {count} message(s) of offsets "
                f"[{partition.start}, {partition.end}) were deleted by retention after the query planned to read them")
        if self.fail_on_data_loss:
            raise DataLossError(what)
        log.warning("%s; skipped (failOnDataLoss=false)", what)


class DataLossError(MQStoreError, RuntimeError):
    """Offsets a query must read were deleted by retention."""

    hint = "read from the queue's earliest offset, or set option failOnDataLoss=false to skip them (reported)"


class MQStoreBatchReader(Reading, DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.mode = self.options.get("mode", "queues")
        if self.mode not in ("queues", "commitlog"):
            raise OptionError(f"option mode={self.mode!r}: expected queues or commitlog")

    def partitions(self) -> list[InputPartition]:
        with StoreSnapshot(self.root) as snap:
            if self.mode == "commitlog":
                return [LogSlice(start, end) for start, end in snap.log_spans()]
            return list(plan_queue_slices(snap.queues(), self.options, snap.offset_by_time))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.read_slices(partition)
