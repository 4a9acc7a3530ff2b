"""A broker's registry of connected clients (RocketMQ 4.9.7 ConsumerManager, ConsumerGroupInfo,
ProducerManager and the heartbeat classes; docs/rocketmq-remoting-spec.md §2.4.4-§2.4.6, §3.6):
what a HEART_BEAT body says, which channels belong to which consumer and producer group with what
subscriptions, and when a group's membership changed (when RocketMQ sends NOTIFY_CONSUMER_IDS_CHANGED).

Pure, single-threaded state: the caller owns the connections. A *channel* is any hashable key
the caller picks for a connection; times are milliseconds passed in by the caller.
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHANNEL_EXPIRED_MS", "ClientChannelInfo", "ConsumeFromWhere", "ConsumeType", "ConsumerData",
           "ConsumerGroupInfo", "ConsumerManager", "HeartbeatData", "MessageModel", "ProducerManager",
           "SubscriptionData", "consumer_list_body", "parse_heartbeat"]

#: a client silent for longer than this is dropped by the 10 s scan (CHANNEL_EXPIRED_TIMEOUT)
CHANNEL_EXPIRED_MS = 120_000
#: SubscriptionData.SUB_ALL
SUB_ALL = "*"


class ConsumeType(enum.Enum):
    """How a consumer gets messages; the value is the ordinal the C++ client sends."""

    CONSUME_ACTIVELY = 0  # a pull consumer
    CONSUME_PASSIVELY = 1  # a push consumer


class MessageModel(enum.Enum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


@dataclass(frozen=True)
class SubscriptionData:
    """One topic a consumer group subscribes to. ``code_set`` is what the client computed: Java's
    String.hashCode of each tag, but atoi(tag) from the C++ client, so do not filter by it for C++."""

    topic: str
    sub_string: str
    sub_version: int
    tags_set: frozenset[str] = frozenset()
    code_set: frozenset[int] = frozenset()
    expression_type: str = "TAG"


@dataclass
class ConsumerData:
    group: str
    consume_type: ConsumeType | None
    message_model: MessageModel | None
    consume_from_where: ConsumeFromWhere | None
    subscriptions: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False


@dataclass
class HeartbeatData:
    client_id: str
    producers: list[str] = field(default_factory=list)
    consumers: list[ConsumerData] = field(default_factory=list)


_INTEGER = re.compile(r"-?[0-9]+")


_KIND_NAMES: dict[type, str] = {str: "a string", list: "a list", bool: "a boolean"}


def _want(obj: dict[str, Any], key: str, where: str, kind: type, default: Any = None, required: bool = False) -> Any:
    """obj[key] when it has the type (bool is not taken for int, nor int for bool); the default when
    it is absent or null; ValueError naming ``where`` + key otherwise."""
    value = obj.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}{key} is missing")
        return default
    if type(value) is not kind:
        raise ValueError(f"{where}{key} must be {_KIND_NAMES[kind]}, not {value!r}")
    return value


def _enum(obj: dict[str, Any], key: str, where: str, kind: type[enum.Enum]) -> Any:
    """An enum sent as its ordinal (C++) or its name (Java); None when absent (RocketMQ keeps null)."""
    value = obj.get(key)
    if value is None:
        return None
    if type(value) is int:
        try:
            return kind(value)
        except ValueError:
            pass
    elif type(value) is str and value in kind.__members__:
        return kind[value]
    names = ", ".join(f"{m.value} {m.name}" for m in kind)
    raise ValueError(f"{where}{key} must be one of {names} (by number or name), not {value!r}")


def _subscription(obj: Any, where: str, now_ms: int) -> SubscriptionData:
    if type(obj) is not dict:
        raise ValueError(f"{where[:-1]} must be an object, not {obj!r}")
    version = obj.get("subVersion")
    if version is None:
        sub_version = now_ms  # Java's field initializer: System.currentTimeMillis() at decoding
    elif type(version) is int:
        sub_version = version
    elif type(version) is str and _INTEGER.fullmatch(version):
        sub_version = int(version)  # the C++ client sends it as a string
    else:
        raise ValueError(f"{where}subVersion must be an integer or a string of digits, not {version!r}")
    tags = _want(obj, "tagsSet", where, list, [])
    if any(type(t) is not str for t in tags):
        raise ValueError(f"{where}tagsSet must be a list of strings, not {tags!r}")
    codes = _want(obj, "codeSet", where, list, [])
    if any(type(c) is not int for c in codes):
        raise ValueError(f"{where}codeSet must be a list of integers, not {codes!r}")
    return SubscriptionData(topic=_want(obj, "topic", where, str, required=True),
                            sub_string=_want(obj, "subString", where, str, required=True),
                            sub_version=sub_version, tags_set=frozenset(tags), code_set=frozenset(codes),
                            expression_type=_want(obj, "expressionType", where, str, "TAG"))


def _consumer(obj: Any, where: str, now_ms: int) -> ConsumerData:
    if type(obj) is not dict:
        raise ValueError(f"{where[:-1]} must be an object, not {obj!r}")
    subs = _want(obj, "subscriptionDataSet", where, list, [])  # absent from the C++ pull consumer
    return ConsumerData(group=_want(obj, "groupName", where, str, required=True),
                        consume_type=_enum(obj, "consumeType", where, ConsumeType),
                        message_model=_enum(obj, "messageModel", where, MessageModel),
                        consume_from_where=_enum(obj, "consumeFromWhere", where, ConsumeFromWhere),
                        subscriptions=[_subscription(s, f"{where}subscriptionDataSet[{i}].", now_ms)
                                       for i, s in enumerate(subs)],
                        unit_mode=_want(obj, "unitMode", where, bool, False))


def parse_heartbeat(body: bytes, now_ms: int | None = None) -> HeartbeatData:
    """A HEART_BEAT body (HeartbeatData JSON) as the C++ client writes it (enum ordinals, subVersion
    as a string, absent sets, a trailing newline) or as a Java client does (enum names, numbers,
    classFilterMode and expressionType). Unknown properties are ignored. A subscription without
    subVersion gets ``now_ms`` (default: the wall clock), as Java's decoding does. ValueError naming
    the property that is missing or of the wrong type."""
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"the heartbeat body is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the heartbeat body is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError("the heartbeat body is nested too deeply") from None
    if type(obj) is not dict:
        raise ValueError("the heartbeat body is not a JSON object")
    producers = []
    for i, p in enumerate(_want(obj, "producerDataSet", "", list, [])):
        if type(p) is not dict:
            raise ValueError(f"producerDataSet[{i}] must be an object, not {p!r}")
        producers.append(_want(p, "groupName", f"producerDataSet[{i}].", str, required=True))
    consumers = [_consumer(c, f"consumerDataSet[{i}].", now_ms)
                 for i, c in enumerate(_want(obj, "consumerDataSet", "", list, []))]
    return HeartbeatData(_want(obj, "clientID", "", str, required=True), producers, consumers)


def consumer_list_body(ids: list[str]) -> bytes:
    """The GET_CONSUMER_LIST_BY_GROUP body as RocketMQ writes it: ``{"consumerIdList":[...]}``."""
    return json.dumps({"consumerIdList": list(ids)}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@dataclass
class ClientChannelInfo:
    """A client on one channel (ClientChannelInfo): what its heartbeat's header and body said, and when."""

    client_id: str
    language: str
    version: int
    last_update_ms: int


