"""Retention (spec §14): CleanService on real stores, real files and real mtimes.

The wall clock and the disk usage are injected (``now_ms``, ``disk_usage``) where a test needs
a given hour or a given fill level; files are aged with os.utime. One end-to-end test runs the
service thread with the real clock and statvfs, one fills a real tmpfs until the disk is full.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from typing import Any
import time

import pytest

from helpers_fs import run_in_tmpfs, tmpfs_supported
from mqstore import Message, MessageStore, PutMessageStatus
from mqstore.log import _shm
from mqstore.queue._consumequeue import CQ_STORE_UNIT_SIZE as UNIT
from mqstore.log._mapped import MappedFile
from mqstore.tools.checker import check_store
from mqstore.config import StoreConfig
from mqstore.queue.consume_queue import ConsumeQueueTable
from mqstore.log.mapped_file_queue import MappedFileQueue
from mqstore.services.clean import (
    MAX_MANUAL_DELETE_FILE_TIMES,
    CleanCommitLogService,
    CleanConsumeQueueService,
    CleanReport,
    CleanService,
    disk_usage_ratio,
)
from mqstore.status import GetMessageStatus as S

FS = 4096          # CommitLog file size: about 20 messages per file
CQ_UNITS = 10      # units per ConsumeQueue file
CFG = {
    "mapped_file_size_commit_log": FS, "max_message_size": 1024,
    "mapped_file_size_consume_queue": CQ_UNITS * UNIT,
    "max_hash_slot_num": 16, "max_index_num": 40,          # 39 keys per index file
    "delete_commit_log_files_interval": 0, "delete_consume_queue_files_interval": 0,
    "delete_when": "04",
}
HOUR_S = 3600
ALL_HOURS = ";".join(str(h) for h in range(24))


def local_ms(hour: int, minute: int = 30) -> int:
    """A wall clock reading at hour:minute local time (a fixed day)."""
    return int(time.mktime((2024, 3, 12, hour, minute, 0, 0, 0, -1)) * 1000)


class Clock:
    """An injectable wall clock (ms)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class Disk:
    """An injectable disk usage: one ratio for every path, the paths asked recorded."""

    def __init__(self, ratio: float = 0.5) -> None:
        self.ratio = ratio
        self.paths: list[str] = []

    def __call__(self, path: str) -> float:
        self.paths.append(path)
        return self.ratio


def fill(store: MessageStore, n: int, *, queues: int = 2, start: int = 0) -> list:
    results = []
    for i in range(start, start + n):
        msg = Message("T", b"body-%04d-" % i + b"x" * 60, queue_id=i % queues, keys=[f"k{i}"])
        results.append(store.put_message(msg).check())
    assert store.wait_dispatched()
    store.flush()
    return results


def age(queue: MappedFileQueue, files: list, now_ms: int, hours: float = 100) -> None:
    """Give files an mtime `hours` before now_ms."""
    t = now_ms / 1000 - hours * HOUR_S
    for mf in files:
        os.utime(mf.path, (t, t))


def starts(queue: MappedFileQueue) -> list[int]:
    return [mf.file_from for mf in queue.files]


def names_on_disk(directory: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(directory) if len(n) == 20 and n.isdigit())


def cleaner(store: MessageStore, clock: Clock, disk: Callable[[str], float] | None = None, **config) -> CleanService:
    cfg = store.config.replace(**config) if config else store.config
    return CleanService(store.ctl, store.commitlog.queue, store.consume_queues, store.index, cfg, store.root,
                        now_ms=clock, disk_usage=disk or Disk(), initial_delay_ms=0)


@pytest.fixture
def store(open_store):
    s = open_store(**CFG)
    fill(s, 300)
    assert len(s.commitlog.queue) >= 12
    return s


# -- CommitLog files by time (spec §6.2 deleteExpiredFileByTime) -------------------------------

def test_expired_files_go_oldest_first_at_most_ten_per_run(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    before = starts(queue)
    age(queue, queue.files[:-1], clock.ms)
    service = cleaner(store, clock)
    r = service.clean_once()
    assert r.time_up and r.deleting and not r.clean_at_once and r.commitlog_files_deleted == 10
    assert starts(queue) == before[10:], "the ten oldest"
    assert names_on_disk(queue.store_path)[:len(before) - 10] == before[10:], "gone from the disk (a file allocated ahead follows)"
    r = service.clean_once()
    assert r.commitlog_files_deleted == len(before) - 11
    assert starts(queue) == before[-1:], "never the last file"
    assert service.clean_once().commitlog_files_deleted == 0


def test_batch_size_follows_delete_file_batch_max(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:-1], clock.ms)
    assert cleaner(store, clock, delete_file_batch_max=3).clean_once().commitlog_files_deleted == 3


