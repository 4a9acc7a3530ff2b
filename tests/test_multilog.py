"""Several CommitLogs (docs/parallel-commitlogs.md): the tests of the issue, T1 first."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from mqstore.log import _shm
from mqstore.config import StoreConfig
from mqstore.errors import NotAStoreError
from mqstore.log.commitlog import CommitLog
from mqstore.tools.checker import check_store
from mqstore.tools.inspection import plan_recovery

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
    from mqstore.log._codec import decode_record
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
    from mqstore.queue._reads import ReadKernel
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


# -- a store with several CommitLogs (commit_log_count) ------------------------------------------
def _several(root: Any, n: int = 2, **config: Any) -> Any:
    from mqstore import MessageStore

    return MessageStore(str(root), commit_log_count=n, mapped_file_size_commit_log=64 * 1024, **config)


@pytest.mark.parametrize("settings, says", [
    ({"commit_log_count": 0}, "commit_log_count"),
    ({"commit_log_count": 33}, "commit_log_count"),
    ({"commit_log_count": 2, "store_path_commit_logs": "a;b;c"}, "names 3 path(s) for commit_log_count=2"),
    ({"commit_log_count": 2, "store_path_commit_logs": "a;a"}, "named twice"),
])
def test_t2_settings_a_store_with_several_logs_cannot_have_are_refused_naming_them(tmp_path, settings, says):
    from mqstore import MessageStore
    from mqstore.errors import ConfigError

    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        MessageStore(str(tmp_path / "s"), **settings)
    assert not (tmp_path / "s" / "commitlog").exists(), "a refused configuration wrote nothing"


def test_t2_the_count_is_fixed_at_creation_and_fenced(tmp_path):
    """commit_log_count is saved with the store and kept when a reopen leaves it out; another
    value is refused either way round; an N > 1 store's commitlog/ holds the fence naming N; a
    store with one CommitLog and data (with or without mqstore.config.json, as RocketMQ
    leaves it) is not turned into one with two."""
    from mqstore import Message, MessageStore
    from mqstore.errors import ConfigError
    from mqstore.layout import FENCE_NAME, fence_log_count

    root = tmp_path / "two"
    with _several(root) as store:
        store.put_message(Message("T", b"x")).check()
    assert json.loads((root / "mqstore.config.json").read_text())["commit_log_count"] == 2
    assert (root / "commitlog" / FENCE_NAME).read_text().startswith("mqstore store with 2 commit logs")
    assert fence_log_count(str(root / "commitlog")) == 2
    with MessageStore(str(root)) as store:  # left out: the store's own count
        assert store.config.commit_log_count == 2 and len(store.logs()) == 2
    with pytest.raises(ConfigError, match="commit_log_count=3, but the store was created with commit_log_count=2"):
        MessageStore(str(root), commit_log_count=3)
    (root / "mqstore.config.json").unlink()  # the fence still tells the count
    with MessageStore(str(root)) as store:
        assert store.config.commit_log_count == 2
        assert store.read_messages("T", 0, 0).bodies() == [b"x"]

    one = tmp_path / "one"
    with MessageStore(str(one), mapped_file_size_commit_log=64 * 1024) as store:
        store.put_message(Message("T", b"x")).check()
    with pytest.raises(ConfigError, match="commit_log_count=2, but the store was created with commit_log_count=1"):
        MessageStore(str(one), commit_log_count=2)
    (one / "mqstore.config.json").unlink()
    with pytest.raises(ConfigError, match="created with commit_log_count=1 \\(the files on disk\\)"):
        MessageStore(str(one), commit_log_count=2)
    assert not (one / "commitlog" / FENCE_NAME).exists()


def _queue_log(topic: str, queue_id: int, n: int) -> int:
    from mqstore.twin.logs import log_of_queue

    return log_of_queue(topic, queue_id, n)


@pytest.mark.parametrize("n", [2, 3])
def test_t3_writers_over_several_logs_keep_each_queue_in_order_and_in_its_log(tmp_path, n):
    """Four writer threads put into 12 queues of two topics of a store with n CommitLogs
    (64 KiB files, so every log rolls): each queue reads back exactly what was put, in order,
    at contiguous queue offsets, every unit in the queue's own log; every log got puts; after a
    clean reopen the same, and puts go on at the next queue offsets."""
    import threading

    from mqstore import Message, MessageStore

    queues = [(topic, q) for topic in ("TopicA", "TopicB") for q in range(6)]
    per_writer = 600
    sent: dict[tuple[str, int], list[bytes]] = {key: [] for key in queues}
    lock = threading.Lock()
    errors: list[Any] = []

    def writer(store: Any, w: int) -> None:
        for i in range(per_writer):
            topic, q = queues[(w * 7 + i) % len(queues)]
            body = b"w%d-%d-" % (w, i) + b"p" * (i % 700)
            with lock:  # the order a queue's puts are made in is the order they must read back
                r = store.put_message(Message(topic, body, queue_id=q))
                if not r.ok:
                    errors.append(r)
                sent[(topic, q)].append(body)

    def check(store: Any) -> None:
        assert store.wait_dispatched(timeout_ms=30_000)
        for (topic, q), bodies in sent.items():
            got = store.read_messages(topic, q, 0, 10_000)
            assert got.bodies() == bodies, f"{topic}/{q}"
            assert {p >> 56 for p in got.physical_offsets} <= {_queue_log(topic, q, n)}
            assert store.get_max_offset_in_queue(topic, q) == len(bodies)

    root = tmp_path / "s"
    with _several(root, n) as store:
        threads = [threading.Thread(target=writer, args=(store, w)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        check(store)
        logs = store.logs()
        assert [k for k, _, _ in logs] == list(range(n))
        assert all(hi > lo for _, lo, hi in logs), f"a log got no puts: {logs}"
        assert all(len(os.listdir(cl.queue.store_path)) > 2 for cl in store.commitlogs), "every log rolled"
    report = check_store(str(root)).raise_if_failed()
    assert sorted(report.log_ends) == list(range(n)) and report.records == 4 * per_writer
    with MessageStore(str(root)) as store:
        assert store.last_exit_ok
        check(store)
        topic, q = queues[0]
        r = store.put_message(Message(topic, b"next", queue_id=q))
        assert r.ok and r.queue_offset == len(sent[(topic, q)])
    check_store(str(root)).raise_if_failed()


def test_t3_delays_batches_bodies_keys_and_times_route_by_the_stored_queue(tmp_path):
    """A delayed message is stored in SCHEDULE_TOPIC_XXXX's queue level - 1 and so in that
    queue's log; batches and put_bodies go to their queue's log; query_message finds keys in
    every log's index; the earliest message time is the earliest over the logs; a look-up by
    the physical offset of either log finds its message."""
    from mqstore import Message

    n = 4
    with _several(tmp_path / "s", n) as store:
        delayed = store.put_message(Message("TopicD", b"later", queue_id=1, properties={"DELAY": "3"}))
        assert delayed.ok and delayed.wrote_offset >> 56 == _queue_log("SCHEDULE_TOPIC_XXXX", 2, n)
        keyed = {}
        for q in range(8):
            r = store.put_message(Message("TopicK", b"k%d" % q, queue_id=q, keys=f"key{q} shared"))
            assert r.ok and r.wrote_offset >> 56 == _queue_log("TopicK", q, n)
            keyed[q] = r.wrote_offset
        batch = store.put_messages([Message("TopicB", b"b%d" % i, queue_id=5) for i in range(3)])
        assert batch.ok and batch.wrote_offset >> 56 == _queue_log("TopicB", 5, n)
        bodies = store.put_bodies("TopicC", [b"c0", b"c1"], queue_id=7)
        assert bodies.ok and bodies.wrote_offset >> 56 == _queue_log("TopicC", 7, n)
        assert len({p >> 56 for p in keyed.values()}) > 1, "the keyed puts went to one log only"
        assert store.wait_dispatched(timeout_ms=10_000)
        assert store.read_messages("SCHEDULE_TOPIC_XXXX", 2, 0).bodies() == [b"later"]
        assert store.read_messages("TopicB", 5, 0).bodies() == [b"b0", b"b1", b"b2"]
        assert store.read_messages("TopicC", 7, 0).bodies() == [b"c0", b"c1"]
        found = store.query_message("TopicK", "shared", max_num=64)
        assert sorted(bytes(v.body) for v in found.messages) == [b"k%d" % q for q in range(8)]
        assert [bytes(v.body) for v in store.query_message("TopicK", "key5").messages] == [b"k5"]
        for q, phy in keyed.items():
            view = store.look_message_by_offset(phy)
            assert view is not None and bytes(view.body) == b"k%d" % q
        first = min(store.look_message_by_offset(lo).store_timestamp for _, lo, hi in store.logs() if hi > lo)
        assert store.get_earliest_message_time() == first
        assert store.get_min_phy_offset(1) == 1 << 56 and store.get_max_phy_offset(1) >= 1 << 56
        with pytest.raises(ValueError, match="CommitLog id 0 .. 3"):
            store.get_max_phy_offset(4)


def run_killed_writer(code: str, root: str, start: int, rng: Any, acked: dict[int, tuple[int, int, int]],
                      env: dict[str, str] | None = None) -> None:
    """Run a writer (``code``: prints READY, then "seq queue queue_offset phy" per acknowledged
    put) and SIGKILL it at a random moment; what it acknowledged goes into acked."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", code, root, str(start)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.2, 1.2))
    finally:
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4:  # the last line may be cut by the kill
            i, q, qoff, phy = map(int, fields)
            acked[i] = (q, qoff, phy)
    assert acked, "the writer acknowledged nothing"


