"""Brokers for tests: in this process (``Broker``, whose store this process owns) or as a
``mqstore broker`` process; loopback only, free ports, every process stopped by its pid."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from mqstore.broker.server import Broker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPBACK = "127.0.0.1"
_SERVING = re.compile(r"serving on (?P<addr>\S+) \((?P<fronts>\d+) front processes\), NameServer (?P<ns>\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def broker_settings(**settings: Any) -> dict[str, Any]:
    """Loopback, free ports, 2 fronts unless told otherwise (a setting given as None is left out).

    The HA port is a free one too: a test that picks listen_port free would otherwise get
    listen_port + 1 (BrokerStartup's default), which another test's socket may hold (two CI
    failures, both 'the HA port ... is taken'); slaves learn it from the NameServer."""
    base: dict[str, Any] = {"listen_port": 0, "namesrv_listen_port": 0, "ha_listen_port": 0,
                            "bind_address": LOOPBACK, "broker_ip1": LOOPBACK, "front_processes": 2}
    base.update(settings)
    return {k: v for k, v in base.items() if v is not None}


@contextlib.contextmanager
def running_broker(root: str, **settings: Any) -> Iterator[Broker]:
    """A Broker owned by this process for the block."""
    broker = Broker(root, **broker_settings(**settings))
    try:
        yield broker
    finally:
        broker.shutdown()


class BrokerProcess:
    """``mqstore broker ROOT --set ...`` as a child process; ``address`` and ``namesrv_address``
    once it serves. stop() sends SIGTERM and waits (SIGKILL after the timeout); kill() is SIGKILL."""

    def __init__(self, root: str, **settings: Any) -> None:
        self.root = root
        argv = [sys.executable, "-m", "mqstore", "broker", root]
        for key, value in broker_settings(**settings).items():
            argv += ["--set", f"{key}={value}"]
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)
        self.address = self.namesrv_address = ""
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(60)
        match = _SERVING.search(line[0]) if line else None
        if match is None:
            self.kill()
            raise RuntimeError(f"mqstore broker did not start: {line!r}; log:\n{self.log_text()}")
        self.first_line = line[0]
        self.address, self.namesrv_address = match["addr"], match["ns"]
        self.fronts = int(match["fronts"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int:
        """SIGKILL the broker; its service and front processes (which exit when their parent is
        gone) are waited for, and killed if they linger."""
        children = _children(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        _wait_gone(children)
        return code

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def _wait_gone(pids: list[int], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    """The direct children of pid (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def send_raw(address: str, topic: str, bodies: list[bytes], *, tags: str = "", queue_id: int = -1,
             timeout_s: float = 10) -> list[tuple[int, str | None, dict[str, str]]]:
    """SEND_MESSAGE requests over one blocking connection, one at a time (a minimal producer
    for tests that need no client library): (code, remark, ext_fields) of each answer."""
    from mqstore.remoting._remoting import FrameReader, RemotingCommand

    host, _, port = address.rpartition(":")
    out = []
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        frames = FrameReader()
        for i, body in enumerate(bodies):
            props = f"TAGS\x01{tags}\x02" if tags else ""
            sock.sendall(RemotingCommand(10, opaque=i + 1, ext_fields={
                "producerGroup": "PID_TEST", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                "queueId": str(queue_id if queue_id >= 0 else i % 4), "sysFlag": "0", "bornTimestamp": "0",
                "flag": "0", "properties": props}, body=body).encode())
            while (answer := frames.next()) is None:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError(f"{address} closed the connection")
                frames.feed(data)
            out.append((answer.code, answer.remark, answer.ext_fields))
    return out


def closed_by_peer(sock: socket.socket) -> bool:
    """The server closed the connection (EOF or reset), without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        sock.setblocking(True)


def trickled_until_closed(sock: socket.socket, data: bytes, every_s: float = 0.25, bound_s: float = 20.0) -> bool:
    """Send data a byte every every_s seconds; True once the server has closed the connection
    (within bound_s), False if every byte went out and it is still open."""
    deadline = time.monotonic() + bound_s
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except ConnectionError:
            return True
        if closed_by_peer(sock):
            return True
        assert time.monotonic() < deadline, f"the connection is still open after {bound_s} s of trickling"
        time.sleep(every_s)
    return False
