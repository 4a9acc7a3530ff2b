"""Rows to messages, shared by every sink: the batch writer (mqstore.spark.write), the
streaming writer (mqstore.spark.sink) and, for their columns, queue choice and row checks, the
network writers (mqstore.spark.remote.writer).

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

Other columns of the read schema (``mqstore.spark.SCHEMA``, and the optional ``commitlog_id``)
are ignored, so a DataFrame read from one store can be written into another; a column of any
other name is an error.

Options: ``queueCount`` (queues per topic for hash and round-robin selection, default 4,
RocketMQ's defaultTopicQueueNums); streaming only: ``sinkId`` (required, ``[A-Za-z0-9._-]+``).

Only ``append`` is supported: the store is append-only, ``overwrite`` is refused.

Every row is checked before anything of its task is put, with the put path's own rules
(``check_rows``): a bad row fails the task with a ``WriteError`` naming the Spark partition,
the row's place in it, its topic and keys, and what is wrong (with the status a put would
answer).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import BinaryType, DataType, IntegerType, LongType, MapType, StringType, StructType

from mqstore.queue._arrow import BatchColumns
from mqstore.layout import log_of
from mqstore.log._codec import java_string_hash, record_length
from mqstore.log._message import MessageBatch, properties_problem_of, topic_problem_of
from mqstore.config import StoreConfig
from mqstore.errors import MQStoreError
from mqstore.log.directory import lock_state, require_store
from mqstore.node.settings import read_config
from mqstore.queue.snapshot import StoreSnapshot
from mqstore.spark.options import OptionError
from mqstore.spark.source import COMMITLOG_ID, SCHEMA, record_batch
from mqstore.spark.worker import settle_worker
from mqstore.store import AttachedStore, StoreBase

T = TypeVar("T")

#: RocketMQ BrokerConfig.defaultTopicQueueNums
DEFAULT_QUEUE_COUNT = 4
#: the property that marks a message a streaming micro-batch wrote: "<sinkId>:<batchId>"
SINK_PROPERTY = "MQSTORE_SINK_BATCH"
#: the property that marks a message a batch write's task put: "<writeId>:<partition>"
TASK_PROPERTY = "MQSTORE_WRITE_TASK"
_STRING, _MAP = StringType(), MapType(StringType(), StringType())
WRITE_TYPES: dict[str, tuple[DataType, ...]] = {
    "topic": (_STRING,),
    "body": (BinaryType(), _STRING),
    "queue_id": (IntegerType(), LongType()),
    "tags": (_STRING,),
    "keys": (_STRING,),
    "properties": (_MAP,),
}
#: record bytes per put_messages call (and never more than max_message_size or a CommitLog file)
CHUNK_BYTES = 1 << 20
CHUNK_MESSAGES = 1024
#: the put path's limit on a message's properties (UTF-8 bytes)
MAX_PROPERTIES_BYTES = 32767
#: a record's bytes besides its body, topic and properties with IPv4 hosts, plus 24 for IPv6 ones
_RECORD_FIXED = record_length(0, 0, 0) + 24


class WriteError(MQStoreError, RuntimeError):
    """A row could not be written (the message names the row and the cause)."""

    hint = "fix the DataFrame's rows; nothing of the failing task was written (docs/spark.md, Writes)"


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
        elif f.name not in SCHEMA.fieldNames() and f.name != COMMITLOG_ID.name:
            raise OptionError(f"column {f.name!r} is not an mqstore column; a write takes "
                              f"{', '.join(WRITE_TYPES)} (topic and body required)")
    for required in ("topic", "body"):
        if required not in names:
            raise OptionError(f"a write needs a {required!r} column (the columns are {', '.join(WRITE_TYPES)})")
    return names


_DEFAULTS = StoreConfig()


@dataclass(frozen=True)
class RowLimits:
    """What the store's put path accepts (from its owner's configuration), and how full
    staging may make the disk."""

    max_message_size: int = _DEFAULTS.max_message_size
    file_size: int = _DEFAULTS.mapped_file_size_commit_log
    max_topic_length: int = _DEFAULTS.max_topic_length
    disk_ratio: float = _DEFAULTS.disk_space_warning_level_ratio / 100

    @classmethod
    def of(cls, config: StoreConfig) -> RowLimits:
        return cls(config.max_message_size, config.mapped_file_size_commit_log, config.max_topic_length,
                   config.disk_space_warning_level_ratio / 100)

    @classmethod
    def of_store(cls, root: str) -> RowLimits:
        """The limits of the store at root (RocketMQ's defaults when mqstore never opened it)."""
        try:
            return cls.of(read_config(root))
        except FileNotFoundError:
            return cls()

    @property
    def chunk_bytes(self) -> int:
        return min(CHUNK_BYTES, self.max_message_size, self.file_size - 8)


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


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def _n(value: int) -> pa.Scalar:
    """value as an Arrow int64 scalar (a Python int given to a compute function costs a failed
    import of numpy every call)."""
    return pa.scalar(value, pa.int64())


_ZERO, _FALSE = _n(0), pa.scalar(False)


def _strings_bad(arr: pa.Array | None) -> pa.Array | pa.Scalar:
    """Per row: set and empty, or holding a property separator (\\x01, \\x02)."""
    if arr is None or len(arr) == 0:
        return _FALSE
    bad = pc.or_(pc.equal(pc.binary_length(arr), _ZERO),
                 pc.or_(pc.match_substring(arr, "\x01"), pc.match_substring(arr, "\x02")))
    return pc.fill_null(bad, _FALSE)


def _bytes(arr: pa.Array, plus: int = 0) -> pa.Array:
    """Per row: the UTF-8 (or binary) bytes of arr plus plus, 0 where null."""
    return pc.fill_null(pc.add(pc.binary_length(arr).cast(pa.int64()), _n(plus)), _ZERO)


def _map_sums(props: pa.MapArray) -> tuple[pa.Array, pa.Array]:
    """Per row of a map column: the bytes of its pairs as name\\x01value\\x02, and how many of
    its pairs cannot be stored (a null or empty name or value, a separator in either)."""
    keys, items = props.keys, props.items  # the whole children; offsets index into them
    pair_bytes = pc.add(_bytes(keys, 2), _bytes(items))
    bad = pc.or_(pc.is_null(items), pc.or_(_strings_bad(keys), _strings_bad(items))).cast(pa.int64())
    offsets = props.offsets
    sums = []
    for per_pair in (pair_bytes, bad):
        ends = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(per_pair)])
        per_row = pc.subtract(pc.take(ends, offsets[1:]), pc.take(ends, offsets[:-1]))
        sums.append(pc.if_else(pc.is_null(props), _ZERO, per_row))
    return sums[0], sums[1]


