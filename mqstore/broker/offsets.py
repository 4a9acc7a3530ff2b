"""A broker's consumer offsets (RocketMQ 4.9.7 ConsumerOffsetManager; docs/rocketmq-remoting-spec.md
§3.5, §2.4.3): the offset each group has committed in each queue of each topic, kept under the key
``<topic>@<group>``, and ``config/consumerOffset.json`` in RocketMQ's own format, so a RocketMQ
broker's file loads as is and ours loads in one.

Only the table: the first-consume rule of QUERY_CONSUMER_OFFSET (offset 0 for a new group on a queue
that still starts at 0) needs the store and lives with the request handler.
"""

from __future__ import annotations

import os
import re

from mqstore.broker.jsonfile import fastjson_pretty, loads_lenient, read_with_bak, write_with_bak
from mqstore.layout import config_path

__all__ = ["ConsumerOffsets", "decode_offset_table", "encode_offset_table"]

#: joins a topic and a group into an offset table key (TOPIC_GROUP_SEPARATOR)
TOPIC_GROUP_SEPARATOR = "@"
_QUEUE_ID_MAX = 2**31 - 1  # a Java int
_OFFSET_MIN, _OFFSET_MAX = -(2**63), 2**63 - 1  # a Java long

_DIGITS = re.compile("[0-9]+")

OffsetTable = dict[str, dict[int, int]]


def encode_offset_table(table: OffsetTable) -> str:
    """consumerOffset.json's content: fastjson's pretty output of the manager, whose only property
    is offsetTable, with bare integer queue ids (``{"offsetTable":{"T@G":{0:12,1:5}}}``, tabs and
    line breaks where fastjson puts them)."""
    return fastjson_pretty({"offsetTable": table})


def decode_offset_table(text: str) -> OffsetTable:
    """The offset table in consumerOffset.json's text: queue ids bare or quoted, any whitespace.
    ValueError saying what is wrong."""
    obj = loads_lenient(text)
    if type(obj) is not dict:
        raise ValueError("the content is not a JSON object")
    raw = obj.get("offsetTable")
    if raw is None:
        return {}
    if type(raw) is not dict:
        raise ValueError("offsetTable is not an object")
    table: OffsetTable = {}
    for key, queues in raw.items():
        if type(queues) is not dict:
            raise ValueError(f"offsetTable[{key!r}] is not an object of queue id -> offset")
        offsets: dict[int, int] = {}
        for queue_id, offset in queues.items():
            if not _DIGITS.fullmatch(queue_id):
                raise ValueError(f"offsetTable[{key!r}] has a queue id {queue_id!r} that is not an integer >= 0")
            qid = int(queue_id)
            if qid > _QUEUE_ID_MAX:
                raise ValueError(f"offsetTable[{key!r}] has a queue id {qid} out of range")
            if type(offset) is not int or not _OFFSET_MIN <= offset <= _OFFSET_MAX:
                raise ValueError(f"offsetTable[{key!r}][{qid}] = {offset!r} is not a 64-bit integer offset")
            offsets[qid] = offset
        table[key] = offsets
    return table


def _check_name(what: str, value: object) -> str:
    if type(value) is not str or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    if TOPIC_GROUP_SEPARATOR in value:
        raise ValueError(f"{what} {value!r} contains '@', which joins topic and group in the offset table")
    return value


def _check_queue_id(queue_id: object) -> int:
    if type(queue_id) is not int or not 0 <= queue_id <= _QUEUE_ID_MAX:
        raise ValueError(f"queue_id must be an int in [0, 2^31), not {queue_id!r}")
    return queue_id


def _split(key: str) -> tuple[str, str] | None:
    """(topic, group) of an offset table key, or None for a key that is not ``topic@group``
    (RocketMQ skips those too)."""
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    return (parts[0], parts[1]) if len(parts) == 2 else None


class ConsumerOffsets:
    """The committed offsets of one broker, persisted in ``<root>/config/consumerOffset.json``.

    Single-threaded: the broker's controller calls it. ``persist()`` is for the periodic flush
    (flushConsumerOffsetInterval, 5 s) and shutdown; it writes only when a commit changed something.
    """

    def __init__(self, root: str) -> None:
        self.path = config_path(root, "consumerOffset.json")
        table, source = read_with_bak(self.path, decode_offset_table)
        self._table: OffsetTable = table or {}
        self._dirty = False
        # loaded from the .bak: the file is damaged or empty, so the next write must not copy it over the .bak
        self._backup = source != self.path + ".bak"

    @property
    def dirty(self) -> bool:
        """Whether the table changed since it was loaded or last persisted."""
        return self._dirty

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Store ``offset`` for the group in the queue (commitOffset): it overwrites, smaller or not."""
        key = _check_name("topic", topic) + TOPIC_GROUP_SEPARATOR + _check_name("group", group)
        _check_queue_id(queue_id)
        if type(offset) is not int or not _OFFSET_MIN <= offset <= _OFFSET_MAX:
            raise ValueError(f"offset must be a 64-bit int, not {offset!r}")
        queues = self._table.setdefault(key, {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group has none in that queue (queryOffset)."""
        key = _check_name("topic", topic) + TOPIC_GROUP_SEPARATOR + _check_name("group", group)
        return self._table.get(key, {}).get(_check_queue_id(queue_id), -1)

    def table(self) -> OffsetTable:
        """A copy of the table: ``"topic@group"`` -> {queue id: offset}."""
        return {key: dict(queues) for key, queues in self._table.items()}

    def groups_of_topic(self, topic: str) -> set[str]:
        """The groups with offsets in the topic (whichGroupByTopic)."""
        return {tg[1] for tg in map(_split, self._table) if tg is not None and tg[0] == topic}

    def topics_of_group(self, group: str) -> set[str]:
        """The topics the group has offsets in (whichTopicByConsumer)."""
        return {tg[0] for tg in map(_split, self._table) if tg is not None and tg[1] == group}

    def remove_group(self, group: str) -> bool:
        """Drop every ``topic@group`` key of the group (removeOffset); whether there was one."""
        _check_name("group", group)
        doomed = [key for key in self._table if (tg := _split(key)) is not None and tg[1] == group]
        for key in doomed:
            del self._table[key]
        if doomed:
            self._dirty = True
        return bool(doomed)

    def replace(self, table: OffsetTable) -> None:
        """The whole table, as a slave takes its master's (SlaveSynchronize)."""
        if table != self._table:
            self._table = {key: dict(queues) for key, queues in table.items()}
            self._dirty = True

    def persist(self) -> bool:
        """Write consumerOffset.json when the table changed (the previous file kept as .bak, the new
        one written whole and renamed over it); whether it wrote. An OSError leaves it dirty."""
        if not self._dirty:
            return False
        write_with_bak(self.path, encode_offset_table(self._table), backup=self._backup)
        self._backup = True
        self._dirty = False
        return True
