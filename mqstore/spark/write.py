"""Writing DataFrames into an mqstore store.

    df.write.format("mqstore").mode("append").save("/data/store")
    (df.writeStream.format("mqstore").option("sinkId", "orders-etl")
       .option("checkpointLocation", ckpt).start("/data/store"))

Rows become messages put through the same compiled put path and shared put lock as every
other writer: each Spark task attaches to the store's running owner (a node, or a process
that opened the store with ``MessageStore(dir)``, e.g. the driver) as an ``AttachedStore``. A
store nobody is serving is refused with an error saying how to serve it.

Columns (``topic`` and ``body`` are required; the others are optional, null means "not set"):

``topic``       string
``body``        binary or string (stored as its UTF-8 bytes)
``queue_id``    int: the queue; without it (or where null) a message goes to the queue the
                hash of its ``keys`` picks (RocketMQ's SelectMessageQueueByHash: Java
                ``String.hashCode``, ``abs(hash % queueCount)`` with Java's ``%``), else round-robin over
                ``queueCount`` queues per topic (each task starts at its partition id)
``tags``        string: the TAGS property
``keys``        string: the KEYS property (space-separated keys)
``properties``  map<string,string>: user properties

Other columns of the read schema (``mqstore.spark.SCHEMA``) are ignored, so a DataFrame
read from one store can be written into another; a column of any other name is an error.

Options: ``queueCount`` (queues per topic for hash and round-robin selection, default 4,
RocketMQ's defaultTopicQueueNums); streaming only: ``sinkId`` (required, ``[A-Za-z0-9._-]+``).

Only ``append`` is supported: the store is append-only, ``overwrite`` is refused.

Delivery: the batch writer is at-least-once (a task Spark retries puts its rows again). The
streaming writer is exactly-once per micro-batch: tasks stage their rows as Arrow IPC files;
the driver's ``commit(batchId)`` appends them, every message marked with the property
``MQSTORE_SINK_BATCH=<sinkId>:<batchId>``, and records the batch in
``config/spark_sinks/<sinkId>/state.json``. A replayed batch at or below the recorded one is
skipped; a batch whose append a crash interrupted (the state file says it was begun) counts the
marked messages already in the log and appends only the rest (rows are appended in a fixed
order: by task partition, then row order, so a replay that yields the same rows completes it).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, DataType, IntegerType, LongType, MapType, StringType, StructType

from mqstore._arrow import BatchColumns
from mqstore._codec import java_string_hash
from mqstore._commitlog import Message
from mqstore.errors import MQStoreError
from mqstore.queue.snapshot import StoreSnapshot
from mqstore.spark.source import SCHEMA, OptionError, int_option, record_batch
from mqstore.log.directory import lock_state, require_store
from mqstore.store import AttachedStore, StoreBase

log = logging.getLogger("mqstore.spark")

#: RocketMQ BrokerConfig.defaultTopicQueueNums
DEFAULT_QUEUE_COUNT = 4
#: the property that marks a message a streaming micro-batch wrote: "<sinkId>:<batchId>"
SINK_PROPERTY = "MQSTORE_SINK_BATCH"
_STRING, _MAP = StringType(), MapType(StringType(), StringType())
WRITE_TYPES: dict[str, tuple[DataType, ...]] = {
    "topic": (_STRING,),
    "body": (BinaryType(), _STRING),
    "queue_id": (IntegerType(), LongType()),
    "tags": (_STRING,),
    "keys": (_STRING,),
    "properties": (_MAP,),
}
_SINK_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
#: bytes of message bodies per put_messages call (well below max_message_size's 4 MiB default)
CHUNK_BYTES = 1 << 20
CHUNK_MESSAGES = 1024


class WriteError(MQStoreError, RuntimeError):
    """A row could not be written (the message names the row and the cause)."""

    hint = "fix the DataFrame's rows; messages put before the failing one stay in the store"


class NoOwnerError(MQStoreError, RuntimeError):
    """A write needs a running owner of the store, and there is none."""

    hint = ("serve the store while the job writes: `mqstore node DIR`, or in the driver "
            "`with mqstore.MessageStore(DIR): df.write...save(DIR)`")


# -- columns and rows ---------------------------------------------------------------------------
def _same_type(got: DataType, want: DataType) -> bool:
    """Types equal, a map's null-values flag aside (map('k', col) gives one that says none)."""
    if isinstance(got, MapType) and isinstance(want, MapType):
        return got.keyType == want.keyType and got.valueType == want.valueType
    return got == want