_KILLED_WRITER = """
import sys
from mqstore import MessageStore, Message
root, i = sys.argv[1], int(sys.argv[2])
store = MessageStore(root, commit_log_count=2, mapped_file_size_commit_log=65536, flush_disk_type="SYNC_FLUSH")
out = sys.stdout
out.write("READY\\n"); out.flush()
while True:
    q = i % 6
    r = store.put_message(Message("K", b"%d-" % i + b"p" * (i % 500), queue_id=q))
    if r.ok:
        out.write(f"{i} {q} {r.queue_offset} {r.wrote_offset}\\n"); out.flush()
    i += 1
"""


@pytest.mark.multiprocess
def test_t4_a_writer_of_two_logs_killed_at_random_moments_loses_no_acknowledged_message(tmp_path):
    """A process owning a store with two CommitLogs (SYNC_FLUSH) is SIGKILLed at random moments,
    three times: each reopen recovers both logs after the crash; every acknowledged message
    reads back at its queue offset and physical offset, in its queue's log; each queue's
    offsets run from 0 without a gap or a repeat, and the next writer goes on after them."""
    import random

    from mqstore import MessageStore

    root = str(tmp_path / "s")
    rng = random.Random(os.getpid())
    acked: dict[int, tuple[int, int, int]] = {}
    start = 0
    for _ in range(3):
        run_killed_writer(_KILLED_WRITER, root, start, rng, acked)
        check_store(root, allow_torn_tail=True).raise_if_failed()  # as the kill left it
        plan = plan_recovery(root)  # mqstore recover: what the open below does, found read-only
        with MessageStore(root) as store:
            assert not store.last_exit_ok and store.config.commit_log_count == 2
            assert [p.report.valid_end for p in plan.logs] == [r.valid_end for r in store.recoveries]
            assert [p.report.records for p in plan.logs] == [r.records for r in store.recoveries]
            assert store.wait_dispatched(timeout_ms=30_000)
            for q in range(6):
                got = store.read_messages("K", q, 0, 100_000)
                ids = [int(bytes(b).split(b"-")[0]) for b in got.bodies()]
                assert ids == sorted(set(ids)), f"queue {q}: a message repeats or is out of order"
                assert {p >> 56 for p in got.physical_offsets} <= {_queue_log("K", q, 2)}
                assert store.get_max_offset_in_queue("K", q) == len(ids)
                mine = {i: (qoff, phy) for i, (qq, qoff, phy) in acked.items() if qq == q}
                for i, (qoff, phy) in mine.items():
                    assert qoff < len(ids) and ids[qoff] == i, f"acknowledged message {i} is not at {q}/{qoff}"
                    assert got.physical_offsets[qoff] == phy
            start = max(acked) + 1_000_000  # ids the next writer uses cannot be confused with these
        check_store(root).raise_if_failed()


