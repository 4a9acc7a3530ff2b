"""Topic creation bounded (docs/broker.md "Topic limits"; issue: 9,103 anonymous sends to new
topics took 52 GB, one 5.86 MB ConsumeQueue file each, and made route look-ups and offset
commits take 5-10 s).

Disk: a new ConsumeQueue file has its full size but only a page of disk, and grows with its
units; a recovery over its hole reads no page of it. Caps: max_topic_count (sends, admin
creations, retry topics), auto_create_topic_max_per_second (SYSTEM_BUSY), and
auto_create_topic_max_per_connection (a new connection may create again). A flood of new-topic
sends leaves another client's heartbeats, offset commits and sends answered quickly, and
config/topics.json holds every created topic after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import threading
import time
from typing import Any

import pytest
from helpers_broker import running_broker
from helpers_proc import wait_until

from mqstore import Message, MessageStore
from mqstore.queue._consumequeue import CQ_ALLOCATE_STEP_MAX
from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.broker.codes import RequestCode
from mqstore.broker.topics import PERSIST_INTERVAL_S, AutoCreations, TopicConfigs
from mqstore.protocol import ResponseCode
from mqstore.queue.consume_queue import ConsumeQueue
from mqstore.tools.checker import check_store

PAGE = 4096
CQ_FILE = 300_000 * 20  # mapped_file_size_consume_queue's default


def allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


# == disk ========================================================================================

def test_a_new_queue_file_with_one_unit_costs_a_page(tmp_path):
    """One message to a new topic: its queue file is the full 5.86 MB to readers, a page on the
    disk. More units allocate more, in steps, never much more than they fill; after a restart
    the queue goes on where it was and the store verifies clean."""
    root = str(tmp_path / "store")
    with MessageStore(root) as store:
        store.put_message(Message("OneByte", b"x", queue_id=0)).check()
        assert store.wait_dispatched()
        path = os.path.join(root, "consumequeue", "OneByte", "0", "00000000000000000000")
        assert os.path.getsize(path) == CQ_FILE
        assert allocated(path) <= PAGE, f"{allocated(path)} bytes of disk for one unit"
        for i in range(2000):  # 40,000 bytes of units
            store.put_message(Message("OneByte", b"y%d" % i, queue_id=0)).check()
        assert store.wait_dispatched()
        assert 40_020 <= allocated(path) <= 2 * 40_020 + PAGE
    with MessageStore(root) as store:
        store.put_message(Message("OneByte", b"z", queue_id=0)).check()
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("OneByte", 0) == 2002
        got = store.read_messages("OneByte", 0, offset=1999, max_msg_nums=10)
        assert got.bodies() == [b"y1998", b"y1999", b"z"]
    assert allocated(path) <= 2 * 40_040 + PAGE
    report = check_store(root)
    assert report.ok, report.problems


def test_units_go_into_allocated_blocks_only(tmp_path):
    """The kernel allocates ahead of every unit (doubling, at most a MiB at once), also for the
    filler units of a queue that starts above offset 0; the file's apparent size never changes."""
    cq = ConsumeQueue(str(tmp_path), "T", 0, 20 * 100_000)
    cq.put_message_position_info(0, 10, 0, 0)
    mf = cq.files.last()
    assert mf is not None and mf.allocated == PAGE and allocated(mf.path) == PAGE
    for q in range(1, 1000):
        cq.put_message_position_info(q * 10, 10, 0, q)
        assert mf.allocated >= (q + 1) * 20
    assert mf.allocated <= 2 * 20_000 + PAGE and allocated(mf.path) == mf.allocated
    assert os.path.getsize(mf.path) == 20 * 100_000
    cq.close()
    late = ConsumeQueue(str(tmp_path), "Late", 0, 20 * 100_000)
    late.put_message_position_info(500, 10, 0, 50_000)  # a queue starting at 50,000: fillers before
    mf = late.files.last()
    assert mf is not None and 50_001 * 20 <= mf.allocated <= 50_001 * 20 + CQ_ALLOCATE_STEP_MAX + PAGE
    assert late.unit(50_000) == (500, 10, 0)
    late.close()


