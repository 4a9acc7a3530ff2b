"""A broker's topics (RocketMQ 4.9.7 TopicConfigManager and TopicValidator; docs/rocketmq-remoting-spec.md
§3.1, §3.2): the startup topics, the checks a sent topic passes, auto-creation from TBW102, and
``config/topics.json`` in RocketMQ's format (a TopicConfigSerializeWrapper, so a RocketMQ broker's
file loads as is and ours loads in one).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from mqstore.broker.jsonfile import write_with_bak
from mqstore.errors import ConfigError
from mqstore.protocol import PERM_INHERIT, PERM_READ, PERM_WRITE

__all__ = ["PERM_INHERIT", "PERM_READ", "PERM_WRITE", "TBW102", "TopicConfigs", "topic_problem"]

#: the topic a client names as its default topic: new topics inherit from it (AUTO_CREATE_TOPIC_KEY_TOPIC)
TBW102 = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_TOPIC_QUEUE_NUM = 18
#: topics a client may not send to (NOT_ALLOWED_SEND_TOPIC_SET)
NOT_ALLOWED_SEND = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                              "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
_VALID = re.compile(r"[%|a-zA-Z0-9_-]+")
TOPIC_MAX_LENGTH = 127


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
        self.path = os.path.join(root, "config", "topics.json")
        self.auto_create = auto_create_topic_enable
        self.table: dict[str, dict[str, Any]] = {}
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
        inherits (createTopicInSendMessageMethod): min(client, default) queues, the default's perm
        without INHERIT. None when it cannot be created (TOPIC_NOT_EXIST for the sender)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        default = self.table.get(default_topic)
        if default is None:
            return None
        perm = default["perm"]
        if default_topic == TBW102 and not self.auto_create:
            perm = PERM_READ | PERM_WRITE
        if not perm & PERM_INHERIT:
            return None
        queues = max(0, min(client_queue_nums, default["writeQueueNums"]))
        cfg = topic_config(topic, queues, perm & ~PERM_INHERIT, sys_flag, default.get("topicFilterType", "SINGLE_TAG"))
        self.table[topic] = cfg
        self.next_version()
        self.persist()
        return cfg

    def next_version(self) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}

    def wrapper(self) -> dict[str, Any]:
        """The TopicConfigSerializeWrapper: what topics.json holds and a registration carries."""
        return {"dataVersion": dict(self.data_version), "topicConfigTable": {k: dict(v) for k, v in self.table.items()}}

    def persist(self) -> None:
        """Write topics.json: the previous file kept as .bak, the new one written whole then renamed
        over it (RocketMQ's MixAll.string2File, with an fsync and an atomic rename: jsonfile)."""
        write_with_bak(self.path, json.dumps(self.wrapper(), indent="\t", sort_keys=True))
