"""The tier manifest (tiered-storage spec §4.2–§4.4, §6.1): what is in the bucket, recorded
locally in ``ROOT/tier/`` before and after every copy and delete.

``tier/manifest.log`` is append-only; each record is framed big-endian as

    length L of the payload (4) · CRC-32 (zlib) of the payload (4) · sequence number (8) ·
    UTF-8 JSON payload ``{"op": OP, ...}`` (L)

and fsynced before the append returns. Sequence numbers strictly increase (from 1). Loading
cuts a torn last record (short, failing its CRC, or a zero-filled tail) as a torn CommitLog tail
is cut; a bad record before the last one stops the load with a ManifestError naming its sequence
number (the manifest is rebuilt from the bucket then, §6.6).

The state machine of one upload (a segment object or a ``.mqidx`` index object, keyed by its
upload id; Kafka's RemoteLogSegmentState):

    (none) → COPY_STARTED [→ MPU] → COPY_FINISHED → DELETE_STARTED → DELETE_FINISHED
                       └──────────────────────────→ DELETE_STARTED (a failed or crashed copy)

Index objects take the same path with the ``INDEX_`` ops. ``GAP`` records a file the local
cleaner deleted before it was copied (§8). Anything else is refused with a
ManifestTransitionError naming the upload id and both states, before any byte is written.

Compaction (§4.4): once the log passes ``compact_bytes`` (16 MiB), the live state (every upload
not DELETE_FINISHED, every gap, and per log the copied-up-to mark) goes to
``tier/manifest.snapshot`` (one record in the same framing: .tmp, fsync, rename, directory
fsync), then the log is replaced by one holding only a ``{"op": "SNAPSHOT", "upto": seq}``
header record (again .tmp, fsync, rename, directory fsync: a crash in between leaves either
log, and the snapshot covers both). Readers read the log first and the snapshot second, so a
compaction running meanwhile never shows them a log newer than its snapshot.

Recovery (§4.3) is :func:`recovery_actions`, a pure function of the state: what the tierer must
do (abort the MPU, delete the key, record DELETE_STARTED / DELETE_FINISHED, re-queue the file)
for every copy or delete a crash interrupted. The network calls are the tierer's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from mqstore.errors import ManifestError, ManifestTransitionError, TierError
from mqstore.layout import MAX_LOGS, log_base

__all__ = [
    "COMPACT_BYTES", "COPY_FINISHED", "COPY_STARTED", "DELETE_FINISHED", "DELETE_STARTED", "GAP", "Gap",
    "HEADER", "INDEX_COPY_FINISHED", "INDEX_COPY_STARTED", "INDEX_DELETE_FINISHED", "INDEX_DELETE_STARTED",
    "IndexObject", "MANIFEST_NAME", "MPU", "Manifest", "ManifestState", "OPS", "RecoveryAction", "SNAPSHOT",
    "SNAPSHOT_NAME", "STORE_ID_NAME", "Segment", "Step", "TIER_DIR", "encode_record", "fsync_dir",
    "load_state", "records_of", "recovery_actions", "scan_records", "store_id", "tier_dir",
]

# -- names (spec §4.4) -----------------------------------------------------------------------
TIER_DIR = "tier"
MANIFEST_NAME = "manifest.log"
SNAPSHOT_NAME = "manifest.snapshot"
STORE_ID_NAME = "STORE_ID"
#: the log is compacted once it is larger than this (spec §4.4)
COMPACT_BYTES = 16 * 1024 * 1024
#: length, CRC-32 of the payload, sequence number
HEADER = struct.Struct(">IIQ")
#: the largest payload a record may have: a record is a few hundred bytes, a snapshot holds one
#: line per live upload (a 10 TB tier of 1 GiB files: 10,000 lines of ~400 bytes)
MAX_PAYLOAD = 1 << 30
#: the largest payload of a record in manifest.log (a record is a few hundred bytes): a longer
#: length field at the tail is damage, not an append cut short
MAX_RECORD = 64 * 1024

# -- ops --------------------------------------------------------------------------------------
COPY_STARTED = "COPY_STARTED"
MPU = "MPU"
COPY_FINISHED = "COPY_FINISHED"
DELETE_STARTED = "DELETE_STARTED"
DELETE_FINISHED = "DELETE_FINISHED"
INDEX_COPY_STARTED = "INDEX_COPY_STARTED"
INDEX_COPY_FINISHED = "INDEX_COPY_FINISHED"
INDEX_DELETE_STARTED = "INDEX_DELETE_STARTED"
INDEX_DELETE_FINISHED = "INDEX_DELETE_FINISHED"
GAP = "GAP"
SNAPSHOT = "SNAPSHOT"

#: op → (kind, the state it moves the upload to); MPU keeps COPY_STARTED
_TRANSITION_OPS: dict[str, tuple[str, str]] = {
    COPY_STARTED: ("segment", COPY_STARTED), COPY_FINISHED: ("segment", COPY_FINISHED),
    DELETE_STARTED: ("segment", DELETE_STARTED), DELETE_FINISHED: ("segment", DELETE_FINISHED),
    INDEX_COPY_STARTED: ("index", COPY_STARTED), INDEX_COPY_FINISHED: ("index", COPY_FINISHED),
    INDEX_DELETE_STARTED: ("index", DELETE_STARTED), INDEX_DELETE_FINISHED: ("index", DELETE_FINISHED),
}
#: the legal next states of an upload (None: not in the manifest)
_LEGAL: dict[str | None, tuple[str, ...]] = {
    None: (COPY_STARTED,),
    COPY_STARTED: (COPY_FINISHED, DELETE_STARTED),
    COPY_FINISHED: (DELETE_STARTED,),
    DELETE_STARTED: (DELETE_FINISHED,),
    DELETE_FINISHED: (),
}

_INT, _STR = "int", "str"
#: op → (required fields, optional fields), each name → type; no other field is accepted
_FIELDS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    COPY_STARTED: ({"log": _INT, "file_start": _INT, "file_size": _INT, "upload_id": _STR, "key": _STR,
                    "created_ms": _INT}, {}),
    MPU: ({"upload_id": _STR, "mpu_id": _STR}, {}),
    COPY_FINISHED: ({"upload_id": _STR, "size": _INT, "data_crc32": _INT, "footer_crc32": _INT,
                     "first_store_ts": _INT, "last_store_ts": _INT, "record_count": _INT, "queues": _INT},
                    {"ms": _INT}),
    DELETE_STARTED: ({"upload_id": _STR}, {"ms": _INT}),
    DELETE_FINISHED: ({"upload_id": _STR}, {"ms": _INT}),
    INDEX_COPY_STARTED: ({"log": _INT, "name": _STR, "upload_id": _STR, "key": _STR, "created_ms": _INT}, {}),
    INDEX_COPY_FINISHED: ({"upload_id": _STR, "size": _INT, "crc32": _INT, "begin_ts": _INT, "end_ts": _INT},
                          {"ms": _INT}),
    INDEX_DELETE_STARTED: ({"upload_id": _STR}, {"ms": _INT}),
    INDEX_DELETE_FINISHED: ({"upload_id": _STR}, {"ms": _INT}),
    GAP: ({"log": _INT, "file_start": _INT, "file_end": _INT, "reason": _STR}, {"ms": _INT}),
}
#: every op a record may carry (SNAPSHOT only as the first record of a compacted log)
OPS = frozenset(_FIELDS) | {SNAPSHOT}
_log = logging.getLogger("mqstore.tier.manifest")

_UPLOAD_ID = re.compile(r"[0-9a-f]{16}")
_CRC_FIELDS = ("data_crc32", "footer_crc32", "crc32")


def tier_dir(root: str) -> str:
    """ROOT/tier."""
    return os.path.join(root, TIER_DIR)


# -- the live state ---------------------------------------------------------------------------


@dataclass
class Segment:
    """One segment upload (``<P>/seg/<log>/<file start>.<upload id>.mqseg``) and what the
    manifest says about it. ``file_size`` is the local file's mapped size (the COPY_STARTED
    record carries it so the copied-up-to mark needs no configuration)."""

    log: int
    file_start: int
    file_size: int
    upload_id: str
    key: str
    created_ms: int
    state: str = COPY_STARTED
    mpu_id: str | None = None
    # from COPY_FINISHED
    size: int | None = None
    data_crc32: int | None = None
    footer_crc32: int | None = None
    first_store_ts: int | None = None
    last_store_ts: int | None = None
    record_count: int | None = None
    queues: int | None = None
    finished_ms: int | None = None
    # from DELETE_STARTED / DELETE_FINISHED
    delete_started_ms: int | None = None
    delete_finished_ms: int | None = None

    @property
    def file_end(self) -> int:
        return self.file_start + self.file_size

    @property
    def copied(self) -> bool:
        """Whether the copy finished (the object was complete and verified), whatever came after."""
        return self.size is not None


@dataclass
class IndexObject:
    """One compacted IndexFile upload (``<P>/idx/<log>/<name>.<upload id>.mqidx``, §5.3)."""

    log: int
    name: str
    upload_id: str
    key: str
    created_ms: int
    state: str = COPY_STARTED
    mpu_id: str | None = None
    size: int | None = None
    crc32: int | None = None
    begin_ts: int | None = None
    end_ts: int | None = None
    finished_ms: int | None = None
    delete_started_ms: int | None = None
    delete_finished_ms: int | None = None

    @property
    def copied(self) -> bool:
        return self.size is not None


@dataclass(frozen=True)
class Gap:
    """Bytes [file_start, file_end) of a log that were deleted locally before they were copied (§8)."""

    log: int
    file_start: int
    file_end: int
    reason: str
    ms: int | None = None


Upload = Segment | IndexObject


def _check_fields(op: str, payload: dict[str, Any]) -> None:
    """Raise ManifestTransitionError unless payload has exactly op's fields, of their types."""
    required, optional = _FIELDS[op]
    for name in required:
        if name not in payload:
            raise ManifestTransitionError(f"{op} record without its field {name!r}: {payload}")
    for name, value in payload.items():
        if name == "op":
            continue
        kind: str | None = required.get(name) or optional.get(name)
        if kind is None:
            raise ManifestTransitionError(f"{op} record with a field {name!r} it does not have "
                                          f"(its fields: {', '.join([*required, *optional])})")
        if kind == _INT and (type(value) is not int or value < 0):
            raise ManifestTransitionError(f"{op} record: {name} must be an int >= 0, not {value!r}")
        if kind == _STR and (type(value) is not str or not value):
            raise ManifestTransitionError(f"{op} record: {name} must be a non-empty str, not {value!r}")
    if "upload_id" in payload and not _UPLOAD_ID.fullmatch(payload["upload_id"]):
        raise ManifestTransitionError(f"{op} record: upload id {payload['upload_id']!r} is not 16 lower-case "
                                      "hex digits (spec §5.1)")
    if "log" in payload and payload["log"] >= MAX_LOGS:
        raise ManifestTransitionError(f"{op} record: log {payload['log']} is past the last CommitLog "
                                      f"({MAX_LOGS - 1})")
    for name in _CRC_FIELDS:
        if name in payload and payload[name] > 0xFFFFFFFF:
            raise ManifestTransitionError(f"{op} record: {name} {payload[name]} is not a CRC-32")
    if op == COPY_STARTED and payload["file_size"] == 0:
        raise ManifestTransitionError(f"COPY_STARTED of upload {payload['upload_id']}: file_size is 0")
    if op == GAP and payload["file_end"] <= payload["file_start"]:
        raise ManifestTransitionError(f"GAP of log {payload['log']}: file_end {payload['file_end']} is not "
                                      f"past file_start {payload['file_start']}")


