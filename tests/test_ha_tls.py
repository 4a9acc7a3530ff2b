"""TLS on the HA link (docs/replication.md "TLS"): a master with tls_server_mode enforcing and a
slave with tls_enable trusting its CA replicate byte for byte, the handshake of mqstore.ha.auth
inside TLS; a plain slave against an enforcing master gets nothing; a slave trusting another CA
appends nothing and says why; a permissive master serves a TLS slave and a plain one on one
port; SYNC_MASTER over TLS answers PUT_OK; a silent or stalled TLS client is closed within the
handshake's time limit; a TLS slave against a plain master is refused with a line saying so.
Loopback only, free ports, every wait bounded."""

from __future__ import annotations

import logging
import socket
import ssl
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import MessageStore
from mqstore.ha import _ha
from mqstore.ha import auth
from mqstore.tls import TLS_RECORD_HANDSHAKE

from helpers_broker import LOOPBACK
from helpers_proc import wait_until
from helpers_tls import Pki, make_pki
from test_ha import caught_up, put_many, same_log, same_messages, stores  # noqa: F401  (stores: the fixture)
from test_ha_auth import KEYS, REFUSAL, drain, ha_port, store_some

MASTER_LOG = "mqstore.ha"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_master(stores, pki: Pki, mode: str = "enforcing", name: str = "master", **config) -> MessageStore:  # noqa: F811
    return stores(name, ha_listen_port=0, tls_server_mode=mode, tls_server_cert_path=pki.server_cert,
                  tls_server_key_path=pki.server_key, **config)


def slave_of(stores, port: int, name: str = "slave", **config) -> MessageStore:  # noqa: F811
    return stores(name, broker_role="SLAVE", ha_master_address=f"{LOOPBACK}:{port}", **config)


def tls_slave(stores, port: int, trust: str, name: str = "slave", **config) -> MessageStore:  # noqa: F811
    return slave_of(stores, port, name, tls_enable=True, tls_client_trust_cert_path=trust, **config)


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(REFUSAL)]


def gets_nothing(master: MessageStore, *slaves: MessageStore) -> None:
    assert master.ctl.get("ha_slaves") == 0 and master.ha.connections == []
    assert master.ctl.get("confirmed") == 0 and master.ctl.get("ha_report_ms") == 0
    for s in slaves:
        assert s.ctl.get("wrote") == 0 and s.ha.frames == 0 and s.commitlog.queue.files == []


# -- the first byte --------------------------------------------------------------------------------
@given(offset=st.integers(0, (TLS_RECORD_HANDSHAKE << 56) - 1))
def test_no_offset_report_starts_like_a_tls_record(offset):
    """Permissive mode tells the two apart by the first byte: an offset report's is the offset's
    top byte (0 below 2^56 = 64 PiB), 0x16 only from 0x16 << 56 (1.4 EiB of CommitLog) on; the
    handshake's messages start with 0xff."""
    assert _ha.report(offset)[0] != TLS_RECORD_HANDSHAKE
    assert auth.challenge(bytes(16))[0] == auth.MAGIC[0] == 0xFF != TLS_RECORD_HANDSHAKE


def test_offset_reports_below_2_to_the_56_start_with_0():
    for offset in (0, 1, 1 << 30, 1 << 40, (1 << 56) - 1):
        assert _ha.report(offset)[0] == 0
    assert _ha.report(TLS_RECORD_HANDSHAKE << 56)[0] == TLS_RECORD_HANDSHAKE


