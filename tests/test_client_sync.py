"""mqstore.client.SyncProducer, the blocking producer, against a real broker on loopback
(tests/helpers_broker.py) and against fake servers in a thread: what it sends is stored exactly
(read back through the broker's store), with both header serializations and both send codes;
batches, oneway sends, threads sharing one producer, heartbeats, UNREGISTER_CLIENT at close,
and its errors: error responses, timeouts, frames that cannot be decoded, requests the server
sends, a broker that stops, bad arguments. Every loop is bounded in count and time."""

from __future__ import annotations

import itertools
import json
import os
import re
import selectors
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable

import pytest

from helpers_broker import running_broker
from helpers_proc import wait_until
from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.client import (ClientStateError, ConnectFailedError, ConnectionClosedError, Message, MessageQueue,
                            MQClientError, Producer, RemotingTimeoutError, RequestCode, ResponseCode, SendStatus,
                            SyncProducer)
from mqstore.client.protocol import SYSTEM_PROPERTIES

SERIALIZE = pytest.mark.parametrize("ser", ["JSON", "ROCKETMQ"])
SEND_CODES = pytest.mark.parametrize("code", ["SEND_MESSAGE_V2", "SEND_MESSAGE"])
_topic_seq = itertools.count()


def new_topic(name: str) -> str:
    return f"Sync{name}_{next(_topic_seq)}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with running_broker(str(tmp_path_factory.mktemp("client_sync") / "store")) as b:
        yield b


def stored(broker, topic: str, queue_id: int, count: int, deadline_s: float = 10.0) -> list:
    """The first count records of the queue, read back from the broker's store (decoded), once
    they are all dispatched."""
    deadline = time.monotonic() + deadline_s
    while True:
        broker.store.wait_dispatched(timeout_ms=500)
        got = broker.store.read_messages(topic, queue_id, 0, count + 10)
        records = [m.decode() for m in got] if got.ok else []
        if len(records) >= count:
            return records
        assert time.monotonic() < deadline, f"only {len(records)} of {count} messages in {topic}:{queue_id}"
        time.sleep(0.05)


def user_properties(record) -> dict[str, str]:
    return {k: v for k, v in record.properties.items() if k not in SYSTEM_PROPERTIES}


# -- sends against the broker ------------------------------------------------------------------------
@SERIALIZE
@SEND_CODES
def test_sends_are_stored_exactly(broker, ser, code):
    topic = new_topic("Send")
    big = os.urandom(64) * 40
    with SyncProducer("PG_sync", broker.namesrv_address, serialize=ser, send_code=code,
                      compress_over=1000) as producer:
        sent = []
        for i in range(6):
            body = bytes([i]) * (i + 1) + b"\x00\xff body" if i != 5 else big
            props = {"user": f"u{i}", "ünïcode": "välue ✓"}
            result = producer.send(topic, body, tags=f"Tag{i % 2}", keys=[f"k{i}", "shared"], properties=props,
                                   queue_id=1, flag=i)
            assert result.status is SendStatus.SEND_OK
            assert (result.topic, result.broker_name, result.queue_id, result.queue_offset) == (topic, "broker-a", 1, i)
            assert re.fullmatch(r"[0-9A-F]{32}", result.msg_id)
            assert re.fullmatch(r"[0-9A-F]{32}", result.offset_msg_id) and result.offset_msg_id != result.msg_id
            sent.append((body, props, result))
        message = producer.send_message(topic, Message(b"as a Message", tags="M", keys="mk", flag=7), queue_id=1)
        assert message.queue_offset == 6
        assert producer.heartbeats == 1, "one HEART_BEAT, before the first send"
    records = stored(broker, topic, 1, 7)
    for i, ((body, props, result), rec) in enumerate(zip(sent, records)):
        raw = zlib.decompress(rec.body) if rec.sys_flag & 1 else rec.body
        assert raw == body and rec.queue_offset == i and rec.flag == i
        assert bool(rec.sys_flag & 1) == (len(body) >= 1000), "bodies of 1000 bytes or more are compressed"
        assert rec.tags == f"Tag{i % 2}" and rec.keys == [f"k{i}", "shared"]
        assert user_properties(rec) == props
        assert rec.properties["UNIQ_KEY"] == result.msg_id and "WAIT" not in rec.properties
        assert rec.physical_offset == int(result.offset_msg_id[-16:], 16)
    last = records[6]
    assert (last.body, last.tags, last.keys, last.flag) == (b"as a Message", "M", ["mk"], 7)
    assert last.properties["UNIQ_KEY"] == message.msg_id