def test_t5_retention_cleans_each_log_and_cuts_its_queues_against_its_own_min_offset(tmp_path):
    """Expired files of both CommitLogs go (oldest first, the last of each log kept); each log's
    min offset is published in its own cell; a queue's ConsumeQueue files are cut against the
    min offset of its own log (the other log's queues keep theirs); reads from each queue's new
    min offset still return its messages."""
    import time

    from mqstore import Message

    with _several(tmp_path / "s", 2, mapped_file_size_consume_queue=20 * 64) as store:
        for i in range(1200):
            store.put_message(Message("R", b"%05d" % i + b"x" * 300, queue_id=i % 2)).check()
        assert store.flush() and store.wait_dispatched(timeout_ms=10_000)
        before = store.logs()
        week_ago = time.time() - 7 * 24 * 3600
        for cl in store.commitlogs:
            for mf in cl.queue.files[:-1]:
                os.utime(mf.path, (week_ago, week_ago))
        store.execute_delete_files_manually()  # the cleaner thread runs at once
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            after = store.logs()
            if all(lo1 > lo0 for (_, lo0, _), (_, lo1, _) in zip(before, after)) and \
                    all(store.get_min_offset_in_queue("R", q) > 0 for q in (0, 1)):
                break
            time.sleep(0.05)
        for (k, lo0, hi0), (_, lo1, hi1) in zip(before, after):
            assert lo1 > lo0 and hi1 == hi0, f"log {k} was not cleaned: {before} -> {after}"
            assert store.ctl.get("min_phy", log=k) == lo1
        for q in (0, 1):
            k = _queue_log("R", q, 2)
            low = store.get_min_offset_in_queue("R", q)
            assert low > 0
            got = store.read_messages("R", q, low, 10_000)
            assert got.physical_offsets[0] >= after[k][1]
            ids = [int(bytes(b)[:5]) for b in got.bodies()]  # (a read ends at a ConsumeQueue file's end)
            assert ids and ids == list(range(2 * low + q, 1200, 2))[:len(ids)]


