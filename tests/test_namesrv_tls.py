"""TLS on the NameServer's port (tls_server_mode's three modes, docs/security.md): a
standalone NameServer, ``mqstore namesrv --tls-*``, the NameServer a broker embeds, and a broker
registering over TLS (tls_enable) with a NameServer whose certificate it checks. Certificates the
test makes; loopback only, free ports, every wait bounded."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from helpers_broker import LOOPBACK, ROOT, free_port, running_broker
from helpers_proc import wait_until
from helpers_tls import Pki, exchange, make_pki

from mqstore.remoting._remoting import RemotingCommand
from mqstore.broker.codes import RequestCode, ResponseCode
from mqstore.broker.namesrv import NameServer, NameServerThread
from mqstore.tls import DISABLED, ENFORCING, PERMISSIVE, client_context, server_context

BODY = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
    "dataVersion": {"counter": 1, "timestamp": 5},
    "topicConfigTable": {"TopicTls": {"topicName": "TopicTls", "readQueueNums": 4, "writeQueueNums": 4,
                                      "perm": 6}}}}).encode()
REGISTRATION = {"brokerName": "broker-t", "brokerAddr": "127.0.0.1:10911", "clusterName": "DefaultCluster",
                "haServerAddr": "", "brokerId": "0", "compressed": "false",
                "bodyCrc32": str(zlib.crc32(BODY) & 0x7FFFFFFF)}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def name_server(pki: Pki, mode: str) -> Iterator[NameServerThread]:
    """A NameServer on a loopback port of its own thread, in ``mode`` with the test's certificate."""
    ns = NameServerThread(LOOPBACK, 0, tls=server_context(mode, pki.server_cert, pki.server_key), tls_mode=mode)
    ns.start()
    try:
        yield ns
    finally:
        ns.close()


def _plain(port: int) -> socket.socket:
    return socket.create_connection((LOOPBACK, port), timeout=10)


def _tls(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    return ctx.wrap_socket(_plain(port), server_hostname=LOOPBACK)


def _call(sock: socket.socket, code: int, fields: dict[str, str], body: bytes = b"",
          opaque: int = 1) -> RemotingCommand | None:
    """One request over sock; its answer, or None when the NameServer closed the connection."""
    return exchange(sock, RemotingCommand(code, language="JAVA", version=407, opaque=opaque, ext_fields=fields,
                                          body=body))


def _route(sock: socket.socket, topic: str, opaque: int = 1) -> RemotingCommand | None:
    return _call(sock, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, opaque=opaque)


def _brokers(answer: RemotingCommand | None) -> dict[str, dict[str, str]]:
    assert answer is not None and answer.code == ResponseCode.SUCCESS, answer and (answer.code, answer.remark)
    return {b["brokerName"]: b["brokerAddrs"] for b in json.loads(answer.body)["brokerDatas"]}


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "mqstore.namesrv" and r.getMessage().startswith("refusing a connection from")]


# == a NameServer of its own ====================================================================

def test_enforcing_answers_over_tls_and_closes_plain_connections(pki, caplog):
    caplog.set_level(logging.WARNING, logger="mqstore.namesrv")
    with name_server(pki, ENFORCING) as ns:
        with _tls(ns.port, client_context(trust_cert_path=pki.ca)) as sock:
            assert sock.version() in ("TLSv1.2", "TLSv1.3")
            got = _call(sock, RequestCode.REGISTER_BROKER, REGISTRATION, BODY)
            assert got is not None and got.code == ResponseCode.SUCCESS, got and got.remark
            assert _brokers(_route(sock, "TopicTls", opaque=2)) == {"broker-t": {"0": "127.0.0.1:10911"}}
            # the registration is tied to this TLS connection: it holds the route while open
            with _plain(ns.port) as plain:
                assert _route(plain, "TopicTls") is None
            with _tls(ns.port, client_context(trust_cert_path=pki.ca)) as other:
                assert _brokers(_route(other, "TopicTls")) == {"broker-t": {"0": "127.0.0.1:10911"}}
        wait_until(lambda: ns.call(lambda: ns.server.routes.route("TopicTls")) is None, 10,
                   "the route gone with its TLS connection")
        # a client checking the certificate against another CA refuses the NameServer
        with pytest.raises(ssl.SSLCertVerificationError):
            _tls(ns.port, client_context(trust_cert_path=pki.other_ca))
        refusals = wait_until(lambda: len(_refusals(caplog)) >= 2 and _refusals(caplog), 10, "two refusals logged")
    assert len(refusals) == 2, refusals  # one line per connection: the plain one, the distrusting client's
    assert all("the TLS handshake failed" in line for line in refusals), refusals


