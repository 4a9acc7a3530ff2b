"""A real RocketMQ PushConsumer (the C++ client of the PyPI ``rocketmq`` wheel, run in a child
process as in tests/test_broker_cpp.py) and a master/slave pair of brokers (docs/replication.md):
the master sends a consumer that lags behind to the slave with its pull answers'
``suggestWhichBrokerId``, the consumer reads the backlog there, and comes back to the master once
it is caught up.

What the C++ client does with the suggestion (apache/rocketmq-client-cpp, release-1.2.3, the
client inside the wheel): every pull answer, whatever its status (FOUND, NO_NEW_MSG,
NO_MATCHED_MSG, OFFSET_ILLEGAL), goes through ``PullAPIWrapper::processPullResult``, which records
the answer's ``suggestWhichBrokerId`` for the queue (``updatePullFromWhichNode``); the queue's next
pull goes to that broker id (``recalculatePullFromWhichNode`` in ``pullKernelImpl``, through
``MQClientFactory::findBrokerAddressInSubscribe``, which falls back to any address of the broker
name when the id has none), and a pull to a slave has its commit-offset flag cleared. So it moves
back as soon as a broker answers 0, which a broker with ``slave_read_enable`` does when the read is
not behind (``brokerId`` of the subscription group, 0), e.g. at the queue's end.

Making the master suggest the slave: ``access_message_in_memory_max_ratio`` is a percentage of
physical memory (0 to 100). 1 % of this kind of machine is hundreds of MiB of backlog, too much for
a quick test; 0 is allowed, and with it every read that finds messages is "behind" (the log end
is past the last message read), while a read at the queue's end is not. Both brokers have the same
read settings (``slave_read_enable``, ratio 0, as one broker.conf would give them), so the slave
keeps the consumer while there is something to read and sends it back at the queue's end.

With ratio 0 the first message of every queue counts as on disk, so a group without offsets would
start at the queues' ends (RocketMQ's first-consume rule, CONSUME_FROM_LAST_OFFSET): the group's
offsets are committed at 0 first, as for a group that fell behind.

How it is seen from outside: each broker is registered with the NameServer at an address of its
own on loopback (``broker_ip1`` 127.0.0.3 for the master, 127.0.0.2 for the slave) where a relay
in this process (``PullTap``) listens and forwards every byte, unchanged, to the port the broker
listens on (127.0.0.1). The relay notes each PULL_MESSAGE request and its answer (status,
suggestWhichBrokerId, next offset, the messages in the body) before it passes the answer on, so the
notes of both relays are in the order the client saw them. Messages in the slave relay's answers
were sent to the consumer by the slave: that cannot happen if the consumer only reads the master.
The slave's HA client is pointed at the master's HA port directly (``ha_master_address``), since the
master registers its HA address with its ``broker_ip1``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from helpers_broker import LOOPBACK, running_broker
from helpers_proc import wait_until
from test_broker_cpp import TOPIC_QUEUES, clients, msg, sent_ok  # noqa: F401  (clients: the fixture)
from test_broker_ha import request

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.client.message import decode_messages
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess

MASTER_IP, SLAVE_IP = "127.0.0.3", "127.0.0.2"
#: the same on both brokers: reads suggest the slave while behind (ratio 0: any read that finds
#: messages), and a pull at a queue's end is held 0.5 s, not 15 s
READ_SETTINGS = {"slave_read_enable": True, "access_message_in_memory_max_ratio": 0,
                 "broker_suspend_max_time_millis": 500}
FLAG_COMMIT_OFFSET = 1  # PullSysFlag bit 0


@dataclass
class Pull:
    """One PULL_MESSAGE request through a relay and the broker's answer to it."""

    broker: str
    topic: str
    queue_id: int
    offset: int
    sys_flag: int
    asked: int  # the shared sequence number when the request went through
    answered: int = -1
    code: int = -1
    suggest: int = -1
    next_offset: int = -1
    bodies: list[bytes] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)


