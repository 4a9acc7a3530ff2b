"""``mqstore namesrv``: a RocketMQ NameServer (mqstore.broker.namesrv) until SIGTERM or Ctrl-C.

With ``--acl FILE`` (a RocketMQ plain_acl.yml) it takes registrations signed by the file's
accounts marked ``admin: true`` only (docs/security.md), re-reading the file when it
changes; a taken port is one line naming it (exit 2). ``--tls-mode permissive|enforcing`` with
``--tls-cert`` and ``--tls-key`` serves TLS as a broker's port does (RocketMQ's tls.server.*).
``--server-channel-max-idle-time-seconds``, ``--max-connections`` and ``--max-connections-per-ip``
limit its connections as the broker's settings of those names limit the broker's."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
import sys
from collections.abc import Callable, Mapping

from mqstore.config import DEFINITIONS
from mqstore.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from mqstore.tools.commands.common import positive_int
from mqstore.tls import DISABLED, ENFORCING, PERMISSIVE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: every interface)")
    p.add_argument("--listen-port", type=int, default=9876,
                   help="the port to listen on (NettyServerConfig listenPort; default 9876)")
    p.add_argument("--acl", metavar="FILE",
                   help="a RocketMQ plain_acl.yml: only brokers signing with one of its accounts with admin: true "
                        "(the brokers' inner_access_key / inner_secret_key) may register or unregister; read again "
                        "when it changes (default: no accounts, registrations need no signature)")
    limits = p.add_argument_group("limits on every connection (the broker's settings of these names, "
                                  "counted by this NameServer)")
    for key, what in (("server_channel_max_idle_time_seconds", "a connection that sends nothing for this many "
                                                              "seconds is closed"),
                      ("max_connections", "connections it holds at most; past them a new one is closed at once"),
                      ("max_connections_per_ip", "connections from one source address it holds at most")):
        default = DEFINITIONS[key].default
        limits.add_argument("--" + key.replace("_", "-"), type=positive_int, default=default, metavar="N",
                            help=f"{what} (default {default})")
    tls = p.add_argument_group("TLS (RocketMQ's tls.server.* settings, the broker's tls_server_* keys)")
    tls.add_argument("--tls-mode", choices=(DISABLED, PERMISSIVE, ENFORCING), default=DISABLED,
                     help="tls.server.mode: disabled (plain, the default), permissive (TLS and plain on one port, "
                          "told apart by the first byte) or enforcing (TLS only)")
    tls.add_argument("--tls-cert", metavar="PEM", default="",
                     help="tls.server.certPath: the certificate (chain) the NameServer presents")
    tls.add_argument("--tls-key", metavar="PEM", default="",
                     help="tls.server.keyPath: its private key (unencrypted)")
    tls.add_argument("--tls-need-client-auth", choices=("none", "optional", "require"), default="none",
                     help="tls.server.need.client.auth: whether clients must present a certificate signed by "
                          "--tls-trust-cert (default none)")
    tls.add_argument("--tls-trust-cert", metavar="PEM", default="",
                     help="tls.server.trustCertPath: the CA certificates client certificates are checked against")


def broker_accounts(path: str) -> Callable[[], Mapping[str, str]]:
    """The accounts with ``admin: true`` of a RocketMQ plain_acl.yml (mqstore.acl.holder: re-read
    when the file changes, the last good version kept when a change does not load);
    AclConfigError when the file cannot be used or has no such account."""
    from mqstore.acl.holder import AclHolder
    from mqstore.acl.holder import broker_accounts as admin_accounts

    return admin_accounts(AclHolder(path))


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The server context of the --tls-* options (None when --tls-mode is disabled); ConfigError
    naming the option when one is missing or a file does not load."""
    from mqstore.errors import ConfigError
    from mqstore.tls import server_context

    if args.tls_mode == DISABLED:
        return None
    missing = [opt for opt, value in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)) if not value]
    if args.tls_need_client_auth != "none" and not args.tls_trust_cert:
        missing.append("--tls-trust-cert")
    if missing:
        raise ConfigError(f"--tls-mode {args.tls_mode} needs {' and '.join(missing)}",
                          hint="PEM files: the NameServer's certificate and key (and the CAs of client certificates)")
    try:
        return server_context(args.tls_mode, args.tls_cert, args.tls_key, need_client_auth=args.tls_need_client_auth,
                              trust_cert_path=args.tls_trust_cert)
    except ConfigError as exc:  # it names the broker's keys: say the options instead
        text = str(exc)
        for key, opt in (("tls_server_cert_path", "--tls-cert"), ("tls_server_key_path", "--tls-key"),
                         ("tls_server_trust_cert_path", "--tls-trust-cert")):
            text = text.replace(key, opt)
        raise ConfigError(text, hint="") from None


def run(args: argparse.Namespace) -> int:
    from mqstore.broker.namesrv import NameServer

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="mqstore namesrv: %(message)s")
    stopped_by: list[int] = []
    if args.acl:
        from mqstore.acl.plain import AclConfigError

        try:
            accounts = broker_accounts(args.acl)
        except AclConfigError as exc:
            print(f"mqstore namesrv: --acl {exc}", file=sys.stderr)
            return EXIT_USAGE
    else:
        accounts = None
    tls = tls_context(args)  # a ConfigError: one line from the command line's main (exit 2)

    async def serve() -> None:
        ns = NameServer(args.host, args.listen_port, accounts=accounts, setting="--listen-port", tls=tls,
                        tls_mode=args.tls_mode,
                        server_channel_max_idle_time_seconds=args.server_channel_max_idle_time_seconds,
                        max_connections=args.max_connections, max_connections_per_ip=args.max_connections_per_ip)
        await ns.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: int) -> None:
            stopped_by.append(sig)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            await stop.wait()
        finally:
            await ns.close()

    try:
        asyncio.run(serve())  # a taken port: PortInUseError, one line from the command line's main (exit 2)
    except OSError as exc:
        print(f"mqstore namesrv: cannot listen on {args.host}:{args.listen_port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return EXIT_INTERRUPTED if stopped_by == [signal.SIGINT] else EXIT_OK