_ATTACHED_WRITER = """
import sys
from mqstore import MessageStore, Message
root, w, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = MessageStore.open(root)
assert store.attached
for i in range(n):
    q = w * 4 + i % 4
    body = b"w%d-%d-" % (w, i) + b"p" * (i % 3000)
    r = store.put_message(Message("P", body, queue_id=q))
    assert r.ok, r
    print(q, r.queue_offset, r.wrote_offset, flush=True)
store.close()
"""


@pytest.mark.multiprocess
def test_t3_writer_processes_over_two_logs_of_a_node(tmp_path):
    """A node (service processes) owning a store with two CommitLogs and two writer processes
    attached to it, each putting into four queues of its own: every queue reads back exactly,
    in order, in its own log, from the owner and from the files after a clean stop; each
    log's allocator, flusher and dispatcher (in their processes) served its log."""
    import subprocess
    import sys

    from mqstore import MessageStore

    root = str(tmp_path / "s")
    n = 1500
    with _several(root, 2, service_mode="processes") as store:
        procs = [subprocess.Popen([sys.executable, "-c", _ATTACHED_WRITER, root, str(w), str(n)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(2)]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            outs.append(out)
        acks = [tuple(map(int, line.split())) for out in outs for line in out.splitlines()]
        assert len(acks) == 2 * n
        assert store.wait_dispatched(timeout_ms=30_000)

        def check(s: Any) -> None:
            for w in range(2):
                for j in range(4):
                    q = w * 4 + j
                    got = s.read_messages("P", q, 0, 10_000)
                    want = [b"w%d-%d-" % (w, i) + b"p" * (i % 3000) for i in range(j, n, 4)]
                    assert [bytes(b) for b in got.bodies()] == want, f"queue {q}"
                    assert {p >> 56 for p in got.physical_offsets} == {_queue_log("P", q, 2)}
                    mine = sorted((qoff, phy) for qq, qoff, phy in acks if qq == q)
                    assert mine == list(enumerate(got.physical_offsets))

        check(store)
        assert all(hi - lo > 64 * 1024 for _, lo, hi in store.logs()), "both logs rolled"
        assert store.stats()["alloc_count"] >= 4
        check_store(root, quiescent=False).raise_if_failed()  # while the node runs
    check_store(root).raise_if_failed()
    with MessageStore(root) as store:
        assert store.last_exit_ok
        check(store)


def test_t6_the_checker_finds_damage_in_any_log_and_a_unit_pointing_into_the_wrong_log(tmp_path):
    """The store-wide checker reads a store with several CommitLogs: a clean one passes; a byte
    flipped in a record of log 1 is reported in that log's files; a ConsumeQueue unit of a
    queue bound to log 1 made to point into log 0 is reported (no record of its queue there)."""
    import struct

    from mqstore import Message, MessageStore

    root = tmp_path / "s"
    with _several(root, 2) as store:
        for i in range(400):
            store.put_message(Message("X", b"%04d" % i + b"y" * 100, queue_id=i % 4, keys=f"k{i}")).check()
    check_store(str(root)).raise_if_failed()
    q1 = next(q for q in range(4) if _queue_log("X", q, 2) == 1)
    q0 = next(q for q in range(4) if _queue_log("X", q, 2) == 0)
    cq = root / "consumequeue" / "X" / str(q1) / ("%020d" % 0)
    original = cq.read_bytes()
    with MessageStore(str(root)) as store:
        phy0 = store.read_messages("X", q0, 0, 1).physical_offsets[0]
    cq.write_bytes(struct.pack(">q", phy0) + original[8:])
    report = check_store(str(root))
    assert not report.ok and any(f"consumequeue/X/{q1}" in p.where for p in report.problems), report.problems
    cq.write_bytes(original)
    check_store(str(root)).raise_if_failed()

    log1 = root / "commitlog-1"
    first = sorted(p for p in log1.iterdir())[0]
    data = bytearray(first.read_bytes())
    data[300] ^= 0xFF  # inside the body of an early record
    first.write_bytes(bytes(data))
    report = check_store(str(root))
    assert not report.ok and any(first.name in p.where or "commitlog" in p.where for p in report.problems), \
        report.problems


def test_t7_a_clean_close_record_per_log_stands_for_each_logs_scan(tmp_path):
    """A clean stop of a store with several CommitLogs writes the version 2 record (each log's
    end and tail CRC, one table); the next open takes every log's end and queue offsets from it
    without a scan. A log whose tail changed after the stop is scanned alone; the record is
    removed at open; an open after a crash never uses it."""
    from mqstore import Message, MessageStore

    root = tmp_path / "s"
    with _several(root, 2) as store:
        for i in range(300):
            store.put_message(Message("C", b"%03d" % i, queue_id=i % 4)).check()
        ends = store.logs()
    record = json.loads((root / "mqstore.clean.json").read_text())
    assert record["version"] == 2 and [e["log"] for e in record["logs"]] == [0, 1]
    assert [e["wrote"] for e in record["logs"]] == [hi for _, _, hi in ends]
    assert sorted((t, q) for t, q, _ in record["table"]) == [("C", q) for q in range(4)]
    with MessageStore(str(root)) as store:
        assert [r.mode for r in store.recoveries] == ["normal, from the clean-close record"] * 2
        assert not (root / "mqstore.clean.json").exists()
        assert store.logs() == ends
        for q in range(4):
            assert store.next_queue_offset("C", q) == 75
    # log 1's last record changed after the stop: log 1 is scanned, log 0 trusts the record
    from mqstore.layout import file_start_of

    start = file_start_of(ends[1][2] - 1, 64 * 1024)
    last = root / "commitlog-1" / f"{start:020d}"
    data = bytearray(last.read_bytes())
    data[ends[1][2] - start - 1] ^= 0x01
    last.write_bytes(bytes(data))
    with MessageStore(str(root)) as store:
        modes = [r.mode for r in store.recoveries]
        assert modes[0] == "normal, from the clean-close record" and modes[1] == "normal", modes
        assert "changed" in store.recoveries[1].clean_close_problem


@pytest.mark.multiprocess
def test_t8_a_broker_serves_a_store_with_two_logs_sends_pulls_ids_and_keys(tmp_path):
    """A broker (its front processes attached to the owner) over a store with two CommitLogs:
    sends to four queues land in both logs; pulls give each queue back in order; an offset
    msgId of either log is viewed by VIEW_MESSAGE_BY_ID; QUERY_MESSAGE finds a key in both
    logs' indexes."""
    import asyncio

    from helpers_broker import running_broker
    from mqstore.remoting._remoting import RemotingCommand
    from mqstore.client import MessageQueue, Producer, PullConsumer, PullStatus, RemotingConnection, decode_messages
    from mqstore.protocol import RequestCode, ResponseCode

    topic = next(t for t in (f"Multi{i}" for i in range(100)) if len({_queue_log(t, q, 2) for q in range(4)}) == 2)

    async def main() -> None:
        with running_broker(str(tmp_path / "store"), commit_log_count=2) as broker:
            async with Producer("PID_multi", broker.namesrv_address) as producer:
                sent = [await producer.send(topic, b"b%02d" % i, keys=[f"key{i}", "both"], queue_id=i % 4)
                        for i in range(40)]
            logs = {int(r.offset_msg_id[16:], 16) >> 56 for r in sent}
            assert logs == {0, 1}
            async with PullConsumer("CG_multi", broker.namesrv_address) as consumer:
                for q in range(4):
                    got: list[Any] = []
                    offset = 0
                    for _ in range(100):
                        result = await consumer.pull(MessageQueue(topic, "broker-a", q), offset, suspend_ms=200)
                        assert result.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG), result
                        got += result.messages
                        offset = result.next_begin_offset
                        if len(got) >= 10:
                            break
                    assert [m.body for m in got] == [b"b%02d" % i for i in range(q, 40, 4)]
                    assert [m.offset_msg_id for m in got] == [r.offset_msg_id for r in sent[q::4]]
            conn = await RemotingConnection.open(broker.address)
            try:
                for r in (sent[0], sent[1], sent[2], sent[3]):
                    phy = int(r.offset_msg_id[16:], 16)
                    answer = await conn.request(RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID,
                                                                ext_fields={"offset": str(phy)}), 5.0)
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
                    [view] = decode_messages(answer.body)
                    assert view.msg_id == r.msg_id
                for _ in range(100):
                    answer = await conn.request(RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields={
                        "topic": topic, "key": "both", "maxNum": "64", "beginTimestamp": "0",
                        "endTimestamp": str(2**63 - 1)}), 5.0)
                    if answer.code == ResponseCode.SUCCESS and len(decode_messages(answer.body)) == 40:
                        break
                    await asyncio.sleep(0.05)
                assert sorted(m.body for m in decode_messages(answer.body)) == [b"b%02d" % i for i in range(40)]
            finally:
                conn.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_t9_stats_show_each_log(tmp_path):
    """mqstore stats of a store with several CommitLogs shows each log's state, puts, bytes and
    positions (its figures' ``logs``); a store with one shows none."""
    from mqstore import Message, MessageStore
    from mqstore.tools.stats import StatsReader, figures, format_lines

    with _several(tmp_path / "two", 2) as store:
        for i in range(40):
            store.put_message(Message("S", b"x" * 10, queue_id=i % 4)).check()
        reader = StatsReader(str(tmp_path / "two"))
        try:
            fig = figures(None, reader.snapshot())
        finally:
            reader.close()
    logs = fig["logs"]
    assert [e["log"] for e in logs] == [0, 1] and all(e["state"] == "online" for e in logs)
    assert sum(e["puts"] for e in logs) == 40 and all(e["puts"] for e in logs)
    assert logs[1]["positions"]["wrote"] > 1 << 56
    assert any(line.strip().startswith("CommitLog 1 (online): ") for line in format_lines(fig))
    with MessageStore(str(tmp_path / "one"), mapped_file_size_commit_log=64 * 1024):
        reader = StatsReader(str(tmp_path / "one"))
        try:
            assert "logs" not in figures(None, reader.snapshot())
        finally:
            reader.close()


