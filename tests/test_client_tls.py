"""mqstore.client over TLS (the ``tls`` and ``namesrv_tls`` arguments): the blocking SyncProducer
and the asyncio Producer send, and the PullConsumer pulls the same bodies back, through a broker
whose remoting port serves TLS (tls_server_mode enforcing or permissive) registered with a plain
NameServer (a NameServerThread of the test: tls towards the broker, namesrv_tls=False), and with
TLS to the broker's embedded NameServer too when it serves TLS; certificates the test makes
(tests/helpers_tls.py) and clients that check them; the
failures: another CA, a name the certificate does not hold, a plain client against a TLS-only
broker, a missing client certificate; timeouts and close() over TLS sockets (silent TLS servers in
a thread). Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers_broker import LOOPBACK, running_broker
from helpers_tls import Pki, make_pki

from mqstore.remoting._remoting import JSON, RemotingCommand
from mqstore.broker.namesrv import NameServerThread
from mqstore.client import (ConnectFailedError, ConnectionClosedError, MessageQueue, MQClientError, Producer,
                            PullConsumer, PullStatus, RemotingConnection, RemotingConnectionError,
                            RemotingTimeoutError, RequestCode, ResponseCode, SyncProducer)
from mqstore.client.instance import client_tls
from mqstore.client.remoting import tls_context
from mqstore.client.sync import _Connection
from mqstore.tls import client_context, server_context

pytestmark = pytest.mark.multiprocess
_topic_seq = itertools.count()


def new_topic(name: str) -> str:
    return f"Tls{name}_{next(_topic_seq)}"


def run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, 60)
    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def trusting(pki) -> ssl.SSLContext:
    """A client context that checks the broker against the test's CA."""
    return client_context(trust_cert_path=pki.ca)


def tls_settings(pki: Pki, mode: str, **more: str) -> dict[str, str]:
    return {"tls_server_mode": mode, "tls_server_cert_path": pki.server_cert, "tls_server_key_path": pki.server_key,
            **more}


@contextlib.contextmanager
def tls_broker(root: str, pki: Pki, mode: str, host: str = LOOPBACK, **more: Any) -> Iterator[Any]:
    """A broker serving TLS (mode) on host, registered with a plain NameServer on loopback
    (its namesrv_address)."""
    more.setdefault("front_processes", 1)
    ns = NameServerThread(LOOPBACK, 0)
    ns.start()
    try:
        with running_broker(root, bind_address=host, broker_ip1=host,
                            namesrv_addr=f"{LOOPBACK}:{ns.port}", **tls_settings(pki, mode, **more)) as broker:
            assert broker.namesrv_address == f"{LOOPBACK}:{ns.port}" and broker.address.startswith(host + ":")
            yield broker
    finally:
        ns.close()


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory, pki):
    with tls_broker(str(tmp_path_factory.mktemp("tls_enforcing") / "store"), pki, "enforcing") as broker:
        yield broker


def serves_tls(address: str) -> bool:
    """Whether address completes a TLS handshake (no certificate checked)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            client_context(test_mode=True).wrap_socket(sock, server_hostname=host).close()
    except (OSError, ssl.SSLError):
        return False
    return True


async def queues_of(consumer: PullConsumer, topic: str, deadline_s: float = 10.0) -> list[MessageQueue]:
    """The topic's queues, once the NameServer knows the topic a send just created."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await consumer.queues(topic)
        except MQClientError as exc:
            assert exc.code == ResponseCode.TOPIC_NOT_EXIST and time.monotonic() < deadline, exc
            await asyncio.sleep(0.1)


async def pull_bodies(consumer: PullConsumer, topic: str, queue_id: int, count: int) -> list[bytes]:
    mq = next(q for q in await queues_of(consumer, topic) if q.queue_id == queue_id)
    bodies: list[bytes] = []
    offset = 0
    for _ in range(20):
        result = await consumer.pull(mq, offset, suspend_ms=1000)
        assert result.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG), result
        bodies += [m.body for m in result.messages]
        offset = result.next_begin_offset
        if len(bodies) >= count:
            break
    return bodies


def sync_send(namesrv: str, topic: str, bodies: list[bytes], **client) -> None:
    with SyncProducer("PG_tls_sync", namesrv, **client) as producer:
        for body in bodies:
            assert producer.send(topic, body, queue_id=0).queue_id == 0


