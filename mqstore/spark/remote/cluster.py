"""A RocketMQ cluster as the network source and sink see it: the options that say how to reach
it (``ClusterConfig``), and ``Cluster``, a blocking face over ``mqstore.client.PullConsumer`` on
an event loop of its own (a Spark task's ``read()`` and the driver's planning are plain
functions): the queues of topics on every broker (routes from the NameServers, then
GET_MIN_OFFSET / GET_MAX_OFFSET of each queue), the exact time lookup (SEARCH_OFFSET_BY_TIMESTAMP,
then the neighbours pulled) and the pull of raw records (docs/rocketmq-remoting-spec.md §2.3.1,
§2.4.2, §2.4.7).

A queue is identified by its broker as well: two brokers each have ``topic/0``. Its key in
offsets JSON and in Spark's checkpoints is ``"<brokerName>/<topic>/<queueId>"``
(``queue_key``); RocketMQ's names cannot hold a "/", so the key reads back unambiguously.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from mqstore.remoting._remoting import RemotingCommand
from mqstore.client import MessageQueue, MQClientError, PullConsumer, RemotingConnectionError, RemotingTimeoutError
from mqstore.client.instance import parse_namesrv, response_int
from mqstore.client.protocol import PullSysFlag, RequestCode, ResponseCode
from mqstore.queue.snapshot import QueueRange
from mqstore.spark.options import OptionError, bool_option, int_option

__all__ = ["Cluster", "ClusterConfig", "Pulled", "RemoteQueue", "parse_key", "queue_key"]

log = logging.getLogger("mqstore.spark")

T = TypeVar("T")
#: the group the source pulls as and the sink sends as, unless consumerGroup / producerGroup say
DEFAULT_GROUP = "MQSTORE_SPARK"
#: messages a pull asks for: the broker's transfer limits decide (RocketMQ's defaults give at
#: most 32 from memory and 8 from disk, 256 / 64 KiB)
DEFAULT_PULL_BATCH = 1024
DEFAULT_TIMEOUT_MS = 10_000
#: offsets a time lookup steps back at a time
BACK_STEP = 32
#: a request that times out or loses its connection is sent again this many times
RETRIES = 3
_QUEUE_OFFSET = struct.Struct(">q")
_I32 = struct.Struct(">i")
#: MessageSysFlag.BORNHOST_V6_FLAG: the born host takes 20 bytes, and the store time is 12 later
_BORNHOST_V6 = 0x10


def queue_key(broker: str, topic: str, queue_id: int) -> str:
    """The key of a queue in offsets JSON and checkpoints: "broker/topic/queueId"."""
    return f"{broker}/{topic}/{queue_id}"


def parse_key(key: str) -> tuple[str | None, str, int]:
    """(broker, topic, queue id) of "broker/topic/queueId", (None, topic, queue id) of the local
    shape "topic/queueId"; OptionError for anything else."""
    parts = key.split("/")
    if len(parts) in (2, 3) and all(parts) and parts[-1].isdigit():
        return (parts[0] if len(parts) == 3 else None), parts[-2], int(parts[-1])
    raise OptionError(f"queue key {key!r}: expected \"brokerName/topic/queueId\" (or \"topic/queueId\" where one "
                      "broker has the topic)")


@dataclass(frozen=True)
class RemoteQueue(QueueRange):
    """A queue on one broker and its readable offsets [min_offset, max_offset) when it was
    asked: a store's QueueRange (what the planning of mqstore.spark.source reads) on a broker."""

    broker: str = ""

    @property
    def key(self) -> str:
        return queue_key(self.broker, self.topic, self.queue_id)

    @property
    def mq(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker, self.queue_id)


@dataclass(frozen=True)
class ClusterConfig:
    """How to reach the cluster, from the options (picklable: the TLS context is made where it
    is used). See docs/spark.md "Reading and writing a cluster over the network"."""

    namesrv: str
    credentials: tuple[str, str] | None = None
    tls: bool = False
    tls_ca_file: str = ""
    namesrv_tls: bool | None = None
    consumer_group: str = DEFAULT_GROUP
    producer_group: str = DEFAULT_GROUP
    pull_batch: int = DEFAULT_PULL_BATCH
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ClusterConfig:
        """options with lower-cased keys (mqstore.spark.options.check_options)."""
        namesrv = options.get("namesrv", "")
        if "path" in options:
            raise OptionError('give either a store directory (load(path) / save(path)) or option namesrv (a cluster '
                              'over the network), not both')
        try:
            parse_namesrv(namesrv)
        except ValueError as exc:
            raise OptionError(f"option namesrv={namesrv!r}: {exc}") from None
        access, secret = options.get("accesskey"), options.get("secretkey")
        if (access is None) != (secret is None):
            raise OptionError("options accessKey and secretKey go together (RocketMQ's plain ACL signs every request "
                              "with the pair)")
        tls = bool_option(options, "tls", False)
        ca_file = options.get("tlscafile", "")
        if ca_file and not tls:
            raise OptionError("option tlsCaFile is only used with tls=true")
        namesrv_tls = bool_option(options, "namesrvTls", tls) if "namesrvtls" in options else None
        return cls(namesrv, (access, secret) if access is not None and secret is not None else None, tls, ca_file,
                   namesrv_tls, _group(options, "consumerGroup"), _group(options, "producerGroup"),
                   int_option(options, "pullBatchSize", DEFAULT_PULL_BATCH),
                   int_option(options, "timeoutMs", DEFAULT_TIMEOUT_MS) / 1000)

    def tls_context(self) -> ssl.SSLContext | bool | None:
        """What the clients' tls argument takes: None (plain), True (the system's CAs) or a
        context that trusts tlsCaFile."""
        if not self.tls:
            return None
        if not self.tls_ca_file:
            return True
        from mqstore.tls import client_context

        return client_context(trust_cert_path=self.tls_ca_file)

    def client_arguments(self) -> dict[str, Any]:
        """The keyword arguments PullConsumer and SyncProducer share."""
        tls = self.tls_context()
        namesrv_tls = None if self.namesrv_tls is None else (tls if self.namesrv_tls else False)
        return {"timeout": self.timeout_s, "credentials": self.credentials, "tls": tls, "namesrv_tls": namesrv_tls}