def test_t9_inspect_and_dump_read_each_log(tmp_path):
    """mqstore inspect lists each CommitLog's files, offsets and index files of a store with
    several; dump reads a record by an offset of either log and a queue in its own log, and
    names an offset of a log the store does not have."""
    import subprocess
    import sys

    from mqstore import Message

    root = tmp_path / "s"
    with _several(root, 2) as store:
        phys = [store.put_message(Message("I", b"i%d" % i, queue_id=i % 4, keys=f"k{i}")).wrote_offset
                for i in range(40)]

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mqstore", *argv], capture_output=True, text=True, timeout=120)

    got = cli("inspect", str(root), "--json")
    assert got.returncode == 0, got.stderr
    inv = json.loads(got.stdout)
    assert [lg["log"] for lg in inv["commitlogs"]] == [0, 1]
    assert inv["commitlogs"][1]["min_offset"] == 1 << 56 and inv["commitlogs"][1]["end"] > 1 << 56
    assert sum(f["records"] for lg in inv["commitlogs"] for f in lg["files"]) == 40
    assert all(lg["index_files"] for lg in inv["commitlogs"])
    assert sum(q["messages"] for q in inv["queues"]) == 40
    for i in (0, 1, 2, 3):
        got = cli("dump", str(root), "--phy", str(phys[i]), "--json")
        assert got.returncode == 0, got.stderr
        assert f'"physical_offset": {phys[i]}' in got.stdout.replace(":  ", ": ")
    q1 = next(q for q in range(4) if _queue_log("I", q, 2) == 1)
    got = cli("dump", str(root), "--topic", "I", "--queue", str(q1), "--count", "3", "--json")
    assert got.returncode == 0, got.stderr
    records = json.loads(got.stdout)["records"]
    assert [r["note"] for r in records] == [None] * 3
    assert [r["physical_offset"] >> 56 for r in records] == [1] * 3
    assert [r["record"]["keys"] for r in records] == [[f"k{i}"] for i in range(q1, 12, 4)]
    got = cli("dump", str(root), "--phy", str(3 << 56))
    assert got.returncode != 0 and "names CommitLog 3, and the store has 2" in got.stderr