def write_columns(schema: StructType) -> list[str]:
    """The columns of schema that become message fields; an error names a missing required
    column, a column of the wrong type or one that is no mqstore column."""
    names = []
    for f in schema.fields:
        if f.name in WRITE_TYPES:
            if not any(_same_type(f.dataType, t) for t in WRITE_TYPES[f.name]):
                allowed = " or ".join(t.simpleString() for t in WRITE_TYPES[f.name])
                raise OptionError(f"column {f.name!r} is {f.dataType.simpleString()}; a write needs {allowed}")
            names.append(f.name)
        elif f.name not in SCHEMA.fieldNames():
            raise OptionError(f"column {f.name!r} is not an mqstore column; a write takes "
                              f"{', '.join(WRITE_TYPES)} (topic and body required)")
    for required in ("topic", "body"):
        if required not in names:
            raise OptionError(f"a write needs a {required!r} column (the columns are {', '.join(WRITE_TYPES)})")
    return names


@dataclass
class QueueChooser:
    """Which queue a message without a queue_id goes to: the hash of its keys, else round-robin
    per topic starting at start."""

    queue_count: int
    start: int = 0
    _next: dict[str, int] = field(default_factory=dict)

    def choose(self, topic: str, keys: str | None) -> int:
        if keys:
            return abs(java_string_hash(keys)) % self.queue_count  # = Java's abs(hash % n)
        at = self._next.get(topic, self.start)
        self._next[topic] = at + 1
        return at % self.queue_count


def batch_messages(batch: pa.RecordBatch, chooser: QueueChooser, marker: dict[str, str] | None = None,
                   row_base: int = 0) -> dict[tuple[str, int], list[Message]]:
    """The rows of batch as messages grouped by (topic, queue), each group in row order; marker
    properties are added to every message. Errors name the row (row_base + index)."""
    n = batch.num_rows
    names = batch.schema.names

    def col(name: str) -> list[Any]:
        return batch.column(names.index(name)).to_pylist() if name in names else [None] * n

    topics, bodies, queue_ids = col("topic"), col("body"), col("queue_id")
    tags, keys, props = col("tags"), col("keys"), col("properties")
    groups: dict[tuple[str, int], list[Message]] = {}
    for i in range(n):
        topic, body = topics[i], bodies[i]
        if topic is None:
            raise WriteError(f"row {row_base + i}: topic is null")
        if body is None:
            raise WriteError(f"row {row_base + i} (topic {topic}): body is null")
        if isinstance(body, str):
            body = body.encode()
        qid = queue_ids[i]
        if qid is None:
            qid = chooser.choose(topic, keys[i])
        elif not 0 <= qid < 1 << 31:
            raise WriteError(f"row {row_base + i} (topic {topic}): queue_id {qid} is negative or too large")
        properties = dict(props[i]) if props[i] else None
        if properties and None in properties.values():
            raise WriteError(f"row {row_base + i} (topic {topic}): property value of "
                             f"{next(k for k, v in properties.items() if v is None)!r} is null")
        if marker:
            properties = {**properties, **marker} if properties else marker
        groups.setdefault((topic, qid), []).append(
            Message(topic, body, queue_id=qid, tags=tags[i], keys=keys[i], properties=properties))
    return groups


def chunks(messages: list[Message]) -> Iterator[list[Message]]:
    """messages cut into put_messages calls of at most CHUNK_MESSAGES / about CHUNK_BYTES."""
    at, n = 0, len(messages)
    while at < n:
        size, end = 0, at
        while end < n and end - at < CHUNK_MESSAGES and (size == 0 or size + len(messages[end].body) <= CHUNK_BYTES):
            size += len(messages[end].body)
            end += 1
        yield messages[at:end]
        at = end


def put_groups(store: Any, groups: dict[tuple[str, int], list[Message]], skip: int = 0,
               on_chunk: Callable[[int], None] | None = None) -> int:
    """Put every group (in order) with put_messages; the first skip messages (in that order) are
    left out. Returns how many were put. A failed put raises WriteError naming the status."""
    put = 0
    for (topic, qid), messages in groups.items():
        for chunk in chunks(messages):
            if skip >= len(chunk):
                skip -= len(chunk)
                continue
            chunk, skip = chunk[skip:], 0
            result = store.put_messages(chunk)
            if not result.status.is_stored:
                raise WriteError(f"putting {len(chunk)} message(s) into {topic}/{qid} failed: "
                                 f"{result.status.name}" + (f" ({result.detail})" if result.detail else ""))
            put += len(chunk)
            if on_chunk is not None:
                on_chunk(put)
    return put