def test_stops_at_the_first_unexpired_file(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    files = queue.files
    age(queue, [files[0], files[1], files[3], files[4]], clock.ms)
    age(queue, [files[2]], clock.ms, hours=71)           # file_reserved_time is 72 h
    r = cleaner(store, clock).clean_once()
    assert r.commitlog_files_deleted == 2 and starts(queue)[0] == files[2].file_from, "no holes"
    r = cleaner(store, clock, file_reserved_time=70).clean_once()
    assert r.commitlog_files_deleted == 3 and starts(queue)[0] == files[5].file_from


def test_young_files_stay_and_the_pause_between_deletions_is_taken_from_the_config(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    before = starts(queue)
    assert cleaner(store, clock).clean_once().commitlog_files_deleted == 0, "real mtimes are years after the clock"
    assert starts(queue) == before
    age(queue, queue.files[:3], clock.ms)
    pauses: list[float] = []
    service = CleanCommitLogService(store.ctl, queue, store.config.replace(delete_commit_log_files_interval=7),
                                    store.root, store.consume_queues.root, now_ms=clock, disk_usage=Disk(),
                                    sleep_ms=pauses.append)
    report = CleanReport(service.check_disk())
    service.run(report)
    assert report.commitlog_files_deleted == 3
    assert pauses == [7, 7, 7], "after each deletion while older files follow (RocketMQ: (i + 1) < count)"


# -- when: delete_when, disk, manual ------------------------------------------------------------

@pytest.mark.parametrize("when, hour, deletes", [
    ("04", 4, True), ("04", 5, False), ("04", 3, False), ("03;04;16", 16, True), ("03;04;16", 15, False),
    ("0", 0, True), ("23", 23, True), ("4", 4, True),
])
def test_delete_when_matches_the_local_hour(store, when, hour, deletes):
    clock = Clock(local_ms(hour, 59))
    queue = store.commitlog.queue
    age(queue, queue.files[:2], clock.ms)
    r = cleaner(store, clock, delete_when=when).clean_once()
    assert r.time_up is deletes and r.deleting is deletes
    assert r.commitlog_files_deleted == (2 if deletes else 0)


def test_disk_over_max_used_ratio_deletes_expired_files_at_any_hour(store):
    clock = Clock(local_ms(13))
    queue = store.commitlog.queue
    age(queue, queue.files[:2], clock.ms)
    disk = Disk(0.76)                                   # above the default 75 %
    r = cleaner(store, clock, disk).clean_once()
    assert not r.time_up and r.disk.space_to_delete and not r.disk.clean_immediately
    assert r.commitlog_files_deleted == 2, "expired files only"
    assert "DISK_FULL" not in store.ctl.running_flags()
    assert set(disk.paths) == {queue.store_path, store.consume_queues.root}


@pytest.mark.parametrize("configured, effective", [(5, 10), (99, 95), (60, 60)])
def test_disk_max_used_space_ratio_is_clamped(store, configured, effective):
    clock = Clock(local_ms(13))
    service = cleaner(store, clock, Disk(effective / 100 + 0.01), disk_max_used_space_ratio=configured,
                      disk_space_clean_forcibly_ratio=100, disk_space_warning_level_ratio=100)
    assert service.clean_once().disk.space_to_delete
    service = cleaner(store, clock, Disk(effective / 100), disk_max_used_space_ratio=configured,
                      disk_space_clean_forcibly_ratio=100, disk_space_warning_level_ratio=100)
    assert not service.clean_once().disk.space_to_delete


def test_unmeasurable_disk_counts_as_space_to_delete(store):
    clock = Clock(local_ms(13))
    queue = store.commitlog.queue
    age(queue, queue.files[:1], clock.ms)
    r = cleaner(store, clock, Disk(-1.0)).clean_once()
    assert r.disk.space_to_delete and not r.disk.disk_full and r.commitlog_files_deleted == 1


def test_disk_above_clean_forcibly_ratio_deletes_unexpired_files(store):
    clock = Clock(local_ms(13))
    queue = store.commitlog.queue
    before = starts(queue)
    r = cleaner(store, clock, Disk(0.86)).clean_once()
    assert r.disk.clean_immediately and r.clean_at_once and not r.disk.disk_full
    assert r.commitlog_files_deleted == 10 and starts(queue) == before[10:]
    assert "DISK_FULL" not in store.ctl.running_flags()
    r = cleaner(store, clock, Disk(0.86), clean_file_forcibly_enable=False).clean_once()
    assert r.deleting and not r.clean_at_once and r.commitlog_files_deleted == 0, "young files stay"


def test_disk_full_flag_refuses_puts_until_usage_drops(store):
    clock = Clock(local_ms(13))
    disk = Disk(0.91)
    service = cleaner(store, clock, disk)
    queue = store.commitlog.queue
    before = starts(queue)
    r = service.clean_once()
    assert r.disk.disk_full and r.clean_at_once and r.commitlog_files_deleted == 10
    assert starts(queue) == before[10:]
    assert "DISK_FULL" in store.ctl.running_flags()
    refused = store.put_message(Message("T", b"no room"))
    assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    # the 10 s disk check alone keeps the flag while the disk stays full ...
    assert service.check_disk_space().disk_full and "DISK_FULL" in store.ctl.running_flags()
    disk.ratio = 0.89                                   # between clean-forcibly and warning
    r = service.check_disk_space()
    assert not r.disk_full and r.clean_immediately and "DISK_FULL" not in store.ctl.running_flags()
    store.put_message(Message("T", b"room again")).check()
    disk.ratio = 0.95
    service.clean_once()
    assert "DISK_FULL" in store.ctl.running_flags()
    disk.ratio = 0.30
    service.clean_once()
    assert "DISK_FULL" not in store.ctl.running_flags()
    fill(store, 5, start=300)


def test_either_partition_full_sets_the_flag_and_both_must_drop_to_clear_it(store):
    clock = Clock(local_ms(13))
    ratios = {store.commitlog.queue.store_path: 0.20, store.consume_queues.root: 0.93}
    service = cleaner(store, clock, lambda path: ratios[path])
    r = service.clean_once()
    assert r.disk.commitlog_ratio == 0.20 and r.disk.consume_queue_ratio == 0.93 and r.disk.disk_full
    assert "DISK_FULL" in store.ctl.running_flags()
    ratios[store.consume_queues.root] = 0.20
    ratios[store.commitlog.queue.store_path] = 0.93
    assert service.check_disk_space().disk_full and "DISK_FULL" in store.ctl.running_flags()
    ratios[store.commitlog.queue.store_path] = 0.20
    assert not service.check_disk_space().disk_full and "DISK_FULL" not in store.ctl.running_flags()


def test_manual_delete_runs_twenty_times(store):
    clock = Clock(local_ms(13))
    queue = store.commitlog.queue
    service = cleaner(store, clock)
    age(queue, queue.files[:3], clock.ms)
    assert not service.clean_once().deleting
    service.execute_delete_files_manually()
    r = service.clean_once()
    assert r.manual and r.deleting and r.commitlog_files_deleted == 3
    for _ in range(MAX_MANUAL_DELETE_FILE_TIMES - 1):
        assert service.clean_once().manual
    age(queue, queue.files[:1], clock.ms)
    r = service.clean_once()
    assert not r.manual and not r.deleting and r.commitlog_files_deleted == 0, "the twenty runs are used up"


# -- what a deletion leaves: flush and dispatch, hanged files, the control block ----------------

@pytest.fixture
def bare(tmp_path):
    """A CommitLog directory of six real files, a control block, no queues: the service's
    constructor takes exactly these."""
    cl_dir = tmp_path / "store" / "commitlog"
    cl_dir.mkdir(parents=True)
    for i in range(6):
        MappedFile.create(str(cl_dir / f"{i * FS:020d}"), FS).close()
    queue = MappedFileQueue(str(cl_dir), FS)
    queue.load()
    ctl = _shm.ControlBlock.create(str(tmp_path / "store" / "mqstore.shm"), table_slots=64, file_size=FS,
                                   lock_kind="spin", sync_flush=False)
    for name in ("wrote", "committed", "flushed", "dispatched"):
        ctl.set(name, 6 * FS)
    queues = ConsumeQueueTable(str(tmp_path / "store" / "consumequeue"), CQ_UNITS * UNIT)
    cfg = StoreConfig(**CFG)
    yield queue, ctl, queues, cfg, str(tmp_path / "store")
    queue.close()
    ctl.close()


def test_never_the_last_file_even_when_cleaning_forcibly(bare):
    queue, ctl, queues, cfg, root = bare
    service = CleanService(ctl, queue, queues, None, cfg, root, now_ms=Clock(local_ms(4)),
                           disk_usage=Disk(0.99), initial_delay_ms=0)
    assert service.clean_once().commitlog_files_deleted == 5
    assert starts(queue) == [5 * FS] and names_on_disk(queue.store_path) == [5 * FS]
    assert service.clean_once().commitlog_files_deleted == 0
    assert ctl.get("min_phy") == 5 * FS


def test_files_the_flush_or_the_dispatch_has_not_passed_are_kept(bare):
    queue, ctl, queues, cfg, root = bare
    service = CleanService(ctl, queue, queues, None, cfg, root, now_ms=Clock(local_ms(4)),
                           disk_usage=Disk(0.99), initial_delay_ms=0)
    ctl.set("dispatched", 2 * FS + 100)                  # dispatch is inside file 2
    assert service.clean_once().commitlog_files_deleted == 2
    assert starts(queue)[0] == 2 * FS
    ctl.set("dispatched", 6 * FS)
    ctl.set("flushed", 3 * FS)                           # flush at the start of file 3
    assert service.clean_once().commitlog_files_deleted == 1
    assert starts(queue)[0] == 3 * FS


def test_min_offset_is_published_in_the_control_block(bare):
    queue, ctl, queues, cfg, root = bare
    clock = Clock(local_ms(4))
    age(queue, queue.files[:2], clock.ms)
    service = CleanService(ctl, queue, queues, None, cfg, root, now_ms=clock, disk_usage=Disk(), initial_delay_ms=0)
    r = service.clean_once()
    assert r.min_offset == 2 * FS
    other = _shm.ControlBlock.attach(ctl.path)          # what another process sees
    try:
        assert other.get("min_phy") == 2 * FS
    finally:
        other.close()


def test_a_hanged_first_file_is_deleted_again_later(bare):
    queue, ctl, queues, cfg, root = bare
    clock = Clock(local_ms(4, 59))
    age(queue, queue.files[:3], clock.ms)
    service = CleanService(ctl, queue, queues, None, cfg, root, now_ms=clock, disk_usage=Disk(), initial_delay_ms=0)
    first = queue.first()
    assert first.hold()                                  # a reader that does not let go
    version = queue.version
    r = service.clean_once()
    assert r.commitlog_files_deleted == 0 and not r.hanged_file_deleted, "destroy of a held file fails"
    assert not first.is_available and os.path.exists(first.path), "shut down, still there"
    assert queue.version > version, "readers are told to drop the file"
    assert r.min_offset == FS and ctl.get("min_phy") == FS, "the min offset skips a file being deleted"
    first.release()
    clock.ms += 60_000                                   # 05:00, no deletion at this hour: only the retry runs
    r = service.clean_once()
    assert not r.deleting and not r.hanged_file_deleted, "the retry waits redelete_hanged_file_interval"
    clock.ms += cfg.redelete_hanged_file_interval + 1
    r = service.clean_once()
    assert r.hanged_file_deleted and not os.path.exists(first.path) and starts(queue)[0] == FS


def test_a_missing_consume_queue_directory_is_measured_at_the_root(bare):
    queue, ctl, queues, cfg, root = bare
    disk = Disk()
    CleanService(ctl, queue, queues, None, cfg, root, now_ms=Clock(local_ms(13)), disk_usage=disk,
                 initial_delay_ms=0).check_disk_space()
    assert disk.paths == [queue.store_path, root]


# -- ConsumeQueue and index files below the new min offset --------------------------------------

def _expired_cq_files(store: MessageStore, min_phy: int) -> dict[tuple[str, int], list[int]]:
    out = {}
    for cq in store.consume_queues:
        gone = []
        for mf in cq.files.files[:-1]:
            if int.from_bytes(mf.read(CQ_UNITS * UNIT - UNIT, 8), "big", signed=True) >= min_phy:
                break
            gone.append(mf.file_from)
        out[(cq.topic, cq.queue_id)] = gone
    return out


def test_consume_queue_and_index_files_below_the_min_offset_go(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:6], clock.ms)
    min_after = queue.files[6].file_from
    expect = _expired_cq_files(store, min_after)
    assert all(expect.values())
    index_files = store.index.files
    index_expired = [f for f in index_files[:-1] if f.end_phy_offset < min_after]
    assert len(index_files) >= 4 and index_expired
    r = cleaner(store, clock).clean_once()
    assert r.commitlog_files_deleted == 6 and r.min_offset == min_after
    assert r.consume_queue_files_deleted == sum(len(v) for v in expect.values())
    for cq in store.consume_queues:
        gone = expect[(cq.topic, cq.queue_id)]
        kept = starts(cq.files)
        assert kept[0] == gone[-1] + CQ_UNITS * UNIT and names_on_disk(cq.store_path) == kept
        # correct_min_offset: the first unit at or after the new min offset
        first_unit = next(q for q in range(cq.min_offset_in_queue, cq.max_offset_in_queue)
                          if cq.unit(q)[0] >= min_after)
        assert cq.min_offset_in_queue == first_unit
        assert cq.unit(first_unit - 1) is None or cq.unit(first_unit - 1)[0] < min_after
    assert r.index_files_deleted == len(index_expired)
    assert [f.file_name for f in store.index.files] == [f.file_name for f in index_files[len(index_expired):]]
    assert sorted(os.listdir(os.path.join(store.root, "index"))) == [f.file_name for f in store.index.files]
    again = cleaner(store, clock).clean_once()
    assert again.consume_queue_files_deleted == 0 and again.index_files_deleted == 0


def test_queues_run_only_when_the_min_offset_rose(store):
    clock = Clock(local_ms(13))
    service = cleaner(store, clock)
    assert service.clean_once().min_offset == 0
    assert service.consume_queue_cleaner.last_physical_min_offset == 0
    queue = store.commitlog.queue
    age(queue, queue.files[:2], clock.ms)
    service.execute_delete_files_manually()
    r = service.clean_once()
    assert r.min_offset == 2 * FS and service.consume_queue_cleaner.last_physical_min_offset == 2 * FS


def test_consume_queue_cleaner_pauses_after_each_queue_that_deleted(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:4], clock.ms)
    service = cleaner(store, clock)
    report = CleanReport(service.check_disk_space())
    service.commitlog_cleaner.run(report)               # the CommitLog half only
    assert report.commitlog_files_deleted == 4
    pauses: list[float] = []
    cq_cleaner = CleanConsumeQueueService(store.consume_queues, store.index,
                                          store.config.replace(delete_consume_queue_files_interval=5),
                                          sleep_ms=pauses.append)
    cq_cleaner.run(store.get_min_phy_offset(), report)
    assert report.consume_queue_files_deleted > 0 and pauses == [5, 5], "two queues deleted files"
    cq_cleaner.run(store.get_min_phy_offset(), report)
    assert pauses == [5, 5], "the min offset did not rise: nothing to do"