def test_recovery_reads_no_page_of_a_hole(tmp_path):
    """Truncating a torn tail (zero_dirty_tail) zeroes the torn bytes and skips the file's hole
    without reading it, so it allocates nothing (on tmpfs a hole read through a shared mapping
    takes a page, and a SIGBUS when the disk is full)."""
    root = str(tmp_path / "cq")
    cq = ConsumeQueue(root, "T", 0, 20 * 100_000)
    for q in range(10):
        cq.put_message_position_info(q * 10, 10, 0, q)
    mf = cq.files.last()
    assert mf is not None
    mf.write_at(200, b"\x7f" * 30)  # a torn unit and a half after the ten
    cq.sync_position()
    cq.close()
    cq = ConsumeQueue(root, "T", 0, 20 * 100_000)
    cq.load()
    report = cq.recover()
    assert report.max_offset == 10 and report.dropped_units == 2
    mf = cq.files.last()
    assert mf is not None and mf.read(200, 40) == b"\0" * 40
    assert allocated(mf.path) == PAGE
    cq.close()


# == the limits, unit by unit ====================================================================

def test_the_rate_is_a_bucket_refilled_every_second():
    now = [100.0]
    made = AutoCreations(clock=lambda: now[0])
    assert [made.rate_refusal(5) for _ in range(5)] == [None] * 5
    refused = made.rate_refusal(5)
    assert refused is not None and "auto_create_topic_max_per_second (5)" in refused
    now[0] += 0.2  # a fifth of a second: one token back
    assert made.rate_refusal(5) is None and made.rate_refusal(5) is not None
    now[0] += 60  # a quiet minute fills the bucket, no more
    assert [made.rate_refusal(5) for _ in range(6)].count(None) == 5


def test_connections_are_counted_and_forgotten():
    made = AutoCreations()
    live = {"11"}
    for _ in range(3):
        assert made.connection_refusal("11:1", 3) is None
        made.created("11:1", lambda: live)
    refused = made.connection_refusal("11:1", 3)
    assert refused is not None and "auto_create_topic_max_per_connection is 3" in refused
    assert made.connection_refusal("11:2", 3) is None
    made.forget("11:1")
    assert made.connection_refusal("11:1", 3) is None
    for i in range(2000):  # connections of a front that died (never reported closed) are dropped
        made.created(f"99:{i}", lambda: live)
    assert len(made.by_conn) < 1100


def test_the_cap_counts_every_topic(tmp_path):
    topics = TopicConfigs(str(tmp_path))
    startup = len(topics.table)
    assert topics.room_refusal("New", startup + 1) is None
    refused = topics.room_refusal("New", startup)
    assert refused is not None and f"holds {startup} topics and max_topic_count is {startup}" in refused
    assert topics.room_refusal("TBW102", startup) is None, "an update is no creation"


def test_topics_json_is_written_a_few_times_a_second_and_at_the_end(tmp_path, monkeypatch):
    """persist_soon: the first change is written at once, the next ones of the same half second
    together; a cancelled writer (the broker's loop ending) writes what is pending first."""
    topics = TopicConfigs(str(tmp_path))
    writes = []
    real = topics._write

    def counted(generation: int, wrapper: dict[str, Any]) -> None:
        writes.append(len(wrapper["topicConfigTable"]))
        real(generation, wrapper)
    monkeypatch.setattr(topics, "_write", counted)
    startup = len(topics.table)

    def on_disk() -> set[str]:
        with open(topics.path, encoding="utf-8") as fh:
            return set(json.load(fh)["topicConfigTable"])

    async def flood() -> None:
        for i in range(500):
            topics.add({**topics.table["TBW102"], "topicName": f"T{i}", "perm": 6})
            topics.persist_soon()
            if i % 50 == 0:
                await asyncio.sleep(0.01)
        await asyncio.sleep(PERSIST_INTERVAL_S * 2 + 0.5)
        assert not topics.persist_pending and on_disk() >= {f"T{i}" for i in range(500)}
        topics.add({**topics.table["TBW102"], "topicName": "Last", "perm": 6})
        topics.persist_soon()
        writer = topics._writer
        assert writer is not None
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer

    asyncio.run(flood())
    assert "Last" in on_disk() and len(on_disk()) == startup + 501
    assert 2 <= len(writes) <= 6, writes