def _sizes(batch: pa.RecordBatch, marker: dict[str, str]) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array | None]:
    """Per row: upper bounds of its properties' bytes (user properties, TAGS, KEYS and marker,
    each as name\\x01value\\x02) and of its record's bytes, its body's bytes, and (with a
    properties column) how many of its properties cannot be stored."""
    tags, keys, props = _column(batch, "tags"), _column(batch, "keys"), _column(batch, "properties")
    prop_bytes = _n(sum(len(k.encode()) + len(v.encode()) + 2 for k, v in marker.items()))
    for arr, name in ((tags, "TAGS"), (keys, "KEYS")):
        if arr is not None:
            prop_bytes = pc.add(prop_bytes, _bytes(arr, len(name) + 2))
    bad_pairs = None
    if props is not None:
        pair_bytes, bad_pairs = _map_sums(props)
        prop_bytes = pc.add(prop_bytes, pair_bytes)
    body_bytes = _bytes(batch.column(batch.schema.get_field_index("body")))
    topic_bytes = _bytes(batch.column(batch.schema.get_field_index("topic")), _RECORD_FIXED)
    return prop_bytes, pc.add(pc.add(body_bytes, prop_bytes), topic_bytes), body_bytes, bad_pairs


def check_rows(batch: pa.RecordBatch, limits: RowLimits, marker: dict[str, str], partition: int,
               row_base: int = 0) -> list[int]:
    """Check every row of batch against the put path's rules before anything is put; return
    each row's record bytes (an upper bound, for cutting puts into chunks). A bad row raises
    WriteError naming the Spark partition, the row (row_base + its index), its topic and keys,
    and what is wrong. Vectorized: rows that might break a rule are picked with Arrow
    kernels, and only those are judged one by one with the put path's own checks."""
    topic, body, queue_id = _column(batch, "topic"), _column(batch, "body"), _column(batch, "queue_id")
    assert topic is not None and body is not None
    prop_bytes, record, body_bytes, bad_pairs = _sizes(batch, marker)
    suspect = pc.or_(pc.is_null(topic), pc.is_null(body))
    if bad_pairs is not None:
        suspect = pc.or_(suspect, pc.greater(bad_pairs, _ZERO))
    bad_topics = [t for t in pc.unique(topic).to_pylist()
                  if t is not None and topic_problem_of(t, limits.max_topic_length) is not None]
    if bad_topics:
        suspect = pc.or_(suspect, pc.fill_null(pc.is_in(topic, pa.array(bad_topics, pa.string())), _FALSE))
    if queue_id is not None:
        qid = queue_id.cast(pa.int64())
        suspect = pc.or_(suspect, pc.fill_null(pc.or_(pc.less(qid, _ZERO), pc.greater(qid, _n(2**31 - 1))), _FALSE))
    suspect = pc.or_(suspect, pc.or_(_strings_bad(_column(batch, "tags")), _strings_bad(_column(batch, "keys"))))
    suspect = pc.or_(suspect, pc.or_(
        pc.greater(prop_bytes, _n(MAX_PROPERTIES_BYTES)),
        pc.or_(pc.greater(pc.add(body_bytes, prop_bytes), _n(limits.max_message_size - 22)),
               pc.greater(record, _n(limits.file_size - 8)))))
    for i in pc.indices_nonzero(suspect).to_pylist():
        row = batch.slice(i, 1)
        problem = row_problem(row, limits, marker)
        if problem is not None:
            values = row.to_pylist()[0]
            named = [f"{name} {values[name]!r}" if values.get(name) is not None else f"no {name}"
                     for name in ("topic", "keys")]
            raise WriteError(f"Spark partition {partition}, row {row_base + i} of the partition ({', '.join(named)}): "
                             f"{problem}")
    weights: list[int] = record.to_pylist()
    return weights


