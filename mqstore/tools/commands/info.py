"""``mqstore info``: files, lock and abort state, checkpoint and control block of a store."""

from __future__ import annotations

import argparse
import os
from typing import Any

from mqstore.log.checkpoint import read_checkpoint_file
from mqstore.tools.stats import ms_to_iso
from mqstore.exit_codes import EXIT_OK
from mqstore.log.directory import lock_state, require_store
from mqstore.queue.files import store_config
from mqstore.layout import CONTROL_BLOCK_NAME, checkpoint_path
from mqstore.tools.commands.common import describe_status, kv, LIST_LIMIT, print_json, read_control_block


# -- reading a store directory (read-only) ------------------------------------------------
def read_checkpoint(root: str) -> dict[str, Any] | None:
    """The checkpoint's fields, or None if absent, {"error": ...} if too short. Read from the
    file: StoreCheckpoint opens it read-write and extends a short one."""
    path = checkpoint_path(root)
    if not os.path.isfile(path):
        return None
    try:
        return dict(read_checkpoint_file(path))
    except ValueError as exc:
        return {"error": str(exc)}




def commitlog_files(root: str) -> tuple[list[dict[str, Any]], list[str]]:
    """([{name, size}] of the CommitLog files in order, [other entries of commitlog/])."""
    cdir = store_config(root).commit_log_dir(root)  # store_path_commit_log as its owner had it
    if not os.path.isdir(cdir):
        return [], []
    files, other = [], []
    for name in sorted(os.listdir(cdir)):
        if len(name) == 20 and name.isdigit():
            files.append({"name": name, "size": os.path.getsize(os.path.join(cdir, name))})
        else:
            other.append(name)
    return files, other


# -- info ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--json", action="store_true", help="print the information as JSON")


def run(args: argparse.Namespace) -> int:
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
        print_json(info)
    else:
        _print_info(info)
    return EXIT_OK


def _print_info(info: dict[str, Any]) -> None:
    print(f"store {info['root']}")
    print(f"  status: {describe_status(info, info['control_block'])}")
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
        print(kv("    positions: ", ctl["positions"]))
        if ctl["running_flags"]:
            print(f"    running flags: {', '.join(ctl['running_flags'])}")
        nonzero = {k: v for k, v in ctl["stats"].items() if v}
        zeros = len(ctl["stats"]) - len(nonzero)
        print(kv("    stats: ", nonzero) if nonzero else "    stats: all zero")
        if nonzero and zeros:
            print(f"           ({zeros} zero counters not shown; --json lists all)")