@SERIALIZE
def test_a_batch_is_stored_as_its_messages_in_order(broker, ser):
    topic = new_topic("Batch")
    items: list = []
    for i in range(100):
        if i % 3 == 0:
            items.append(b"plain %d" % i)
        elif i % 3 == 1:
            items.append((b"with props %d" % i, {"i": str(i)}))
        else:
            items.append(Message(b"message %d" % i, tags="BatchTag", keys=f"key{i}", properties={"i": str(i)}, flag=i))
    with SyncProducer("PG_sync_batch", broker.namesrv_address, serialize=ser) as producer:
        result = producer.send_batch(topic, items, queue_id=2)
        assert result.status is SendStatus.SEND_OK and (result.queue_id, result.queue_offset) == (2, 0)
        again = producer.send_batch(topic, [b"second"] * 3, queue_id=2)
        assert again.queue_offset == 100 and len(again.msg_id.split(",")) == 3
    ids = result.msg_id.split(",")
    assert len(ids) == len(set(ids)) == 100 and len(result.offset_msg_id.split(",")) == 100
    records = stored(broker, topic, 2, 103)
    assert [r.queue_offset for r in records] == list(range(103))
    assert [r.properties["UNIQ_KEY"] for r in records[:100]] == ids
    for i, rec in enumerate(records[:100]):
        if i % 3 == 0:
            assert rec.body == b"plain %d" % i and user_properties(rec) == {} and rec.tags is None
        elif i % 3 == 1:
            assert rec.body == b"with props %d" % i and user_properties(rec) == {"i": str(i)}
        else:
            assert (rec.body, rec.tags, rec.keys, rec.flag) == (b"message %d" % i, "BatchTag", [f"key{i}"], i)
    assert [r.body for r in records[100:]] == [b"second"] * 3


@SERIALIZE
def test_oneway_sends_are_stored(broker, ser):
    topic = new_topic("Oneway")
    with SyncProducer("PG_sync_ow", broker.namesrv_address, serialize=ser) as producer:
        ids = [producer.send_oneway(topic, b"oneway %d" % i, tags="OW", queue_id=3) for i in range(3)]
        assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
        producer.send(topic, b"after", queue_id=3)  # a round trip after the oneway sends
        assert producer._connections[broker.address].unmatched == 0, "no response to a oneway request"
    records = stored(broker, topic, 3, 4)
    assert [r.body for r in records] == [b"oneway 0", b"oneway 1", b"oneway 2", b"after"]
    assert [r.properties["UNIQ_KEY"] for r in records[:3]] == ids and records[0].tags == "OW"


def test_sends_go_round_robin_over_the_queues_of_a_new_topic(broker):
    topic = new_topic("RoundRobin")
    with SyncProducer("PG_sync_rr", broker.namesrv_address) as producer:
        results = [producer.send(topic, b"m%d" % i) for i in range(12)]
        queues = producer.queues(topic)
        assert queues == [MessageQueue(topic, "broker-a", i) for i in range(4)], "TBW102's route, 4 queues"
        ids = [r.queue_id for r in results]
        assert sorted(ids) == sorted([0, 1, 2, 3] * 3)
        assert all(ids[i] != ids[i + 1] for i in range(len(ids) - 1))