def test_never_the_last_consume_queue_or_index_file(open_store):
    store = open_store(**CFG)
    fill(store, 40, queues=1)
    store.put_message(Message("Other", b"o" * 80, keys=["o"])).check()  # its queue: one file, all below
    fill(store, 300, queues=1, start=40)
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:-1], clock.ms)
    service = cleaner(store, clock, delete_file_batch_max=100)
    service.clean_once()
    assert len(queue) == 1
    other = store.consume_queues.get("Other", 0)
    assert len(other.files) == 1 and other.min_offset_in_queue == 0, "the last file stays; no unit is above"
    t = store.consume_queues.get("T", 0)
    assert len(t.files) >= 1 and len(store.index.files) >= 1
    got = store.get_message("g", "Other", 0, 0, 32)
    assert got.status is S.MESSAGE_WAS_REMOVING and got.next_begin_offset == 1


# -- reads after deletion (spec §11) ------------------------------------------------------------

def test_reads_after_deletion(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    held = store.get_message("g", "T", 0, 0, 4)         # views taken before the deletion
    assert held.status is S.FOUND
    held_bodies = [bytes(m.body) for m in held]
    first_phy = held[0].physical_offset
    age(queue, queue.files[:4], clock.ms)
    min_after = queue.files[4].file_from
    service = cleaner(store, clock)
    # the CommitLog half alone first: the queues still hold units of the removed records
    report = CleanReport(service.commitlog_cleaner.check_disk())
    service.commitlog_cleaner.run(report)
    assert report.commitlog_files_deleted == 4 and store.get_min_phy_offset() == min_after
    got = store.get_message("g", "T", 0, 0, 32)
    assert got.status is S.MESSAGE_WAS_REMOVING and len(got) == 0 and got.next_begin_offset > 0
    assert store.look_message_by_offset(first_phy) is None
    assert store.get_message_store_timestamp("T", 0, 0) == -1
    assert store.query_message("T", "k0").messages == []
    assert [bytes(m.body) for m in held] == held_bodies, "views taken before stay readable"
    # then the queues: offsets below the corrected min are too small
    r = service.clean_once()
    assert r.min_offset == min_after and r.consume_queue_files_deleted > 0
    cq_min = store.get_min_offset_in_queue("T", 0)
    assert cq_min > 0
    got = store.get_message("g", "T", 0, 0, 32)
    assert got.status is S.OFFSET_TOO_SMALL and got.next_begin_offset == cq_min
    got = store.get_message("g", "T", 0, cq_min, 32)
    assert got.status is S.FOUND and got[0].physical_offset >= min_after and got[0].queue_offset == cq_min
    assert store.get_offset_in_queue_by_time("T", 0, 0) == cq_min
    assert store.get_earliest_message_time("T", 0) == got[0].store_timestamp
    assert store.get_earliest_message_time() == store.look_message_by_offset(min_after).store_timestamp
    assert [bytes(m.body) for m in held] == held_bodies


def test_readers_racing_the_cleaner_never_crash(store):
    """A reader thread pulls, looks up by time and by offset while the cleaner deletes files
    run after run; every answer is a status, never an exception or a crash."""
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:-1], clock.ms)
    service = cleaner(store, clock, delete_file_batch_max=1)
    stop = threading.Event()
    seen: set = set()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                for qid in (0, 1):
                    for offset in (0, 5, 40, 80, 120):
                        got = store.get_message("g", "T", qid, offset, 8)
                        seen.add(got.status)
                        for m in got:
                            assert m.topic == "T"
                    store.get_offset_in_queue_by_time("T", qid, 0)
                    store.look_message_by_queue_offset("T", qid, 3)
                store.look_message_by_offset(0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        while service.clean_once().commitlog_files_deleted:
            pass
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[0]
    assert len(queue) == 1
    assert seen <= {S.FOUND, S.MESSAGE_WAS_REMOVING, S.OFFSET_TOO_SMALL, S.OFFSET_FOUND_NULL,
                    S.OFFSET_OVERFLOW_ONE, S.OFFSET_OVERFLOW_BADLY}


def test_deleted_files_are_unmapped_once_no_result_holds_them(store):
    """A deleted file's disk space is freed when its last mapping goes: the reader drops its
    map of the old file list at once, results taken before keep theirs until released."""
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    store.get_message("g", "T", 0, 0, 4)                # the reader maps every file
    first_path = queue.files[0].path
    held = store.get_message("g", "T", 1, 0, 4)
    age(queue, queue.files[:2], clock.ms)
    cleaner(store, clock).clean_once()
    assert not os.path.exists(first_path)
    assert first_path in _mappings(), "a result taken before still maps it"
    del held
    assert first_path not in _mappings()


def _mappings() -> str:
    with open(f"/proc/{os.getpid()}/maps") as fh:
        return fh.read()


# -- the store after cleaning ---------------------------------------------------------------------

def test_checker_passes_after_cleaning(store):
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:7], clock.ms)
    r = cleaner(store, clock).clean_once()
    assert r.commitlog_files_deleted == 7
    report = check_store(store.root, quiescent=False, config=store.config)
    assert report.ok, report.problems
    assert report.records > 0 and any(s.removed for s in report.consume_queues.values())
    store.shutdown()
    report = check_store(store.root, config=store.config).raise_if_failed()
    assert report.queues_complete_checked


