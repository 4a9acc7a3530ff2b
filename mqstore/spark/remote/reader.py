"""Reading a RocketMQ cluster over the network: ``format("mqstore").option("namesrv", ...)``.

    spark.read.format("mqstore").option("namesrv", "ns1:9876;ns2:9876").option("topics", "orders").load()

The queues of the named topics on every broker of their routes are planned from the brokers'
min and max offsets (GET_MIN_OFFSET, GET_MAX_OFFSET) and cut into offset ranges as the local
reader cuts a store's queues (mqstore.spark.source.plan_queue_ranges, split_for); each task
pulls its range (PULL_MESSAGE, from the broker id the last answer suggested) and turns the
answers' bodies, the records as stored, into Arrow batches with the same kernel the local
reader runs over mapped files (``mqstore.queue._arrow``). The streaming reader is the local one
(mqstore.spark.stream.MQStoreStreamReader: offsets, admission control, availableNow) over these
queues; its offsets are keyed ``"broker/topic/queueId"`` (mqstore.spark.remote.cluster).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructType

from mqstore.queue._arrow import RecordSource
from mqstore.client.protocol import ResponseCode
from mqstore.errors import MQStoreError
from mqstore.spark.remote.cluster import Cluster, ClusterConfig, RemoteQueue, parse_key, queue_key, record_times
from mqstore.spark.options import OptionError, list_option, per_queue_json
from mqstore.spark.source import Reading, plan_queue_ranges, record_batch, select_queues, split_for, starting_offsets
from mqstore.spark.stream import MQStoreStreamReader
from mqstore.spark.worker import settle_worker

__all__ = ["NetworkBatchReader", "NetworkStreamReader", "RemoteSlice", "RemoteReadError"]


#: the column a narrower user schema may add: the name of the broker a row was pulled from
BROKER_COLUMN = "broker"
#: the JSON options whose keys name queues
_KEYED_OPTIONS = ("startingOffsets", "endingOffsets", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp")
#: pulls in a row that bring nothing before a range is given up (about 10 s with the waits)
STALLED_PULLS = 20
#: the driver's stream reader asks the NameServers again this often, so new brokers are seen
STREAM_ROUTE_TTL_S = 5.0


class RemoteReadError(MQStoreError, RuntimeError):
    """A broker does not give the offsets a query planned to read."""

    hint = "check that the broker still serves the queue (and its slaves have caught up), then run the query again"


@dataclass
class RemoteSlice(InputPartition):
    """Queue offsets [start, end) of one queue of one broker."""

    broker: str
    topic: str
    queue_id: int
    start: int
    end: int

    @property
    def key(self) -> str:
        return queue_key(self.broker, self.topic, self.queue_id)


def cut(ranges: list[tuple[RemoteQueue, int, int]], options: Mapping[str, str]) -> list[RemoteSlice]:
    """The ranges in pieces of maxRowsPerPartition offsets (fewer with minPartitions), as
    mqstore.spark.source.cut_ranges cuts a store's."""
    per_partition = split_for(sum(max(0, e - s) for _, s, e in ranges), options)
    return [RemoteSlice(q.broker, q.topic, q.queue_id, at, min(e, at + per_partition))
            for q, s, e in ranges for at in range(s, e, per_partition)]


def topics_of(options: Mapping[str, str]) -> list[str]:
    """The topics the topics (subscribe) or assign option names: over the network they must be
    named (RocketMQ's NameServer gives routes by topic)."""
    if "subscribepattern" in options:
        raise OptionError("option subscribePattern needs the list of every topic, which the NameServer protocol does "
                          "not serve (mqstore's NameServer answers routes by topic); name the topics with option "
                          "topics (Kafka's subscribe) or assign")
    topics = list_option(options, "topics")
    if topics is not None:
        return topics
    raw = options.get("assign")
    if raw is not None:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise OptionError(f'option assign={raw!r}: expected JSON like {{"topicA": [0, 1], "topicB": [2]}}')
        return sorted(parsed)
    raise OptionError('name the topics to read: option("topics", "a,b") (Kafka\'s subscribe) or option("assign", '
                      '\'{"a": [0, 1]}\'); over the network the NameServers answer routes by topic')


