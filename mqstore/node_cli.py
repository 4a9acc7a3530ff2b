"""``mqstore node``: run a node on a store directory, or show a running node's status.

    mqstore node STORE_DIR [--config broker.conf] [--set key=value ...]
    mqstore node status STORE_DIR [--json]

The node is a MessageStore opened with ``service_mode="processes"``: this process owns the
directory (the ``lock`` file) and supervises one process each for the allocator, the flusher
and the dispatcher. It runs until SIGTERM or SIGINT, then shuts down cleanly (dispatch catches
up, everything is flushed, the checkpoint written, ``abort`` removed). Other processes use the
store with ``MessageStore.open(STORE_DIR)``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

from mqstore.errors import ConfigError

NODE_INFO_NAME = "mqstore.node.json"


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


def serve(root: str, config_path: str | None, settings: list[str]) -> int:
    from mqstore.store import MessageStore

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store = MessageStore(root, _config(config_path, settings))
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
    clean = not os.path.exists(os.path.join(store.root, "abort"))
    print(f"mqstore node on {store.root}: stopped {'cleanly' if clean else 'with abort left (see the log)'}",
          flush=True)
    return 0 if clean else 1


def _write_info(root: str, info: dict[str, Any]) -> None:
    path = os.path.join(root, NODE_INFO_NAME)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    os.replace(path + ".tmp", path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def status(root: str, *, as_json: bool = False) -> int:
    """Owner and service processes (alive or not), positions, dispatch lag and key counters,
    read from the control block without taking the store's lock (mqstore.stats). 0 when a
    node is running."""
    from mqstore.stats import StatsReader

    with StatsReader(root) as reader:
        snap = reader.snapshot()
    info: dict[str, Any] = {}
    try:
        with open(os.path.join(snap.root, NODE_INFO_NAME), encoding="utf-8") as fh:
            info = json.load(fh)
    except (FileNotFoundError, ValueError):
        pass
    running = snap.running and snap.state == "READY"
    services: dict[str, dict[str, Any]] = {k: {"pid": v, "alive": _alive(v)} for k, v in info.get("services", {}).items()}
    shown = {k: snap.counters[k] for k in ("put_messages", "put_bytes", "flush_count", "flush_timeouts",
                                           "page_cache_busy", "lock_takeovers", "dispatch_records")
             if k in snap.counters}
    owner_alive = snap.owner_pid > 0 and _alive(snap.owner_pid)
    out: dict[str, Any] = {
        "store": snap.root, "state": snap.state, "owner_pid": snap.owner_pid, "owner_alive": owner_alive,
        "services": services, "positions": snap.positions, "dispatch_behind_bytes": snap.dispatch_behind_bytes,
        "dispatch_lag_ms": snap.dispatch_lag_ms, "running_flags": list(snap.running_flags), "stats": shown,
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
    return 0 if running else 1


if __name__ == "__main__":
    from mqstore.cli import main

    sys.exit(main(["node", *sys.argv[1:]]))