async def async_send_and_pull(namesrv: str, topic: str, bodies: list[bytes], already: int, **client) -> list[bytes]:
    """bodies sent to queue 0 by a Producer, then the queue's already + len(bodies) messages pulled back."""
    async with Producer("PG_tls", namesrv, **client) as producer:
        for result in await asyncio.gather(*(producer.send(topic, b, queue_id=0) for b in bodies)):
            assert result.queue_id == 0
    async with PullConsumer("CG_tls", namesrv, **client) as consumer:
        return await pull_bodies(consumer, topic, 0, already + len(bodies))


# -- sends and pulls over TLS ------------------------------------------------------------------------
def test_sync_and_asyncio_clients_send_and_pull_over_tls(enforcing, trusting):
    topic = new_topic("RoundTrip")
    sync_bodies = [b"sync %d " % i + bytes(range(256)) * i for i in range(5)]
    sync_send(enforcing.namesrv_address, topic, sync_bodies, tls=trusting, namesrv_tls=False)
    async_bodies = [b"async %d" % i * (i + 1) for i in range(5)] + [b"x" * 200_000]  # many TLS records
    got = run(async_send_and_pull(enforcing.namesrv_address, topic, async_bodies, len(sync_bodies), tls=trusting,
                                  namesrv_tls=False))
    assert got[:len(sync_bodies)] == sync_bodies
    assert sorted(got[len(sync_bodies):]) == sorted(async_bodies)  # sent together: any order


def test_the_connections_to_the_broker_are_tls_and_those_to_the_namesrv_plain(enforcing, trusting):
    topic = new_topic("Which")

    async def go() -> None:
        async with Producer("PG_tls_which", enforcing.namesrv_address, tls=trusting, namesrv_tls=False) as producer:
            await producer.send(topic, b"one")
            conns = producer.client.connections
            ns = conns[enforcing.namesrv_address]
            broker = conns[enforcing.address]
            assert ns._transport is not None and broker._transport is not None
            assert ns.tls is None and ns._transport.get_extra_info("ssl_object") is None
            tls_object = broker._transport.get_extra_info("ssl_object")
            assert broker.tls is trusting and tls_object.version() in ("TLSv1.2", "TLSv1.3")
            assert tls_object.getpeercert()["subject"] == ((("commonName", "mqstore test broker"),),)
    run(go())
    with SyncProducer("PG_tls_which", enforcing.namesrv_address, tls=trusting, namesrv_tls=False) as producer:
        producer.send(topic, b"two")
        assert isinstance(producer._connections[enforcing.address].sock, ssl.SSLSocket)
        assert not isinstance(producer._connections[enforcing.namesrv_address].sock, ssl.SSLSocket)


def test_a_bare_remoting_connection_over_tls(enforcing, trusting):
    async def go() -> None:
        conn = await RemotingConnection.open(enforcing.address, tls=trusting)
        answers = await asyncio.gather(*(conn.request(RemotingCommand(
            RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "TBW102", "queueId": str(i % 4)}), 5) for i in range(50)))
        assert {a.code for a in answers} == {ResponseCode.SUCCESS}
        conn.close()
        await conn.wait_closed()
    run(go())


def test_tls_to_the_embedded_namesrv_too(tmp_path, pki, trusting):
    """A broker's embedded NameServer serves TLS as its remoting port does: one tls argument for both."""
    with running_broker(str(tmp_path / "s"), front_processes=1, **tls_settings(pki, "enforcing")) as broker:
        if not serves_tls(broker.namesrv_address):
            pytest.skip("this broker's embedded NameServer serves plain TCP")
        topic = new_topic("AllTls")
        sync_send(broker.namesrv_address, topic, [b"sync"], tls=trusting)
        assert run(async_send_and_pull(broker.namesrv_address, topic, [b"async"], 1, tls=trusting)) == [b"sync",
                                                                                                       b"async"]
        with pytest.raises(ConnectFailedError, match="no NameServer answered .*serves TLS only"):
            sync_send(broker.namesrv_address, topic, [b"never"], tls=trusting, namesrv_tls=False)


# -- failures: the certificate, the name, a plain client ---------------------------------------------
def test_a_client_trusting_another_ca_refuses_the_broker(enforcing, pki):
    other = client_context(trust_cert_path=pki.other_ca)
    with pytest.raises(ConnectFailedError) as sync_err:
        sync_send(enforcing.namesrv_address, new_topic("OtherCa"), [b"never"], tls=other, namesrv_tls=False)

    async def go() -> None:
        async with Producer("PG_tls_other", enforcing.namesrv_address, tls=other, namesrv_tls=False) as producer:
            await producer.send(new_topic("OtherCa"), b"never")
    with pytest.raises(ConnectFailedError) as async_err:
        run(go())
    for err in (sync_err.value, async_err.value):
        assert err.address == enforcing.address
        message = str(err)
        assert enforcing.address in message and "TLS handshake failed" in message, message
        assert "certificate" in message and "unable to get local issuer certificate" in message, message