class PullTap:
    """A TCP relay from listen (host, port) to target (host, port), noting the pulls (see the
    module docstring). ``pulls`` are the answered ones, ``errors`` what could not be parsed."""

    def __init__(self, name: str, listen: tuple[str, int], target: tuple[str, int], seq: itertools.count) -> None:
        self.name, self.target, self.seq = name, target, seq
        self.pulls: list[Pull] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(listen)
        self.server.listen(64)
        self.server.settimeout(0.1)
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"tap-{self.name}")
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError as exc:
                self.errors.append(f"cannot reach {self.target}: {exc}")
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            pending: dict[int, Pull] = {}
            self._start(self._pump, client, upstream, False, pending)
            self._start(self._pump, upstream, client, True, pending)

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool, pending: dict[int, Pull]) -> None:
        frames: FrameReader | None = FrameReader()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            if frames is not None:  # noted before it is passed on
                try:
                    frames.feed(data)
                    while (cmd := frames.next()) is not None:
                        self._note(cmd, answers, pending)
                except Exception as exc:  # forward regardless; the test fails on errors
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    frames = None
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):  # one side gone: end the other direction too
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _note(self, cmd: RemotingCommand, answer: bool, pending: dict[int, Pull]) -> None:
        if not answer:
            if cmd.code == RequestCode.PULL_MESSAGE and not cmd.is_response:
                f = cmd.ext_fields
                pending[cmd.opaque] = Pull(self.name, f["topic"], int(f["queueId"]), int(f["queueOffset"]),
                                           int(f["sysFlag"]), next(self.seq))
            return
        pull = pending.pop(cmd.opaque, None) if cmd.is_response else None
        if pull is None:
            return
        pull.answered, pull.code = next(self.seq), cmd.code
        pull.suggest = int(cmd.ext_fields.get("suggestWhichBrokerId", -1))
        pull.next_offset = int(cmd.ext_fields.get("nextBeginOffset", -1))
        if cmd.code == ResponseCode.SUCCESS:
            messages = decode_messages(bytes(cmd.body))
            pull.bodies = [bytes(m.body) for m in messages]
            pull.queue_offsets = [m.queue_offset for m in messages]
        with self._lock:
            self.pulls.append(pull)

    def of(self, topic: str, queue_id: int) -> list[Pull]:
        with self._lock:
            return [p for p in self.pulls if p.topic == topic and p.queue_id == queue_id]

    def stop(self) -> None:
        self._stopped = True
        self.server.close()
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(5)
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def tapped(name: str, broker: Any, host: str, seq: itertools.count) -> Any:
    """A PullTap on the address broker registered (host:port) to where it listens."""
    assert broker.address == f"{host}:{broker.port}"
    tap = PullTap(name, (host, broker.port), (LOOPBACK, broker.port), seq)
    try:
        yield tap
    finally:
        tap.stop()


def route_addrs(namesrv: str, topic: str) -> dict[str, str]:
    """brokerId -> address of the topic's broker, from the NameServer."""
    got = request(namesrv, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))
    if got.code != ResponseCode.SUCCESS:
        return {}
    (broker,) = json.loads(got.body.decode().replace("{0:", '{"0":').replace(",1:", ',"1":'))["brokerDatas"]
    return dict(broker["brokerAddrs"])


