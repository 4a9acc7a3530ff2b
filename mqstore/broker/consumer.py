"""Embedded consumer groups: a Python process on the broker's machine consumes a topic as a member
of a consumer group, reading the store directly (mapped files, no network, no copy per message)
while its offsets and its membership live in the broker's tables, beside those of the RocketMQ
clients of the same group.

    store = MessageStore.attach("/data/store")          # the directory `mqstore broker` serves
    with GroupConsumer(store, "CID_REPORTS", "Orders", expression="TagA || TagB") as consumer:
        for message in consumer.messages(timeout_s=5):   # blocks for new messages (long polling)
            handle(message.body_bytes(), message.properties)
        # offsets are committed every auto_commit_interval_s and at close()

The consumer joins the group through the broker's controller (the same link its front processes
use, found from the store's owner pid and port): a heartbeat with the group and its subscription,
so GET_CONSUMER_LIST_BY_GROUP lists it and the group's other members are told to rebalance; it
takes its share of the topic's queues as RocketMQ's AllocateMessageQueueAveragely does (the sorted
consumer ids over the sorted queues), starts each queue at the group's committed offset
(QUERY_CONSUMER_OFFSET, with the broker's first-consume rule) or, for a queue the group never
committed and whose head is gone, at the queue's min offset, and re-balances when the broker says
the group changed. docs/rocketmq-remoting-spec.md §2.4.3–2.4.6, §3.5, §3.6.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from mqstore.queue._reads import MessageView
from mqstore.remoting._remoting import FrameError, FrameReader, RemotingCommand
from mqstore.broker import link
from mqstore.broker.codes import RequestCode, ResponseCode
from mqstore.errors import MQStoreError
from mqstore.status import GetMessageStatus
from mqstore.store import StoreBase

__all__ = ["BrokerLinkError", "GroupConsumer", "allocate_averagely"]

log = logging.getLogger("mqstore.broker")

HEARTBEAT_INTERVAL_S = 30.0
REQUEST_TIMEOUT_S = 10.0


class BrokerLinkError(MQStoreError, RuntimeError):
    """The broker's controller could not be reached or refused a request."""

    hint = "is `mqstore broker` running on this store directory?"


def allocate_averagely(queues: list[int], consumers: list[str], me: str) -> list[int]:
    """AllocateMessageQueueAveragely: my share of the sorted queues among the sorted consumers."""
    queues, consumers = sorted(queues), sorted(consumers)
    if me not in consumers or not queues:
        return []
    index, n, total = consumers.index(me), len(consumers), len(queues)
    mod = total % n
    size = (total // n + (1 if index < mod else 0)) if total > n else 1
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % total] for i in range(min(size, total - start))]


