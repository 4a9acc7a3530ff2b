"""A broker's topics (RocketMQ 4.9.7 TopicConfigManager and TopicValidator; docs/rocketmq-remoting-spec.md
§3.1, §3.2): the startup topics, the checks a sent topic passes, auto-creation from TBW102, and
``config/topics.json`` in RocketMQ's format (a TopicConfigSerializeWrapper, so a RocketMQ broker's
file loads as is and ours loads in one).

Beyond RocketMQ, creation is bounded (docs/broker.md "Topic limits"): a broker holds at most
``max_topic_count`` topics, and creations on first sends are limited broker-wide per second
(``AutoCreations``, a token bucket) and per client connection. A creation costs O(1): topics.json
is written by ``persist_soon`` at most every ``PERSIST_INTERVAL_S`` (and at shutdown), not once
per creation (each write is O(topics)).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from mqstore.broker.jsonfile import write_with_bak
from mqstore.errors import ConfigError
from mqstore.protocol import PERM_INHERIT, PERM_READ, PERM_WRITE
from mqstore.layout import config_path

__all__ = ["PERM_INHERIT", "PERM_READ", "PERM_WRITE", "TBW102", "AutoCreations", "TopicConfigs", "topic_problem"]

log = logging.getLogger("mqstore.broker")

#: the topic a client names as its default topic: new topics inherit from it (AUTO_CREATE_TOPIC_KEY_TOPIC)
TBW102 = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_TOPIC_QUEUE_NUM = 18
#: topics a client may not send to (NOT_ALLOWED_SEND_TOPIC_SET)
NOT_ALLOWED_SEND = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                              "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
_VALID = re.compile(r"[%|a-zA-Z0-9_-]+")
TOPIC_MAX_LENGTH = 127
#: topics.json is written at most this often while topics are being created (and at shutdown)
PERSIST_INTERVAL_S = 0.5


def topic_problem(topic: str) -> str | None:
    """Why a client may not send to `topic` (TopicValidator.validateTopic's remarks, and the
    forbidden system topics), or None."""
    if not topic or topic.isspace():
        return "The specified topic is blank."
    if not _VALID.fullmatch(topic):
        return "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    if topic in NOT_ALLOWED_SEND:
        return f"Sending message to topic[{topic}] is forbidden."
    return None


def topic_config(name: str, queues: int = 16, perm: int = PERM_READ | PERM_WRITE, sys_flag: int = 0,
                 filter_type: str = "SINGLE_TAG", order: bool = False) -> dict[str, Any]:
    """A TopicConfig as RocketMQ serializes it (its defaults: 16 queues, perm READ|WRITE)."""
    return {"order": order, "perm": perm, "readQueueNums": queues, "topicFilterType": filter_type,
            "topicName": name, "topicSysFlag": sys_flag, "writeQueueNums": queues}


class TopicConfigs:
    """The topic table of one broker, persisted in ``<root>/config/topics.json``."""

    def __init__(self, root: str, *, cluster: str = "DefaultCluster", broker_name: str = "broker-a",
                 auto_create_topic_enable: bool = True, default_topic_queue_nums: int = 8,
                 cluster_topic_enable: bool = True, broker_topic_enable: bool = True) -> None:
        self.path = config_path(root, "topics.json")
        self.auto_create = auto_create_topic_enable
        self.table: dict[str, dict[str, Any]] = {}
        self.auto_creations = AutoCreations()
        # topics.json's writes: each change bumps the generation; a write never replaces a newer one
        self._generation = 0
        self._written_generation = -1
        self._written_at = float("-inf")  # time.monotonic() of the last write's start
        self._write_lock = threading.Lock()
        self._writer: asyncio.Task[None] | None = None
        self.data_version = {"counter": 0, "timestamp": int(time.time() * 1000)}
        # the startup topics (TopicConfigManager's constructor)
        for cfg in (topic_config("SELF_TEST_TOPIC", 1),
                    topic_config(TBW102, default_topic_queue_nums, PERM_INHERIT | PERM_READ | PERM_WRITE)
                    if auto_create_topic_enable else None,
                    topic_config("BenchmarkTest", 1024),
                    topic_config(cluster, 16, PERM_INHERIT | (PERM_READ | PERM_WRITE if cluster_topic_enable else 0)),
                    topic_config(broker_name, 1, PERM_INHERIT | (PERM_READ | PERM_WRITE if broker_topic_enable else 0)),
                    topic_config("OFFSET_MOVED_EVENT", 1),
                    topic_config(SCHEDULE_TOPIC, SCHEDULE_TOPIC_QUEUE_NUM),
                    topic_config(f"{cluster}_REPLY_TOPIC", 1)):
            if cfg is not None:
                self.table[cfg["topicName"]] = cfg
        self._load()

    def _load(self) -> None:
        """Topics from topics.json (or its .bak when the file is unreadable), over the startup ones."""
        for path in (self.path, self.path + ".bak"):
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except FileNotFoundError:
                continue
            try:
                obj = json.loads(text) if text.strip() else {}
                table = obj.get("topicConfigTable") or {}
                if type(table) is not dict or any(type(v) is not dict for v in table.values()):
                    raise ValueError("topicConfigTable is not an object of topic configs")
            except (ValueError, AttributeError) as exc:
                if path == self.path:
                    continue  # RocketMQ's ConfigManager falls back to the .bak
                raise ConfigError(f"{self.path} and its .bak cannot be read: {exc}") from None
            for name, cfg in table.items():
                self.table[str(name)] = {**topic_config(str(name)), **cfg}
            version = obj.get("dataVersion")
            if type(version) is dict:
                self.data_version = {"counter": int(version.get("counter", 0)),
                                     "timestamp": int(version.get("timestamp", 0))}
            return
        if os.path.exists(self.path):
            raise ConfigError(f"{self.path} cannot be read (and there is no {self.path}.bak)")

    def get(self, topic: str) -> dict[str, Any] | None:
        return self.table.get(topic)

    def create_in_send(self, topic: str, default_topic: str, client_queue_nums: int,
                       sys_flag: int = 0) -> dict[str, Any] | None:
        """The topic's config, created from `default_topic` when it does not exist and the default
        inherits (createTopicInSendMessageMethod), and written to topics.json. None when it cannot
        be created (TOPIC_NOT_EXIST for the sender)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        cfg = self.config_in_send(topic, default_topic, client_queue_nums, sys_flag)
        if cfg is not None:
            self.add(cfg)
            self.persist()
        return cfg

    def config_in_send(self, topic: str, default_topic: str, client_queue_nums: int,
                       sys_flag: int = 0) -> dict[str, Any] | None:
        """The config a first send to `topic` would create it with, from `default_topic` when the
        default inherits: min(client, default) queues, the default's perm without INHERIT. None
        when it cannot be created. Nothing is stored."""
        default = self.table.get(default_topic)
        if default is None:
            return None
        perm = default["perm"]
        if default_topic == TBW102 and not self.auto_create:
            perm = PERM_READ | PERM_WRITE
        if not perm & PERM_INHERIT:
            return None
        queues = max(0, min(client_queue_nums, default["writeQueueNums"]))
        return topic_config(topic, queues, perm & ~PERM_INHERIT, sys_flag, default.get("topicFilterType", "SINGLE_TAG"))

    def add(self, cfg: dict[str, Any]) -> None:
        """Create or replace a topic (the data version goes up); topics.json is written by
        ``persist`` or ``persist_soon``."""
        self.table[cfg["topicName"]] = cfg
        self.next_version()

    def room_refusal(self, topic: str, max_topic_count: int) -> str | None:
        """Why `topic` may not be created (the broker holds max_topic_count topics), or None. An
        existing topic always has room (an update is no creation)."""
        if topic in self.table or len(self.table) < max_topic_count:
            return None
        return (f"topic[{topic}] cannot be created: the broker holds {len(self.table)} topics and "
                f"max_topic_count is {max_topic_count} (delete unused topics or raise max_topic_count)")

    def next_version(self) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}

    def wrapper(self) -> dict[str, Any]:
        """The TopicConfigSerializeWrapper: what topics.json holds and a registration carries."""
        return {"dataVersion": dict(self.data_version), "topicConfigTable": {k: dict(v) for k, v in self.table.items()}}

    def persist(self) -> None:
        """Write topics.json now: the previous file kept as .bak, the new one written whole then
        renamed over it (RocketMQ's MixAll.string2File, with an fsync and an atomic rename: jsonfile)."""
        self._generation += 1
        self._write(self._generation, self.wrapper())

    def persist_soon(self) -> None:
        """Have topics.json written soon, by a task of the running loop: at once when the last
        write is PERSIST_INTERVAL_S old, else when it is, so a flood of creations writes the file
        (O(topics) each time) a few times a second, not once per creation. The file is written
        in a thread (the loop keeps serving), whole and renamed as ``persist`` does; when the
        task is cancelled (the broker's loop ending) what is pending is written first."""
        self._generation += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_when_due())
            self._writer.add_done_callback(self._writer_ended)

    @property
    def persist_pending(self) -> bool:
        """A change is not in topics.json yet."""
        return self._written_generation < self._generation

    async def _write_when_due(self) -> None:
        while self.persist_pending:
            await asyncio.sleep(max(0.0, self._written_at + PERSIST_INTERVAL_S - time.monotonic()))
            self._written_at = time.monotonic()
            try:
                await asyncio.to_thread(self._write, self._generation, self.wrapper())
            except OSError as exc:
                log.error("writing %s failed (tried again in %.1f s): %s", self.path, PERSIST_INTERVAL_S, exc)

    def _writer_ended(self, task: asyncio.Task[None]) -> None:
        """The writer was cancelled (the loop is ending; maybe before it ran at all) or failed:
        what is pending is written now."""
        if self.persist_pending and (task.cancelled() or task.exception() is not None):
            self.persist()

    def _write(self, generation: int, wrapper: dict[str, Any]) -> None:
        """Write one snapshot of the table, unless a newer one was written meanwhile."""
        with self._write_lock:
            if generation < self._written_generation:
                return
            write_with_bak(self.path, json.dumps(wrapper, indent="\t", sort_keys=True))
            self._written_generation = max(self._written_generation, generation)


