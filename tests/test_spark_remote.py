"""format("mqstore") over the network (issue 26): with option namesrv the source reads and the
sink writes a cluster of two brokers (broker-a with its embedded NameServer, broker-b registered
with it; each broker a store of its own) through mqstore.client. Rows are compared with the
brokers' own stores read by the local reader; offsets are keyed "broker/topic/queueId"; exact
time lookups; retention between planning and reading (failOnDataLoss); a slave read when the
master suggests it; ACL and TLS; the streaming sink's exactly-once records. The cluster test
with separate executors and a killed driver is tests/test_spark_remote_cluster.py.
Loopback only, free ports; every wait is bounded."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from helpers_broker import LOOPBACK, running_broker
from helpers_proc import wait_until
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from mqstore.client import SyncProducer
from mqstore.spark.options import OptionError
from mqstore.spark.remote.cluster import Cluster, ClusterConfig, parse_key, queue_key
from mqstore.spark.remote.reader import NetworkBatchReader, NetworkStreamReader, RemoteReadError, RemoteSlice
from mqstore.spark.remote.writer import (SINK_PROPERTY, NetworkBatchWriter, NetworkStreamWriter, SinkReport,
                                         fence_topic)
from mqstore.spark.source import SCHEMA, DataLossError, MQStoreBatchReader
from mqstore.spark.rows import WriteError

pytestmark = pytest.mark.multiprocess

TOPIC = "Orders"
#: messages sent to each broker's queues (4 queues each), some compressed by the producer
PER_BROKER = 600
ALL_HOURS = ";".join(str(h) for h in range(24))
_topics = itertools.count()


def _send(namesrv: str, broker: str, topic: str, n: int, tag: str = "") -> None:
    """n messages to broker's queues of topic: single sends (bodies of 300+ bytes compressed by
    the producer), keys and tags on some, user properties on others."""
    with SyncProducer("PG_remote", namesrv, compress_over=300) as producer:
        for i in range(n):
            body = (f"{broker}-{tag}{i}-".encode()) * (1 if i % 3 else 40)
            producer.send(topic, body, queue_id=i % 4, broker_name=broker, tags=f"T{i % 2}" if i % 5 else None,
                          keys=f"k{i}" if i % 2 else None, properties={"n": str(i)} if i % 7 == 0 else None)


def create_topic(namesrv: str, topic: str, *brokers: Any) -> None:
    """topic with 4 queues on each broker (UPDATE_AND_CREATE_TOPIC), once the NameServer's route
    names them all (a producer sends only to the brokers of a topic's route)."""
    from test_broker_ha import request

    from mqstore.remoting._remoting import RemotingCommand
    from mqstore.protocol import RequestCode, ResponseCode

    fields = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
              "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}
    for broker in brokers:
        got = request(broker.address, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=fields))
        assert got.code == ResponseCode.SUCCESS, got.remark
    with Cluster(ClusterConfig(namesrv), route_ttl=0.1) as cluster:
        wait_until(lambda: len(cluster.message_queues([topic], missing_ok=True)) == 4 * len(brokers), 30,
                   f"every broker in the route of {topic}")


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    """broker-a (its NameServer the cluster's) and broker-b, each with PER_BROKER messages of
    TOPIC: (namesrv, {name: broker})."""
    base = tmp_path_factory.mktemp("remote")
    with running_broker(str(base / "a"), broker_name="broker-a", front_processes=1) as a, \
            running_broker(str(base / "b"), broker_name="broker-b", front_processes=1,
                           namesrv_addr=a.namesrv_address) as b:
        ns = a.namesrv_address
        create_topic(ns, TOPIC, a, b)
        for name in ("broker-a", "broker-b"):
            _send(ns, name, TOPIC, PER_BROKER)
        for br in (a, b):
            br.store.wait_dispatched()
        yield ns, {"broker-a": a, "broker-b": b}


def _rows(batches: Any) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def _network_rows(reader: NetworkBatchReader) -> list[dict[str, Any]]:
    return _rows(batch for part in reader.partitions() for batch in reader.read(part))


def _store_rows(root: str, topic: str = TOPIC) -> list[dict[str, Any]]:
    local = MQStoreBatchReader({"path": root, "topics": topic}, SCHEMA)
    return _rows(batch for part in local.partitions() for batch in local.read(part))


