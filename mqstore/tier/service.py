"""The tierer's copy loop (tiered-storage spec §4.1–§4.3), as a library object: ``Tierer``.

One pass (``run_once``) claims the bucket prefix (``STORE.json``, once), finishes what a crash or
a failed copy left half done (§4.3: the manifest's ``recovery_actions``), then copies per
CommitLog at most one eligible closed file, the lowest not copied yet:

1. build its ``.mqseg`` segment from a read-only map of the file (``SegmentBuilder``; the valid
   length is where ``scan_records`` meets the file's END_OF_FILE blank);
2. ``COPY_STARTED`` (before anything is created in the bucket: every object the tierer makes is
   known to the manifest);
3. put the segment in parts under ``segment_key(P, log, file_start, upload_id)``;
4. with ``tiered_store_verify_after_upload``: HEAD (size), ranged GETs of the trailer and the
   footer, both parsed and their CRCs compared with the ones computed while streaming;
5. the tier queue index entries of every queue group, appended and synced;
6. ``COPY_FINISHED``.

Any failure after step 2 (an ``ObjectStoreError``, a failed verification, a refused queue index
entry) records ``DELETE_STARTED``, deletes the key, drops the entries step 5 wrote, records
``DELETE_FINISHED``, and leaves the file for a later pass with a new upload id (Kafka's
"cleaning segment"). A delete the bucket refuses stays ``DELETE_STARTED`` and is retried at the
start of every pass.

Not here yet (docs/tiering.md): the service process and its supervision, publishing
``copied_upto`` in the control block, tier retention, the orphan sweep, index objects.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from mqstore.config import StoreConfig
from mqstore.errors import CorruptRecordError, CorruptSegmentError, ObjectStoreError, TierError
from mqstore.log._mapped import MappedFile
from mqstore.log._scan import scan_records
from mqstore.log.commitlog import commit_log_files
from mqstore.log.mapped_file_queue import mapped_file_names
from mqstore.roles import BrokerRole
from mqstore.segformat import TRAILER_SIZE
from mqstore.tier._segment import SegmentBuilder, parse_footer, parse_trailer
from mqstore.tier.manifest import COPY_STARTED, DELETE_STARTED, Manifest, RecoveryAction, Step, store_id
from mqstore.tier.objects import ObjectStore, claim_store, new_upload_id, segment_key
from mqstore.tier.queues import QueueEntry, TierQueueIndex, drop_segment_entries, iter_queue_indexes

if TYPE_CHECKING:
    from mqstore.log._shm import CellName

__all__ = ["CopyResult", "PassReport", "Positions", "Tierer"]

_log = logging.getLogger("mqstore.tier.service")


class Positions(Protocol):
    """What the tierer reads of the control block (``ControlBlock`` has it)."""

    def get(self, name: CellName, log: int = 0) -> int: ...


@dataclass(frozen=True)
class CopyResult:
    """One copy attempt of one file."""

    log: int
    file_start: int
    upload_id: str | None  # None: refused before COPY_STARTED (the local file does not parse)
    key: str | None
    ok: bool
    size: int = 0
    error: str | None = None


@dataclass
class PassReport:
    """What one ``run_once`` did."""

    recovered: list[RecoveryAction] = field(default_factory=list)
    copied: list[CopyResult] = field(default_factory=list)
    failed: list[CopyResult] = field(default_factory=list)
    #: per log, why nothing was copied (no closed file left, a position behind, the upload delay)
    waiting: dict[int, str] = field(default_factory=dict)


class _CopyFailed(Exception):
    """A copy that got past COPY_STARTED and must be cleaned up."""


class Tierer:
    """The copy loop of one store (spec §4). ``root``: the store directory; ``config``: its
    settings (``object_store_*``, ``tiered_store_*``); ``positions``: its control block (the
    ``wrote``/``flushed``/``dispatched``/``confirmed``/``ha_slaves`` cells of each log).

    The object owns the manifest (one Tierer per store: a second one fails with TierError).
    ``objects`` overrides the ObjectStore (tests pass a short back-off)."""

    def __init__(self, root: str, config: StoreConfig, positions: Positions, *,
                 objects: ObjectStore | None = None) -> None:
        self.root = os.fspath(root)
        self.config = config
        self.positions = positions
        self.objects = objects or ObjectStore(config)
        self.manifest = Manifest(self.root)
        self.store_id = store_id(self.root)
        self._claimed = False
        # a queue's next offset after the copied files (queue_ends for the builder: the
        # put_unit MAX_GAP_UNITS rule needs the end before the file); one CommitLog only
        self._queue_ends: dict[tuple[str, int], int] | None = None

    def close(self) -> None:
        self.manifest.close()

    def __enter__(self) -> Tierer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pass ------------------------------------------------------------------------------

    def copied_upto(self, log: int) -> int:
        """What ``tier_copied_upto_k`` will publish (spec §4.2 step 5): the end of log's
        contiguous copied prefix (Manifest.copied_upto)."""
        return self.manifest.copied_upto(log)

    def run_once(self, now_ms: int | None = None) -> PassReport:
        """One pass: claim the prefix (first pass), recover, then copy at most one eligible file
        per log (spec §4.1). Bucket errors of a copy are reported in ``failed``; those of the
        claim and of recovery are raised (the pass cannot start safely without them)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        report = PassReport()
        if not self._claimed:
            claim_store(self.config, self.store_id, objects=self.objects, now_ms=now)
            self._claimed = True
        report.recovered = self.recover()
        for log in range(self.config.commit_log_count):
            result = self._copy_next(log, now, report)
            if result is not None:
                (report.copied if result.ok else report.failed).append(result)
        return report

    def recover(self) -> list[RecoveryAction]:
        """spec §4.3: every upload left COPY_STARTED (a crash) or DELETE_STARTED (a crash or a
        delete the bucket refused) is deleted from the bucket and recorded DELETE_FINISHED; a
        segment's tier queue index entries are dropped; its file is copied again by a later
        pass (the eligibility rule finds it: no copied upload). An ObjectStoreError leaves the
        upload DELETE_STARTED for the next pass and is raised."""
        actions = self.manifest.recovery_actions()
        for action in actions:
            for step in action.steps:
                if step is Step.RECORD_DELETE_STARTED:
                    self.manifest.delete_started(action.upload_id)
                elif step is Step.ABORT_MPU:
                    # never recorded by this tierer (obstore 0.12 exposes no MPU id); a manifest
                    # holding one came from elsewhere: the bucket's lifecycle rule aborts it
                    _log.warning("upload %s: multipart upload %s cannot be aborted with obstore; the bucket's "
                                 "AbortIncompleteMultipartUpload rule removes it", action.upload_id, action.mpu_id)
                elif step is Step.DELETE_OBJECT:
                    self.objects.delete(action.key)
                elif step is Step.RECORD_DELETE_FINISHED:
                    self.manifest.delete_finished(action.upload_id)
                elif step is Step.DROP_QUEUE_ENTRIES:
                    assert action.file_start is not None
                    drop_segment_entries(self.root, action.log, action.file_start)
                    self._queue_ends = None  # read again from the indexes
            if Step.REQUEUE in action.steps:
                _log.info("upload %s of log %d (%s) was cut short: cleaned, the file will be copied again",
                          action.upload_id, action.log, action.key)
        return actions

    # -- eligibility (spec §4.1) -------------------------------------------------------------------

    def _bound(self, log: int) -> tuple[int, str]:
        """The highest file end the positions allow, and the cell that sets it."""
        names: tuple[CellName, ...] = ("wrote", "flushed", "dispatched")
        if self.config.broker_role is not BrokerRole.SLAVE and self.positions.get("ha_slaves", log=log) > 0:
            names += ("confirmed",)  # never tier bytes a slave does not have
        values = [(self.positions.get(name, log=log), name) for name in names]
        return min(values)

    def _next_file(self, log: int) -> tuple[str, int, int] | str:
        """(path, file start, file size) of log's lowest file not copied nor in a gap, or why none."""
        files = commit_log_files(self.root, self.config, log)
        names = mapped_file_names(files.store_path, fenced=files.fenced) if os.path.isdir(files.store_path) else []
        state = self.manifest.state
        segments = state.segments(log)
        gaps = state.gaps_of(log)
        size = files.file_size
        for name in names:
            start = int(name)
            seg = segments.get(start)
            if seg is not None and seg.copied:
                continue
            if any(g.file_start <= start < g.file_end for g in gaps):
                continue
            if seg is not None and seg.state in (COPY_STARTED, DELETE_STARTED):
                return f"file {name} has an upload in state {seg.state} (cleaned at the next pass)"
            return os.path.join(files.store_path, name), start, size
        return "no file left to copy"

    # -- one copy ----------------------------------------------------------------------------------

    def _copy_next(self, log: int, now: int, report: PassReport) -> CopyResult | None:
        found = self._next_file(log)
        if isinstance(found, str):
            report.waiting[log] = found
            return None
        path, start, size = found
        bound, cell = self._bound(log)
        if bound < start + size:
            report.waiting[log] = f"file {start} is not closed/{cell} yet ({cell} {bound} < end {start + size})"
            return None
        try:
            mapped = MappedFile.open(path, size, readonly=True)
        except FileNotFoundError:  # deleted locally meanwhile: local retention records the gap
            report.waiting[log] = f"file {start} is gone"
            return None
        try:
            delay = self.config.tiered_store_upload_delay_ms
            if delay > 0:
                closed_ms = self._closed_ms(log, start + size, size)
                if closed_ms is None or now - closed_ms < delay:
                    report.waiting[log] = f"file {start} closed less than {delay} ms ago"
                    return None
            return self._copy(log, start, size, mapped, now)
        finally:
            mapped.close()

    def _closed_ms(self, log: int, next_start: int, size: int) -> int | None:
        """When the file before next_start was closed: the store timestamp of the next file's
        first record (the put that did not fit in it)."""
        files = commit_log_files(self.root, self.config, log)
        try:
            mapped = MappedFile.open(files.path_of(next_start), size, readonly=True)
        except FileNotFoundError:
            return None
        try:
            with memoryview(mapped) as view:
                first = int.from_bytes(view[:4], "big", signed=True)
            if first <= 0 or first > size:
                return None
            _stop, reason, count, ts = scan_records(mapped, next_start, 0, first, False)
            return ts if count == 1 else None
        finally:
            mapped.close()

    def _copy(self, log: int, start: int, size: int, mapped: MappedFile, now: int) -> CopyResult:
        try:
            stop, reason, _count, _ts = scan_records(mapped, start, 0, size, False)
            if reason != "blank":
                raise CorruptRecordError(f"{mapped.path}: the records stop at file position {stop} ({reason}), "
                                         "not at an END_OF_FILE blank")
            seg = SegmentBuilder(mapped, start, log, stop, queue_ends=self._ends(log))
        except CorruptRecordError as exc:
            _log.error("log %d file %d is not copied: %s", log, start, exc)
            return CopyResult(log, start, None, None, False, error=str(exc))
        upload_id = new_upload_id()
        key = segment_key(self.objects.prefix, log, start, upload_id)
        self.manifest.copy_started(log=log, file_start=start, file_size=size, upload_id=upload_id, key=key,
                                   created_ms=now)
        entries_started = False
        try:
            self._put(key, seg)
            if self.config.tiered_store_verify_after_upload:
                self._verify(key, seg)
            entries_started = True
            groups = self._write_queue_entries(log, start, seg)
        except (ObjectStoreError, CorruptSegmentError, TierError, _CopyFailed) as exc:
            _log.warning("copy %s of log %d file %d failed, cleaning up: %s", upload_id, log, start, exc)
            self._clean_failed(upload_id, key, log, start, entries_started)
            return CopyResult(log, start, upload_id, key, False, error=str(exc))
        self.manifest.copy_finished(upload_id, size=seg.size, data_crc32=seg.data_crc, footer_crc32=seg.footer_crc,
                                    first_store_ts=seg.first_store_timestamp, last_store_ts=seg.last_store_timestamp,
                                    record_count=seg.record_count, queues=groups)
        return CopyResult(log, start, upload_id, key, True, size=seg.size)

    def _put(self, key: str, seg: SegmentBuilder) -> None:
        part_size = self.objects.part_size
        info = self.objects.put(key, lambda: seg.parts(part_size), size=seg.size)
        if info.size != seg.size:
            raise _CopyFailed(f"put {key} sent {info.size} bytes, the segment has {seg.size}")

    def _verify(self, key: str, seg: SegmentBuilder) -> None:
        """spec §4.2 step 4: the object's size, trailer and footer as stored, against what was built."""
        head = self.objects.head(key)
        if head.size != seg.size:
            raise _CopyFailed(f"{key} holds {head.size} bytes after the upload, the segment has {seg.size}")
        trailer_bytes = self.objects.get_range(key, seg.size - TRAILER_SIZE, TRAILER_SIZE)
        trailer = parse_trailer(trailer_bytes)
        footer = self.objects.get_range(key, trailer.data_len, trailer.footer_len) if trailer.footer_len else b""
        parse_footer(footer, trailer)
        if (trailer_bytes != seg.trailer or trailer.data_crc != seg.data_crc
                or trailer.footer_crc != seg.footer_crc or footer != seg.footer):
            raise _CopyFailed(f"{key} read back differs from the segment built (data CRC "
                              f"{trailer.data_crc:#010x} vs {seg.data_crc:#010x}, footer CRC "
                              f"{trailer.footer_crc:#010x} vs {seg.footer_crc:#010x})")

    def _write_queue_entries(self, log: int, start: int, seg: SegmentBuilder) -> int:
        """spec §6.2: one entry per queue group, every index synced (before COPY_FINISHED);
        how many queue groups the segment has."""
        ends = self._queue_ends
        groups = 0
        for g in seg.directory:
            if g.no_queue:
                continue
            topic = g.topic.decode("utf-8")
            with TierQueueIndex(self.root, topic, g.queue_id, writable=True) as index:
                index.append(QueueEntry(first_queue_offset=g.first_queue_offset, record_count=g.record_count,
                                        log=log, file_start=start, min_store_ts=g.min_store_timestamp))
                index.sync()
            groups += 1
            if ends is not None:
                ends[(topic, g.queue_id)] = g.first_queue_offset + g.record_count
        return groups

    def _clean_failed(self, upload_id: str, key: str, log: int, start: int, entries_started: bool) -> None:
        """Kafka's "cleaning segment": DELETE_STARTED, delete, drop the entries, DELETE_FINISHED. A
        delete the bucket refuses leaves DELETE_STARTED: the next pass's recovery deletes again."""
        self.manifest.delete_started(upload_id)
        if entries_started:
            drop_segment_entries(self.root, log, start)
            self._queue_ends = None
        try:
            self.objects.delete(key)
        except ObjectStoreError as exc:
            _log.warning("delete of the failed upload %s (%s) failed; retried next pass: %s", upload_id, key, exc)
            return
        self.manifest.delete_finished(upload_id)

    def _ends(self, log: int) -> Mapping[tuple[str, int], int] | None:
        """queue_ends for the builder: each queue's next offset after the copied files, from the
        tier queue indexes (read once, then kept up to date). Only for a store with one
        CommitLog: with several, a queue's records of other logs are not in this log's files."""
        if self.config.commit_log_count != 1:
            return None
        if self._queue_ends is None:
            ends: dict[tuple[str, int], int] = {}
            for topic, queue_id, _path in iter_queue_indexes(self.root):
                with TierQueueIndex(self.root, topic, queue_id) as index:
                    end = index.max_offset()
                if end is not None:
                    ends[(topic, queue_id)] = end
            self._queue_ends = ends
        return self._queue_ends
