"""The clean-close record (``mqstore.clean.json``): what a clean shutdown leaves so that the next
open needs no scan of the CommitLog (docs/format.md "The clean-close record").

RocketMQ's recoverNormally re-reads the last three CommitLog files after a clean shutdown
(spec §5.4) to find the write position and, here, to rebuild the topic-queue table: the work
grows with the records in those files (1M records of 100 bytes: ~0.1 s warm, seconds from
disk). A clean shutdown knows both, so it writes them down: the write position, the CRC-32 of
the last bytes before it (up to 4 KiB, inside its file), the last store timestamp and every
queue's next offset. The next open checks the record against the files in constant time
(the tail bytes give the same CRC, the bytes at the write position are not a record) and takes
the table from it; a record that is missing, unreadable or disagrees with the files gives the
scan RocketMQ does (QUIRK decision: docs/rocketmq-store-spec.md §5.4 — the scan's CRC check of
older records is left to check_crc_on_read and ``mqstore verify``).

The record is written after everything was flushed and dispatched, before ``abort`` is removed,
and deleted when the store is opened again, before anything is written: after a crash
``abort`` is present and the record (if any) is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

from mqstore.layout import CLEAN_CLOSE_NAME, file_start_of, local_of, log_of
from mqstore.log.directory import replace_file

log = logging.getLogger("mqstore.recovery")

VERSION = 1
#: the record of a store with several CommitLogs (docs/parallel-commitlogs.md "clean-close record
#: version 2"): one entry per log, one table; a store with one keeps writing version 1
VERSION_LOGS = 2
#: bytes before the write position whose CRC the record keeps (inside the position's file)
TAIL_BYTES = 4096


@dataclass
class CleanClose:
    """What a clean shutdown wrote (see the module docstring)."""

    wrote: int
    tail_crc: int
    last_store_timestamp: int
    #: (topic, queue_id, next queue offset) of every queue the topic-queue table held
    table: list[tuple[str, int, int]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "wrote": self.wrote, "tail_crc": self.tail_crc,
                           "last_store_timestamp": self.last_store_timestamp,
                           "table": [list(t) for t in self.table]}, separators=(",", ":"))


def tail_range(wrote: int, file_size: int) -> tuple[int, int]:
    """The [start, wrote) range whose CRC the record keeps: up to TAIL_BYTES, inside the file
    that holds the byte before wrote (of the log wrote is an offset of)."""
    if wrote <= 0 or local_of(wrote) == 0:
        return wrote, wrote
    file_from = file_start_of(wrote - 1, file_size)
    return max(file_from, wrote - TAIL_BYTES), wrote


def tail_crc(files: Any, wrote: int) -> int | None:
    """CRC-32 of the tail range of a MappedFileQueue's files, None when its file is not there."""
    start, end = tail_range(wrote, files.file_size)
    if end <= start:
        return 0
    mf = files.get(file_start_of(start, files.file_size))
    if mf is None:
        return None
    base = mf.file_from
    return zlib.crc32(mf.read(start - base, end - start))


def write(root: str, record: CleanClose) -> None:
    """Write the record atomically (fsync'd: it stands for a scan of the log)."""
    path = os.path.join(root, CLEAN_CLOSE_NAME)
    try:
        replace_file(path, record.to_json(), fsync=True)
    except OSError as exc:  # the next open scans instead: nothing is lost
        log.warning("cannot write the clean-close record %s: %s", path, exc)


def write_logs(root: str, records: dict[int, CleanClose], table: list[tuple[str, int, int]]) -> None:
    """Write the version 2 record of a store with several CommitLogs: each log's write
    position, tail CRC and last store timestamp (a log left out is scanned at the next open),
    and the whole topic-queue table."""
    text = json.dumps({"version": VERSION_LOGS,
                       "logs": [{"log": k, "wrote": r.wrote, "tail_crc": r.tail_crc,
                                 "last_store_timestamp": r.last_store_timestamp} for k, r in sorted(records.items())],
                       "table": [list(t) for t in table]}, separators=(",", ":"))
    path = os.path.join(root, CLEAN_CLOSE_NAME)
    try:
        replace_file(path, text, fsync=True)
    except OSError as exc:  # the next open scans instead: nothing is lost
        log.warning("cannot write the clean-close record %s: %s", path, exc)


def _load(root: str) -> tuple[Any, str]:
    path = os.path.join(root, CLEAN_CLOSE_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh), ""
    except FileNotFoundError:
        return None, ""
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{CLEAN_CLOSE_NAME} cannot be read: {exc}"