def require_owner(root: str) -> str:
    """root (absolute) if a running owner serves it; NoOwnerError otherwise."""
    root = require_store(root)
    if lock_state(root)["status"] != "running":
        raise NoOwnerError(f"{root}: no store is running on it; Spark writes go through a running owner's put path")
    return root


def attach(root: str) -> AttachedStore:
    """The store at root, attached to its running owner; NoOwnerError if nobody serves it."""
    return AttachedStore(require_owner(root))


def _root(options: dict[str, str]) -> str:
    root = options.get("path")
    if not root:
        raise OptionError('no store directory: df.write.format("mqstore").mode("append").save("/path/to/store")')
    return root


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError('save mode overwrite: an mqstore store is append-only; write with .mode("append") '
                          "(outputMode append for streams)")


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


# -- batch writes ---------------------------------------------------------------------------
@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote (batch) or staged (streaming)."""

    partition: int
    messages: int
    path: str | None = None


class MQStoreBatchWriter(DataSourceArrowWriter):
    """``df.write.format("mqstore").mode("append").save(dir)``: each task puts its rows."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options = {k.lower(): v for k, v in options.items()}
        write_columns(schema)  # refuses a missing, unknown or mistyped column
        self.queue_count = int_option(self.options, "queueCount", DEFAULT_QUEUE_COUNT)
        self.root = require_owner(_root(self.options))  # fail at planning, not in every task

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        part = _partition_id()
        chooser = QueueChooser(self.queue_count, part)
        written = rows = 0
        with attach(self.root) as store:
            for batch in iterator:
                written += put_groups(store, batch_messages(batch, chooser, row_base=rows))
                rows += batch.num_rows
        return WriteReport(part, written)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, WriteReport))
        log.info("mqstore write into %s: %d message(s) from %d task(s)", self.root, total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.messages for m in messages if isinstance(m, WriteReport))
        log.warning("mqstore write into %s failed; the %d message(s) successful tasks put stay in the store "
                    "(it is append-only)", self.root, done)


# -- streaming writes -----------------------------------------------------------------------
def sink_dir(root: str, sink_id: str) -> str:
    return os.path.join(root, "config", "spark_sinks", sink_id)


