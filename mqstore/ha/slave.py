"""The slave's side of replication (docs/rocketmq-remoting-spec.md §4.3, RocketMQ's
HAService.HAClient): connect to the master's HA service at ``ha_master_address``, report this
log's end, append every frame the master sends to this store's CommitLog at the same offsets
(``CommitLogAppender.append_data``: the bytes go from the socket buffer into the mapped file,
nothing per record in Python), report the new end after each frame and every
``ha_send_heartbeat_interval``; the store's own dispatcher builds the ConsumeQueues and the
index from what arrives, and its flusher flushes it by its own flush settings.

A dropped connection is retried with a back-off (0.1 s doubling to 5 s; RocketMQ retries
every 5 s), as is a master that cannot be reached; a connection silent for
``ha_housekeeping_interval`` is dropped. Decided differently from RocketMQ
(docs/replication.md): the first report goes out at once (RocketMQ's goes 5 s after connecting);
and when the master says its log ends before this one's (an empty frame below this end, sent by
an mqstore master before it closes), this log holds bytes the master lost: the slave asks its
owner to cut its log back to the master's end (``mqstore.ha.request_truncation``; RocketMQ 5's
truncateFiles), says how much that drops, and follows the master from there. In a store's
threads the owner truncates at once (``truncate``, a callable of the owner); a node's HA process
exits with ``TRUNCATE_EXIT`` and its owner truncates with the other service processes stopped.

With ``inner_secret_key`` the slave takes part in the handshake (``mqstore.ha.auth``) before its
first report: it proves it holds the broker account and follows only a master that proves the
same, so nothing from an impostor (or from a master without the secret) is appended. Without
one it reports at once, as RocketMQ's slave; a master that asks for the handshake is then named
in one error saying which keys to set.

With ``tls_enable`` the connection is TLS, the master's certificate checked per the client keys
(``tls_client_trust_cert_path``, ``tls_test_mode_enable``; a client certificate from
``tls_client_cert_path``), the TLS handshake within ``HANDSHAKE_TIMEOUT_S``; the handshake above
runs inside it. Bytes TLS has decrypted and holds are not seen by ``select``, so the loop asks
the SSL object (``pending``) first; its reads wait at most ``TLS_READ_WAIT_S`` for the rest of a
record.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from mqstore.ha._ha import SlaveReader, report
from mqstore.layout import file_start_of, log_base, log_of
from mqstore.ha import TRUNCATE_EXIT, read_ha_master, read_truncation, request_truncation
from mqstore.ha.auth import HANDSHAKE_TIMEOUT_S, MAGIC, HandshakeError, authenticate_master
from mqstore.ha.master import write_status
from mqstore.services.base import ServiceThread
from mqstore.tls import config_client_context

__all__ = ["HAClient"]

log = logging.getLogger("mqstore.ha")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
#: the first read of a connection without the handshake: enough to tell a frame from a challenge
FIRST_READ_BYTES = 64 * 1024
#: TLS: the longest a read waits for the rest of a record (or a report for room) before the loop
#: goes round again (a plain socket is read only when select says it has bytes)
TLS_READ_WAIT_S = 1.0


class HAClient(ServiceThread):
    """The slave's replication loop over ``commitlog`` (a CommitLog with its appender)."""

    channel = None

    def __init__(self, ctl: Any, commitlog: Any, config: Any, master_address: str | None = None,
                 root: str | None = None, truncate: Callable[[], Any] | None = None) -> None:
        #: the CommitLog this client replicates (one client per log of a store with several, each
        #: on its own connection, reporting that log's encoded end: docs/parallel-commitlogs.md)
        self.log = commitlog.log_id
        super().__init__("haclient" if not self.log else f"haclient-{self.log}", ctl)
        self.root = root
        self.truncate = truncate
        #: every client of the store (set by the registry with several CommitLogs): log 0's writes
        #: the status file for all of them
        self.peers: list[HAClient] = [self]
        self.commitlog = commitlog
        self.appender = commitlog.appender
        self.config = config
        self.master_address = master_address if master_address is not None else config.ha_master_address
        self.sock: socket.socket | None = None
        self.reader = SlaveReader()
        self.backoff_s = BACKOFF_FIRST_S
        self.connects = 0
        self.frames = 0
        self.bytes_received = 0
        self.last_error: str | None = None
        self.diverged: str | None = None
        self._last_report = 0.0
        self._last_read = 0.0
        self._reported = -1
        self._next_status = 0.0
        #: the broker account's secret: with one, the master must pass the handshake
        self.secret_key: str = config.inner_secret_key
        self.handshake_timeout_s = HANDSHAKE_TIMEOUT_S
        self._first_read = False  # the connection's first read is still to come (no handshake)
        #: TLS to the master (tls_enable and the tls_client_* keys), or None: plain
        self.tls_context: ssl.SSLContext | None = config_client_context(config)

    # -- the connection ----------------------------------------------------------------------------
    def _open(self) -> socket.socket:
        """A connection to the master's HA port (the one place the slave connects), TLS with
        tls_enable (the handshake done, the master's certificate checked)."""
        host, _, port = self.master_address.rpartition(":")
        host = host.strip("[]")
        sock = socket.create_connection((host, int(port)), timeout=3.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls_context is None:
            return sock
        sock.settimeout(self.handshake_timeout_s)
        try:
            return self.tls_context.wrap_socket(sock, server_hostname=host)  # closes sock when it fails
        except TimeoutError:
            raise TimeoutError(f"no TLS handshake within {self.handshake_timeout_s:g} s") from None

    def _connect(self) -> bool:
        try:
            sock = self._open()
        except ssl.SSLCertVerificationError as exc:
            self._failed(f"the master at {self.master_address} presents a certificate this slave does not trust: "
                         f"{exc.verify_message} (tls_client_trust_cert_path)")
            return False
        except ssl.SSLError as exc:
            hint = " (it does not speak TLS: is its tls_server_mode disabled?)" \
                if exc.reason == "WRONG_VERSION_NUMBER" else ""
            self._failed(f"the TLS handshake with the master at {self.master_address} failed: {exc}{hint}")
            return False
        except (OSError, ValueError) as exc:
            self._failed(f"cannot connect to the master's HA service at {self.master_address}: {exc}")
            return False
        self.sock = sock
        if self.secret_key:
            try:
                authenticate_master(sock, self.config.inner_access_key, self.secret_key, self.handshake_timeout_s)
            except HandshakeError as exc:
                self._failed(f"the master at {self.master_address} {exc}")
                return False
            except (OSError, ValueError) as exc:
                self._failed(f"the HA handshake with the master at {self.master_address} failed: {exc}")
                return False
        sock.settimeout(TLS_READ_WAIT_S if self.tls_context is not None else None)
        self._first_read = not self.secret_key
        self.reader = SlaveReader()
        self.connects += 1
        self._last_read = time.monotonic()
        log.info("HA: connected to master %s; this log ends at %d", self.master_address,
                 self.ctl.get("wrote", log=self.log))
        self._report_end(force=True)
        return True

    def _failed(self, why: str) -> None:
        if why != self.last_error:
            log.warning("HA: %s; retrying in %.1f s", why, self.backoff_s)
        self.last_error = why
        self._close()
        self.sleep(self.backoff_s * 1000)
        self.backoff_s = min(BACKOFF_MAX_S, self.backoff_s * 2)

    def _close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def _report_end(self, force: bool = False) -> None:
        assert self.sock is not None
        end = self.ctl.get("wrote", log=self.log)
        now = time.monotonic()
        if force or end != self._reported or (now - self._last_report) * 1000 >= self.config.ha_send_heartbeat_interval:
            self.sock.sendall(report(end))
            self._reported = end
            self._last_report = now

    # -- the loop ----------------------------------------------------------------------------------
    def run_once(self) -> None:
        now = time.monotonic()
        if now >= self._next_status and self.log == 0:
            self._next_status = now + 1.0
            several = {"logs": [peer.status() for peer in self.peers]} if len(self.peers) > 1 else {}
            write_status(self.root, {"role": "slave", "pid": os.getpid(), "time_ms": time.time_ns() // 1_000_000,
                                     **self.status(), **several})
        if self.diverged is not None:
            self.sleep(1000)
            return
        if not self.config.ha_master_address and self.root is not None and self.sock is None:
            self.master_address = read_ha_master(self.root)  # learned by the broker from its NameServer
        if not self.master_address:
            self.sleep(500)
            return
        if self.sock is None and not self._connect():
            return
        sock = self.sock
        if sock is None:
            return
        try:
            if self.tls_context is not None and sock.pending():  # type: ignore[attr-defined]
                ready = [sock]  # decrypted bytes the SSL object holds: select does not see them
            else:
                ready, _, _ = select.select([sock], [], [], 0.5)
            now = time.monotonic()
            if ready:
                try:
                    n = self._first_recv(sock) if self._first_read else self.reader.recv_into(sock)
                except TimeoutError:  # TLS: only part of a record arrived within TLS_READ_WAIT_S
                    n = -1
                if n < 0:
                    return
                if n == 0:
                    self._failed(f"the master {self.master_address} closed the connection")
                    return
                self._last_read = now
                self.bytes_received += n
                self._apply()
            elif (now - self._last_read) * 1000 > self.config.ha_housekeeping_interval:
                self._failed(f"nothing from the master for {self.config.ha_housekeeping_interval} ms "
                             "(ha_housekeeping_interval)")
                return
            if self.sock is not None:
                self._report_end()
        except (OSError, ValueError) as exc:
            self._failed(f"replication from {self.master_address} failed: {exc}")

    def _first_recv(self, sock: socket.socket) -> int:
        """The first read of a connection without the handshake: a master that sends its
        challenge wants one, which this slave cannot do without the keys (-1: the connection
        is dropped, saying so); anything else goes to the reader as received."""
        data = sock.recv(FIRST_READ_BYTES)
        self._first_read = False
        if data and MAGIC.startswith(data[:len(MAGIC)]):
            self._failed(f"the master at {self.master_address} asks for the HA handshake: set inner_access_key and "
                         "inner_secret_key (the broker account) on this slave as on the master")
            return -1
        self.reader.feed(data)
        return len(data)

    def _apply(self) -> None:
        while self.sock is not None:
            frame = self.reader.next()
            if frame is None:
                return
            phy, body = frame
            end = self.ctl.get("wrote", log=self.log)
            if len(body) == 0:
                if phy < end:
                    self._diverge(phy, end)
                continue  # a heartbeat
            if phy != end:
                base = log_base(self.log)
                if not (end == base and self.ctl.get("min_phy", log=self.log) == base and log_of(phy) == self.log
                        and file_start_of(phy, self.commitlog.file_size) == phy):
                    raise ValueError(f"the master sent bytes from offset {phy}, but this log ends at {end}")
                self._start_log_at(phy)
            self.appender.append_data(phy, body)
            self.frames += 1
            self.backoff_s = BACKOFF_FIRST_S
            self.last_error = None
            self._report_end(force=True)

    def _start_log_at(self, phy: int) -> None:
        """An empty slave whose master no longer holds offset 0 (its cleaner deleted the first
        files) gets the log from a file start: this log starts there, as RocketMQ's slave
        creates its first file at the master's offset."""
        log.info("HA: the master's log starts at %d: this empty log starts there too", phy)
        for name in ("min_phy", "dispatched", "confirmed", "flushed", "committed", "wrote"):
            self.ctl.set(name, phy, log=self.log)  # type: ignore[arg-type]

    def _diverge(self, master_end: int, end: int) -> None:
        """The master's log ends at master_end, before this one's end: cut this log back there."""
        self.diverged = (f"this slave's CommitLog ends at {end}, the master's at {master_end}: the slave holds "
                         f"{end - master_end} bytes the master does not (it lost them in a crash)")
        self._close()
        if self.root is None:
            log.error("HA: %s; replication stopped", self.diverged)
            return
        log.error("HA: %s; truncating this log to %d", self.diverged, master_end)
        request_truncation(self.root, master_end, end, self.master_address)
        if self.truncate is None:  # a node's HA process: the owner truncates, then starts it again
            self.exit_code = TRUNCATE_EXIT
            self._stopped.set()
            return
        self.truncate()
        self.diverged = None
        self.backoff_s = BACKOFF_FIRST_S

    def status(self) -> dict[str, Any]:
        return {"master": self.master_address, "connected": self.sock is not None, "tls": self.tls_context is not None,
                "offset": self.ctl.get("wrote", log=self.log),
                "connects": self.connects, "frames": self.frames, "bytes_received": self.bytes_received,
                "last_error": self.last_error, "diverged": self.diverged, "truncated": read_truncation(self.root)}

    def on_shutdown(self) -> None:
        self._close()
        dropped = self.appender.drop_partial_tail()
        if dropped:
            log.info("HA: dropped the %d bytes of a record the master had not finished sending; they are asked "
                     "for again at the next connection", dropped)
