"""The put path (spec §9): statuses, offsets, END_OF_FILE and rolls, batches, lock kinds, flush."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import Message, MessageBatch, PutMessageError, PutMessageStatus, StoreClosedError
from mqstore.log._codec import BLANK_MAGIC_CODE, decode_record, encode_batch_body
from mqstore.log._mapped import inject_flush_failure
from mqstore.tools.checker import check_store

FILE = 64 * 1024


def read_record(store, phy):
    mf = store.commitlog.queue.find_mapped_file_by_offset(phy)
    view = mf.view(phy - mf.file_from, FILE - (phy - mf.file_from))
    try:
        return decode_record(view)
    finally:
        view.release()


@pytest.mark.parametrize("lock", [True, False], ids=["mutex", "spin"])
def test_offsets_are_consecutive_per_queue(open_store, lock):
    store = open_store(use_reentrant_lock_when_put_message=lock)
    assert store.ctl.lock_kind == ("mutex" if lock else "spin")
    phy = 0
    for i in range(300):
        r = store.put_message(Message("T", b"m%d" % i, queue_id=i % 3, tags="A")).check()
        assert r.queue_offset == i // 3
        assert r.wrote_offset >= phy
        phy = r.wrote_offset + r.wrote_bytes
        rec = read_record(store, r.wrote_offset)
        assert rec.queue_offset == r.queue_offset and rec.physical_offset == r.wrote_offset
        assert rec.store_timestamp == r.store_timestamp and rec.body == b"m%d" % i
        assert r.msg_id == rec.msg_id
    assert store.next_queue_offset("T", 0) == 100
    assert store.next_queue_offset("nope", 0) == 0


def test_result_fields(open_store):
    store = open_store()
    before = int(time.time() * 1000)
    r = store.put("TopicA", b"x" * 10, properties={"UNIQ_KEY": "u1"})
    assert r.ok and r.status is PutMessageStatus.PUT_OK and r.msg_num == 1
    assert r.wrote_offset == 0 and r.wrote_bytes == 91 + 10 + 6 + len("UNIQ_KEY\x01u1")
    assert before <= r.store_timestamp <= int(time.time() * 1000)
    assert len(r.msg_id) == 32 and r.check() is r


def test_end_of_file_blank_and_roll(open_store):
    store = open_store()
    body = b"b" * 1000
    results = [store.put_message(Message("T", body)).check() for _ in range(70)]
    size = results[0].wrote_bytes
    per_file = (FILE - 8) // size  # a record never ends closer than 8 bytes to the end (spec §1.7)
    first_in_second = results[per_file]
    assert first_in_second.wrote_offset == FILE
    last_in_first = results[per_file - 1]
    blank_pos = last_in_first.wrote_offset + size
    mf = store.commitlog.queue.get(0)
    remaining = FILE - blank_pos
    assert int.from_bytes(mf.read(blank_pos, 4), "big") == remaining
    assert int.from_bytes(mf.read(blank_pos + 4, 4), "big", signed=True) == BLANK_MAGIC_CODE
    assert [r.queue_offset for r in results] == list(range(70))
    assert store.stats()["rolls"] >= 1


def test_batch_never_straddles_files(open_store):
    store = open_store(max_message_size=FILE)
    store.put_message(Message("T", b"a" * (FILE - 3000))).check()
    batch = [Message("T", b"%04d" % i + b"z" * 200) for i in range(20)]  # ~6 KiB: does not fit in the rest
    r = store.put_messages(batch).check()
    assert r.wrote_offset == FILE and r.msg_num == 20 and r.queue_offset == 1
    ids = r.msg_id.split(",")
    assert len(ids) == 20
    off = r.wrote_offset
    for i, msg_id in enumerate(ids):
        rec = read_record(store, off)
        assert rec.queue_offset == 1 + i and rec.body[:4] == b"%04d" % i and rec.msg_id == msg_id
        assert rec.store_timestamp == r.store_timestamp
        off += rec.total_size
    assert off == r.wrote_offset + r.wrote_bytes


def test_client_batch_body_with_batch_properties(open_store):
    store = open_store()
    body = encode_batch_body([(b"one", {"TAGS": "a"}, 1), (b"two", None, 2)])
    r = store.put_messages(MessageBatch("B", body, queue_id=2, properties={"KEYS": "k"})).check()
    first = read_record(store, r.wrote_offset)
    second = read_record(store, r.wrote_offset + first.total_size)
    assert (first.body, first.flag, first.properties) == (b"one", 1, {"TAGS": "a", "KEYS": "k"})
    assert (second.body, second.flag, second.properties) == (b"two", 2, {"KEYS": "k"})
    assert (first.queue_id, first.queue_offset, second.queue_offset) == (2, 0, 1)


def test_born_timestamp_zero_is_the_store_timestamp_and_a_given_one_is_kept(open_store):
    store = open_store()
    now = store.put_message(Message("T", b"a")).check()
    assert read_record(store, now.wrote_offset).born_timestamp == now.store_timestamp
    given = store.put_message(Message("T", b"b", born_timestamp=1234)).check()
    assert read_record(store, given.wrote_offset).born_timestamp == 1234
    batch = store.put_messages([Message("T", b"c"), Message("T", b"d")]).check()
    first = read_record(store, batch.wrote_offset)
    second = read_record(store, batch.wrote_offset + first.total_size)
    assert first.born_timestamp == second.born_timestamp == batch.store_timestamp


def test_client_batch_body_properties_join_rules(open_store):
    """Inner properties ending in \x02 take the batch's without another separator; inner
    messages without properties take the batch's alone (spec §9.4)."""
    store = open_store()
    body = (encode_batch_body([(b"one", None, 0)])
            + (100).to_bytes(4, "big") + bytes(12) + (3).to_bytes(4, "big") + b"two"
            + (4).to_bytes(2, "big") + b"A\x01a\x02")
    r = store.put_messages(MessageBatch("B", body, properties={"KEYS": "k"})).check()
    first = read_record(store, r.wrote_offset)
    second = read_record(store, r.wrote_offset + first.total_size)
    assert first.properties == {"KEYS": "k"}
    assert second.properties_string == "A\x01a\x02KEYS\x01k"


