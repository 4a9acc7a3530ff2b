"""``mqstore broker``: a RocketMQ broker on a store directory (mqstore.broker.server.Broker) until
SIGTERM, SIGINT or SIGHUP: the node's service processes, the front processes on ``listen_port``
and, unless ``namesrv_addr`` is set, an embedded NameServer.

    mqstore broker STORE_DIR [--config broker.conf] [--set KEY=VALUE ...]

Settings are the store's and the broker's keys (docs/config.md), from a RocketMQ broker.conf and
``--set``; the command prints one line with the broker's and the NameServer's addresses once it
serves, and exits 0 after a clean stop (1 when the store was left with ``abort``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from mqstore.tools.node_cli import STOP_SIGNALS, _config, _log_to_stderr
from mqstore.layout import abort_path
from mqstore.signals import StopRequest

log = logging.getLogger("mqstore.broker")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE_DIR", help="the store directory (created when missing)")
    p.add_argument("--config", metavar="FILE", help="a RocketMQ broker.conf-style properties file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting (snake_case MessageStoreConfig / BrokerConfig name), repeatable; e.g. "
                        "--set listen_port=10911 --set namesrv_addr=127.0.0.1:9876")


def run(args: argparse.Namespace) -> int:
    stop = StopRequest()
    stop.on_signals(STOP_SIGNALS, lambda sig: log.info("%s: stopping the broker", sig.name))
    _log_to_stderr()
    from mqstore.broker.server import Broker

    broker = Broker(args.store, _config(args.config, args.set))
    try:
        print(f"mqstore broker {broker.config.broker_name} on {broker.root}: serving on {broker.address} "
              f"({len(broker.front_pids())} front processes), NameServer {broker.namesrv_address} "
              f"[{broker.security_summary()}]", flush=True)
        if broker.exposed_without_acl:
            log.warning("listening on %s with ACL off: anyone who can reach the port can send, read, and change "
                        "topics and offsets (set acl_enable=true, or bind_address=127.0.0.1; docs/security.md)",
                        broker.bind_address)
        while not stop.wait(1.0):
            pass
    finally:
        broker.shutdown()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    clean = not os.path.exists(abort_path(broker.root))
    print(f"mqstore broker on {broker.root}: stopped {'cleanly' if clean else 'with abort left (see the log)'}",
          file=sys.stdout, flush=True)
    return 0 if clean else 1