def _properties(tags: str | None, keys: str | None, pairs: list[tuple[str, str]] | None) -> str:
    """The properties string (spec §1.4) of a row's message before the write's marker: TAGS,
    KEYS and its user properties (one named TAGS or KEYS gives way to the column, as in
    Message)."""
    parts = []
    if tags is not None:
        parts.append("TAGS\x01" + tags)
    if keys is not None:
        parts.append("KEYS\x01" + keys)
    if pairs:
        parts.extend(f"{k}\x01{v}" for k, v in pairs
                     if not (k == "TAGS" and tags is not None or k == "KEYS" and keys is not None))
    return "\x02".join(parts)


def _marker_string(marker: dict[str, str]) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in marker.items())


def row_problem(row: pa.RecordBatch, limits: RowLimits, marker: dict[str, str]) -> str | None:
    """Why the put path would refuse the message of the one-row batch row (put as staged,
    marker added), with the status a put would answer, or None."""
    values = row.to_pylist()[0]
    topic, body, queue_id = values["topic"], values["body"], values.get("queue_id")
    tags, keys, pairs = values.get("tags"), values.get("keys"), values.get("properties")
    if topic is None:
        return "topic is null"
    if body is None:
        return "body is null"
    if pairs and any(v is None for _, v in pairs):
        return f"property value of {next(k for k, v in pairs if v is None)!r} is null"
    illegal = "(a put would answer MESSAGE_ILLEGAL)"
    if queue_id is not None and not 0 <= queue_id < 1 << 31:
        return f"queue_id {queue_id} is negative or too large {illegal}"
    problem = topic_problem_of(topic, limits.max_topic_length)
    if problem is not None:
        return f"{problem} {illegal}"
    properties = {**dict(pairs or ()), **({"TAGS": tags} if tags is not None else {}),
                  **({"KEYS": keys} if keys is not None else {}), **marker}
    problem = properties_problem_of(properties)
    if problem is not None:
        return f"{problem} {illegal}"
    inner = len(_properties(tags, keys, pairs).encode())
    stored = inner + len(_marker_string(marker).encode()) + (1 if inner and marker else 0)
    if stored > MAX_PROPERTIES_BYTES:  # a client batch item holds at most 32767 bytes of its own
        return (f"properties (user properties, TAGS, KEYS and the write's marker) are {stored} UTF-8 bytes, "
                f"more than {MAX_PROPERTIES_BYTES} " + (illegal if inner > MAX_PROPERTIES_BYTES else
                                                        "(a put would answer PROPERTIES_SIZE_EXCEEDED)"))
    body_len = len(body.encode() if isinstance(body, str) else body)
    if 22 + body_len + inner > limits.max_message_size:
        return (f"body is {body_len} bytes: with its properties more than the store's "
                f"max_message_size={limits.max_message_size} {illegal}")
    size = record_length(body_len, len(topic.encode()), stored) + 24
    if size + 8 > limits.file_size:
        return (f"the record of about {size} bytes does not fit in a CommitLog file of the store "
                f"(mapped_file_size_commit_log={limits.file_size}) {illegal}")
    return None


