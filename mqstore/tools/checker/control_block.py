"""The control block against the files: positions in order and at the end of the log, the
topic-queue table against the log's queue offsets."""

from __future__ import annotations

import os

from mqstore.layout import CONTROL_BLOCK_NAME
from mqstore.tools.checker.report import CheckReport


def _read_positions(root: str, log: int = 0) -> dict[str, int] | None:
    from mqstore.log import _shm

    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return None
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
    except (OSError, ValueError):
        return None  # reported by _check_control_block
    try:
        return None if ctl.state == _shm.STATE_BUILDING else ctl.positions(log)
    finally:
        ctl.close()


def _check_control_block(root: str, report: CheckReport, problem, quiescent: bool,
                         live_positions: dict[str, int] | None = None, blank_end: int | None = None, *,
                         log: int = 0, check_table: bool = True) -> None:
    """blank_end: the end of the last file when it ends with its END_OF_FILE blank. The put
    path that wrote the blank moved the wrote position there, to the start of a next file
    that a kill may have kept from being created; recovery ends the log at the blank.

    log: the CommitLog whose positions are checked against report.valid_end (its end, in a
    store with several); check_table: the topic-queue table against every queue of the log(s)
    the report holds."""
    from mqstore.log import _shm

    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
    except (OSError, ValueError) as exc:
        problem("control block", 0, f"cannot attach: {exc}")
        return
    try:
        if ctl.state == _shm.STATE_BUILDING:
            return  # being rebuilt by an owner; nothing to compare yet
        # live: the positions read before the scan (the log had reached them then)
        pos = live_positions if live_positions is not None else ctl.positions(log)
        if log == 0:
            report.control_block = pos
        where = "control block" if log == 0 else f"control block (CommitLog {log})"
        if not pos["flushed"] <= pos["committed"] <= pos["wrote"]:
            problem(where, pos["wrote"], f"positions out of order: {pos}")
        ends = (report.valid_end, blank_end)
        # what the files hold: up to the committed position with a transient store pool (the
        # rest is in its buffers), else up to the wrote position
        name = "committed" if ctl.pool_buffers else "wrote"
        end = pos[name]
        if quiescent and end not in ends:
            problem(where, end, f"{name} position {end} but the log ends at {report.valid_end}")
        if end > report.valid_end and end != blank_end:
            problem(where, end, f"{name} position is past the end of the log {report.valid_end}")
        if quiescent and check_table:
            table = {(t, q): n for t, q, n in ctl.table_items()}
            # records still in the pool's buffers (wrote past committed) have their offsets
            in_pool = ctl.pool_buffers > 0 and pos["wrote"] > pos["committed"]
            for key, summary in report.queues.items():
                got = table.get(key)
                if got != summary.last_offset + 1 and not (in_pool and got is not None and got > summary.last_offset):
                    problem("control block", 0, f"queue {key[0]}-{key[1]}: table says next offset {table.get(key)}, "
                                                f"the log's last is {summary.last_offset}")
    finally:
        ctl.close()
