"""Index files (spec §4.1): headers, hash chains, slots, entries against their records."""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from mqstore.layout import checkpoint_path, index_dir
from mqstore.tools.checker.records import _I32, TX_MASK, TX_ROLLBACK, _Log, _Logs
from mqstore.tools.checker.report import CheckReport, IndexFileSummary, ProblemSink, Progress

if TYPE_CHECKING:
    from mqstore.config import StoreConfig

INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INDEX_SLOT_TABLE_READ_MAX = 16 << 20  # read the whole slot table when it is at most this big

_INDEX_HEADER = struct.Struct(">qqqqii")
_INDEX_ENTRY = struct.Struct(">iqii")  # keyHash, commitLogOffset, timeDiff, prevIndex



def _check_index_files(root: str, report: CheckReport, problem: ProblemSink, log: _Log | _Logs,
                       config: StoreConfig | None, *, live: bool, stable: bool,
                       progress: Progress | None = None, deep: bool = False, log_id: int = 0) -> None:
    """The IndexFiles of CommitLog log_id (index/ for log 0, index-k/ for log k of a store with
    several), checked against the records."""
    idir = index_dir(root, log_id)
    if not os.path.isdir(idir):
        return
    # deep, after a crash: the files the next open keeps (spec §4.4: it destroys those ending
    # after checkpoint.indexMsgTimestamp) must have sound slots; -1: none is checked
    kept_until = -1
    if deep and not live and not stable:
        from mqstore.log.checkpoint import read_checkpoint_file

        try:
            kept_until = read_checkpoint_file(checkpoint_path(root, log_id))["index_msg_timestamp"]
        except (OSError, ValueError):
            kept_until = 0
    if config is None:
        from mqstore.config import StoreConfig

        config, given = StoreConfig(), False
    else:
        given = True
    slots, num = config.max_hash_slot_num, config.max_index_num
    expected = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slots + INDEX_ENTRY_SIZE * num
    names = sorted(os.listdir(idir))
    for i, name in enumerate(names):
        if progress is not None:
            progress("index files", i, len(names))
        path = os.path.join(idir, name)
        if len(name) != 17 or not name.isdigit() or not os.path.isfile(path):
            continue  # index files are named yyyyMMddHHmmssSSS; others are not the index's
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        with fh:
            _check_index_file(report, problem, log, fh.fileno(), name, slots, num, expected, given,
                              live=live, stable=stable, deep=deep, kept_until=kept_until,
                              where=f"{os.path.basename(idir)}/{name}")