class ManifestState:
    """The live state the records describe: uploads by upload id (segments and index objects),
    gaps, and per log the copied-up-to mark a compaction kept. ``apply`` checks a record and
    refuses an illegal one before changing anything."""

    def __init__(self) -> None:
        self.last_seq = 0
        #: every upload by upload id, in COPY_STARTED order
        self.uploads: dict[str, Upload] = {}
        self.gaps: list[Gap] = []
        #: per log, copied_upto when the uploads below it were dropped by a compaction
        self.copied_base: dict[int, int] = {}

    # -- applying records ----------------------------------------------------------------------

    def check(self, payload: dict[str, Any]) -> None:
        """Raise ManifestTransitionError if payload is not a legal next record."""
        op = payload.get("op")
        if op not in _FIELDS:
            raise ManifestTransitionError(f"unknown manifest op {op!r} (ops: {', '.join(sorted(_FIELDS))})")
        _check_fields(op, payload)
        if op == GAP:
            self._check_gap(payload)
            return
        upload_id = payload["upload_id"]
        upload = self.uploads.get(upload_id)
        if op == MPU:
            if upload is None or upload.state != COPY_STARTED or upload.mpu_id is not None:
                now = "(none)" if upload is None else upload.state + (
                    f" with MPU {upload.mpu_id}" if upload.mpu_id is not None else "")
                raise ManifestTransitionError(f"upload {upload_id}: MPU in state {now} is not a legal transition "
                                              "(an MPU is recorded once, in COPY_STARTED)")
            return
        kind, new = _TRANSITION_OPS[op]
        old = None if upload is None else upload.state
        if upload is not None and _kind(upload) != kind:
            raise ManifestTransitionError(f"upload {upload_id}: {op} names a {kind} but the upload is a "
                                          f"{_kind(upload)} (in state {old})")
        if new not in _LEGAL[old]:
            legal = ", ".join(_LEGAL[old]) or "nothing: the upload is done"
            raise ManifestTransitionError(f"upload {upload_id}: {old or '(none)'} → {new} is not a legal "
                                          f"transition (legal from {old or '(none)'}: {legal})")
        if op == COPY_STARTED:
            self._check_copy_start(payload)

    def _check_copy_start(self, payload: dict[str, Any]) -> None:
        log, start, end = payload["log"], payload["file_start"], payload["file_start"] + payload["file_size"]
        for other in self.uploads.values():
            if (isinstance(other, Segment) and other.log == log and other.file_start == start
                    and other.state in (COPY_STARTED, COPY_FINISHED)):
                raise ManifestTransitionError(
                    f"upload {payload['upload_id']}: COPY_STARTED of log {log} file {start} while upload "
                    f"{other.upload_id} of the same file is {other.state} (one copy per file at a time)")
        for gap in self.gaps:
            if gap.log == log and gap.file_start < end and start < gap.file_end:
                raise ManifestTransitionError(
                    f"upload {payload['upload_id']}: COPY_STARTED of log {log} file {start} inside the GAP "
                    f"[{gap.file_start}, {gap.file_end}) ({gap.reason}): that file was deleted before copy")

    def _check_gap(self, payload: dict[str, Any]) -> None:
        log, start, end = payload["log"], payload["file_start"], payload["file_end"]
        for other in self.uploads.values():
            if (isinstance(other, Segment) and other.log == log and other.state == COPY_FINISHED
                    and other.file_start < end and start < other.file_end):
                raise ManifestTransitionError(
                    f"GAP [{start}, {end}) of log {log} covers upload {other.upload_id} (file "
                    f"{other.file_start}), which is COPY_FINISHED: its bytes are in the tier")

    def apply(self, seq: int, payload: dict[str, Any]) -> None:
        """Check payload (ManifestTransitionError) and apply it as record seq."""
        if seq <= self.last_seq:
            raise ManifestTransitionError(f"sequence number {seq} does not follow {self.last_seq}")
        self.check(payload)
        self._apply(payload)
        self.last_seq = seq

    def _apply(self, p: dict[str, Any]) -> None:
        op = p["op"]
        if op == GAP:
            self.gaps.append(Gap(p["log"], p["file_start"], p["file_end"], p["reason"], p.get("ms")))
            return
        if op == COPY_STARTED:
            self.uploads[p["upload_id"]] = Segment(p["log"], p["file_start"], p["file_size"], p["upload_id"],
                                                   p["key"], p["created_ms"])
            return
        if op == INDEX_COPY_STARTED:
            self.uploads[p["upload_id"]] = IndexObject(p["log"], p["name"], p["upload_id"], p["key"],
                                                       p["created_ms"])
            return
        upload = self.uploads[p["upload_id"]]
        if op == MPU:
            upload.mpu_id = p["mpu_id"]
            return
        upload.state = _TRANSITION_OPS[op][1]
        if upload.state == COPY_FINISHED:
            for name, value in p.items():
                if name not in ("op", "upload_id", "ms"):
                    setattr(upload, name, value)
            upload.finished_ms = p.get("ms")
        elif upload.state == DELETE_STARTED:
            upload.delete_started_ms = p.get("ms")
        else:
            upload.delete_finished_ms = p.get("ms")

    # -- views -----------------------------------------------------------------------------------

    def logs(self) -> list[int]:
        """Every log the manifest knows of."""
        return sorted({u.log for u in self.uploads.values()} | {g.log for g in self.gaps} | set(self.copied_base))

    def segments(self, log: int) -> dict[int, Segment]:
        """Log's segments by file start: per file its latest upload (an earlier failed attempt of
        the same file is only in ``uploads``), in file order."""
        out: dict[int, Segment] = {}
        for upload in self.uploads.values():
            if isinstance(upload, Segment) and upload.log == log:
                out[upload.file_start] = upload
        return dict(sorted(out.items()))

    def copied_segments(self, log: int) -> list[Segment]:
        """Log's COPY_FINISHED segments (readable from the tier), in file order."""
        return [s for s in self.segments(log).values() if s.state == COPY_FINISHED]

    def index_objects(self, log: int) -> dict[str, IndexObject]:
        """Log's index objects by IndexFile name: per name its latest upload, in name order."""
        out: dict[str, IndexObject] = {}
        for upload in self.uploads.values():
            if isinstance(upload, IndexObject) and upload.log == log:
                out[upload.name] = upload
        return dict(sorted(out.items()))

    def gaps_of(self, log: int) -> list[Gap]:
        return sorted((g for g in self.gaps if g.log == log), key=lambda g: g.file_start)

    def copied_upto(self, log: int) -> int:
        """spec §4.2 step 5, §8: the end of the contiguous prefix of log's files that are copied
        (a COPY_FINISHED segment, or one copied and since deleted from the tier by retention) or
        recorded as a GAP: what ``tier_copied_upto_k`` publishes, the bound below which local
        retention may delete. The prefix starts at the lowest file the manifest knows of (any
        state), so a file whose copy failed holds it back; ``log_base(log)`` when nothing is
        copied."""
        done: dict[int, int] = {}
        lowest: int | None = None
        for upload in self.uploads.values():
            if isinstance(upload, Segment) and upload.log == log:
                lowest = upload.file_start if lowest is None else min(lowest, upload.file_start)
                if upload.copied:
                    done[upload.file_start] = max(done.get(upload.file_start, 0), upload.file_end)
        for gap in self.gaps:
            if gap.log == log:
                lowest = gap.file_start if lowest is None else min(lowest, gap.file_start)
        pos = self.copied_base.get(log, lowest)
        if pos is None:
            return log_base(log)
        while True:
            end = done.get(pos)
            for gap in self.gaps:
                if gap.log == log and gap.file_start <= pos < gap.file_end:
                    end = max(end or 0, gap.file_end)
            if end is None or end <= pos:
                return pos
            pos = end

    # -- snapshots ---------------------------------------------------------------------------

    def live_json(self) -> dict[str, Any]:
        """The live state as JSON-ready data: every upload not DELETE_FINISHED, every gap, and per
        log the copied-up-to mark (what a snapshot holds, spec §4.4)."""
        return {
            "uploads": [{"kind": _kind(u), **asdict(u)} for u in self.uploads.values() if u.state != DELETE_FINISHED],
            "gaps": [asdict(g) for g in self.gaps],
            "copied_upto": {str(log): self.copied_upto(log) for log in self.logs()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], seq: int) -> ManifestState:
        """The state a snapshot (``live_json``) holds, as of sequence number seq; KeyError,
        TypeError or ValueError on data that is not one."""
        state = cls()
        state.last_seq = seq
        for row in data["uploads"]:
            row = dict(row)
            kind = row.pop("kind")
            upload: Upload
            if kind == "segment":
                upload = Segment(**row)
            elif kind == "index":
                upload = IndexObject(**row)
            else:
                raise ValueError(f"upload kind {kind!r}")
            if (upload.state not in _LEGAL or upload.state == DELETE_FINISHED
                    or not _UPLOAD_ID.fullmatch(upload.upload_id)):
                raise ValueError(f"upload {upload.upload_id!r} in state {upload.state!r}")
            state.uploads[upload.upload_id] = upload
        state.gaps = [Gap(**g) for g in data["gaps"]]
        state.copied_base = {int(log): int(v) for log, v in data["copied_upto"].items()}
        return state

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ManifestState):
            return NotImplemented
        return self.last_seq == other.last_seq and self.live_json() == other.live_json()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        states: dict[str, int] = {}
        for u in self.uploads.values():
            states[u.state] = states.get(u.state, 0) + 1
        return f"ManifestState(seq={self.last_seq}, uploads={states}, gaps={len(self.gaps)})"


