"""TLS as RocketMQ offers it (TlsSystemConfig, TlsHelper; docs/security.md): the servers' context
from ``tls_server_*``, the clients' from ``tls_client_*`` / ``tls_test_mode_enable``, and the accept
loop every listener of a broker shares, which serves plain and TLS connections on one port in
``permissive`` mode (a TLS ClientHello starts with the record type 0x16; no remoting frame does:
its first byte is the high byte of a length that is at most 16 MiB).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

from mqstore.errors import ConfigError

__all__ = ["DISABLED", "ENFORCING", "PERMISSIVE", "TLS_RECORD_HANDSHAKE", "accept_loop", "client_context",
           "server_context"]

log = logging.getLogger("mqstore.tls")

DISABLED, PERMISSIVE, ENFORCING = "disabled", "permissive", "enforcing"
#: the first byte of a TLS connection (a handshake record)
TLS_RECORD_HANDSHAKE = 0x16
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


def _readable(path: str, key: str) -> str:
    if not path:
        raise ConfigError(f"{key} is empty", hint=f"set {key} to a PEM file (docs/security.md)")
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: {path!r} is not a file", hint=f"set {key} to a PEM file (docs/security.md)")
    return path


def server_context(mode: str, cert_path: str, key_path: str, *, key_password: str = "", need_client_auth: str = "none",
                   trust_cert_path: str = "") -> ssl.SSLContext | None:
    """The context the servers present with (None when mode is disabled): the certificate chain
    and key (tls_server_cert_path / tls_server_key_path, the key's password), and, when
    need_client_auth is optional or require, the CAs client certificates are checked against.
    ConfigError naming the key when a file is missing or does not load."""
    if mode == DISABLED:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(_readable(cert_path, "tls_server_cert_path"), _readable(key_path, "tls_server_key_path"),
                            password=key_password or None)
    except ssl.SSLError as exc:
        raise ConfigError(f"tls_server_cert_path / tls_server_key_path do not load: {exc}",
                          hint="a PEM certificate and its private key (and tls_server_key_password if encrypted)") \
            from None
    ctx.verify_mode = _CLIENT_AUTH[need_client_auth]
    if ctx.verify_mode != ssl.CERT_NONE:
        try:
            ctx.load_verify_locations(_readable(trust_cert_path, "tls_server_trust_cert_path"))
        except ssl.SSLError as exc:
            raise ConfigError(f"tls_server_trust_cert_path does not load: {exc}") from None
    return ctx


def client_context(*, trust_cert_path: str = "", cert_path: str = "", key_path: str = "",
                   test_mode: bool = False) -> ssl.SSLContext:
    """A client's context: the server's certificate checked against trust_cert_path (the system's
    CAs when empty) and its name, unless test_mode (RocketMQ's tls.test.mode.enable: no check);
    cert_path / key_path present a client certificate. ConfigError naming the file that does not load."""
    try:
        return _client_context(trust_cert_path, cert_path, key_path, test_mode)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"the TLS client files do not load ({trust_cert_path or 'system CAs'}, "
                          f"{cert_path or 'no certificate'}): {exc}",
                          hint="check tls_client_trust_cert_path, tls_client_cert_path and tls_client_key_path") from None


def _client_context(trust_cert_path: str, cert_path: str, key_path: str, test_mode: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=trust_cert_path or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if test_mode:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_path:
        ctx.load_cert_chain(cert_path, key_path or None)
    return ctx


def config_server_context(cfg: Any) -> ssl.SSLContext | None:
    """server_context from a StoreConfig's tls_server_* keys."""
    return server_context(cfg.tls_server_mode, cfg.tls_server_cert_path, cfg.tls_server_key_path,
                          key_password=cfg.tls_server_key_password, need_client_auth=cfg.tls_server_need_client_auth,
                          trust_cert_path=cfg.tls_server_trust_cert_path)


def config_client_context(cfg: Any) -> ssl.SSLContext | None:
    """The broker's own connections' context (tls_enable and the tls_client_* keys), or None."""
    if not cfg.tls_enable:
        return None
    return client_context(trust_cert_path=cfg.tls_client_trust_cert_path, cert_path=cfg.tls_client_cert_path,
                          key_path=cfg.tls_client_key_path, test_mode=cfg.tls_test_mode_enable)


async def _first_byte(sock: socket.socket, timeout_s: float) -> int | None:
    """The connection's first byte, left unread (MSG_PEEK); None when it closed or sent nothing in time."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)
    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(ready, timeout_s)
    except asyncio.TimeoutError:
        return None
    finally:
        loop.remove_reader(fd)
    try:
        data = sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return None
    return data[0] if data else None


async def accept_loop(listener: socket.socket, protocol_factory: Callable[[], asyncio.BaseProtocol], mode: str,
                      ctx: ssl.SSLContext | None, *, sniff_timeout_s: float = 10.0, max_pending: int = 1024,
                      on_refused: Callable[[str], None] | None = None) -> None:
    """Accept connections on ``listener`` (non-blocking, listening) until cancelled, each served
    by a protocol of ``protocol_factory``: plain (disabled), TLS (enforcing: the handshake
    first), or either by its first byte (permissive). A connection that sends nothing for
    sniff_timeout_s, or fails its handshake, is closed (``on_refused`` is told why); at most
    max_pending connections wait for their first byte or handshake at once."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    async def serve(sock: socket.socket, address: Any) -> None:
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        use_tls = mode == ENFORCING
        if mode == PERMISSIVE:
            first = await _first_byte(sock, sniff_timeout_s)
            if first is None:
                sock.close()
                return
            use_tls = first == TLS_RECORD_HANDSHAKE
        try:
            await loop.connect_accepted_socket(protocol_factory, sock, ssl=ctx if use_tls else None,
                                               ssl_handshake_timeout=sniff_timeout_s if use_tls else None)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            sock.close()
            if on_refused is not None:
                on_refused(f"{peer}: the TLS handshake failed: {exc}" if use_tls else f"{peer}: {exc}")

    try:
        while True:
            sock, peer = await loop.sock_accept(listener)
            sock.setblocking(False)
            if mode == DISABLED:
                try:
                    await loop.connect_accepted_socket(protocol_factory, sock)
                except OSError:
                    sock.close()
                continue
            if len(pending) >= max_pending:
                sock.close()
                if on_refused is not None:
                    on_refused(f"{peer[0]}:{peer[1]}: {len(pending)} connections already wait for their first bytes")
                continue
            task = loop.create_task(serve(sock, peer))
            pending.add(task)
            task.add_done_callback(pending.discard)
    finally:
        for task in pending:
            task.cancel()