def with_broker_keys(options: Mapping[str, str], queues: list[RemoteQueue]) -> dict[str, str]:
    """options with the JSON of the offsets and timestamps options keyed "broker/topic/queueId":
    a key in the local shape "topic/queueId" (or Kafka's {"topic": {"0": n}}) stands for the one
    broker that has that queue; where several have it, or none, it is an OptionError naming
    them."""
    out = dict(options)
    for name in _KEYED_OPTIONS:
        raw = options.get(name.lower())
        if raw is None or raw.strip() in ("earliest", "latest"):
            continue
        given = per_queue_json(options, name, "42")
        assert given is not None
        keyed = {}
        for key, value in given.items():
            broker, topic, queue_id = parse_key(key)
            if broker is None:
                owners = sorted({q.broker for q in queues if q.topic == topic and q.queue_id == queue_id})
                if len(owners) != 1:
                    where = (f"brokers {', '.join(owners)} each have it" if owners else "no broker has it")
                    raise OptionError(f"option {name}: {key!r} does not say which broker ({where}); key queues as "
                                      f'"brokerName/topic/queueId", e.g. "{(owners or ["broker-a"])[0]}/{key}"')
                broker = owners[0]
            keyed[queue_key(broker, topic, queue_id)] = value
        out[name.lower()] = json.dumps(keyed)
    return out