def _kind(upload: Upload) -> str:
    return "segment" if isinstance(upload, Segment) else "index"


# -- recovery (spec §4.3) ----------------------------------------------------------------------


class Step(str, Enum):
    """One thing the tierer does for a crashed copy or delete, in the order a RecoveryAction lists."""

    RECORD_DELETE_STARTED = "record DELETE_STARTED"  # (INDEX_DELETE_STARTED for an index object)
    ABORT_MPU = "abort the multipart upload"  # NoSuchUpload counts as done
    DELETE_OBJECT = "delete the key"  # 404 counts as done
    RECORD_DELETE_FINISHED = "record DELETE_FINISHED"
    DROP_QUEUE_ENTRIES = "drop the file's tier queue index entries"  # mqstore.tier.queues.drop_segment_entries
    REQUEUE = "re-queue the file for a copy with a new upload id"


@dataclass(frozen=True)
class RecoveryAction:
    """What to do about one upload a crash left half done (spec §4.3)."""

    upload_id: str
    kind: str  # "segment" or "index"
    log: int
    key: str
    state: str  # COPY_STARTED or DELETE_STARTED
    mpu_id: str | None  # the MPU to abort (None: none recorded, or the copy completed it)
    steps: tuple[Step, ...]
    file_start: int | None = None  # segments
    index_name: str | None = None  # index objects


