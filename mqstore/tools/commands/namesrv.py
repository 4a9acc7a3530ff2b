"""``mqstore namesrv``: a RocketMQ NameServer (mqstore.broker.namesrv) until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from mqstore.exit_codes import EXIT_INTERRUPTED, EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: every interface)")
    p.add_argument("--listen-port", type=int, default=9876,
                   help="the port to listen on (NettyServerConfig listenPort; default 9876)")


def run(args: argparse.Namespace) -> int:
    from mqstore.broker.namesrv import NameServer

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="mqstore namesrv: %(message)s")
    stopped_by: list[int] = []

    async def serve() -> None:
        ns = NameServer(args.host, args.listen_port)
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
        asyncio.run(serve())
    except OSError as exc:
        print(f"mqstore namesrv: cannot listen on {args.host}:{args.listen_port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return EXIT_INTERRUPTED if stopped_by == [signal.SIGINT] else EXIT_OK