@pytest.mark.parametrize("crash", [False, True], ids=["clean-shutdown", "abort-left"])
def test_reopen_after_cleaning(open_store, store_dir, crash):
    store = open_store(**CFG)
    fill(store, 300)
    clock = Clock(local_ms(4))
    queue = store.commitlog.queue
    age(queue, queue.files[:8], clock.ms)
    r = cleaner(store, clock).clean_once()
    assert r.commitlog_files_deleted == 8
    min_phy = store.get_min_phy_offset()
    mins = {q: store.get_min_offset_in_queue("T", q) for q in (0, 1)}
    maxs = {q: store.get_max_offset_in_queue("T", q) for q in (0, 1)}
    store.shutdown()
    if crash:
        open(os.path.join(store_dir, "abort"), "wb").close()
    again = open_store(**CFG)
    assert not again.recovery.damaged, again.recovery.summary()
    assert again.get_min_phy_offset() == min_phy and again.ctl.get("min_phy") == min_phy
    for q in (0, 1):
        assert again.get_min_offset_in_queue("T", q) == mins[q]
        assert again.get_max_offset_in_queue("T", q) == maxs[q]
        got = again.get_message("g", "T", q, mins[q], 32)
        assert got.status is S.FOUND and got[0].queue_offset == mins[q]
    results = fill(again, 10, start=300)
    assert results[0].queue_offset == maxs[0]
    cleaner(again, clock).clean_once()


