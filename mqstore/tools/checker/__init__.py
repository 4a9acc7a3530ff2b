"""The store-wide invariant checker (style.md: sortedcontainers' ``_check()`` after every step).

``check_store(root)`` verifies a store directory.

CommitLog: every record parses and its CRC matches, every record's PHYSICALOFFSET is where it
sits and its QUEUEID is not negative (recovery ends the log at a record failing either, see
mqstore.queue.recovery.header_problem), store timestamps never go back, every file but the last ends with a well-formed
END_OF_FILE blank, nothing but zeros follows the end of the log (files after it may exist,
pre-allocated and empty), queue offsets of each queue are consecutive, and, when a control
block is present, its positions are ordered (flushed <= committed <= wrote) and agree with the
files, as does its topic-queue table.

ConsumeQueues (``consumequeue/<topic>/<int queueId>/``, spec §3): all files have one size (the
configured one when a config is given), are contiguous and named by logical byte offset;
units are read up to the first invalid one (phyOffset < 0 or size <= 0). Filler units
(0, 0x7FFFFFFF, 0) are counted: before the first real unit they are the pre-fill of a queue
that starts above 0, later they stand for skipped offsets (``gaps``). Every real unit points at
a record of the valid log (or below its first file: removed by retention) whose TOTALSIZE,
topic, queue id and QUEUEOFFSET match the unit, of transaction type NOT or COMMIT, whose tags
code matches (a delivery time >= the store timestamp for a delayed SCHEDULE_TOPIC_XXXX
record); phyOffsets strictly increase along a queue. When the store is quiescent and was
closed cleanly (no ``abort`` file), every NOT/COMMIT record of the log must have its unit.

Index files (``index/``, spec §4.1): the header is sane, every entry chains only to older
entries of its own hash slot, the hash slots point at the newest entry of their chain, and
every entry's keyHash is the hash of one of the keys (topic#UNIQ_KEY, topic#k for each KEYS
word) of the record it points at. Entries are checked when the file size matches the
configured (or default) max_hash_slot_num / max_index_num; otherwise the file is noted and
only its header checked.

Stress and crash tests call it after every step; ``mqstore verify`` runs it.

The package, by concept: ``report`` (what a check found), ``commitlog`` (the scan of the log),
``control_block`` (positions and the topic-queue table against the files), ``records`` (a
record by physical offset, what units and entries are checked against), ``queues`` (the
ConsumeQueues) and ``index`` (the IndexFiles); ``check_store`` here runs them in that order.
"""

from __future__ import annotations

import os
from array import array
from typing import TYPE_CHECKING

from mqstore.queue._index import index_key_hash
from mqstore.layout import FENCE_NAME, abort_path, log_base
from mqstore.tools.checker.commitlog import LogScan, _commitlog_dir, scan_commitlog
from mqstore.tools.checker.control_block import _check_control_block, _read_positions
from mqstore.tools.checker.index import _check_index_files
from mqstore.tools.checker.queues import _check_consume_queues, unit_mismatch
from mqstore.tools.checker.records import _Log, _Logs
from mqstore.queue.files import queue_log, store_config
from mqstore.tools.checker.report import (CheckReport, ConsumeQueueSummary, IndexFileSummary, Problem, ProblemSink,
                                          Progress, QueueSummary)

if TYPE_CHECKING:
    from mqstore.config import StoreConfig

__all__ = ["CheckReport", "ConsumeQueueSummary", "IndexFileSummary", "LogScan", "Problem", "QueueSummary",
           "check_store", "index_key_hash", "unit_mismatch"]

