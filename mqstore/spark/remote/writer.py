"""Writing DataFrames into a RocketMQ cluster over the network: ``format("mqstore")`` with
option ``namesrv``, each task sending its rows with ``mqstore.client.SyncProducer``.

    df.write.format("mqstore").option("namesrv", "ns:9876").mode("append").save()
    (df.writeStream.format("mqstore").option("namesrv", "ns:9876").option("sinkId", "orders-etl")
       .option("checkpointLocation", ckpt).start())

Columns are the local sink's (mqstore.spark.rows.WRITE_TYPES: ``topic`` and ``body`` required,
``queue_id``, ``tags``, ``keys``, ``properties``), and ``broker`` (string, optional: the broker
name). A row goes to one of the topic's write queues (its route's, every broker's, sorted by
broker then queue id) that fit its ``broker`` and ``queue_id``: the only one, else the one the
hash of its keys picks (as mqstore.spark.rows.QueueChooser: Java's String.hashCode), else
round-robin from the task's partition id. Rows sharing a queue go as batches
(SEND_BATCH_MESSAGE) of up to 1,024 messages / about 1 MiB (mqstore.spark.rows.chunks).
Properties RocketMQ reserves (UNIQ_KEY, TAGS, KEYS, ... : mqstore.client.protocol.SYSTEM_PROPERTIES)
are left out of the properties column: the producer sets them from its own columns.

Delivery. The batch writer is at-least-once (a task Spark retries sends its rows again). The
streaming writer is exactly-once per micro-batch, with its state kept in the cluster: the topic
``MQSTORE_SINK_<sinkId>`` holds JSON records (in queue 0 of one broker: the one that has them,
at first the first by name). Each task of micro-batch N (Spark's ``streaming.sql.batchId``),
partition p:

1. reads the records since the last ``done`` of its query (Spark's queryId, kept in the
   checkpoint): if N is done already (a replay after the driver stopped between the sink's
   commit and Spark's), it sends nothing;
2. finds the ``begin`` record of (N, p) an earlier attempt wrote, or writes one with the max
   offsets of the queues it is about to send to;
3. sends its rows, each message marked ``MQSTORE_SINK_BATCH=<sinkId>:<N>:<p>``, leaving out of
   each queue as many as it counts with that mark from the begin record's offset (an attempt
   that died half way sent a prefix of each queue's rows; the retry sends the rest).

A broker answers a send before it has dispatched the message to its queue, so before it reads
records, and before it counts marks on a broker, a task sends a fence message to that broker's
topic ``MQSTORE_FENCE_<brokerName>`` and waits until the fence's queue shows it: the broker
dispatches its CommitLog in order, so everything sent to it before is in its queues by then.

The driver's ``commit(N)`` writes ``done``. Exact when a replayed micro-batch gives each
partition the same rows in the same order (a deterministic query over a replayable source, as
the local sink assumes), the topics' routes do not change in between, and no two attempts of a
task run at once (Spark's speculation is off by default).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StringType, StructType

from mqstore.queue._arrow import BatchColumns, RecordSource
from mqstore.client import ClientError, Message, MessageQueue, SyncProducer, decode_messages
from mqstore.client.protocol import SYSTEM_PROPERTIES
from mqstore.spark.options import OptionError, check_options
from mqstore.spark.remote.cluster import BACK_STEP, Cluster, ClusterConfig, RemoteQueue, queue_key
from mqstore.spark.remote.reader import BROKER_COLUMN
from mqstore.spark.source import record_batch
from mqstore.spark.worker import settle_worker
from mqstore.spark.rows import (SINK_PROPERTY, QueueChooser, RowLimits, WriteError, WriteReport, check_rows, chunks,
                                write_columns)

__all__ = ["NetworkBatchWriter", "NetworkStreamWriter", "STATE_TOPIC_PREFIX"]

log = logging.getLogger("mqstore.spark")

#: the topic that keeps a streaming sink's records is this followed by its sinkId
STATE_TOPIC_PREFIX = "MQSTORE_SINK_"
#: a broker's fence topic is this followed by its name (characters a topic cannot hold as "_")
FENCE_TOPIC_PREFIX = "MQSTORE_FENCE_"
#: a sinkId over the network: what a RocketMQ topic name may hold, the prefix included
_SINK_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
#: the local property Spark sets on a micro-batch's tasks (MicroBatchExecution.BATCH_ID_KEY)
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: what to do when the sink's own topics cannot be sent to
_CREATE_HINT = (f"the sink keeps its records in {STATE_TOPIC_PREFIX}<sinkId> and fences in "
                f"{FENCE_TOPIC_PREFIX}<broker>: where brokers do not create topics, create them, and where an ACL "
                "is on, let the sink's account send to and pull them")
#: how long a fence may take to be dispatched
FENCE_WAIT_S = 30.0
_PROPERTIES_SCHEMA = pa.schema([pa.field("properties", pa.map_(pa.string(), pa.string()))])


def sink_columns(schema: StructType) -> list[str]:
    """The message columns of a write (write_columns) and ``broker`` when the schema has it."""
    broker = [f for f in schema.fields if f.name == BROKER_COLUMN]
    if broker and broker[0].dataType != StringType():
        raise OptionError(f"column {BROKER_COLUMN!r} is {broker[0].dataType.simpleString()}; a write needs string")
    return write_columns(StructType([f for f in schema.fields if f.name != BROKER_COLUMN])) + \
        [BROKER_COLUMN] * len(broker)


def _network_options(options: Mapping[str, str], kind: str) -> tuple[dict[str, str], ClusterConfig]:
    checked = check_options(options, kind)
    if "queuecount" in checked:
        raise OptionError("option queueCount does not apply with namesrv: the topic's route gives its queues")
    return checked, ClusterConfig.from_options(checked)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError('save mode overwrite: RocketMQ topics are append-only; write with .mode("append") '
                          "(outputMode append for streams)")


class Targets:
    """The write queues of each topic (the producer's routes) and the one a row goes to."""

    def __init__(self, producer: SyncProducer, start: int) -> None:
        self.producer = producer
        self.start = start
        self._queues: dict[str, list[MessageQueue]] = {}
        self._choosers: dict[tuple[str, int | None, str | None], tuple[list[MessageQueue], QueueChooser]] = {}

    def pick(self, topic: str, queue_id: int | None, broker: str | None, keys: str | None, row: int) -> MessageQueue:
        fit = self._choosers.get((topic, queue_id, broker))
        if fit is None:
            every = self._queues.get(topic)
            if every is None:
                try:
                    every = self._queues[topic] = self.producer.queues(topic)
                except (ClientError, ValueError) as exc:
                    raise WriteError(f"row {row}: topic {topic}: no route to send to ({exc})") from None
            cands = [mq for mq in every if (queue_id is None or mq.queue_id == queue_id)
                     and (broker is None or mq.broker_name == broker)]
            if not cands:
                have = ", ".join(f"{mq.broker_name}/{mq.queue_id}" for mq in every)
                raise WriteError(f"row {row} (topic {topic}): no write queue {broker or '*'}/"
                                 f"{'*' if queue_id is None else queue_id}; the topic's write queues are {have}")
            fit = self._choosers[(topic, queue_id, broker)] = (cands, QueueChooser(len(cands), self.start))
        cands, chooser = fit
        return cands[0] if len(cands) == 1 else cands[chooser.choose(topic, keys)]


#: what a row is checked against (mqstore.spark.rows.check_rows): RocketMQ's defaults, a
#: broker's own limits are not known to its clients (a broker with smaller ones refuses the send)
LIMITS = RowLimits()
Groups = dict[tuple[str, str, int], tuple[list[Message], list[int]]]


def cluster_messages(batch: pa.RecordBatch, targets: Targets, part: int, marker: str | None = None,
                     row_base: int = 0) -> Groups:
    """The rows of batch (checked by check_rows, which names a bad row) as client messages
    grouped by (broker, topic, queue id), each group in row order with each message's record
    bytes, marked SINK_PROPERTY=marker when given."""
    marks = {SINK_PROPERTY: marker} if marker else {}
    weights = check_rows(batch, LIMITS, marks, part, row_base)
    n = batch.num_rows
    names = batch.schema.names

    def col(name: str) -> list[Any]:
        return batch.column(names.index(name)).to_pylist() if name in names else [None] * n

    topics, bodies, queue_ids, brokers = col("topic"), col("body"), col("queue_id"), col(BROKER_COLUMN)
    tags, keys, props = col("tags"), col("keys"), col("properties")
    groups: Groups = {}
    for i in range(n):
        topic, body = topics[i], bodies[i]
        user = {k: v for k, v in props[i] if k not in SYSTEM_PROPERTIES} if props[i] else {}
        user.update(marks)
        mq = targets.pick(topic, queue_ids[i], brokers[i], keys[i], row_base + i)
        messages, sizes = groups.setdefault((mq.broker_name, topic, mq.queue_id), ([], []))
        messages.append(Message(body.encode() if isinstance(body, str) else body, tags[i], keys[i], user or None))
        sizes.append(weights[i])
    return groups


def send_groups(producer: SyncProducer, groups: Groups, skip: Mapping[tuple[str, str, int], int] | None = None) -> int:
    """Send every group (in order) as batches, leaving out the first skip[group] messages of
    each; the messages sent. A refused send is a WriteError naming the queue and the cause."""
    sent = 0
    for (broker, topic, qid), (messages, sizes) in groups.items():
        left = (skip or {}).get((broker, topic, qid), 0)
        for chunk in chunks(messages[left:], sizes[left:], LIMITS.chunk_bytes):  # type: ignore[arg-type]
            try:
                producer.send_batch(topic, chunk, queue_id=qid, broker_name=broker)  # type: ignore[arg-type]
            except (ClientError, ValueError) as exc:
                raise WriteError(f"sending {len(chunk)} message(s) to {queue_key(broker, topic, qid)} failed: "
                                 f"{exc}") from None
            sent += len(chunk)
    return sent


def fence_topic(broker: str) -> str:
    """The topic fences to broker go to: it exists on that broker only (a producer sends to the
    brokers of a topic's route, so one topic cannot reach a broker it was not created on)."""
    return FENCE_TOPIC_PREFIX + re.sub(r"[^A-Za-z0-9_-]", "_", broker)[:100]


def _task() -> tuple[int, Any]:
    """(partition id, TaskContext) of the running Spark task; (0, None) outside one. Writers
    call it first: it settles the Python worker too (settle_worker)."""
    from pyspark import TaskContext

    settle_worker()

    ctx = TaskContext.get()
    return (ctx.partitionId(), ctx) if ctx is not None else (0, None)


def _producer(config: ClusterConfig) -> SyncProducer:
    return SyncProducer(config.producer_group, config.namesrv, **config.client_arguments()).start()


class NetworkBatchWriter(DataSourceArrowWriter):
    """``df.write.format("mqstore").option("namesrv", ...).mode("append").save()``: each task
    sends its rows; at-least-once."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options, self.config = _network_options(options, "write")
        sink_columns(schema)  # refuses a missing, unknown or mistyped column

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        part, _ = _task()
        sent = rows = 0
        with _producer(self.config) as producer:
            targets = Targets(producer, part)
            for batch in iterator:
                sent += send_groups(producer, cluster_messages(batch, targets, part, row_base=rows))
                rows += batch.num_rows
        return WriteReport(part, sent)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, WriteReport))
        log.info("mqstore write to %s: %d message(s) from %d task(s)", self.config.namesrv, total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.messages for m in messages if isinstance(m, WriteReport))
        log.warning("mqstore write to %s failed; the %d message(s) successful tasks sent stay (topics are "
                    "append-only)", self.config.namesrv, done)


# -- streaming: the sink's records in the cluster ------------------------------------------------
class SinkRecords:
    """The state topic of one sink. Its records go to queue 0 of one broker: the one whose
    queue 0 holds records already, else the first by name."""

    def __init__(self, config: ClusterConfig, sink_id: str) -> None:
        self.config = config
        self.sink_id = sink_id
        self.topic = STATE_TOPIC_PREFIX + sink_id

    def _records_queue(self, cluster: Cluster) -> RemoteQueue | None:
        held = [q for q in cluster.queues([self.topic], missing_ok=True) if q.queue_id == 0 and q.max_offset > 0]
        return max(held, key=lambda q: (q.max_offset, q.broker)) if held else None

    def broker(self, cluster: Cluster, producer: SyncProducer) -> str:
        """The broker that keeps the records."""
        q = self._records_queue(cluster)
        if q is not None:
            return q.broker
        zero = sorted(mq.broker_name for mq in producer.queues(self.topic) if mq.queue_id == 0)
        if not zero:
            raise WriteError(f"sink {self.sink_id}: topic {self.topic} has no write queue 0")
        return zero[0]

    def fence(self, cluster: Cluster, producer: SyncProducer, broker: str) -> None:
        """Return once broker has dispatched everything stored before now (a message to its
        fence topic, waited for in its queue): a count of its queues then sees every message an
        earlier attempt sent, as a broker dispatches its CommitLog in order."""
        topic = fence_topic(broker)
        try:
            sent = producer.send(topic, b"fence", broker_name=broker)
        except (ClientError, ValueError) as exc:
            raise WriteError(f"sink {self.sink_id}: sending to {topic} on {broker} failed ({exc}); {_CREATE_HINT}") \
                from None
        mq = [MessageQueue(topic, broker, sent.queue_id)]
        deadline = time.monotonic() + FENCE_WAIT_S
        while True:
            try:
                if cluster.offsets(mq, "max")[0] > sent.queue_offset:
                    return
            except ClientError:  # (the topic's route not at the NameServers yet)
                pass
            if time.monotonic() > deadline:
                raise WriteError(f"sink {self.sink_id}: broker {broker} did not dispatch a message to {topic} within "
                                 f"{FENCE_WAIT_S} s; cannot tell what an earlier attempt sent")
            time.sleep(0.01)

    def since_done(self, cluster: Cluster, query: str) -> tuple[int, list[dict[str, Any]]]:
        """(the last batch the query committed or -1, the query's records after it, oldest
        first), read back from the end of the records until that done record or a record of
        another query."""
        q = self._records_queue(cluster)
        if q is None:
            return -1, []
        found: list[dict[str, Any]] = []
        at = q.max_offset
        while at > q.min_offset:
            begin = max(q.min_offset, at - BACK_STEP)
            records = [json.loads(m.body) for body in cluster.bodies(q, begin, at) for m in decode_messages(body)]
            for record in reversed(records):
                if record.get("query") != query:
                    return -1, found
                if record["kind"] == "done":
                    return int(record["batch"]), found
                found.insert(0, record)
            at = begin
        return -1, found

    def append(self, producer: SyncProducer, broker: str, record: dict[str, Any]) -> None:
        try:
            producer.send(self.topic, json.dumps(record).encode(), queue_id=0, broker_name=broker)
        except (ClientError, ValueError) as exc:
            raise WriteError(f"sink {self.sink_id}: sending its record to {self.topic} on {broker} failed ({exc}); "
                             f"{_CREATE_HINT}") from None


def count_marked(cluster: Cluster, q: RemoteQueue, start: int, marker: str) -> int:
    """Messages of q from offset start up to its max offset now whose SINK_PROPERTY is marker."""
    found = 0
    for body in cluster.bodies(q, start, q.max_offset):
        cols = BatchColumns(["properties"])
        cols.add_span(RecordSource(0, len(body), [body]), 0, len(body))
        props = record_batch(cols, _PROPERTIES_SCHEMA).column(0)
        found += pc.sum(pc.equal(pc.map_lookup(props, SINK_PROPERTY, "first"), marker)).as_py() or 0
    return found


@dataclass
class SinkReport(WriteReport):
    """What a streaming task sent, and its query's id (the driver's commit has no task)."""

    query: str = ""


class NetworkStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mqstore").option("namesrv", ...).option("sinkId", ...)``:
    exactly-once per micro-batch (the module docstring)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options, self.config = _network_options(options, "stream-write")
        sink_columns(schema)
        sink_id = self.options.get("sinkid")
        if not sink_id or not _SINK_ID.match(sink_id):
            raise OptionError(f"a streaming write to a cluster needs option sinkId (got {sink_id!r}): 1 to 100 of "
                              f"A-Z a-z 0-9 _ -, a name for the sink; its records go to topic "
                              f"{STATE_TOPIC_PREFIX}<sinkId>, so a replayed micro-batch is not written twice")
        self.records = SinkRecords(self.config, sink_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        part, ctx = _task()
        raw_batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        if raw_batch is None:
            raise WriteError(f"no micro-batch id in the task (Spark's local property {BATCH_ID_PROPERTY})")
        return self.write_task(iterator, int(raw_batch), ctx.getLocalProperty(QUERY_ID_PROPERTY) or "", part)

    def write_task(self, iterator: Iterator[pa.RecordBatch], batch_id: int, query: str, part: int) -> SinkReport:
        """Partition part of micro-batch batch_id of query (what write() takes from the task)."""
        marker = f"{self.records.sink_id}:{batch_id}:{part}"
        with _producer(self.config) as producer, Cluster(self.config) as cluster:
            state_broker = self.records.broker(cluster, producer)
            self.records.fence(cluster, producer, state_broker)  # so an earlier attempt's begin record is seen
            done, records = self.records.since_done(cluster, query)
            if batch_id <= done:
                log.info("sink %s: micro-batch %d was written before (done %d); partition %d sends nothing",
                         self.records.sink_id, batch_id, done, part)
                return SinkReport(part, 0, query=query)
            targets = Targets(producer, part)
            groups: Groups = {}
            rows = 0
            for batch in iterator:
                for target, (messages, sizes) in cluster_messages(batch, targets, part, marker, rows).items():
                    into = groups.setdefault(target, ([], []))
                    into[0].extend(messages)
                    into[1].extend(sizes)
                rows += batch.num_rows
            if not groups:
                return SinkReport(part, 0, query=query)
            begun = next((r["starts"] for r in records
                          if r["kind"] == "begin" and r["batch"] == batch_id and r["part"] == part), None)
            skip: dict[tuple[str, str, int], int] = {}
            if begun is None:
                # (a topic that does not exist yet: its queues start at 0)
                ends = cluster.offsets([MessageQueue(topic, broker, qid) for broker, topic, qid in groups], "max",
                                       missing=0)
                starts = {queue_key(*target): end for target, end in zip(groups, ends)}
                self.records.append(producer, state_broker, {"kind": "begin", "query": query, "batch": batch_id,
                                                             "part": part, "starts": starts})
            else:
                for broker in sorted({broker for broker, _, _ in groups} - {state_broker}):
                    self.records.fence(cluster, producer, broker)
                ends = cluster.offsets([MessageQueue(topic, broker, qid) for broker, topic, qid in groups], "max",
                                       missing=0)
                for (broker, topic, qid), end in zip(groups, ends):
                    q = RemoteQueue(topic, qid, 0, end, broker)
                    skip[(broker, topic, qid)] = count_marked(cluster, q, begun.get(q.key, end), marker)
                log.warning("sink %s: micro-batch %d partition %d was begun before; %d of its message(s) are there, "
                            "sending the rest", self.records.sink_id, batch_id, part, sum(skip.values()))
            return SinkReport(part, send_groups(producer, groups, skip), query=query)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Record micro-batch batchId as done (a micro-batch no task wrote needs no record)."""
        query = next((m.query for m in messages if isinstance(m, SinkReport)), None)
        if query is None:
            return
        with _producer(self.config) as producer, Cluster(self.config) as cluster:
            self.records.append(producer, self.records.broker(cluster, producer),
                                {"kind": "done", "query": query, "batch": batchId})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("sink %s: micro-batch %d aborted; the messages its tasks sent stay, and its retry sends only the "
                    "rest", self.records.sink_id, batchId)