#: a client batch item's head (spec §1.10): TOTALSIZE, MAGIC, BODYCRC, FLAG (all 0), BODYLEN
_ITEM_HEAD = struct.Struct(">I12xI")
_ITEM_PROPS_LEN = struct.Struct(">H")
Groups = dict[tuple[str, int], tuple[list[bytes], list[int]]]


def encode_rows(batch: pa.RecordBatch, chooser: QueueChooser, weights: list[int]) -> Groups:
    """The rows of batch (checked by check_rows, which gave weights) as client batch items
    (spec §1.10, what put_messages takes in a MessageBatch) grouped by (topic, queue), each
    group in row order with each item's record bytes."""
    n = batch.num_rows
    names = batch.schema.names

    def col(name: str) -> list[Any]:
        if name not in names:
            return [None] * n
        arr = batch.column(names.index(name))
        return (arr.cast(pa.binary()) if name == "body" else arr).to_pylist()  # a string body as its UTF-8

    topics, bodies, queue_ids = col("topic"), col("body"), col("queue_id")
    tags, keys, pairs = col("tags"), col("keys"), col("properties")
    head, props_len = _ITEM_HEAD.pack, _ITEM_PROPS_LEN.pack
    groups: Groups = {}
    for i in range(n):
        topic, qid, body = topics[i], queue_ids[i], bodies[i]
        if qid is None:
            qid = chooser.choose(topic, keys[i])
        props = _properties(tags[i], keys[i], pairs[i]).encode()
        items, sizes = groups.setdefault((topic, qid), ([], []))
        items.append(b"".join((head(22 + len(body) + len(props), len(body)), body, props_len(len(props)), props)))
        sizes.append(weights[i])
    return groups


def chunks(items: list[T], sizes: list[int], max_bytes: int) -> Iterator[list[T]]:
    """items cut into put_messages calls of at most CHUNK_MESSAGES items and max_bytes record
    bytes (an item bigger than that alone)."""
    at, n = 0, len(items)
    while at < n:
        size, end = 0, at
        while end < n and end - at < CHUNK_MESSAGES and (size == 0 or size + sizes[end] <= max_bytes):
            size += sizes[end]
            end += 1
        yield items[at:end]
        at = end


#: what is staged: a row per put_messages call to come
STAGED = pa.schema([("topic", pa.string()), ("queue_id", pa.int32()), ("messages", pa.int32()), ("body", pa.binary())])


def staged_batch(groups: Groups, max_bytes: int) -> pa.RecordBatch:
    """groups cut into put_messages calls, a row each: topic, queue_id, messages, and the
    client batch body."""
    calls = [(topic, qid, len(chunk), b"".join(chunk))
             for (topic, qid), (items, sizes) in groups.items() for chunk in chunks(items, sizes, max_bytes)]
    return pa.record_batch([pa.array([c[i] for c in calls], f.type) for i, f in enumerate(STAGED)], schema=STAGED)


def _skip_items(body: bytes, count: int) -> bytes:
    """body without its first count items (each starts with its TOTALSIZE)."""
    at = 0
    for _ in range(count):
        at += int.from_bytes(body[at:at + 4], "big")
    return body[at:]


def put_staged(store: Any, staged: pa.RecordBatch, marker: dict[str, str], skip: int = 0,
               on_chunk: Callable[[int], None] | None = None) -> int:
    """Make the put_messages calls of a staged batch in order, marker the batch properties of
    each (so every message carries it), leaving out the first skip messages. Returns how many
    were put; on_chunk(n) is called after each put with the messages put so far. A failed put
    raises WriteError naming the status."""
    put = 0
    for topic, qid, count, body in zip(*(staged.column(i).to_pylist() for i in range(len(STAGED)))):
        if skip >= count:
            skip -= count
            continue
        if skip:
            body, count, skip = _skip_items(body, skip), count - skip, 0
        result = store.put_messages(MessageBatch(topic, body, queue_id=qid, properties=marker))
        if not result.status.is_stored:
            raise WriteError(f"putting {count} message(s) into {topic}/{qid} failed: "
                             f"{result.status.name}" + (f" ({result.detail})" if result.detail else ""),
                             hint="the store refused the put; once it takes puts again, a retry of the "
                                  "task puts only what is missing")
        put += count
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