def test_four_threads_share_one_producer(broker):
    topic = new_topic("Threads")
    per_thread = 60
    results: list = []
    errors: list[BaseException] = []
    with SyncProducer("PG_sync_mt", broker.namesrv_address) as producer:
        producer.send(topic, b"first", queue_id=0)  # the topic exists and its route is cached

        def work(t: int) -> None:
            try:
                for i in range(per_thread):
                    results.append((t, i, producer.send(topic, b"t%d-%d" % (t, i))))
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads), "a sending thread hangs"
        assert not errors, errors
        assert producer.heartbeats == 1
        assert [a for a in producer._connections if a != broker.namesrv_address] == [broker.address]
    assert len(results) == 4 * per_thread
    assert all(r.status is SendStatus.SEND_OK for _, _, r in results)
    assert len({r.msg_id for _, _, r in results}) == len(results), "every send acknowledged once"
    assert len({(r.queue_id, r.queue_offset) for _, _, r in results}) == len(results), "offsets unique per queue"
    counts = Counter(r.queue_id for _, _, r in results)
    bodies = []
    for qid in range(4):
        n = counts[qid] + (qid == 0)
        bodies += [r.body for r in stored(broker, topic, qid, n)]
        assert sorted(r.queue_offset for _, _, r in results if r.queue_id == qid) == list(range(qid == 0, n))
    assert sorted(bodies) == sorted([b"first"] + [b"t%d-%d" % (t, i) for t in range(4) for i in range(per_thread)])


def test_heartbeats_repeat_when_the_interval_passed(broker):
    topic = new_topic("Heartbeat")
    with SyncProducer("PG_sync_hb", broker.namesrv_address, heartbeat_interval=0.1) as producer:
        producer.send(topic, b"x")
        assert producer.heartbeats == 1
        for _ in range(3):
            time.sleep(0.12)
            producer.send(topic, b"x")
        assert producer.heartbeats == 4, "one before each send once 0.1 s passed"
        producer.heartbeat()
        assert producer.heartbeats == 5


def test_close_unregisters_the_producer(broker):
    topic, group = new_topic("Unregister"), "PG_sync_unreg"
    producers = broker.controller.producers
    producer = SyncProducer(group, broker.namesrv_address).start()
    producer.send(topic, b"x")
    wait_until(lambda: producers.channels(group), 5, "producer registered by the heartbeat")
    conn = producer._connections[broker.address]
    producer.close()
    assert conn.sock is None and producer.closed
    wait_until(lambda: not producers.channels(group), 5, "producer unregistered")
    producer.close()  # twice is fine
    with pytest.raises(ClientStateError, match="closed"):
        producer.send(topic, b"x")


def test_close_sends_unregister_client_while_the_connection_is_open(broker, monkeypatch):
    """The group leaves the broker's producer table because of UNREGISTER_CLIENT, not only
    because the connection closes: checked with the connections kept open."""
    from mqstore.client import sync

    topic, group = new_topic("Unregister"), "PG_sync_unreg2"
    producers = broker.controller.producers
    producer = SyncProducer(group, broker.namesrv_address).start()
    producer.send(topic, b"x")
    wait_until(lambda: producers.channels(group), 5, "producer registered by the heartbeat")
    conn = producer._connections[broker.address]
    sock = conn.sock
    assert sock is not None
    try:
        with monkeypatch.context() as m:  # close() leaves the connections open
            m.setattr(sync._Connection, "drop", lambda self: None)
            m.setattr(socket.socket, "shutdown", lambda self, how: None)
            producer.close()
        assert conn.sock is sock and sock.fileno() >= 0
        wait_until(lambda: not producers.channels(group), 5, "producer unregistered")
    finally:
        sock.close()


def test_a_topic_the_broker_does_not_create_is_an_mq_client_error(tmp_path):
    with running_broker(str(tmp_path / "store"), auto_create_topic_enable=False) as b:
        with SyncProducer("PG_sync_nocreate", b.namesrv_address) as producer:
            with pytest.raises(MQClientError) as unknown:
                producer.send("NoSuchTopic", b"x")
            assert unknown.value.code == ResponseCode.TOPIC_NOT_EXIST
            assert "TOPIC_NOT_EXIST(17)" in str(unknown.value) and "NoSuchTopic" in str(unknown.value)


