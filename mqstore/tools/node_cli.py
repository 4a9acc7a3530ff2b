"""``mqstore node``: run a node on a store directory, or show a running node's status.

    mqstore node STORE_DIR [--config broker.conf] [--set key=value ...]
    mqstore node status STORE_DIR [--json]

The node is a MessageStore opened with ``service_mode="processes"``: this process owns the
directory (the ``lock`` file) and supervises one process each for the allocator, the flusher,
the dispatcher and the cleaner, each in a process group of its own (a terminal's Ctrl-C reaches
the owner only). It runs until SIGTERM, SIGINT or SIGHUP, at any moment including start-up,
then shuts down cleanly (dispatch catches up, everything is flushed, the checkpoint written,
``abort`` removed) and exits 0. Other processes use the store with
``MessageStore.attach(STORE_DIR)`` (or ``MessageStore.open``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from mqstore.layout import NODE_INFO_NAME, abort_path
from mqstore.log.directory import replace_file
from mqstore.errors import ConfigError
from mqstore.signals import StopRequest


log = logging.getLogger("mqstore.node")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs="+", metavar="[status] STORE_DIR",
                        help="the store directory to run a node on; 'status STORE_DIR' shows a running node")
    parser.add_argument("--config", metavar="FILE", help="a RocketMQ broker.conf-style properties file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a configuration key (snake_case MessageStoreConfig name), repeatable")
    parser.add_argument("--json", action="store_true", help="status: print JSON")


def run(args: argparse.Namespace) -> int:
    if args.args[0] == "status":
        if len(args.args) != 2:
            raise ConfigError("usage: mqstore node status STORE_DIR")
        return status(args.args[1], as_json=args.json)
    if len(args.args) != 1:
        raise ConfigError("usage: mqstore node STORE_DIR (or: mqstore node status STORE_DIR)")
    return serve(args.args[0], args.config, args.set)


def _config(config_path: str | None, settings: list[str]) -> Any:
    from mqstore.config import StoreConfig

    overrides: dict[str, Any] = {"service_mode": "processes"}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    if config_path:
        return StoreConfig.from_broker_conf(config_path, **overrides)
    return StoreConfig().replace(**overrides)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _log_to_stderr() -> None:
    """INFO lines of the mqstore loggers (recovery progress, service restarts) on stderr, one
    line each, unless the program configured logging itself."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s node[%(process)d] %(levelname)s %(message)s")


def serve(root: str, config_path: str | None, settings: list[str]) -> int:
    """Own root until SIGTERM, SIGINT (Ctrl-C) or SIGHUP, then stop cleanly: 0 when the store
    was left clean (no ``abort``), 1 otherwise. A signal while the store is still opening
    (recovery, service processes starting) is remembered: the open completes and the store
    shuts down at once, so it is never left half-open; later signals only say so."""
    stop = StopRequest()

    def say(sig: signal.Signals) -> None:
        if stop.is_set():
            log.info("%s: already stopping", sig.name)
        else:
            log.info("%s: stopping the node%s", sig.name, "" if opened.is_set() else " once the store is open")

    opened = threading.Event()
    stop.on_signals(STOP_SIGNALS, say)
    _log_to_stderr()
    from mqstore.store import MessageStore

    config = _config(config_path, settings)
    log.info("opening %s", os.path.abspath(root))
    store = MessageStore(root, config)
    opened.set()
    try:
        info: dict[str, Any] = {"owner_pid": os.getpid(),
                                "services": store.supervisor.pids() if store.supervisor else {}}
        _write_info(store.root, info)
        rec = store.recovery
        print(f"mqstore node on {store.root}: owner pid {os.getpid()}, "
              + ", ".join(f"{k} pid {v}" for k, v in info["services"].items()), flush=True)
        print(f"recovered: {rec.summary()}", flush=True)
        while not stop.wait(1.0):
            if store.supervisor is not None:
                pids = store.supervisor.pids()
                if pids != info["services"]:
                    info["services"] = pids
                    _write_info(store.root, info)
    finally:
        store.shutdown()
        try:
            os.unlink(os.path.join(store.root, NODE_INFO_NAME))
        except FileNotFoundError:
            pass
        # stopped: a Ctrl-C pressed again while the process exits changes nothing (Python
        # restores the default handlers as it finalizes, which would report death by SIGINT)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    clean = not os.path.exists(abort_path(store.root))
    print(f"mqstore node on {store.root}: stopped {'cleanly' if clean else 'with abort left (see the log)'}",
          flush=True)
    return 0 if clean else 1


def _write_info(root: str, info: dict[str, Any]) -> None:
    replace_file(os.path.join(root, NODE_INFO_NAME), json.dumps(info))


def status(root: str, *, as_json: bool = False) -> int:
    """Owner and service processes (alive or not), positions, dispatch lag, key counters and
    replication, read from the control block and the HA service's ha.json without taking the
    store's lock (mqstore.tools.stats). 0 when a node is running."""
    from mqstore.procs import alive
    from mqstore.tools.stats import StatsReader, replication_figures, replication_lines

    with StatsReader(root) as reader:
        snap = reader.snapshot()
    info: dict[str, Any] = {}
    try:
        with open(os.path.join(snap.root, NODE_INFO_NAME), encoding="utf-8") as fh:
            info = json.load(fh)
    except (FileNotFoundError, ValueError):
        pass
    running = snap.running and snap.state == "READY"
    services: dict[str, dict[str, Any]] = {k: {"pid": v, "alive": v > 0 and alive(v)}
                                           for k, v in info.get("services", {}).items()}
    shown = {k: snap.counters[k] for k in ("put_messages", "put_bytes", "flush_count", "flush_timeouts",
                                           "page_cache_busy", "lock_takeovers", "dispatch_records")
             if k in snap.counters}
    owner_alive = snap.owner_pid > 0 and alive(snap.owner_pid)
    out: dict[str, Any] = {
        "store": snap.root, "state": snap.state, "owner_pid": snap.owner_pid, "owner_alive": owner_alive,
        "services": services, "positions": snap.positions, "dispatch_behind_bytes": snap.dispatch_behind_bytes,
        "dispatch_lag_ms": snap.dispatch_lag_ms, "running_flags": list(snap.running_flags), "stats": shown,
        "replication": snap.ha,  # the HA service's ha.json (None: the store does not replicate)
    }
    if as_json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{snap.root}: {snap.state}, owner pid {snap.owner_pid} ({'alive' if owner_alive else 'not running'})")
        for kind, s in services.items():
            print(f"  {kind:<11} pid {s['pid']:<8} {'alive' if s['alive'] else 'DEAD'}")
        print("  positions: " + ", ".join(f"{k} {v:,}" for k, v in snap.positions.items()))
        print(f"  dispatch behind {snap.dispatch_behind_bytes:,} bytes, lag {snap.dispatch_lag_ms} ms; "
              f"flags {', '.join(snap.running_flags) or 'none'}")
        print("  " + ", ".join(f"{k} {v:,}" for k, v in shown.items()))
        for line in replication_lines(replication_figures(snap)):
            print("  " + line)
    return 0 if running else 1
