"""``mqstore inspect``: topics and queues, every file with its positions, the index files."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from mqstore.queue.files import LogFile, QueueInfo
from mqstore.tools.inspection import LogInventory, Inventory, inventory
from mqstore.exit_codes import EXIT_OK
from mqstore.log.directory import lock_state, require_store
from mqstore.tools.commands.common import describe_status, phy_offset_arg, print_json, print_lines, progress_bar, read_control_block, table, when


# -- inspect ------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--json", action="store_true", help="print everything as JSON (text output shortens lists)")


def run(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    ctl = read_control_block(root)
    positions = ctl["positions"] if ctl and "positions" in ctl else None
    bar = progress_bar(args, "inspect")
    try:
        inv = inventory(root, flushed=positions["flushed"] if positions else None, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print_json(_inspect_json(inv, owner, positions))
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
    out = {
        "root": inv.root, "status": owner["status"], "positions": positions,
        "commitlog": {"file_size": inv.log_files[0].size if inv.log_files else 0, "min_offset": inv.log_min,
                      "end": inv.log_end, "files": [dataclasses.asdict(f) for f in inv.log_files]},
        "topics": _topics(inv.queues),
        "queues": [{**dataclasses.asdict(q), "messages": q.messages} for q in inv.queues],
        "index_files": [dataclasses.asdict(f) for f in inv.index_files],
    }
    if inv.logs:  # several CommitLogs: each one ("commitlog" and "index_files" above are log 0's)
        out["commitlogs"] = [{"log": lg.log, "min_offset": lg.min_offset, "end": lg.end,
                              "files": [dataclasses.asdict(f) for f in lg.files],
                              "index_files": [dataclasses.asdict(f) for f in lg.index_files]} for lg in inv.logs]
    return out


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
    print(f"  status: {describe_status(owner, ctl)}")
    each: list[LogInventory | None] = list(inv.logs) or [None]
    for lg in each:
        files, log_min, log_end = (inv.log_files, inv.log_min, inv.log_end) if lg is None else \
            (lg.files, lg.min_offset, lg.end)
        size = f" of {files[0].size:,} bytes" if files else ""
        where = (f", flushed to {positions['flushed']:,}" if positions is not None and lg is None else
                 "" if lg is not None else ", flushed position unknown (no control block)")
        name = "commitlog" if lg is None else f"commitlog {lg.log}"
        print(f"  {name}: {len(files)} file(s){size}, records from {log_min:,} to {log_end:,}{where} "
              f"(records parsed, CRCs not checked)")
        rows: list[Sequence[Any]] = [(f.name, f.file_from, f.wrote, f.flushed, f.records, _log_file_end(f, log_end))
                                     for f in files]
        print_lines(table(("FILE", "FROM", "WROTE", "FLUSHED", "RECORDS", "END"), rows, what="files"))
    topics = _topics(inv.queues)
    print(f"  topics: {len(topics)}, queues: {len(inv.queues)}, messages: "
          f"{sum(q.messages for q in inv.queues):,}")
    rows = [(q.topic, q.queue_id, q.min_offset, q.max_offset, q.messages, phy_offset_arg(q.min_phy_offset),
             phy_offset_arg(q.max_phy_offset), len(q.files)) for q in inv.queues]
    print_lines(table(("TOPIC", "QUEUE", "MIN", "MAX", "MESSAGES", "MIN PHY", "MAX PHY", "FILES"), rows,
                        what="queues"))
    cq_files = [(q, f) for q in inv.queues for f in q.files]
    if cq_files:
        print(f"  consumequeue files: {len(cq_files)}")
        rows = [(f"{q.topic}/{q.queue_id}", f.name, f.file_from // 20, f.size, f.wrote, f.wrote // 20,
                 f.dirty_bytes or None) for q, f in cq_files]
        print_lines(table(("QUEUE", "FILE", "FIRST OFFSET", "SIZE", "WROTE", "UNITS", "TORN"), rows,
                            what="files"))
    for k, index in enumerate([lg.index_files for lg in inv.logs] or [inv.index_files]):
        print(f"  index{f' of commitlog {k}' if inv.logs else ''}: {len(index)} file(s)")
        rows = [(f.name, f.size, f.error or when(f.begin_timestamp), when(f.end_timestamp),
                 f.hash_slot_count, f.index_count) for f in index]
        print_lines(table(("FILE", "SIZE", "BEGIN", "END", "HASH SLOTS", "INDEXES"), rows, what="index files"))
