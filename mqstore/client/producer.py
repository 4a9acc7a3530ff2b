"""The producer (RocketMQ's DefaultMQProducer, asyncio; docs/rocketmq-remoting-spec.md §2.4.1,
§2.5.1): sends one message (SEND_MESSAGE_V2, or SEND_MESSAGE), a batch (SEND_BATCH_MESSAGE) or a
oneway message to a queue picked round robin over every broker's write queues, and heartbeats
its group to the brokers.

    producer = Producer("PG", namesrv="127.0.0.1:9876")
    await producer.start()
    result = await producer.send("TopicTest", b"hello", tags="TagA", keys="k1")
    await producer.close()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType

from mqstore.remoting._remoting import RemotingCommand
from mqstore.acl.signature import SessionCredentials, as_credentials
from mqstore.client._sending import (BATCH_PROPERTIES, V2_NAMES, BatchItem, QueuePicker, batch_body, batch_entries,
                                     check_topic, heartbeat_body, prepare_message, producer_options, send_header,
                                     send_properties, send_result)
from mqstore.client.instance import ClientInstance
from mqstore.client.message import Message, SendResult
from mqstore.client.protocol import VERSION, RequestCode
from mqstore.client.remoting import TlsOption
from mqstore.client.route import MessageQueue

__all__ = ["BatchItem", "Producer", "V2_NAMES"]


class Producer:
    """A producer of group ``group`` over the NameServers ``namesrv`` ("host:port;host:port").

    serialize: the header serialization of its requests, "JSON" or "ROCKETMQ".
    send_code: "SEND_MESSAGE_V2" (the Java client's, one-letter header names) or "SEND_MESSAGE".
    timeout: seconds a request waits for its response (3, as RocketMQ's sendMsgTimeout).
    compress_over: bodies of at least this many bytes are sent zlib-compressed (sys flag bit 0),
    as RocketMQ's compressMsgBodyOverHowmuch; None (the default) sends every body as it is.
    heartbeat_interval, route_ttl: seconds between heartbeats, and how long a route is cached.
    credentials: a SessionCredentials or an (access_key, secret_key) pair: every request (to the
    brokers and the NameServers) is signed with it, for a broker with ACL on (docs/client.md).
    tls: True (the system's CAs) or an ssl.SSLContext (mqstore.tls.client_context): every
    connection over TLS, the server's certificate checked against the host of its address.
    namesrv_tls: the NameServers' connections, when they differ (None: as tls; False: plain).
    """

    def __init__(self, group: str, namesrv: str, *, serialize: str = "JSON", send_code: str = "SEND_MESSAGE_V2",
                 timeout: float = 3.0, compress_over: int | None = None, heartbeat_interval: float = 30.0,
                 route_ttl: float = 30.0,
                 credentials: SessionCredentials | tuple[str, str] | None = None, tls: TlsOption = None,
                 namesrv_tls: TlsOption = None) -> None:
        self.group, self.send_code, self.compress_over = producer_options(group, send_code, compress_over)
        self.client = ClientInstance(namesrv, serialize=serialize, timeout=timeout,
                                     heartbeat_interval=heartbeat_interval, route_ttl=route_ttl, version=VERSION,
                                     heartbeat_body=self._heartbeat_body,
                                     unregister_fields={"producerGroup": self.group},
                                     credentials=as_credentials(credentials), tls=tls, namesrv_tls=namesrv_tls)
        self._picker = QueuePicker()

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> Producer:
        """Start the heartbeat timer; nothing is sent until a topic is used (its route names the brokers)."""
        self.client.start()
        return self

    async def close(self) -> None:
        """UNREGISTER_CLIENT to every broker this producer heartbeated, then the connections close."""
        await self.client.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def heartbeat(self) -> None:
        """HEART_BEAT to every known broker now (it also runs every heartbeat_interval)."""
        self.client.check_open("the producer")
        await self.client.heartbeat()

    def _heartbeat_body(self, client_id: str) -> bytes:
        return heartbeat_body(self.group, client_id)

    @property
    def client_id(self) -> str:
        return self.client.client_id

    # -- queues --------------------------------------------------------------------------------
    async def queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to topic may go to (every broker's write queues)."""
        self.client.check_open("the producer")
        check_topic(topic)
        return (await self.client.route(topic, publish=True)).publish_queues(topic)

    async def _pick(self, topic: str, queue_id: int | None, broker_name: str | None) -> tuple[MessageQueue, str]:
        """The queue (round robin unless queue_id says) and its broker's master address."""
        return self._picker.pick(topic, await self.client.route(topic, publish=True), queue_id, broker_name)

    # -- sends ---------------------------------------------------------------------------------
    async def _prepare(self, topic: str, msg: Message, queue_id: int | None,
                       broker_name: str | None) -> tuple[RemotingCommand, MessageQueue, str, str]:
        self.client.check_open("the producer")
        check_topic(topic)
        body, props, sys_flag = prepare_message(msg, self.compress_over)  # refused before anything is sent
        mq, addr = await self._pick(topic, queue_id, broker_name)
        uniq = self.client.new_msg_id()
        fields = send_header(self.group, topic, mq.queue_id, send_properties(props, uniq), sys_flag=sys_flag,
                             flag=msg.flag, v2=self.send_code == RequestCode.SEND_MESSAGE_V2)
        return RemotingCommand(self.send_code, ext_fields=fields, body=body), mq, addr, uniq

    async def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | list[str] | None = None,
                   properties: Mapping[str, str] | None = None, queue_id: int | None = None,
                   broker_name: str | None = None, flag: int = 0, delay_level: int = 0,
                   timeout: float | None = None) -> SendResult:
        """Send one message and wait for the broker's answer. The queue is picked round robin over
        every broker's write queues unless queue_id (and broker_name) name one. MQClientError for
        an error response (its code and remark), RemotingTimeoutError, ConnectionClosedError."""
        return await self.send_message(topic, Message(body, tags, keys, properties, flag, delay_level),
                                       queue_id=queue_id, broker_name=broker_name, timeout=timeout)

    async def send_message(self, topic: str, message: Message, *, queue_id: int | None = None,
                           broker_name: str | None = None, timeout: float | None = None) -> SendResult:
        """send() for a Message."""
        cmd, mq, addr, uniq = await self._prepare(topic, message, queue_id, broker_name)
        response = await self.client.invoke(addr, cmd, timeout)
        return send_result(response, topic, mq, uniq, addr, cmd.code)

    async def send_oneway(self, topic: str, body: bytes, *, tags: str | None = None,
                          keys: str | list[str] | None = None, properties: Mapping[str, str] | None = None,
                          queue_id: int | None = None, broker_name: str | None = None, flag: int = 0,
                          delay_level: int = 0) -> str:
        """Send one message with the oneway flag: no response is awaited (and the broker sends
        none), so nothing says whether it was stored. Returns the message's id (UNIQ_KEY)."""
        cmd, _mq, addr, uniq = await self._prepare(topic, Message(body, tags, keys, properties, flag, delay_level),
                                                   queue_id, broker_name)
        conn = await self.client.connection(addr)
        await conn.oneway(cmd)
        return uniq

    async def send_batch(self, topic: str, messages: Iterable[BatchItem], *, queue_id: int | None = None,
                         broker_name: str | None = None, timeout: float | None = None) -> SendResult:
        """Send messages as one batch (SEND_BATCH_MESSAGE; the body is MessageDecoder.encodeMessages,
        spec §2.4.1): all go to one queue, with consecutive queue offsets. Items are bodies,
        (body, user properties) pairs or Messages (for tags, keys, flag). SendResult.msg_id is
        the messages' ids comma-joined, offset_msg_id the broker's offset ids."""
        self.client.check_open("the producer")
        check_topic(topic)
        entries = batch_entries(messages)
        mq, addr = await self._pick(topic, queue_id, broker_name)
        ids = self.client.new_msg_ids(len(entries))
        cmd = RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, body=batch_body(entries, ids),
                              ext_fields=send_header(self.group, topic, mq.queue_id, BATCH_PROPERTIES, batch=True))
        response = await self.client.invoke(addr, cmd, timeout)
        return send_result(response, topic, mq, ",".join(ids), addr, cmd.code)