def test_tls_true_checks_against_the_systems_cas(enforcing):
    """The test CA is in no system store: tls=True refuses the test's broker."""
    with pytest.raises(ConnectFailedError, match="TLS handshake failed: the server's certificate was refused"):
        sync_send(enforcing.namesrv_address, new_topic("System"), [b"never"], tls=True, namesrv_tls=False)


def test_a_name_the_certificate_does_not_hold_is_refused(tmp_path, pki, trusting):
    """The broker listens on 127.0.0.2 (loopback too), which its certificate does not name."""
    with tls_broker(str(tmp_path / "s"), pki, "enforcing", host="127.0.0.2") as broker:
        with pytest.raises(ConnectFailedError, match="IP address mismatch") as err:
            sync_send(broker.namesrv_address, new_topic("Name"), [b"never"], tls=trusting, namesrv_tls=False)
        assert broker.address in str(err.value)
        with pytest.raises(ConnectFailedError, match="IP address mismatch"):
            run(RemotingConnection.open(broker.address, tls=trusting))
        # without the name check (RocketMQ's tls.test.mode.enable) it is served
        sync_send(broker.namesrv_address, new_topic("Name"), [b"test mode"],
                  tls=client_context(test_mode=True), namesrv_tls=False)


def test_a_plain_client_against_an_enforcing_broker_fails_within_its_timeout(enforcing):
    started = time.monotonic()
    with pytest.raises(ConnectionClosedError) as sync_err:
        sync_send(enforcing.namesrv_address, new_topic("Plain"), [b"never"], timeout=5)

    async def go() -> None:
        async with Producer("PG_tls_plain", enforcing.namesrv_address, timeout=5) as producer:
            await producer.send(new_topic("Plain"), b"never")
    with pytest.raises(ConnectionClosedError) as async_err:
        run(go())
    assert time.monotonic() - started < 5  # the broker closes at once: no timeout waited for
    for err in (sync_err.value, async_err.value):
        assert err.address == enforcing.address
        assert "closed by the peer" in str(err) and "serves TLS only" in str(err), str(err)


# -- permissive: plain and TLS on one port -----------------------------------------------------------
def test_permissive_serves_plain_and_tls_clients(tmp_path, pki, trusting):
    with tls_broker(str(tmp_path / "s"), pki, "permissive", front_processes=2) as broker:
        topic = new_topic("Permissive")
        sync_send(broker.namesrv_address, topic, [b"sync plain"])
        sync_send(broker.namesrv_address, topic, [b"sync tls"], tls=trusting, namesrv_tls=False)
        got = run(async_send_and_pull(broker.namesrv_address, topic, [b"async tls"], 2, tls=trusting,
                                      namesrv_tls=False))
        assert got == [b"sync plain", b"sync tls", b"async tls"]
        got = run(async_send_and_pull(broker.namesrv_address, topic, [b"async plain"], 3))
        assert got == [b"sync plain", b"sync tls", b"async tls", b"async plain"]


# -- client certificates -----------------------------------------------------------------------------
def test_client_certificates_when_the_broker_requires_them(tmp_path, pki, trusting):
    with tls_broker(str(tmp_path / "s"), pki, "enforcing", tls_server_need_client_auth="require",
                    tls_server_trust_cert_path=pki.ca) as broker:
        topic = new_topic("ClientCert")
        with_cert = client_context(trust_cert_path=pki.ca, cert_path=pki.client_cert, key_path=pki.client_key)
        sync_send(broker.namesrv_address, topic, [b"sync"], tls=with_cert, namesrv_tls=False)
        got = run(async_send_and_pull(broker.namesrv_address, topic, [b"async"], 1, tls=with_cert,
                                      namesrv_tls=False))
        assert got == [b"sync", b"async"]
        # without one: refused in the handshake (TLS 1.2), or at the first read (TLS 1.3's alert)
        with pytest.raises(RemotingConnectionError, match="(?i)certificate") as sync_err:
            sync_send(broker.namesrv_address, topic, [b"never"], tls=trusting, namesrv_tls=False, timeout=5)

        async def go() -> None:
            async with Producer("PG_tls_nocert", broker.namesrv_address, tls=trusting, namesrv_tls=False,
                                timeout=5) as producer:
                await producer.send(topic, b"never")
        with pytest.raises(RemotingConnectionError, match="(?i)certificate") as async_err:
            run(go())
        for err in (sync_err.value, async_err.value):
            assert err.address == broker.address, err