# -- the service thread with the real clock and the real disk ------------------------------------

def test_end_to_end_thread_real_clock_real_mtimes_real_statvfs(open_store):
    """Nothing injected: real wall clock, file mtimes set with os.utime, statvfs of the real
    partition. Thresholds at 100 % so the real fill level of this disk cannot change the
    outcome; delete_when lists every hour."""
    store = open_store(**{**CFG, "delete_when": ALL_HOURS, "clean_resource_interval": 50,
                          "disk_space_warning_level_ratio": 100, "disk_space_clean_forcibly_ratio": 100})
    fill(store, 300)
    queue = store.commitlog.queue
    now = time.time() * 1000
    age(queue, queue.files[:5], now, hours=73)
    min_after = queue.files[5].file_from
    usage = disk_usage_ratio(queue.store_path)
    assert 0 < usage <= 1
    service = CleanService(store.ctl, queue, store.consume_queues, store.index, store.config, store.root,
                           initial_delay_ms=0)
    service.start()
    try:
        deadline = time.monotonic() + 60
        while (service.runs < 2 or store.ctl.get("min_phy") < min_after) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        service.shutdown()
    assert service.error is None and service.last_error is None
    assert store.ctl.get("min_phy") == min_after and starts(queue)[0] == min_after
    assert names_on_disk(queue.store_path)[0] == min_after
    assert store.get_min_offset_in_queue("T", 0) > 0
    assert service.last_report is not None and service.last_report.disk.commitlog_ratio > 0
    assert "DISK_FULL" not in store.ctl.running_flags()