def test_error_responses_name_the_code_and_the_remark(broker):
    with SyncProducer("PG_sync_err", broker.namesrv_address) as producer:
        with pytest.raises(MQClientError) as bad:
            producer.send("bad topic!", b"x")
        assert bad.value.code == ResponseCode.SYSTEM_ERROR and bad.value.address == broker.address
        assert str(bad.value).startswith(f"SYSTEM_ERROR(1) from {broker.address} to SEND_MESSAGE_V2(310): ")
        with pytest.raises(MQClientError) as system:
            producer.send("SCHEDULE_TOPIC_XXXX", b"x")
        assert system.value.code == ResponseCode.NO_PERMISSION
        topic = new_topic("Errors")
        producer.send(topic, b"x", queue_id=0)
        with pytest.raises(ValueError, match=r"no write queue \*:7; its write queues are broker-a:0, "):
            producer.send(topic, b"x", queue_id=7)
        assert producer.send(topic, b"still fine").status is SendStatus.SEND_OK


def test_a_stopped_broker_fails_sends_with_connection_errors(tmp_path):
    with running_broker(str(tmp_path / "store")) as b:
        producer = SyncProducer("PG_sync_gone", b.namesrv_address, timeout=2.0).start()
        producer.send("Gone", b"x", queue_id=0)
        b.shutdown()
        errors = []
        started = time.monotonic()
        for _ in range(2):
            with pytest.raises((ConnectionClosedError, ConnectFailedError)) as gone:
                producer.send("Gone", b"y", queue_id=0)
            assert gone.value.address == b.address and b.address in str(gone.value)
            errors.append(type(gone.value))
        assert time.monotonic() - started < 10
        assert errors[-1] is ConnectFailedError, "a new connection to a stopped broker is refused"
        producer.close()


