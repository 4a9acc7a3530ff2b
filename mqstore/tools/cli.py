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
import dataclasses
import json
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from mqstore import _shm
from mqstore.tools import stats
from mqstore.tools.checker import CheckReport, check_store
from mqstore.log.checkpoint import read_checkpoint_file
from mqstore.errors import MQStoreError, NotAStoreError
from mqstore.tools import node_cli
from mqstore.queue.files import LogFile, QueueInfo, store_config
from mqstore.tools.inspection import DumpEntry, Inventory, LogReader, RecoveryPlan, inventory, plan_recovery, queue_records
from mqstore.log.record import DecodedRecord
from mqstore.tools.stats import STATE_NAMES, ms_to_iso
from mqstore.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE
from mqstore.progress import describe
from mqstore.log.directory import lock_state, require_store
from mqstore.layout import CONTROL_BLOCK_NAME

LIST_LIMIT = 20  # text output lists at most this many files / queues; --json lists all


# -- reading a store directory (read-only) ------------------------------------------------
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

    The block is attached read-only (O_RDONLY, PROT_READ) and every accessor used here is a
    load, so this is safe next to a running owner. {"error": ...} if it cannot be read."""
    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return None
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
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
    p.add_argument("--deep", action="store_true",
                   help="read every byte the default check samples: whole tails of files past the end of the log "
                        "and of the queues, every hash slot of every index file with its chain; with the store's "
                        "own configuration (mqstore.config.json), so index files of any geometry are checked")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_verify(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    check_crc = not args.no_crc
    deep = bool(getattr(args, "deep", False))
    config = store_config(root) if deep else None
    bar = _progress_bar(args, "verify")
    try:
        if owner["status"] == "running":
            # positions are read before the scan; bytes past them may still be being written
            report = check_store(root, check_crc=check_crc, quiescent=False, allow_torn_tail=True, progress=bar,
                                 config=config, deep=deep)
        else:
            # A crashed store may end in a torn record; its next open truncates it: not corruption.
            report = check_store(root, check_crc=check_crc, allow_torn_tail=owner["status"] == "crashed",
                                 progress=bar, config=config, deep=deep)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        _print_json(_verify_json(report, owner, check_crc=check_crc, deep=deep))
    else:
        _print_verify(report, owner, check_crc=check_crc, deep=deep)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def verify_hints(report: CheckReport) -> list[str]:
    """What to do about problems found in the index files: they are derived data, rebuilt from
    the CommitLog without losing anything. (Damage the next open repairs by itself, such as
    units past the end of a crashed store's log, needs no hint: ``mqstore recover`` says what
    it will do.)"""
    hints = []
    damaged = sorted({p.where.split("/", 1)[1] for p in report.problems if p.where.startswith("index/")})
    if damaged:
        hints.append(
            "the index is derived from the CommitLog: `mqstore-spark rebuild STORE_DIR` rebuilds it (and the "
            "ConsumeQueues) with Spark; without Spark, cut the damaged file short (`truncate -s 0 STORE_DIR/index/"
            f"{damaged[0]}`) and open the store: a damaged index file is deleted with every newer one and "
            "rebuilt from the CommitLog (mqstore.queue.index.plan_index_load)")
    return hints


def _verify_json(report: CheckReport, owner: dict[str, Any], *, check_crc: bool, deep: bool = False
                 ) -> dict[str, Any]:
    return {
        "root": report.root, "ok": report.ok, "status": owner["status"], "check_crc": check_crc, "deep": deep,
        "files": report.files, "records": report.records, "valid_end": report.valid_end,
        "torn_tail_bytes": report.torn_tail_bytes, "in_flight_bytes": report.in_flight_bytes,
        "queues": [{"topic": t, "queue_id": q, "first_offset": s.first_offset, "last_offset": s.last_offset,
                    "count": s.count} for (t, q), s in sorted(report.queues.items())],
        "consume_queues": [{"topic": t, "queue_id": q, **dataclasses.asdict(s)}
                           for (t, q), s in sorted(report.consume_queues.items())],
        "queues_complete_checked": report.queues_complete_checked,
        "in_flight_units": report.in_flight_units,
        "index_files": [dataclasses.asdict(f) for f in report.index_files],
        "index_entries": report.index_entries,
        "control_block": report.control_block,
        "notes": report.notes,
        "problems": [{"where": p.where, "offset": p.offset, "message": p.message} for p in report.problems],
        "hints": verify_hints(report),
    }


def _print_verify(report: CheckReport, owner: dict[str, Any], *, check_crc: bool, deep: bool = False) -> None:
    verdict = "OK" if report.ok else f"{len(report.problems)} PROBLEM(S)"
    print(f"store {report.root}: {verdict}{' (deep check)' if deep else ''}")
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
    _print_verify_queues(report)
    _print_verify_index(report)
    if report.control_block is not None:
        print(_kv("  positions: ", report.control_block))
    for note in report.notes:
        print(f"  note: {note}")
    for problem in report.problems:
        print(f"  PROBLEM {problem}")
    for hint in verify_hints(report):
        print(f"  hint: {hint}")


def _print_verify_queues(report: CheckReport) -> None:
    """The checker's ConsumeQueue summaries (what it read of those files)."""
    if report.consume_queues:
        complete = ("every record of the log has its unit" if report.queues_complete_checked else
                    "units checked; a crashed or running store may lack the last units")
        print(f"  consumequeues: {len(report.consume_queues)} ({complete})")
        rows = [(f"{t}/{q}", s.min_offset, s.max_offset, s.units, s.fillers, s.gaps, s.removed, s.files)
                for (t, q), s in sorted(report.consume_queues.items())]
        _print_lines(_table(("QUEUE", "MIN", "MAX", "UNITS", "FILLERS", "GAPS", "REMOVED", "FILES"), rows,
                            what="queues"))
    if report.in_flight_units:
        print(f"  in flight: {report.in_flight_units:,} units / index entries point past the log read by the scan "
              f"(written while it ran), not checked")