def _write_json(path: str, value: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def count_marked(store: StoreBase, start: int, marker: str, wait_s: float = 30.0) -> int:
    """Messages at CommitLog offsets >= start whose SINK_PROPERTY is marker, once the store has
    dispatched everything written when this is called (so none is missed)."""
    target = store.max_phy_offset
    if not store.wait_dispatched(target, wait_s * 1000):
        raise WriteError(f"{store.root}: the store did not dispatch up to {target} within {wait_s:.0f} s; "
                         "cannot tell how much of an interrupted micro-batch was written")
    schema = pa.schema([pa.field("properties", pa.map_(pa.string(), pa.string()))])
    found = 0
    with StoreSnapshot(store.root) as snap:
        source = snap.record_source()
        for span_start, span_end in snap.log_spans():
            at = max(span_start, start)
            while at < span_end:
                cols = BatchColumns(["properties"])
                added, at = cols.add_span(source, at, span_end, 65_536)
                if not added:
                    break
                props = record_batch(cols, schema).column(0)
                found += pc.sum(pc.equal(pc.map_lookup(props, SINK_PROPERTY, "first"), marker)).as_py() or 0
    return found


class SinkLog:
    """The applied micro-batches of one streaming sink: ``state.json`` ({"last_batch": id,
    "pending": {"batch", "start", "rows"} or null}) under ``config/spark_sinks/<sinkId>/``,
    changed under an flock of ``lock`` there."""

    def __init__(self, root: str, sink_id: str) -> None:
        if not _SINK_ID.match(sink_id):
            raise OptionError(f"option sinkId={sink_id!r}: use 1 to 128 of A-Z a-z 0-9 . _ -")
        self.root = root
        self.sink_id = sink_id
        self.dir = sink_dir(root, sink_id)
        self.staging = os.path.join(self.dir, "staging")
        self.state_path = os.path.join(self.dir, "state.json")

    def state(self) -> dict[str, Any]:
        try:
            with open(self.state_path) as f:
                state: dict[str, Any] = json.load(f)
        except FileNotFoundError:
            return {"last_batch": -1, "pending": None}
        return state

    def apply(self, batch_id: int, files: list[str], on_chunk: Callable[[int], None] | None = None) -> int:
        """Append the rows of the staged files (in order) as micro-batch batch_id, once: a batch
        already applied is skipped, an interrupted one completed. Returns the messages put.
        on_chunk(n) is called after each put with the messages put so far (tests kill there)."""
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.state()
            if batch_id <= state["last_batch"]:
                log.info("sink %s: micro-batch %d was applied before (last %d); skipped", self.sink_id, batch_id,
                         state["last_batch"])
                self._clear_staging()
                return 0
            marker = f"{self.sink_id}:{batch_id}"
            pending = state.get("pending")
            done = 0
            with attach(self.root) as store:
                if pending and pending["batch"] == batch_id:
                    done = count_marked(store, pending["start"], marker)
                    log.warning("sink %s: micro-batch %d was interrupted after %d message(s); appending the rest",
                                self.sink_id, batch_id, done)
                else:
                    if pending:
                        log.warning("sink %s: micro-batch %d was begun and never finished; now %d is written",
                                    self.sink_id, pending["batch"], batch_id)
                    state["pending"] = {"batch": batch_id, "start": store.max_phy_offset}
                    _write_json(self.state_path, state)
                put = 0
                for path in files:
                    with pa.memory_map(path) as source:
                        reader = pa.ipc.open_file(source)
                        chooser = QueueChooser(int(reader.schema.metadata[b"queue_count"]),
                                               int(reader.schema.metadata[b"partition"]))
                        for i in range(reader.num_record_batches):
                            groups = batch_messages(reader.get_batch(i), chooser, {SINK_PROPERTY: marker})
                            n = sum(len(g) for g in groups.values())
                            skip = min(done, n)
                            done -= skip
                            base = put
                            put += put_groups(store, groups, skip,
                                              None if on_chunk is None else lambda n: on_chunk(base + n))
            _write_json(self.state_path, {"last_batch": batch_id, "pending": None})
            self._clear_staging()
            return put

    def _clear_staging(self) -> None:
        """Staged files are only needed until their micro-batch is applied; a micro-batch's
        tasks run after the previous one's commit, so everything staged now is done with."""
        shutil.rmtree(self.staging, ignore_errors=True)


class MQStoreStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mqstore").option("sinkId", ...)``: exactly-once per micro-batch."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options = {k.lower(): v for k, v in options.items()}
        self.root = _root(self.options)
        write_columns(schema)  # refuses a missing, unknown or mistyped column
        self.queue_count = int_option(self.options, "queueCount", DEFAULT_QUEUE_COUNT)
        sink_id = self.options.get("sinkid")
        if not sink_id:
            raise OptionError("a streaming write needs option sinkId: a name for the sink, under which the store "
                              "records the micro-batches it applied (so a replayed one is not written twice)")
        self.sink = SinkLog(require_store(self.root), sink_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        """Stage the task's rows as an Arrow IPC file; commit appends them."""
        part = _partition_id()
        os.makedirs(self.sink.staging, exist_ok=True)
        path = os.path.join(self.sink.staging, f"part-{part:05d}-{uuid.uuid4().hex}.arrow")
        rows = 0
        writer = None
        try:
            for batch in iterator:
                if writer is None:
                    meta = {b"partition": str(part).encode(), b"queue_count": str(self.queue_count).encode()}
                    writer = pa.ipc.new_file(path, batch.schema.with_metadata(meta))
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        return WriteReport(part, rows, path if writer is not None else None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        reports = sorted((m for m in messages if isinstance(m, WriteReport) and m.path), key=lambda m: m.partition)
        self.sink.apply(batchId, [m.path for m in reports if m.path])

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for m in messages:
            if isinstance(m, WriteReport) and m.path:
                try:
                    os.unlink(m.path)
                except FileNotFoundError:
                    pass
        log.warning("sink %s: micro-batch %d aborted; nothing of it was written", self.sink.sink_id, batchId)
