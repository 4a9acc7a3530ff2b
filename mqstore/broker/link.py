"""The link between a broker's front processes and its controller (the owner process).

Front processes hold the client connections and serve sends, pulls and the store's reads
themselves; what is one broker-wide state (consumer offsets, the client registry, subscription
groups, topic creation) lives in the controller, which every front reaches over one Unix socket
(abstract namespace) carrying remoting frames (``mqstore.remoting._remoting``):

- a client's request the front does not serve is forwarded as it came, with two ext fields added,
  ``_conn`` (the client connection's id, ``<front pid>:<n>``) and ``_peer`` (its ip:port), under
  an opaque of the link's own; the controller's response goes back to the client with the
  client's opaque; ``_peer`` marks a client's request (the controller's ACL check of offset
  updates, BrokerController._offset_membership_refusal, is for clients': a front's commit of a
  pull's commitOffset comes as UPDATE_CONSUMER_OFFSET with ``_conn`` alone);
- the internal requests below (codes 9000 and up, never seen by clients) ask for what a front
  caches (the topic table, a consumer group's config) or tell what it saw (a closed connection);
- the controller pushes topic changes and NOTIFY_CONSUMER_IDS_CHANGED deliveries to the fronts.

A front that loses the link exits (its supervisor starts a new one); the controller drops every
client connection of a front whose link closed, as RocketMQ drops a closed channel's clients.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable

from mqstore.remoting._remoting import FrameError, FrameReader, RemotingCommand

__all__ = ["CONN", "HELLO", "INTERNAL", "LinkClient", "PEER", "link_address"]

log = logging.getLogger("mqstore.broker")

#: front -> controller: the front's pid; answered with the topic table (topics.json's wrapper)
HELLO = 9000
#: front -> controller: a send's topic (topic, defaultTopic, defaultTopicQueueNums, sysFlag), created
#: from the default topic when it does not exist; SUCCESS with the topic config, or TOPIC_NOT_EXIST
TOPIC_FOR_SEND = 9001
#: front -> controller: a consumer group's config (group), created when auto-creation is on; or 26
GROUP = 9002
#: front -> controller, oneway: a client connection closed (conn)
CLOSED = 9003
#: front -> controller: the subscription a group registered for a topic (group, topic); or 24
SUBSCRIPTION = 9004
#: controller -> front, oneway: a topic's config changed (topic; body: its config, empty when deleted)
TOPIC_CHANGED = 9010
#: controller -> front, oneway: send NOTIFY_CONSUMER_IDS_CHANGED (group) to these connections (body:
#: the conn ids, comma-separated)
NOTIFY = 9011

#: the link's own request codes: a front answers a client's request with one of them
#: REQUEST_CODE_NOT_SUPPORTED instead of forwarding it (a client must not speak for a front)
INTERNAL = frozenset({HELLO, TOPIC_FOR_SEND, GROUP, CLOSED, SUBSCRIPTION, TOPIC_CHANGED, NOTIFY})

CONN = "_conn"
PEER = "_peer"


def link_address(root_pid: int, port: int) -> str:
    """The controller's socket name: abstract (no file, no path length limit), one per broker."""
    return f"\0mqstore-broker-{root_pid}-{port}"


class LinkClient:
    """A front's end of the link: requests with their own opaques, answered by futures; pushes
    from the controller go to ``on_push``; ``on_lost`` runs once when the link closes."""

    def __init__(self, address: str, on_push: Callable[[RemotingCommand], None], on_lost: Callable[[], None]) -> None:
        self.address = address
        self.on_push = on_push
        self.on_lost = on_lost
        self._opaques = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, self.address)
        reader, self._writer = await asyncio.open_unix_connection(sock=sock)
        self._reader_task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        frames = FrameReader()
        try:
            while data := await reader.read(262144):
                frames.feed(data)
                while (cmd := frames.next()) is not None:
                    if cmd.is_response:
                        fut = self._waiting.pop(cmd.opaque, None)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    else:
                        self.on_push(cmd)
        except (FrameError, ConnectionError) as exc:
            log.error("the link to the controller broke: %s", exc)
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the link to the broker's controller closed"))
            self._waiting.clear()
            self.on_lost()

    def send(self, cmd: RemotingCommand, *, oneway: bool = False) -> asyncio.Future[RemotingCommand] | None:
        """Send a request; its response's future (None for oneway)."""
        if self._writer is None or self._writer.is_closing():
            raise ConnectionError("the link to the broker's controller is closed")
        cmd.opaque = next(self._opaques)
        fut: asyncio.Future[RemotingCommand] | None = None
        if oneway:
            cmd.flag |= 2
        else:
            fut = asyncio.get_running_loop().create_future()
            self._waiting[cmd.opaque] = fut
        self._writer.write(cmd.encode())
        return fut

    async def request(self, cmd: RemotingCommand, timeout_s: float = 10.0) -> RemotingCommand:
        fut = self.send(cmd)
        assert fut is not None
        return await asyncio.wait_for(fut, timeout_s)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