# == a broker ====================================================================================

def _send_fields(topic: str) -> dict[str, str]:
    return {"producerGroup": "PID_LIMITS", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": ""}


class Client:
    """One blocking connection speaking remoting frames, one request at a time (or pipelined)."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.frames = FrameReader()
        self.opaque = 0

    def request(self, code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
        self.opaque += 1
        self.sock.sendall(RemotingCommand(code, language="JAVA", opaque=self.opaque, ext_fields=fields,
                                          body=body).encode())
        while True:  # the broker's own requests (NOTIFY_CONSUMER_IDS_CHANGED) are passed over
            while (got := self.frames.next()) is None:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                self.frames.feed(data)
            if got.is_response:
                assert got.opaque == self.opaque
                return got

    def send(self, topic: str, body: bytes = b"x") -> RemotingCommand:
        return self.request(RequestCode.SEND_MESSAGE, _send_fields(topic), body)

    def send_frame(self, topic: str, body: bytes = b"x") -> RemotingCommand:
        self.opaque += 1
        return RemotingCommand(RequestCode.SEND_MESSAGE, language="JAVA", opaque=self.opaque,
                               ext_fields=_send_fields(topic), body=body)

    def pipeline(self, cmds: list[RemotingCommand]) -> list[RemotingCommand]:
        """Send every request at once; their responses (in any order)."""
        self.sock.sendall(b"".join(cmd.encode() for cmd in cmds))
        waiting = {cmd.opaque for cmd in cmds}
        out = []
        while waiting:
            while (got := self.frames.next()) is None:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                self.frames.feed(data)
            if got.is_response and got.opaque in waiting:
                waiting.discard(got.opaque)
                out.append(got)
        return out

    def heartbeat(self, client_id: str, consumer_group: str | None = None) -> RemotingCommand:
        consumers = [] if consumer_group is None else [{
            "groupName": consumer_group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}]
        body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": "PID_LIMITS"}],
                           "consumerDataSet": consumers}).encode()
        return self.request(RequestCode.HEART_BEAT, {}, body)

    def commit(self, group: str, topic: str, offset: int) -> RemotingCommand:
        return self.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                                 "queueId": "0", "commitOffset": str(offset)})

    def create_topic(self, topic: str) -> RemotingCommand:
        return self.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6",
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def on_disk_topics(root: str) -> set[str]:
    with open(os.path.join(root, "config", "topics.json"), encoding="utf-8") as fh:
        return set(json.load(fh)["topicConfigTable"])


@pytest.mark.multiprocess
def test_past_max_topic_count_creations_are_refused_and_existing_topics_work(tmp_path):
    """Sends, admin creations and a consumer group's retry topic stop at max_topic_count,
    named with the count; sends to existing topics, admin updates of them, go on."""
    root = str(tmp_path / "store")
    startup = len(TopicConfigs(str(tmp_path / "probe")).table)
    with running_broker(root, front_processes=1, max_topic_count=startup + 3) as broker, Client(broker.address) as c:
        assert [c.send(f"Capped{i}").code for i in range(2)] == [ResponseCode.SUCCESS] * 2
        assert c.create_topic("CappedAdmin").code == ResponseCode.SUCCESS
        refused = c.send("OneTooMany")
        assert refused.code == ResponseCode.TOPIC_NOT_EXIST
        assert f"the broker holds {startup + 3} topics and max_topic_count is {startup + 3}" in refused.remark
        admin = c.create_topic("AdminTooMany")
        assert admin.code == ResponseCode.SYSTEM_ERROR and "max_topic_count" in admin.remark
        assert c.heartbeat("limits@1", "CID_LIMITS").code == ResponseCode.SUCCESS  # its retry topic: no room
        assert broker.controller.topics.get("%RETRY%CID_LIMITS") is None
        assert c.send("Capped0").code == ResponseCode.SUCCESS
        assert c.create_topic("CappedAdmin").code == ResponseCode.SUCCESS, "an update of an existing topic"
        assert len(broker.controller.topics.table) == startup + 3
        wait_until(lambda: not broker.controller.topics.persist_pending, 10, "topics.json written")
        assert {"Capped0", "Capped1", "CappedAdmin"} <= on_disk_topics(root)
        assert "OneTooMany" not in on_disk_topics(root)


@pytest.mark.multiprocess
def test_past_the_rate_a_burst_gets_system_busy_then_creations_resume(tmp_path):
    with running_broker(root := str(tmp_path / "store"), front_processes=1,
                        auto_create_topic_max_per_second=5) as broker, Client(broker.address) as c:
        answers = [c.send(f"Burst{i}") for i in range(30)]
        ok = [a for a in answers if a.code == ResponseCode.SUCCESS]
        busy = [a for a in answers if a.code == ResponseCode.SYSTEM_BUSY]
        assert len(ok) + len(busy) == 30 and 5 <= len(ok) <= 10, [a.code for a in answers]
        assert all("auto_create_topic_max_per_second (5)" in (a.remark or "") for a in busy)
        assert c.send("Burst0").code == ResponseCode.SUCCESS, "an existing topic is no creation"
        time.sleep(1.0)
        assert [c.send(f"Later{i}").code for i in range(4)] == [ResponseCode.SUCCESS] * 4
        assert broker.controller.topics.get("Later3") is not None
    assert {"Later0", "Later3"} <= on_disk_topics(root)


@pytest.mark.multiprocess
def test_past_the_connection_cap_a_new_connection_may_create_again(tmp_path):
    with running_broker(str(tmp_path / "store"), front_processes=1,
                        auto_create_topic_max_per_connection=3) as broker:
        with Client(broker.address) as first:
            assert [first.send(f"Mine{i}").code for i in range(3)] == [ResponseCode.SUCCESS] * 3
            refused = first.send("Mine3")
            assert refused.code == ResponseCode.TOPIC_NOT_EXIST
            assert "auto_create_topic_max_per_connection is 3" in refused.remark
            assert first.send("Mine0").code == ResponseCode.SUCCESS, "its topics still take its sends"
            with Client(broker.address) as second:
                assert second.send("Mine3").code == ResponseCode.SUCCESS
        counts = broker.controller.topics.auto_creations.by_conn
        wait_until(lambda: not counts, 10, "the closed connections forgotten")


def _observe(address: str, stop: threading.Event, out: dict[str, list[float]]) -> None:
    """Heartbeats, offset commits and sends to an existing topic, timed, until stop."""
    with Client(address) as c:
        i = 0
        while not stop.is_set():
            for what, call in (("heartbeat", lambda: c.heartbeat("observer@1", "CID_OBSERVER")),
                               ("commit", lambda: c.commit("CID_OBSERVER", "Existing", i)),
                               ("send", lambda: c.send("Existing", b"o"))):
                t0 = time.monotonic()
                got = call()
                out[what].append(time.monotonic() - t0)
                assert got.code == ResponseCode.SUCCESS, (what, got.code, got.remark)
            i += 1
            time.sleep(0.01)


def _flood(address: str, count: int, window: int = 100) -> tuple[dict[int, int], float]:
    """Sends to `count` new topics from one connection, `window` of them pipelined at a time (a
    first send waits for its topic's registration with the NameServers, as in RocketMQ: one at a
    time they would be paced by it)."""
    codes: dict[int, int] = {}
    t0 = time.monotonic()
    with Client(address) as c:
        for start in range(0, count, window):
            for got in c.pipeline([c.send_frame(f"Flood{i}") for i in range(start, min(count, start + window))]):
                codes[got.code] = codes.get(got.code, 0) + 1
    return codes, time.monotonic() - t0


def _summary(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return (f"n={len(ms)} p50={statistics.median(ms):.1f} p99={ms[int(len(ms) * 0.99)]:.1f} "
            f"max={ms[-1]:.1f} ms")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_flood_of_new_topics_is_bounded_and_others_keep_being_answered(tmp_path: Any, capsys: Any) -> None:
    """2,000 sends to new topics from one connection: with the default limits it creates its
    auto_create_topic_max_per_connection (100) and is refused the rest, quickly; with the
    limits raised it creates all 2,000 while another client's heartbeats, offset commits and
    sends to an existing topic keep being answered (latencies printed; the bound asserted is
    generous). Every created topic is in topics.json after a restart, and is a topic there."""
    root = str(tmp_path / "store")
    report = []
    with running_broker(root, front_processes=1) as broker:
        with Client(broker.address) as c:
            assert c.send("Existing").code == ResponseCode.SUCCESS
        codes, took = _flood(broker.address, 2000)
        report.append(f"default limits: 2,000 sends in {took:.1f} s: {codes}")
        assert 50 <= codes.get(ResponseCode.SUCCESS, 0) <= 100 and sum(codes.values()) == 2000
        assert set(codes) <= {ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY, ResponseCode.TOPIC_NOT_EXIST}
        assert took < 60
        created_first = {t for t in broker.controller.topics.table if t.startswith("Flood")}
    assert created_first <= on_disk_topics(root)
    with running_broker(root, front_processes=1, auto_create_topic_max_per_second=100_000,
                        auto_create_topic_max_per_connection=100_000) as broker:
        assert created_first <= set(broker.controller.topics.table)
        stop = threading.Event()
        latencies: dict[str, list[float]] = {"heartbeat": [], "commit": [], "send": []}
        errors: list[BaseException] = []

        def observe() -> None:
            try:
                _observe(broker.address, stop, latencies)
            except BaseException as exc:  # reported below
                errors.append(exc)
        observer = threading.Thread(target=observe, daemon=True)
        observer.start()
        wait_until(lambda: len(latencies["send"]) >= 5, 20, "the observer running")
        codes, took = _flood(broker.address, 2000)
        stop.set()
        observer.join(30)
        assert not errors, errors
        report.append(f"limits raised: 2,000 sends in {took:.1f} s ({2000 / took:.0f}/s): {codes}")
        for what, samples in latencies.items():
            report.append(f"  {what} during the flood: {_summary(samples)}")
        assert codes == {ResponseCode.SUCCESS: 2000}
        assert max(max(s) for s in latencies.values()) < 5.0, report
        t0 = time.monotonic()  # each new queue's first file is made by the dispatcher: it runs behind
        wait_until(lambda: broker.store.dispatch_behind_bytes == 0, 120, "the dispatcher caught up")
        report.append(f"  the dispatcher caught up {time.monotonic() - t0:.1f} s after the flood")
        created = {t for t in broker.controller.topics.table if t.startswith("Flood")}
        registrations = broker.controller.registrations
        report.append(f"  NameServer registrations: {registrations}")
    assert len(created) == 2000 and created <= on_disk_topics(root)
    with running_broker(root, front_processes=1) as broker, Client(broker.address) as c:
        assert created <= set(broker.controller.topics.table)
        before = len(broker.controller.topics.table)
        assert c.send("Flood1999").code == ResponseCode.SUCCESS
        assert len(broker.controller.topics.table) == before
    queue_files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "consumequeue")) for f in fs]
    used = sum(allocated(p) for p in queue_files)
    report.append(f"  {len(queue_files)} queue files: {used / 1024:.0f} KiB on disk")
    assert used <= len(queue_files) * PAGE + (1 << 20)  # a page each; a few queues of the observer grew
    with capsys.disabled():
        print("\n" + "\n".join(report))
