"""Several CommitLogs (docs/parallel-commitlogs.md): the tests of the issue, T1 first."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from mqstore import _shm
from mqstore.config import StoreConfig
from mqstore.errors import NotAStoreError
from mqstore.log.commitlog import CommitLog

from golden_store import GOLDEN, golden_digest


@contextlib.contextmanager
def two_logs(root: Any, **config: Any) -> Iterator[tuple[_shm.ControlBlock, list[CommitLog], contextlib.ExitStack]]:
    """A control block with two CommitLogs at root (a fresh block each time: the positions
    start at each log's first offset, as an owner's do before it recovers) and log 0's and
    log 1's CommitLog. What a test adds to the ExitStack closes first, then the logs and the
    block."""
    cfg = StoreConfig(**{"store_host": "10.0.0.1:10911", **config})
    ctl = _shm.ControlBlock.create(os.path.join(root, "mqstore.shm"), table_slots=64,
                                   file_size=cfg.mapped_file_size_commit_log, lock_kind="spin", sync_flush=False,
                                   log_count=2)
    with contextlib.ExitStack() as closing:
        closing.callback(ctl.close)
        logs = [CommitLog(str(root), cfg, ctl, log=k) for k in (0, 1)]
        for cl in logs:
            closing.callback(cl.close)
        yield ctl, logs, closing


def test_one_commit_log_store_is_byte_identical_to_the_golden_digest(tmp_path):
    """T1: a store with one CommitLog is written byte for byte as the code wrote it before the
    CommitLog was split (the clock zeroed): every file of commitlog/, consumequeue/, index/,
    the clean-close record and the saved geometry, and every msgId."""
    want = json.loads(GOLDEN.read_text())
    got = golden_digest(str(tmp_path / "store"))
    assert got["messages"] == want["messages"]
    assert sorted(got["files"]) == sorted(want["files"]), "the store's files are not the same set"
    differ = [name for name in want["files"] if got["files"][name] != want["files"][name]]
    assert not differ, f"files whose bytes changed: {differ}"
    assert got["msg_ids"] == want["msg_ids"]


def test_a_store_fenced_for_several_logs_is_refused_and_left_as_it_was(tmp_path):
    """Item 7 / T2's refusal: the fence an N > 1 store writes into commitlog/ (a 20-digit name
    past 2^63 - 1) makes this code refuse to open the store, naming the file, before anything
    in it is changed (an owner that went on would recover commitlog/ alone and cut every
    ConsumeQueue unit of the other logs)."""
    import hashlib

    from mqstore import Message, MessageStore
    from mqstore.queue.snapshot import StoreSnapshot
    from mqstore.tools.checker import check_store

    root = tmp_path / "store"
    with MessageStore(str(root), mapped_file_size_commit_log=64 * 1024) as store:
        for i in range(50):
            store.put_message(Message("T", b"m%d" % i, queue_id=i % 2)).check()
    fence = root / "commitlog" / "99999999999999999999"
    fence.write_text("mqstore store with 2 commit logs (commit_log_count); open it with an mqstore that has "
                     "commit_log_count\n")
    os.utime(fence, (1, 1))

    def digest() -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
                for p in sorted(root.rglob("*")) if p.is_file()}

    before = digest()
    with pytest.raises(NotAStoreError, match="99999999999999999999: the store has several CommitLogs"):
        MessageStore(str(root))
    with pytest.raises(NotAStoreError, match="several CommitLogs"):
        StoreSnapshot(str(root))  # what the Spark source and the read-only tools open
    report = check_store(str(root))
    assert not report.ok and "several CommitLogs" in report.problems[0].message
    assert digest() == before


def test_a_second_commit_log_is_written_in_its_own_directory_offsets_and_cells(tmp_path):
    """Log 1 of a store with two CommitLogs, on its own: files named from 2^56 in steps of a
    file size that does not divide 2^56, records whose PHYSICALOFFSET is the encoded offset
    their put answered, its own positions, flush and statistics; log 0 untouched by it; a
    reload finds the same contiguous files."""
    from mqstore import Message
    from mqstore._codec import decode_record
    from mqstore.layout import commit_log_k_dir, file_start_of, local_of, log_base, log_of
    from mqstore.log.mapped_file_queue import MappedFileQueue

    size = 12 * 1024
    assert (1 << 56) % size
    root = str(tmp_path)
    with two_logs(tmp_path, mapped_file_size_commit_log=size) as (ctl, logs, _):
        puts: list[tuple[int, int, bytes, int]] = []
        for i in range(300):
            k = i % 3 % 2  # two of every three to log 0
            body = b"%d-" % i + b"x" * (i * 37 % 900)
            r = logs[k].appender.put_message(Message("T", body, queue_id=k)).check()
            assert log_of(r.wrote_offset) == k and r.msg_id.endswith("%016X" % r.wrote_offset)
            puts.append((k, r.wrote_offset, body, r.queue_offset))
        for k in (0, 1):
            mine = [p for p in puts if p[0] == k]
            assert [p[3] for p in mine] == list(range(len(mine))), "queue offsets of the log's queue"
            assert ctl.get("wrote", log=k) > mine[-1][1] >= log_base(k)
            assert ctl.log_stats(k)["puts"] == len(mine)
            assert ctl.log_stats(k)["bytes"] == sum(
                decode_record(logs[k].queue.find_mapped_file_by_offset(p[1]).read(
                    p[1] - file_start_of(p[1], size), size - (p[1] - file_start_of(p[1], size)))).total_size
                for p in mine)
        names = sorted(os.listdir(commit_log_k_dir(root, 1)))
        assert names == [f"{log_base(1) + j * size:020d}" for j in range(len(names))] and len(names) > 3
        for k, phy, body, qoff in puts:
            mf = logs[k].queue.find_mapped_file_by_offset(phy)
            rec = decode_record(mf.read(phy - mf.file_from, size - (phy - mf.file_from)))
            assert (rec.physical_offset, bytes(rec.body), rec.queue_offset, rec.queue_id) == (phy, body, qoff, k)
        wrote0 = ctl.get("wrote")
        assert logs[1].flush(0) and ctl.get("flushed", log=1) == ctl.get("wrote", log=1)
        assert ctl.get("flushed") == 0 and ctl.get("wrote") == wrote0, "log 0 is not log 1's business"
        again = MappedFileQueue(commit_log_k_dir(root, 1), size, base=log_base(1))
        again.load()
        assert [mf.file_name for mf in again.files] == names
        assert again.find_mapped_file_by_offset(ctl.get("wrote", log=1) - 1).file_from == file_start_of(
            ctl.get("wrote", log=1) - 1, size)
        assert local_of(again.mapped_end) == len(names) * size
        again.close()
        misplaced = MappedFileQueue(commit_log_k_dir(root, 1), size)  # read as if it were log 0's
        with pytest.raises(NotAStoreError, match="not all of CommitLog 0"):
            misplaced.load()
        misplaced.close()


def test_two_logs_dispatched_apart_and_read_by_queue_and_by_offset(tmp_path):
    """Each log's dispatcher builds the ConsumeQueues of its own queues from its own cursor;
    the read kernel reads a queue's messages in the log its ConsumeQueue names and a record
    by offset in the log the offset names; an offset of a log the store does not have is
    not found."""
    from mqstore import Message
    from mqstore._reads import ReadKernel
    from mqstore.layout import log_base, log_of
    from mqstore.queue.consume_queue import ConsumeQueueTable
    from mqstore.queue.dispatch import Dispatcher
    from mqstore.status import GetMessageStatus

    with two_logs(tmp_path, mapped_file_size_commit_log=12 * 1024) as (ctl, logs, closing):
        queues = ConsumeQueueTable(str(tmp_path / "consumequeue"), 20 * 64, log_count=2)
        closing.callback(queues.close)
        dispatchers = [Dispatcher(cl, queues, None, ctl) for cl in logs]
        for d in dispatchers:
            closing.callback(d.close)
        bound = {q: _shm.log_of_queue("T", q, 2) for q in range(4)}
        assert sorted(bound.values()) == [0, 0, 1, 1]
        sent: dict[int, list[tuple[bytes, int]]] = {q: [] for q in range(4)}
        for i in range(400):
            q = i % 4
            body = b"%d:" % i + b"y" * (i * 53 % 700)
            r = logs[bound[q]].appender.put_message(Message("T", body, queue_id=q, tags="t%d" % (i % 3))).check()
            sent[q].append((body, r.wrote_offset))
        assert dispatchers[1].dispatch_available() == 200
        assert ctl.get("dispatched", log=1) == ctl.get("wrote", log=1) and ctl.get("dispatched") == 0
        assert dispatchers[0].dispatch_available() == 200
        assert ctl.get("dispatched") == ctl.get("wrote")
        reader = ReadKernel(queues.by_key, [cl.queue for cl in logs], ctl)
        for q in range(4):
            cq = queues.get("T", q)
            assert cq.log_id == bound[q] and cq.max_offset_in_queue == 100
            got = []
            offset = 0
            while offset < 100:
                res = reader.get_message("g", "T", q, offset, 32, capped=False)
                assert res.status == GetMessageStatus.FOUND
                got.extend((bytes(m.body), m.physical_offset) for m in res)
                offset = res.next_begin_offset
            assert got == sent[q]
            assert all(log_of(phy) == bound[q] for _, phy in got)
            body, phy = sent[q][57]
            assert bytes(reader.look_message_by_offset(phy).body) == body
            assert bytes(reader.look_message_by_queue_offset("T", q, 57).body) == body
            assert reader.get_message_store_timestamp("T", q, 57) > 0
        assert reader.look_message_by_offset(log_base(2)) is None, "a log the store does not have"
        assert reader.look_message_by_offset(ctl.get("wrote", log=1)) is None, "past log 1's end"
        tagged = reader.get_message("g", "T", 3, 0, 32, tags="t1", capped=False)
        # one get reads one ConsumeQueue file (64 units here), as RocketMQ's getIndexBuffer does
        assert tagged.next_begin_offset == 64
        assert [bytes(m.body) for m in tagged] == [b for b, _ in sent[3][:64] if int(b.split(b":")[0]) % 3 == 1]


def test_a_log_that_lost_its_tail_is_recovered_alone(tmp_path):
    """T6 for the parts: log 1 loses its tail (the file holding a record zeroed from it on,
    the files after it gone) while log 0 is whole. Recovering each log cuts log 1 at that
    record, drops the units of log 1's queues that pointed past it, and leaves log 0's
    queues, units and table entries as they were."""
    from mqstore import Message
    from mqstore.layout import file_start_of, log_base
    from mqstore.queue.consume_queue import ConsumeQueueTable
    from mqstore.queue.dispatch import Dispatcher
    from mqstore.queue.recovery import recover_store

    size = 12 * 1024
    cq_root = str(tmp_path / "consumequeue")
    bound = {q: _shm.log_of_queue("T", q, 2) for q in range(4)}
    sent: dict[int, list[int]] = {q: [] for q in range(4)}
    with two_logs(tmp_path, mapped_file_size_commit_log=size) as (ctl, logs, closing):
        queues = ConsumeQueueTable(cq_root, 20 * 64, log_count=2)
        closing.callback(queues.close)
        for i in range(400):
            q = i % 4
            body = b"%d" % i + b"z" * (i * 31 % 500)
            sent[q].append(logs[bound[q]].appender.put_message(Message("T", body, queue_id=q)).check().wrote_offset)
        for cl in logs:
            assert Dispatcher(cl, queues, None, ctl).dispatch_available() == 200
            cl.flush(0)
        queues.flush()
        ends = [ctl.get("wrote", log=k) for k in (0, 1)]

    lost_queue = next(q for q in range(4) if bound[q] == 1)
    cut = sent[lost_queue][60]
    cut_file = file_start_of(cut, size)
    log1_dir = tmp_path / "commitlog-1"
    with open(log1_dir / f"{cut_file:020d}", "r+b") as fh:
        fh.seek(cut - cut_file)
        fh.write(bytes(size - (cut - cut_file)))
    for name in os.listdir(log1_dir):
        if int(name) > cut_file:
            os.unlink(log1_dir / name)

    with two_logs(tmp_path, mapped_file_size_commit_log=size) as (ctl, logs, closing):
        queues = ConsumeQueueTable(cq_root, 20 * 64, log_count=2)
        closing.callback(queues.close)
        for cl in logs:
            cl.queue.load()
        queues.load()
        reports = [recover_store(logs[k].queue, ctl, queues, None, check_crc=True, clean_shutdown=False, log_id=k)
                   for k in (0, 1)]
        assert reports[0].valid_end == ends[0] and reports[1].valid_end == cut > log_base(1)
        assert ctl.get("wrote") == ends[0] and ctl.get("wrote", log=1) == cut
        for q in range(4):
            kept = sum(1 for phy in sent[q] if bound[q] == 0 or phy < cut)
            assert queues.get("T", q).max_offset_in_queue == kept, q
            assert ctl.table_get("T", q) == kept, q
        assert reports[0].queue_units_dropped == {} and reports[0].queues == 2
        assert sum(reports[1].queue_units_dropped.values()) == sum(
            1 for q in range(4) if bound[q] == 1 for phy in sent[q] if phy >= cut)


def test_each_log_has_its_own_flush_service_woken_by_its_puts(tmp_path):
    """A flush service per CommitLog waits on its log's FLUSH channel: a put into log 1 wakes
    log 1's service (a 10 min period, so only the wake-up can make it flush within the minute
    waited), which flushes log 1 to its end and leaves log 0's flushed position alone."""
    from mqstore import Message
    from mqstore.services.flush import FlushRealTimeService

    with two_logs(tmp_path, mapped_file_size_commit_log=64 * 1024, flush_interval_commit_log=600_000,
                  flush_commit_log_thorough_interval=600_000, flush_commit_log_least_pages=0,
                  flush_commit_log_timed=False) as (ctl, logs, closing):
        services = [FlushRealTimeService(cl) for cl in logs]
        assert [s.name for s in services] == ["flush-commitlog", "flush-commitlog-1"]
        for s in services:
            s.start()
            closing.callback(s.shutdown)
        logs[0].appender.put_message(Message("A", b"zero", queue_id=0)).check()
        assert ctl.wait_position("flushed", ctl.get("wrote"), "flushed", 60_000)
        flushed0 = ctl.get("flushed")
        for i in range(20):
            logs[1].appender.put_message(Message("B", b"one-%d" % i, queue_id=1)).check()
        end = ctl.get("wrote", log=1)
        assert ctl.wait_position("flushed", end, "flushed", 60_000, log=1), "log 1's service flushed its log"
        assert ctl.get("flushed") == flushed0


