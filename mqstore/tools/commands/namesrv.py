"""``mqstore namesrv``: a RocketMQ NameServer (mqstore.broker.namesrv) until SIGTERM or Ctrl-C.

With ``--acl FILE`` (a RocketMQ plain_acl.yml) it takes registrations signed by the file's
accounts marked ``admin: true`` only (docs/security-namesrv.md), re-reading the file when it
changes; a taken port is one line naming it (exit 2)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Mapping

from mqstore.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: every interface)")
    p.add_argument("--listen-port", type=int, default=9876,
                   help="the port to listen on (NettyServerConfig listenPort; default 9876)")
    p.add_argument("--acl", metavar="FILE",
                   help="a RocketMQ plain_acl.yml: only brokers signing with one of its accounts with admin: true "
                        "(the brokers' inner_access_key / inner_secret_key) may register or unregister; read again "
                        "when it changes (default: no accounts, registrations need no signature)")


def broker_accounts(path: str) -> Callable[[], Mapping[str, str]]:
    """The accounts with ``admin: true`` of a RocketMQ plain_acl.yml (mqstore.acl.holder: re-read
    when the file changes, the last good version kept when a change does not load);
    AclConfigError when the file cannot be used or has no such account."""
    from mqstore.acl.holder import AclHolder
    from mqstore.acl.holder import broker_accounts as admin_accounts

    return admin_accounts(AclHolder(path))


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

    async def serve() -> None:
        ns = NameServer(args.host, args.listen_port, accounts=accounts, setting="--listen-port")
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
