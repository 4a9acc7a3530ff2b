"""The HA link authenticated (docs/replication.md "The handshake", mqstore.ha.auth): a slave
holding the broker account (inner_access_key / inner_secret_key) replicates byte for byte; a
slave with another secret, one without keys and a raw socket posing as a slave with fake offset
reports get nothing and are not counted (a SYNC_MASTER answers as with no slave); an impostor
master cannot make a slave append; a silent connection is closed within the handshake's time
limit; a master without a secret accepts any slave and says so once; and a taken HA port is one
line naming it and ha_listen_port, exit 2. Loopback only, free ports, every wait bounded."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time

import pytest

from mqstore import Message, MessageStore
from mqstore.ha import _ha
from mqstore.ha import auth
from mqstore.status import PutMessageStatus

from helpers_broker import LOOPBACK, ROOT
from helpers_proc import wait_until
from test_ha import caught_up, put_many, same_log, same_messages, stores  # noqa: F401  (stores: the fixture)

AK, SK = "rocketmq2", "12345678"
KEYS = {"inner_access_key": AK, "inner_secret_key": SK}
REFUSAL = "HA: refused the connection from"


def keyed_master(stores, name: str = "master", **config) -> MessageStore:  # noqa: F811
    return stores(name, ha_listen_port=0, **{**KEYS, **config})


def slave_of(stores, port: int, name: str = "slave", **config) -> MessageStore:  # noqa: F811
    return stores(name, broker_role="SLAVE", ha_master_address=f"{LOOPBACK}:{port}", **config)


def store_some(master: MessageStore, n: int) -> None:
    """Puts a SYNC_MASTER without a slave stores all the same (SLAVE_NOT_AVAILABLE)."""
    for i in range(n):
        r = master.put_message(Message("T", b"stored-%06d" % i, queue_id=i % 4))
        assert r.status in (PutMessageStatus.PUT_OK, PutMessageStatus.SLAVE_NOT_AVAILABLE), r.status


def ha_port(master: MessageStore) -> int:
    return master.ctl.get("ha_port")


def drain(sock: socket.socket, timeout_s: float) -> tuple[bytes, bool]:
    """Everything the peer sends within timeout_s, and whether it closed the connection."""
    got = bytearray()
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return bytes(got), False
        except ConnectionResetError:
            return bytes(got), True
        if not chunk:
            return bytes(got), True
        got += chunk
    return bytes(got), False


# -- the codec -------------------------------------------------------------------------------------
def test_the_handshake_messages_and_their_signatures():
    nonce, theirs = secrets.token_bytes(16), secrets.token_bytes(16)
    c = auth.challenge(nonce)
    assert len(c) == auth.CHALLENGE_SIZE == 28 and c.startswith(b"\xffMQSTOREHA\x01C")
    assert auth.parse_challenge(c) == nonce
    # as a frame header, a negative offset and a body of ~1.2 GB: a RocketMQ slave appends nothing
    phy, size = int.from_bytes(c[:8], "big", signed=True), int.from_bytes(c[8:12], "big", signed=True)
    assert phy < 0 and size > 1 << 30
    r = auth.response(nonce, theirs, AK, SK)
    assert len(r) == 12 + 16 + 1 + len(AK) + 20 and r[12:28] == theirs and r[28] == len(AK)
    assert r[-20:] == auth.slave_signature(SK, nonce, theirs, AK) != auth.slave_signature("other", nonce, theirs, AK)
    # the two sides' signatures differ: a slave's cannot be reflected as the master's proof
    assert auth.master_signature(SK, nonce, theirs, AK) != auth.slave_signature(SK, nonce, theirs, AK)
    a = auth.answer(auth.ACCEPTED, auth.master_signature(SK, nonce, theirs, AK))
    assert len(a) == auth.ANSWER_SIZE == 33 and auth.parse_answer(a) == (0, auth.master_signature(SK, nonce, theirs, AK))
    with pytest.raises(auth.HandshakeError, match="not the HA handshake's challenge"):
        auth.parse_challenge(_ha.header(0, 16) + bytes(16))
    with pytest.raises(auth.HandshakeError, match="version 2"):
        auth.parse_challenge(auth.MAGIC + b"\x02C" + nonce)
    with pytest.raises(auth.HandshakeError, match="kind"):
        auth.parse_answer(c + bytes(6))


# -- slaves ----------------------------------------------------------------------------------------
def test_a_slave_with_the_broker_account_replicates_byte_for_byte(stores):  # noqa: F811
    master = keyed_master(stores, broker_role="SYNC_MASTER", slave_timeout=2000)
    slave = slave_of(stores, ha_port(master), **KEYS)
    wait_until(lambda: master.ctl.get("ha_slaves") == 1, what="the slave past the handshake")
    (conn,) = master.ha.connections
    assert conn.access_key == AK
    put_many(master, 6000)  # SYNC_MASTER: each PUT_OK once the slave reported holding it
    wait_until(lambda: caught_up(master, slave), what="the slave to catch up")
    same_log(master, slave)
    same_messages(master, slave)
    assert master.ctl.get("confirmed") == master.ctl.get("wrote")
    assert slave.ha.status()["connected"] and slave.ha.last_error is None


def test_a_slave_with_another_secret_gets_nothing_and_is_not_waited_for(stores, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="mqstore.ha")
    master = keyed_master(stores, broker_role="SYNC_MASTER", slave_timeout=300)
    store_some(master, 1)
    wrong = slave_of(stores, ha_port(master), "wrong", inner_access_key=AK, inner_secret_key="not-the-secret")
    wait_until(lambda: "refused this slave's" in (wrong.ha.last_error or ""), what="the refusal on the slave")
    wait_until(lambda: any("signed with another secret" in r.getMessage() for r in caplog.records),
               what="the master's line")
    other = slave_of(stores, ha_port(master), "other", inner_access_key="someone", inner_secret_key=SK)
    wait_until(lambda: "refused this slave's" in (other.ha.last_error or ""), what="the refusal of another key")
    keyless = slave_of(stores, ha_port(master), "keyless")
    wait_until(lambda: "asks for the HA handshake: set inner_access_key and inner_secret_key" in
               (keyless.ha.last_error or ""), what="the keyless slave told which keys to set")
    for _ in range(3):
        assert master.ctl.get("ha_slaves") == 0
        r = master.put_message(Message("T", b"unreplicated"))
        assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE and "no slave is connected" in r.detail
        time.sleep(0.2)
    assert master.ctl.get("confirmed") == 0 and master.ha.connections == []
    for s in (wrong, other, keyless):
        assert s.ctl.get("wrote") == 0 and s.commitlog.queue.files == []
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith(REFUSAL)]
    assert any("gave the access key 'someone', not this broker's inner_access_key" in m for m in refusals)
    assert any("sent no HA handshake" in m for m in refusals)


def test_a_raw_socket_posing_as_a_slave_is_not_counted_and_reads_no_log(stores, caplog):  # noqa: F811
    """The attack: connect to the HA port, send 8-byte offset reports as a slave does. It must
    get no CommitLog byte, and a SYNC_MASTER must not count its reports as acknowledgements."""
    caplog.set_level(logging.INFO, logger="mqstore.ha")
    master = keyed_master(stores, broker_role="SYNC_MASTER", slave_timeout=300)
    store_some(master, 200)  # there is a log to steal
    log_end = master.ctl.get("wrote")
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as raw:
        raw.sendall(_ha.report(0))
        got, closed = drain(raw, 2.0)
        assert closed, "the master keeps the connection of a slave that skipped the handshake"
        assert got == got[:auth.CHALLENGE_SIZE] and auth.is_handshake(got), got[:64]  # the challenge, no log byte
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as raw:
        # acknowledgements far ahead, sent while a put waits: none of them may count
        results: list[PutMessageStatus] = []
        t = threading.Thread(target=lambda: results.append(master.put_message(Message("T", b"waits")).status))
        t.start()
        for _ in range(20):
            try:
                raw.sendall(_ha.report(log_end * 10))
            except OSError:
                break
            time.sleep(0.01)
        t.join(10)
        assert results == [PutMessageStatus.SLAVE_NOT_AVAILABLE]
        got, _ = drain(raw, 1.0)
        assert len(got) <= auth.CHALLENGE_SIZE
    assert master.ctl.get("ha_slaves") == 0 and master.ctl.get("confirmed") == 0
    assert master.ctl.get("ha_report_ms") == 0
    assert sum(1 for r in caplog.records if r.getMessage().startswith(REFUSAL)) == 2  # one line per connection


@pytest.mark.parametrize("impostor, why", [
    ("frames", "not the HA handshake's challenge"),
    ("any-answer", "could not prove it holds this slave's inner_secret_key"),
    ("other-secret", "could not prove it holds this slave's inner_secret_key"),
    ("silent", "did not start the HA handshake within"),
])
def test_an_impostor_master_cannot_make_a_slave_append(stores, impostor, why):  # noqa: F811
    """A raw server in the master's place: it sends CommitLog frames at once, or a challenge
    and then an answer it cannot sign (anything, or signed with another secret), or nothing;
    each time followed by frames. The slave appends nothing and says why."""
    record = b"x" * 64
    frames = _ha.header(0, len(record)) + record
    server = socket.create_server((LOOPBACK, 0))
    server.settimeout(0.5)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(3)
                try:
                    if impostor == "frames":
                        conn.sendall(frames)
                    elif impostor == "silent":
                        done.wait(8)
                    else:
                        nonce = secrets.token_bytes(16)
                        conn.sendall(auth.challenge(nonce))
                        head = conn.recv(12 + 16 + 1, socket.MSG_WAITALL)
                        conn.recv(head[-1] + 20, socket.MSG_WAITALL)
                        sig = (secrets.token_bytes(20) if impostor == "any-answer" else
                               auth.master_signature("guess", nonce, head[12:28], AK))
                        conn.sendall(auth.answer(auth.ACCEPTED, sig) + frames)
                    time.sleep(0.3)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        slave = slave_of(stores, server.getsockname()[1], **KEYS)
        wait_until(lambda: why in (slave.ha.last_error or ""), timeout_s=15, what=why)
        assert slave.ctl.get("wrote") == 0 and slave.ha.frames == 0
    finally:
        done.set()
        server.close()
        t.join(10)


def test_a_slave_with_keys_refuses_a_master_without_a_secret(stores):  # noqa: F811
    master = stores("master", ha_listen_port=0)
    put_many(master, 100)
    slave = slave_of(stores, ha_port(master), **KEYS)
    wait_until(lambda: "did not start the HA handshake within 5 s" in (slave.ha.last_error or ""), timeout_s=15,
               what="the slave's refusal")
    assert slave.ctl.get("wrote") == 0


# -- the time limit --------------------------------------------------------------------------------
def test_a_silent_connection_is_closed_within_the_handshake_time_limit(stores, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="mqstore.ha")
    master = keyed_master(stores)
    assert master.ha.handshake_timeout_s == auth.HANDSHAKE_TIMEOUT_S == 5.0
    t0 = time.monotonic()
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as silent:
        got, closed = drain(silent, auth.HANDSHAKE_TIMEOUT_S + 3)
    took = time.monotonic() - t0
    assert closed and auth.is_handshake(got) and len(got) == auth.CHALLENGE_SIZE
    assert auth.HANDSHAKE_TIMEOUT_S - 0.5 < took < auth.HANDSHAKE_TIMEOUT_S + 2.5
    # a byte at a time does not stretch it: the limit is on the whole handshake
    master.ha.handshake_timeout_s = 1.0
    t0 = time.monotonic()
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as slow:
        for b in auth.MAGIC:
            try:
                slow.sendall(bytes((b,)))
            except OSError:
                break
            time.sleep(0.2)
        _, closed = drain(slow, 3)
    assert closed and time.monotonic() - t0 < 4
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(REFUSAL)]
    assert len(lines) == 2, lines
    assert "sent nothing of the HA handshake within 5 s" in lines[0]
    assert "sent only part of the HA handshake within 1 s" in lines[1]
    assert master.ctl.get("ha_slaves") == 0


def test_a_master_without_a_secret_accepts_any_slave_and_says_so_once(stores, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="mqstore.ha")
    master = stores("master", ha_listen_port=0)
    put_many(master, 50)
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as raw:  # RocketMQ's slave, as before
        raw.sendall(_ha.report(0))
        reader = _ha.SlaveReader()
        raw.settimeout(5)
        frame = None
        while frame is None:
            reader.feed(raw.recv(65536))
            frame = reader.next()
        assert frame[0] == 0 and len(frame[1]) > 0
        wait_until(lambda: master.ctl.get("ha_slaves") == 1)
    warnings = [r.getMessage() for r in caplog.records if "accepting any slave" in r.getMessage()]
    assert len(warnings) == 1 and "inner_secret_key is not set" in warnings[0]


# -- two nodes -------------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_two_nodes_with_the_broker_account_replicate(stores):  # noqa: F811
    master = keyed_master(stores, broker_role="SYNC_MASTER", service_mode="processes", slave_timeout=3000)
    wait_until(lambda: ha_port(master) > 0, what="the master's HA process to listen")
    slave = slave_of(stores, ha_port(master), service_mode="processes", **KEYS)
    wait_until(lambda: master.ctl.get("ha_slaves") == 1, what="the slave node past the handshake")
    put_many(master, 500)
    wait_until(lambda: caught_up(master, slave), what="the slave node to catch up")
    same_log(master, slave)


# -- a taken HA port -------------------------------------------------------------------------------
def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "mqstore", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


def _held_port_after_a_free_one() -> tuple[socket.socket, int]:
    """A listening socket on a port whose predecessor is free (a broker's listen_port there has
    its HA port, listen_port + 1, taken); the socket and the free port."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            free = probe.getsockname()[1]
        holder = socket.socket()
        try:
            holder.bind((LOOPBACK, free + 1))
        except OSError:
            holder.close()
            continue
        holder.listen()
        return holder, free
    raise AssertionError("no two consecutive free ports")