def _group(options: Mapping[str, str], name: str) -> str:
    from mqstore.client.instance import check_group

    value = options.get(name.lower(), DEFAULT_GROUP)
    try:
        return check_group(value, "DEFAULT_CONSUMER" if name == "consumerGroup" else "DEFAULT_PRODUCER")
    except ValueError as exc:
        raise OptionError(f"option {name}={value!r}: {exc}") from None


@dataclass(frozen=True)
class Pulled:
    """A PULL_MESSAGE answer: its code and remark (the GetMessageStatus name), the raw records
    (spec §2.6, concatenated in queue order), the offsets it names, and the broker id that
    answered and the one it suggests for the next pull."""

    code: int
    remark: str
    body: bytes
    next_offset: int
    min_offset: int
    max_offset: int
    broker_id: int
    suggest: int


def record_times(body: bytes) -> list[tuple[int, int]]:
    """(queue offset, store timestamp ms) of each record of a pull body."""
    out = []
    at, n = 0, len(body)
    while at + 84 <= n:
        size = _I32.unpack_from(body, at)[0]
        sys_flag = _I32.unpack_from(body, at + 36)[0]
        store_ts_at = at + (68 if sys_flag & _BORNHOST_V6 else 56)
        out.append((_QUEUE_OFFSET.unpack_from(body, at + 20)[0], _QUEUE_OFFSET.unpack_from(body, store_ts_at)[0]))
        at += size
    return out


def cut_records(body: bytes, n: int) -> bytes:
    """The first n records of a pull body."""
    at = 0
    for _ in range(n):
        at += _I32.unpack_from(body, at)[0]
    return body[:at]