def test_permissive_answers_tls_and_plain_on_one_port(pki):
    with name_server(pki, PERMISSIVE) as ns:
        with _plain(ns.port) as plain:  # a broker registering in plain, routes asked both ways
            got = _call(plain, RequestCode.REGISTER_BROKER, REGISTRATION, BODY)
            assert got is not None and got.code == ResponseCode.SUCCESS
            for i in range(3):
                with _tls(ns.port, client_context(trust_cert_path=pki.ca)) as sock:
                    assert _brokers(_route(sock, "TopicTls", opaque=i)) == {"broker-t": {"0": "127.0.0.1:10911"}}
                with _plain(ns.port) as sock:
                    assert _brokers(_route(sock, "TopicTls", opaque=i)) == {"broker-t": {"0": "127.0.0.1:10911"}}


def test_failed_handshakes_are_logged_within_the_log_budget(pki, caplog):
    """A flood of plain connections to an enforcing port writes at most the NameServer's burst of
    lines (LogLimiter), the rest counted, and the port still serves."""
    caplog.set_level(logging.WARNING, logger="mqstore.namesrv")
    with name_server(pki, ENFORCING) as ns:
        burst = ns.server.log_budget.burst
        for _ in range(burst + 10):
            with _plain(ns.port) as sock:
                assert _route(sock, "T") is None
        wait_until(lambda: ns.call(lambda: ns.server.log_budget.suppressed_total) >= 10, 10,
                   "the lines past the burst counted")
        assert len(_refusals(caplog)) == burst
        with _tls(ns.port, client_context(trust_cert_path=pki.ca)) as sock:
            got = _route(sock, "T")
            assert got is not None and got.code == ResponseCode.TOPIC_NOT_EXIST


def test_a_tls_mode_needs_a_context_and_disabled_none(pki):
    ctx = server_context(ENFORCING, pki.server_cert, pki.server_key)
    assert NameServer(LOOPBACK, 0, tls=ctx).tls_mode == ENFORCING
    assert NameServer(LOOPBACK, 0).tls_mode == DISABLED
    for tls, mode in ((None, ENFORCING), (None, PERMISSIVE), (ctx, DISABLED), (ctx, "strict")):
        with pytest.raises(ValueError, match="tls_mode"):
            NameServer(LOOPBACK, 0, tls=tls, tls_mode=mode)


# == brokers ====================================================================================

@pytest.mark.multiprocess
def test_a_broker_with_tls_enable_registers_with_a_tls_name_server(tmp_path, pki, caplog):
    with name_server(pki, ENFORCING) as ns:
        settings: dict[str, Any] = {"namesrv_addr": f"{LOOPBACK}:{ns.port}", "front_processes": 1,
                                    "tls_enable": True, "tls_client_trust_cert_path": pki.ca}
        with running_broker(str(tmp_path / "s"), **settings) as broker:
            assert broker.controller.registrations >= 1
            with _tls(ns.port, client_context(trust_cert_path=pki.ca)) as sock:
                assert _brokers(_route(sock, "TBW102")) == {"broker-a": {"0": broker.address}}


@pytest.mark.multiprocess
def test_a_broker_that_does_not_trust_the_name_servers_certificate_does_not_register(tmp_path, pki, caplog):
    caplog.set_level(logging.WARNING, logger="mqstore.namesrv")
    with name_server(pki, ENFORCING) as ns:
        settings: dict[str, Any] = {"namesrv_addr": f"{LOOPBACK}:{ns.port}", "front_processes": 1,
                                    "tls_enable": True, "tls_client_trust_cert_path": pki.other_ca}
        with running_broker(str(tmp_path / "s"), **settings) as broker:
            assert broker.controller.registrations == 0
            assert ns.call(lambda: ns.server.routes.route("TBW102")) is None
        why = [r.getMessage() for r in caplog.records if "TLS certificate is not trusted" in r.getMessage()]
        assert why and f"NameServer {LOOPBACK}:{ns.port}" in why[0] and "tls_client_trust_cert_path" in why[0], why
        assert "certificate" in why[0]
        # and the NameServer logged the refused handshake
        assert any("the TLS handshake failed" in line for line in _refusals(caplog))


@pytest.mark.multiprocess
def test_the_embedded_name_server_of_an_enforcing_broker_answers_over_tls(tmp_path, pki):
    settings = {"tls_server_mode": ENFORCING, "tls_server_cert_path": pki.server_cert,
                "tls_server_key_path": pki.server_key, "front_processes": 1}
    with running_broker(str(tmp_path / "s"), **settings) as broker:
        port = int(broker.namesrv_address.rpartition(":")[2])
        assert broker.controller.namesrv is not None and broker.controller.namesrv.server.tls_mode == ENFORCING
        assert broker.controller.registrations >= 1  # its own link to it: a socket pair
        with _tls(port, client_context(trust_cert_path=pki.ca)) as sock:
            assert _brokers(_route(sock, "TBW102")) == {"broker-a": {"0": broker.address}}
        with _plain(port) as sock:
            assert _route(sock, "TBW102") is None