def recovery_actions(state: ManifestState) -> list[RecoveryAction]:
    """spec §4.3, as data: for every COPY_STARTED upload without COPY_FINISHED, record
    DELETE_STARTED first (so a crash during the clean-up is retried as a delete), abort its MPU if
    one is recorded, delete its key, record DELETE_FINISHED, drop the tier queue index entries a
    segment may have written before its COPY_FINISHED, and re-queue the file; for every
    DELETE_STARTED without DELETE_FINISHED: abort the MPU of a copy that never completed, delete
    the key again, record DELETE_FINISHED. In COPY_STARTED order."""
    out: list[RecoveryAction] = []
    for u in state.uploads.values():
        if u.state not in (COPY_STARTED, DELETE_STARTED):
            continue
        mpu = u.mpu_id if u.mpu_id is not None and not u.copied else None
        steps: list[Step] = [Step.RECORD_DELETE_STARTED] if u.state == COPY_STARTED else []
        if mpu is not None:
            steps.append(Step.ABORT_MPU)
        steps += [Step.DELETE_OBJECT, Step.RECORD_DELETE_FINISHED]
        if u.state == COPY_STARTED:
            if isinstance(u, Segment):
                steps.append(Step.DROP_QUEUE_ENTRIES)
            steps.append(Step.REQUEUE)
        out.append(RecoveryAction(u.upload_id, _kind(u), u.log, u.key, u.state, mpu, tuple(steps),
                                  file_start=u.file_start if isinstance(u, Segment) else None,
                                  index_name=u.name if isinstance(u, IndexObject) else None))
    return out