def test_t10_a_log_whose_flush_fails_with_an_io_error_goes_offline_alone(tmp_path):
    """SYNC_FLUSH, two CommitLogs: an EIO flushing log 1 takes log 1 offline: the put it covered
    answers FLUSH_DISK_TIMEOUT (stored, not known durable), later puts to log 1's queues answer
    SERVICE_NOT_AVAILABLE naming the log and the error, log 0's queues go on; everything stored
    reads back; a reopen brings log 1 back. A store with one CommitLog keeps retrying instead
    (tests/test_put_path.py: the next flush succeeds)."""
    import errno

    from mqstore import Message, MessageStore, PutMessageStatus
    from mqstore.log._mapped import inject_flush_failure

    root = tmp_path / "s"
    q0 = next(q for q in range(8) if _queue_log("O", q, 2) == 0)
    q1 = next(q for q in range(8) if _queue_log("O", q, 2) == 1)
    with _several(root, 2, flush_disk_type="SYNC_FLUSH", sync_flush_timeout=3000) as store:
        store.put_message(Message("O", b"a0", queue_id=q0)).check()
        store.put_message(Message("O", b"a1", queue_id=q1)).check()
        inject_flush_failure(errno.EIO, 1, where=os.sep + "commitlog-1" + os.sep)
        r = store.put_message(Message("O", b"b1", queue_id=q1))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and "Input/output error" in r.detail
        assert store.ctl.log_state(1) == "offline" and store.ctl.log_state(0) == "online"
        r = store.put_message(Message("O", b"c1", queue_id=q1))
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "CommitLog 1 is offline after an I/O error (Input/output error" in r.detail, r.detail
        store.put_message(Message("O", b"c0", queue_id=q0)).check()
        assert store.wait_dispatched(timeout_ms=10_000)
        assert store.read_messages("O", q0, 0).bodies() == [b"a0", b"c0"]
        assert store.read_messages("O", q1, 0).bodies() == [b"a1", b"b1"]
    with MessageStore(str(root)) as store:
        assert store.ctl.log_state(1) == "online"
        store.put_message(Message("O", b"d1", queue_id=q1)).check()
        assert store.wait_dispatched(timeout_ms=10_000)
        assert store.read_messages("O", q1, 0).bodies() == [b"a1", b"b1", b"d1"]
    check_store(str(root)).raise_if_failed()