def _by_message(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Rows by (store host: the broker, topic, queue, offset); each key once."""
    out = {(r["store_host"], r["topic"], r["queue_id"], r["queue_offset"]): r for r in rows}
    assert len(out) == len(rows), "a message came twice"
    return out


# -- reads ----------------------------------------------------------------------------------------
def test_a_read_gives_every_message_of_both_brokers_as_their_stores_hold_them(brokers):
    """Partitions are offset ranges of each broker's queues (maxRowsPerPartition); the rows are
    the local reader's rows of each broker's store, column for column (compressed bodies come
    out as sent); a narrower schema may add the broker's name."""
    ns, by_name = brokers
    reader = NetworkBatchReader({"namesrv": ns, "topics": TOPIC, "maxRowsPerPartition": "40", "batchRows": "50"},
                                SCHEMA)
    parts = reader.partitions()
    assert len(parts) == 2 * 4 * 4  # 150 messages per queue, 40 per partition
    assert {p.broker for p in parts} == {"broker-a", "broker-b"}
    got = _by_message(_network_rows(reader))
    expected = _by_message([r for br in by_name.values() for r in _store_rows(br.root)])
    assert len(got) == 2 * PER_BROKER and got == expected
    sent = {f"{name}-{i}-".encode() * (1 if i % 3 else 40) for name in by_name for i in range(PER_BROKER)}
    assert {r["body"] for r in got.values()} == sent
    assert any(r["sys_flag"] & 1 for r in got.values()), "no body was stored compressed"

    narrow = StructType([StructField("queue_offset", LongType()), StructField("broker", StringType()),
                         StructField("body", BinaryType())])
    rows = _network_rows(NetworkBatchReader({"namesrv": ns, "topics": TOPIC}, narrow))
    assert list(rows[0]) == ["queue_offset", "broker", "body"]
    assert Counter(r["broker"] for r in rows) == {"broker-a": PER_BROKER, "broker-b": PER_BROKER}
    assert all(r["body"].startswith(r["broker"].encode()) for r in rows)


def test_offsets_json_is_keyed_by_broker_and_the_local_shape_only_where_one_broker_has_the_queue(brokers):
    ns, _ = brokers
    assert queue_key("broker-a", "Orders", 3) == "broker-a/Orders/3"
    assert parse_key("broker-a/Orders/3") == ("broker-a", "Orders", 3)
    assert parse_key("Orders/3") == (None, "Orders", 3)
    with pytest.raises(OptionError, match="brokerName/topic/queueId"):
        parse_key("a/b/c/1")
    schema = StructType([StructField("broker", StringType()), StructField("queue_offset", LongType())])

    def read(**options: str) -> list[tuple[str, int]]:
        picks = {} if "assign" in options else {"topics": TOPIC}
        reader = NetworkBatchReader({"namesrv": ns, **picks, **options}, schema)
        return sorted((r["broker"], r["queue_offset"]) for r in _network_rows(reader))

    got = read(assign='{"Orders": [1]}', startingOffsets='{"broker-b/Orders/1": 140}',
               endingOffsets='{"broker-a/Orders": {"1": 3}, "broker-b/Orders/1": -1}')
    assert got == [("broker-a", o) for o in range(3)] + [("broker-b", o) for o in range(140, 150)]
    with pytest.raises(OptionError, match=r"'Orders/1' does not say which broker \(brokers broker-a, broker-b "
                                          r"each have it\).*\"broker-a/Orders/1\""):
        read(startingOffsets='{"Orders/1": 5}')
    with pytest.raises(OptionError, match="'Orders/9' does not say which broker \\(no broker has it\\)"):
        read(startingOffsets='{"Orders": {"9": 5}}')
    with pytest.raises(OptionError, match=r"names queue\(s\) .*: broker-c/Orders/0"):
        read(startingOffsets='{"broker-c/Orders/0": 5}')


def test_a_queue_on_one_broker_may_be_named_as_locally(brokers):
    ns, _ = brokers
    topic = f"Solo{next(_topics)}"
    _send(ns, "broker-b", topic, 40)
    # the route, and every message in the broker's queues (it answers a send before dispatching it)
    with Cluster(ClusterConfig(ns), route_ttl=0.1) as cluster:
        wait_until(lambda: sum(q.max_offset for q in cluster.queues([topic], missing_ok=True)) == 40, 30,
                   "the topic's route and its 40 messages in the queues")
    reader = NetworkBatchReader({"namesrv": ns, "topics": topic, "startingOffsets": json.dumps({f"{topic}/2": 8})},
                                SCHEMA)
    rows = _network_rows(reader)
    assert sorted((r["queue_id"], r["queue_offset"]) for r in rows if r["queue_id"] == 2) == [(2, 8), (2, 9)]
    assert len(rows) == 40 - 8


def test_a_starting_timestamp_starts_each_queue_at_its_first_message_stored_at_or_after_it(brokers):
    """SEARCH_OFFSET_BY_TIMESTAMP gives the nearest message; the reader pulls the neighbours
    and starts at the first one stored at or after the time, as a local exact lookup does."""
    ns, by_name = brokers
    topic = f"Timed{next(_topics)}"
    create_topic(ns, topic, *by_name.values())
    for half in range(2):
        for name in by_name:
            _send(ns, name, topic, 24, tag=f"h{half}-")
        time.sleep(0.05)
    for br in by_name.values():  # the local and the network reads see what is dispatched
        assert br.store.wait_dispatched(timeout_ms=60_000)
    every = [r for br in by_name.values() for r in _store_rows(br.root, topic)]
    times = sorted({r["store_timestamp"] for r in every})
    for t in (times[0], times[len(times) // 2], times[-1]):
        ms = int(t.timestamp() * 1000)
        reader = NetworkBatchReader({"namesrv": ns, "topics": topic, "startingTimestamp": str(ms)}, SCHEMA)
        got = {(r["store_host"], r["queue_id"], r["queue_offset"]) for r in _network_rows(reader)}
        first: dict[tuple[str, int], int] = {}
        for r in every:
            if r["store_timestamp"] >= t:
                key = (r["store_host"], r["queue_id"])
                first[key] = min(first.get(key, 1 << 62), r["queue_offset"])
        assert got == {(r["store_host"], r["queue_id"], r["queue_offset"]) for r in every
                       if r["queue_offset"] >= first.get((r["store_host"], r["queue_id"]), 1 << 62)}


@pytest.mark.parametrize(("options", "message"), [
    ({}, "name the topics to read"),
    ({"subscribePattern": "Ord.*"}, "subscribePattern needs the list of every topic"),
    ({"topics": "Orders", "path": "/tmp/x"}, "either a store directory"),
    ({"topics": "Orders", "accessKey": "ak"}, "accessKey and secretKey go together"),
    ({"topics": "Orders", "mode": "commitlog"}, "over the network a read is by queues"),
    ({"topics": "Orders", "tlsCaFile": "/ca.pem"}, "tlsCaFile is only used with tls=true"),
    ({"topics": "Orders", "consumerGroup": "bad group"}, "consumerGroup='bad group'"),
    ({"topics": "Orders", "pullBatchsize": "0"}, "pullBatchSize=0 must be >= 1"),
])
def test_a_bad_option_is_named_before_anything_is_read(options, message):
    with pytest.raises(OptionError, match=message):
        NetworkBatchReader({"namesrv": "127.0.0.1:1", **options}, SCHEMA)


def test_an_unknown_topic_fails_a_batch_read_naming_it_and_a_stream_waits_for_it(brokers):
    ns, _ = brokers
    with pytest.raises(OptionError, match="topic NoSuchTopic: the NameServers .* know no broker that has it"):
        NetworkBatchReader({"namesrv": ns, "topics": "NoSuchTopic"}, SCHEMA).partitions()
    stream = NetworkStreamReader({"namesrv": ns, "topics": "NoSuchTopic"}, SCHEMA)
    try:
        assert stream.initialOffset() == {}
    finally:
        stream.stop()


# -- retention ------------------------------------------------------------------------------------
def test_offsets_retention_deleted_fail_the_stream_and_the_read_naming_the_range_unless_skipping(tmp_path, caplog,
                                                                                               monkeypatch):
    """A stream whose start is below the queue's earliest offset now fails planning naming the
    range (or skips it, kept in the reader's skipped list); a partition planned before the
    deletion gets PULL_OFFSET_MOVED from the broker and fails (or logs and reads the rest)."""
    settings = {"mapped_file_size_commit_log": 64 * 1024, "file_reserved_time": 0, "delete_when": ALL_HOURS,
                "delete_commit_log_files_interval": 0}
    with running_broker(str(tmp_path / "s"), broker_name="broker-r", front_processes=1, **settings) as broker:
        ns = broker.namesrv_address
        with SyncProducer("PG_retention", ns) as producer:
            for _ in range(12):
                producer.send_batch("R", [b"r" * 1000] * 50, queue_id=0)
        stream = NetworkStreamReader({"namesrv": ns, "topics": "R"}, SCHEMA)
        start = {"broker-r/R/0": 0}
        end = {"broker-r/R/0": 600}
        planned = RemoteSlice("broker-r", "R", 0, 0, 600)
        broker.store.wait_dispatched()

        def deleted() -> int:
            broker.store.execute_delete_files_manually()
            return broker.store.get_min_offset_in_queue("R", 0)

        # (retention goes on deleting meanwhile: each check takes the earliest offset it is told)
        lowest = wait_until(deleted, 60, "retention to delete the first CommitLog files", every_s=0.5)
        try:
            with pytest.raises(DataLossError, match=r"queue broker-r/R/0: offsets \[0, (\d+)\) are no longer stored "
                                                    r"\(retention deleted them; the earliest is \1\)"):
                stream.partitions(start, end)
        finally:
            stream.stop()
        skipping = NetworkStreamReader({"namesrv": ns, "topics": "R", "failOnDataLoss": "false"}, SCHEMA)
        try:
            parts = skipping.partitions(start, end)
        finally:
            skipping.stop()
        assert skipping.skipped == [("broker-r/R/0", 0, parts[0].start)] and parts[0].start >= lowest
        reader = NetworkBatchReader({"namesrv": ns, "topics": "R"}, SCHEMA)
        with pytest.raises(DataLossError, match=r"queue broker-r/R/0: (\d+) message\(s\) of offsets \[0, \1\) are no "
                                                r"longer stored \(below the queue's earliest offset \1\)"):
            list(reader.read(planned))
        lenient = NetworkBatchReader({"namesrv": ns, "topics": "R", "failOnDataLoss": "false"}, SCHEMA)
        lowest = broker.store.get_min_offset_in_queue("R", 0)
        assert 0 < sum(b.num_rows for b in lenient.read(planned)) <= 600 - lowest
        assert "skipped (failOnDataLoss=false)" in caplog.text
        # a range past what the broker holds is named, not waited for forever
        monkeypatch.setattr("mqstore.spark.remote.reader.STALLED_PULLS", 3)
        with pytest.raises(RemoteReadError, match=r"queue broker-r/R/0: broker id 0 answers OFFSET_OVERFLOW"):
            list(reader.read(RemoteSlice("broker-r", "R", 0, 600, 610)))


# -- a slave ----------------------------------------------------------------------------------------
def test_pulls_go_to_the_slave_the_master_suggests_and_back(tmp_path):
    """A master with slave_read_enable (and its backlog threshold at 0, so every pull that finds
    messages is "behind") answers the first pull suggesting broker id 1; the reader's next pulls
    go to the slave (relays on the brokers' registered addresses see which broker answered), and
    the rows are the queue's, once."""
    from test_broker_ha_cpp import MASTER_IP, READ_SETTINGS, SLAVE_IP, route_addrs, tapped

    seq = itertools.count()
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(running_broker(str(tmp_path / "m"), broker_name="broker-m", broker_ip1=MASTER_IP,
                                                    front_processes=1, **READ_SETTINGS))
        master_tap = stack.enter_context(tapped("master", master, MASTER_IP, seq))
        ns = master.namesrv_address
        _send(ns, "broker-m", "Backlog", 200)
        slave = stack.enter_context(running_broker(
            str(tmp_path / "s"), broker_name="broker-m", broker_role="SLAVE", broker_id=1, namesrv_addr=ns,
            broker_ip1=SLAVE_IP, front_processes=1, ha_master_address=f"{LOOPBACK}:{master.store.ctl.get('ha_port')}",
            **READ_SETTINGS))
        slave_tap = stack.enter_context(tapped("slave", slave, SLAVE_IP, seq))
        end = master.store.ctl.get("wrote")
        wait_until(lambda: slave.store.ctl.get("dispatched") == end, 30, what="the slave to hold the master's log")
        wait_until(lambda: "Backlog" in slave.controller.topics.table, 30, what="the slave to copy the topics")
        wait_until(lambda: route_addrs(ns, "Backlog") == {"0": master.address, "1": slave.address}, 30,
                   what="the NameServer to list the master and the slave")
        assert master.store.wait_dispatched(timeout_ms=60_000)
        reader = NetworkBatchReader({"namesrv": ns, "topics": "Backlog", "pullBatchSize": "8"}, SCHEMA)
        rows = _network_rows(reader)
        assert not master_tap.errors and not slave_tap.errors
    assert sorted((r["queue_id"], r["queue_offset"]) for r in rows) == [(q, o) for q in range(4) for o in range(50)]
    for q in range(4):
        pulls = sorted(master_tap.of("Backlog", q) + slave_tap.of("Backlog", q), key=lambda p: p.asked)
        print(f"queue {q}:", " ".join(f"{p.broker}@{p.offset}:{len(p.bodies)}->{p.suggest}" for p in pulls))
        assert (pulls[0].broker, pulls[0].suggest) == ("master", 1)
        assert pulls[1].broker == "slave" and pulls[1].offset == pulls[0].next_offset
        assert sum(len(p.bodies) for p in pulls if p.broker == "slave") > 25


# -- ACL and TLS ------------------------------------------------------------------------------------
ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: sparkjob
    secretKey: "spark-secret"
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Secured=PUB|SUB
      - Copied=PUB|SUB
  - accessKey: sparkadmin
    secretKey: "admin-secret"
    whiteRemoteAddress:
    admin: true
"""


def test_with_the_acl_on_the_source_and_the_sink_sign_with_access_and_secret_keys(tmp_path):
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    with running_broker(str(tmp_path / "s"), broker_name="broker-acl", acl_enable=True, acl_file=str(acl_file),
                        front_processes=1) as broker:
        ns = broker.namesrv_address
        with SyncProducer("PG_admin", ns, credentials=("sparkadmin", "admin-secret")) as admin:
            for topic in ("Secured", "Copied"):
                for i in range(30):
                    admin.send(topic, b"s%d" % i, queue_id=i % 2)
        assert broker.store.wait_dispatched(timeout_ms=60_000)  # a pull sees what is dispatched
        keys = {"accessKey": "sparkjob", "secretKey": "spark-secret"}
        rows = _network_rows(NetworkBatchReader({"namesrv": ns, "topics": "Secured", **keys}, SCHEMA))
        assert sorted(r["body"] for r in rows) == sorted(b"s%d" % i for i in range(30))
        with pytest.raises(Exception, match="AccessKey"):
            NetworkBatchReader({"namesrv": ns, "topics": "Secured"}, SCHEMA).partitions()
        batch = pa.record_batch({"topic": ["Copied"] * 5, "body": [b"c%d" % i for i in range(5)]})
        schema = StructType([StructField("topic", StringType()), StructField("body", BinaryType())])
        assert NetworkBatchWriter({"namesrv": ns, **keys}, schema, False).write(iter([batch])).messages == 5
        with pytest.raises(WriteError, match="Secured2"):
            other = pa.record_batch({"topic": ["Secured2"], "body": [b"x"]})
            NetworkBatchWriter({"namesrv": ns, **keys}, schema, False).write(iter([other]))
        broker.store.wait_dispatched()
        assert sum(broker.store.get_max_offset_in_queue("Copied", q) for q in range(4)) == 30 + 5


def test_over_tls_the_source_and_the_sink_check_the_brokers_certificate(tmp_path):
    from helpers_tls import make_pki
    from test_client_tls import tls_broker

    pki = make_pki(tmp_path / "pki")
    with tls_broker(str(tmp_path / "s"), pki, "enforcing", broker_name="broker-tls") as broker:
        ns = broker.namesrv_address
        tls = {"tls": "true", "tlsCaFile": pki.ca, "namesrvTls": "false"}
        batch = pa.record_batch({"topic": ["Tls"] * 20, "body": [b"t%d" % i for i in range(20)]})
        schema = StructType([StructField("topic", StringType()), StructField("body", BinaryType())])
        assert NetworkBatchWriter({"namesrv": ns, **tls}, schema, False).write(iter([batch])).messages == 20
        broker.store.wait_dispatched()
        with Cluster(ClusterConfig.from_options({"namesrv": ns, "tls": "true", "tlscafile": pki.ca,
                                                 "namesrvtls": "false"}), route_ttl=0.1) as cluster:
            wait_until(lambda: cluster.message_queues(["Tls"], missing_ok=True), 30, "the topic's route")
        rows = _network_rows(NetworkBatchReader({"namesrv": ns, "topics": "Tls", **tls}, SCHEMA))
        assert sorted(r["body"] for r in rows) == sorted(b"t%d" % i for i in range(20))
        with pytest.raises(Exception, match="(?i)tls|ssl|closed|certificate"):
            NetworkBatchReader({"namesrv": ns, "topics": "Tls", "timeoutMs": "3000"}, SCHEMA).read(
                RemoteSlice("broker-tls", "Tls", 0, 0, 5)).__next__()


# -- the streaming sink's records ------------------------------------------------------------------
SINK_SCHEMA = StructType([StructField("topic", StringType()), StructField("body", BinaryType()),
                          StructField("keys", StringType())])


def _sink_rows(topic: str, n: int, tag: str = "") -> pa.RecordBatch:
    return pa.record_batch({"topic": [topic] * n, "body": [f"{tag}{i}".encode() for i in range(n)],
                            "keys": [None if i % 3 else f"k{i}" for i in range(n)]})


def _stored(ns: str, topic: str, brokers: dict[str, Any]) -> list[dict[str, Any]]:
    """Every message of topic, read over the network once each broker has dispatched what it
    acknowledged (a send is acknowledged when the CommitLog holds it; a pull sees it once its
    ConsumeQueue unit is built, which a loaded machine can delay)."""
    for broker in brokers.values():
        assert broker.store.wait_dispatched(timeout_ms=60_000)
    with Cluster(ClusterConfig(ns), route_ttl=0.1) as cluster:
        wait_until(lambda: cluster.message_queues([topic], missing_ok=True), 30, "the topic's route")
    return _network_rows(NetworkBatchReader({"namesrv": ns, "topics": topic}, SCHEMA))


def test_a_task_retried_after_dying_half_way_sends_only_the_rest_and_a_replay_nothing(brokers, monkeypatch):
    """Attempt 0 of partition 3 of micro-batch 5 dies after two of its batch sends; attempt 1
    counts the marked messages each queue holds from its begin record and sends the rest;
    after the driver's commit a replay of the micro-batch sends nothing; another query (a new
    checkpoint) with the same sinkId and batch id writes its rows."""
    ns, by_name = brokers
    topic = f"Sunk{next(_topics)}"
    writer = NetworkStreamWriter({"namesrv": ns, "sinkId": f"etl{topic}"}, SINK_SCHEMA, False)
    rows = _sink_rows(topic, 3000)
    real = SyncProducer.send_batch
    calls = itertools.count()

    def dying(self: SyncProducer, *args: Any, **kwargs: Any) -> Any:
        if next(calls) == 2:
            raise ConnectionError("the executor died")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SyncProducer, "send_batch", dying)
    with pytest.raises(ConnectionError):
        writer.write_task(iter([rows]), 5, "query-1", 3)
    monkeypatch.setattr(SyncProducer, "send_batch", real)
    before = len(_stored(ns, topic, by_name))
    assert 0 < before < 3000
    report = writer.write_task(iter([rows]), 5, "query-1", 3)
    assert report.messages == 3000 - before
    got = _stored(ns, topic, by_name)
    assert sorted(r["body"] for r in got) == sorted(f"{i}".encode() for i in range(3000))
    assert {dict(r["properties"])[SINK_PROPERTY] for r in got} == {f"etl{topic}:5:3"}
    again = _sink_rows(topic, 3000)
    writer.commit([SinkReport(3, report.messages, query="query-1"), None], 5)
    assert writer.write_task(iter([again]), 5, "query-1", 3).messages == 0
    assert writer.write_task(iter([_sink_rows(topic, 10, "b6-")]), 6, "query-1", 3).messages == 10
    assert writer.write_task(iter([_sink_rows(topic, 7, "q2-")]), 5, "query-2", 0).messages == 7
    assert len(_stored(ns, topic, by_name)) == 3000 + 10 + 7
    # the sink's records and fences are topics of their own
    with Cluster(ClusterConfig(ns)) as cluster:
        assert cluster.message_queues([f"MQSTORE_SINK_etl{topic}"])
        assert cluster.message_queues([fence_topic("broker-a")]) and cluster.message_queues([fence_topic("broker-b")])


def test_a_sink_names_what_it_cannot_do(brokers):
    ns, _ = brokers
    with pytest.raises(OptionError, match="needs option sinkId"):
        NetworkStreamWriter({"namesrv": ns}, SINK_SCHEMA, False)
    with pytest.raises(OptionError, match="1 to 100 of"):
        NetworkStreamWriter({"namesrv": ns, "sinkId": "has.dot"}, SINK_SCHEMA, False)
    with pytest.raises(OptionError, match="queueCount does not apply with namesrv"):
        NetworkBatchWriter({"namesrv": ns, "queueCount": "4"}, SINK_SCHEMA, False)
    with pytest.raises(OptionError, match="append-only"):
        NetworkBatchWriter({"namesrv": ns}, SINK_SCHEMA, True)
    writer = NetworkBatchWriter({"namesrv": ns}, SINK_SCHEMA, False)
    with pytest.raises(WriteError, match=r"row 1 \(topic Orders\): no write queue broker-a/7; the topic's write "
                                         r"queues are broker-a/0, .*broker-b/3"):
        rows = pa.record_batch({"topic": ["Orders"] * 2, "body": [b"a", b"b"], "queue_id": pa.array([0, 7], pa.int32()),
                                "broker": ["broker-a"] * 2})
        writer.write(iter([rows]))
    with pytest.raises(WriteError, match="row 0 .*body is null"):
        writer.write(iter([pa.record_batch({"topic": ["Orders"], "body": pa.array([None], pa.binary())})]))


# -- through Spark ----------------------------------------------------------------------------------
def test_spark_reads_and_writes_the_cluster_with_format_mqstore(spark, brokers, tmp_path):
    """A batch read of both brokers, a batch write of a copy (queue_id and broker kept, so each
    message lands in the queue it came from), a stream from the cluster into the cluster with
    the exactly-once sink (availableNow, run twice as more messages come)."""
    ns, by_name = brokers
    df = spark.read.format("mqstore").option("namesrv", ns).option("topics", TOPIC).load()
    assert df.count() == 2 * PER_BROKER
    copy = f"Copy{next(_topics)}"
    create_topic(ns, copy, *by_name.values())
    (spark.read.format("mqstore").option("namesrv", ns).option("topics", TOPIC)
     .schema("topic string, queue_id int, broker string, body binary, keys string, tags string").load()
     .selectExpr(f"'{copy}' as topic", "queue_id", "broker", "body", "keys", "tags")
     .write.format("mqstore").option("namesrv", ns).mode("append").save())
    copied = _stored(ns, copy, by_name)
    original = {(r["store_host"], r["queue_id"], r["body"]) for br in by_name.values() for r in _store_rows(br.root)}
    assert {(r["store_host"], r["queue_id"], r["body"]) for r in copied} == original and len(copied) == len(original)

    out = f"Streamed{next(_topics)}"

    def run() -> None:
        q = (spark.readStream.format("mqstore").option("namesrv", ns).option("topics", copy)
             .option("maxRecordsPerTrigger", 500).load()
             .selectExpr(f"'{out}' as topic", "body", "keys")
             .writeStream.format("mqstore").option("namesrv", ns).option("sinkId", out)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
        try:
            q.awaitTermination(240)
        finally:
            q.stop()

    run()
    _send(ns, "broker-b", copy, 50, tag="late-")
    by_name["broker-b"].store.wait_dispatched()
    run()
    streamed = Counter(r["body"] for r in _stored(ns, out, by_name))
    expected = Counter(r["body"] for r in copied) + Counter(
        (f"broker-b-late-{i}-".encode()) * (1 if i % 3 else 40) for i in range(50))
    assert streamed == expected
    sink_records = _stored(ns, f"MQSTORE_SINK_{out}", by_name)
    assert {json.loads(r["body"])["kind"] for r in sink_records} >= {"begin", "done"}