def _the_line(got: subprocess.CompletedProcess[str], command: str, port: int) -> None:
    assert got.returncode == 2, (got.returncode, got.stderr)
    errors = [line for line in got.stderr.splitlines() if line.startswith(f"mqstore {command}:")]
    assert errors == [f"mqstore {command}: the HA port {port} (ha_listen_port) on {LOOPBACK} is taken: Address already "
                      "in use (hint: stop what holds the port, or give the setting another port (0 = any free one))"], \
        got.stderr
    assert got.stderr.splitlines()[-1] == errors[0] and "Traceback" not in got.stderr


@pytest.mark.multiprocess
def test_a_taken_ha_port_is_one_line_and_exit_2(tmp_path):
    holder, listen_port = _held_port_after_a_free_one()
    with holder:
        got = _run_cli("broker", str(tmp_path / "broker"), "--set", f"listen_port={listen_port}", "--set",
                       "namesrv_listen_port=0", "--set", f"bind_address={LOOPBACK}", "--set",
                       f"broker_ip1={LOOPBACK}", "--set", "front_processes=1")
        _the_line(got, "broker", listen_port + 1)
        got = _run_cli("node", str(tmp_path / "node"), "--set", f"ha_listen_port={listen_port + 1}")
        _the_line(got, "node", listen_port + 1)