def _same_logs(master: Any, slave: Any) -> None:
    """Each CommitLog of the slave byte-identical to the master's, file by file, up to its end."""
    for k, (mine, theirs) in enumerate(zip(master.commitlogs, slave.commitlogs, strict=True)):
        end = slave.ctl.get("wrote", log=k)
        assert end == master.ctl.get("wrote", log=k) and end > (k << 56), f"log {k}"
        for mf in theirs.queue.files:
            upto = min(mf.file_size, end - mf.file_from)
            if upto <= 0:
                break
            other = mine.queue.get(mf.file_from)
            assert other is not None and bytes(memoryview(mf)[:upto]) == bytes(memoryview(other)[:upto]), \
                f"log {k} file {mf.file_from}"


@pytest.mark.multiprocess
def test_t11_a_master_and_slave_of_two_logs_replicate_each_log_byte_for_byte(tmp_path):
    """Replication per log: a SYNC_MASTER with two CommitLogs and its slave (a node: its HA
    process holds a client per log, each on its own connection to the master's one HA port,
    reporting its log's encoded end). Puts to queues of both logs are acknowledged once the
    slave holds them (SYNC_MASTER waits on the log it wrote to); each log is byte for byte the
    master's; the slave's HA process SIGKILLed and restarted by its supervisor catches up with
    what the master took meanwhile; the slave reads every queue as the master does."""
    import signal
    import time

    from mqstore import Message, MessageStore, PutMessageStatus

    def put(store: Any, start: int, n: int) -> None:
        for i in range(start, start + n):
            r = store.put_message(Message("H", b"h%05d-" % i + b"z" * (i % 900), queue_id=i % 4))
            assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)

    def caught_up(master: Any, slave: Any) -> bool:
        return all(slave.ctl.get("wrote", log=k) == master.ctl.get("wrote", log=k)
                   and slave.ctl.get("dispatched", log=k) == slave.ctl.get("wrote", log=k) for k in (0, 1))

    def wait(cond: Any, what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    assert {_queue_log("H", q, 2) for q in range(4)} == {0, 1}
    master = _several(tmp_path / "master", 2, broker_role="SYNC_MASTER", ha_listen_port=0, slave_timeout=10_000)
    try:
        port = master.ctl.get("ha_port")
        slave = _several(tmp_path / "slave", 2, broker_role="SLAVE", ha_master_address=f"127.0.0.1:{port}",
                         service_mode="processes")
        try:
            wait(lambda: all(master.ctl.get("ha_slaves", log=k) == 1 for k in (0, 1)), "a slave per log connected")
            put(master, 0, 400)  # each put acknowledged once the slave reported holding it
            wait(lambda: caught_up(master, slave), "the slave caught up")
            _same_logs(master, slave)
            ha = slave.supervisor.services["ha"].proc  # type: ignore[union-attr]
            os.kill(ha.pid, signal.SIGKILL)
            services = slave.supervisor.services  # type: ignore[union-attr]
            wait(lambda: (p := services["ha"].proc) is not None and p.pid != ha.pid, "the HA process restarted")
            wait(lambda: all(master.ctl.get("ha_slaves", log=k) == 1 for k in (0, 1)), "the slave reconnected")
            put(master, 400, 400)
            wait(lambda: caught_up(master, slave), "the slave caught up after the restart")
            _same_logs(master, slave)
            assert master.wait_dispatched(timeout_ms=10_000)
            for q in range(4):
                mine = master.read_messages("H", q, 0, 1000)
                theirs = slave.read_messages("H", q, 0, 1000)
                assert [bytes(b) for b in theirs.bodies()] == [bytes(b) for b in mine.bodies()] and len(mine) == 200
        finally:
            slave.shutdown()
    finally:
        master.shutdown()
    check_store(str(tmp_path / "master")).raise_if_failed()
    check_store(str(tmp_path / "slave")).raise_if_failed()


def test_t12_a_log_whose_disk_is_full_is_refused_alone(tmp_path):
    """Disk full on one log's directory: the cleaner's disk check finds log 1's filesystem above
    disk_space_warning_level_ratio and log 0's and the ConsumeQueues' below it: log 1 is "full"
    (puts to its queues answer SERVICE_NOT_AVAILABLE naming it), log 0 goes on, DISK_FULL stays
    clear; every log over it sets DISK_FULL; below it again, log 1 takes puts."""
    from mqstore import Message, PutMessageStatus

    q0 = next(q for q in range(8) if _queue_log("D", q, 2) == 0)
    q1 = next(q for q in range(8) if _queue_log("D", q, 2) == 1)
    usage = {"log1": 0.2, "other": 0.2}

    def disk_usage(path: str) -> float:
        return usage["log1"] if os.path.basename(path) == "commitlog-1" else usage["other"]

    with _several(tmp_path / "s", 2) as store:
        assert store.cleaner is not None
        store.cleaner.commitlog_cleaner.disk_usage = disk_usage
        usage["log1"] = 0.95
        assert not store.cleaner.check_disk_space().disk_full
        assert store.ctl.log_state(1) == "full" and store.ctl.log_state(0) == "online"
        assert "DISK_FULL" not in store.ctl.running_flags()
        r = store.put_message(Message("D", b"x", queue_id=q1))
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "CommitLog 1 is full" in r.detail
        store.put_message(Message("D", b"y", queue_id=q0)).check()
        usage["other"] = 0.95  # every log (and the ConsumeQueues) over it: the store refuses every put
        assert store.cleaner.check_disk_space().disk_full and "DISK_FULL" in store.ctl.running_flags()
        assert store.ctl.log_state(1) == "online"  # the store-wide flag says it now
        assert store.put_message(Message("D", b"z", queue_id=q0)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        usage["log1"] = usage["other"] = 0.2
        assert not store.cleaner.check_disk_space().disk_full
        store.put_message(Message("D", b"w", queue_id=q1)).check()
        store.put_message(Message("D", b"v", queue_id=q0)).check()
        assert store.wait_dispatched(timeout_ms=10_000)
        assert store.read_messages("D", q1, 0).bodies() == [b"w"]
        assert store.read_messages("D", q0, 0).bodies() == [b"y", b"v"]
