"""A recording loopback server for the ACL tests: a NameServer and a broker in one socket that
records every request frame (code, extFields, body) and answers just enough for a producer or a
pull consumer to go on (a route naming itself as the broker's master, SUCCESS to heartbeats and
sends, PULL_NOT_FOUND to pulls, offset 0)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from mqstore.remoting._remoting import FrameError, FrameReader, RemotingCommand

LOOPBACK = "127.0.0.1"
BROKER_NAME = "broker-acl"


@dataclass
class Recorded:
    code: int
    language: str
    ext_fields: dict[str, str]
    body: bytes


class RecordingServer:
    """Serve on a free loopback port until close(); ``requests`` lists what arrived, in order."""

    def __init__(self, queues: int = 1) -> None:
        self.queues = queues
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server((LOOPBACK, 0))
        self.port = self._sock.getsockname()[1]
        self.address = f"{LOOPBACK}:{self.port}"
        self._closed = False
        self._conns: list[socket.socket] = []
        self._offset = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> RecordingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def of(self, code: int) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.code == code]

    def wait_for(self, code: int, timeout_s: float = 30.0) -> Recorded:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.of(code)
            if got:
                return got[0]
            time.sleep(0.02)
        raise AssertionError(f"no request {code} within {timeout_s} s; got {[r.code for r in self.requests]}")

    # -- serving ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        frames = FrameReader()
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            frames.feed(data)
            try:
                while (cmd := frames.next()) is not None:
                    if cmd.is_response:
                        continue
                    with self._lock:
                        self.requests.append(Recorded(cmd.code, cmd.language, dict(cmd.ext_fields), bytes(cmd.body)))
                    answer = self._answer(cmd)
                    if answer is not None and not cmd.is_oneway:
                        answer.opaque = cmd.opaque
                        answer.flag = 1
                        answer.serialize_type = cmd.serialize_type
                        conn.sendall(answer.encode())
            except (FrameError, OSError):
                return

    def route_body(self) -> bytes:
        """Route data as a 4.9.7 NameServer writes it for an old client (bare numeric brokerAddrs
        keys), which both the C++ client and mqstore.client read."""
        return (f'{{"brokerDatas":[{{"brokerAddrs":{{0:"{self.address}"}},"brokerName":"{BROKER_NAME}",'
                f'"cluster":"DefaultCluster"}}],"filterServerTable":{{}},"queueDatas":[{{"brokerName":'
                f'"{BROKER_NAME}","perm":6,"readQueueNums":{self.queues},"topicSysFlag":0,'
                f'"writeQueueNums":{self.queues}}}]}}').encode()

    def _answer(self, cmd: RemotingCommand) -> RemotingCommand | None:
        code = cmd.code
        if code == 105:  # GET_ROUTEINFO_BY_TOPIC
            return RemotingCommand(0, body=self.route_body())
        if code in (10, 310, 320):  # sends
            with self._lock:
                self._offset += 1
                offset = self._offset
            return RemotingCommand(0, ext_fields={"msgId": "7F00000100002A9F0000000000000000", "queueId": "0",
                                                  "queueOffset": str(offset)})
        if code == 11:  # PULL_MESSAGE
            return RemotingCommand(19, remark="no new message", ext_fields={
                "nextBeginOffset": cmd.ext_fields.get("queueOffset", "0"), "minOffset": "0", "maxOffset": "0",
                "suggestWhichBrokerId": "0"})
        if code == 38:  # GET_CONSUMER_LIST_BY_GROUP
            return RemotingCommand(0, body=b'{"consumerIdList":[]}')
        if code in (14, 30, 31, 29):  # QUERY_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP
            return RemotingCommand(0, ext_fields={"offset": "0"})
        return RemotingCommand(0)