def _print_verify_index(report: CheckReport) -> None:
    """The checker's index file summaries."""
    if report.index_files:
        print(f"  index: {len(report.index_files)} file(s), {report.index_entries:,} entries checked")
        rows = [(f.name, _when(f.begin_timestamp), _when(f.end_timestamp), f.hash_slot_count,
                 f.index_count, "yes" if f.entries_checked else "header only") for f in report.index_files]
        _print_lines(_table(("FILE", "BEGIN", "END", "HASH SLOTS", "INDEXES", "ENTRIES CHECKED"), rows,
                            what="index files"))


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
            when = f"  ({ms_to_iso(value)})" if name.endswith("timestamp") and value > 0 else ""
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


# -- inspect ------------------------------------------------------------------------------
def _inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--json", action="store_true", help="print everything as JSON (text output shortens lists)")


def run_inspect(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    ctl = read_control_block(root)
    positions = ctl["positions"] if ctl and "positions" in ctl else None
    bar = _progress_bar(args, "inspect")
    try:
        inv = inventory(root, flushed=positions["flushed"] if positions else None, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        _print_json(_inspect_json(inv, owner, positions))
    else:
        _print_inspect(inv, owner, ctl, positions)
    return EXIT_OK


def _topics(queues: list[QueueInfo]) -> dict[str, dict[str, int]]:
    topics: dict[str, dict[str, int]] = {}
    for q in queues:
        t = topics.setdefault(q.topic, {"queues": 0, "messages": 0})
        t["queues"] += 1
        t["messages"] += q.messages
    return topics


def _inspect_json(inv: Inventory, owner: dict[str, Any], positions: dict[str, int] | None) -> dict[str, Any]:
    return {
        "root": inv.root, "status": owner["status"], "positions": positions,
        "commitlog": {"file_size": inv.log_files[0].size if inv.log_files else 0, "min_offset": inv.log_min,
                      "end": inv.log_end, "files": [dataclasses.asdict(f) for f in inv.log_files]},
        "topics": _topics(inv.queues),
        "queues": [{**dataclasses.asdict(q), "messages": q.messages} for q in inv.queues],
        "index_files": [dataclasses.asdict(f) for f in inv.index_files],
    }


def _log_file_end(f: LogFile, log_end: int) -> str:
    """How a CommitLog file ends, in one word or two (docs/cli.md lists them)."""
    if f.stop_reason == "blank":
        return "blank"
    if f.stop_reason == "end":
        return "full"
    if f.dirty_bytes:
        return f"torn {f.dirty_bytes:,}"
    if f.records == 0 and f.file_from > log_end:
        return "empty"
    return "end of log" if f.file_from + f.wrote == log_end else "ends early"


def _print_inspect(inv: Inventory, owner: dict[str, Any], ctl: dict[str, Any] | None,
                   positions: dict[str, int] | None) -> None:
    print(f"store {inv.root}")
    print(f"  status: {_describe_status(owner, ctl)}")
    files = inv.log_files
    size = f" of {files[0].size:,} bytes" if files else ""
    where = (f", flushed to {positions['flushed']:,}" if positions is not None else
             ", flushed position unknown (no control block)")
    print(f"  commitlog: {len(files)} file(s){size}, records from {inv.log_min:,} to {inv.log_end:,}{where} "
          f"(records parsed, CRCs not checked)")
    rows: list[Sequence[Any]] = [(f.name, f.file_from, f.wrote, f.flushed, f.records, _log_file_end(f, inv.log_end))
                                 for f in files]
    _print_lines(_table(("FILE", "FROM", "WROTE", "FLUSHED", "RECORDS", "END"), rows, what="files"))
    topics = _topics(inv.queues)
    print(f"  topics: {len(topics)}, queues: {len(inv.queues)}, messages: "
          f"{sum(q.messages for q in inv.queues):,}")
    rows = [(q.topic, q.queue_id, q.min_offset, q.max_offset, q.messages, _phy(q.min_phy_offset),
             _phy(q.max_phy_offset), len(q.files)) for q in inv.queues]
    _print_lines(_table(("TOPIC", "QUEUE", "MIN", "MAX", "MESSAGES", "MIN PHY", "MAX PHY", "FILES"), rows,
                        what="queues"))
    cq_files = [(q, f) for q in inv.queues for f in q.files]
    if cq_files:
        print(f"  consumequeue files: {len(cq_files)}")
        rows = [(f"{q.topic}/{q.queue_id}", f.name, f.file_from // 20, f.size, f.wrote, f.wrote // 20,
                 f.dirty_bytes or None) for q, f in cq_files]
        _print_lines(_table(("QUEUE", "FILE", "FIRST OFFSET", "SIZE", "WROTE", "UNITS", "TORN"), rows,
                            what="files"))
    print(f"  index: {len(inv.index_files)} file(s)")
    rows = [(f.name, f.size, f.error or _when(f.begin_timestamp), _when(f.end_timestamp),
             f.hash_slot_count, f.index_count) for f in inv.index_files]
    _print_lines(_table(("FILE", "SIZE", "BEGIN", "END", "HASH SLOTS", "INDEXES"), rows, what="index files"))


def _phy(offset: int) -> int | None:
    return None if offset < 0 else offset


# -- dump ---------------------------------------------------------------------------------
class UsageError(MQStoreError):
    """Options that argparse cannot check alone (which ones go together)."""


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _dump_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--phy", type=int, metavar="OFFSET", help="the record at this physical (CommitLog) offset")
    where.add_argument("--topic", metavar="T", help="records of this topic's queue --queue, through its ConsumeQueue")
    p.add_argument("--queue", type=int, metavar="Q", help="queue id (with --topic)")
    p.add_argument("--from", dest="from_offset", type=int, metavar="QOFF",
                   help="first queue offset (with --topic; default: the queue's min offset)")
    p.add_argument("--count", type=_positive, default=1, metavar="N", help="records to show (default 1)")
    p.add_argument("--body", choices=("none", "hex", "text"), default="none",
                   help="show the body as a hex dump or as UTF-8 text (default: its length only)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")


def run_dump(args: argparse.Namespace) -> int:
    if args.topic is not None and args.queue is None:
        raise UsageError("--topic needs --queue Q")
    if args.phy is not None and (args.queue is not None or args.from_offset is not None):
        raise UsageError("--queue and --from go with --topic, not with --phy")
    root = require_store(args.store_dir)
    with LogReader(root) as log:
        if args.phy is not None:
            entries = log.records_at(args.phy, args.count)
            where: dict[str, Any] = {"phy": args.phy}
        else:
            info, entries = queue_records(root, log, args.topic, args.queue, args.from_offset, args.count)
            where = {"topic": info.topic, "queue_id": info.queue_id, "min_offset": info.min_offset,
                     "max_offset": info.max_offset}
        if args.json:
            _print_json({"root": root, **where, "count": len(entries),
                         "records": [_entry_json(e, args.body) for e in entries]})
        else:
            for i, entry in enumerate(entries):
                if i:
                    print()
                _print_entry(entry, args.body)
            if len(entries) < args.count:
                print(f"\n({len(entries)} of {args.count} shown: "
                      f"{'the queue ends' if args.phy is None else 'the log ends'} there)")
    return EXIT_OK


SYS_FLAG_BITS = ((0x1, "COMPRESSED"), (0x2, "MULTI_TAGS"), (0x10, "BORNHOST_V6"), (0x20, "STOREHOST_V6"),
                 (0x40, "NEED_UNWRAP"), (0x80, "INNER_BATCH"))
TRANSACTION_TYPES = {0x0: "NOT", 0x4: "PREPARED", 0x8: "COMMIT", 0xC: "ROLLBACK"}
COMPRESSION_TYPES = {0x100: "LZ4", 0x200: "ZSTD", 0x300: "ZLIB"}


def _sys_flag_names(sys_flag: int) -> list[str]:
    """spec §1.3: the bits of SYSFLAG by name; the transaction type is always named."""
    names = [name for bit, name in SYS_FLAG_BITS if sys_flag & bit]
    names.append(f"TRANSACTION_{TRANSACTION_TYPES[sys_flag & 0xC]}")
    if sys_flag & 0x700:
        names.append(f"COMPRESSION_{COMPRESSION_TYPES.get(sys_flag & 0x700, hex(sys_flag & 0x700))}")
    return names


def _host(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _body(body: bytes, mode: str) -> str | None:
    if mode == "hex":
        return body.hex()
    if mode == "text":
        return body.decode("utf-8", errors="replace")
    return None


def _record_json(rec: DecodedRecord, entry: DumpEntry, body_mode: str) -> dict[str, Any]:
    body = rec.body or b""
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name != "body"}
    return {**fields, "born_host": _host(rec.born_host), "store_host": _host(rec.store_host),
            "version": "V2" if rec.is_v2 else "V1", "sys_flag_names": _sys_flag_names(rec.sys_flag),
            "tags": rec.tags, "tags_code": rec.tags_code, "keys": rec.keys, "uniq_key": rec.uniq_key,
            "msg_id": rec.msg_id, "body_length": len(body), "computed_body_crc": entry.computed_crc,
            "body_crc_ok": entry.crc_ok, "body": _body(body, body_mode)}


def _entry_json(entry: DumpEntry, body_mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {"physical_offset": entry.phy, "file": entry.file_name or None}
    if entry.unit is not None:
        phy, size, tags = entry.unit
        out.update(queue_offset=entry.queue_offset, unit={"phy_offset": phy, "size": size, "tags_code": tags})
    out["note"] = entry.note or None
    out["record"] = None if entry.record is None else _record_json(entry.record, entry, body_mode)
    return out


def _print_entry(entry: DumpEntry, body_mode: str) -> None:
    if entry.unit is not None:
        phy, size, tags = entry.unit
        print(f"queue offset {entry.queue_offset}: unit phy {phy:,}, size {size:,}, tags code {tags}")
    rec = entry.record
    if rec is None:
        print(f"  NOTE {entry.note}")
        return
    body = rec.body or b""
    pos = entry.phy - int(entry.file_name)  # a CommitLog file is named by its start offset
    print(f"record at {entry.phy:,} (file {entry.file_name}, position {pos:,})")
    crc = "ok" if entry.crc_ok else f"MISMATCH: the body's CRC is {entry.computed_crc}"
    rows = [
        ("topic", rec.topic),
        ("queue id", rec.queue_id),
        ("queue offset", rec.queue_offset),
        ("physical offset", f"{rec.physical_offset:,}"),
        ("total size", f"{rec.total_size:,} (body {len(body):,}, topic {len(rec.topic.encode()):,}, properties "
                       f"{len(rec.properties_string.encode()):,})"),
        ("magic", f"0x{rec.magic & 0xFFFFFFFF:08X} ({'V2' if rec.is_v2 else 'V1'})"),
        ("body CRC", f"{rec.body_crc} ({crc})"),
        ("flag", rec.flag),
        ("sys flag", f"0x{rec.sys_flag:X} ({', '.join(_sys_flag_names(rec.sys_flag))})"),
        ("born", f"{rec.born_timestamp} ({ms_to_iso(rec.born_timestamp)}) from {_host(rec.born_host)}"),
        ("stored", f"{rec.store_timestamp} ({ms_to_iso(rec.store_timestamp)}) at {_host(rec.store_host)}"),
        ("reconsume times", rec.reconsume_times),
        ("prepared tx offset", rec.prepared_transaction_offset),
        ("properties", ", ".join(f"{k}={_printable(v)}" for k, v in rec.properties.items()) or "(none)"),
        ("tags", f"{_printable(rec.tags)} (tags code {rec.tags_code})" if rec.tags else "(none)"),
        ("keys", " ".join(_printable(k) for k in rec.keys) or "(none)"),
        ("unique key", rec.uniq_key or "(none)"),
        ("msg id", rec.msg_id),
        ("body", f"{len(body):,} bytes"),
    ]
    for name, value in rows:
        print(f"  {name:<19} {value}")
    if entry.note:
        print(f"  NOTE {entry.note}")
    if body_mode == "hex":
        _print_lines(_hexdump(body))
    elif body_mode == "text":
        print(textwrap.indent(_printable(body.decode("utf-8", errors="replace"), keep="\n\t"), "    "))


def _printable(text: str | None, keep: str = "") -> str:
    """text with control characters escaped, so a record cannot drive the terminal."""
    if text is None:
        return ""
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text)


def _hexdump(data: bytes, width: int = 16) -> list[str]:
    lines = []
    for at in range(0, len(data), width):
        chunk = data[at:at + width]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"    {at:08x}  {chunk.hex(' '):<{width * 3 - 1}}  {text}")
    return lines


# -- recover ------------------------------------------------------------------------------
def _recover_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--no-crc", action="store_true",
                   help="plan as a store with check_crc_on_recover=false (records are still parsed)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def run_recover(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    bar = _progress_bar(args, "recover")
    try:
        plan = plan_recovery(root, check_crc=False if args.no_crc else None, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        _print_json(_recover_json(plan, owner, root))
    else:
        _print_recover(plan, owner, root, read_control_block(root))
    return EXIT_PROBLEMS if plan.drops_data else EXIT_OK


def _recover_json(plan: RecoveryPlan, owner: dict[str, Any], root: str) -> dict[str, Any]:
    report = {k: v for k, v in plan.report.to_dict().items() if k != "elapsed_ms"}
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in ("report", "queues")}
    return {"root": root, "status": owner["status"], "dry_run": True, "drops_data": plan.drops_data, "report": report,
            **fields, "queues": [{**dataclasses.asdict(q), "changed": q.changed} for q in plan.queues]}


#: RecoveryReport fields the text output words itself; any other field that is set is listed
#: as the open reports it
RECOVER_SHOWN = frozenset({"clean_shutdown", "mode", "files_scanned", "first_file_scanned", "records", "bytes_scanned",
                           "valid_end", "stop_reason", "dropped_bytes", "deleted_files", "queues",
                           "queue_units_dropped", "queue_files_deleted", "dispatch_from", "redispatched_records",
                           "last_store_timestamp", "elapsed_ms"})


def _print_recover(plan: RecoveryPlan, owner: dict[str, Any], root: str, ctl: dict[str, Any] | None) -> None:
    r = plan.report
    print(f"store {root}: recovery dry run (nothing was changed)")
    print(f"  status: {_describe_status(owner, ctl)}")
    if owner["status"] == "running":
        print("  WARNING: a store holds the lock, so opening it now would fail; below is what an open would do if "
              "that store died now, read from files that are still changing")
    if r.clean_shutdown:
        print("  recovery: normal (no abort file: the last run shut down cleanly); the scan starts at the "
              "third-last file")
    else:
        cp = plan.checkpoint
        print("  recovery: abnormal (the abort file is present); the scan starts at the newest file whose first "
              "record is not newer than the checkpoint's min timestamp (spec §5.5)")
        print(f"    checkpoint: physic {_when(cp['physic_msg_timestamp'])}, logics "
              f"{_when(cp['logics_msg_timestamp'])}, index {_when(cp['index_msg_timestamp'])}; min timestamp "
              f"{plan.min_timestamp} ({_when(plan.min_timestamp)})")
    _print_recover_log(plan)
    _print_recover_queues(plan)
    if plan.index_files_destroyed:
        print(f"  index: would destroy {len(plan.index_files_destroyed)} file(s) ending after checkpoint."
              f"indexMsgTimestamp {plan.checkpoint['index_msg_timestamp']}: {', '.join(plan.index_files_destroyed)}")
    if plan.leftovers:
        print(f"  leftovers of interrupted allocations, would be removed: {', '.join(plan.leftovers)}")
    print(f"  dispatch: would start at {r.dispatch_from:,} and re-dispatch {plan.redispatch_bytes:,} bytes "
          f"({r.redispatched_records:,} records) to the ConsumeQueues and the index")
    more = {k: v for k, v in r.to_dict().items() if k not in RECOVER_SHOWN and v not in (0, -1, "", [], {}, None)}
    if more:
        print("  the open also reports:")
        for name, value in more.items():
            print(f"    {name}: {value}")
    if plan.drops_data:
        units = sum(max(q.units_dropped, q.max_offset - q.kept_offset) for q in plan.queues)
        print(f"  verdict: opening would drop {r.dropped_bytes + plan.deleted_files_data_bytes:,} bytes of the "
              f"CommitLog and {units:,} ConsumeQueue unit(s)")
    else:
        print("  verdict: opening would drop nothing that was written")


def _print_recover_log(plan: RecoveryPlan) -> None:
    r = plan.report
    if not plan.commitlog_files:
        print("  commitlog: no files (the open starts an empty log)")
        return
    why = {"blank": "the END_OF_FILE blank of the last file", "end": "the end of the last file",
           "invalid": "bytes that are not a valid record (zeros after the last record, or damage)"}
    print(f"  commitlog: {len(plan.commitlog_files)} file(s); the scan starts at {r.first_file_scanned} (offset "
          f"{plan.scan_start:,}, first record stored {_when(plan.scan_start_timestamp)})")
    print(f"    {r.records:,} records in {r.files_scanned} file(s), CRCs {'' if plan.check_crc else 'not '}checked; "
          f"valid end {r.valid_end:,}, at {why.get(r.stop_reason, r.stop_reason)}")
    if r.dropped_bytes:
        print(f"    would zero {r.dropped_bytes:,} bytes after the valid end (a torn or damaged tail)")
    if r.deleted_files:
        held = (f", holding {plan.deleted_files_data_bytes:,} bytes of data" if plan.deleted_files_data_bytes else
                " (empty: allocated ahead)")
        print(f"    would delete {len(r.deleted_files)} file(s) after the valid end{held}: {', '.join(r.deleted_files)}")


def _print_recover_queues(plan: RecoveryPlan) -> None:
    if plan.queues_destroyed:
        print(f"  consumequeues: the CommitLog is empty: would destroy all {plan.queues_destroyed} queue(s)")
        return
    changed = [q for q in plan.queues if q.changed]
    print(f"  consumequeues: {len(plan.queues)} queue(s), {len(changed)} would change, "
          f"{plan.report.dropped_units:,} unit(s) dropped")
    rows = [(f"{q.topic}/{q.queue_id}", q.max_offset, q.kept_offset, q.units_dropped, q.bytes_zeroed or None,
             ", ".join(q.files_deleted) or None) for q in changed]
    _print_lines(_table(("QUEUE", "NEXT OFFSET", "KEPT TO", "UNITS DROPPED", "BYTES ZEROED", "FILES DELETED"), rows,
                        what="queues"))


# -- stats --------------------------------------------------------------------------------
def _stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                   help="seconds between samples: the rates are over this interval (default 1)")
    once = p.add_mutually_exclusive_group()
    once.add_argument("--once", action="store_true", help="print one sample (rates over --interval) and stop")
    once.add_argument("--count", type=_positive, metavar="N", help="stop after N samples (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="print one JSON object per sample, one per line")


def run_stats(args: argparse.Namespace) -> int:
    return stats.render(args.store_dir, once=args.once, interval=args.interval, json=args.json, count=args.count)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


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


def _when(ms: int) -> str:
    """A store / checkpoint time for people: UTC, or "none" for 0 (never written)."""
    return ms_to_iso(ms) if ms > 0 else "none"


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, what: str, indent: str = "    ",
           limit: int = LIST_LIMIT) -> list[str]:
    """Aligned columns for people: numbers right-aligned with thousands separators, text left-
    aligned. At most limit rows (the first limit - 5 and the last 5), and a line saying how
    many were left off; --json lists all."""
    if not rows:
        return []
    shown: list[Sequence[Any] | None] = list(rows)
    if len(rows) > limit:
        shown = [*rows[:limit - 5], None, *rows[-5:]]
    real = [row for row in shown if row is not None]
    numeric = [all(isinstance(r[i], int) or r[i] is None for r in real) for i in range(len(headers))]
    cells = [[_cell(v) for v in row] if row is not None else None for row in shown]
    widths = [max([len(h)] + [len(c[i]) for c in cells if c is not None]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return indent + "  ".join(v.rjust(w) if num else v.ljust(w)
                                  for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(headers)]
    for c in cells:
        out.append(line(c) if c is not None else f"{indent}... {len(rows) - limit} more {what} "
                                                  f"(--json lists all)")
    return out


class ProgressBar:
    """One line on a terminal's stderr, redrawn in place with '\\r' and cleared when done, for
    commands that read many files. Draws at most every REDRAW_S seconds."""

    WIDTH = 30
    REDRAW_S = 0.1

    def __init__(self, command: str, stream: TextIO) -> None:
        self.command = command
        self.stream = stream
        self._last = 0.0
        self._shown = 0
        self._what = ""
        self._what_started = time.monotonic()

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if what != self._what:
            self._what, self._what_started = what, now
        if done < total and now - self._last < self.REDRAW_S:
            return
        self._last = now
        filled = min(self.WIDTH, self.WIDTH * done // total) if total else self.WIDTH
        self.draw(f"{self.command}: [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                  f"{describe(what, done, total, now - self._what_started)}")

    def draw(self, text: str) -> None:
        text = text[:max(20, shutil.get_terminal_size().columns - 1)]  # one line, never wrapped
        self.stream.write("\r" + text.ljust(self._shown))
        self.stream.flush()
        self._shown = len(text)

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0


def _progress_bar(args: argparse.Namespace, command: str) -> ProgressBar | None:
    """A bar on stderr if it is a terminal and the output is for people (not --json)."""
    if args.json or not sys.stderr.isatty():
        return None
    return ProgressBar(command, sys.stderr)


# -- the command --------------------------------------------------------------------------
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]

COMMANDS: dict[str, Command] = {
    "verify": ("check every invariant of a store directory (read-only)", _verify_arguments, run_verify),
    "info": ("show the files, owner, checkpoint and control block of a store (read-only)", _info_arguments, run_info),
    "inspect": ("list topics, queues, every CommitLog / ConsumeQueue file with its positions, and the index files "
                "(read-only)", _inspect_arguments, run_inspect),
    "dump": ("decode records at a physical offset or a queue offset range, every field (read-only)",
             _dump_arguments, run_dump),
    "recover": ("dry run: what opening the store would recover, truncate and re-dispatch (read-only)",
                _recover_arguments, run_recover),
    "node": ("run a node (owner + allocator, flusher, dispatcher processes) on a store until SIGTERM/SIGINT; "
             "'node status DIR' shows a running one", node_cli.add_arguments, node_cli.run),
    "stats": ("live figures of a store from its control block: rates, latencies, positions, flags (read-only)",
              _stats_arguments, run_stats),
}


def build_parser() -> argparse.ArgumentParser:
    from mqstore import __version__

    parser = argparse.ArgumentParser(
        prog="mqstore",
        description="Run and inspect mqstore (RocketMQ message store) directories: 'node' owns a store and "
                    "writes it; verify, info, inspect, dump, recover and stats only read (they work while a node "
                    "runs).",
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
