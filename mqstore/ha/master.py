"""The master's side of replication (docs/rocketmq-remoting-spec.md §4.3, HAService and
HAConnection of RocketMQ 4.9.7): a listener on ``ha_listen_port`` accepting any number of
slaves, and per slave a reader (its 8-byte reports) and a writer (the CommitLog from where the
slave stands, in frames of at most ``ha_transfer_batch_size`` bytes that never cross a file's
end, sent straight from the mapped files; an empty frame after ``ha_send_heartbeat_interval``
of silence).

What the slaves report is published in the control block: ``confirmed`` is the highest
offset a slave reported holding (RocketMQ's push2SlaveMaxOffset), ``ha_slaves`` the slaves
connected, ``ha_report_ms`` when the last report came; each report wakes the SYNC_MASTER puts
waiting (``ControlBlock.ha_broadcast``), and puts wake the writers while slaves are connected
(``wait_ha_data``). ``ha_port`` is the port listened on (``ha_listen_port`` 0 picks one).

With ``inner_secret_key`` set, a connection is a slave only once it has passed the handshake
(``mqstore.ha.auth``: it proves it holds the broker account, and this master proves it too):
until then nothing it sends is read as a report and nothing is sent to it but the challenge; a
connection that fails it, or does not finish it within ``HANDSHAKE_TIMEOUT_S``, is closed with
one log line. Without ``inner_secret_key`` any connection is a slave, as in RocketMQ (a warning
at start says so).

TLS (``tls_server_mode``, the keys of ``mqstore.tls``): enforcing wraps every connection,
permissive tells a TLS slave (its first byte 0x16, a handshake record) from a plain one (an 8-byte
offset report, whose first byte is 0 below 2^56, or silence: a slave with the keys waits for the
challenge, a RocketMQ slave reports 5 s after connecting) by peeking at the first byte, disabled
serves plain connections only. The TLS handshake runs in the connection's reader thread, within
the same ``HANDSHAKE_TIMEOUT_S`` as the HA handshake, which then runs inside TLS. A TLS
connection's reader and writer share one SSL object, which is not safe for two threads at once:
its socket is non-blocking and each SSL read or write holds a lock (never while waiting); the
plain path keeps ``select`` / ``recv_into`` / ``sendmsg`` as they were.

Decided differently from RocketMQ (docs/replication.md): a slave that reports 0 (an empty
log) gets the master's whole log from its first byte still held, where RocketMQ starts it at
the start of the master's last file; and a slave that reports more than the master holds is
sent one empty frame at the master's end before the connection closes, so it can say how many
bytes it holds that the master lost (RocketMQ closes without a word).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import select
import socket
import ssl
import threading
import time
from typing import Any

from mqstore.ha._ha import header, last_report
from mqstore.errors import PortInUseError
from mqstore.layout import log_base, log_of
from mqstore.ha import read_json_object
from mqstore.ha.auth import HANDSHAKE_TIMEOUT_S, HandshakeError, authenticate_slave
from mqstore.log.directory import replace_file
from mqstore.procs import alive
from mqstore.services.base import ServiceThread
from mqstore.tls import DISABLED, PERMISSIVE, TLS_RECORD_HANDSHAKE, config_server_context

__all__ = ["HAConnection", "HAService", "STATUS_FILE", "listen_ha", "read_ha_status", "write_status"]

#: what the HA service (either side) says about itself, in the store directory, about every
#: second (``mqstore node status`` shows it)
STATUS_FILE = "ha.json"


def write_status(root: str | None, status: dict[str, Any]) -> None:
    """Write the status file atomically (a failure is not the service's: it is skipped)."""
    if root is None:
        return
    try:
        replace_file(os.path.join(root, STATUS_FILE), json.dumps(status))
    except OSError:
        pass


def read_ha_status(root: str) -> dict[str, Any] | None:
    """What the store's HA service last wrote about itself (write_status, about every second):
    on a master its port and, per slave, the offset it reported, its lag in bytes and ms and the
    transfer rate; on a slave its master, offset, whether it is connected, the last error, a
    divergence and the last truncation. None when there is no such file, it cannot be read, or
    the process that wrote it is gone (a file left by an HA service that stopped)."""
    status = read_json_object(os.path.join(root, STATUS_FILE))
    if status is None:
        return None
    try:
        pid = int(status.get("pid", 0))
    except (TypeError, ValueError):
        return None
    return status if pid > 0 and alive(pid) else None


log = logging.getLogger("mqstore.ha")

#: how long a writer waits for new data before looking again (RocketMQ: 100 ms)
IDLE_WAIT_MS = 100.0
#: connections in the handshake at once; more are closed at once (each holds a thread for up
#: to HANDSHAKE_TIMEOUT_S)
MAX_PENDING_HANDSHAKES = 32
#: permissive TLS: how long a connection may be silent before it is taken for a plain one (a
#: TLS slave sends its ClientHello as soon as it is connected; a plain slave with the keys waits
#: for the challenge, a RocketMQ slave sends its first report 5 s after connecting)
TLS_SNIFF_S = 1.0
#: TLS: how long the writer waits for room in the socket before it looks again
TLS_WRITE_WAIT_S = 1.0


def listen_ha(host: str, port: int, previous: int = 0) -> socket.socket:
    """The HA port's listening socket on host:port (0: a free one, or ``previous`` when it is
    free again: a restarted HA process takes the port its slaves know); PortInUseError naming
    the port and ``ha_listen_port`` when it is taken."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if port == 0 and previous > 0:
            try:
                server.bind((host, previous))
            except OSError:
                server.bind((host, 0))
        else:
            server.bind((host, port))
        server.listen(64)
    except OSError as exc:
        server.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise PortInUseError.of("HA", host, port, "ha_listen_port", exc) from None
        raise
    return server


class HAConnection:
    """One slave: its socket, the reader thread (the handshake, then the reports) and the
    writer thread (started once the handshake passed)."""

    def __init__(self, service: HAService, sock: socket.socket, peer: str) -> None:
        self.service = service
        self.sock = sock
        self.peer = peer
        self.access_key: str | None = None  # the account it proved holding (None: no handshake)
        self.authenticated = False
        self.tls = False  # whether the connection is TLS (_secure)
        #: TLS: held by each SSL read or write (the reader's and the writer's share one SSL object)
        self._tls_lock = threading.Lock()
        #: the CommitLog this slave follows, named by its first report (an encoded offset: an
        #: empty log k reports log_base(k)); 0 until then (docs/parallel-commitlogs.md)
        self.log = 0
        self.request_offset = -1   # the slave's first report: where the writer starts
        self.ack_offset = -1       # its latest report
        self.sent_upto = -1        # the writer's next byte
        self.started = time.monotonic()
        self.bytes_sent = 0
        self.rate = 0.0  # bytes sent per second over the last status interval (HAService._status_tick)
        self._rate_mark = (0.0, 0)  # (monotonic s, bytes_sent) when rate was last computed
        self._closed = threading.Event()
        self._first_report = threading.Event()
        self.reader = threading.Thread(target=self._read_loop, name=f"mqstore-ha-read-{peer}", daemon=True)
        self.writer = threading.Thread(target=self._write_loop, name=f"mqstore-ha-write-{peer}", daemon=True)

    def start(self) -> None:
        self.reader.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self, why: str = "") -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._first_report.set()
        if why and not self.authenticated:
            log.warning("HA: refused the connection from %s: %s", self.peer, why)
        elif why:
            log.info("HA: closing the connection of slave %s: %s", self.peer, why)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.service.connection_closed(self)

    def _first_byte(self, timeout_s: float) -> bytes | None:
        """The connection's first byte, left unread (MSG_PEEK): b"" when the peer closed, None
        when it sent nothing within timeout_s."""
        ready, _, _ = select.select([self.sock], [], [], max(timeout_s, 0.0))
        if not ready:
            return None
        return self.sock.recv(1, socket.MSG_PEEK)

    def _secure(self) -> bool:
        """TLS per ``tls_server_mode``: wrap the connection (enforcing; permissive when its first
        byte starts a TLS handshake record) and run the TLS handshake, within the handshake's
        time limit from the connection on. False when the connection is closed instead (one log
        line saying why)."""
        service = self.service
        if service.tls_mode == DISABLED:
            return True
        timeout_s = service.handshake_timeout_s
        left = self.started + timeout_s - time.monotonic()
        try:
            first = self._first_byte(min(left, TLS_SNIFF_S) if service.tls_mode == PERMISSIVE else left)
            if service.tls_mode == PERMISSIVE and (first is None or first[:1] != bytes((TLS_RECORD_HANDSHAKE,))):
                return True  # a plain slave: its offset report's first byte is 0 (below 2^56), or silence
            if first is None:
                self.close(f"sent nothing within {timeout_s:g} s: no TLS handshake (a slave without tls_enable, which "
                           "a master with tls_server_mode enforcing does not serve)")
                return False
            if first != bytes((TLS_RECORD_HANDSHAKE,)):
                what = "closed the connection" if not first else "sent bytes that are not TLS"
                self.close(f"{what} before a TLS handshake (a slave without tls_enable, which a master with "
                           "tls_server_mode enforcing does not serve)")
                return False
            assert service.tls_context is not None
            wrapped = service.tls_context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
            self.sock = wrapped
            if self._closed.is_set():  # closed (the service stops) while it was being wrapped
                wrapped.close()
                return False
            wrapped.settimeout(max(self.started + timeout_s - time.monotonic(), 0.001))
            wrapped.do_handshake()
        except TimeoutError:
            self.close(f"did not finish the TLS handshake within {timeout_s:g} s")
            return False
        except (OSError, ValueError) as exc:
            self.close(f"the TLS handshake failed: {exc}")
            return False
        self.tls = True
        return True

    def _handshake(self) -> bool:
        """With inner_secret_key: the slave proves it holds the broker account (mqstore.ha.auth)
        before anything of it counts (inside TLS when the connection is); then it becomes a
        slave of the service, and the writer starts. False when the connection is closed
        instead."""
        service = self.service
        if service.secret_key:
            try:
                self.access_key = authenticate_slave(self.sock, service.config.inner_access_key, service.secret_key,
                                                     service.handshake_timeout_s, started=self.started)
            except HandshakeError as exc:
                self.close(f"it {exc}")
                return False
            except OSError as exc:
                self.close(f"the HA handshake failed: {exc}")
                return False
        if self.tls:
            try:
                self.sock.setblocking(False)  # each SSL read or write under the lock, none waiting in it
            except OSError as exc:
                self.close(f"the connection failed: {exc}")
                return False
        if not service.connection_ready(self):
            self.close()
            return False
        self.writer.start()
        return True

    # -- the slave's reports (ReadSocketService) ---------------------------------------------------
    def _read_loop(self) -> None:
        if not self._secure() or not self._handshake():
            return
        if self.tls:
            self._read_reports(self._tls_readable, self._tls_recv_into)
        else:
            self._read_reports(self._readable, self.sock.recv_into)

    def _readable(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(ready)

    def _tls_readable(self, timeout_s: float) -> bool:
        """Bytes to read: decrypted ones already in the SSL object, which select does not see,
        or new ones on the socket."""
        if self.sock.pending():  # type: ignore[attr-defined]
            return True
        return self._readable(timeout_s)

    def _tls_recv_into(self, view: memoryview) -> int:
        """One SSL read into view under the lock: its byte count (0: the peer closed), -1 when
        no whole TLS record has arrived yet."""
        with self._tls_lock:
            try:
                return self.sock.recv_into(view)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return -1

    def _read_reports(self, readable: Any, recv_into: Any) -> None:
        cfg = self.service.config
        buf = bytearray(1024 * 1024)
        view = memoryview(buf)
        end = 0
        last_read = time.monotonic()
        try:
            while not self._closed.is_set() and not self.service.is_stopped:
                ready = readable(1.0)
                now = time.monotonic()
                if not ready:
                    if (now - last_read) * 1000 > cfg.ha_housekeeping_interval:
                        self.close(f"nothing read for {cfg.ha_housekeeping_interval} ms (ha_housekeeping_interval)")
                    continue
                n = recv_into(view[end:])
                if n < 0:
                    continue
                if n == 0:
                    self.close("the slave closed it")
                    return
                last_read = now
                end += n
                if self.request_offset < 0 and buf[0] == TLS_RECORD_HANDSHAKE:
                    # a ClientHello, not a report (whose first byte is 0 below 2^56: 64 PiB of log)
                    self.close(f"started a TLS handshake, which this master took for a plain connection "
                               f"({self.service.tls_why_plain()})")
                    return
                value, used = last_report(buf, 0, end)
                if value < 0:
                    continue
                buf[:end - used] = buf[used:end]
                end -= used
                if not self._report(value):
                    return
        except (OSError, ValueError) as exc:  # ValueError: select on a socket the writer closed
            self.close(f"read failed: {exc}")

    def _report(self, offset: int) -> bool:
        ctl = self.service.ctl
        if self.request_offset < 0:
            k = log_of(offset)
            if not 0 <= k < self.service.log_count:
                self.close(f"it asks for CommitLog {k} (offset {offset}); this master has {self.service.log_count}")
                return False
            self.log = k
            self.service.count_slaves()
        master_end = ctl.get("wrote", log=self.log)
        if self.request_offset < 0:
            self.request_offset = offset
            log.info("HA: slave %s asks for the CommitLog from offset %d (the master ends at %d)", self.peer, offset,
                     master_end)
            self._first_report.set()
            if offset > master_end:
                return False  # the writer tells the slave where the master ends, then closes
        elif offset > master_end:
            self.close(f"it reports offset {offset}, past the master's end {master_end}")
            return False
        self.ack_offset = offset
        ctl.set("ha_report_ms", time.time_ns() // 1_000_000, log=self.log)
        ctl.advance("confirmed", offset, log=self.log)
        ctl.ha_broadcast(log=self.log)
        return True

    # -- the CommitLog to the slave (WriteSocketService) -------------------------------------------
    def _write_loop(self) -> None:
        service = self.service
        cfg, ctl = service.config, service.ctl
        while not self._first_report.wait(1.0):
            if self._closed.is_set() or service.is_stopped:
                return
        if self._closed.is_set():
            return
        k = self.log
        try:
            master_end = ctl.get("wrote", log=k)
            if self.request_offset > master_end:
                # the slave holds bytes this master does not (it lost them in a crash): say
                # where this log ends, so the slave can report it, and close
                self._send(header(master_end, 0))
                self.close(f"it holds {self.request_offset - master_end} bytes past the master's end {master_end}")
                return
            empty = self.request_offset == log_base(k)  # (RocketMQ: 0, an empty slave)
            self.sent_upto = self.request_offset if not empty else service.first_offset(k)
            log.info("HA: sending the CommitLog to slave %s from offset %d", self.peer, self.sent_upto)
            last_write = time.monotonic()
            heartbeat_s = cfg.ha_send_heartbeat_interval / 1000
            batch = cfg.ha_transfer_batch_size
            while not self._closed.is_set() and not service.is_stopped:
                seq = ctl.ha_data_seq(log=k)
                readable = ctl.get("committed", log=k)
                if self.sent_upto < readable:
                    view = service.log_view(self.sent_upto, min(readable, self.sent_upto + batch))
                    if view is None:
                        self.close(f"the master no longer holds offset {self.sent_upto} (its log starts at "
                                   f"{service.first_offset(k)})")
                        return
                    self._send(header(self.sent_upto, len(view)), view)
                    self.sent_upto += len(view)
                    self.bytes_sent += len(view)
                    last_write = time.monotonic()
                    continue
                if time.monotonic() - last_write >= heartbeat_s:
                    self._send(header(self.sent_upto, 0))
                    last_write = time.monotonic()
                ctl.wait_ha_data(seq, IDLE_WAIT_MS, log=k)
        except OSError as exc:
            self.close(f"write failed: {exc}")

    def _send(self, head: bytes, body: memoryview | None = None) -> None:
        """The header and the body (a view of the mapped file: no copy here), all of it."""
        if self.tls:
            self._send_tls(head, body)
            return
        parts: list[Any] = [head] if body is None else [head, body]
        total = sum(len(p) for p in parts)
        sent = 0
        while sent < total:
            n = self.sock.sendmsg(parts)
            sent += n
            while parts and n >= len(parts[0]):
                n -= len(parts[0])
                parts.pop(0)
            if parts and n:
                parts[0] = memoryview(parts[0])[n:]

    def _send_tls(self, head: bytes, body: memoryview | None) -> None:
        """The header and the body in one SSL write (TLS copies the bytes anyway), under the
        lock; while the socket has no room the lock is left to the reader."""
        data = memoryview(head if body is None else b"".join((head, body)))
        sock = self.sock
        while len(data):
            want_read = False
            with self._tls_lock:
                try:
                    n = sock.send(data)
                except ssl.SSLWantWriteError:
                    n = 0
                except ssl.SSLWantReadError:
                    n, want_read = 0, True
            if n:
                data = data[n:]
                continue
            if self._closed.is_set() or self.service.is_stopped:
                raise OSError("the connection is closed")
            try:
                if want_read:
                    select.select([sock], [], [], TLS_WRITE_WAIT_S)
                else:
                    select.select([], [sock], [], TLS_WRITE_WAIT_S)
            except ValueError:  # the reader closed the socket meanwhile
                raise OSError("the connection is closed") from None

    def status(self) -> dict[str, Any]:
        now_end = self.service.ctl.get("wrote", log=self.log)
        ack = max(self.ack_offset, log_base(self.log))
        out = {"slave": self.peer, "request_offset": self.request_offset, "ack_offset": self.ack_offset,
               "sent_upto": self.sent_upto, "lag_bytes": max(0, now_end - ack),
               "lag_ms": self.service.lag_ms(ack, self.log), "bytes_sent": self.bytes_sent,
               "rate_bytes_per_s": self.rate, "tls": self.tls, "connected_s": round(time.monotonic() - self.started, 1)}
        if self.service.log_count > 1:
            out["log"] = self.log
        return out



class HAService(ServiceThread):
    """The master's HA listener and its slave connections (RocketMQ's HAService.AcceptSocketService).

    ``files`` is a MappedFileQueue of the CommitLog (the node's HA process maps new files as
    the allocator creates them: ``follow``), or a list of them, one per CommitLog of a store
    with several: a slave's connection follows the log its first report names, on that log's
    cells (docs/parallel-commitlogs.md)."""

    channel = None

    def __init__(self, ctl: Any, files: Any, config: Any, *, follow: bool = False, root: str | None = None) -> None:
        super().__init__("ha", ctl)
        self.config = config
        self.root = root
        #: (monotonic s, the master's end) about every second: how long ago the log first held
        #: bytes past what a slave reported (its lag in time)
        self.logs = list(files) if isinstance(files, list) else [files]
        self.log_count = len(self.logs)
        self._ends: list[collections.deque[tuple[float, int]]] = [collections.deque(maxlen=3600) for _ in self.logs]
        self._next_status = 0.0
        self.files = self.logs[0]
        self.follow = follow
        self.connections: list[HAConnection] = []  # the slaves (past the handshake)
        self.pending: list[HAConnection] = []  # connections in the handshake
        self._lock = threading.Lock()
        #: the broker account's secret: with one, every slave must pass the handshake
        self.secret_key: str = config.inner_secret_key
        self.handshake_timeout_s = HANDSHAKE_TIMEOUT_S
        #: TLS on the HA port (tls_server_mode: disabled, permissive, enforcing; mqstore.tls)
        self.tls_mode: str = config.tls_server_mode
        self.tls_context: ssl.SSLContext | None = config_server_context(config)
        host = config.effective_bind_address
        self.server = listen_ha(host, config.ha_listen_port, ctl.get("ha_port"))
        self.port = self.server.getsockname()[1]
        for k in range(self.log_count):
            ctl.set("ha_slaves", 0, log=k)
            ctl.ha_broadcast(log=k)
        ctl.set("ha_port", self.port)
        tls = "" if self.tls_mode == DISABLED else f" (TLS: tls_server_mode {self.tls_mode})"
        if self.secret_key:
            log.info("HA: listening for slaves on %s:%d%s; each must prove it holds the broker account "
                     "(inner_access_key %r)", host, self.port, tls, config.inner_access_key)
        else:
            log.warning("HA: listening for slaves on %s:%d%s, accepting any slave: inner_secret_key is not set, so "
                        "anyone who reaches the port can read the whole CommitLog (and have a SYNC_MASTER's puts "
                        "acknowledged); set inner_access_key and inner_secret_key on master and slaves "
                        "(docs/replication.md)", host, self.port, tls)

    def tls_why_plain(self) -> str:
        """Why a connection was served in plain, in a few words (for a log line)."""
        if self.tls_mode == PERMISSIVE:
            return f"tls_server_mode permissive, and its first bytes came later than {TLS_SNIFF_S:g} s"
        return f"tls_server_mode {self.tls_mode}"

    def lag_ms(self, ack: int, log: int = 0) -> int:
        """How long ago the master's log first ended past `ack` (0 when it does not), to the
        resolution of the samples (about a second)."""
        if self.ctl.get("wrote", log=log) <= ack:
            return 0
        now = time.monotonic()
        first = now
        for t, end in reversed(self._ends[log]):
            if end <= ack:
                break
            first = t
        return int((now - first) * 1000)

    def _status_tick(self) -> None:
        now = time.monotonic()
        if now < self._next_status:
            return
        self._next_status = now + 1.0
        for k, ends in enumerate(self._ends):
            ends.append((now, self.ctl.get("wrote", log=k)))
        with self._lock:
            conns = list(self.connections)
        for c in conns:
            t0, sent0 = c._rate_mark
            c.rate = round((c.bytes_sent - sent0) / (now - t0), 1) if t0 else 0.0
            c._rate_mark = (now, c.bytes_sent)
        write_status(self.root, {"role": "master", "port": self.port, "pid": os.getpid(),
                                 "time_ms": time.time_ns() // 1_000_000, "slaves": [c.status() for c in conns]})

    def run_once(self) -> None:
        self._status_tick()
        ready, _, _ = select.select([self.server], [], [], 0.5)
        if not ready or self.is_stopped:
            return
        accepted = self._accept()
        if accepted is None:
            return
        sock, peer = accepted
        conn = HAConnection(self, sock, peer)
        with self._lock:
            full = len(self.pending) >= MAX_PENDING_HANDSHAKES
            if not full:
                self.pending.append(conn)
        if full:
            conn.close(f"{MAX_PENDING_HANDSHAKES} connections are in the HA handshake already")
            return
        conn.start()

    def _accept(self) -> tuple[socket.socket, str] | None:
        """The next connection to the HA port and its peer's address (the one place a slave's
        connection is accepted); None when the accept failed. It is wrapped in TLS, per
        ``tls_server_mode``, by its own reader thread (HAConnection._secure), so a slow or silent
        TLS client holds that thread, for the handshake's time limit, and never this one."""
        try:
            sock, addr = self.server.accept()
        except OSError:
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, f"{addr[0]}:{addr[1]}"

    def connection_ready(self, conn: HAConnection) -> bool:
        """A connection passed the handshake (or there is none): it is a slave from now on,
        counted in ``ha_slaves``. False when it or the service closed meanwhile."""
        with self._lock:
            if conn.closed or self.is_stopped or conn not in self.pending:
                return False
            self.pending.remove(conn)
            conn.authenticated = True
            self.connections.append(conn)
        self.count_slaves()
        account = f" (access key {conn.access_key!r})" if conn.access_key is not None else ""
        log.info("HA: slave %s connected%s", conn.peer, account)
        return True

    def connection_closed(self, conn: HAConnection) -> None:
        with self._lock:
            if conn in self.pending:
                self.pending.remove(conn)
            if conn in self.connections:
                self.connections.remove(conn)
        self.count_slaves()

    def count_slaves(self) -> None:
        """Publish each log's connected slaves (``ha_slaves``: SYNC_MASTER puts of a log with
        none answer SLAVE_NOT_AVAILABLE) and wake the puts waiting on them."""
        with self._lock:
            counts = [0] * self.log_count
            for conn in self.connections:
                counts[conn.log] += 1
            for k, n in enumerate(counts):
                self.ctl.set("ha_slaves", n, log=k)
        for k in range(self.log_count):
            self.ctl.ha_broadcast(log=k)

    def first_offset(self, log: int = 0) -> int:
        """The first byte of CommitLog log this master still holds."""
        files = self.logs[log]
        if self.follow:
            files.map_new_files()
        first = files.first()
        return first.file_from if first is not None else log_base(log)

    def log_view(self, start: int, end: int) -> memoryview | None:
        """A view of the mapped CommitLog (the one start names) from start up to end, cut at its
        file's end; None when no file holds start (deleted by the cleaner, or not yet mapped)."""
        k = log_of(start)
        if not 0 <= k < self.log_count:
            return None
        files = self.logs[k]
        mf = files.find_mapped_file_by_offset(start)
        if mf is None and self.follow:
            files.map_new_files()
            mf = files.find_mapped_file_by_offset(start)
        if mf is None:
            return None
        pos = start - mf.file_from
        stop = min(end - mf.file_from, mf.file_size)
        return memoryview(mf)[pos:stop]

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [c.status() for c in self.connections]

    def on_shutdown(self) -> None:
        self.server.close()
        with self._lock:
            conns = self.pending + self.connections
        for conn in conns:
            conn.close("the master stops" if conn.authenticated else "")
        for conn in conns:
            for thread in (conn.reader, conn.writer):
                if thread.ident is not None:
                    thread.join(2)
        for k in range(self.log_count):
            self.ctl.set("ha_slaves", 0, log=k)
            self.ctl.ha_broadcast(log=k)
        self.ctl.set("ha_port", 0)
