"""A cluster: one NameServer and two brokers, broker-a and broker-b, each on its own directory
and port and registered with that NameServer (``namesrv_addr``), as RocketMQ 4.9.7 runs one
(docs/broker.md, docs/rocketmq-remoting-spec.md §2.3).

- The real C++ producer (the ``rocketmq`` wheel, in a child process as in test_broker_cpp)
  spreads its sends over both brokers' queues, and one push consumer group reads them all.
- A broker that stops registering (SIGSTOP: its connection to the NameServer stays open) stays in
  the routes until its registration expires (the NameServer's clock is the test's:
  ``NameServer(clock_ms=...)`` jumps past the 120 s), then its queues drop out, and they come back
  when it is started again; a broker that stops cleanly unregisters at once (a SIGKILLed one's
  routes go when its connection closes: tests/test_namesrv_guard.py).
  Routes are read as a client reads them: GET_ROUTEINFO_BY_TOPIC through ``mqstore.client``.
- The NameServer refuses a registration whose numbers do not parse, naming the field.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers_broker import BrokerProcess, broker_settings, free_port, running_broker, send_raw
from helpers_proc import wait_until
from test_broker_cpp import TOPIC_QUEUES, ClientProc, msg, sent_ok, stored

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.broker.namesrv import NameServer
from mqstore.broker.requests import wall_ms
from mqstore.broker.server import Broker
from mqstore.client import MQClientError, Producer, PullConsumer, ResponseCode, SendStatus
from mqstore.tools.checker import check_store

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: a broker whose last registration is older than this is dropped (RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME)
EXPIRY_MS = 120_000


class NameServerThread:
    """A NameServer (``mqstore.broker.namesrv``) in an asyncio loop of its own thread, its clock
    the wall clock plus ``skew_ms`` (the test moves time forward), scanning every 200 ms."""

    def __init__(self, scan_interval_ms: int = 200) -> None:
        self.skew_ms = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="namesrv", daemon=True)
        self.thread.start()
        self.ns = NameServer("127.0.0.1", 0, clock_ms=lambda: wall_ms() + self.skew_ms,
                             scan_interval_ms=scan_interval_ms)
        asyncio.run_coroutine_threadsafe(self.ns.start(), self.loop).result(10)
        self.address = f"127.0.0.1:{self.ns.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.ns.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def clients(tmp_path) -> Iterator[Callable[..., ClientProc]]:
    """Factory: clients(name, kind, **spec) starts a C++ client child (test_broker_cpp's
    scenarios: "produce", "push", "pull"); every child is killed at the end."""
    started: list[ClientProc] = []

    def start(name: str, kind: str, **spec: Any) -> ClientProc:
        proc = ClientProc(str(tmp_path / "clients"), name, kind, **spec)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def namesrv() -> Iterator[NameServerThread]:
    ns = NameServerThread()
    yield ns
    ns.close()


def route(namesrv: str, topic: str) -> dict[str, tuple[str, list[int]]]:
    """The topic's route as mqstore.client reads it from the NameServer (GET_ROUTEINFO_BY_TOPIC):
    broker name -> (master address, read queue ids); {} when the NameServer has no route."""
    async def ask() -> dict[str, tuple[str, list[int]]]:
        async with PullConsumer("CID_ROUTE_CHECK", namesrv) as consumer:
            try:
                got = await consumer.client.query_route(topic)
            except MQClientError as exc:
                if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                    return {}
                raise
        queues = {q.broker_name: sorted(m.queue_id for m in got.subscribe_queues(topic)
                                        if m.broker_name == q.broker_name) for q in got.queue_datas}
        return {b.broker_name: (b.master or "", queues.get(b.broker_name, [])) for b in got.broker_datas}
    return asyncio.run(ask())


def send_to(namesrv: str, topic: str, broker_name: str, bodies: list[bytes]) -> list[Any]:
    """Send bodies with mqstore.client to one broker's queues of topic (created there by the
    first send, from TBW102); the SendResults."""
    async def go() -> list[Any]:
        async with Producer("PID_CLUSTER", namesrv) as producer:
            return [await producer.send(topic, body, broker_name=broker_name) for body in bodies]
    results = asyncio.run(go())
    assert all(r.status == SendStatus.SEND_OK and r.broker_name == broker_name for r in results), results
    return results


def both(a_addr: str, b_addr: str) -> dict[str, tuple[str, list[int]]]:
    queues = list(range(TOPIC_QUEUES))
    return {"broker-a": (a_addr, queues), "broker-b": (b_addr, queues)}


# == the tests ==================================================================================

def test_a_cpp_producer_spreads_over_both_brokers_and_one_group_reads_all(tmp_path, clients, namesrv):
    """The C++ producer's sync sends to a new topic go round robin over the queues of both
    brokers (each creates the topic on its first send and registers it); each message is stored
    once, on one broker, where its result says; the topic's route names both brokers' queues;
    one push consumer group gets every message once, and commits its offsets to both brokers."""
    topic, group = "TopicCluster", "CID_cluster"
    # retry_for_s: the C++ client fails a send at once when another of its threads holds its connection
    # table ("GetTransport ... get timed_mutex timeout", while it connects to the other broker)
    steps = [msg(topic, f"c{i}", op="sync", keys=f"k{i}", retry_for_s=10) for i in range(40)]
    settings = {"namesrv_addr": namesrv.address, "front_processes": 1}
    with running_broker(str(tmp_path / "a"), broker_name="broker-a", **settings) as a, \
            running_broker(str(tmp_path / "b"), broker_name="broker-b", **settings) as b:
        assert set(route(namesrv.address, "TBW102")) == {"broker-a", "broker-b"}
        producer = clients("producer", "produce", group="PID_cluster", namesrv=namesrv.address, steps=steps)
        producer.finish(90)
        sent = sent_ok(producer)
        wait_until(lambda: sum(len(rs) for br in (a, b) for rs in stored(br.store, topic).values()) >= len(steps),
                   10, "every message stored")
        records = {name: [r for rs in stored(br.store, topic).values() for r in rs] for name, br in
                   (("broker-a", a), ("broker-b", b))}
        counts = {name: len(rs) for name, rs in records.items()}
        print("stored per broker", counts)
        assert counts["broker-a"] > 0 and counts["broker-b"] > 0, "the sends went to one broker only"
        assert sorted(r.body.decode() for rs in records.values() for r in rs) == sorted(s["body"] for s in steps)
        by_key = {r.properties["UNIQ_KEY"]: r for rs in records.values() for r in rs}
        for event in sent:
            assert by_key[event["msg_id"]].queue_offset == event["offset"]
            assert by_key[event["msg_id"]].body.decode() == steps[event["i"]]["body"]
        wait_until(lambda: route(namesrv.address, topic) == both(a.address, b.address), 10,
                   "the topic's route with both brokers")

        consumer = clients("consumer", "push", group=group, namesrv=namesrv.address, topic=topic)
        consumer.wait_messages(len(steps), 30)
        time.sleep(0.5)
        got = [e for e in consumer.stop() if e["ev"] == "msg"]
        assert Counter(m["body"] for m in got) == Counter(s["body"] for s in steps), "every message once"
        # its shutdown committed the offsets to each broker: each at the end of what that broker has
        for name, br in (("broker-a", a), ("broker-b", b)):
            committed = sum(max(br.controller.offsets.query(group, topic, q), 0) for q in range(TOPIC_QUEUES))
            assert committed == counts[name], (name, committed, counts[name])
    for part in ("a", "b"):
        check_store(str(tmp_path / part)).raise_if_failed()


def test_a_silent_brokers_queues_leave_the_route_when_it_expires_and_come_back(tmp_path, namesrv):
    """broker-b (``mqstore broker``) is stopped (SIGSTOP: it registers no more, its connection to
    the NameServer stays open): its queues stay in the topic's route while its last registration
    is younger than 120 s, NameServer scans or not; once the NameServer's clock passes that
    (broker-a registering meanwhile), the route has broker-a's queues only. broker-b, SIGKILLed
    and started again on its directory and port, registers, and its queues are back, taking
    sends; then it stops cleanly and unregisters: gone from the route at once."""
    topic = "TopicExpiry"
    b_root, b_port = str(tmp_path / "b"), free_port()
    b_settings = {"broker_name": "broker-b", "namesrv_addr": namesrv.address, "listen_port": b_port,
                  "ha_listen_port": 0, "front_processes": 1}  # (a free HA port at each start, as below)
    with running_broker(str(tmp_path / "a"), broker_name="broker-a", namesrv_addr=namesrv.address,
                        front_processes=1) as a:
        proc = BrokerProcess(b_root, **b_settings)
        try:
            # the topic made on each broker by a send straight to it (a client that knows the topic's
            # route sends only to the brokers it names)
            before = send_raw(proc.address, topic, [b"b-before-%d" % i for i in range(6)])
            assert all(code == ResponseCode.SUCCESS for code, _, _ in before + send_raw(a.address, topic, [b"a"]))
            wait_until(lambda: route(namesrv.address, topic) == both(a.address, proc.address), 10,
                       "the route with both brokers")
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(0.6)  # three scans: a registration younger than 120 s keeps the silent broker in
            assert route(namesrv.address, topic) == both(a.address, proc.address), "dropped before its expiry"

            namesrv.skew_ms += EXPIRY_MS + 1_000
            a._call(a.controller.register_all())  # broker-a registers at the NameServer's new time
            wait_until(lambda: route(namesrv.address, topic) == {"broker-a": (a.address, list(range(TOPIC_QUEUES)))},
                       5, "broker-b's queues gone from the route")
            assert set(route(namesrv.address, "TBW102")) == {"broker-a"}
        finally:
            proc.kill()

        with BrokerProcess(b_root, **b_settings) as proc:  # the same directory and port
            assert proc.address == f"127.0.0.1:{b_port}"
            assert route(namesrv.address, topic) == both(a.address, proc.address), "registered when it started"
            after = send_to(namesrv.address, topic, "broker-b", [b"b-after"])[0]
            # what broker-b acknowledged before it was killed is still there: the queue goes on after it
            assert after.queue_offset == Counter(int(f["queueId"]) for _, _, f in before)[after.queue_id]
            assert proc.stop() == 0
            assert route(namesrv.address, topic) == {"broker-a": (a.address, list(range(TOPIC_QUEUES)))}, \
                "a broker that stopped cleanly unregisters at once"
    check_store(b_root).raise_if_failed()


@pytest.mark.slow
def test_a_push_consumer_rides_out_a_broker_kill_and_its_return(tmp_path, clients, namesrv):
    """A C++ push consumer of the cluster gets what broker-a takes while broker-b is dead (its
    pulls of broker-b's queues fail and are retried; the others go on), and, once broker-b is
    back on its directory and port, what broker-b takes: every message at least once (a
    redelivery is allowed: at least once is RocketMQ's promise), none lost."""
    topic, group = "TopicRide", "CID_ride"
    b_root, b_port = str(tmp_path / "b"), free_port()
    # the HA port a free one at each start: listen_port + 1, the default, can be a client's
    # ephemeral port by the time broker-b comes back (it failed CI once so)
    b_settings = {"broker_name": "broker-b", "namesrv_addr": namesrv.address, "listen_port": b_port,
                  "ha_listen_port": 0, "front_processes": 1}
    sent: list[bytes] = []

    def send(addr: str, bodies: list[bytes]) -> None:
        assert all(code == ResponseCode.SUCCESS for code, _, _ in send_raw(addr, topic, bodies))
        sent.extend(bodies)

    with running_broker(str(tmp_path / "a"), broker_name="broker-a", namesrv_addr=namesrv.address,
                        front_processes=1) as a:
        proc = BrokerProcess(b_root, **b_settings)
        try:
            send(a.address, [b"a-%d" % i for i in range(4)])
            send(proc.address, [b"b-%d" % i for i in range(4)])
            wait_until(lambda: route(namesrv.address, topic) == both(a.address, proc.address), 10,
                       "the route with both brokers")
            consumer = clients("consumer", "push", group=group, namesrv=namesrv.address, topic=topic)
            consumer.wait_messages(len(sent), 30)
            proc.kill()
            send(a.address, [b"a-dead-%d" % i for i in range(6)])
            consumer.wait_messages(len(sent), 30)
        finally:
            proc.kill()
        with BrokerProcess(b_root, **b_settings) as proc:
            send(proc.address, [b"b-back-%d" % i for i in range(6)])
            send(a.address, [b"a-back"])
            got = consumer.wait_for(lambda c: {m["body"].encode() for m in c.messages()} >= set(sent) and c.messages(),
                                    60, "every message, broker-b's after its return too")
            time.sleep(0.5)
            got = [e for e in consumer.stop() if e["ev"] == "msg"]
            counts = Counter(m["body"].encode() for m in got)
            assert set(counts) == set(sent), "nothing lost, nothing made up"
            print("redelivered", {b: n for b, n in counts.items() if n > 1})
            assert proc.stop() == 0
    for part in ("a", "b"):
        check_store(str(tmp_path / part)).raise_if_failed()


def _namesrv_process(port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "mqstore", "namesrv", "--host", "127.0.0.1", "--listen-port",
                             str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"mqstore namesrv did not listen: {proc.communicate()[1]}") from None
            time.sleep(0.05)


def test_a_cleanly_stopped_broker_unregisters_at_once(tmp_path):
    """With ``mqstore namesrv`` as the NameServer (its own process, the wall clock): each broker
    that shuts down unregisters before it is gone, so the route changes with no wait (the 120 s
    expiry cannot be what removed it), and the last one's leaving takes the topic's route away."""
    port = free_port()
    ns = f"127.0.0.1:{port}"
    namesrv = _namesrv_process(port)
    try:
        topic = "TopicLeave"
        with running_broker(str(tmp_path / "a"), broker_name="broker-a", namesrv_addr=ns, front_processes=1) as a:
            broker_b = Broker(str(tmp_path / "b"), **broker_settings(broker_name="broker-b", namesrv_addr=ns,
                                                                      front_processes=1))
            try:
                assert send_raw(a.address, topic, [b"a"])[0][0] == send_raw(broker_b.address, topic, [b"b"])[0][0] == 0
                wait_until(lambda: route(ns, topic) == both(a.address, broker_b.address), 10,
                           "the route with both brokers")
            finally:
                broker_b.shutdown()
            t = time.monotonic()
            assert route(ns, topic) == {"broker-a": (a.address, list(range(TOPIC_QUEUES)))}
            assert set(route(ns, "TBW102")) == {"broker-a"}
            assert time.monotonic() - t < 5
        assert route(ns, topic) == {} and route(ns, "TBW102") == {}
    finally:
        namesrv.send_signal(signal.SIGTERM)
        try:
            namesrv.wait(10)
        except subprocess.TimeoutExpired:
            namesrv.kill()
            namesrv.wait()
        if namesrv.stderr is not None:
            namesrv.stderr.close()
    assert namesrv.returncode == 0
    for part in ("a", "b"):
        check_store(str(tmp_path / part)).raise_if_failed()


def _ns_call(sock: socket.socket, cmd: RemotingCommand) -> RemotingCommand:
    sock.sendall(cmd.encode())
    frames = FrameReader()
    while (got := frames.next()) is None:
        data = sock.recv(65536)
        assert data, "the NameServer closed the connection"
        frames.feed(data)
    return got


@pytest.mark.parametrize("broker_id, why", [
    ("9" * 30, "out of range"), (str(2**63), "out of range"), ("9" * 5000, "out of range"), ("abc", "not a number"), ("1.0", "not a number"),
    ("", "not a number"), ("0x1", "not a number"), (" 0", "not a number"),
])
def test_the_name_server_refuses_a_registration_whose_broker_id_does_not_parse(namesrv, broker_id, why):
    """REGISTER_BROKER's brokerId is a Java Long: text that is not one (too big for 64 bits, not
    decimal digits) is refused naming the field, and registers nothing; then a good registration
    on the same server goes through. One connection, kept open, as a broker's (the NameServer
    drops what a connection registered when it closes)."""
    body = json.dumps({"topicConfigSerializeWrapper": {"dataVersion": {"counter": 1, "timestamp": 1},
                                                       "topicConfigTable": {"TopicNs": {"topicName": "TopicNs",
                                                                                         "readQueueNums": 2,
                                                                                         "writeQueueNums": 2,
                                                                                         "perm": 6}}},
                       "filterServerList": []}).encode()
    fields = {"brokerAddr": "127.0.0.1:1", "brokerName": "broker-x", "clusterName": "C", "haServerAddr": "",
              "compressed": "false", "bodyCrc32": "0"}
    with socket.create_connection(("127.0.0.1", int(namesrv.address.rpartition(":")[2])), timeout=5) as sock:
        got = _ns_call(sock, RemotingCommand(103, opaque=1, ext_fields={**fields, "brokerId": broker_id}, body=body))
        assert got.code == ResponseCode.SYSTEM_ERROR and "<brokerId>" in (got.remark or "") and why in (got.remark or ""), \
            (got.code, got.remark)
        assert route(namesrv.address, "TopicNs") == {}
        got = _ns_call(sock, RemotingCommand(103, opaque=2, ext_fields={**fields, "brokerId": "0"}, body=body))
        assert got.code == ResponseCode.SUCCESS, got.remark
        assert route(namesrv.address, "TopicNs") == {"broker-x": ("127.0.0.1:1", [0, 1])}
        got = _ns_call(sock, RemotingCommand(104, opaque=3, ext_fields={**fields, "brokerId": broker_id}))
        assert got.code == ResponseCode.SYSTEM_ERROR and "<brokerId>" in (got.remark or ""), (got.code, got.remark)
        assert route(namesrv.address, "TopicNs") == {"broker-x": ("127.0.0.1:1", [0, 1])}


def test_a_broker_registers_with_every_nameserver_it_is_given(tmp_path) -> None:
    """namesrv_addr "a;b": the broker registers with both (registerBrokerAll), a topic created by
    a send reaches both at once, and a clean stop unregisters from both."""
    first, second = NameServerThread(), NameServerThread()
    try:
        with running_broker(str(tmp_path / "store"), namesrv_addr=f"{first.address};{second.address}",
                            broker_name="broker-m") as broker:
            assert broker.namesrv_address == f"{first.address};{second.address}"
            for ns in (first, second):
                assert wait_until(lambda ns=ns: route(ns.address, "TBW102").get("broker-m"), 10,
                                  f"broker-m in {ns.address}'s TBW102 route")[0] == broker.address
            assert all(code == 0 for code, _, _ in send_raw(broker.address, "TwoNameServers", [b"x"] * 4))
            for ns in (first, second):
                assert wait_until(lambda ns=ns: route(ns.address, "TwoNameServers").get("broker-m"), 10,
                                  f"the new topic in {ns.address}") == (broker.address, [0, 1, 2, 3])
        for ns in (first, second):
            assert route(ns.address, "TwoNameServers") == {}
    finally:
        first.close()
        second.close()
