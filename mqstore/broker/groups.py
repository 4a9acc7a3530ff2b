"""A broker's subscription groups (RocketMQ 4.9.7 SubscriptionGroupManager and SubscriptionGroupConfig;
docs/rocketmq-remoting-spec.md §3.3): the per-group settings a pull, a send-back and a heartbeat
consult, auto-created on first use, and ``config/subscriptionGroup.json`` in RocketMQ's format
(a RocketMQ broker's file loads as is and ours loads in one).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from mqstore.broker.jsonfile import fastjson_pretty, loads_lenient, read_with_bak, write_with_bak
from mqstore.layout import config_path

__all__ = ["STARTUP_GROUPS", "SubscriptionGroupConfig", "SubscriptionGroups", "is_sys_consumer_group"]

#: groups with this prefix are created on first use even when auto-creation is off (MixAll.CID_RMQ_SYS_PREFIX)
CID_RMQ_SYS_PREFIX = "CID_RMQ_SYS_"
#: the groups SubscriptionGroupManager's constructor puts in the table, all with the default settings
#: (TOOLS_CONSUMER, FILTERSRV_CONSUMER, SELF_TEST_C_GROUP, the ONS proxy and API groups)
STARTUP_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                  "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER")

# field name -> (RocketMQ's JSON name, type)
_FIELDS: dict[str, tuple[str, type]] = {
    "group_name": ("groupName", str),
    "consume_enable": ("consumeEnable", bool),
    "consume_from_min_enable": ("consumeFromMinEnable", bool),
    "consume_broadcast_enable": ("consumeBroadcastEnable", bool),
    "retry_queue_nums": ("retryQueueNums", int),
    "retry_max_times": ("retryMaxTimes", int),
    "broker_id": ("brokerId", int),
    "which_broker_when_consume_slowly": ("whichBrokerWhenConsumeSlowly", int),
    "notify_consumer_ids_changed_enable": ("notifyConsumerIdsChangedEnable", bool),
}
_KIND_NAMES = {str: "a string", bool: "a boolean", int: "an integer"}
_BY_JSON = {json_name: (name, kind) for name, (json_name, kind) in _FIELDS.items()}


def is_sys_consumer_group(group: str) -> bool:
    """MixAll.isSysConsumerGroup."""
    return group.startswith(CID_RMQ_SYS_PREFIX)


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    """One group's settings with RocketMQ's defaults. ``extra`` keeps properties of other RocketMQ
    versions found in a loaded file (5.x's consumeMessageOrderly, groupRetryPolicy, ...) so that
    they are written back unchanged."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, (json_name, kind) in _FIELDS.items():
            value = getattr(self, name)
            if type(value) is not kind:
                raise ValueError(f"{json_name} must be {_KIND_NAMES[kind]}, not {value!r}")
        if not self.group_name:
            raise ValueError("groupName must not be empty")
        if type(self.extra) is not dict or any(k in _BY_JSON for k in self.extra):
            raise ValueError("extra must be a dict of properties other than SubscriptionGroupConfig's own")

    def to_json(self) -> dict[str, Any]:
        """The config as RocketMQ serializes it (its property names)."""
        return {**self.extra, **{json_name: getattr(self, name) for name, (json_name, _) in _FIELDS.items()}}

    @classmethod
    def from_json(cls, obj: Any, group: str | None = None) -> SubscriptionGroupConfig:
        """A config from RocketMQ's JSON object; absent properties take the defaults, and ``group``
        (the table key) stands in for an absent groupName. ValueError naming a property of the wrong type."""
        if type(obj) is not dict:
            raise ValueError(f"subscription group {group!r} is not an object")
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in obj.items():
            if key in _BY_JSON:
                kwargs[_BY_JSON[key][0]] = value
            else:
                extra[key] = value
        kwargs.setdefault("group_name", group)
        try:
            return cls(**kwargs, extra=extra)
        except ValueError as exc:
            raise ValueError(f"subscription group {group!r}: {exc}") from None


def _decode(text: str) -> tuple[dict[str, SubscriptionGroupConfig], dict[str, int] | None]:
    obj = loads_lenient(text)
    if type(obj) is not dict:
        raise ValueError("the content is not a JSON object")
    raw = obj.get("subscriptionGroupTable")
    if raw is None:
        raw = {}
    if type(raw) is not dict:
        raise ValueError("subscriptionGroupTable is not an object")
    table = {name: SubscriptionGroupConfig.from_json(cfg, name) for name, cfg in raw.items()}
    version = obj.get("dataVersion")
    if version is None:
        return table, None
    if type(version) is not dict or any(type(version.get(k, 0)) is not int for k in ("counter", "timestamp")):
        raise ValueError("dataVersion is not an object with integer counter and timestamp")
    return table, {"counter": version.get("counter", 0), "timestamp": version.get("timestamp", 0)}


class SubscriptionGroups:
    """The subscription group table of one broker, persisted in ``<root>/config/subscriptionGroup.json``
    whenever it changes (as RocketMQ does). Single-threaded; a failed write raises OSError after the
    table has changed in memory."""

    def __init__(self, root: str, *, auto_create_subscription_group: bool = True) -> None:
        self.path = config_path(root, "subscriptionGroup.json")
        self.auto_create = auto_create_subscription_group
        self.table = {name: SubscriptionGroupConfig(name) for name in STARTUP_GROUPS}
        self.data_version = {"counter": 0, "timestamp": int(time.time() * 1000)}
        loaded, source = read_with_bak(self.path, _decode)
        if loaded is not None:
            table, version = loaded
            self.table.update(table)
            if version is not None:
                self.data_version = version
        # loaded from the .bak: the file is damaged or empty, so the next write must not copy it over the .bak
        self._backup = source != self.path + ".bak"

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config (findSubscriptionGroupConfig); an unknown group is created with the
        defaults and persisted when auto-creation is on or it is a system group, else None."""
        if type(group) is not str or not group:
            raise ValueError(f"group must be a non-empty string, not {group!r}")
        cfg = self.table.get(group)
        if cfg is None and (self.auto_create or is_sys_consumer_group(group)):
            cfg = self.table[group] = SubscriptionGroupConfig(group)
            self._changed()
        return cfg

    def update(self, config: SubscriptionGroupConfig) -> None:
        """Create or replace a group's config (updateSubscriptionGroupConfig)."""
        if not isinstance(config, SubscriptionGroupConfig):
            raise ValueError(f"config must be a SubscriptionGroupConfig, not {type(config).__name__}")
        self.table[config.group_name] = config
        self._changed()

    def delete(self, group: str) -> bool:
        """Remove a group's config (deleteSubscriptionGroupConfig); whether it existed."""
        if self.table.pop(group, None) is None:
            return False
        self._changed()
        return True

    def all(self) -> dict[str, SubscriptionGroupConfig]:
        """A copy of the table (the configs themselves are immutable)."""
        return dict(self.table)

    def replace(self, text: str) -> None:
        """The whole table from a GET_ALL_SUBSCRIPTIONGROUP_CONFIG answer, as a slave takes its
        master's (SlaveSynchronize); ValueError when it does not decode."""
        table, version = _decode(text)
        merged = {name: SubscriptionGroupConfig(name) for name in STARTUP_GROUPS}
        merged.update(table)
        if merged != self.table:
            self.table = merged
            if version is not None:
                self.data_version = version
            self.persist()

    def wrapper(self) -> dict[str, Any]:
        """The manager as RocketMQ serializes it: what subscriptionGroup.json holds and
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG answers."""
        return {"dataVersion": dict(self.data_version),
                "subscriptionGroupTable": {name: cfg.to_json() for name, cfg in self.table.items()}}

    def persist(self) -> None:
        """Write subscriptionGroup.json (the previous file kept as .bak, the new one written whole
        and renamed over it)."""
        write_with_bak(self.path, fastjson_pretty(self.wrapper()), backup=self._backup)
        self._backup = True

    def _changed(self) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}
        self.persist()