def test_a_push_consumer_behind_reads_from_the_slave_and_comes_back_to_the_master(tmp_path, clients):  # noqa: F811
    """160 messages (UTF-8 text, 10 to 1500 characters) wait in 4 queues of the master before a
    PushConsumer of a group whose offsets are at 0 starts. For every queue: the master answers the
    first pull with a batch and suggestWhichBrokerId 1; the next pulls go to the slave from where
    that batch ended, the slave answers the rest of the queue (suggesting 1) and, at the queue's
    end, 0; every pull after that is the master's. Each message is consumed at least once, byte
    for byte; the two brokers' answers hold each message once, most of them from the slave; the
    offsets reached end up committed on the master."""
    topic, group = "TopicSlaveRead", "CID_slave_read"
    rng = random.Random(5)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?-_é✓"
    bodies = [f"m{i}-" + "".join(rng.choices(alphabet, k=rng.randrange(10, 1500))) for i in range(160)]
    want = Counter(b.encode() for b in bodies)
    seq = itertools.count()
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(running_broker(str(tmp_path / "master"), broker_ip1=MASTER_IP, **READ_SETTINGS))
        master_tap = stack.enter_context(tapped("master", master, MASTER_IP, seq))
        ns = master.controller.namesrv_addrs[0]
        # the backlog, then the group's offsets at 0 (a group that fell behind)
        producer = clients("producer", "produce", group="PID_slave_read", namesrv=ns,
                           steps=[msg(topic, b, op="sync") for b in bodies])
        producer.finish(60)
        assert len(sent_ok(producer)) == len(bodies)
        ends = {q: master.store.get_max_offset_in_queue(topic, q) for q in range(TOPIC_QUEUES)}
        assert sum(ends.values()) == len(bodies) and all(ends.values())
        for q in range(TOPIC_QUEUES):
            answer = request(f"{LOOPBACK}:{master.port}", RemotingCommand(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                ext_fields={"consumerGroup": group, "topic": topic, "queueId": str(q), "commitOffset": "0"}))
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        slave = stack.enter_context(running_broker(
            str(tmp_path / "slave"), broker_role="SLAVE", broker_id=1, namesrv_addr=ns, broker_ip1=SLAVE_IP,
            ha_master_address=f"{LOOPBACK}:{master.store.ctl.get('ha_port')}", **READ_SETTINGS))
        slave_tap = stack.enter_context(tapped("slave", slave, SLAVE_IP, seq))
        end = master.store.ctl.get("wrote")
        wait_until(lambda: slave.store.ctl.get("dispatched") == end, 30, what="the slave to hold the master's log")
        wait_until(lambda: slave.controller.slave_syncs > 0 and topic in slave.controller.topics.table, 30,
                   what="the slave to copy the master's topics")
        wait_until(lambda: route_addrs(ns, topic) == {"0": master.address, "1": slave.address}, 30,
                   what="the NameServer to list the master and the slave")

        consumer = clients("consumer", "push", group=group, namesrv=ns, topic=topic)
        consumer.wait_messages(len(bodies), 30)

        # back on the master: for each queue, a pull of the master after the slave's answer at the
        # queue's end, then one more (held and answered there: the consumer stays)
        def returned(q: int) -> list[Pull]:
            at_end = [p for p in slave_tap.of(topic, q) if p.offset == ends[q] and p.suggest == 0]
            if not at_end:
                return []
            return [p for p in master_tap.of(topic, q) if p.asked > at_end[0].answered]

        wait_until(lambda: all(len(returned(q)) >= 2 for q in range(TOPIC_QUEUES)), 30,
                   what="the consumer back on the master for every queue")
        got = [e for e in consumer.stop() if e["ev"] == "msg"]
        assert not master_tap.errors and not slave_tap.errors, (master_tap.errors, slave_tap.errors)

        # every message consumed at least once, byte for byte as sent
        consumed = Counter(m["body"].encode() for m in got)
        assert set(consumed) == set(want) and all(consumed[b] >= want[b] for b in want)
        served: Counter[bytes] = Counter()
        from_slave: set[bytes] = set()
        for q in range(TOPIC_QUEUES):
            pulls = sorted(master_tap.of(topic, q) + slave_tap.of(topic, q), key=lambda p: p.asked)
            # broker@offset:messages->suggestWhichBrokerId, e.g. master@0:8->1 slave@8:8->1 ...
            print(f"queue {q}:", " ".join(f"{p.broker}@{p.offset}:{len(p.bodies)}->{p.suggest}" for p in pulls[:12]))
            # the master answered the first pull (at the committed offset 0) with messages and
            # "pull from broker 1"
            first = pulls[0]
            assert (first.broker, first.offset, first.code, first.suggest) == ("master", 0, ResponseCode.SUCCESS, 1)
            assert first.bodies and first.next_offset < ends[q]
            # the next pulls went to the slave, from where the master's answer left off; the slave
            # gave the rest of the queue, saying "broker 1" while it found messages
            on_slave = [p for p in pulls if p.broker == "slave"]
            assert pulls[1].broker == "slave" and pulls[1].offset == first.next_offset
            assert pulls[1].asked > first.answered
            found = [p for p in on_slave if p.code == ResponseCode.SUCCESS]
            assert found and all(p.suggest == 1 for p in found)
            assert [o for p in [first, *found] for o in p.queue_offsets] == list(range(ends[q])), \
                f"queue {q}: the master's first answer and the slave's answers hold the queue once, in order"
            assert all(not p.sys_flag & FLAG_COMMIT_OFFSET for p in on_slave), "no commit on a slave pull"
            # at the queue's end the slave said "broker 0" and the consumer went back: every pull
            # after that answer is the master's, at the end
            back = next(p for p in on_slave if p.offset == ends[q] and p.suggest == 0)
            assert back.code == ResponseCode.PULL_NOT_FOUND
            after = [p for p in pulls if p.asked > back.answered]
            assert after and all(p.broker == "master" and p.offset == ends[q] for p in after)
            assert all(p.suggest == 0 and p.code == ResponseCode.PULL_NOT_FOUND for p in after)
            for p in [first, *found]:
                served.update(p.bodies)
            for p in found:
                from_slave.update(p.bodies)
        # what the two brokers sent is every message once, byte for byte; most came from the slave
        assert served == want
        assert len(from_slave) > len(bodies) // 2
        # the offsets the consumer reached on the slave were committed to the master (with the
        # master's pulls, and at the consumer's shutdown)
        wait_until(lambda: all(master.controller.offsets.query(group, topic, q) == ends[q]
                               for q in range(TOPIC_QUEUES)), 10, what="the offsets committed to the master")
