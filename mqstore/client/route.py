"""Topic routes as the NameServer sends them (docs/rocketmq-remoting-spec.md §2.3.1): TopicRouteData
in either of its JSON forms, and the queues a producer sends to and a consumer pulls from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mqstore.client.errors import RouteError
from mqstore.client.protocol import MASTER_ID, PERM_READ, PERM_WRITE

__all__ = ["BrokerData", "MessageQueue", "QueueData", "TopicRoute", "parse_route_data"]


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (RocketMQ's MessageQueue)."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(frozen=True)
class QueueData:
    """A topic's queues on one broker."""

    broker_name: str
    perm: int
    read_queue_nums: int
    write_queue_nums: int
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass(frozen=True)
class BrokerData:
    """A broker name's addresses by broker id (0 = the master)."""

    broker_name: str
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)

    @property
    def master(self) -> str | None:
        return self.addrs.get(MASTER_ID)

    def lowest(self) -> str | None:
        """The address of the lowest id present (findBrokerAddressInAdmin)."""
        return self.addrs[min(self.addrs)] if self.addrs else None


@dataclass(frozen=True)
class TopicRoute:
    """TopicRouteData: the brokers that have the topic and its queues on each."""

    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None

    def broker(self, broker_name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a producer sends to: each writable queue data whose broker has a master,
        queues 0..writeQueueNums-1, by broker name; a non-empty ``order_topic_conf``
        ("brokerName:queueNums;...") replaces the queue datas (topicRouteData2TopicPublishInfo)."""
        out: list[MessageQueue] = []
        if self.order_topic_conf:
            for part in self.order_topic_conf.split(";"):
                name, sep, nums = part.partition(":")
                if not sep or not nums.strip().isdigit():
                    raise RouteError(f"orderTopicConf {self.order_topic_conf!r} is not 'brokerName:queueNums;...'")
                b = self.broker(name.strip())
                if b is not None and b.master is not None:
                    out += [MessageQueue(topic, b.broker_name, i) for i in range(int(nums))]
            return out
        for q in sorted(self.queue_datas, key=lambda q: q.broker_name):
            b = self.broker(q.broker_name)
            if q.writable and b is not None and b.master is not None:
                out += [MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums)]
        return out

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a consumer pulls: each readable queue data's 0..readQueueNums-1 (a broker
        without a master included), by broker name."""
        return [MessageQueue(topic, q.broker_name, i)
                for q in sorted(self.queue_datas, key=lambda q: q.broker_name) if q.readable
                for i in range(q.read_queue_nums)]

    def with_queue_nums(self, nums: int) -> TopicRoute:
        """This route with every queue data's read and write counts capped at nums: what a
        producer uses for a topic that does not exist yet, from TBW102's route."""
        return TopicRoute(tuple(QueueData(q.broker_name, q.perm, min(nums, q.read_queue_nums),
                                          min(nums, q.read_queue_nums), q.topic_sys_flag) for q in self.queue_datas),
                          self.broker_datas, None)


def _quote_numeric_keys(text: str) -> str:
    """fastjson's plain output writes map keys that are numbers bare ({0:"addr"}); quote them so
    the text is standard JSON. Strings are copied untouched."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            continue
        out.append(ch)
        i += 1
        if ch in "{,":
            j = i
            while j < n and text[j] in " \t\r\n":
                j += 1
            k = j + 1 if j < n and text[j] == "-" else j
            while k < n and text[k].isdigit():
                k += 1
            m = k
            while m < n and text[m] in " \t\r\n":
                m += 1
            if k > j and text[k - 1].isdigit() and m < n and text[m] == ":":
                out.append(text[i:j] + '"' + text[j:k] + '"')
                i = k
    return "".join(out)


def _int(obj: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if type(value) is not int:
        raise RouteError(f"route data: {where}.{key} must be an integer, not {value!r}")
    return value


def _str(obj: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if type(value) is not str:
        raise RouteError(f"route data: {where}.{key} must be a string, not {value!r}")
    return value


def parse_route_data(body: bytes) -> TopicRoute:
    """A GET_ROUTEINFO_BY_TOPIC response body: standard JSON (what a client of version >= V4_9_4
    gets), or fastjson's plain output with bare numeric brokerAddrs keys (what older clients get).
    RouteError naming what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RouteError(f"route data is not UTF-8: {exc}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        try:
            obj = json.loads(_quote_numeric_keys(text))
        except json.JSONDecodeError as exc:
            raise RouteError(f"route data is not JSON: {exc}: {text[:200]!r}") from None
    if type(obj) is not dict:
        raise RouteError(f"route data is not a JSON object: {text[:200]!r}")
    queues = obj.get("queueDatas") or []
    brokers = obj.get("brokerDatas") or []
    if type(queues) is not list or type(brokers) is not list:
        raise RouteError("route data: queueDatas and brokerDatas must be lists")
    qds = []
    for i, q in enumerate(queues):
        where = f"queueDatas[{i}]"
        if type(q) is not dict:
            raise RouteError(f"route data: {where} is not an object")
        qds.append(QueueData(_str(q, "brokerName", where), _int(q, "perm", where), _int(q, "readQueueNums", where),
                             _int(q, "writeQueueNums", where), _int(q, "topicSysFlag", where, 0)))
    bds = []
    for i, b in enumerate(brokers):
        where = f"brokerDatas[{i}]"
        if type(b) is not dict:
            raise RouteError(f"route data: {where} is not an object")
        raw = b.get("brokerAddrs") or {}
        if type(raw) is not dict:
            raise RouteError(f"route data: {where}.brokerAddrs is not an object")
        addrs: dict[int, str] = {}
        for key, addr in raw.items():
            try:
                bid = int(key)
            except ValueError:
                raise RouteError(f"route data: {where}.brokerAddrs has a key that is not a broker id: {key!r}") from None
            if type(addr) is not str:
                raise RouteError(f"route data: {where}.brokerAddrs[{key}] is not an address: {addr!r}")
            addrs[bid] = addr
        bds.append(BrokerData(_str(b, "brokerName", where), _str(b, "cluster", where, ""), addrs))
    conf = obj.get("orderTopicConf")
    if conf is not None and type(conf) is not str:
        raise RouteError(f"route data: orderTopicConf must be a string, not {conf!r}")
    return TopicRoute(tuple(qds), tuple(bds), conf or None)