# -- enforcing -------------------------------------------------------------------------------------
def test_a_tls_slave_replicates_byte_for_byte_from_an_enforcing_master(stores, pki):  # noqa: F811
    master = tls_master(stores, pki, **KEYS)
    put_many(master, 2500)  # a backlog across files of 1 MiB, then puts while it streams
    slave = tls_slave(stores, ha_port(master), pki.ca, **KEYS)
    wait_until(lambda: master.ctl.get("ha_slaves") == 1, what="the TLS slave past both handshakes")
    (conn,) = master.ha.connections
    assert conn.tls and conn.access_key == KEYS["inner_access_key"]
    assert isinstance(conn.sock, ssl.SSLSocket) and conn.sock.version() in ("TLSv1.2", "TLSv1.3")
    assert isinstance(slave.ha.sock, ssl.SSLSocket)
    put_many(master, 2500, start=2500)
    wait_until(lambda: caught_up(master, slave), what="the TLS slave to catch up")
    same_log(master, slave)
    same_messages(master, slave)
    assert master.ctl.get("confirmed") == master.ctl.get("wrote")
    assert slave.ha.status()["tls"] and slave.ha.status()["connected"] and slave.ha.last_error is None
    assert master.ha.status()[0]["tls"] is True


def test_sync_master_over_tls_answers_put_ok(stores, pki):  # noqa: F811
    master = tls_master(stores, pki, broker_role="SYNC_MASTER", slave_timeout=3000, **KEYS)
    slave = tls_slave(stores, ha_port(master), pki.ca, **KEYS)
    wait_until(lambda: master.ctl.get("ha_slaves") == 1, what="the TLS slave")
    put_many(master, 1500)  # each PUT_OK only once the slave reported holding it, over TLS
    assert master.ctl.get("confirmed") == master.ctl.get("wrote")
    wait_until(lambda: caught_up(master, slave), what="the slave's dispatch")
    same_log(master, slave)


def test_a_slave_with_a_client_certificate_when_the_master_requires_one(stores, pki):  # noqa: F811
    master = tls_master(stores, pki, tls_server_need_client_auth="require", tls_server_trust_cert_path=pki.ca)
    master.ha.handshake_timeout_s = 2.0
    put_many(master, 200)
    anonymous = tls_slave(stores, ha_port(master), pki.ca, "anonymous")
    slave = tls_slave(stores, ha_port(master), pki.ca, tls_client_cert_path=pki.client_cert,
                      tls_client_key_path=pki.client_key)
    wait_until(lambda: caught_up(master, slave), what="the slave with the client certificate")
    same_log(master, slave)
    assert anonymous.ctl.get("wrote") == 0 and len(master.ha.connections) == 1


def test_a_plain_slave_gets_nothing_from_an_enforcing_master(stores, pki, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger=MASTER_LOG)
    master = tls_master(stores, pki, broker_role="SYNC_MASTER", slave_timeout=300, **KEYS)
    master.ha.handshake_timeout_s = 1.0
    store_some(master, 200)
    master.ctl.set("confirmed", 0)
    log_end = master.ctl.get("wrote")
    keyless = slave_of(stores, ha_port(master), "keyless")  # its offset report comes first: not TLS
    keyed = slave_of(stores, ha_port(master), "keyed", **KEYS)  # waits for a challenge that never comes
    wait_until(lambda: any("sent bytes that are not TLS" in m for m in refusals(caplog)), what="the keyless refusal")
    wait_until(lambda: any("sent nothing within 1 s: no TLS handshake" in m for m in refusals(caplog)),
               timeout_s=10, what="the keyed slave's refusal")
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as raw:  # as a RocketMQ slave
        raw.sendall(_ha.report(0))
        got, closed = drain(raw, 2.0)
    assert closed and got == b""  # not a byte: no challenge, no log
    assert keyless.ha.last_error and keyed.ha.last_error
    gets_nothing(master, keyless, keyed)
    assert log_end > 0 and master.ctl.get("confirmed") == 0