def test_bad_arguments_are_refused_as_the_async_producer_refuses_them(broker):
    ns = broker.namesrv_address
    for group, match in (("", "blank"), ("a b", "illegal characters"), ("DEFAULT_PRODUCER", "DEFAULT_PRODUCER"),
                         (7, "must be a str")):
        with pytest.raises(ValueError, match=match):
            SyncProducer(group, ns)  # type: ignore[arg-type]
    for kwargs, match in (({"serialize": "XML"}, "serialize must be"), ({"send_code": "V3"}, "send_code must be"),
                          ({"compress_over": 0}, "compress_over"), ({"timeout": 0}, "timeout must be a positive"),
                          ({"heartbeat_interval": -1}, "heartbeat_interval"), ({"route_ttl": "1"}, "route_ttl")):
        with pytest.raises(ValueError, match=match):
            SyncProducer("PG", ns, **kwargs)  # type: ignore[arg-type]
    for namesrv in ("", "localhost", "a:1;b"):
        with pytest.raises(ValueError):
            SyncProducer("PG", namesrv)
    producer = SyncProducer("PG_sync_args", ns)
    with pytest.raises(ClientStateError, match="not started"):
        producer.send("T", b"x")
    producer.start()
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: producer.send("T", b""), "body length is zero"),
        (lambda: producer.send("T", "text"), "must be bytes"),  # type: ignore[arg-type]
        (lambda: producer.send("T", b"x" * (4 * 1024 * 1024 + 1)), "over max value"),
        (lambda: producer.send("T", b"x", properties={"TAGS": "a"}), "used by the system"),
        (lambda: producer.send("T", b"x", properties={"a": "b\x01c"}), "separator"),
        (lambda: producer.send("T", b"x", properties={"a": ""}), "is empty"),
        (lambda: producer.send("T", b"x", tags="a\x02b"), "separator"),
        (lambda: producer.send("T", b"x", keys=["a b"]), "contains a space"),
        (lambda: producer.send("T", b"x", keys=[]), "empty list"),
        (lambda: producer.send("T", b"x", flag=2**31), "int32"),
        (lambda: producer.send("T", b"x", delay_level=-1), "delay_level"),
        (lambda: producer.send(5, b"x"), "topic must be a str"),  # type: ignore[arg-type]
        (lambda: producer.send("T", b"x", timeout=0), "timeout must be a positive"),
        (lambda: producer.send("T", b"x", queue_id=-1), "queue_id must be"),
        (lambda: producer.send_batch("T", []), "at least one message"),
        (lambda: producer.send_batch("T", [b"ok", Message(b"x", delay_level=2)]), "batch message 1: delay_level"),
        (lambda: producer.send_batch("T", [b"ok", "str"]), "batch item 1"),  # type: ignore[list-item]
        (lambda: producer.send_batch("T", [b"ok", b""]), "body length is zero"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    producer.close()
    with pytest.raises(ClientStateError, match="closed"):
        producer.send("T", b"x")
    with pytest.raises(ClientStateError, match="closed"):
        producer.start()


def test_the_two_producers_send_the_same_request(broker, monkeypatch):
    """SyncProducer and Producer share their request code: the same message gets the same
    header (but for the id and the born timestamp)."""
    import asyncio

    import mqstore.client.producer as async_module
    import mqstore.client.sync as sync_module
    from mqstore.client import _sending

    captured: list[dict[str, str]] = []

    def spy(*args, **kwargs):
        fields = _sending.send_header(*args, **kwargs)
        captured.append(fields)
        return fields

    monkeypatch.setattr(async_module, "send_header", spy)
    monkeypatch.setattr(sync_module, "send_header", spy)
    topic = new_topic("Same")
    msg = Message(b"same", tags="T", keys=["a", "b"], properties={"p": "1"}, flag=3)
    with SyncProducer("PG_same", broker.namesrv_address) as producer:
        producer.send_message(topic, msg, queue_id=0)

    async def main():
        async with Producer("PG_same", broker.namesrv_address) as p:
            await p.send_message(topic, msg, queue_id=0)
    asyncio.run(asyncio.wait_for(main(), 30))
    a, b = ({k: v for k, v in f.items() if k != "g"} for f in captured)
    uniq = re.compile(r"UNIQ_KEY\x01[0-9A-F]{32}")
    assert uniq.sub("", a.pop("i")) == uniq.sub("", b.pop("i"))
    assert a == b


# -- fake servers: timeouts, bad frames, requests the server sends ------------------------------------
class FakeServer:
    """A loopback TCP server in a thread: every command a client sends is recorded and given to
    ``answer(cmd)``, whose frames (bytes) are written back on that connection."""

    def __init__(self, answer: Callable[[RemotingCommand], list[bytes]]) -> None:
        self.answer = answer
        self.received: list[RemotingCommand] = []
        self.connections = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._drop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        readers: dict[socket.socket, FrameReader] = {}
        try:
            while not self._stop.is_set():
                if self._drop.is_set():
                    for sock in list(readers):
                        sel.unregister(sock)
                        del readers[sock]
                        sock.close()
                    self._drop.clear()
                for key, _ in sel.select(0.05):
                    sock = key.fileobj
                    if sock is self.listener:
                        client, _addr = self.listener.accept()
                        self.connections += 1
                        readers[client] = FrameReader()
                        sel.register(client, selectors.EVENT_READ)
                        continue
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(sock)
                        del readers[sock]
                        sock.close()
                        continue
                    readers[sock].feed(data)
                    while (cmd := readers[sock].next()) is not None:
                        self.received.append(cmd)
                        for frame in self.answer(cmd):
                            sock.sendall(frame)
        finally:
            for sock in readers:
                sock.close()
            sel.close()

    def drop_clients(self, timeout_s: float = 5.0) -> None:
        """Close every client connection (as a broker closes idle ones), and wait until it did."""
        self._drop.set()
        deadline = time.monotonic() + timeout_s
        while self._drop.is_set():
            assert time.monotonic() < deadline, "the fake server did not drop its clients"
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.listener.close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def response(to: RemotingCommand, code: int = 0, **fields: str) -> bytes:
    return RemotingCommand(code, opaque=to.opaque, flag=1, ext_fields=dict(fields),
                           serialize_type=to.serialize_type).encode()


def fake_namesrv(broker_addr: str) -> FakeServer:
    route = json.dumps({"brokerDatas": [{"brokerAddrs": {"0": broker_addr}, "brokerName": "fake-b", "cluster": "C"}],
                        "queueDatas": [{"brokerName": "fake-b", "perm": 6, "readQueueNums": 1, "writeQueueNums": 1,
                                        "topicSysFlag": 0}]}).encode()

    def answer(cmd: RemotingCommand) -> list[bytes]:
        assert cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
        return [RemotingCommand(0, opaque=cmd.opaque, flag=1, body=route, serialize_type=cmd.serialize_type).encode()]
    return FakeServer(answer)


#: what a fake broker answers SUCCESS
CLIENT_REQUESTS = (RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT)


def stored_ok(cmd: RemotingCommand) -> bytes:
    return response(cmd, msgId="7F0000010000277F0000000000000000", queueId="0", queueOffset="0")


@SERIALIZE
@pytest.mark.parametrize("kernel_timeouts", [True, False], ids=["SO_RCVTIMEO", "settimeout"])
def test_a_send_without_an_answer_times_out_and_the_next_one_reconnects(ser, kernel_timeouts, monkeypatch):
    from mqstore.client import sync

    monkeypatch.setattr(sync, "KERNEL_TIMEOUTS", kernel_timeouts and sync.KERNEL_TIMEOUTS)
    mode = {"send": "ignore"}

    def answer(cmd: RemotingCommand) -> list[bytes]:
        if cmd.code in CLIENT_REQUESTS:
            return [response(cmd)]
        if cmd.code == RequestCode.SEND_MESSAGE_V2 and mode["send"] == "ok":
            return [stored_ok(cmd)]
        return []  # never answered

    with FakeServer(answer) as fake_broker, fake_namesrv(fake_broker.address) as ns:
        with SyncProducer("PG_sync_to", ns.address, serialize=ser, timeout=5.0) as producer:
            started = time.monotonic()
            with pytest.raises(RemotingTimeoutError) as late:
                producer.send("T", b"x", timeout=0.3)
            elapsed = time.monotonic() - started
            assert 0.3 <= elapsed < 1.5, f"the timeout of 0.3 s fired after {elapsed:.2f} s"
            assert late.value.address == fake_broker.address and late.value.timeout == 0.3
            assert re.fullmatch(rf"no response from {fake_broker.address} to SEND_MESSAGE_V2\(310\) \(opaque \d+\) "
                                r"in 0.3 s", str(late.value))
            assert producer._connections[fake_broker.address].sock is None, "the timed-out connection is closed"
            mode["send"] = "ok"
            result = producer.send("T", b"y")
            assert result.status is SendStatus.SEND_OK and result.broker_name == "fake-b"
            assert fake_broker.connections == 2 and producer.heartbeats == 2, "a new connection, heartbeated again"


def test_a_silent_broker_times_out_the_heartbeat_and_a_silent_namesrv_the_route():
    with FakeServer(lambda cmd: []) as silent, fake_namesrv(silent.address) as ns:
        with SyncProducer("PG_sync_silent", ns.address, timeout=0.3) as producer:
            started = time.monotonic()
            with pytest.raises(RemotingTimeoutError, match=r"to HEART_BEAT\(34\) .* in 0.3 s"):
                producer.send("T", b"x")
            assert time.monotonic() - started < 1.5
        with SyncProducer("PG_sync_silent_ns", silent.address, timeout=0.3) as producer:
            with pytest.raises(ConnectFailedError, match=r"no NameServer answered the route of T: no response from "
                                                         rf"{silent.address} to GET_ROUTEINFO_BY_TOPIC\(105\)"):
                producer.send("T", b"x")


@SERIALIZE
def test_requests_from_the_server_and_late_responses_are_handled(ser):
    def answer(cmd: RemotingCommand) -> list[bytes]:
        if cmd.code in CLIENT_REQUESTS:
            return [response(cmd)]
        if cmd.code == RequestCode.SEND_MESSAGE_V2:
            st = cmd.serialize_type
            return [RemotingCommand(999, opaque=77, serialize_type=st).encode(),  # a request: answered NOT_SUPPORTED
                    RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=78, flag=2,
                                    ext_fields={"consumerGroup": "g"}, serialize_type=st).encode(),  # oneway: skipped
                    RemotingCommand(0, opaque=cmd.opaque + 1000, flag=1, serialize_type=st).encode(),  # matches nothing
                    stored_ok(cmd)]
        return []

    with FakeServer(answer) as fake_broker, fake_namesrv(fake_broker.address) as ns:
        with SyncProducer("PG_sync_req", ns.address, serialize=ser) as producer:
            assert producer.send("T", b"x").status is SendStatus.SEND_OK
            conn = producer._connections[fake_broker.address]
            assert conn.unmatched == 1
            wait_until(lambda: any(c.is_response for c in fake_broker.received), 5, "answer to the server's request")
            [refused] = [c for c in fake_broker.received if c.is_response]
            assert (refused.code, refused.opaque) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 77)
            assert refused.serialize_type == (1 if ser == "ROCKETMQ" else 0)
            assert refused.remark == " request type 999 not supported"
            assert producer.send("T", b"again").status is SendStatus.SEND_OK, "the connection is still in use"
            assert fake_broker.connections == 1


