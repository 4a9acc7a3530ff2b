"""A broker on a network: one broker per port, loopback by default, and the limits on every
connection (docs/security.md): idle and frame timeouts, a client that does not read its answers,
connections per address and in total over every front of the broker (a front killed gives back
what it held), requests in flight, half-close, and a bounded log."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers_broker import (LOOPBACK, ROOT, BrokerProcess, broker_settings, closed_by_peer, free_port, running_broker,
                            trickled_until_closed)
from helpers_proc import wait_until

from mqstore.broker._conns import address_slot
from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.broker.limits import IP_SLOTS, ConnectionCounter, LogLimiter
from mqstore.broker.server import Broker
from mqstore.config import StoreConfig
from mqstore.errors import PortInUseError
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess


def _connect(address: str, timeout_s: float = 10.0) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def _max_offset(opaque: int, topic: str = "TBW102") -> bytes:
    return RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=opaque,
                           ext_fields={"topic": topic, "queueId": "0"}).encode()


def _read_answers(sock: socket.socket, count: int, timeout_s: float = 30.0) -> list[RemotingCommand]:
    frames = FrameReader()
    out: list[RemotingCommand] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, f"{len(out)} of {count} answers within {timeout_s} s"
        data = sock.recv(1 << 20)
        if not data:
            break
        frames.feed(data)
        while (cmd := frames.next()) is not None:
            out.append(cmd)
    return out


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


# -- one broker per port ------------------------------------------------------------------------

def test_a_second_broker_on_a_taken_port_is_refused_naming_the_port(tmp_path):
    """Regression: with SO_REUSEPORT a second broker on another store started on the same port
    and the kernel split the clients between the two stores."""
    with running_broker(str(tmp_path / "a")) as first:
        with pytest.raises(PortInUseError, match=rf"port {first.port} \(listen_port\)"):
            Broker(str(tmp_path / "b"), **broker_settings(listen_port=first.port))
        # nothing else can take a share of the port either, SO_REUSEPORT or not
        other = socket.socket()
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError) as caught:
            other.bind((LOOPBACK, first.port))
        other.close()
        assert caught.value.errno == errno.EADDRINUSE
        # and the store of the refused broker was not touched
        assert not (tmp_path / "b" / "commitlog").exists()


def test_the_cli_says_one_line_and_exits_2_on_a_taken_port(tmp_path):
    holder = socket.socket()
    holder.bind((LOOPBACK, 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        argv = [sys.executable, "-m", "mqstore", "broker", str(tmp_path / "s")]
        for key, value in broker_settings(listen_port=port).items():
            argv += ["--set", f"{key}={value}"]
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mqstore broker:")]
    assert len(lines) == 1 and f"port {port} (listen_port)" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_fronts_restarted_serve_the_same_socket(tmp_path):
    with running_broker(str(tmp_path / "s"), front_processes=1) as broker:
        (old,) = broker.front_pids().values()
        os.kill(old, 9)
        wait_until(lambda: set(broker.front_pids().values()) - {old}, 30, "a restarted front")
        with _connect(broker.address) as sock:
            sock.sendall(_max_offset(7))
            (answer,) = _read_answers(sock, 1)
        assert answer.opaque == 7


# -- safe defaults --------------------------------------------------------------------------------

def test_listeners_bind_loopback_unless_told():
    assert StoreConfig().effective_bind_address == "127.0.0.1"
    assert StoreConfig(broker_ip1="127.0.0.2").effective_bind_address == "127.0.0.1"
    assert StoreConfig(broker_ip1="10.0.0.5").effective_bind_address == "0.0.0.0"
    assert StoreConfig(bind_address="0.0.0.0").effective_bind_address == "0.0.0.0"
    assert StoreConfig(broker_ip1="10.0.0.5", bind_address="127.0.0.1").effective_bind_address == "127.0.0.1"


def test_the_first_line_says_where_it_listens_and_what_guards_it(tmp_path):
    with BrokerProcess(str(tmp_path / "s"), bind_address=None) as broker:
        host, _, port = broker.address.rpartition(":")
        with _connect(broker.address) as sock:
            assert sock.getpeername() == (LOOPBACK, int(port))
        line = broker.first_line
    assert f"listening on 127.0.0.1:{port} (loopback only)" in line
    assert "ACL off" in line and "TLS disabled" in line


# -- limits on a connection -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """One front, so every connection of a test meets the same counters."""
    root = str(tmp_path_factory.mktemp("limited") / "s")
    with running_broker(root, front_processes=1, server_channel_max_idle_time_seconds=2,
                        max_connections_per_ip=8, max_requests_in_flight_per_connection=4,
                        write_buffer_high_water_mark=256 * 1024, write_buffer_low_water_mark=64 * 1024) as broker:
        yield broker


def test_an_idle_connection_is_closed(limited):
    with _connect(limited.address) as sock:
        assert wait_until(lambda: closed_by_peer(sock), 20, "the idle connection closed", every_s=0.1)


def test_a_frame_trickled_a_byte_at_a_time_is_closed(limited):
    frame = _max_offset(1)
    with _connect(limited.address) as sock:
        closed = trickled_until_closed(sock, frame)  # never idle, never whole within the 2 s bound
        assert closed


def test_connections_per_address_are_capped(limited):
    socks = [_connect(limited.address) for _ in range(8)]
    try:
        for i, sock in enumerate(socks):  # each admitted one is served
            sock.sendall(_max_offset(100 + i))
            assert _read_answers(sock, 1)[0].opaque == 100 + i
        extra = _connect(limited.address)
        try:
            assert wait_until(lambda: closed_by_peer(extra), 10, "the ninth connection refused", every_s=0.05)
        finally:
            extra.close()
        socks.pop().close()

        def admitted_again() -> bool:
            with _connect(limited.address) as sock:
                sock.sendall(_max_offset(9))
                try:
                    return bool(_read_answers(sock, 1, timeout_s=5))
                except (ConnectionError, AssertionError):
                    return False
        assert wait_until(admitted_again, 10, "a connection admitted once another closed", every_s=0.1)
    finally:
        for sock in socks:
            sock.close()


def test_requests_in_flight_stop_reading_until_answers_go_out(limited):
    """Held pulls count as in flight: with 4 held, the connection is not read, so a request sent
    after six long-polling pulls is answered only once held ones were (without the limit it is
    answered first)."""
    pull = {"consumerGroup": "CID_LIMITS", "topic": "TBW102", "queueId": "0", "queueOffset": "0",
            "maxMsgNums": "1", "sysFlag": str(0x2 | 0x4), "commitOffset": "0", "suspendTimeoutMillis": "1000",
            "subscription": "*", "subVersion": "0"}
    frames = b"".join(RemotingCommand(RequestCode.PULL_MESSAGE, opaque=i, ext_fields=pull).encode()
                      for i in range(1, 7))
    with _connect(limited.address) as sock:
        sock.sendall(frames + _max_offset(99))
        answers = _read_answers(sock, 7)
    order = [a.opaque for a in answers]
    assert order.index(99) >= 3, order
    assert sorted(order) == [1, 2, 3, 4, 5, 6, 99]


def test_a_request_then_half_close_is_answered(limited):
    with _connect(limited.address) as sock:
        sock.sendall(_max_offset(5))
        sock.shutdown(socket.SHUT_WR)
        answers = _read_answers(sock, 2)  # the answer, then EOF
    assert [a.opaque for a in answers] == [5]
    assert answers[0].code == ResponseCode.SUCCESS


def test_requests_the_controller_answers_then_half_close_are_answered(limited):
    """Requests still in flight when the client shuts its side (forwarded to the controller,
    sends waiting for their topic's creation) are answered before the front closes. Regression:
    the answer of the last one in flight was dropped (the connection closed first)."""
    runtime = RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO, opaque=6).encode()
    topics = RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG, opaque=7).encode()
    # two sends to a topic the broker does not have: the first asks the controller to create it,
    # the second waits for that creation
    sends = b"".join(RemotingCommand(RequestCode.SEND_MESSAGE, opaque=opaque, ext_fields={
        "producerGroup": "PG_HALF", "topic": "TopicHalfClosed", "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0",
        "properties": ""}, body=b"sent before the half-close").encode() for opaque in (8, 9))
    with _connect(limited.address) as sock:
        sock.sendall(runtime + _max_offset(5) + topics + sends)
        sock.shutdown(socket.SHUT_WR)
        answers = _read_answers(sock, 6)  # five answers, then EOF
    assert sorted(a.opaque for a in answers) == [5, 6, 7, 8, 9]
    assert all(a.code == ResponseCode.SUCCESS for a in answers), [(a.opaque, a.code, a.remark) for a in answers]


def test_a_client_that_never_reads_holds_no_memory_and_slows_no_one(limited):
    """Regression: 455,850 pipelined GET_ALL_TOPIC_CONFIG in 20 s grew a front from 17 to 468 MB."""
    (front,) = limited.front_pids().values()
    before = _rss_kb(front)
    request = RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=1,
                              ext_fields={"topic": "TBW102", "queueId": "0"}).encode()
    hostile = _connect(limited.address)
    hostile.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hostile.setblocking(False)
    sent = 0
    stalled_since = None
    deadline = time.monotonic() + 20
    chunk = request * 2000
    pending = memoryview(b"")
    while time.monotonic() < deadline and sent < 200_000 * len(request):
        if not pending:
            pending = memoryview(chunk)
        try:
            n = hostile.send(pending)
            pending = pending[n:]
            sent += n
            stalled_since = None
        except BlockingIOError:  # the broker stopped reading us
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 1.0:
                break
            time.sleep(0.01)
        # another client on the same front keeps being answered
        if not pending and sent % (len(chunk) * 50) == 0:
            with _connect(limited.address) as other:
                other.sendall(_max_offset(3))
                assert _read_answers(other, 1)[0].opaque == 3
    assert stalled_since is not None, f"the broker read all {sent} bytes of requests of a client that reads nothing"
    grown_mb = (_rss_kb(front) - before) / 1024
    assert grown_mb < 64, f"the front grew {grown_mb:.0f} MB"
    with _connect(limited.address) as other:
        other.sendall(_max_offset(4))
        assert _read_answers(other, 1)[0].opaque == 4
    hostile.close()


def test_refused_connections_are_logged_within_a_budget(tmp_path):
    with BrokerProcess(str(tmp_path / "s"), front_processes=1, max_connections_per_ip=2) as broker:
        held = [_connect(broker.address) for _ in range(2)]
        for _ in range(300):
            sock = _connect(broker.address)
            sock.close()
        for _ in range(100):  # and bad frames
            with _connect(broker.address) as sock:
                sock.sendall(b"\xff" * 16)
        for sock in held:
            sock.close()
        wait_until(lambda: "refusing a connection" in broker.log_text(), 20, "a refusal logged")
        text = broker.log_text()
    refusals = sum(1 for line in text.splitlines() if "refusing a connection" in line or "closing the connection" in line)
    assert refusals <= 40, f"{refusals} lines for 400 refused connections"


# -- connections over every front of a broker --------------------------------------------------------

def _fronts(broker_pid: int) -> dict[int, int]:
    """index -> pid of the broker's front processes (python -c ...front.main ROOT INDEX ...)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if int(state[1]) == broker_pid and state[0] != "Z" and len(argv) > 4 and "broker.front" in argv[2]:
            out[int(argv[4])] = int(entry)
    return out


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def _only(front: int, fronts: dict[int, int]):
    """Every front process but `front` stopped (SIGSTOP) for the block: `front` accepts every
    connection opened in it."""
    others = [pid for pid in fronts.values() if pid != front]
    try:
        for pid in others:
            os.kill(pid, signal.SIGSTOP)
            wait_until(lambda: _state(pid) == "T", 10, f"front {pid} stopped", every_s=0.01)  # noqa: B023
        yield
    finally:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _open(address: str, source: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def _admitted(address: str, source: str = LOOPBACK) -> socket.socket | None:
    """A connection from source the broker serves (it answers a request), or None when refused."""
    sock = _open(address, source)
    try:
        sock.sendall(_max_offset(11))
        answered = bool(_read_answers(sock, 1, timeout_s=15))
    except ConnectionError:
        answered = False
    if not answered:
        sock.close()
        return None
    return sock


def _refused(address: str, source: str = LOOPBACK) -> bool:
    with _open(address, source) as sock:
        return bool(wait_until(lambda: closed_by_peer(sock), 10, f"a connection from {source} refused", every_s=0.02))


def _serve(address: str, source: str = LOOPBACK) -> socket.socket:
    sock = _admitted(address, source)
    assert sock is not None, f"a connection from {source} was refused"
    return sock


def test_the_connection_caps_are_the_brokers_not_each_fronts(tmp_path):
    """Regression: each front counted its own connections, so a broker of N fronts held N times
    max_connections and max_connections_per_ip. Fronts are stopped in turn (SIGSTOP) so that each
    holds some of the connections."""
    assert address_slot("127.0.0.1", IP_SLOTS) != address_slot("127.0.0.2", IP_SLOTS)
    held: list[socket.socket] = []
    with BrokerProcess(str(tmp_path / "s"), front_processes=2, max_connections=4, max_connections_per_ip=3) as broker:
        fronts = _fronts(broker.pid)
        assert len(fronts) == 2, fronts
        try:
            with _only(fronts[0], fronts):
                held += [_serve(broker.address) for _ in range(2)]
            with _only(fronts[1], fronts):
                held.append(_serve(broker.address))
                # front 1 holds one connection from 127.0.0.1, the broker three: max_connections_per_ip
                assert _refused(broker.address)
                held.append(_serve(broker.address, "127.0.0.2"))
                # front 1 holds two connections, the broker four: max_connections
                assert _refused(broker.address, "127.0.0.3")
            with _only(fronts[0], fronts):
                assert _refused(broker.address, "127.0.0.3")
            held.pop(0).close()  # one of front 0's: once front 0 saw it close, a place on either front
            held.append(wait_until(lambda: _admitted(broker.address, "127.0.0.3"), 20, "a place given back",
                                   every_s=0.2))
        finally:
            for sock in held:
                sock.close()
        log = broker.log_text()
    assert "4 connections open to the broker (max_connections 4)" in log
    assert "3 connections open to the broker from 127.0.0.1 (max_connections_per_ip 3)" in log


def test_a_killed_front_gives_back_the_connections_it_held(tmp_path):
    """A front killed with SIGKILL never releases its connections: the front the broker starts
    in its place zeroes its counts, so the broker admits again as many as the killed one held."""
    held: list[socket.socket] = []
    with BrokerProcess(str(tmp_path / "s"), front_processes=2, max_connections=4) as broker:
        fronts = _fronts(broker.pid)
        try:
            with _only(fronts[0], fronts):
                on_front0 = [_serve(broker.address) for _ in range(3)]
            with _only(fronts[1], fronts):
                held.append(_serve(broker.address))
            held += on_front0
            assert _refused(broker.address)
            os.kill(fronts[0], signal.SIGKILL)
            for sock in on_front0:
                assert wait_until(lambda: closed_by_peer(sock), 20, "a killed front's connection closed")  # noqa: B023
            wait_until(lambda: _fronts(broker.pid).get(0) not in (None, fronts[0]), 60, "front 0 restarted")
            for _ in range(3):
                held.append(wait_until(lambda: _admitted(broker.address), 60, "a connection admitted again",
                                       every_s=0.2))
            assert _refused(broker.address)
        finally:
            for sock in held:
                sock.close()


# -- the pieces -------------------------------------------------------------------------------------

def test_connection_counter():
    counter = ConnectionCounter(max_total=3, max_per_ip=2)
    assert counter.admit("a") is None and counter.admit("a") is None
    assert "max_connections_per_ip 2" in (counter.admit("a") or "")
    assert counter.admit("b") is None
    assert "max_connections 3" in (counter.admit("c") or "")
    counter.release("a")
    assert counter.admit("c") is None
    counter.release("zzz")  # never admitted: nothing changes
    assert counter.total == 3


def test_log_limiter_says_how_many_lines_it_held_back(caplog):
    now = [0.0]
    limiter = LogLimiter(logging.getLogger("test.limiter"), burst=3, window_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.limiter"):
        results = [limiter.warning("line %d", i) for i in range(10)]
        now[0] = 11
        limiter.warning("after")
    assert results == [True] * 3 + [False] * 7
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == ["line 0", "line 1", "line 2"]
    assert messages[3].startswith("(7 similar lines")
    assert messages[4] == "after"


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")
def test_the_controllers_link_refuses_other_users(tmp_path):
    """The link is an abstract Unix socket (no file permissions): a process of another user
    that connects to it is closed before it can speak for a front."""
    from mqstore.broker import link

    with running_broker(str(tmp_path / "s"), front_processes=1) as broker:
        hello = RemotingCommand(link.HELLO, opaque=1, ext_fields={"pid": "1"}).encode()
        pid = os.fork()
        if pid == 0:  # the child: another user, then the link
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(10)
                    sock.connect(broker.link_address)
                    sock.sendall(hello)
                    code = 0 if sock.recv(65536) == b"" else 1
            except ConnectionError:
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # the broker's own user is served
            sock.settimeout(10)
            sock.connect(broker.link_address)
            sock.sendall(hello)
            frames = FrameReader()
            while (answer := frames.next()) is None:
                frames.feed(sock.recv(65536))
        assert answer.opaque == 1 and answer.code == 0