class _Link:
    """A blocking connection to the broker's controller: requests answered in order of opaque,
    pushes (NOTIFY_CONSUMER_IDS_CHANGED) counted for the consumer to rebalance on."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(address)
        except OSError as exc:
            self.sock.close()
            raise BrokerLinkError(f"cannot reach the broker's controller: {exc}") from None
        self.frames = FrameReader()
        self.lock = threading.Lock()
        self.opaque = 0
        self.answers: dict[int, RemotingCommand] = {}
        self.cond = threading.Condition()
        self.notified = 0
        self.closed = False
        self.reader = threading.Thread(target=self._read, name="mqstore-consumer-link", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while data := self.sock.recv(262144):
                self.frames.feed(data)
                while (cmd := self.frames.next()) is not None:
                    with self.cond:
                        if cmd.is_response:
                            self.answers[cmd.opaque] = cmd
                        elif cmd.code == link.NOTIFY:
                            self.notified += 1
                        self.cond.notify_all()
        except (OSError, FrameError):
            pass
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()

    def request(self, code: int, fields: dict[str, str], body: bytes = b"", *, oneway: bool = False) -> RemotingCommand | None:
        with self.lock:
            self.opaque += 1
            opaque = self.opaque
            cmd = RemotingCommand(code, language="PYTHON", version=407, opaque=opaque, flag=2 if oneway else 0,
                                  ext_fields=fields, body=body)
            try:
                self.sock.sendall(cmd.encode())
            except OSError as exc:
                raise BrokerLinkError(f"the broker's controller closed the link: {exc}") from None
        if oneway:
            return None
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        with self.cond:
            while opaque not in self.answers:
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    raise BrokerLinkError(f"no answer to request {code} from the broker's controller"
                                          + (" (the link closed)" if self.closed else ""))
                self.cond.wait(left)
            return self.answers.pop(opaque)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class GroupConsumer:
    """A member of consumer group ``group`` reading ``topic`` from ``store`` (a MessageStore attached
    to, or owning, the directory a broker serves); not thread-safe: one thread iterates it."""

    def __init__(self, store: StoreBase, group: str, topic: str, *, expression: str = "*",
                 instance_name: str = "DEFAULT", auto_commit_interval_s: float = 5.0) -> None:
        self.store = store
        self.group = group
        self.topic = topic
        self.expression = expression or "*"
        self.client_id = f"{os.getpid()}-{store.config.broker_ip1}@{instance_name}"
        self.auto_commit_interval_s = auto_commit_interval_s
        port = int(store.config.store_host.rpartition(":")[2])
        self._link = _Link(link.link_address(store.ctl.owner_pid, port))
        # the link's name for this member: like a front's pid, unique per consumer object
        self._token = f"{os.getpid()}-{id(self):x}"
        self._conn = f"{self._token}:1"
        hello = self._call(link.HELLO, {"pid": self._token})
        self._topics: dict[str, Any] = json.loads(hello.body).get("topicConfigTable", {})
        self.positions: dict[int, int] = {}  # my queues -> next offset to read
        self._committed: dict[int, int] = {}
        self._seen_notices = 0
        self._last_rebalance = 0.0
        self._last_heartbeat = 0.0
        self._last_commit = time.monotonic()
        self._closed = False
        self._heartbeat()
        self.rebalance()

    # -- broker calls ----------------------------------------------------------------------------
    def _call(self, code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
        fields = {**fields, link.CONN: self._conn, link.PEER: "127.0.0.1:0"}
        answer = self._link.request(code, fields, body)
        assert answer is not None
        return answer

    def _heartbeat(self) -> None:
        sub = {"topic": self.topic, "subString": self.expression, "subVersion": int(time.time() * 1000)}
        if self.expression != "*":
            sub["tagsSet"] = [t.strip() for t in self.expression.split("||") if t.strip()]
        body = json.dumps({"clientID": self.client_id, "consumerDataSet": [{
            "groupName": self.group, "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [sub], "unitMode": False}],
            "producerDataSet": []}).encode()
        answer = self._call(RequestCode.HEART_BEAT, {}, body)
        if answer.code != ResponseCode.SUCCESS:
            raise BrokerLinkError(f"the broker refused the heartbeat of {self.group}: {answer.remark}")
        self._last_heartbeat = time.monotonic()

    def rebalance(self) -> list[int]:
        """Take this member's share of the topic's queues now (also done when the broker says the
        group changed); returns the queue ids. Offsets of queues given up are committed first."""
        self._seen_notices = self._link.notified
        self._last_rebalance = time.monotonic()
        answer = self._call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group})
        ids = json.loads(answer.body).get("consumerIdList", []) if answer.code == ResponseCode.SUCCESS else []
        tc = self._topic_config()
        queues = list(range(int(tc.get("readQueueNums", 0)))) if tc else []
        mine = allocate_averagely(queues, ids, self.client_id)
        for qid in [q for q in self.positions if q not in mine]:
            self._commit_queue(qid)
            del self.positions[qid]
        for qid in mine:
            if qid not in self.positions:
                self.positions[qid] = self._start_offset(qid)
                self._committed[qid] = self.positions[qid]
        return sorted(self.positions)

    def _topic_config(self) -> dict[str, Any] | None:
        tc = self._topics.get(self.topic)
        if tc is None:  # created since: ask again
            hello = self._call(link.HELLO, {"pid": self._token})
            self._topics = json.loads(hello.body).get("topicConfigTable", {})
            tc = self._topics.get(self.topic)
        return tc

    def _start_offset(self, qid: int) -> int:
        answer = self._call(RequestCode.QUERY_CONSUMER_OFFSET,
                            {"consumerGroup": self.group, "topic": self.topic, "queueId": str(qid)})
        if answer.code == ResponseCode.SUCCESS:
            return max(int(answer.ext_fields.get("offset", "0")), self.store.get_min_offset_in_queue(self.topic, qid))
        return self.store.get_max_offset_in_queue(self.topic, qid)  # CONSUME_FROM_LAST_OFFSET

    def _commit_queue(self, qid: int) -> None:
        offset = self.positions.get(qid)
        if offset is None or self._committed.get(qid) == offset:
            return
        self._link.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": self.group, "topic": self.topic, "queueId": str(qid), "commitOffset": str(offset),
            link.CONN: self._conn}, oneway=True)
        self._committed[qid] = offset

    def commit(self) -> None:
        """Commit the offset after the last message handed out, on every queue of this member."""
        for qid in list(self.positions):
            self._commit_queue(qid)
        self._last_commit = time.monotonic()

    # -- reading ---------------------------------------------------------------------------------
    def poll(self, max_messages: int = 32, timeout_s: float = 0.0) -> list[MessageView]:
        """Up to max_messages from this member's queues (each queue in order), waiting up to
        timeout_s for the first one. The offsets move past what is returned (committed later)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._housekeeping()
            got: list[MessageView] = []
            for qid in sorted(self.positions):
                if len(got) >= max_messages:
                    break
                result = self.store.read_messages(self.topic, qid, self.positions[qid], max_messages - len(got),
                                                  self.expression)
                status = result.status
                if status is GetMessageStatus.FOUND:
                    got.extend(result)
                    self.positions[qid] = result.next_begin_offset
                elif status in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.OFFSET_TOO_SMALL,
                                GetMessageStatus.OFFSET_OVERFLOW_BADLY, GetMessageStatus.MESSAGE_WAS_REMOVING,
                                GetMessageStatus.OFFSET_FOUND_NULL):
                    self.positions[qid] = result.next_begin_offset
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            seen = self.store.ctl.channel_seq("dispatched")
            if not any(self.store.get_max_offset_in_queue(self.topic, q) > off for q, off in self.positions.items()):
                self.store.ctl.wait_seq_change("dispatched", seen, min(left, 0.5) * 1000)

    def messages(self, timeout_s: float | None = None) -> Iterator[MessageView]:
        """The messages of this member's queues as they come; ends after timeout_s without one
        (None: never)."""
        while True:
            batch = self.poll(32, 1.0 if timeout_s is None else timeout_s)
            if not batch and timeout_s is not None:
                return
            yield from batch

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if self._link.closed:
            raise BrokerLinkError("the broker's controller closed the link (did the broker stop?)")
        if self._link.notified != self._seen_notices or (not self.positions and now - self._last_rebalance >= 1.0):
            self.rebalance()  # told the group changed, or waiting for the topic to exist
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL_S:
            self._heartbeat()
        if now - self._last_commit >= self.auto_commit_interval_s:
            self.commit()

    def close(self) -> None:
        """Commit, leave the group (its other members rebalance), close the link."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._link.closed:
                self.commit()
                self._call(RequestCode.UNREGISTER_CLIENT,
                           {"clientID": self.client_id, "producerGroup": "", "consumerGroup": self.group})
        finally:
            self._link.close()

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
