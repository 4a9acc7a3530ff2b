"""TLS on the broker's remoting port (tls_server_mode, docs/security.md), with certificates the
test makes and clients that check them."""

from __future__ import annotations

import socket
import ssl

import pytest
from helpers_broker import LOOPBACK, running_broker
from helpers_tls import Pki, exchange, make_pki

from mqstore.remoting._remoting import RemotingCommand
from mqstore.errors import ConfigError
from mqstore.protocol import RequestCode, ResponseCode
from mqstore.tls import client_context

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_settings(pki: Pki, mode: str, **more: str) -> dict[str, str]:
    return {"tls_server_mode": mode, "tls_server_cert_path": pki.server_cert, "tls_server_key_path": pki.server_key,
            **more}


def _ask(sock: socket.socket, opaque: int = 1) -> RemotingCommand | None:
    """GET_MAX_OFFSET over sock; its answer, or None when the broker closed the connection."""
    return exchange(sock, RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=opaque,
                                          ext_fields={"topic": "TBW102", "queueId": "0"}))


def _plain(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _tls(address: str, ctx: ssl.SSLContext, server_name: str = LOOPBACK) -> ssl.SSLSocket:
    return ctx.wrap_socket(_plain(address), server_hostname=server_name)


def test_enforcing_serves_tls_and_closes_plain_connections(tmp_path, pki):
    with running_broker(str(tmp_path / "s"), front_processes=1, **_tls_settings(pki, "enforcing")) as broker:
        with _tls(broker.address, client_context(trust_cert_path=pki.ca)) as sock:
            answer = _ask(sock)
            assert answer is not None and answer.code == ResponseCode.SUCCESS
            assert sock.version() in ("TLSv1.2", "TLSv1.3")
        with _plain(broker.address) as sock:
            assert _ask(sock) is None
        # a client that checks the certificate against another CA refuses the broker
        with pytest.raises(ssl.SSLCertVerificationError):
            _tls(broker.address, client_context(trust_cert_path=pki.other_ca))


def test_permissive_serves_tls_and_plain_on_one_port(tmp_path, pki):
    with running_broker(str(tmp_path / "s"), front_processes=2, **_tls_settings(pki, "permissive")) as broker:
        for i in range(6):  # both kinds, on both fronts
            with _tls(broker.address, client_context(trust_cert_path=pki.ca)) as sock:
                answer = _ask(sock, opaque=i)
                assert answer is not None and answer.opaque == i
            with _plain(broker.address) as sock:
                answer = _ask(sock, opaque=100 + i)
                assert answer is not None and answer.opaque == 100 + i


def test_client_certificates_when_required(tmp_path, pki):
    settings = _tls_settings(pki, "enforcing", tls_server_need_client_auth="require",
                             tls_server_trust_cert_path=pki.ca)
    with running_broker(str(tmp_path / "s"), front_processes=1, **settings) as broker:
        with _tls(broker.address, client_context(trust_cert_path=pki.ca, cert_path=pki.client_cert,
                                                 key_path=pki.client_key)) as sock:
            assert _ask(sock) is not None
        try:
            sock = _tls(broker.address, client_context(trust_cert_path=pki.ca))
        except (ssl.SSLError, ConnectionError):
            return  # refused in the handshake (TLS 1.2)
        with sock:  # TLS 1.3: the server refuses after the client's side of the handshake ended
            assert _ask(sock) is None


def test_a_tls_setting_that_does_not_load_stops_the_start_naming_the_key(tmp_path, pki):
    with pytest.raises(ConfigError, match="tls_server_cert_path"):
        with running_broker(str(tmp_path / "s"), tls_server_mode="enforcing", tls_server_key_path=pki.server_key):
            pass
    with pytest.raises(ConfigError, match="tls_server_cert_path / tls_server_key_path do not load"):
        with running_broker(str(tmp_path / "s"), **_tls_settings(pki, "enforcing", tls_server_key_path=pki.client_key)):
            pass