def test_a_slave_trusting_another_ca_appends_nothing_and_says_why(stores, pki, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger=MASTER_LOG)
    master = tls_master(stores, pki, **KEYS)
    put_many(master, 100)
    slave = tls_slave(stores, ha_port(master), pki.other_ca, **KEYS)
    why = "presents a certificate this slave does not trust"
    wait_until(lambda: why in (slave.ha.last_error or ""), what="the slave's refusal")
    assert "tls_client_trust_cert_path" in slave.ha.last_error
    wait_until(lambda: any("the TLS handshake failed" in m for m in refusals(caplog)), what="the master's line")
    time.sleep(1.0)  # a few retries with the back-off: each the same error, logged once
    lines = [r.getMessage() for r in caplog.records if why in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"HA: the master at {LOOPBACK}:{ha_port(master)} ")
    gets_nothing(master, slave)
    assert all(line.count("HA: refused") == 1 for line in refusals(caplog))  # one line per connection


def test_a_tls_slave_of_a_plain_master_is_refused(stores, pki, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger=MASTER_LOG)
    keyed = stores("keyed", ha_listen_port=0, **KEYS)
    open_ = stores("open", ha_listen_port=0)
    put_many(keyed, 50)
    put_many(open_, 50)
    a = tls_slave(stores, ha_port(keyed), pki.ca, "a", **KEYS)
    b = tls_slave(stores, ha_port(open_), pki.ca, "b")
    for s in (a, b):
        wait_until(lambda s=s: "the TLS handshake with the master" in (s.ha.last_error or ""), what="the TLS failure")
    wait_until(lambda: sum("started a TLS handshake" in m for m in refusals(caplog)) >= 2, what="both masters' lines")
    gets_nothing(keyed, a)
    gets_nothing(open_, b)


# -- permissive ------------------------------------------------------------------------------------
@pytest.mark.parametrize("keys", [KEYS, {}], ids=["keyed", "keyless"])
def test_a_permissive_master_serves_a_tls_slave_and_a_plain_slave(stores, pki, keys):  # noqa: F811
    """With the keys the plain slave is silent until the challenge (taken for plain after
    TLS_SNIFF_S); without, its offset report's first byte 0 says plain at once."""
    master = tls_master(stores, pki, "permissive", broker_role="SYNC_MASTER", slave_timeout=3000, **keys)
    secure = tls_slave(stores, ha_port(master), pki.ca, "secure", **keys)
    plain = slave_of(stores, ha_port(master), "plain", **keys)
    wait_until(lambda: master.ctl.get("ha_slaves") == 2, what="both slaves")
    assert sorted(c.tls for c in master.ha.connections) == [False, True]
    put_many(master, 1500)
    for s in (secure, plain):
        wait_until(lambda s=s: caught_up(master, s), what="each slave to catch up")
        same_log(master, s)
        same_messages(master, s)
    assert isinstance(secure.ha.sock, ssl.SSLSocket) and not isinstance(plain.ha.sock, ssl.SSLSocket)


# -- the time limit --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
def test_a_stalled_tls_client_is_closed_within_the_handshake_time_limit(stores, pki, caplog, mode):  # noqa: F811
    """A client that starts a TLS handshake and goes silent holds its connection's thread for
    the handshake's time limit, not longer; the accept loop goes on serving meanwhile."""
    caplog.set_level(logging.INFO, logger=MASTER_LOG)
    master = tls_master(stores, pki, mode, **KEYS)
    master.ha.handshake_timeout_s = 1.0
    t0 = time.monotonic()
    with socket.create_connection((LOOPBACK, ha_port(master)), timeout=5) as stalled:
        stalled.sendall(bytes((TLS_RECORD_HANDSHAKE, 3, 1, 0, 200)))  # a record header, then nothing
        slave = tls_slave(stores, ha_port(master), pki.ca, **KEYS)
        wait_until(lambda: master.ctl.get("ha_slaves") == 1, what="a slave served while one stalls")
        got, closed = drain(stalled, 4.0)
    assert closed and got == b"" and time.monotonic() - t0 < 4
    wait_until(lambda: len(master.ha.pending) == 0, what="the stalled connection dropped")
    assert any("did not finish the TLS handshake within 1 s" in m for m in refusals(caplog)), refusals(caplog)
    assert slave.ha.last_error is None
