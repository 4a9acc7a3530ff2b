"""``mqstore recover``: the recovery dry run (what opening the store would do)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from mqstore.tools.inspection import RecoveryPlan, plan_recovery
from mqstore.exit_codes import EXIT_OK, EXIT_PROBLEMS
from mqstore.log.directory import lock_state, require_store
from mqstore.tools.commands.common import describe_status, print_json, print_lines, progress_bar, read_control_block, table, when


# -- recover ------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--no-crc", action="store_true",
                   help="plan as a store with check_crc_on_recover=false (records are still parsed)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    root = require_store(args.store_dir)
    owner = lock_state(root)
    bar = progress_bar(args, "recover")
    try:
        plan = plan_recovery(root, check_crc=False if args.no_crc else None, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print_json(_recover_json(plan, owner, root))
    else:
        _print_recover(plan, owner, root, read_control_block(root))
    return EXIT_PROBLEMS if plan.drops_data else EXIT_OK


def _recover_json(plan: RecoveryPlan, owner: dict[str, Any], root: str) -> dict[str, Any]:
    out = {"root": root, "status": owner["status"], "dry_run": True, "drops_data": plan.drops_data, **_plan_json(plan)}
    if plan.logs:  # several CommitLogs: each log's plan (the fields above are log 0's)
        out["commitlogs"] = [_plan_json(p) for p in plan.logs]
    return out


def _plan_json(plan: RecoveryPlan) -> dict[str, Any]:
    report = {k: v for k, v in plan.report.to_dict().items() if k != "elapsed_ms"}
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)
              if f.name not in ("report", "queues", "logs") and (f.name != "log" or plan.logs or plan.log)}
    return {"report": report, **fields,
            "queues": [{**dataclasses.asdict(q), "changed": q.changed} for q in plan.queues]}


#: RecoveryReport fields the text output words itself; any other field that is set is listed
#: as the open reports it
RECOVER_SHOWN = frozenset({"clean_shutdown", "mode", "files_scanned", "first_file_scanned", "records", "bytes_scanned",
                           "valid_end", "stop_reason", "dropped_bytes", "deleted_files", "queues",
                           "queue_units_dropped", "queue_files_deleted", "dispatch_from", "redispatched_records",
                           "last_store_timestamp", "elapsed_ms"})


def _print_recover(plan: RecoveryPlan, owner: dict[str, Any], root: str, ctl: dict[str, Any] | None) -> None:
    r = plan.report
    print(f"store {root}: recovery dry run (nothing was changed)")
    print(f"  status: {describe_status(owner, ctl)}")
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
        print(f"    checkpoint: physic {when(cp['physic_msg_timestamp'])}, logics "
              f"{when(cp['logics_msg_timestamp'])}, index {when(cp['index_msg_timestamp'])}; min timestamp "
              f"{plan.min_timestamp} ({when(plan.min_timestamp)})")
    for each in plan.logs or [plan]:
        if plan.logs:
            print(f"  CommitLog {each.log} of {len(plan.logs)}: {each.report.mode} recovery")
        _print_recover_log(each)
        _print_recover_queues(each)
        if each.index_files_destroyed:
            print(f"  index: would destroy {len(each.index_files_destroyed)} file(s) ending after checkpoint."
                  f"indexMsgTimestamp {each.checkpoint['index_msg_timestamp']}: {', '.join(each.index_files_destroyed)}")
        if each.leftovers:
            print(f"  leftovers of interrupted allocations, would be removed: {', '.join(each.leftovers)}")
        er = each.report
        print(f"  dispatch: would start at {er.dispatch_from:,} and re-dispatch {each.redispatch_bytes:,} bytes "
              f"({er.redispatched_records:,} records) to the ConsumeQueues and the index")
        more = {k: v for k, v in er.to_dict().items() if k not in RECOVER_SHOWN and v not in (0, -1, "", [], {}, None)}
        if more:
            print("  the open also reports:")
            for name, value in more.items():
                print(f"    {name}: {value}")
    if plan.drops_data:
        plans = plan.logs or [plan]
        units = sum(max(q.units_dropped, q.max_offset - q.kept_offset) for p in plans for q in p.queues)
        dropped = sum(p.report.dropped_bytes + p.deleted_files_data_bytes for p in plans)
        print(f"  verdict: opening would drop {dropped:,} bytes of the CommitLog and {units:,} ConsumeQueue unit(s)")
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
          f"{plan.scan_start:,}, first record stored {when(plan.scan_start_timestamp)})")
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
    print_lines(table(("QUEUE", "NEXT OFFSET", "KEPT TO", "UNITS DROPPED", "BYTES ZEROED", "FILES DELETED"), rows,
                        what="queues"))