def test_the_thread_wakes_for_a_manual_request_and_stops_promptly(open_store):
    store = open_store(**CFG)
    fill(store, 100)
    queue = store.commitlog.queue
    clock = Clock(local_ms(13))
    age(queue, queue.files[:2], clock.ms)
    service = CleanService(store.ctl, queue, store.consume_queues, store.index, store.config, store.root,
                           now_ms=clock, disk_usage=Disk(), initial_delay_ms=10**9)
    service.start()
    try:
        # the store's own cleaner waits on the same "clean" channel, and a notify wakes one
        # waiter (RocketMQ's wakeup): when that one takes it, the request is made again
        deadline = time.monotonic() + 60
        while service.runs == 0 and time.monotonic() < deadline:
            service.execute_delete_files_manually()
            time.sleep(0.2)
    finally:
        service.shutdown()
    assert service.runs >= 1 and service.last_report.manual
    assert starts(queue)[0] == 2 * FS


def test_disk_usage_ratio_of_real_paths(tmp_path):
    st = os.statvfs(tmp_path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    ratio = disk_usage_ratio(str(tmp_path))
    assert ratio == -(-used * 100 // entire) / 100 or abs(ratio - used / entire) <= 0.02
    assert disk_usage_ratio(str(tmp_path / "missing")) == -1.0
    total, _, _ = shutil.disk_usage(tmp_path)
    assert total > 0


@pytest.mark.skipif(not tmpfs_supported(), reason="needs a tmpfs in a private mount namespace (root + unshare)")
def test_a_really_full_disk(tmp_path):
    """A 2 MiB tmpfs filled by puts until statvfs says more than 90 %: the service (real
    statvfs, real clock) sets DISK_FULL, puts fail, files are deleted although young, and the
    next disk check clears the flag."""
    out = run_in_tmpfs(f"""
        from mqstore import Message, MessageStore
        from mqstore.services.clean import CleanService, disk_usage_ratio
        root = os.path.join(TMPFS, "store")
        store = MessageStore(root, mapped_file_size_commit_log=64 * 1024, max_message_size=4096,
                             message_index_enable=False, topic_queue_table_slots=64,
                             mapped_file_size_consume_queue=2000, delete_commit_log_files_interval=0,
                             delete_when="{(time.localtime().tm_hour + 12) % 24}")
        puts = 0
        while disk_usage_ratio(root) <= 0.90:
            store.put_message(Message("T", b"x" * 1500)).check()
            puts += 1
        store.wait_dispatched()
        store.flush()
        files_before = len(store.commitlog.queue)
        usage_before = disk_usage_ratio(root)
        service = CleanService(store.ctl, store.commitlog.queue, store.consume_queues, None, store.config,
                               store.root, initial_delay_ms=0)
        r = service.clean_once()
        flagged = "DISK_FULL" in store.ctl.running_flags()
        refused = store.put_message(Message("T", b"y")).status.name
        check = service.check_disk_space()
        after = store.put_message(Message("T", b"z")).status.name
        store.shutdown()
        emit(dict(puts=puts, files_before=files_before, usage_before=usage_before, deleted=r.commitlog_files_deleted,
                  disk_full=r.disk.disk_full, at_once=r.clean_at_once, time_up=r.time_up, flagged=flagged,
                  refused=refused, usage_after=check.commitlog_ratio, cleared=not check.disk_full, after=after,
                  files_after=len(os.listdir(os.path.join(root, "commitlog")))))
    """, tmp_path / "mnt", size="2m", timeout=120)
    assert out["usage_before"] > 0.90 and out["files_before"] > 10
    assert out["disk_full"] and out["flagged"] and out["at_once"] and not out["time_up"]
    assert out["refused"] == "SERVICE_NOT_AVAILABLE"
    assert out["deleted"] == 10 and out["files_after"] == out["files_before"] - 10
    assert out["usage_after"] < 0.90 and out["cleared"] and out["after"] == "PUT_OK"


def test_a_manual_request_from_an_attached_store_reaches_the_node_cleaner_process(tmp_path):
    """executeDeleteFilesManually in a node: the request goes through the control block to the
    cleaner process, which deletes the expired files now (whatever the hour)."""
    root = str(tmp_path / "s")
    cfg = {**CFG, "service_mode": "processes", "disk_space_warning_level_ratio": 100,
           "disk_space_clean_forcibly_ratio": 100}
    with MessageStore(root, **cfg) as node:
        fill(node, 300)
        queue = node.commitlog.queue
        assert len(queue) >= 12
        age(queue, queue.files[:4], time.time() * 1000, hours=73)
        min_after = queue.files[4].file_from
        with MessageStore.open(root) as attached:
            assert attached.attached
            attached.execute_delete_files_manually()
        deadline = time.monotonic() + 60
        while node.ctl.get("min_phy") < min_after and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.ctl.get("min_phy") == min_after
        assert names_on_disk(queue.store_path)[0] == min_after
        # the cleaner corrects the queues' min offsets after it deleted the CommitLog files (as
        # RocketMQ's CleanConsumeQueueService follows CleanCommitLogService): wait for that step too
        while node.get_min_offset_in_queue("T", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        low = node.get_min_offset_in_queue("T", 0)
        assert low > 0  # the owner follows the cleaner process: the files it deleted are gone here too
        assert node.get_message("g", "T", 0, 0, 32).status is S.OFFSET_TOO_SMALL
        r = node.get_message("g", "T", 0, low, 32)
        assert r.status is S.FOUND and next(iter(r)).queue_offset == low
    check_store(root).raise_if_failed()


def test_a_node_owners_look_ups_follow_new_units_new_files_and_deletions(tmp_path):
    """The owner of a node reads what its dispatcher, allocator and cleaner processes build and
    delete. Its look-ups call the follower only when what they need is missing (a unit past the
    last one followed, a CommitLog file not mapped yet) or min_phy moved: each of those cases
    still answers as a store that builds everything itself would."""
    root = str(tmp_path / "s")
    cfg = {**CFG, "service_mode": "processes", "disk_space_warning_level_ratio": 100,
           "disk_space_clean_forcibly_ratio": 100}

    def eventually(read: Callable[[], Any]) -> Any:  # the dispatcher process builds units a moment later
        deadline = time.monotonic() + 30
        while (got := read()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return got

    with MessageStore(root, **cfg) as node:
        first = node.put_message(Message("T", b"first")).check()
        view = eventually(lambda: node.look_message_by_queue_offset("T", 0, 0))
        assert view is not None and bytes(view.body) == b"first"
        files_before = len(node.commitlog.queue)
        results = fill(node, 300, queues=1, start=1)  # ~15 CommitLog files more, each mapped here later
        assert len(node.commitlog.queue) > files_before + 10
        last = results[-1]
        view = node.look_message_by_queue_offset("T", 0, last.queue_offset)
        assert view is not None and view.physical_offset == last.wrote_offset
        assert bytes(view.body) == b"body-0300-" + b"x" * 60
        assert node.look_message_by_queue_offset("T", 0, last.queue_offset + 1) is None
        assert node.look_message_by_offset(last.wrote_offset).queue_offset == last.queue_offset
        # the cleaner process deletes the oldest files: what they held is gone for the look-ups too
        queue = node.commitlog.queue
        age(queue, queue.files[:4], time.time() * 1000, hours=73)
        min_after = queue.files[4].file_from
        node.execute_delete_files_manually()
        deadline = time.monotonic() + 60
        while node.ctl.get("min_phy") < min_after and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.ctl.get("min_phy") == min_after
        assert node.look_message_by_queue_offset("T", 0, 0) is None
        assert node.look_message_by_offset(first.wrote_offset) is None
        view = node.look_message_by_queue_offset("T", 0, last.queue_offset)
        assert view is not None and view.physical_offset == last.wrote_offset
    check_store(root).raise_if_failed()