@pytest.mark.multiprocess
def test_the_embedded_name_server_takes_client_certificates_as_the_port_does(tmp_path, pki):
    """tls_server_need_client_auth=require: route queries need a client certificate, and the broker
    still registers with the NameServer it embeds (its link to it presents none)."""
    settings = {"tls_server_mode": ENFORCING, "tls_server_cert_path": pki.server_cert,
                "tls_server_key_path": pki.server_key, "tls_server_need_client_auth": "require",
                "tls_server_trust_cert_path": pki.ca, "front_processes": 1}
    with running_broker(str(tmp_path / "s"), **settings) as broker:
        port = int(broker.namesrv_address.rpartition(":")[2])
        assert broker.controller.registrations >= 1
        with _tls(port, client_context(trust_cert_path=pki.ca, cert_path=pki.client_cert,
                                       key_path=pki.client_key)) as sock:
            assert _brokers(_route(sock, "TBW102")) == {"broker-a": {"0": broker.address}}
        try:
            sock = _tls(port, client_context(trust_cert_path=pki.ca))
        except (ssl.SSLError, ConnectionError):
            return  # refused in the handshake (TLS 1.2)
        with sock:  # TLS 1.3: refused after the client's side of the handshake ended
            assert _route(sock, "TBW102") is None


@pytest.mark.multiprocess
def test_a_name_server_that_closes_each_connection_is_not_asked_in_a_loop(tmp_path, pki, caplog):
    """A NameServer requiring a client certificate the broker does not present: over TLS 1.3 the
    broker's handshake ends and the NameServer closes the connection after it. The broker does
    not register, and does not reconnect at once in a loop (a lost connection that never
    answered held no registration): the next try is the next period."""
    caplog.set_level(logging.WARNING, logger="mqstore.namesrv")
    ctx = server_context(ENFORCING, pki.server_cert, pki.server_key, need_client_auth="require",
                         trust_cert_path=pki.ca)
    ns = NameServerThread(LOOPBACK, 0, tls=ctx)
    ns.start()
    try:
        settings: dict[str, Any] = {"namesrv_addr": f"{LOOPBACK}:{ns.port}", "front_processes": 1,
                                    "tls_enable": True, "tls_client_trust_cert_path": pki.ca}
        with running_broker(str(tmp_path / "s"), **settings) as broker:
            time.sleep(2)
            assert broker.controller.registrations == 0
            assert len(_refusals(caplog)) <= 2, _refusals(caplog)  # the start's registration (and a period's)
        # the registration's, or (when a loaded machine saw the close only as a lost connection
        # then) the unregistration's at the stop
        # (with the hint naming tls_client_cert_path when the close is seen as the TLS refusal it
        # is; a loaded machine may see it only as a lost connection)
        assert any(re.search(r"request 10[34] failed", r.getMessage()) for r in caplog.records), \
            "the broker's log says its registration failed"
    finally:
        ns.close()


# == mqstore namesrv ============================================================================

def _namesrv(*argv: str, **popen: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "mqstore", "namesrv", "--host", LOOPBACK, *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)


def test_mqstore_namesrv_tls_options(pki):
    port = free_port()
    proc = _namesrv("--listen-port", str(port), "--tls-mode", "enforcing", "--tls-cert", pki.server_cert,
                    "--tls-key", pki.server_key)
    try:
        def answer() -> RemotingCommand | None:
            assert proc.poll() is None, proc.communicate()
            try:
                with _tls(port, client_context(trust_cert_path=pki.ca)) as sock:
                    return _route(sock, "T")
            except OSError:
                return None
        assert wait_until(answer, 20, "mqstore namesrv answering over TLS").code == ResponseCode.TOPIC_NOT_EXIST
        with _plain(port) as sock:
            assert _route(sock, "T") is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert f"listening on {LOOPBACK}:{port} (TLS enforcing)" in err
    assert "refusing a connection from" in err and "the TLS handshake failed" in err

    for argv, said in ((["--tls-mode", "permissive", "--tls-cert", pki.server_cert],
                        "mqstore namesrv: --tls-mode permissive needs --tls-key"),
                       (["--tls-mode", "enforcing", "--tls-cert", pki.server_cert, "--tls-key", pki.client_cert],
                        "mqstore namesrv: --tls-cert / --tls-key do not load")):
        proc = _namesrv("--listen-port", "0", *argv)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and len(err.splitlines()) == 1 and err.startswith(said), err