# -- records on disk ---------------------------------------------------------------------------


def encode_record(seq: int, payload: dict[str, Any], *, max_payload: int = MAX_RECORD) -> bytes:
    """One framed record: length, CRC-32, sequence number, compact UTF-8 JSON."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(body) > max_payload:
        raise TierError(f"a manifest record of {len(body)} bytes is past the limit of {max_payload}: {body[:80]!r}")
    return HEADER.pack(len(body), zlib.crc32(body), seq) + body


def scan_records(data: bytes, what: str = "manifest", *,
                 max_payload: int = MAX_RECORD) -> tuple[list[tuple[int, dict[str, Any]]], int, str | None]:
    """(records as (seq, payload), the byte length they fill, why the rest is a torn tail or
    None). A torn tail is a short last record, a last record failing its CRC, or zeros to the
    end; a record that fails its CRC or does not parse with bytes after it, a short record
    followed by a whole one (a damaged length field) or claiming more than max_payload bytes, or
    a sequence number that does not increase, raises ManifestError naming the sequence number."""
    records: list[tuple[int, dict[str, Any]]] = []
    pos, n = 0, len(data)
    prev: int | None = None
    while pos < n:
        after = "the first record" if prev is None else f"after sequence number {prev}"
        if n - pos < HEADER.size:
            return records, pos, f"a torn header of {n - pos} bytes {after}"
        length, crc, seq = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if end > n:
            if length > max_payload:
                raise ManifestError(f"{what}: record with sequence number {seq} at byte {pos} ({after}) claims "
                                    f"{length} bytes, past the limit of {max_payload}: a damaged length, not a "
                                    "torn tail")
            following = _whole_record_after(data, pos + 1, prev)
            if following is not None:
                raise ManifestError(f"{what}: record with sequence number {seq} at byte {pos} ({after}) runs past "
                                    f"the end, but a whole record (sequence number {following}) follows it: a "
                                    "damaged length, not a torn tail")
            return records, pos, f"record {seq} ({after}) is short: {n - pos} of {end - pos} bytes"
        body = data[pos + HEADER.size:end]
        if length == 0 or zlib.crc32(body) != crc:
            if not any(data[pos:]):
                return records, pos, f"zeros from byte {pos} ({after}) to the end"
            if end == n and _whole_record_after(data, pos + 1, prev) is None:
                return records, pos, f"record {seq} ({after}) fails its CRC-32 and is the last"
            raise ManifestError(f"{what}: record with sequence number {seq} at byte {pos} ({after}) fails its "
                                "CRC-32 and is not the last record: not a torn tail")
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ManifestError(f"{what}: record with sequence number {seq} at byte {pos} is not UTF-8 JSON: "
                                f"{exc}") from None
        if not isinstance(payload, dict) or payload.get("op") not in OPS:
            raise ManifestError(f"{what}: record with sequence number {seq} at byte {pos} is not an "
                                f"{{\"op\": OP}} object of a known op: {body[:120]!r}")
        if prev is not None and seq <= prev:
            raise ManifestError(f"{what}: record with sequence number {seq} at byte {pos} does not follow "
                                f"sequence number {prev}")
        records.append((seq, payload))
        prev = seq
        pos = end
    return records, pos, None


def _whole_record_after(data: bytes, start: int, prev: int | None) -> int | None:
    """The sequence number of a whole record (CRC right, sequence number past prev) starting
    anywhere in data[start:], or None."""
    n = len(data)
    for at in range(start, n - HEADER.size + 1):
        length, crc, seq = HEADER.unpack_from(data, at)
        end = at + HEADER.size + length
        if 0 < length and end <= n and (prev is None or seq > prev) and zlib.crc32(data[at + HEADER.size:end]) == crc:
            return int(seq)
    return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _load(directory: str) -> tuple[ManifestState, int, int, str | None]:
    """(state, the log's good length, its full length, why its tail is torn or None)."""
    log_path = os.path.join(directory, MANIFEST_NAME)
    snap_path = os.path.join(directory, SNAPSHOT_NAME)
    log_data = _read(log_path) or b""  # the log first: a compaction renames the snapshot first
    snap_data = _read(snap_path)
    state = ManifestState()
    if snap_data is not None:
        snaps, good, torn = scan_records(snap_data, snap_path, max_payload=MAX_PAYLOAD)
        if torn is not None or len(snaps) != 1 or snaps[0][1]["op"] != SNAPSHOT:
            raise ManifestError(f"{snap_path} is not one whole SNAPSHOT record ({torn or f'{len(snaps)} records'})")
        seq, payload = snaps[0]
        try:
            state = ManifestState.from_json(payload["state"], seq)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{snap_path}: the snapshot at sequence number {seq} does not hold a "
                                f"manifest state: {exc!r}") from None
    records, good, torn = scan_records(log_data, log_path)
    for i, (seq, payload) in enumerate(records):
        if payload["op"] == SNAPSHOT:
            upto = payload.get("upto")
            if i != 0 or type(upto) is not int or upto != seq:
                raise ManifestError(f"{log_path}: SNAPSHOT record with sequence number {seq} is not a header "
                                    f"(first record, upto = its sequence number): {payload}")
            if upto > state.last_seq:
                raise ManifestError(f"{log_path} starts after a snapshot at sequence number {upto}, but "
                                    f"{snap_path} holds {state.last_seq if snap_data is not None else 'nothing'}")
            continue
        if seq <= state.last_seq:
            continue  # in the snapshot already (a crash between its rename and the log's)
        try:
            state.apply(seq, payload)
        except ManifestTransitionError as exc:
            raise ManifestError(f"{log_path}: record with sequence number {seq} is refused: {exc.args[0]}") from None
    return state, good, len(log_data), torn