def test_each_log_keeps_its_own_index_and_checkpoint(tmp_path):
    """Log k's dispatcher writes log k's IndexFiles (ROOT/index-k), whose entries hold that
    log's encoded offsets: a key finds its message through the index of the log it was put
    to, and nothing through the other's; each log's checkpoint is its own file."""
    import time

    from mqstore import Message
    from mqstore.layout import checkpoint_path, index_dir, log_of
    from mqstore.log.checkpoint import StoreCheckpoint
    from mqstore.queue.consume_queue import ConsumeQueueTable
    from mqstore.queue.dispatch import Dispatcher
    from mqstore.queue.index import IndexService

    root = str(tmp_path)
    with two_logs(tmp_path, mapped_file_size_commit_log=64 * 1024, max_hash_slot_num=256,
                  max_index_num=1024) as (ctl, logs, closing):
        checkpoints = [StoreCheckpoint(checkpoint_path(root, k)) for k in (0, 1)]
        indexes = [IndexService(root, logs[k].config, checkpoints[k], log=k) for k in (0, 1)]
        queues = ConsumeQueueTable(str(tmp_path / "consumequeue"), 20 * 256, log_count=2)
        for closeable in (*checkpoints, *indexes, queues):
            closing.callback(closeable.close)
        for ix in indexes:
            ix.load(True)
        dispatchers = [Dispatcher(logs[k], queues, indexes[k], ctl) for k in (0, 1)]
        bound = {q: _shm.log_of_queue("T", q, 2) for q in range(4)}
        where: dict[str, int] = {}
        for i in range(200):
            q = i % 4
            r = logs[bound[q]].appender.put_message(Message("T", b"b%d" % i, queue_id=q, keys=["key-%d" % i])).check()
            where["key-%d" % i] = r.wrote_offset
        for d in dispatchers:
            d.dispatch_available()
        now = int(time.time() * 1000)
        for key, phy in where.items():
            k = log_of(phy)
            assert indexes[k].query_offset("T", key, 10, 0, now + 60_000).phy_offsets == [phy]
            assert phy not in indexes[1 - k].query_offset("T", key, 10, 0, now + 60_000).phy_offsets
        assert os.listdir(index_dir(root, 1)) and os.listdir(index_dir(root, 0))
        assert all(f.begin_phy_offset >= 1 << 56 for f in indexes[1].files)
        assert checkpoint_path(root, 1).endswith("checkpoint-1") and index_dir(root, 1).endswith("index-1")