def test_a_connection_the_broker_closed_while_idle_is_made_again_by_the_heartbeat():
    def answer(cmd: RemotingCommand) -> list[bytes]:
        return [response(cmd) if cmd.code in CLIENT_REQUESTS else stored_ok(cmd)]

    with FakeServer(answer) as fake_broker, fake_namesrv(fake_broker.address) as ns:
        with SyncProducer("PG_sync_idle", ns.address, heartbeat_interval=0.1) as producer:
            assert producer.send("T", b"x").status is SendStatus.SEND_OK
            fake_broker.drop_clients()
            time.sleep(0.15)  # the next send heartbeats first, and finds the connection closed
            assert producer.send("T", b"y").status is SendStatus.SEND_OK
            assert fake_broker.connections == 2 and producer.heartbeats == 2
            fake_broker.drop_clients()
            with pytest.raises(ConnectionClosedError, match="closed by the peer"):
                producer.send("T", b"z")  # no heartbeat due: the send itself finds it closed
            assert producer.send("T", b"z").status is SendStatus.SEND_OK, "the next one connects again"


def test_a_frame_that_cannot_be_decoded_closes_the_connection():
    mode = {"send": "garbage"}

    def answer(cmd: RemotingCommand) -> list[bytes]:
        if cmd.code in CLIENT_REQUESTS:
            return [response(cmd)]
        if mode["send"] == "garbage":
            return [b"\x00\x00\x00\x08\x00\x00\x00\xff{}{}"]  # a header longer than its frame
        return [stored_ok(cmd)]

    with FakeServer(answer) as fake_broker, fake_namesrv(fake_broker.address) as ns:
        with SyncProducer("PG_sync_bad", ns.address) as producer:
            with pytest.raises(ConnectionClosedError) as bad:
                producer.send("T", b"x")
            assert bad.value.address == fake_broker.address and "cannot be decoded" in str(bad.value)
            assert "SEND_MESSAGE_V2(310)" in str(bad.value)
            mode["send"] = "ok"
            assert producer.send("T", b"y").status is SendStatus.SEND_OK
            assert fake_broker.connections == 2


def test_close_fails_a_request_in_flight_in_another_thread():
    def answer(cmd: RemotingCommand) -> list[bytes]:
        return [response(cmd)] if cmd.code in CLIENT_REQUESTS else []

    with FakeServer(answer) as fake_broker, fake_namesrv(fake_broker.address) as ns:
        producer = SyncProducer("PG_sync_inflight", ns.address, timeout=1.0).start()
        failure: list[BaseException] = []

        def send() -> None:
            try:
                producer.send("T", b"x", timeout=20)
            except BaseException as exc:
                failure.append(exc)

        th = threading.Thread(target=send)
        th.start()
        wait_until(lambda: any(c.code == RequestCode.SEND_MESSAGE_V2 for c in fake_broker.received), 5, "the send")
        started = time.monotonic()
        producer.close()
        th.join(10)
        assert not th.is_alive() and time.monotonic() - started < 5
        [exc] = failure
        assert isinstance(exc, ConnectionClosedError) and "was closed by the client while SEND_MESSAGE_V2" in str(exc)