def _table(data: Any) -> list[tuple[str, int, int]]:
    return [(str(t), int(q), int(n)) for t, q, n in data["table"]]


def read(root: str) -> tuple[CleanClose | None, str]:
    """(the record, "") or (None, why not: "" when there is none)."""
    data, why = _load(root)
    if data is None:
        return None, why
    try:
        if data["version"] != VERSION:
            return None, f"{CLEAN_CLOSE_NAME} has version {data['version']!r}, not {VERSION}"
        rec = CleanClose(int(data["wrote"]), int(data["tail_crc"]), int(data["last_store_timestamp"]), _table(data))
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"{CLEAN_CLOSE_NAME} is malformed: {exc!r}"
    if rec.wrote < 0 or any(q < 0 or n < 0 for _, q, n in rec.table):
        return None, f"{CLEAN_CLOSE_NAME} holds a negative offset"
    return rec, ""


def read_logs(root: str, log_count: int) -> tuple[dict[int, CleanClose], str]:
    """The version 2 record of a store with log_count CommitLogs, as one CleanClose per log it
    names (each with the table entries of its own queues, by the binding); ({}, why not) when
    there is none or it cannot be used ("" when there is none)."""
    from mqstore.log._shm import log_of_queue

    data, why = _load(root)
    if data is None:
        return {}, why
    try:
        if data["version"] != VERSION_LOGS:
            return {}, f"{CLEAN_CLOSE_NAME} has version {data['version']!r}, not {VERSION_LOGS} (several CommitLogs)"
        table = _table(data)
        records = {int(e["log"]): CleanClose(int(e["wrote"]), int(e["tail_crc"]), int(e["last_store_timestamp"]))
                   for e in data["logs"]}
    except (KeyError, TypeError, ValueError) as exc:
        return {}, f"{CLEAN_CLOSE_NAME} is malformed: {exc!r}"
    if any(q < 0 or n < 0 for _, q, n in table) or any(r.wrote < 0 for r in records.values()):
        return {}, f"{CLEAN_CLOSE_NAME} holds a negative offset"
    if any(not 0 <= k < log_count or log_of(r.wrote) != k for k, r in records.items()):
        return {}, f"{CLEAN_CLOSE_NAME} names a CommitLog the store does not have, or an offset of another log"
    for topic, qid, n in table:
        try:
            record = records.get(log_of_queue(topic, qid, log_count))
        except (OverflowError, UnicodeEncodeError):  # no queue has such a name: the record is not ours
            return {}, f"{CLEAN_CLOSE_NAME} names a queue {topic!r}/{qid} no store can have"
        if record is not None:
            record.table.append((topic, qid, n))
    return records, ""


def remove(root: str) -> None:
    """Delete the record (an open does, before anything is written)."""
    try:
        os.unlink(os.path.join(root, CLEAN_CLOSE_NAME))
    except FileNotFoundError:
        pass


def mismatch(files: Any, record: CleanClose) -> str:
    """Why record does not describe the CommitLog files ("" when it does): its write position
    must lie in (or at the end of) the mapped files, the tail bytes before it must have the CRC
    it says, and no record may start at it (its first 8 bytes are zero or the position is a
    file's end)."""
    wrote = record.wrote
    mapped = files.files
    base = getattr(files, "base", 0)  # (the log's first offset: 0, or k << 56 for log k)
    if not mapped:
        return "" if wrote == base else f"the record says the log ends at {wrote}, but there is no CommitLog file"
    first, end = mapped[0].file_from, mapped[-1].file_from + files.file_size
    if wrote == base and first == base and files.get(base) is not None:
        head = files.get(base).read(0, 8)
        return "" if head == bytes(8) else "the record says the log is empty, but its first file holds data"
    if not first < wrote <= end:
        return f"the record's write position {wrote} is outside the CommitLog files [{first}, {end})"
    crc = tail_crc(files, wrote)
    if crc is None:
        return f"the CommitLog file holding offset {wrote - 1} is missing"
    if crc != record.tail_crc:
        return f"the {min(TAIL_BYTES, wrote - tail_range(wrote, files.file_size)[0])} bytes before {wrote} changed"
    pos = wrote - file_start_of(wrote, files.file_size)
    if pos and pos + 8 <= files.file_size:
        at = files.get(wrote - pos)
        if at is not None and at.read(pos, 8) != bytes(8):
            return f"bytes follow the record's write position {wrote}"
    return ""
