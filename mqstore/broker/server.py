"""A broker: the node (a store whose allocator, flusher, dispatcher and cleaner are supervised
processes) plus the remoting front (docs/rocketmq-remoting-spec.md): ``front_processes`` front
processes accepting clients on ``listen_port`` (one listening socket, inherited), the controller in this process
(``controller``), and, when ``namesrv_addr`` is empty, an embedded NameServer, so one command (or
one ``Broker(...)``) is a working cluster of one.

    with Broker("/data/store", listen_port=0, namesrv_listen_port=0) as broker:
        print(broker.address, broker.namesrv_address)

The store's ``store_host`` is ``broker_ip1:listen_port`` (what records carry as STOREHOSTADDRESS
and offset msgIds encode). The owner listens on ``listen_port`` (``effective_bind_address``:
loopback unless told otherwise, docs/security.md) for the broker's life and every front accepts
on that one socket, so restarted fronts serve the same port and no other process can share it;
with ``listen_port=0`` it is a free port.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import os
import socket
import sys
import threading
from concurrent.futures import Future
from typing import Any

from mqstore.broker.controller import BrokerController
from mqstore.broker.limits import connection_table
from mqstore.broker.link import link_address
from mqstore.config import StoreConfig
from mqstore.acl.plain import AclConfigError, load_acl
from mqstore.errors import ConfigError, PortInUseError
from mqstore.log.directory import check_store_dir
from mqstore.node.supervisor import Supervisor
from mqstore.roles import BrokerRole
from mqstore.store import MessageStore
from mqstore.tls import config_client_context, config_server_context

__all__ = ["Broker", "FrontSupervisor", "front_count", "listen"]

log = logging.getLogger("mqstore.broker")

_FRONT_ENTRY = "import sys; from mqstore.broker.front import main; sys.exit(main(sys.argv[1:]))"
START_TIMEOUT_S = 30.0


def front_count(setting: int) -> int:
    """front_processes: 0 means one per CPU, at most 4."""
    return setting if setting > 0 else max(1, min(4, os.cpu_count() or 1))


class FrontSupervisor(Supervisor):
    """The node's supervisor, running front processes (``front0``, ``front1``, ...), each given
    the broker's listening socket (``listener``: its file descriptor, inherited) and its
    connection table (``connections_fd``: ``mqstore.broker.limits.connection_table``, where the
    fronts count their connections against the broker's caps; front i owns array i)."""

    def __init__(self, root: str, count: int, listener: socket.socket, address: str, connections_fd: int, *,
                 log_dir: str | None = None) -> None:
        super().__init__(root, tuple(f"front{i}" for i in range(count)), log_dir=log_dir)
        self.listener = listener
        self.port = listener.getsockname()[1]
        self.address = address
        self.connections_fd = connections_fd

    def argv(self, kind: str) -> list[str]:
        return [sys.executable, "-c", _FRONT_ENTRY, self.root, kind.removeprefix("front"), str(self.port),
                self.address.replace("\0", "\\0"), str(self.listener.fileno()), str(self.connections_fd)]

    def pass_fds(self, kind: str) -> tuple[int, ...]:
        return (self.listener.fileno(), self.connections_fd)


async def _cancel_other_tasks() -> None:
    """Cancel every task of the running loop but this one and wait for them (connection handlers
    close their transports while the loop still runs; asyncio's Server.wait_closed does not wait
    for them before Python 3.12)."""
    loop = asyncio.get_running_loop()

    def quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # 3.11's StreamReaderProtocol asks a cancelled handler task for its exception and logs
        # the CancelledError that raises; nothing failed
        if not isinstance(context.get("exception"), asyncio.CancelledError):
            loop.default_exception_handler(context)

    loop.set_exception_handler(quiet)
    me = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not me]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def listen(host: str, port: int, setting: str = "listen_port", what: str = "broker") -> socket.socket:
    """The broker's listening socket on host:port, made once by the owner and inherited by every
    front process (they all accept on it). No SO_REUSEPORT: the kernel then refuses the port to
    any other socket, so a second broker (or anything else) cannot take a share of the clients;
    PortInUseError naming the port and its setting when it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart over TIME_WAIT, as Netty
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise PortInUseError.of(what, host, port, setting, exc) from None
        raise
    return sock


class Broker:
    """The broker on a store directory: open, serving, until ``shutdown()``."""

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None, **overrides: Any) -> None:
        cfg = (config or StoreConfig()).replace(**overrides) if overrides else (config or StoreConfig())
        if "service_mode" not in overrides and (config is None or "service_mode" not in config._explicit):
            cfg = cfg.replace(service_mode="processes")  # a broker is a node unless told otherwise
        cfg.validate()
        check_store_dir(os.path.abspath(os.fspath(root)))  # before taking a port: a bad directory is named first
        config_server_context(cfg)  # the TLS files load (ConfigError naming the key), before a port is taken
        config_client_context(cfg)
        if cfg.acl_enable:  # each front loads it again; a file that does not load is named here, once
            try:
                load_acl(cfg.acl_path(os.path.abspath(os.fspath(root))))
            except AclConfigError as exc:
                raise ConfigError(f"acl_enable is true but the ACL cannot be used: {exc}",
                                  hint="write RocketMQ's plain_acl.yml there, or set acl_file "
                                       "(docs/security.md)") from None
        self.bind_address = cfg.effective_bind_address
        self._listener = listen(self.bind_address, cfg.listen_port)
        self.port: int = self._listener.getsockname()[1]
        cfg = cfg.replace(store_host=f"{cfg.broker_ip1}:{self.port}")
        if "ha_listen_port" not in cfg.explicit_keys and cfg.broker_role is not BrokerRole.SLAVE:
            # a master accepts slaves on listen_port + 1, as BrokerStartup sets haListenPort (a
            # free port when the broker's own was picked free)
            cfg = cfg.replace(ha_listen_port=self.port + 1 if cfg.listen_port else 0)
        try:
            self.store = MessageStore(root, cfg)
        except BaseException:
            self._listener.close()
            raise
        self.root = self.store.root
        self.config = self.store.config
        self.link_address = link_address(os.getpid(), self.port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mqstore-broker", daemon=True)
        self._thread.start()
        self.controller = BrokerController(self.store, self.port, self.link_address)
        self.fronts: FrontSupervisor | None = None
        self._connections_fd = -1
        try:
            self._call(self.controller.start())
            count = front_count(self.config.front_processes)
            self._connections_fd = connection_table(count)  # max_connections(_per_ip) hold for the broker
            self.fronts = FrontSupervisor(self.root, count, self._listener, self.link_address, self._connections_fd,
                                          log_dir=None)
            self.fronts.start()
            self._call(self.controller.register_all())
        except BaseException:
            self.shutdown()
            raise
        self._closed = False
        log.info("broker %s serving on %s:%d (%d fronts), NameServers %s", self.config.broker_name,
                 self.config.broker_ip1, self.port, len(self.fronts.kinds), ";".join(self.controller.namesrv_addrs))

    def _call(self, coro: Any, timeout: float = START_TIMEOUT_S) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    @property
    def address(self) -> str:
        """host:port clients reach the broker at (broker_ip1:listen_port)."""
        return f"{self.config.broker_ip1}:{self.port}"

    @property
    def namesrv_address(self) -> str:
        """The NameServer addresses the broker registers with ("a;b"), the embedded one's by default."""
        return ";".join(self.controller.namesrv_addrs)

    def security_summary(self) -> str:
        """Where the broker listens and what guards it, as its first line says (docs/security.md):
        ``listening on HOST (loopback only|every interface|HOST), HA port N, ACL on|off, TLS MODE``."""
        host = self.bind_address
        where = ("loopback only" if ipaddress.IPv4Address(host).is_loopback else
                 "every interface" if host == "0.0.0.0" else host)
        parts = [f"listening on {host}:{self.port} ({where})"]
        if self.config.broker_role is not BrokerRole.SLAVE and self.config.ha_listen_port:
            parts.append(f"HA port {self.config.ha_listen_port}")
        parts.append(f"ACL {'on' if self.config.acl_enable else 'off'}")
        parts.append(f"TLS {self.config.tls_server_mode}")
        return ", ".join(parts)

    @property
    def exposed_without_acl(self) -> bool:
        """Listening beyond loopback with no ACL: anyone who reaches the port may send, read and
        administer (docs/security.md)."""
        return not ipaddress.IPv4Address(self.bind_address).is_loopback and not self.config.acl_enable

    def front_pids(self) -> dict[str, int]:
        return self.fronts.pids() if self.fronts is not None else {}

    def shutdown(self) -> None:
        """Stop the fronts (clients see their connections close), then the controller (offsets
        written, the broker unregistered), then the store (flushed, checkpoint, no abort)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.fronts is not None:
            self.fronts.stop()
        try:
            self._call(self.controller.close())
        except Exception as exc:  # the store must still be shut down
            log.error("stopping the broker's controller failed: %s", exc)
        try:  # clients' NameServer connections and fronts' links still being served end here
            self._call(_cancel_other_tasks(), timeout=10)
        except Exception as exc:
            log.error("ending the broker's connections failed: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self.store.shutdown()
        self._listener.close()
        if self._connections_fd >= 0:
            os.close(self._connections_fd)
            self._connections_fd = -1

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