class Cluster:
    """The queues and records of a cluster, by blocking calls (the class docstring of the module).
    Use as a context manager or call close()."""

    def __init__(self, config: ClusterConfig, *, route_ttl: float = 30.0) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.consumer = PullConsumer(config.consumer_group, config.namesrv, route_ttl=route_ttl,
                                     **config.client_arguments())
        self._suggested: dict[MessageQueue, int] = {}
        try:
            self._run(self.consumer.start())
        except BaseException:
            self.loop.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self._run(self.consumer.close())
        finally:
            self.loop.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- queues ------------------------------------------------------------------------------
    def message_queues(self, topics: Iterable[str], *, missing_ok: bool = False) -> list[MessageQueue]:
        """The readable queues of topics on every broker their routes name. A topic no broker
        has is an OptionError, or (missing_ok, a stream waiting for it) no queue."""
        async def of(topic: str) -> list[MessageQueue]:
            try:
                return await self.consumer.queues(topic)
            except MQClientError as exc:
                if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                if missing_ok:
                    return []
                raise OptionError(f"topic {topic}: the NameServers {self.config.namesrv} know no broker that has it "
                                  f"({exc.remark})") from None

        return sorted(mq for mqs in self._run(_gather(*(of(t) for t in sorted(set(topics))))) for mq in mqs)

    def queues(self, topics: Iterable[str], *, missing_ok: bool = False) -> list[RemoteQueue]:
        """message_queues with each queue's [min, max) offsets now."""
        mqs = self.message_queues(topics, missing_ok=missing_ok)
        mins = self.offsets(mqs, "min")
        maxes = self.offsets(mqs, "max")
        return [RemoteQueue(mq.topic, mq.queue_id, lo, hi, mq.broker_name) for mq, lo, hi in zip(mqs, mins, maxes)]

    def offsets(self, mqs: list[MessageQueue], which: str, *, missing: int | None = None) -> list[int]:
        """GET_MIN_OFFSET ("min") or GET_MAX_OFFSET ("max") of each queue, asked at once; with
        missing, that for a queue whose topic no broker has yet (else MQClientError)."""
        ask = self.consumer.min_offset if which == "min" else self.consumer.max_offset

        async def one(mq: MessageQueue) -> int:
            try:
                return await self._retried(lambda: ask(mq))
            except MQClientError as exc:
                if missing is None or exc.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                return missing

        return list(self._run(_gather(*(one(mq) for mq in mqs))))

    # -- time ------------------------------------------------------------------------------------
    def first_offset_at(self, q: QueueRange, ms: int) -> int:
        """The first offset of q (a RemoteQueue) whose store time is >= ms (q.max_offset when
        none is): the broker's SEARCH_OFFSET_BY_TIMESTAMP (getOffsetInQueueByTime: the nearest
        message), then the neighbours pulled until the first one at or after ms is found."""
        assert isinstance(q, RemoteQueue)
        lo, hi = q.min_offset, q.max_offset
        if lo >= hi:
            return hi
        at = min(max(self._run(self._retried(lambda: self.consumer.search_offset(q.mq, max(ms, 0)))), lo), hi)
        # forward past messages stored before ms
        while at < hi:
            got = self.pull(q, at, self.config.pull_batch)
            times = record_times(got.body) if got.code == ResponseCode.SUCCESS else []
            later = [o for o, ts in times if ts >= ms]
            if later:
                at = later[0]
                break
            if got.next_offset <= at:  # the queue ends here (or moved): nothing at or after ms
                return at
            at = got.next_offset
        # back over messages before at stored at or after ms
        while at > lo:
            begin = max(lo, at - BACK_STEP)
            times = record_times(b"".join(self.bodies(q, begin, at)))
            earlier = [o for o, ts in times if ts < ms]
            if earlier:
                return earlier[-1] + 1
            if not times:
                return at
            at = times[0][0]
        return at

    # -- pulls -----------------------------------------------------------------------------------
    def pull(self, q: RemoteQueue, offset: int, max_nums: int) -> Pulled:
        """PULL_MESSAGE of up to max_nums messages of q from offset, every tag, no long polling,
        from the broker id the last answer for q suggested (the master at first; the lowest id
        present when the suggested one is not in the route), as RocketMQ's
        PullAPIWrapper.recalculatePullFromWhichNode does."""
        return self._run(self._retried(lambda: self._pull(q.mq, offset, max_nums)))

    def bodies(self, q: RemoteQueue, start: int, end: int) -> list[bytes]:
        """The pull bodies of q's offsets [start, end) (records cut at end; a broker answers
        fewer messages than asked past its transfer limits, 8 from disk for RocketMQ's)."""
        out, at = [], start
        while at < end:
            got = self.pull(q, at, min(self.config.pull_batch, end - at))
            if got.code != ResponseCode.SUCCESS or got.next_offset <= at:
                break
            times = record_times(got.body)
            keep = sum(o < end for o, _ in times)
            if keep < len(times):
                out.append(cut_records(got.body, keep))
                break
            out.append(got.body)
            at = got.next_offset
        return out

    async def _pull(self, mq: MessageQueue, offset: int, max_nums: int) -> Pulled:
        client = self.consumer.client
        await client.route(mq.topic)  # cached; refreshed every route_ttl with the brokers' addresses
        broker_id = self._suggested.get(mq, 0)
        addr = client.broker_address(mq.broker_name, broker_id)
        if addr is None:
            table = client.brokers.get(mq.broker_name) or {}
            if not table:
                raise MQClientError(ResponseCode.TOPIC_NOT_EXIST, f"no address of broker {mq.broker_name} is in the "
                                    f"route of {mq.topic}", request=RequestCode.PULL_MESSAGE)
            broker_id = min(table)
            addr = table[broker_id]
        fields = {"consumerGroup": self.config.consumer_group, "topic": mq.topic, "queueId": str(mq.queue_id),
                  "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(PullSysFlag.SUBSCRIPTION),
                  "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
                  "expressionType": "TAG"}
        response = await client.invoke(addr, RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=fields))
        code = RequestCode.PULL_MESSAGE
        if response.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                                 ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED):
            raise MQClientError(response.code, response.remark, address=addr, request=code)
        suggest = response_int(response, "suggestWhichBrokerId", addr, code)
        self._suggested[mq] = suggest
        return Pulled(response.code, response.remark or "", bytes(response.body or b""),
                      response_int(response, "nextBeginOffset", addr, code),
                      response_int(response, "minOffset", addr, code), response_int(response, "maxOffset", addr, code),
                      broker_id, suggest)

    async def _retried(self, make: Any) -> Any:
        """make()'s result; a timeout or a connection that fails or closes tries again (RETRIES
        times, waiting 0.2, 0.4, 0.8 s: a broker restarting, a loaded machine)."""
        for attempt in range(RETRIES + 1):
            try:
                return await make()
            except (RemotingTimeoutError, RemotingConnectionError) as exc:
                if attempt == RETRIES:
                    raise
                log.warning("%s; trying again (%d of %d)", exc, attempt + 1, RETRIES)
                await asyncio.sleep(0.2 * 2 ** attempt)
        raise AssertionError("unreachable")


async def _gather(*coros: Coroutine[Any, Any, T]) -> list[T]:
    """Every result; the first failure raised once all have ended (none left running when the
    caller closes the client)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