@dataclass
class ConsumerGroupInfo:
    """A consumer group's live state (ConsumerGroupInfo): the settings of its latest heartbeat,
    its subscriptions by topic and its channels."""

    group: str
    consume_type: ConsumeType | None
    message_model: MessageModel | None
    consume_from_where: ConsumeFromWhere | None
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    channels: dict[Hashable, ClientChannelInfo] = field(default_factory=dict)
    last_update_ms: int = 0


def _check_now(now_ms: object) -> int:
    if type(now_ms) is not int:
        raise ValueError(f"now_ms must be an int, not {now_ms!r}")
    return now_ms


def _check_client_id(client_id: object) -> str:
    if type(client_id) is not str:
        raise ValueError(f"client_id must be a string, not {client_id!r}")
    return client_id


def _drop_channel(tables: dict[str, dict[Hashable, ClientChannelInfo]], channel: Hashable) -> list[str]:
    """Remove the channel from every group's table; the groups it was in."""
    return [group for group, channels in tables.items() if channels.pop(channel, None) is not None]


def _expire(tables: dict[str, dict[Hashable, ClientChannelInfo]], now_ms: int,
            expiry_ms: int) -> list[tuple[Hashable, str]]:
    """Remove the channels silent for more than expiry_ms from every group's table; (channel, group) pairs."""
    _check_now(now_ms)
    removed = []
    for group, channels in tables.items():
        for channel in [ch for ch, client in channels.items() if now_ms - client.last_update_ms > expiry_ms]:
            del channels[channel]
            removed.append((channel, group))
    return removed