class AutoCreations:
    """The topics created on first sends (TOPIC_FOR_SEND) and their two limits: broker-wide a
    token bucket of auto_create_topic_max_per_second tokens, refilled at that rate (a burst of
    that many, then that many a second), and a count per client connection
    (auto_create_topic_max_per_connection), forgotten when the connection closes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: connection id (``<front pid>:<n>``) -> topics it created on first sends
        self.by_conn: dict[str, int] = {}
        self._tokens: float | None = None  # None: a full bucket at the first creation
        self._at = 0.0
        self._prune_at = 1024

    def connection_refusal(self, conn: str, limit: int) -> str | None:
        """Why connection `conn` may not create one more topic on a first send, or None."""
        made = self.by_conn.get(conn, 0)
        if made < limit:
            return None
        return (f"this connection created {made} topics on first sends and auto_create_topic_max_per_connection "
                f"is {limit}: create the topic first (mqstore admin topic create)")

    def rate_refusal(self, per_second: int) -> str | None:
        """None, and a token taken, when a creation may go ahead now; else why not."""
        now = self.clock()
        if self._tokens is None:
            self._tokens = float(per_second)
        else:
            self._tokens = min(float(per_second), self._tokens + (now - self._at) * per_second)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (f"topics are being created on first sends faster than auto_create_topic_max_per_second "
                f"({per_second}): try again later")

    def created(self, conn: str, live_fronts: Callable[[], set[str]]) -> None:
        """Count a creation of `conn`. The connections of a front that ended were never reported
        closed: they are dropped whenever the table has doubled (``live_fronts()``: the pids of
        the fronts linked now), so it stays in proportion to the connections that exist."""
        self.by_conn[conn] = self.by_conn.get(conn, 0) + 1
        if len(self.by_conn) >= self._prune_at:
            live = live_fronts()
            self.by_conn = {c: n for c, n in self.by_conn.items() if c.partition(":")[0] in live}
            self._prune_at = max(1024, 2 * len(self.by_conn))

    def forget(self, conn: str) -> None:
        """A client connection closed: what it created no longer counts against a new one."""
        self.by_conn.pop(conn, None)
