"""The NameServer (docs/rocketmq-remoting-spec.md §2.3): brokers register with it, clients ask it for
a topic's route. An asyncio TCP server over the route table of ``mqstore.broker.routes`` and the
frame codec of ``mqstore._remoting``: REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC;
any other code is answered REQUEST_CODE_NOT_SUPPORTED, a request missing a field SYSTEM_ERROR naming
it, and a frame that cannot be decoded closes its connection only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mqstore._remoting import FrameError, FrameReader, RemotingCommand
from mqstore.broker.codes import FAQ, RequestCode, ResponseCode
from mqstore.broker.requests import field, int_field, response, wall_ms
from mqstore.broker.routes import BROKER_CHANNEL_EXPIRED_MS, RouteTable, parse_register_body, route_json
from mqstore.protocol import VERSION  # the MQVersion ordinal a 4.9.7 NameServer sends (V4_9_7)

__all__ = ["NameServer", "SCAN_INTERVAL_MS", "VERSION"]

log = logging.getLogger("mqstore.namesrv")

#: how often brokers whose registration expired are dropped (NamesrvController: every 10 s)
SCAN_INTERVAL_MS = 10_000
#: the first client version that gets standard JSON route data (V4_9_4)
STANDARD_JSON_VERSION = 401


class NameServer:
    """A NameServer on host:port (port 0: any free one; ``port`` says which after start)."""

    def __init__(self, host: str = "0.0.0.0", port: int = 9876, *, clock_ms: Callable[[], int] = wall_ms,
                 scan_interval_ms: int = SCAN_INTERVAL_MS) -> None:
        self.host = host
        self.port = port
        self.routes = RouteTable()
        self.clock_ms = clock_ms
        self.scan_interval_ms = scan_interval_ms
        self._server: asyncio.Server | None = None
        self._scan: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._scan = asyncio.create_task(self._scan_loop())
        log.info("NameServer listening on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._scan is not None:
            self._scan.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval_ms / 1000)
            for addr in self.routes.expire(self.clock_ms()):
                log.warning("broker %s dropped: no registration for %d s", addr, BROKER_CHANNEL_EXPIRED_MS // 1000)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                frames.feed(data)
                while (cmd := frames.next()) is not None:
                    answer = self.handle(cmd)
                    if answer is not None and not cmd.is_oneway:
                        writer.write(answer.encode())
                await writer.drain()
        except FrameError as exc:
            log.warning("closing the connection from %s: %s", peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def handle(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """The response to one request (None for a response frame, which a NameServer never asked for)."""
        if cmd.is_response:
            return None
        try:
            if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                return self._route(cmd)
            if cmd.code == RequestCode.REGISTER_BROKER:
                return self._register(cmd)
            if cmd.code == RequestCode.UNREGISTER_BROKER:
                self.routes.unregister_broker(field(cmd.ext_fields, "clusterName"), field(cmd.ext_fields, "brokerAddr"),
                                              field(cmd.ext_fields, "brokerName"), int_field(cmd.ext_fields, "brokerId"))
                return response(cmd, ResponseCode.SUCCESS)
        except ValueError as exc:  # BadField too
            return response(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        return response(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")

    def _route(self, cmd: RemotingCommand) -> RemotingCommand:
        topic = field(cmd.ext_fields, "topic")
        route = self.routes.route(topic)
        if route is None:
            return response(cmd, ResponseCode.TOPIC_NOT_EXIST,
                            f"No topic route info in name server for the topic: {topic}{FAQ}")
        standard = cmd.version >= STANDARD_JSON_VERSION or cmd.ext_fields.get("acceptStandardJsonOnly") == "true"
        return response(cmd, ResponseCode.SUCCESS, body=route_json(route, standard=standard))

    def _register(self, cmd: RemotingCommand) -> RemotingCommand:
        body = parse_register_body(cmd.body, compressed=cmd.ext_fields.get("compressed", "false"),
                                   body_crc32=cmd.ext_fields.get("bodyCrc32", "0"))
        ha, master = self.routes.register_broker(
            field(cmd.ext_fields, "clusterName"), field(cmd.ext_fields, "brokerAddr"), field(cmd.ext_fields, "brokerName"),
            int_field(cmd.ext_fields, "brokerId"), cmd.ext_fields.get("haServerAddr", ""), body, self.clock_ms())
        fields = {k: v for k, v in (("haServerAddr", ha), ("masterAddr", master)) if v is not None}
        return response(cmd, ResponseCode.SUCCESS, ext_fields=fields, body=b'{"table":{}}')