def _task() -> tuple[int, int]:
    """(partition id, attempt number) of the running Spark task; (0, 0) outside one. Writers
    call it first: it settles the Python worker too (settle_worker)."""
    from pyspark import TaskContext

    settle_worker()

    ctx = TaskContext.get()
    return (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)


# -- staging ------------------------------------------------------------------------------------
def _check_room(directory: str, need: int, limits: RowLimits) -> None:
    st = os.statvfs(directory)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if entire > 0 and (used + need) / entire > limits.disk_ratio:
        raise WriteError(f"staging {need} more bytes under {directory} would fill its disk past "
                         f"{limits.disk_ratio:.0%} (disk_space_warning_level_ratio, where the store refuses puts); "
                         "nothing of this task was written",
                         hint="free disk space, or write in more, smaller partitions (df.repartition(n))")


@dataclass
class RowStager:
    """What a task does to each batch of its rows before staging it: keep the write's columns,
    check every row (check_rows, naming bad ones by partition and row), and encode them into
    the put_messages calls to come, with the task's queue choice."""

    columns: list[str]
    limits: RowLimits
    marker: dict[str, str]  # the write's marker (or one as long), for the size checks
    partition: int
    queue_count: int
    rows: int = 0

    def __post_init__(self) -> None:
        self.chooser = QueueChooser(self.queue_count, self.partition)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = batch.select(self.columns)
        weights = check_rows(batch, self.limits, self.marker, self.partition, self.rows)
        self.rows += batch.num_rows
        return staged_batch(encode_rows(batch, self.chooser, weights), self.limits.chunk_bytes)


def stage_rows(batches: Iterable[pa.RecordBatch], path: str, stager: RowStager) -> int:
    """Stage batches into the Arrow IPC file path, each made by stager into the put_messages
    calls to come (so no row is put before every row is checked, and the encoding runs while
    Spark still feeds the task); returns the rows. On any failure the file is removed."""
    writer = None
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            staged = stager(batch)
            _check_room(os.path.dirname(path), staged.nbytes, stager.limits)
            if writer is None:
                writer = pa.ipc.new_file(path, STAGED)
            writer.write_batch(staged)
        if writer is not None:
            writer.close()
    except BaseException as exc:
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if isinstance(exc, OSError):
            raise WriteError(f"staging the task's rows in {path} failed: {exc}; nothing of this task was "
                             "written") from exc
        raise
    return stager.rows


def append_staged(store: StoreBase, paths: list[str], marker: dict[str, str], done: int = 0,
                  on_chunk: Callable[[int], None] | None = None) -> int:
    """Put what the staged files hold, in order, every message marked with marker, leaving out
    the first done messages (in that order: what an interrupted append put). Returns how many
    were put; on_chunk(n) is called after each put with the messages put so far."""
    put = 0
    for path in paths:
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                staged = reader.get_batch(i)
                skip = min(done, pc.sum(staged.column("messages")).as_py() or 0)
                done -= skip
                base = put
                put += put_staged(store, staged, marker, skip, None if on_chunk is None else lambda n: on_chunk(base + n))
    return put


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


def _read_json(path: str, default: dict[str, Any]) -> dict[str, Any]:
    try:
        with open(path) as f:
            value: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return dict(default)
    return value


def count_marked(store: StoreBase, start: int, prop: str, marker: str, wait_s: float = 30.0) -> int:
    """Messages at CommitLog offsets >= start whose property prop is marker, once the store has
    dispatched everything written when this is called (so none is missed)."""
    target = store.max_phy_offset
    if not store.wait_dispatched(target, wait_s * 1000):
        raise WriteError(f"{store.root}: the store did not dispatch up to {target} within {wait_s:.0f} s; "
                         "cannot tell how much of an interrupted append was written")
    schema = pa.schema([pa.field("properties", pa.map_(pa.string(), pa.string()))])
    found = 0
    with StoreSnapshot(store.root) as snap:
        for span_start, span_end in snap.log_spans():
            if log_of(span_start) != log_of(start):
                continue  # (start is an offset of one CommitLog: the appended records are in it)
            source = snap.record_source(log_of(span_start))
            at = max(span_start, start)
            while at < span_end:
                cols = BatchColumns(["properties"])
                added, at = cols.add_span(source, at, span_end, 65_536)
                if not added:
                    break
                props = record_batch(cols, schema).column(0)
                found += pc.sum(pc.equal(pc.map_lookup(props, prop, "first"), marker)).as_py() or 0
    return found


# -- what a task reports ------------------------------------------------------------------------
@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote (batch) or staged (streaming)."""

    partition: int
    messages: int
    path: str | None = None