def check_store(root: str, *, check_crc: bool = True, allow_torn_tail: bool = False,
                quiescent: bool = True, max_problems: int = 200, config: StoreConfig | None = None,
                check_queues_complete: bool | None = None, progress: Progress | None = None,
                deep: bool = False) -> CheckReport:
    """Check every invariant of the store at root; see the module docstring.

    Every file is opened read-only (MappedFile.open(readonly=True), the control block
    attached read-only), so the check works on a read-only mount.

    allow_torn_tail: a store that crashed and was not reopened may hold a partly written
    record after its valid end; count it in ``torn_tail_bytes`` instead of failing.
    quiescent: no writer is active, so the control block's wrote position must equal the end
    found in the files. With quiescent=False (writers may be running) the positions are read
    before the scan: the log must reach at least that wrote position, and bytes after it that
    do not parse yet are a record being written, not a problem; so are ConsumeQueue units and
    index entries pointing past the end of the log found by the scan.

    A partly written record is a torn tail (allow_torn_tail) in the last file that holds data;
    files after it that the allocate service created ahead are empty.

    config: the store's configuration: the ConsumeQueue file size and the index geometry
    (max_hash_slot_num, max_index_num). Without it the ConsumeQueue file size is inferred from
    the files and the index geometry is StoreConfig()'s default; an index file of another
    size then gets its header checked only (see ``notes``).
    check_queues_complete: require every NOT/COMMIT record of the log to have its
    ConsumeQueue unit. None (default) = only when quiescent and no ``abort`` file exists (a
    crashed store rebuilds missing units at its next open; a running one dispatches behind
    the writer). Existing units are checked either way.
    progress(what, done, total): called as the work goes ("CommitLog" in bytes, then
    "ConsumeQueues" and "index files" by count), at most every few thousand records.
    deep (``mqstore verify --deep``): read every byte that the default check samples. Files
    past the end of the log must be all zeros (not only their first bytes), so must the rest
    of the file where the log ends and of the file where each ConsumeQueue ends (not only the
    next 16 pages / 64 KiB); and every hash slot of every index file is read, whatever the
    size of the slot table, and its chain walked: each slot must hold its newest entry, every
    entry on a chain must hash to that slot, and every entry must be on a chain (an entry no
    chain reaches is never found by a query). After a crash the slots are checked in the index
    files the next open keeps (those ending by checkpoint.indexMsgTimestamp), not in the
    newest ones that it destroys.
    """
    report = CheckReport(root=root)
    problems = report.problems

    def problem(where: str, offset: int, message: str) -> None:
        if len(problems) < max_problems:
            problems.append(Problem(where, offset, message))

    live_positions = None if quiescent else _read_positions(root)
    cdir = _commitlog_dir(root, config)
    names = sorted(n for n in os.listdir(cdir) if len(n) == 20 and n.isdigit()) if os.path.isdir(cdir) else []
    store_cfg = config if config is not None else store_config(root)
    if store_cfg.commit_log_count > 1:
        return _check_several(root, store_cfg, report, problem, check_crc=check_crc, allow_torn_tail=allow_torn_tail,
                              quiescent=quiescent, check_queues_complete=check_queues_complete, progress=progress,
                              deep=deep)
    if FENCE_NAME in names:
        problem(FENCE_NAME, 0, "the store has several CommitLogs (commit_log_count > 1): this checker reads "
                               "stores with one, and checks nothing else of it")
        return report
    if not names:
        _check_control_block(root, report, problem, quiescent, live_positions)
        log = _Log(0)
        try:
            _check_queues_and_index(root, report, problem, log, {}, set(), quiescent=quiescent, config=config,
                                    check_queues_complete=check_queues_complete, progress=progress, deep=deep)
        finally:
            log.close()
        return report
    scan = scan_commitlog(cdir, names, report, problem, check_crc=check_crc, allow_torn_tail=allow_torn_tail,
                          deep=deep, config=config, live_positions=live_positions, progress=progress)
    if scan is None:
        return report
    try:
        _check_control_block(root, report, problem, quiescent, live_positions, scan.blank_end)
        scan.log.end = report.valid_end
        _check_queues_and_index(root, report, problem, scan.log, scan.queue_phys, scan.broken, quiescent=quiescent,
                                config=config, check_queues_complete=check_queues_complete, progress=progress,
                                deep=deep)
    finally:
        scan.close()
    return report


