"""The ``mqstore`` command: look at a store directory without changing it.

    mqstore verify STORE_DIR [--no-crc] [--json]   every invariant (mqstore.checker.check_store)
    mqstore info STORE_DIR [--json]                files, lock/abort state, checkpoint, control block

Exit codes: 0 clean, 1 the checker found problems, 2 usage error / not a store / cannot read.
Both commands only read: they never take the store's lock, never create or truncate a file,
and work while a running store owns the directory. See docs/cli.md.

A subcommand is one entry of ``COMMANDS``: (help, add_arguments, run); ``run(args)`` returns
the exit code and may raise MQStoreError or OSError, which ``main`` prints as one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from mqstore import _shm
from mqstore.checker import CheckReport, check_store
from mqstore.checkpoint import read_checkpoint_file
from mqstore.errors import MQStoreError, NotAStoreError
from mqstore.store import CONTROL_BLOCK_NAME, check_store_dir

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

LIST_LIMIT = 20  # text output lists at most this many files / queues; --json lists all
STATE_NAMES = {_shm.STATE_BUILDING: "BUILDING", _shm.STATE_READY: "READY", _shm.STATE_CLOSED: "CLOSED"}


# -- reading a store directory (read-only) ------------------------------------------------
def require_store(root: str) -> str:
    """Absolute path of root if it looks like a store directory; NotAStoreError otherwise."""
    root = os.path.abspath(root)
    if not os.path.exists(root):
        raise NotAStoreError(f"{root} does not exist")
    check_store_dir(root)  # a file, foreign files only, commitlog not a directory
    if not os.listdir(root):
        raise NotAStoreError(f"{root} is an empty directory")
    return root


def lock_state(root: str) -> dict[str, Any]:
    """Who owns root: the lock file, whether a running store holds its OFD lock, the abort file.

    ``status`` is "running" (lock held), "crashed" (abort file left, lock free: the next open
    recovers), "clean" (shut down cleanly) or "new" (no lock file: never opened by a store)."""
    lock_path = os.path.join(root, "lock")
    held = False
    if os.path.exists(lock_path):
        fd = os.open(lock_path, os.O_RDONLY)  # F_OFD_GETLK only tests; it takes nothing
        try:
            held = _shm.ofd_is_locked(fd)
        finally:
            os.close(fd)
    abort = os.path.exists(os.path.join(root, "abort"))
    status = ("running" if held else "crashed" if abort else
              "clean" if os.path.exists(lock_path) else "new")
    return {"status": status, "lock_file": os.path.exists(lock_path), "lock_held": held, "abort_file": abort}


def read_checkpoint(root: str) -> dict[str, Any] | None:
    """The checkpoint's fields, or None if absent, {"error": ...} if too short. Read from the
    file: StoreCheckpoint opens it read-write and extends a short one."""
    path = os.path.join(root, "checkpoint")
    if not os.path.isfile(path):
        return None
    try:
        return dict(read_checkpoint_file(path))
    except ValueError as exc:
        return {"error": str(exc)}


def read_control_block(root: str) -> dict[str, Any] | None:
    """Header, positions, running flags and statistics of ROOT/mqstore.shm, or None if absent.

    ControlBlock.attach maps the file shared but writes nothing, and every accessor used here
    is a load, so this is safe next to a running owner. {"error": ...} if it cannot be read."""
    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return None
    try:
        ctl = _shm.ControlBlock.attach(path)
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    try:
        return {
            "state": STATE_NAMES.get(ctl.state, str(ctl.state)),
            "generation": ctl.generation,
            "owner_pid": ctl.owner_pid,
            "lock_kind": ctl.lock_kind,
            "sync_flush": ctl.sync_flush,
            "file_size": ctl.file_size,
            "table_slots": ctl.table_slots,
            "queues": ctl.table_count,
            "positions": ctl.positions(),
            "running_flags": ctl.running_flags(),
            "stats": ctl.stats(),
        }
    finally:
        ctl.close()


def commitlog_files(root: str) -> tuple[list[dict[str, Any]], list[str]]:
    """([{name, size}] of the CommitLog files in order, [other entries of commitlog/])."""
    cdir = os.path.join(root, "commitlog")
    if not os.path.isdir(cdir):
        return [], []
    files, other = [], []
    for name in sorted(os.listdir(cdir)):
        if len(name) == 20 and name.isdigit():
            files.append({"name": name, "size": os.path.getsize(os.path.join(cdir, name))})
        else:
            other.append(name)
    return files, other


# -- verify -------------------------------------------------------------------------------
def _verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--no-crc", action="store_true", help="skip body CRCs (faster; still parses every record)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_verify(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    check_crc = not args.no_crc
    if owner["status"] == "running":
        # positions are read before the scan; bytes past them may still be being written
        report = check_store(root, check_crc=check_crc, quiescent=False, allow_torn_tail=True)
    else:
        # A crashed store may end in a torn record; its next open truncates it: not corruption.
        report = check_store(root, check_crc=check_crc, allow_torn_tail=owner["status"] == "crashed")
    if args.json:
        _print_json(_verify_json(report, owner, check_crc=check_crc))
    else:
        _print_verify(report, owner, check_crc=check_crc)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _verify_json(report: CheckReport, owner: dict[str, Any], *, check_crc: bool) -> dict[str, Any]:
    return {
        "root": report.root, "ok": report.ok, "status": owner["status"], "check_crc": check_crc,
        "files": report.files, "records": report.records, "valid_end": report.valid_end,
        "torn_tail_bytes": report.torn_tail_bytes, "in_flight_bytes": report.in_flight_bytes,
        "queues": [{"topic": t, "queue_id": q, "first_offset": s.first_offset, "last_offset": s.last_offset,
                    "count": s.count} for (t, q), s in sorted(report.queues.items())],
        "control_block": report.control_block,
        "problems": [{"where": p.where, "offset": p.offset, "message": p.message} for p in report.problems],
    }


def _print_verify(report: CheckReport, owner: dict[str, Any], *, check_crc: bool) -> None:
    verdict = "OK" if report.ok else f"{len(report.problems)} PROBLEM(S)"
    print(f"store {report.root}: {verdict}")
    print(f"  status: {_describe_status(owner)}")
    crc = "" if check_crc else " (CRC not checked)"
    print(f"  commitlog: {report.files} file(s), {report.records:,} records{crc}, log ends at {report.valid_end:,}")
    if report.torn_tail_bytes:
        print(f"  torn tail: {report.torn_tail_bytes:,} bytes after the end of the log (a partly written record; "
              f"{'the writer is still at work' if owner['status'] == 'running' else 'the next open truncates it'})")
    if report.in_flight_bytes:
        print(f"  in flight: {report.in_flight_bytes:,} bytes past the wrote position read before the scan "
              f"not checked (the running store was writing them)")
    queues = sorted(report.queues.items())
    print(f"  queues: {len(queues)}")
    for (topic, qid), s in queues[:LIST_LIMIT]:
        print(f"    {topic}-{qid}: offsets {s.first_offset}..{s.last_offset} ({s.count:,} records)")
    if len(queues) > LIST_LIMIT:
        print(f"    ... {len(queues) - LIST_LIMIT} more (--json lists all)")
    if report.control_block is not None:
        print(_kv("  positions: ", report.control_block))
    for problem in report.problems:
        print(f"  PROBLEM {problem}")


# -- info ---------------------------------------------------------------------------------
def _info_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--json", action="store_true", help="print the information as JSON")


def run_info(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    files, other = commitlog_files(root)
    info = {
        "root": root,
        "entries": sorted(os.listdir(root)),
        **lock_state(root),
        "commitlog": {"files": files, "other": other, "bytes": sum(f["size"] for f in files)},
        "checkpoint": read_checkpoint(root),
        "control_block": read_control_block(root),
    }
    if args.json:
        _print_json(info)
    else:
        _print_info(info)
    return EXIT_OK


def _print_info(info: dict[str, Any]) -> None:
    print(f"store {info['root']}")
    print(f"  status: {_describe_status(info, info['control_block'])}")
    print(f"    lock file: {'held' if info['lock_held'] else 'free' if info['lock_file'] else 'absent'}, "
          f"abort file: {'present' if info['abort_file'] else 'absent'}")
    print(f"  entries: {', '.join(info['entries'])}")
    files = info["commitlog"]["files"]
    print(f"  commitlog: {len(files)} file(s), {info['commitlog']['bytes']:,} bytes")
    shown = files if len(files) <= LIST_LIMIT else files[:LIST_LIMIT // 2] + [None] + files[-LIST_LIMIT // 2:]
    for f in shown:
        print(f"    ... {len(files) - LIST_LIMIT} more" if f is None else f"    {f['name']}  {f['size']:>14,}")
    if info["commitlog"]["other"]:
        print(f"    other entries: {', '.join(info['commitlog']['other'])}")
    cp = info["checkpoint"]
    if cp is None:
        print("  checkpoint: none")
    elif "error" in cp:
        print(f"  checkpoint: cannot read: {cp['error']}")
    else:
        print("  checkpoint:")
        for name, value in cp.items():
            when = f"  ({_ms_to_iso(value)})" if name.endswith("timestamp") and value > 0 else ""
            print(f"    {name:<22} {value}{when}")
    ctl = info["control_block"]
    if ctl is None:
        print(f"  control block: none ({CONTROL_BLOCK_NAME} absent)")
    elif "error" in ctl:
        print(f"  control block: cannot read: {ctl['error']}")
    else:
        print(f"  control block: state {ctl['state']}, generation {ctl['generation']}, owner pid {ctl['owner_pid']}")
        print(f"    {ctl['lock_kind']} put lock, {'SYNC' if ctl['sync_flush'] else 'ASYNC'}_FLUSH, "
              f"file size {ctl['file_size']:,}, {ctl['queues']} of {ctl['table_slots']:,} queue slots used")
        print(_kv("    positions: ", ctl["positions"]))
        if ctl["running_flags"]:
            print(f"    running flags: {', '.join(ctl['running_flags'])}")
        nonzero = {k: v for k, v in ctl["stats"].items() if v}
        zeros = len(ctl["stats"]) - len(nonzero)
        print(_kv("    stats: ", nonzero) if nonzero else "    stats: all zero")
        if nonzero and zeros:
            print(f"           ({zeros} zero counters not shown; --json lists all)")


# -- shared helpers -----------------------------------------------------------------------
def _describe_status(owner: dict[str, Any], ctl: dict[str, Any] | None = None) -> str:
    status = owner["status"]
    if status == "running":
        pid = f" (owner pid {ctl['owner_pid']})" if ctl and "owner_pid" in ctl else ""
        return f"running: a store holds the lock{pid}"
    if status == "crashed":
        return "not running; the last run did not shut down cleanly (abort file present), the next open recovers"
    if status == "clean":
        return "not running; shut down cleanly"
    return "never opened by a store (no lock file)"


def _kv(label: str, d: dict[str, Any]) -> str:
    """'label k=v k=v ...' wrapped at 100 columns, continuation lines aligned after the label."""
    return textwrap.fill(" ".join(f"{k}={v}" for k, v in d.items()), 100, initial_indent=label,
                         subsequent_indent=" " * len(label), break_long_words=False, break_on_hyphens=False)


def _ms_to_iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return "out of range"


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


# -- the command --------------------------------------------------------------------------
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]

COMMANDS: dict[str, Command] = {
    "verify": ("check every invariant of a store directory (read-only)", _verify_arguments, run_verify),
    "info": ("show the files, owner, checkpoint and control block of a store (read-only)", _info_arguments, run_info),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqstore", description="Inspect mqstore (RocketMQ message store) directories.",
        epilog="exit codes: 0 clean, 1 problems found, 2 usage error or not a store")
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
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) not in str(exc.strerror) else ""
        print(f"mqstore {args.command}: cannot read the store: {where}{exc.strerror or exc}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