class ConsumerManager:
    """The consumer groups of one broker and their channels (ConsumerManager)."""

    def __init__(self) -> None:
        self._groups: dict[str, ConsumerGroupInfo] = {}

    def register(self, channel: Hashable, client_id: str, language: str, version: int, data: ConsumerData,
                 now_ms: int) -> bool:
        """Register a heartbeat's consumer data for the channel (registerConsumer). True when the
        channel is new to the group or a topic was added to or removed from the group's
        subscriptions: then RocketMQ sends NOTIFY_CONSUMER_IDS_CHANGED to every channel of the group
        (when the group's notifyConsumerIdsChangedEnable is on). A newer subVersion of a topic
        replaces its subscription without counting as a change, as in RocketMQ."""
        _check_client_id(client_id)
        _check_now(now_ms)
        if not isinstance(data, ConsumerData):
            raise ValueError(f"data must be a ConsumerData, not {type(data).__name__}")
        info = self._groups.get(data.group)
        if info is None:
            info = self._groups[data.group] = ConsumerGroupInfo(data.group, data.consume_type, data.message_model,
                                                                data.consume_from_where)
        info.consume_type, info.message_model = data.consume_type, data.message_model
        info.consume_from_where = data.consume_from_where
        old = info.channels.get(channel)
        channel_new = old is None
        if old is None or old.client_id != client_id:  # a different client id on a known channel replaces it quietly
            info.channels[channel] = ClientChannelInfo(client_id, language, version, now_ms)
        else:
            old.last_update_ms = now_ms
        info.last_update_ms = now_ms
        subscriptions_changed = self._update_subscriptions(info, data.subscriptions)
        return channel_new or subscriptions_changed

    @staticmethod
    def _update_subscriptions(info: ConsumerGroupInfo, subs: list[SubscriptionData]) -> bool:
        """ConsumerGroupInfo.updateSubscription: whether the group's set of topics changed."""
        changed = False
        for sub in subs:
            old = info.subscriptions.get(sub.topic)
            if old is None:
                info.subscriptions[sub.topic] = sub
                changed = True
            elif sub.sub_version > old.sub_version:
                info.subscriptions[sub.topic] = sub
        topics = {sub.topic for sub in subs}
        for topic in [t for t in info.subscriptions if t not in topics]:
            del info.subscriptions[topic]
            changed = True
        return changed

    def unregister(self, channel: Hashable, group: str) -> bool:
        """Remove the channel from the group (unregisterConsumer, on UNREGISTER_CLIENT); True when it
        was there, so the group's remaining channels should be notified. A group left without
        channels is dropped. (RocketMQ notifies whenever the group exists, even when the channel
        was not in it; nothing changed then, so we say False.)"""
        info = self._groups.get(group)
        if info is None or info.channels.pop(channel, None) is None:
            return False
        if not info.channels:
            del self._groups[group]
        return True

    def channel_closed(self, channel: Hashable) -> list[str]:
        """The channel's connection closed (doChannelCloseEvent): it leaves every group; the groups it
        left, whose remaining channels should be notified."""
        left = _drop_channel({group: info.channels for group, info in self._groups.items()}, channel)
        self._drop_empty_groups()
        return left

    def scan_expired_channels(self, now_ms: int, expiry_ms: int = CHANNEL_EXPIRED_MS) -> list[tuple[Hashable, str]]:
        """Remove every channel silent for more than ``expiry_ms`` (scanNotActiveChannel); the
        (channel, group) pairs removed. RocketMQ also closes those connections."""
        removed = _expire({group: info.channels for group, info in self._groups.items()}, now_ms, expiry_ms)
        self._drop_empty_groups()
        return removed

    def _drop_empty_groups(self) -> None:
        for group in [g for g, info in self._groups.items() if not info.channels]:
            del self._groups[group]

    def scan_expired(self, now_ms: int, expiry_ms: int = CHANNEL_EXPIRED_MS) -> list[str]:
        """Like scan_expired_channels, returning the groups that lost a channel."""
        return list(dict.fromkeys(group for _, group in self.scan_expired_channels(now_ms, expiry_ms)))

    def consumer_ids(self, group: str) -> list[str]:
        """The client ids of the group's channels (GET_CONSUMER_LIST_BY_GROUP); [] for no group."""
        info = self._groups.get(group)
        return [client.client_id for client in info.channels.values()] if info else []

    def channels(self, group: str) -> list[Hashable]:
        """The group's channels: where NOTIFY_CONSUMER_IDS_CHANGED goes."""
        info = self._groups.get(group)
        return list(info.channels) if info else []

    def has_channel(self, group: str, channel: Hashable) -> bool:
        """Whether the channel is one of the group's: a heartbeat on it registered a consumer of
        the group, not since unregistered, closed or expired (the ACL's offset rule, docs/security.md)."""
        info = self._groups.get(group)
        return info is not None and channel in info.channels

    def find_channel(self, group: str, client_id: str) -> Hashable | None:
        """The channel of the group's client with that id (findChannel), or None."""
        info = self._groups.get(group)
        for channel, client in (info.channels.items() if info else ()):
            if client.client_id == client_id:
                return channel
        return None

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        """A copy of the group's state, or None when it has no channel."""
        info = self._groups.get(group)
        if info is None:
            return None
        return ConsumerGroupInfo(info.group, info.consume_type, info.message_model, info.consume_from_where,
                                 dict(info.subscriptions),
                                 {ch: ClientChannelInfo(c.client_id, c.language, c.version, c.last_update_ms)
                                  for ch, c in info.channels.items()},
                                 info.last_update_ms)

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        """The group's subscription to the topic (findSubscriptionData), or None."""
        info = self._groups.get(group)
        return info.subscriptions.get(topic) if info else None

    def groups(self) -> list[str]:
        """The groups with at least one channel."""
        return list(self._groups)