@pytest.mark.parametrize("make,status,needle", [
    (lambda: MessageBatch("B", encode_batch_body([(b"x", None, 0)])[:-2] + b"\x00\x02\xff\xfe"),
     PutMessageStatus.MESSAGE_ILLEGAL, "not UTF-8"),
    (lambda: MessageBatch("B", encode_batch_body([(b"x", {"k": "v" * 16000}, 0)]), properties={"K": "w" * 17000}),
     PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, "message 0 of the batch"),
    (lambda: MessageBatch("B", b""), PutMessageStatus.MESSAGE_ILLEGAL, "empty"),
    (lambda: [Message("B", b"x"), Message("B", b"y", queue_id=1)], PutMessageStatus.MESSAGE_ILLEGAL, "one queue"),
])
def test_bad_batches_get_a_status_and_keep_what_was_stored(open_store, make, status, needle):
    store = open_store()
    good = store.put_message(Message("B", b"before")).check()
    r = store.put_messages(make())
    assert r.status is status and needle in r.detail, r
    assert read_record(store, good.wrote_offset).body == b"before"
    assert store.put_messages(iter([Message("B", b"after")])).check().queue_offset == 1


def test_batch_items_must_be_messages(open_store):
    store = open_store()
    with pytest.raises(TypeError, match="Message"):
        store.put_messages([Message("B", b"x"), b"not a message"])
    assert store.put_message(Message("B", b"y")).check().queue_offset == 0