# -- timeouts and close over TLS sockets (a TLS server in a thread that never answers) --------------
@contextlib.contextmanager
def silent_tls_server(pki: Pki, first_bytes: bytes = b"") -> Iterator[str]:
    """A TLS server on loopback that completes handshakes, sends first_bytes, and answers nothing
    more; its address."""
    ctx = server_context("enforcing", pki.server_cert, pki.server_key)
    assert ctx is not None
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(5)
            try:
                tls = ctx.wrap_socket(sock, server_side=True)
                if first_bytes:
                    tls.recv(65536)
                    tls.sendall(first_bytes)
            except OSError:
                sock.close()
                continue
            held.append(tls)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{LOOPBACK}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for sock in held:
            sock.close()


@pytest.mark.parametrize("first_bytes", [b"", b"\x00\x00\x01\x00\x00\x00"], ids=["nothing", "a partial frame"])
def test_sync_timeouts_over_tls_are_remoting_timeouts(pki, trusting, first_bytes):
    with silent_tls_server(pki, first_bytes) as address:
        conn = _Connection(address, None, trusting)
        started = time.monotonic()
        with pytest.raises(RemotingTimeoutError, match="no response from") as err:
            conn.exchange(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "T", "queueId": "0"}),
                          0.5, JSON)
        assert 0.4 < time.monotonic() - started < 3
        assert err.value.address == address and conn.sock is None


def test_asyncio_timeouts_over_tls(pki, trusting):
    async def go() -> None:
        conn = await RemotingConnection.open(address, tls=trusting)
        with pytest.raises(RemotingTimeoutError):
            await conn.request(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "T", "queueId": "0"}),
                               0.3)
        conn.close()
        await conn.wait_closed(1)
    with silent_tls_server(pki) as address:
        run(go())


def test_close_wakes_a_send_waiting_on_a_tls_socket(pki, trusting):
    with silent_tls_server(pki) as address:
        producer = SyncProducer("PG_tls_close", address, tls=trusting, timeout=20).start()
        errors: list[BaseException] = []

        def send() -> None:
            try:
                producer.send("TopicNever", b"x")
            except BaseException as exc:
                errors.append(exc)
        thread = threading.Thread(target=send)
        thread.start()
        time.sleep(0.5)
        started = time.monotonic()
        producer.close()
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - started < 5
        assert len(errors) == 1 and isinstance(errors[0], ConnectFailedError), errors
        assert "was closed by the client" in str(errors[0])


def test_a_handshake_with_no_answer_is_bounded_by_the_timeout():
    """A server that accepts and never speaks TLS: the handshake fails within the timeout."""
    with socket.create_server((LOOPBACK, 0)) as listener:
        address = f"{LOOPBACK}:{listener.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ConnectFailedError, match="TLS handshake"):
            _Connection(address, None, client_context()).connect(0.5)
        with pytest.raises(ConnectFailedError, match="TLS handshake"):
            run(RemotingConnection.open(address, connect_timeout=0.5, tls=True))
        assert time.monotonic() - started < 3


# -- the arguments -----------------------------------------------------------------------------------
def test_the_tls_arguments(trusting):
    assert tls_context(None) is None and tls_context(False) is None
    assert tls_context(trusting) is trusting
    default = tls_context(True)
    assert default is not None and default.check_hostname and default.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ValueError, match="a server's context"):
        tls_context(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    with pytest.raises(ValueError, match="namesrv_tls must be None, True, False or an ssl.SSLContext"):
        client_tls(None, "yes")  # type: ignore[arg-type]
    assert client_tls(trusting, None) == (trusting, trusting)  # the NameServers as the brokers
    assert client_tls(trusting, False) == (trusting, None)
    assert client_tls(None, trusting) == (None, trusting)
    producer = Producer("PG", "127.0.0.1:9876;127.0.0.1:9877", tls=trusting, namesrv_tls=False)
    assert (producer.client.tls, producer.client.namesrv_tls) == (trusting, None)
    consumer = PullConsumer("CG", "127.0.0.1:9876", tls=trusting)
    assert (consumer.client.tls, consumer.client.namesrv_tls) == (trusting, trusting)
    sync = SyncProducer("PG", "127.0.0.1:9876", tls=trusting, namesrv_tls=False)
    assert sync._connection("127.0.0.1:9876").tls is None and sync._connection("127.0.0.1:10911").tls is trusting
    with pytest.raises(ValueError, match="tls must be"):
        SyncProducer("PG", "127.0.0.1:9876", tls="on")  # type: ignore[arg-type]