def _check_index_file(report: CheckReport, problem: ProblemSink, log: _Log | _Logs, fd: int, name: str,
                      slots: int, num: int, expected_size: int, geometry_given: bool, *, live: bool, stable: bool,
                      deep: bool = False, kept_until: int = -1, where: str = "") -> None:
    where = where or f"index/{name}"
    size = os.fstat(fd).st_size
    if size < INDEX_HEADER_SIZE:
        problem(where, 0, f"file is {size} bytes, shorter than the {INDEX_HEADER_SIZE}-byte header")
        return
    begin_ts, end_ts, begin_phy, end_phy, slot_count, count = _INDEX_HEADER.unpack(
        os.pread(fd, INDEX_HEADER_SIZE, 0))
    summary = IndexFileSummary(name, size, begin_ts, end_ts, begin_phy, end_phy, slot_count, count)
    report.index_files.append(summary)
    # header (spec §4.1). indexCount starts at 1 (entry #0 is never used); a file whose header
    # was never written reads 0, which RocketMQ's load() also takes as 1.
    if count < 0 or (count == 0 and slot_count != 0):
        problem(where, 0, f"header: index_count {count} (at least 1; 0 only in a file never written to)")
        return
    used = max(count, 1)  # entries #0 .. #used-1 are written (#0 never)
    if slot_count < 0 or (stable and slot_count > used - 1):
        problem(where, 0, f"header: hash_slot_count {slot_count} with {used - 1} entries")
    if stable and count > 1 and begin_ts > end_ts:
        problem(where, 0, f"header: begin timestamp {begin_ts} is after the end timestamp {end_ts}")
    if size != expected_size:
        if geometry_given:
            problem(where, 0, f"file is {size} bytes; max_hash_slot_num={slots} and max_index_num={num} make "
                              f"{expected_size}")
        else:
            report.notes.append(f"{where}: {size} bytes is not the size of an index file with the default "
                                f"max_hash_slot_num={slots} and max_index_num={num}; only its header was checked "
                                f"(pass the store's config to check its entries)")
        return
    if slot_count > slots:
        problem(where, 0, f"header: hash_slot_count {slot_count} is more than the {slots} hash slots")
    if count > num:
        problem(where, 0, f"header: index_count {count} is more than max_index_num {num}")
        used = num
    summary.entries_checked = True
    area = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slots
    entries = list(_INDEX_ENTRY.iter_unpack(os.pread(fd, INDEX_ENTRY_SIZE * used, area)))
    newest: dict[int, int] = {}  # hash slot -> its newest entry
    last_phy = -1
    bounds = log.bounds
    for n in range(1, used):
        key_hash, phy, time_diff, prev = entries[n]
        msgs = []
        slot = key_hash % slots
        older = newest.get(slot, 0)
        if prev < 0 or prev >= n:
            msgs.append(f"previous entry {prev} is not an older entry")
        elif prev != older:
            msgs.append(f"previous entry {prev}, but the newest older entry of its hash slot {slot} is {older}")
        newest[slot] = n
        if key_hash < 0:
            msgs.append(f"keyHash {key_hash} is negative")
        if time_diff < 0:
            msgs.append(f"timeDiff {time_diff} is negative")
        if phy < last_phy:
            msgs.append(f"commitLogOffset {phy} is below the previous entry's {last_phy}")
        last_phy = max(last_phy, phy)
        log_min, log_end = bounds(phy) if phy >= 0 else (0, 0)
        if phy < 0:
            msgs.append(f"commitLogOffset {phy} is negative")
        elif phy < log_min:
            pass  # the record was removed by retention
        elif phy >= log_end:
            if live:
                report.in_flight_units += 1  # its record was written after the scan
            else:
                msgs.append(f"points at {phy}, past the end of the log at {log_end}")
        else:
            rec = log.record(phy)
            if isinstance(rec, str):
                msgs.append(f"points at {phy}: {rec}")
            else:
                if rec.sys_flag & TX_MASK == TX_ROLLBACK:
                    msgs.append(f"points at {phy}, a ROLLBACK record (those are not indexed)")
                hashes = rec.key_hashes()
                if key_hash not in hashes:
                    keys = ", ".join(f"{k!r} ({h})" for h, k in hashes.items()) or "none"
                    msgs.append(f"keyHash {key_hash} is the hash of none of the keys of the record at {phy} "
                                f"(keys: {keys})")
        if msgs:
            problem(where, n, f"entry {n}: " + "; ".join(msgs))
    report.index_entries += used - 1
    if deep and not stable and not live and 0 <= end_ts <= kept_until and used > 1:
        stable = True  # a file the next open keeps after this crash: it was flushed whole
    if not stable or used <= 1:
        return  # a writer may be between the entry, its slot and the header
    if begin_phy != entries[1][1] or end_phy != entries[used - 1][1]:
        problem(where, 0, f"header: phy offsets {begin_phy}..{end_phy}, but the entries span "
                          f"{entries[1][1]}..{entries[used - 1][1]}")
    if slot_count != len(newest):
        problem(where, 0, f"header: hash_slot_count {slot_count}, but the entries use {len(newest)} hash slots")
    if deep:
        _check_slot_chains(problem, where, fd, slots, used, entries, newest)
        return
    if INDEX_SLOT_SIZE * slots <= INDEX_SLOT_TABLE_READ_MAX:
        table = array("i")
        table.frombytes(os.pread(fd, INDEX_SLOT_SIZE * slots, INDEX_HEADER_SIZE))
        if table.itemsize != 4:
            return
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            table.byteswap()
        in_use = slots - table.count(0)
        if in_use != len(newest):
            problem(where, 0, f"{in_use} hash slots are in use, but the entries use {len(newest)}")
        slot_value: Callable[[int], int] = table.__getitem__
    else:
        def slot_value(slot: int) -> int:
            return int(_I32.unpack(os.pread(fd, INDEX_SLOT_SIZE, INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slot))[0])
    for slot, n in sorted(newest.items()):
        value = slot_value(slot)
        if value != n:
            problem(where, n, f"hash slot {slot} holds entry {value}, but its newest entry is {n}")


INDEX_SLOT_CHUNK = 1 << 20  # hash slots read at a time by the deep check


def _check_slot_chains(problem: ProblemSink, where: str, fd: int, slots: int, used: int,
                       entries: list[tuple[int, int, int, int]], newest: dict[int, int]) -> None:
    """check_store(deep=True): read every hash slot (in chunks) and walk its chain. A slot must
    hold the newest entry of its hash (0 when none); every entry a chain reaches must exist
    and hash to that slot, and be reached once; every entry must be reached (queries walk the
    chains only: an entry no chain reaches is never found)."""
    reached = bytearray(used)
    for first in range(0, slots, INDEX_SLOT_CHUNK):
        n = min(INDEX_SLOT_CHUNK, slots - first)
        table = array("i")
        table.frombytes(os.pread(fd, INDEX_SLOT_SIZE * n, INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * first))
        if len(table) < n:
            problem(where, 0, f"the hash slot table is cut short at slot {first + len(table)}")
            return
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            table.byteswap()
        wanted = [(slot - first, entry) for slot, entry in newest.items() if first <= slot < first + n]
        if table.count(0) == n and not wanted:
            continue
        for i, value in enumerate(table):
            slot = first + i
            want = newest.get(slot, 0)
            if value != want:
                problem(where, value if 0 < value < used else 0,
                        f"hash slot {slot} holds entry {value}, but its newest entry is {want}"
                        + (" (the slot is zeroed: its entries cannot be found)" if value == 0 else ""))
            at = value
            while 0 < at < used and not reached[at]:
                key_hash = entries[at][0]
                if key_hash % slots != slot:
                    problem(where, at, f"hash slot {slot}: its chain reaches entry {at}, whose keyHash {key_hash} "
                                       f"belongs to hash slot {key_hash % slots}")
                    break
                reached[at] = 1
                prev = entries[at][3]
                at = prev if 0 < prev < at else 0
    lost = reached.count(0, 1)
    if lost:
        first_lost = reached.find(0, 1)
        problem(where, first_lost, f"{lost} entr{'y is' if lost == 1 else 'ies are'} on no hash slot's chain "
                                   f"(queries cannot find them), the first entry {first_lost}")
