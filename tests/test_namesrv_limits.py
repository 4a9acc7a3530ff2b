"""The NameServer's limits on every connection, as the broker's fronts have them (docs/security.md):
a connection idle for server_channel_max_idle_time_seconds is closed, so is one whose frame
trickles in, and connections are capped per source address and in total; on ``mqstore namesrv``
(its options) and on the NameServer a broker embeds (the broker's settings)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
from helpers_broker import LOOPBACK, ROOT, closed_by_peer, free_port, running_broker, trickled_until_closed
from helpers_proc import wait_until

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess


class NameServerProcess:
    """``mqstore namesrv`` on a free loopback port with the given options, stopped by its pid."""

    def __init__(self, *options: str) -> None:
        self.port = free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "mqstore", "namesrv", "--host", LOOPBACK, "--listen-port",
                                      str(self.port), *options], env=env, stdout=subprocess.DEVNULL, stderr=self.log)

        def listening() -> bool:
            assert self.proc.poll() is None, self.log_text()
            try:
                socket.create_connection((LOOPBACK, self.port), timeout=1).close()
            except OSError:
                return False
            return True
        try:
            wait_until(listening, 30, "mqstore namesrv listening", every_s=0.05)
        except BaseException:
            self.stop()
            raise

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def idle_2s() -> Iterator[NameServerProcess]:
    ns = NameServerProcess("--server-channel-max-idle-time-seconds", "2")
    try:
        yield ns
    finally:
        ns.stop()


@pytest.fixture(scope="module")
def capped() -> Iterator[NameServerProcess]:
    ns = NameServerProcess("--max-connections", "5", "--max-connections-per-ip", "3")
    try:
        yield ns
    finally:
        ns.stop()


def _open(address: str, source: str = LOOPBACK) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def _route_request(opaque: int) -> bytes:
    return RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=opaque, ext_fields={"topic": "TBW102"}).encode()


def _answer(sock: socket.socket, timeout_s: float = 15) -> RemotingCommand | None:
    """The next answer on sock, or None when the NameServer closed it."""
    frames = FrameReader()
    deadline = time.monotonic() + timeout_s
    while (got := frames.next()) is None:
        assert time.monotonic() < deadline, f"no answer within {timeout_s} s"
        try:
            data = sock.recv(65536)
        except ConnectionError:
            return None
        if not data:
            return None
        frames.feed(data)
    return got


def _served(address: str, source: str = LOOPBACK) -> socket.socket | None:
    """A connection from source that the NameServer answers, or None when it refused it."""
    sock = _open(address, source)
    sock.sendall(_route_request(1))
    if _answer(sock) is None:
        sock.close()
        return None
    return sock


def _refused(address: str, source: str = LOOPBACK) -> bool:
    with _open(address, source) as sock:
        return bool(wait_until(lambda: closed_by_peer(sock), 10, f"a connection from {source} refused"))


# -- idle and slow ----------------------------------------------------------------------------------

def test_an_idle_connection_is_closed_and_an_active_one_kept(idle_2s):
    quiet = _open(idle_2s.address)
    active = _open(idle_2s.address)
    try:
        started = time.monotonic()
        opaque = 0
        while not closed_by_peer(quiet):  # a request every 0.5 s: never idle for 2 s
            assert time.monotonic() - started < 20, "the idle connection was not closed within 20 s"
            opaque += 1
            active.sendall(_route_request(opaque))
            answer = _answer(active)
            assert answer is not None and answer.opaque == opaque, "the active connection was closed"
            time.sleep(0.5)
        assert time.monotonic() - started >= 1.5  # not before its idle time (checked every 0.5 s)
        active.sendall(_route_request(opaque + 1))
        assert _answer(active) is not None
    finally:
        quiet.close()
        active.close()


def test_a_frame_trickled_a_byte_at_a_time_is_closed(idle_2s):
    """A byte every 0.25 s is never idle for 2 s, but its frame is not whole after 2 s either."""
    frame = _route_request(1)
    with _open(idle_2s.address) as sock:
        closed = trickled_until_closed(sock, frame[:-1])
        assert closed, f"the whole frame but its last byte ({len(frame) - 1} bytes) was trickled in"


# -- connection caps ---------------------------------------------------------------------------------

def _serve_all(address: str, sources: list[str]) -> list[socket.socket]:
    """A served connection from each source (retried: the NameServer may still be counting
    connections another test closed)."""
    return [wait_until(lambda: _served(address, source), 20, f"a connection from {source} admitted",  # noqa: B023
                       every_s=0.1) for source in sources]


def test_connections_from_one_address_are_capped(capped):
    held = _serve_all(capped.address, [LOOPBACK] * 3)
    try:
        assert _refused(capped.address)
        other = _served(capped.address, "127.0.0.2")  # another address has its own count
        assert other is not None
        other.close()
        held.pop().close()  # a place given back
        again = wait_until(lambda: _served(capped.address), 20, "a connection admitted again", every_s=0.1)
        held.append(again)
    finally:
        for sock in held:
            sock.close()


def test_connections_in_total_are_capped(capped):
    held = _serve_all(capped.address, ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"])
    try:
        assert _refused(capped.address, "127.0.0.4")
        held.pop().close()
        again = wait_until(lambda: _served(capped.address, "127.0.0.4"), 20, "a connection admitted again",
                           every_s=0.1)
        held.append(again)
    finally:
        for sock in held:
            sock.close()
    log = capped.log_text()
    assert "refusing a connection from 127.0.0.4" in log and "(max_connections 5)" in log
    assert "(max_connections_per_ip 3)" in log


# -- the NameServer a broker embeds ----------------------------------------------------------------------

def test_the_embedded_name_server_takes_the_brokers_settings_but_not_for_the_brokers_own_link(tmp_path, caplog):
    """Its idle time and caps are the broker's settings; the broker's registration link (a socket
    pair inside the process) is neither counted nor closed when idle, so the route stays."""
    with caplog.at_level(logging.INFO, logger="mqstore.namesrv"):
        with running_broker(str(tmp_path / "s"), front_processes=1, server_channel_max_idle_time_seconds=1,
                            max_connections_per_ip=2) as broker:
            held = [_served(broker.namesrv_address) for _ in range(2)]
            try:
                assert all(held), held
                assert _refused(broker.namesrv_address)
                for sock in held:  # idle for 1 s: closed, places given back
                    assert wait_until(lambda: closed_by_peer(sock), 20, "an idle connection closed")  # noqa: B023
                route = wait_until(lambda: _served(broker.namesrv_address), 20, "a connection admitted again",
                                   every_s=0.1)
                held.append(route)
                route.sendall(_route_request(2))
                answer = _answer(route)
                assert answer is not None and answer.code == ResponseCode.SUCCESS, answer
            finally:
                for sock in held:
                    if sock is not None:
                        sock.close()
    assert not [r for r in caplog.records if "dropped" in r.getMessage()], "the broker's own link was closed"