class NetworkReading(Reading):
    """What the network batch and stream readers share: the options, the columns (those of
    mqstore.spark.source.Reading, and ``broker``) and how a partition is pulled. There is no
    store directory: Reading's own __init__ is not run, its take_options is."""

    def __init__(self, options: Mapping[str, str], schema: StructType, kind: str | None = None) -> None:
        kind = kind or ("stream" if isinstance(self, DataSourceStreamReader) else "read")
        self.kernel_schema = StructType([f for f in schema.fields if f.name != BROKER_COLUMN])
        self.take_options(options, kind, self.kernel_schema)
        self.cluster_config = ClusterConfig.from_options(self.options)
        self.root = ""  # (no store directory)
        for f in schema.fields:
            if f.name == BROKER_COLUMN and f.dataType != StringType():
                raise OptionError(f"column {BROKER_COLUMN!r} is string, not {f.dataType.simpleString()}")
        self.with_broker = any(f.name == BROKER_COLUMN for f in schema.fields)
        self.schema = schema

    def _batch(self, cols: Any, broker: str, kernel: pa.Schema, full: pa.Schema) -> pa.RecordBatch:
        batch = record_batch(cols, kernel)
        if not self.with_broker:
            return batch
        arrays = list(batch.columns)
        arrays.insert(full.get_field_index(BROKER_COLUMN), pa.array([broker] * batch.num_rows, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=full)

    def read_slice(self, part: RemoteSlice) -> Iterator[pa.RecordBatch]:
        """The messages of part as Arrow batches of at most about batchRows rows / maxBatchBytes
        bytes of records, pulled in order; offsets no longer stored fail the read
        (failOnDataLoss) or are logged and skipped; a broker that keeps answering nothing below
        part.end (a queue cut short, a slave far behind) is a RemoteReadError."""
        kernel = to_arrow_schema(self.kernel_schema, timezone="UTC")
        full = to_arrow_schema(self.schema, timezone="UTC")
        q = RemoteQueue(part.topic, part.queue_id, part.start, part.end, part.broker)
        pull_batch = self.cluster_config.pull_batch
        with Cluster(self.cluster_config) as cluster:
            cols, taken, at, stalled = self._batch_columns(), 0, part.start, 0
            while at < part.end:
                got = cluster.pull(q, at, min(pull_batch, part.end - at))
                stop = min(got.next_offset, part.end)
                if got.code == ResponseCode.SUCCESS and got.body and stop > at:
                    body = got.body
                    source = RecordSource(0, len(body), [body])
                    if got.next_offset <= part.end:
                        added = cols.add_span(source, 0, len(body))[0]
                    else:  # the broker skipped entries and answered records past part.end: not those
                        keep = sum(o < part.end for o, _ in record_times(body))
                        added = cols.add_span(source, 0, len(body), keep)[0] if keep else 0
                    self._lost(part, at, stop, (stop - at) - added, got.remark)
                    at, taken, stalled = stop, taken + len(body), 0
                    if cols.rows >= self.batch_rows or taken >= self.batch_bytes:
                        yield self._batch(cols, part.broker, kernel, full)
                        cols, taken = self._batch_columns(), 0
                elif got.code == ResponseCode.PULL_OFFSET_MOVED and at < got.min_offset:
                    stop = min(got.min_offset, part.end)  # OFFSET_TOO_SMALL: retention deleted them
                    self._lost(part, at, stop, stop - at, f"below the queue's earliest offset {got.min_offset}")
                    at, stalled = stop, 0
                elif got.code == ResponseCode.PULL_RETRY_IMMEDIATELY and stop > at:
                    self._lost(part, at, stop, stop - at, got.remark)  # MESSAGE_WAS_REMOVING
                    at, stalled = stop, 0
                else:
                    stalled += 1  # (the next pull goes to the broker id the answer suggests)
                    if stalled >= STALLED_PULLS:  # (looked up here: a test lowers it)
                        raise RemoteReadError(
                            f"queue {part.key}: broker id {got.broker_id} answers {got.remark or got.code} at offset "
                            f"{at} (it holds [{got.min_offset}, {got.max_offset})), but the query planned to read up "
                            f"to {part.end}")
                    if got.suggest == got.broker_id:
                        time.sleep(min(0.05 * stalled, 0.5))
            if cols.rows:
                yield self._batch(cols, part.broker, kernel, full)

    def _lost(self, part: RemoteSlice, start: int, end: int, count: int, why: str) -> None:
        """count messages of [start, end) of part are not there: fail (failOnDataLoss, the
        default) or log them (Reading.data_lost)."""
        if count <= 0:
            return
        self.data_lost(f"queue {part.key}: {count} message(s) of offsets [{start}, {end}) are no longer stored "
                       f"({why or 'the broker skipped them'}); the query planned to read [{part.start}, {part.end})")


class NetworkBatchReader(NetworkReading, DataSourceReader):
    """``spark.read.format("mqstore").option("namesrv", ...)``."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema, "read")
        if self.options.get("mode", "queues") != "queues":
            raise OptionError(f"option mode={self.options['mode']!r}: over the network a read is by queues (the "
                              "CommitLog files are the brokers'; mode=commitlog reads a store directory)")
        self.topics = topics_of(self.options)

    def partitions(self) -> list[InputPartition]:
        with Cluster(self.cluster_config) as cluster:
            queues = cluster.queues(self.topics)
            options = with_broker_keys(self.options, queues)
            ranges = plan_queue_ranges([*queues], options, cluster.first_offset_at)
            return list(cut(cast(list[tuple[RemoteQueue, int, int]], ranges), options))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RemoteSlice)
        return self.read_slice(partition)


class NetworkStreamReader(MQStoreStreamReader, NetworkReading):
    """``spark.readStream.format("mqstore").option("namesrv", ...)``: the local stream reader
    (its options, offsets, admission control and availableNow; mqstore.spark.stream) over the
    cluster's queues, offsets keyed "broker/topic/queueId". The driver's reader keeps one
    Cluster for the query (asked again for routes every 5 s, so new brokers and queues are
    read from their earliest offset)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(dict(options), schema)  # MQStoreStreamReader's, on NetworkReading's
        self.topics = topics_of(self.options)
        self._cluster: Cluster | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cluster"] = None  # (an event loop and connections: the driver's own)
        return state

    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(self.cluster_config, route_ttl=STREAM_ROUTE_TTL_S)
        return self._cluster

    def _queues_now(self) -> list[RemoteQueue]:
        queues = self.cluster().queues(self.topics, missing_ok=True)
        return cast(list[RemoteQueue], select_queues([*queues], self.options, streaming=True))

    def initialOffset(self) -> dict[str, int]:
        queues = self._queues_now()
        return starting_offsets([*queues], with_broker_keys(self.options, queues), self.cluster().first_offset_at,
                                streaming=True)

    def _ranges(self) -> dict[str, RemoteQueue]:  # type: ignore[override]
        return {q.key: q for q in self._queues_now()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return list(cut(self.planned(start, end, self._ranges()), self.options))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RemoteSlice)
        return self.read_slice(partition)

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