@pytest.mark.parametrize("make,status,needle", [
    (lambda: Message("", b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "empty"),
    (lambda: Message("t" * 128, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "127"),
    (lambda: Message("é" * 100, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "character 'é' at index 0"),
    (lambda: Message("../escape", b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "character '.' at index 0"),
    (lambda: Message("a/b", b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "character '/' at index 1"),
    (lambda: Message("a\x00b", b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "character '\\x00' at index 1"),
    (lambda: Message("T", b"x", properties={"a\x01": "b\x02c"}), PutMessageStatus.MESSAGE_ILLEGAL,
     "name 'a\\x01' contains a separator"),
    (lambda: Message("T", b"x", tags="A\x02B"), PutMessageStatus.MESSAGE_ILLEGAL, "'TAGS' has a value containing"),
    (lambda: Message("T", b"x", keys=["k\x01"]), PutMessageStatus.MESSAGE_ILLEGAL, "'KEYS' has a value containing"),
    (lambda: Message("T", b"x", queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL, "queue id"),
    (lambda: Message("T", b"x" * (16 * 1024 + 1)), PutMessageStatus.MESSAGE_ILLEGAL, "max_message_size"),
    (lambda: Message("T", b"x", properties={"k": "v" * 40000}), PutMessageStatus.MESSAGE_ILLEGAL, "32767"),
    (lambda: Message("T", b"x", properties={"k": "é" * 20000}), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, "32767"),
])
def test_bad_input_gets_a_status_and_keeps_what_was_stored(open_store, make, status, needle):
    store = open_store()
    good = store.put_message(Message("T", b"before")).check()
    r = store.put_message(make())
    assert r.status is status and not r.ok
    assert needle in r.detail
    with pytest.raises(PutMessageError, match=status.name):
        r.check()
    assert read_record(store, good.wrote_offset).body == b"before"
    after = store.put_message(Message("T", b"after")).check()
    assert after.queue_offset == 1 and after.wrote_offset == good.wrote_offset + good.wrote_bytes


def test_record_that_can_never_fit_a_file_is_illegal(open_store):
    store = open_store(mapped_file_size_commit_log=8192, max_message_size=16 * 1024)
    r = store.put_message(Message("T", b"x" * 8100))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "never fit" in r.detail


@pytest.mark.parametrize("batch,needle", [
    ([Message("A", b"1"), Message("B", b"2")], "one topic"),
    ([Message("A", b"1", queue_id=0), Message("A", b"2", queue_id=1)], "one queue"),
    ([], "empty"),
    ([Message("A", b"1", sys_flag=0x4)], "transaction"),
    (MessageBatch("A", b"\x00\x00\x00\x05junk"), "does not parse"),
    (MessageBatch("A", encode_batch_body([(b"x", None, 0)]), properties={"DELAY": "3"}), "delay"),
    (MessageBatch("A", b"\x00" * (16 * 1024 + 1)), "max_message_size"),
])
def test_bad_batches(open_store, batch, needle):
    store = open_store()
    r = store.put_messages(batch)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and needle in r.detail


def test_prepared_and_rollback_messages_take_queue_offset_zero(open_store):
    store = open_store()
    store.put_message(Message("T", b"a")).check()
    prepared = store.put_message(Message("T", b"p", sys_flag=0x4)).check()
    assert prepared.queue_offset == 0
    assert store.put_message(Message("T", b"b")).check().queue_offset == 1
    assert store.put_message(Message("T", b"c", sys_flag=0x8)).check().queue_offset == 2


def test_delay_message_goes_to_schedule_topic(open_store):
    store = open_store()
    r = store.put_message(Message("Real", b"d", queue_id=5, properties={"DELAY": "40"})).check()
    rec = read_record(store, r.wrote_offset)
    assert rec.topic == "SCHEDULE_TOPIC_XXXX" and rec.queue_id == 17
    assert rec.properties["REAL_TOPIC"] == "Real" and rec.properties["REAL_QID"] == "5"
    assert rec.properties["DELAY"] == "18"


def test_ipv6_store_host_sets_sysflag(open_store):
    store = open_store(store_host="[::1]:10911")
    r = store.put_message(Message("T", b"v6", born_host=("fe80::1", 5))).check()
    rec = read_record(store, r.wrote_offset)
    assert rec.sys_flag & 0x30 == 0x30 and rec.store_host == ("::1", 10911) and rec.born_host == ("fe80::1", 5)
    assert len(r.msg_id) == 56


def test_shut_down_store_refuses_puts(open_store):
    store = open_store()
    store.shutdown()
    for put in (lambda: store.put_message(Message("T", b"x")), lambda: store.put_messages([Message("T", b"x")])):
        with pytest.raises(StoreClosedError, match="shut down"):
            put()


def test_slave_and_unwritable_refuse_puts(open_store, tmp_path):
    slave = open_store(str(tmp_path / "slave"))
    slave.commitlog.appender.slave = True  # broker_role=SLAVE is refused until replication exists
    r = slave.put_message(Message("T", b"x"))
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "slave" in r.detail
    master = open_store(str(tmp_path / "master"))
    master.ctl.set_running_flag("DISK_FULL")
    r = master.put_message(Message("T", b"x"))
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "not writable: DISK_FULL (the disk is above" in r.detail
    master.ctl.set_running_flag("DISK_FULL", False)
    master.put_message(Message("T", b"x")).check()


@pytest.mark.parametrize("lock", [True, False], ids=["mutex", "spin"])
def test_os_page_cache_busy_fails_fast(open_store, lock):
    store = open_store(use_reentrant_lock_when_put_message=lock, os_page_cache_busy_time_out_mills=200)
    store.put_message(Message("T", b"warm")).check()
    store.ctl.acquire_put_lock()  # another put "stuck" inside the lock
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        r = store.put_message(Message("T", b"x"))
        assert time.monotonic() - t0 < 1.0
        assert r.status is PutMessageStatus.OS_PAGECACHE_BUSY
    finally:
        store.ctl.release_put_lock()
    assert store.stats()["page_cache_busy"] == 1
    assert store.put_message(Message("T", b"y")).check().queue_offset == 1


def test_put_waits_for_lock_held_by_another_thread(open_store):
    store = open_store(use_reentrant_lock_when_put_message=True)
    store.ctl.acquire_put_lock()
    out = []
    t = threading.Thread(target=lambda: out.append(store.put_message(Message("T", b"x"))))
    t.start()
    time.sleep(0.1)
    assert not out  # blocked on the kernel mutex with the GIL released
    store.ctl.release_put_lock()
    t.join(5)
    assert out and out[0].ok


@pytest.mark.parametrize("lock", [True, False], ids=["mutex", "spin"])
def test_concurrent_threads_never_duplicate_offsets(open_store, lock):
    store = open_store(use_reentrant_lock_when_put_message=lock)
    results = []

    def worker(k):
        for i in range(200):
            results.append(store.put_message(Message("T", b"%d-%d" % (k, i), queue_id=i % 2)).check())

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in (0, 1):
        assert sorted(r.queue_offset for r in results if read_record(store, r.wrote_offset).queue_id == q) == \
            list(range(400))


def test_sync_flush_waits_for_disk(open_store):
    store = open_store(flush_disk_type="SYNC_FLUSH")
    r = store.put_message(Message("T", b"durable")).check()
    assert store.positions()["flushed"] >= r.wrote_offset + r.wrote_bytes
    assert store.stats()["group_commit_waits"] == 1


def test_sync_flush_wait_false_returns_without_waiting(open_store):
    store = open_store(flush_disk_type="SYNC_FLUSH")
    r = store.put_message(Message("T", b"x", wait_store_msg_ok=False)).check()
    assert store.stats()["group_commit_waits"] == 0
    store.ctl.wait_position("flushed", r.wrote_offset + r.wrote_bytes, "flushed", 5000)


def test_sync_flush_spanning_a_roll(open_store):
    store = open_store(flush_disk_type="SYNC_FLUSH")
    for _ in range(80):
        r = store.put_message(Message("T", b"s" * 1000)).check()
    assert r.wrote_offset > FILE
    assert store.positions()["flushed"] == r.wrote_offset + r.wrote_bytes


def test_failed_flush_is_never_success(open_store):
    store = open_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=3000)
    store.put_message(Message("T", b"ok")).check()
    # only the CommitLog's flush: the ConsumeQueue flush thread must not take the failure
    inject_flush_failure(errno.EIO, 1, where=os.sep + "commitlog" + os.sep)
    t0 = time.monotonic()
    r = store.put_message(Message("T", b"lost?"))
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert "Input/output error" in r.detail and time.monotonic() - t0 < 2.5
    assert r.status.is_stored
    assert store.stats()["flush_errors"] == 1 and store.stats()["flush_timeouts"] == 1
    # the next flush succeeds and covers the earlier message too
    r2 = store.put_message(Message("T", b"later")).check()
    assert store.positions()["flushed"] >= r2.wrote_offset + r2.wrote_bytes


def test_a_sync_put_flushes_on_its_own_side(open_store):
    """With nobody else flushing, the putting thread flushes (no hand-off to the group commit
    thread): puts stay durable with that thread gone."""
    store = open_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=300)
    store._services[1].shutdown()  # the group commit service
    r = store.put_message(Message("T", b"x")).check()
    assert store.positions()["flushed"] >= r.wrote_offset + r.wrote_bytes


def test_flush_disk_timeout_when_the_flush_never_comes(open_store):
    """Another thread of the process holds the flush (a stuck msync) and the group commit
    service is gone: the put waits sync_flush_timeout and says so."""
    store = open_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=300)
    store._services[1].shutdown()
    with store.commitlog._flush_lock:
        r = store.put_message(Message("T", b"x"))
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and "300 ms" in r.detail


def test_concurrent_sync_puts_are_all_flushed(open_store):
    store = open_store(flush_disk_type="SYNC_FLUSH")
    results: list[list] = [[] for _ in range(4)]

    def writer(k: int) -> None:
        for i in range(100):
            results[k].append(store.put_message(Message("T", b"w%d-%d" % (k, i), queue_id=k)).check())

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ends = [r.wrote_offset + r.wrote_bytes for rs in results for r in rs]
    assert len(ends) == 400 and store.positions()["flushed"] >= max(ends)
    assert store.stats()["flush_errors"] == 0


def test_async_flush_realtime_flushes_soon(open_store):
    store = open_store(flush_commit_log_timed=False, flush_interval_commit_log=50, flush_commit_log_least_pages=0)
    r = store.put_message(Message("T", b"x")).check()
    assert store.ctl.wait_position("flushed", r.wrote_offset + r.wrote_bytes, "flushed", 5000)


def test_async_flush_least_pages_and_thorough(open_store):
    store = open_store(flush_interval_commit_log=20, flush_commit_log_least_pages=4,
                       flush_commit_log_thorough_interval=400)
    store.put_message(Message("T", b"x")).check()
    time.sleep(0.15)
    # one small record is less than 4 dirty pages; only the thorough flush (every 400 ms) takes it
    end = store.max_phy_offset
    assert store.ctl.wait_position("flushed", end, "flushed", 3000)


op = st.tuples(st.sampled_from(["one", "batch"]), st.integers(0, 2), st.integers(0, 3000), st.integers(1, 12))


@given(st.lists(op, min_size=1, max_size=40))
def test_random_put_sequences_keep_every_invariant(tmp_path_factory, ops):
    from mqstore import MessageStore

    root = str(tmp_path_factory.mktemp("rand"))
    expected: dict[int, int] = {}
    with MessageStore(root, mapped_file_size_commit_log=16 * 1024, max_message_size=8 * 1024) as store:
        for kind, qid, size, n in ops:
            body = bytes([qid]) * size
            if kind == "one":
                r = store.put_message(Message("R", body, queue_id=qid))
                count = 1
            else:
                r = store.put_messages([Message("R", body[: max(1, size // n)], queue_id=qid) for _ in range(n)])
                count = n
            if r.ok:
                assert r.queue_offset == expected.get(qid, 0)
                expected[qid] = expected.get(qid, 0) + count
            else:
                assert r.status is PutMessageStatus.MESSAGE_ILLEGAL  # only too-large batches
            check_store(root, quiescent=True).raise_if_failed()
    report = check_store(root).raise_if_failed()
    assert {q: s.count for (_, q), s in report.queues.items()} == {q: c for q, c in expected.items() if c}


@pytest.mark.parametrize("lock", [True, False], ids=["mutex", "spin"])
def test_takeover_repairs_an_uncounted_queue_offset(open_store, lock):
    """A writer died inside the lock after publishing its record but before counting its queue
    offset: the next put takes the lock over, re-counts, and does not reuse the offset."""
    import subprocess
    import sys
    import textwrap

    store = open_store(use_reentrant_lock_when_put_message=lock)
    store.put_message(Message("T", b"a")).check()
    r = store.put_message(Message("T", b"b")).check()
    store.ctl.table_set("T", 0, 1)  # the dead writer's record (offset 1) was never counted
    store.ctl.set("lock_entry_wrote", r.wrote_offset)
    code = textwrap.dedent(f"""
        import os, signal
        from mqstore.log._shm import ControlBlock
        cb = ControlBlock.attach({store.ctl.path!r})
        cb.acquire_put_lock()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], timeout=60)
    after = store.put_message(Message("T", b"c")).check()
    assert after.queue_offset == 2
    assert store.stats()["lock_takeovers"] == 1
