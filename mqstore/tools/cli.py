"""The ``mqstore`` command: run a node on a store directory, or look at one without changing it.

    mqstore node STORE_DIR [--config broker.conf] [--set KEY=VALUE ...]
                                                     own the store and run its service processes
    mqstore node status STORE_DIR [--json]           a running node's processes and positions
    mqstore verify STORE_DIR [--no-crc] [--deep] [--json]
                                                     every invariant (mqstore.tools.checker.check_store)
    mqstore info STORE_DIR [--json]                  files, lock/abort state, checkpoint, control block
    mqstore inspect STORE_DIR [--json]               topics and queues, every file with its positions, index
    mqstore dump STORE_DIR (--phy OFFSET | --topic T --queue Q [--from QOFF]) [--count N]
                 [--body {none,hex,text}] [--json]   records with every field
    mqstore recover STORE_DIR [--no-crc] [--json]    dry run: what opening the store would recover and drop
    mqstore stats STORE_DIR [--interval S] [--once | --count N] [--json]
                                                     live rates, latencies, positions from the control block
    mqstore namesrv [--host H] [--listen-port P]     a RocketMQ NameServer
    mqstore broker STORE_DIR [--config broker.conf] [--set KEY=VALUE ...]
                                                     a RocketMQ broker: the node, its front processes, a NameServer
    mqstore admin (status | topics | topic-create NAME | groups | group NAME) [--broker H:P] [--json]
                                                     ask a running broker

Exit codes: 0 clean, 1 problems found (verify: broken invariants; recover: the open would drop
data), 2 usage error / not a store / cannot read / an offset that holds no record, 130
interrupted (Ctrl-C). ``node`` owns the store and writes it; every other command only reads:
none takes the store's lock, creates, truncates or deletes a file, and all work while a
running store owns the directory. Long runs of verify, inspect and recover draw
a progress line on stderr when it is a terminal (never with --json). See docs/cli.md.

A subcommand is one entry of ``COMMANDS``: (help, add_arguments, run); ``run(args)`` returns
the exit code and may raise MQStoreError or OSError, which ``main`` prints as one line.
The reading itself (inspect, dump, the recovery plan) lives in ``mqstore.tools.inspection``, the
live figures of ``stats`` in ``mqstore.tools.stats``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from mqstore.errors import MQStoreError, NotAStoreError
from mqstore.tools import node_cli
from mqstore.exit_codes import EXIT_INTERRUPTED, EXIT_USAGE
from mqstore.tools.commands import verify
from mqstore.tools.commands import info
from mqstore.tools.commands import inspect
from mqstore.tools.commands import dump
from mqstore.tools.commands import recover
from mqstore.tools.commands import stats as stats_command
from mqstore.tools.commands import namesrv
from mqstore.tools.commands import broker
from mqstore.tools.commands import admin


# -- the command --------------------------------------------------------------------------
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]

COMMANDS: dict[str, Command] = {
    "verify": ("check every invariant of a store directory (read-only)", verify.add_arguments, verify.run),
    "info": ("show the files, owner, checkpoint and control block of a store (read-only)", info.add_arguments, info.run),
    "inspect": ("list topics, queues, every CommitLog / ConsumeQueue file with its positions, and the index files "
                "(read-only)", inspect.add_arguments, inspect.run),
    "dump": ("decode records at a physical offset or a queue offset range, every field (read-only)",
             dump.add_arguments, dump.run),
    "recover": ("dry run: what opening the store would recover, truncate and re-dispatch (read-only)",
                recover.add_arguments, recover.run),
    "node": ("run a node (owner + allocator, flusher, dispatcher processes) on a store until SIGTERM/SIGINT; "
             "'node status DIR' shows a running one", node_cli.add_arguments, node_cli.run),
    "stats": ("live figures of a store from its control block: rates, latencies, positions, flags (read-only)",
              stats_command.add_arguments, stats_command.run),
    "namesrv": ("run a RocketMQ NameServer (broker registration and topic routes) until SIGTERM/SIGINT",
                namesrv.add_arguments, namesrv.run),
    "broker": ("run a RocketMQ broker (a node plus the remoting front and, by default, a NameServer) until "
               "SIGTERM/SIGINT", broker.add_arguments, broker.run),
    "admin": ("ask a running broker: status, topics (list, create), consumer groups and their lag",
              admin.add_arguments, admin.run),
}


def build_parser() -> argparse.ArgumentParser:
    from mqstore import __version__

    parser = argparse.ArgumentParser(
        prog="mqstore",
        description="Run and inspect mqstore (RocketMQ message store) directories: 'node' owns a store and "
                    "writes it; verify, info, inspect, dump, recover and stats only read (they work while a node "
                    "runs); 'namesrv' runs a RocketMQ NameServer.",
        epilog="exit codes: 0 clean, 1 problems found (recover: the open would drop data), 2 usage error, not a "
               "store, or an offset that holds no record, 130 interrupted")
    parser.add_argument("--version", action="version", version=f"mqstore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage (or --help)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except NotAStoreError as exc:
        print(f"mqstore {args.command}: not a store: {exc.args[0]}", file=sys.stderr)
    except MQStoreError as exc:
        print(f"mqstore {args.command}: {exc}", file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C in a command that only reads: nothing to clean up
        print(f"mqstore {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) not in str(exc.strerror) else ""
        print(f"mqstore {args.command}: cannot read the store: {where}{exc.strerror or exc}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