def _check_several(root: str, config: StoreConfig, report: CheckReport, problem: ProblemSink, *, check_crc: bool,
                   allow_torn_tail: bool, quiescent: bool, check_queues_complete: bool | None,
                   progress: Progress | None, deep: bool) -> CheckReport:
    """check_store of a store with several CommitLogs (docs/parallel-commitlogs.md): each log
    scanned as a store's one is (its files named from its base, its own valid end, recorded in
    ``report.log_ends``), every queue's records found in the log its queue is bound to, each
    log's positions in the control block against its end; then the ConsumeQueues and every
    log's IndexFiles, each unit and entry against the log its offset names. report.valid_end
    is log 0's."""
    count = config.commit_log_count
    scans: list[LogScan] = []
    logs: list[_Log] = []
    queue_phys: dict[tuple[str, int], array] = {}
    broken: set[tuple[str, int]] = set()
    torn = 0
    try:
        for k, cdir in enumerate(config.commit_log_dirs(root)):
            names = sorted(n for n in os.listdir(cdir) if len(n) == 20 and n.isdigit() and n != FENCE_NAME) \
                if os.path.isdir(cdir) else []
            report.valid_end = report.torn_tail_bytes = 0
            live_positions = None if quiescent else _read_positions(root, k)
            before = set(report.queues)
            records, found = report.records, len(report.problems)
            blank_end = None
            if names:
                scan = scan_commitlog(cdir, names, report, problem, check_crc=check_crc,
                                      allow_torn_tail=allow_torn_tail, deep=deep, config=config,
                                      live_positions=live_positions, progress=progress)
                if scan is None:
                    report.log_problems[k] = report.problems[found:]
                    return report
                scans.append(scan)
                log, blank_end = scan.log, scan.blank_end
                queue_phys.update(scan.queue_phys)
                broken |= scan.broken
            else:
                log = _Log(config.mapped_file_size_commit_log)
                log.min_offset = report.valid_end = log_base(k)
            log.end = report.valid_end
            logs.append(log)
            report.log_ends[k] = report.valid_end
            torn += report.torn_tail_bytes
            for topic, qid in sorted(set(report.queues) - before):
                bound = queue_log(topic, qid, count)
                if bound != k:
                    problem(f"commitlog-{k}" if k else "commitlog", 0,
                            f"queue {topic}-{qid} has records in CommitLog {k}, but it is bound to CommitLog {bound}")
            _check_control_block(root, report, problem, quiescent, live_positions, blank_end, log=k,
                                 check_table=k == count - 1)
            report.log_records[k] = report.records - records
            report.log_torn_tail_bytes[k] = report.torn_tail_bytes
            report.log_problems[k] = report.problems[found:]
        report.valid_end, report.torn_tail_bytes = report.log_ends[0], torn
        every = _Logs(logs)
        _check_queues_and_index(root, report, problem, every, queue_phys, broken, quiescent=quiescent, config=config,
                                check_queues_complete=check_queues_complete, progress=progress, deep=deep,
                                log_count=count)
    finally:
        for scan in scans:
            scan.close()
        for log in logs:
            log.close()
    return report


def _check_queues_and_index(root: str, report: CheckReport, problem: ProblemSink, log: _Log | _Logs,
                            queue_phys: dict[tuple[str, int], array], broken: set[tuple[str, int]], *,
                            quiescent: bool, config: StoreConfig | None,
                            check_queues_complete: bool | None, progress: Progress | None = None,
                            deep: bool = False, log_count: int = 1) -> None:
    crashed = os.path.exists(abort_path(root))
    complete = (quiescent and not crashed) if check_queues_complete is None else check_queues_complete
    # stable: nothing writes the store now and it was shut down cleanly, so the last units and
    # index entries are whole and the index header agrees with its slots
    stable = quiescent and not crashed
    cq_size = config.mapped_file_size_consume_queue if config is not None else None
    _check_consume_queues(root, report, problem, log, queue_phys, broken, file_size=cq_size, live=not quiescent,
                          stable=stable, complete=complete, progress=progress, deep=deep)
    if progress is not None:
        progress("ConsumeQueues", len(report.consume_queues), len(report.consume_queues))
    for k in range(log_count):
        _check_index_files(root, report, problem, log, config, live=not quiescent, stable=stable, progress=progress,
                           deep=deep, log_id=k)
    if progress is not None:
        progress("index files", len(report.index_files), len(report.index_files))
