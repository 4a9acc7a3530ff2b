"""The NameServer's route table (RocketMQ 4.9.7 RouteInfoManager; docs/rocketmq-remoting-spec.md
§2.3): brokers register their topics, clients ask for a topic's route, and a broker that has not
registered for BROKER_CHANNEL_EXPIRED_MS, or whose registering connection closed, drops out.

Unlike RocketMQ's, the table keeps a broker's name from being taken (docs/security.md):
each registration remembers the connection it came on (``channel``, any object the caller uses
for one), and while that connection is open and the registration not expired, no other
connection registers the same broker name and id or the same address, nor unregisters it
without a verified signature; RouteRefused says who holds it.

Pure data and functions, no sockets: the NameServer process (and the one embedded in a broker)
calls them from its request handlers. Times are milliseconds passed in by the caller.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

__all__ = ["BROKER_CHANNEL_EXPIRED_MS", "MASTER_ID", "RegisterBody", "RouteRefused", "RouteTable",
           "parse_register_body", "route_json"]

#: a broker whose last registration is older than this is dropped (BROKER_CHANNEL_EXPIRED_TIME)
BROKER_CHANNEL_EXPIRED_MS = 120_000
#: the broker id of a master (MixAll.MASTER_ID); a slave has an id > 0
MASTER_ID = 0


class RouteRefused(Exception):
    """A registration or unregistration another connection's live registration forbids (the
    NameServer answers NO_PERMISSION with the message)."""


@dataclass
class _Live:
    last_update_ms: int
    data_version: dict[str, Any] | None
    ha_server_addr: str
    #: the connection the registration came on (None: not known, e.g. a caller without sockets)
    channel: object | None = None


@dataclass
class RegisterBody:
    """A REGISTER_BROKER request body (RegisterBrokerBody): the broker's topic configs and the
    data version they were taken at, and its filter servers."""

    topic_configs: dict[str, dict[str, Any]]
    data_version: dict[str, Any] | None
    filter_servers: list[str] = field(default_factory=list)


def parse_register_body(body: bytes, *, compressed: str = "false", body_crc32: str = "0") -> RegisterBody:
    """The body of a REGISTER_BROKER request; ValueError naming the problem. ``body_crc32`` is the
    request's bodyCrc32 field (Java UtilAll.crc32: CRC32 & 0x7FFFFFFF; 0 skips the check, and the
    mismatch message is RocketMQ's "crc32 not match"). Only the JSON form (compressed=false, the
    default of a RocketMQ broker's compressedRegister) is understood."""
    try:
        expected = int(body_crc32 or "0")
    except ValueError:
        raise ValueError(f"bodyCrc32 {body_crc32!r} is not a number") from None
    if expected and (zlib.crc32(body) & 0x7FFFFFFF) != expected:
        raise ValueError("crc32 not match")
    if compressed.lower() == "true":
        raise ValueError("a compressed registration body (compressedRegister=true) is not supported: "
                         "register with compressed=false")
    try:
        obj = json.loads(body.decode("utf-8")) if body else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the registration body is not JSON: {exc}") from None
    if type(obj) is not dict:
        raise ValueError("the registration body is not a JSON object")
    wrapper = obj.get("topicConfigSerializeWrapper") or {}
    if type(wrapper) is not dict:
        raise ValueError("topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if type(table) is not dict or any(type(v) is not dict for v in table.values()):
        raise ValueError("topicConfigTable is not an object of topic configs")
    version = wrapper.get("dataVersion")
    filters = obj.get("filterServerList") or []
    if type(filters) is not list or any(type(f) is not str for f in filters):
        raise ValueError("filterServerList is not a list of addresses")
    return RegisterBody({str(k): v for k, v in table.items()}, version if type(version) is dict else None, filters)


def _queue_data(broker_name: str, tc: dict[str, Any]) -> dict[str, Any]:
    """QueueData of a TopicConfig (createAndUpdateQueueData)."""
    def num(key: str, default: int) -> int:
        v = tc.get(key, default)
        if type(v) is not int:
            raise ValueError(f"topic config field {key} must be an integer, not {v!r}")
        return v
    return {"brokerName": broker_name, "perm": num("perm", 6), "readQueueNums": num("readQueueNums", 16),
            "topicSysFlag": num("topicSysFlag", 0), "writeQueueNums": num("writeQueueNums", 16)}


class RouteTable:
    """Clusters, brokers (name -> id -> address), topics' queue data by broker name, and the
    brokers alive (address -> last registration), as RouteInfoManager keeps them."""

    def __init__(self) -> None:
        self.clusters: dict[str, set[str]] = {}
        self.brokers: dict[str, dict[str, Any]] = {}          # name -> {cluster, brokerName, brokerAddrs}
        self.topics: dict[str, dict[str, dict[str, Any]]] = {}  # topic -> broker name -> QueueData
        self.live: dict[str, _Live] = {}
        self.filter_servers: dict[str, list[str]] = {}

    def _holder(self, broker_addr: str, now_ms: int) -> object | None:
        """The connection holding broker_addr's registration: open (a closed one's registrations
        are gone) and not expired; None when nobody holds it."""
        live = self.live.get(broker_addr)
        if live is None or live.last_update_ms + BROKER_CHANNEL_EXPIRED_MS < now_ms:
            return None
        return live.channel

    def register_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int, ha_server_addr: str,
                        body: RegisterBody | None, now_ms: int, *,
                        channel: object | None = None) -> tuple[str | None, str | None]:
        """A broker's (re-)registration, from ``channel``. Returns (haServerAddr, masterAddr): for
        a slave whose master is registered and alive, else (None, None). Queue data comes from a
        master's registration only, and only when its data version changed or on its first one.
        A topic config that is not one is a ValueError, and a name, id or address another
        connection holds RouteRefused, before anything changes."""
        queue_datas = {str(tc.get("topicName") or name): _queue_data(broker_name, tc)
                       for name, tc in body.topic_configs.items()} if body is not None and broker_id == MASTER_ID else {}
        data = self.brokers.get(broker_name)
        held_by = data["brokerAddrs"].get(broker_id) if data is not None else None
        if held_by is not None and held_by != broker_addr:
            holder = self._holder(held_by, now_ms)
            if holder is not None and holder is not channel:
                raise RouteRefused(f"broker {broker_name} id {broker_id} is registered from {held_by}, whose connection "
                                   f"is open: {broker_addr} cannot take it")
        holder = self._holder(broker_addr, now_ms)
        if holder is not None and holder is not channel:
            raise RouteRefused(f"{broker_addr} is registered (as broker {self._name_of(broker_addr)}) from another "
                               "connection, still open: only that connection registers it again")
        self.clusters.setdefault(cluster, set()).add(broker_name)
        first = data is None
        if data is None:
            data = {"cluster": cluster, "brokerName": broker_name, "brokerAddrs": {}}
            self.brokers[broker_name] = data
        addrs: dict[int, str] = data["brokerAddrs"]
        for bid in [b for b, a in addrs.items() if a == broker_addr and b != broker_id]:
            del addrs[bid]  # the same address under another id: a slave switched to master
        old = addrs.get(broker_id)
        addrs[broker_id] = broker_addr
        first = first or old is None
        version = body.data_version if body is not None else None
        if body is not None and broker_id == MASTER_ID:
            prev = self.live.get(broker_addr)
            if first or prev is None or prev.data_version != version:
                for topic, queue_data in queue_datas.items():
                    self.topics.setdefault(topic, {})[broker_name] = queue_data
        self.live[broker_addr] = _Live(now_ms, version, ha_server_addr, channel)
        if body is not None:
            if body.filter_servers:
                self.filter_servers[broker_addr] = list(body.filter_servers)
            else:
                self.filter_servers.pop(broker_addr, None)
        if broker_id != MASTER_ID:
            master = addrs.get(MASTER_ID)
            if master is not None and master in self.live:
                return self.live[master].ha_server_addr, master
        return None, None

    def _name_of(self, broker_addr: str) -> str:
        return next((f"{n} id {b}" for n, d in self.brokers.items() for b, a in d["brokerAddrs"].items()
                     if a == broker_addr), "?")

    def _drop_address(self, broker_addr: str, broker_name: str | None = None, broker_id: int | None = None) -> None:
        """Forget one broker address; a broker name with no address left leaves its cluster and
        every topic's queue data (onChannelDestroy / unregisterBroker). With a name and id, only
        that entry goes."""
        self.live.pop(broker_addr, None)
        self.filter_servers.pop(broker_addr, None)
        for name, data in list(self.brokers.items()):
            if broker_name is not None and name != broker_name:
                continue
            addrs = data["brokerAddrs"]
            for bid in [b for b, a in addrs.items() if (b == broker_id if broker_id is not None else a == broker_addr)]:
                del addrs[bid]
            if addrs:
                continue
            del self.brokers[name]
            for cluster, names in list(self.clusters.items()):
                names.discard(name)
                if not names:
                    del self.clusters[cluster]
            for topic, queues in list(self.topics.items()):
                queues.pop(name, None)
                if not queues:
                    del self.topics[topic]

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int, *,
                          channel: object | None = None, verified: bool = False) -> None:
        """UNREGISTER_BROKER: a broker stopping. From the connection that registered the address,
        or ``verified`` (a signature the NameServer checked); else RouteRefused. A name and id
        registered at another address are left alone (RocketMQ removes them whatever their
        address: one broker's unregistration could remove another's)."""
        data = self.brokers.get(broker_name)
        if data is None or data["brokerAddrs"].get(broker_id) != broker_addr:
            return
        live = self.live.get(broker_addr)
        if live is not None and live.channel is not None and live.channel is not channel and not verified:
            raise RouteRefused(f"{broker_addr} (broker {broker_name} id {broker_id}) was registered from another "
                               "connection: only that connection, or a signed request, unregisters it")
        self._drop_address(broker_addr, broker_name, broker_id)

    def channel_closed(self, channel: object) -> list[str]:
        """A connection closed: the addresses it registered are dropped (onChannelDestroy); which."""
        gone = [addr for addr, live in self.live.items() if live.channel is not None and live.channel is channel]
        for addr in gone:
            self._drop_address(addr)
        return gone

    def expire(self, now_ms: int) -> list[str]:
        """Drop the brokers whose last registration is older than BROKER_CHANNEL_EXPIRED_MS
        (scanNotActiveBroker); the addresses dropped."""
        gone = [a for a, live in self.live.items() if live.last_update_ms + BROKER_CHANNEL_EXPIRED_MS < now_ms]
        for addr in gone:
            self._drop_address(addr)
        return gone

    def route(self, topic: str) -> dict[str, Any] | None:
        """TopicRouteData of a topic (pickupTopicRouteData), or None (TOPIC_NOT_EXIST) when no
        broker with an address has it."""
        queues = self.topics.get(topic)
        if not queues:
            return None
        brokers = [{"brokerAddrs": dict(sorted(self.brokers[n]["brokerAddrs"].items())), "brokerName": n,
                    "cluster": self.brokers[n]["cluster"]} for n in sorted(queues) if n in self.brokers]
        if not brokers:
            return None
        filters = {a: self.filter_servers[a] for b in brokers for a in b["brokerAddrs"].values()
                   if a in self.filter_servers}
        return {"brokerDatas": brokers, "filterServerTable": filters,
                "queueDatas": [dict(queues[n]) for n in sorted(queues)]}


def _json(value: Any, standard: bool) -> str:
    """fastjson's output for route data: keys in alphabetical order, no spaces; a map keyed by
    broker id is written with bare numeric keys unless ``standard`` (spec §2.3.1)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=itemgetter(0))  # a map's keys are all ints or all strs
        parts = []
        for k, v in items:
            key = json.dumps(str(k), ensure_ascii=False) if standard or not isinstance(k, int) else str(k)
            parts.append(f"{key}:{_json(v, standard)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json(v, standard) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def route_json(route: dict[str, Any], *, standard: bool) -> bytes:
    """The GET_ROUTEINFO_BY_TOPIC body: standard JSON for a client of version >= 401 (V4_9_4) or
    one that asks for it (acceptStandardJsonOnly), else fastjson's plain output with unquoted
    numeric keys in brokerAddrs, which the C++ client (version 63) reads."""
    return _json(route, standard).encode("utf-8")
