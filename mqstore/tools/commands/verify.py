"""``mqstore verify``: every invariant of a store (mqstore.tools.checker.check_store)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from mqstore.tools.checker import CheckReport, check_store
from mqstore.queue.files import store_config
from mqstore.exit_codes import EXIT_OK, EXIT_PROBLEMS
from mqstore.log.directory import lock_state, require_store
from mqstore.tools.commands.common import LIST_LIMIT, describe_status, kv, when, print_json, print_lines, table, progress_bar


# -- verify -------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--no-crc", action="store_true", help="skip body CRCs (faster; still parses every record)")
    p.add_argument("--deep", action="store_true",
                   help="read every byte the default check samples: whole tails of files past the end of the log "
                        "and of the queues, every hash slot of every index file with its chain; with the store's "
                        "own configuration (mqstore.config.json), so index files of any geometry are checked")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    check_crc = not args.no_crc
    deep = bool(getattr(args, "deep", False))
    config = store_config(root) if deep else None
    bar = progress_bar(args, "verify")
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
        print_json(_verify_json(report, owner, check_crc=check_crc, deep=deep))
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
        **({"log_ends": {str(k): end for k, end in sorted(report.log_ends.items())}} if report.log_ends else {}),
    }


def _print_verify(report: CheckReport, owner: dict[str, Any], *, check_crc: bool, deep: bool = False) -> None:
    verdict = "OK" if report.ok else f"{len(report.problems)} PROBLEM(S)"
    print(f"store {report.root}: {verdict}{' (deep check)' if deep else ''}")
    print(f"  status: {describe_status(owner)}")
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
        print(kv("  positions: ", report.control_block))
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
        print_lines(table(("QUEUE", "MIN", "MAX", "UNITS", "FILLERS", "GAPS", "REMOVED", "FILES"), rows,
                            what="queues"))
    if report.in_flight_units:
        print(f"  in flight: {report.in_flight_units:,} units / index entries point past the log read by the scan "
              f"(written while it ran), not checked")


def _print_verify_index(report: CheckReport) -> None:
    """The checker's index file summaries."""
    if report.index_files:
        print(f"  index: {len(report.index_files)} file(s), {report.index_entries:,} entries checked")
        rows = [(f.name, when(f.begin_timestamp), when(f.end_timestamp), f.hash_slot_count,
                 f.index_count, "yes" if f.entries_checked else "header only") for f in report.index_files]
        print_lines(table(("FILE", "BEGIN", "END", "HASH SLOTS", "INDEXES", "ENTRIES CHECKED"), rows,
                            what="index files"))