class ProducerManager:
    """The producer groups of one broker and their channels (ProducerManager); needed to find a
    producer to ask about a transaction."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[Hashable, ClientChannelInfo]] = {}

    def register(self, channel: Hashable, client_id: str, group: str, now_ms: int, *, language: str = "",
                 version: int = 0) -> bool:
        """Register a heartbeat's producer group for the channel (registerProducer); True when the
        channel is new to the group. A known channel only has its time refreshed."""
        _check_client_id(client_id)
        _check_now(now_ms)
        channels = self._groups.setdefault(group, {})
        old = channels.get(channel)
        if old is not None:
            old.last_update_ms = now_ms
            return False
        channels[channel] = ClientChannelInfo(client_id, language, version, now_ms)
        return True

    def unregister(self, channel: Hashable, group: str) -> bool:
        """Remove the channel from the group (unregisterProducer); whether it was there."""
        channels = self._groups.get(group)
        if channels is None or channels.pop(channel, None) is None:
            return False
        if not channels:
            del self._groups[group]
        return True

    def channel_closed(self, channel: Hashable) -> list[str]:
        """The channel's connection closed: it leaves every group; the groups it left."""
        left = _drop_channel(self._groups, channel)
        self._drop_empty_groups()
        return left

    def scan_expired_channels(self, now_ms: int, expiry_ms: int = CHANNEL_EXPIRED_MS) -> list[tuple[Hashable, str]]:
        """Remove every channel silent for more than ``expiry_ms``; the (channel, group) pairs removed."""
        removed = _expire(self._groups, now_ms, expiry_ms)
        self._drop_empty_groups()
        return removed

    def _drop_empty_groups(self) -> None:
        for group in [g for g, channels in self._groups.items() if not channels]:
            del self._groups[group]

    def scan_expired(self, now_ms: int, expiry_ms: int = CHANNEL_EXPIRED_MS) -> list[str]:
        """Like scan_expired_channels, returning the groups that lost a channel."""
        return list(dict.fromkeys(group for _, group in self.scan_expired_channels(now_ms, expiry_ms)))

    def channels(self, group: str) -> list[Hashable]:
        return list(self._groups.get(group, ()))

    def find_channel(self, client_id: str) -> Hashable | None:
        """A channel of the producer with that client id (findChannel), or None."""
        for channels in self._groups.values():
            for channel, client in channels.items():
                if client.client_id == client_id:
                    return channel
        return None

    def groups(self) -> list[str]:
        """The groups with at least one channel."""
        return list(self._groups)