def load_state(root_or_tier_dir: str) -> ManifestState:
    """The manifest's state, read only (a reader process): a torn last record is left out, not
    cut (it may be an append in flight). Accepts the store root or its tier directory."""
    return _load(_resolve(root_or_tier_dir))[0]


def _resolve(path: str) -> str:
    return path if os.path.basename(os.path.normpath(path)) == TIER_DIR else tier_dir(path)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_whole(path: str, data: bytes) -> None:
    """data to path.tmp, fsync, rename over path, fsync the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# -- the owner's manifest ----------------------------------------------------------------------


class Manifest:
    """The tierer's manifest: load (cutting a torn tail), append records one fsync each, compact.

    One process appends (the tierer; the store's lock keeps it alone); readers use load_state.
    ``compact_bytes`` is the log size past which an append compacts (16 MiB; tests use less)."""

    def __init__(self, root_or_tier_dir: str, *, compact_bytes: int = COMPACT_BYTES) -> None:
        if compact_bytes < 1:
            raise ValueError(f"compact_bytes must be >= 1, not {compact_bytes}")
        self.directory = _resolve(root_or_tier_dir)
        self.compact_bytes = compact_bytes
        self.path = os.path.join(self.directory, MANIFEST_NAME)
        self.snapshot_path = os.path.join(self.directory, SNAPSHOT_NAME)
        os.makedirs(self.directory, exist_ok=True)
        self._fd = -1
        # one owner: a flock on the directory (the log itself is replaced by compactions),
        # released by the kernel when the owner dies
        self._lock_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise TierError(f"{self.directory}: the tier manifest is owned by another Manifest (another tierer, "
                            "or an open one in this process)",
                            hint="one tierer per store; readers use mqstore.tier.manifest.load_state") from None
        try:
            for name in (MANIFEST_NAME, SNAPSHOT_NAME):
                try:
                    os.unlink(os.path.join(self.directory, name + ".tmp"))  # a compaction cut short
                except FileNotFoundError:
                    pass
            self.state, good, size, self.torn = _load(self.directory)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except BaseException:
            self.close()
            raise
        if size > good:
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        self.size = good
        #: how many compactions this object ran
        self.compactions = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def __enter__(self) -> Manifest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    def append(self, op: str, **fields: Any) -> int:
        """Append {"op": op, **fields} durably (fsync) and apply it; its sequence number.
        ManifestTransitionError, before anything is written, for a record the state refuses."""
        if self._fd < 0:
            raise TierError(f"{self.path}: the manifest is closed")
        payload = {"op": op, **fields}
        self.state.check(payload)
        seq = self.state.last_seq + 1
        record = encode_record(seq, payload)
        try:
            _write_all(self._fd, record)
            os.fsync(self._fd)
        except BaseException:
            # never leave a partial record for the next append to follow (it would be a bad
            # record before the last one): cut back to where this one started
            os.ftruncate(self._fd, self.size)
            raise
        self.size += len(record)
        self.state.apply(seq, payload)
        if self.size > self.compact_bytes:
            try:
                self.compact()
            except OSError as exc:  # the record is durable; the next append tries again
                _log.warning("%s: compaction failed (%s); the log keeps growing until it succeeds", self.path, exc)
        return seq

    def compact(self) -> None:
        """spec §4.4: the live state to manifest.snapshot, then a log holding only the
        SNAPSHOT header record. A failure before the log is replaced leaves the old log in use
        (a snapshot newer than it is harmless: its records up to the snapshot are skipped)."""
        seq = self.state.last_seq
        live = self.state.live_json()
        _write_whole(self.snapshot_path, encode_record(seq, {"op": SNAPSHOT, "upto": seq, "state": live},
                                                       max_payload=MAX_PAYLOAD))
        header = encode_record(seq, {"op": SNAPSHOT, "upto": seq})
        _write_whole(self.path, header)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = len(header)
        self.state = ManifestState.from_json(live, seq)
        self.compactions += 1

    # -- one method per op (spec §4.2's write order) ----------------------------------------------

    def copy_started(self, *, log: int, file_start: int, file_size: int, upload_id: str, key: str,
                     created_ms: int | None = None) -> int:
        return self.append(COPY_STARTED, log=log, file_start=file_start, file_size=file_size, upload_id=upload_id,
                           key=key, created_ms=_now_ms() if created_ms is None else created_ms)

    def mpu(self, upload_id: str, mpu_id: str) -> int:
        return self.append(MPU, upload_id=upload_id, mpu_id=mpu_id)

    def copy_finished(self, upload_id: str, *, size: int, data_crc32: int, footer_crc32: int, first_store_ts: int,
                      last_store_ts: int, record_count: int, queues: int, ms: int | None = None) -> int:
        """COPY_FINISHED; the segment's tier queue index entries must be written and synced
        before (mqstore.tier.queues), so no COPY_FINISHED segment lacks them."""
        return self.append(COPY_FINISHED, upload_id=upload_id, size=size, data_crc32=data_crc32,
                           footer_crc32=footer_crc32, first_store_ts=first_store_ts, last_store_ts=last_store_ts,
                           record_count=record_count, queues=queues, ms=_now_ms() if ms is None else ms)

    def delete_started(self, upload_id: str, *, ms: int | None = None) -> int:
        op = INDEX_DELETE_STARTED if isinstance(self.state.uploads.get(upload_id), IndexObject) else DELETE_STARTED
        return self.append(op, upload_id=upload_id, ms=_now_ms() if ms is None else ms)

    def delete_finished(self, upload_id: str, *, ms: int | None = None) -> int:
        op = INDEX_DELETE_FINISHED if isinstance(self.state.uploads.get(upload_id), IndexObject) else DELETE_FINISHED
        return self.append(op, upload_id=upload_id, ms=_now_ms() if ms is None else ms)

    def index_copy_started(self, *, log: int, name: str, upload_id: str, key: str,
                           created_ms: int | None = None) -> int:
        return self.append(INDEX_COPY_STARTED, log=log, name=name, upload_id=upload_id, key=key,
                           created_ms=_now_ms() if created_ms is None else created_ms)

    def index_copy_finished(self, upload_id: str, *, size: int, crc32: int, begin_ts: int, end_ts: int,
                            ms: int | None = None) -> int:
        return self.append(INDEX_COPY_FINISHED, upload_id=upload_id, size=size, crc32=crc32, begin_ts=begin_ts,
                           end_ts=end_ts, ms=_now_ms() if ms is None else ms)

    def gap(self, *, log: int, file_start: int, file_end: int, reason: str, ms: int | None = None) -> int:
        return self.append(GAP, log=log, file_start=file_start, file_end=file_end, reason=reason,
                           ms=_now_ms() if ms is None else ms)

    def copied_upto(self, log: int) -> int:
        return self.state.copied_upto(log)

    def recovery_actions(self) -> list[RecoveryAction]:
        return recovery_actions(self.state)


def _now_ms() -> int:
    return int(time.time() * 1000)


def records_of(root_or_tier_dir: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The log's records as they are on disk (a torn tail left out), for tools and tests."""
    path = os.path.join(_resolve(root_or_tier_dir), MANIFEST_NAME)
    yield from scan_records(_read(path) or b"", path)[0]


# -- tier/STORE_ID (spec §4.4, §5.1) -----------------------------------------------------------


def store_id(root_or_tier_dir: str) -> str:
    """This store's tier id: 16 random bytes as 32 lower-case hex digits in tier/STORE_ID,
    created once (written to a temporary file, fsynced, then linked into place, which fails if
    another process created it first: both then return the same id)."""
    directory = _resolve(root_or_tier_dir)
    path = os.path.join(directory, STORE_ID_NAME)
    existing = _read_store_id(path)
    if existing is not None:
        return existing
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, (os.urandom(16).hex() + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fsync_dir(directory)
    made = _read_store_id(path)
    assert made is not None
    return made


def _read_store_id(path: str) -> str | None:
    data = _read(path)
    if data is None:
        return None
    text = data.decode("ascii", "replace").strip()
    if not re.fullmatch(r"[0-9a-f]{32}", text):
        raise TierError(f"{path} holds {data[:80]!r}, not a store id (32 lower-case hex digits)",
                        hint="the file is written once by the tierer; restore it, or remove it only if this "
                             "store has never tiered (the bucket's STORE.json names the id)")
    return text
