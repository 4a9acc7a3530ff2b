"""Dispatch, ConsumeQueue and getMessage on real stores (spec §3, §10.1, §11)."""

from __future__ import annotations

import struct
import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import Message, MessageStore
from mqstore.log._codec import java_string_hash
from mqstore.queue._consumequeue import CQ_STORE_UNIT_SIZE as UNIT
from mqstore.queue.consume_queue import ConsumeQueue
from mqstore.status import GetMessageStatus as S

CQ_UNITS = 50  # units per ConsumeQueue file in these tests
CFG = {"mapped_file_size_consume_queue": CQ_UNITS * UNIT, "message_index_enable": False}


def put(store, n, *, topic="T", queue_ids=1, tags=None, body=b"m-%d", **fields):
    out = []
    for i in range(n):
        props = {"TAGS": tags(i)} if tags else None
        msg = Message(topic, body % i, queue_id=i % queue_ids, properties=props, **fields)
        out.append(store.put_message(msg).check())
    assert store.wait_dispatched()
    return out


def cq_bytes(store_dir, topic="T", qid=0):
    d = os.path.join(store_dir, "consumequeue", topic, str(qid))
    return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))}


# -- dispatch and ConsumeQueue files ------------------------------------------------------------

def test_units_point_at_their_records_across_queue_files(open_store, store_dir):
    store = open_store(**CFG)
    results = put(store, 130, queue_ids=2, tags=lambda i: f"tag{i % 3}")
    assert store.get_max_offset_in_queue("T", 0) == 65 and store.get_max_offset_in_queue("T", 1) == 65
    names = sorted(os.listdir(os.path.join(store_dir, "consumequeue", "T", "0")))
    assert names == [f"{n * CQ_UNITS * UNIT:020d}" for n in range(2)]  # named by logical byte offset
    cq = store.consume_queues.get("T", 0)
    for q in range(65):
        phy, size, tags = cq.unit(q)
        r = results[2 * q]
        assert (phy, size, tags) == (r.wrote_offset, r.wrote_bytes, java_string_hash(f"tag{(2 * q) % 3}"))
    assert store.dispatch_behind_bytes == 0 and store.dispatch_lag_ms == 0
    stats = store.stats()
    assert stats["dispatch_records"] == 130 and stats["dispatch_units"] == 130
    assert stats["dispatched"] == stats["wrote"]


def test_dispatch_twice_is_idempotent(open_store, store_dir):
    store = open_store(**CFG)
    put(store, 120, queue_ids=3)
    store.consume_queues.flush()
    before = {q: cq_bytes(store_dir, qid=q) for q in range(3)}
    store.dispatcher.reset(0)  # replay the whole log
    store.dispatcher.dispatch_available()
    assert {q: cq_bytes(store_dir, qid=q) for q in range(3)} == before
    assert store.get_max_offset_in_queue("T", 2) == 40


def test_deleted_consume_queues_are_rebuilt_byte_identical(store_dir):
    with MessageStore(store_dir, **CFG) as store:
        put(store, 200, queue_ids=4, tags=lambda i: "A" if i % 2 else None)
    before = {q: cq_bytes(store_dir, qid=q) for q in range(4)}
    import shutil
    shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    with MessageStore(store_dir, **CFG) as store:
        assert store.recovery.redispatched_records == 200
        assert [store.next_queue_offset("T", q) for q in range(4)] == [50] * 4
    assert {q: cq_bytes(store_dir, qid=q) for q in range(4)} == before


def test_transaction_types_and_delay_messages(open_store):
    store = open_store(**CFG)
    store.put_message(Message("T", b"prepared", sys_flag=0x4)).check()
    store.put_message(Message("T", b"commit", sys_flag=0x8)).check()
    store.put_message(Message("T", b"rollback", sys_flag=0xC)).check()
    store.put_message(Message("T", b"plain")).check()
    r = store.put_message(Message("T", b"later", properties={"DELAY": "3"})).check()
    assert store.wait_dispatched()
    got = store.get_message("g", "T", 0, 0, 32)
    assert [bytes(m.body) for m in got] == [b"commit", b"plain"]  # only NOT and COMMIT are queued
    sched = store.consume_queues.get("SCHEDULE_TOPIC_XXXX", 2)
    phy, _, tags = sched.unit(0)
    assert phy == r.wrote_offset and tags == r.store_timestamp + 10_000  # level 3 = 10 s


def test_queue_starting_above_zero_is_prefilled(tmp_path):
    cq = ConsumeQueue(str(tmp_path), "T", 0, CQ_UNITS * UNIT)
    assert cq.put_message_position_info(1000, 100, 7, 120)
    assert os.listdir(cq.store_path) == [f"{100 * UNIT:020d}"]
    assert cq.min_offset_in_queue == 120 and cq.max_offset_in_queue == 121
    assert cq.unit(120) == (1000, 100, 7)
    assert cq.get_index_buffer(119) is None
    mf = cq.files.first()
    assert mf.read(0, UNIT) == (0).to_bytes(8, "big") + (0x7FFFFFFF).to_bytes(4, "big") + bytes(8)
    assert not cq.put_message_position_info(1000, 100, 7, 120)  # idempotent
    assert not cq.put_message_position_info(900, 50, 7, 119)  # an older record
    cq.close()


def test_skipped_queue_offset_becomes_a_filler_not_a_shift(tmp_path, caplog):
    cq = ConsumeQueue(str(tmp_path), "T", 0, CQ_UNITS * UNIT)
    cq.put_message_position_info(0, 100, 0, 0)
    cq.put_message_position_info(100, 100, 0, 3)  # offsets 1 and 2 never came
    assert cq.gaps == 2 and cq.max_offset_in_queue == 4
    assert cq.unit(3) == (100, 100, 0) and cq.unit(1)[1] == 0x7FFFFFFF
    assert "expected queue offset 3" in caplog.text
    cq.close()


def test_truncate_dirty_logic_files_and_correct_min_offset(tmp_path):
    cq = ConsumeQueue(str(tmp_path), "T", 0, 10 * UNIT)
    for q in range(35):
        cq.put_message_position_info(q * 100, 100, 0, q)
    assert len(cq.files) == 4
    dropped = cq.truncate_dirty_logic_files(1250)  # units of records at 1300.. go
    assert dropped == 22 and cq.max_offset_in_queue == 13 and len(cq.files) == 2
    assert cq.max_physic_offset == 1300
    assert cq.put_message_position_info(1300, 100, 0, 13)  # appends continue at the cut
    cq.correct_min_offset(450)
    assert cq.min_offset_in_queue == 5
    cq.truncate_dirty_logic_files(0)  # nothing left: the empty queue keeps its position
    assert cq.max_offset_in_queue == cq.min_offset_in_queue == 5 and len(cq.files) == 0
    cq.close()


# -- getMessage statuses and next offsets (spec §11) --------------------------------------------

def test_get_message_statuses_and_next_offsets(open_store):
    store = open_store(**CFG)
    got = store.get_message("g", "nobody", 0, 5, 32)
    assert got.status == S.NO_MESSAGE_IN_QUEUE and got.next_begin_offset == 0
    put(store, 40)
    cases = {-1: (S.OFFSET_TOO_SMALL, 0), 40: (S.OFFSET_OVERFLOW_ONE, 40), 41: (S.OFFSET_OVERFLOW_BADLY, 40),
             500: (S.OFFSET_OVERFLOW_BADLY, 40)}
    for offset, (status, nxt) in cases.items():
        got = store.get_message("g", "T", 0, offset, 32)
        assert (got.status, got.next_begin_offset, len(got)) == (status, nxt, 0)
        assert (got.min_offset, got.max_offset) == (0, 40)
    got = store.get_message("g", "T", 0, 5, 10)
    assert got.status == S.FOUND and len(got) == 10 and got.next_begin_offset == 15
    assert [m.queue_offset for m in got] == list(range(5, 15))
    assert [bytes(m.body) for m in got] == [b"m-%d" % i for i in range(5, 15)]
    # a read never crosses a ConsumeQueue file: offsets 45.. are in the second file
    got = store.get_message("g", "T", 0, 30, 32)
    assert len(got) == 10 and got.next_begin_offset == 40


def test_in_memory_and_on_disk_transfer_caps(open_store):
    store = open_store(**CFG, max_transfer_count_on_message_in_memory=5)
    put(store, 30)
    assert len(store.get_message("g", "T", 0, 0, 32)) == 5
    total = store.get_message("g", "T", 0, 0, 1).buffer_total_size
    # caps by bytes: room for exactly 3 messages
    store.reader.config = store.config.replace(max_transfer_bytes_on_message_in_memory=3 * total)
    got = store.get_message("g", "T", 0, 0, 32)
    assert len(got) == 3 and got.next_begin_offset == 3 and got.buffer_total_size == 3 * total
    assert not got.suggest_pulling_from_slave
    # everything counts as "on disk" when no memory may be used: the disk caps (8) apply
    store.reader.config = store.config
    store.reader.in_memory_limit = 0
    got = store.get_message("g", "T", 0, 0, 32)
    assert len(got) == 8 and got.suggest_pulling_from_slave


def test_tag_filter_by_tags_code(open_store):
    store = open_store(**CFG)
    put(store, 40, tags=lambda i: "ABC"[i % 3])
    got = store.get_message("g", "T", 0, 0, 32, tags="A || C")
    assert [m.tags for m in got][:4] == ["A", "C", "A", "C"]
    assert all(m.tags in ("A", "C") for m in got)
    got = store.get_message("g", "T", 0, 0, 32, tags="Z")
    assert got.status == S.NO_MATCHED_MESSAGE and len(got) == 0 and got.next_begin_offset == 40
    assert len(store.get_message("g", "T", 0, 0, 32, tags="*")) == 32


def test_deleted_commitlog_file_reads_as_removing(open_store):
    store = open_store(**CFG, mapped_file_size_commit_log=4096)
    put(store, 100, body=b"x" * 100 + b"%d")
    queue = store.commitlog.queue
    assert queue.delete_expired_file_by_time(0, 0, 0, True) >= 2
    min_phy = store.get_min_phy_offset()
    got = store.get_message("g", "T", 0, 0, 32)
    assert got.status == S.MESSAGE_WAS_REMOVING and len(got) == 0
    assert got.next_begin_offset > 0
    assert store.look_message_by_offset(0) is None and store.get_message_store_timestamp("T", 0, 0) == -1
    # the first readable message is reached by following next_begin_offset
    offset = 0
    while True:
        got = store.get_message("g", "T", 0, offset, 32)
        if got.status == S.FOUND:
            break
        offset = got.next_begin_offset
    assert got[0].physical_offset >= min_phy


def test_offset_found_null_when_a_queue_file_is_missing(open_store):
    store = open_store(**CFG)
    put(store, 120)
    cq = store.consume_queues.get("T", 0)
    first = cq.files.first()
    with cq.files._lock:
        cq.files._files.pop(first.file_from)
    got = store.get_message("g", "T", 0, 3, 32)
    assert got.status == S.OFFSET_FOUND_NULL and got.next_begin_offset == CQ_UNITS
    first.close()


# -- message views and lookups -------------------------------------------------------------------

def test_message_views_are_zero_copy_and_decode_lazily(open_store):
    store = open_store(**CFG)
    r = store.put_message(Message("T", b"hello", properties={"KEYS": "k1 k2", "TAGS": "t"}, flag=3)).check()
    store.wait_dispatched()
    view = store.get_message("g", "T", 0, 0, 1)[0]
    assert isinstance(view.body, memoryview) and view.body.readonly and bytes(view.body) == b"hello"
    assert view.buffer.nbytes == r.wrote_bytes == view.total_size
    rec = view.decode()
    assert (rec.topic, rec.queue_offset, rec.physical_offset, rec.flag, rec.body) == ("T", 0, r.wrote_offset, 3,
                                                                                       b"hello")
    assert view.keys == ["k1", "k2"] and view.tags == "t" and view.store_timestamp == r.store_timestamp
    assert view.msg_id == r.msg_id
    same = store.look_message_by_offset(r.wrote_offset)
    assert same.decode() == rec
    assert store.look_message_by_offset(r.wrote_offset + 1) is None  # not the start of a record
    assert store.look_message_by_offset(store.get_max_phy_offset()) is None
    assert store.get_message_store_timestamp("T", 0, 0) == r.store_timestamp
    assert store.get_message_store_timestamp("T", 0, 1) == -1
    assert store.get_earliest_message_time() == r.store_timestamp
    assert store.get_earliest_message_time("T", 0) == r.store_timestamp
    assert store.get_earliest_message_time("T", 9) == -1


def test_time_lookup_nearest_entry_rules(open_store):
    store = open_store(**CFG)
    groups = []
    for g in range(4):
        rs = put(store, 15, body=b"g%d-" % g + b"%d")
        stamps = [r.store_timestamp for r in rs]
        assert stamps == sorted(stamps)  # store timestamps never go back within a group
        assert not groups or stamps[0] > groups[-1]  # nor across the 20 ms pause
        groups.append(stamps[-1])
        time.sleep(0.02)
    ts = [store.get_message_store_timestamp("T", 0, q) for q in range(60)]
    assert ts == sorted(ts)
    for q in (0, 7, 15, 44, 59):
        first_equal = ts.index(ts[q])
        assert store.get_offset_in_queue_by_time("T", 0, ts[q]) == first_equal  # earliest exact match
    assert store.get_offset_in_queue_by_time("T", 0, ts[0] - 10_000) == 0
    assert store.get_offset_in_queue_by_time("T", 0, ts[-1] + 10_000) == 59
    # between two neighbours: the nearer one, ties to the older
    for q in range(1, 60):
        a, b = ts[q - 1], ts[q]
        if b - a >= 2:
            mid = (a + b) // 2
            want = ts.index(a) if (mid - a) <= (b - mid) else q
            if mid - a <= b - mid:
                want = max(i for i in range(60) if ts[i] == a)
            assert store.get_offset_in_queue_by_time("T", 0, mid) == want
    assert store.get_offset_in_queue_by_time("nobody", 0, ts[0]) == 0


def test_tail_time_lookup_touches_at_most_two_queue_pages(open_store):
    store = open_store(mapped_file_size_consume_queue=20_000 * UNIT, mapped_file_size_commit_log=1 << 20,
                       message_index_enable=False)
    put(store, 2990, body=b"%d")
    for i in range(10):  # the newest messages get store times of their own
        time.sleep(0.002)
        store.put_message(Message("T", b"tail-%d" % i)).check()
    assert store.wait_dispatched()
    last = store.get_message_store_timestamp("T", 0, 2999)
    hot = store.offset_in_queue_by_time("T", 0, last)
    assert hot.cq_pages <= 2 and hot.probes > 0
    plain = store.offset_in_queue_by_time("T", 0, last, warm_bytes=0)
    assert plain.offset == hot.offset
    assert plain.cq_pages >= hot.cq_pages


# -- shutdown and abort ----------------------------------------------------------------------------

def test_abort_is_left_when_dispatch_is_behind(store_dir, monkeypatch):
    import mqstore.services.reput as reput

    store = MessageStore(store_dir, **CFG)
    monkeypatch.setattr(reput, "SHUTDOWN_CATCH_UP_MS", 0)
    store.reput.shutdown()  # dispatch stops; puts go on
    for i in range(20):
        store.put_message(Message("T", b"undispatched-%d" % i)).check()
    assert store.dispatch_behind_bytes > 0
    store.shutdown()
    assert os.path.exists(os.path.join(store_dir, "abort"))
    monkeypatch.undo()
    with MessageStore(store_dir, **CFG) as store:
        assert not store.last_exit_ok and store.recovery.mode == "abnormal"
        assert store.recovery.redispatched_records >= 20
        got = store.get_message("g", "T", 0, 0, 32)
        assert [bytes(m.body) for m in got] == [b"undispatched-%d" % i for i in range(20)]
    assert not os.path.exists(os.path.join(store_dir, "abort"))


def test_damaged_log_tail_truncates_queues_and_reports_them(store_dir):
    with MessageStore(store_dir, **CFG) as store:
        results = put(store, 30, queue_ids=2)
    last = results[-1]
    path = os.path.join(store_dir, "commitlog", f"{0:020d}")
    with open(path, "r+b") as f:  # break the CRC of the last two records
        for r in results[-2:]:
            f.seek(r.wrote_offset + r.wrote_bytes - 5)
            f.write(b"\xff")
    open(os.path.join(store_dir, "abort"), "wb").close()
    with MessageStore(store_dir, **CFG) as store:
        rep = store.recovery
        assert rep.valid_end == results[-2].wrote_offset and rep.dropped_bytes > 0
        assert rep.queue_units_dropped == {"T/0": 1, "T/1": 1}
        assert "dropped 2 queue units" in rep.summary()
        assert [store.get_max_offset_in_queue("T", q) for q in range(2)] == [14, 14]
        assert store.put_message(Message("T", b"after", queue_id=1)).check().queue_offset == 14
        assert last.wrote_offset > rep.valid_end


def test_a_queue_offset_too_far_past_the_end_is_refused_not_filled(tmp_path):
    cq = ConsumeQueue(str(tmp_path), "T", 0, 10 * UNIT)
    cq.put_message_position_info(0, 100, 0, 0)
    with pytest.raises(ValueError, match="queue offset 1099511627776 lies more than 1000000 units past the queue's end 1"):
        cq.put_message_position_info(100, 100, 0, 1 << 40)
    assert cq.max_offset_in_queue == 1 and cq.gaps == 0 and len(os.listdir(cq.store_path)) == 1
    assert cq.put_message_position_info(100, 100, 0, 1) and cq.unit(1) == (100, 100, 0)
    cq.close()


def test_gap_of_whole_files_keeps_queue_files_contiguous(tmp_path):
    cq = ConsumeQueue(str(tmp_path), "T", 0, 10 * UNIT)
    cq.put_message_position_info(0, 100, 0, 0)
    cq.put_message_position_info(100, 100, 0, 25)
    assert sorted(os.listdir(cq.store_path)) == [f"{n * 10 * UNIT:020d}" for n in range(3)]
    assert cq.gaps == 24 and cq.unit(25) == (100, 100, 0)
    cq.close()
    again = ConsumeQueue(str(tmp_path), "T", 0, 10 * UNIT)
    again.load()  # contiguous files load
    assert again.recover().max_offset == 26
    again.close()


def test_dispatch_chunks_end_at_record_boundaries(open_store, monkeypatch):
    import mqstore.queue.dispatch as dispatch

    monkeypatch.setattr(dispatch, "CHUNK_BYTES", 1000)  # far smaller than what is written, not a record multiple
    store = open_store(**CFG)
    store.reput.shutdown()
    for i in range(100):
        store.put_message(Message("T", b"chunked-%d" % i)).check()
    assert store.dispatcher.dispatch_available() == 100
    stats = store.stats()
    assert stats["dispatch_errors"] == 0 and stats["dispatch_skipped_bytes"] == 0 and stats["dispatch_batches"] >= 5
    assert store.get_max_offset_in_queue("T", 0) == 100


# -- the compiled getMessage against its pure-Python twin (mqstore.twin.reads) -----------------------

TWIN_TAGS = [None, "*", "A", "A || C", "B||C", "Z", " A || Z "]


@pytest.fixture(scope="module")
def twin_store(tmp_path_factory):
    """Two queues over several ConsumeQueue files, the first CommitLog files deleted."""
    root = str(tmp_path_factory.mktemp("twin") / "store")
    store = MessageStore(root, mapped_file_size_commit_log=4096, max_message_size=2048, **CFG)
    for i in range(400):
        msg = Message("T", b"t" * (i % 90) + b"-%d" % i, queue_id=i % 2, properties={"TAGS": "ABC"[i % 3]})
        store.put_message(msg).check()
    assert store.wait_dispatched()
    assert store.commitlog.queue.delete_expired_file_by_time(0, 0, 0, True) >= 2
    yield store
    store.shutdown()


@given(queue_id=st.sampled_from([0, 1]), offset=st.integers(-2, 205), max_msg_nums=st.integers(-2, 64),
       tags=st.sampled_from(TWIN_TAGS), count_memory=st.integers(1, 40), bytes_memory=st.integers(100, 6000),
       in_memory=st.sampled_from([0, 3000, 1 << 40]))
def test_get_message_matches_the_twin(twin_store, queue_id, offset, max_msg_nums, tags, count_memory,
                                      bytes_memory, in_memory):
    from mqstore.twin.reads import Limits, get_message as twin_get_message

    store = twin_store
    reader = store.reader
    reader.config = store.config.replace(max_transfer_count_on_message_in_memory=count_memory,
                                         max_transfer_bytes_on_message_in_memory=bytes_memory)
    reader.in_memory_limit = in_memory
    cq = store.consume_queues.get("T", queue_id)
    lm = reader.log_map()
    units = [cq.unit(q) for q in range(cq.max_offset_in_queue)]
    cfg = reader.config
    limits = Limits(min_phy=store.get_min_phy_offset(), max_phy=store.get_max_phy_offset(),
                    log_file_size=store.config.mapped_file_size_commit_log, in_memory=in_memory,
                    max_bytes_memory=bytes_memory, max_count_memory=count_memory,
                    max_bytes_disk=cfg.max_transfer_bytes_on_message_in_disk,
                    max_count_disk=cfg.max_transfer_count_on_message_in_disk)
    codes = reader.tag_codes(tags)
    want = twin_get_message(units, cq.min_offset_in_queue, cq.max_offset_in_queue, CQ_UNITS, offset, max_msg_nums,
                            codes, limits, lambda phy, size: lm.file_of(phy) is not None and phy >= lm.first_from)
    got = store.get_message("g", "T", queue_id, offset, max_msg_nums, tags=tags)
    assert (got.status, got.next_begin_offset, got.physical_offsets, got.buffer_total_size) == \
        (want.status, want.next_begin_offset, want.physical_offsets, want.buffer_total_size)
    assert got.suggest_pulling_from_slave == want.suggest_pulling_from_slave
    expected_codes = None if tags is None or tags.strip() in ("", "*") else \
        frozenset(java_string_hash(t.strip()) for t in tags.split("||") if t.strip())
    assert codes == expected_codes


@st.composite
def _unit_runs(draw):
    """ConsumeQueue file bytes: mostly ordered real units, with fillers, overlaps and a zero tail."""
    units, phy = [], draw(st.integers(0, 1 << 40))
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["next", "next", "next", "filler", "back", "gap"]))
        size = draw(st.integers(1, 5000))
        if kind == "filler":
            units.append((0, 0x7FFFFFFF, 0))
            continue
        if kind == "back":
            phy = max(0, phy - draw(st.integers(1, 6000)))
        elif kind == "gap":
            phy += draw(st.integers(1, 1 << 20))
        units.append((phy, size, draw(st.integers(-(1 << 63), (1 << 63) - 1))))
        phy += size
    data = b"".join(struct.pack(">qiq", *u) for u in units) + bytes(20 * draw(st.integers(0, 3)))
    return data, draw(st.integers(0, len(data) + 30))


@given(_unit_runs(), st.integers(0, 1 << 30), st.integers(-1, 1 << 41), st.integers(-1, 1 << 30))
def test_order_break_matches_the_twin(run, file_from, prev_end, prev_pos):
    from mqstore.queue._consumequeue import order_break
    from mqstore.twin.consume_queue import order_break as twin_order_break
    data, end = run
    file_from -= file_from % 20
    assert order_break(data, end, file_from, prev_end, prev_pos) == twin_order_break(data, end, file_from, prev_end,
                                                                                      prev_pos)


def test_units_in_older_queue_files_are_read_in_c_and_their_map_goes_with_the_files(tmp_path):
    """A queue over several ConsumeQueue files: reads in the files before the current one go
    through a LogMap of the queue's files kept on the queue (not a Python file search per
    call), give what the current-file path gives, and the map is dropped when files go."""
    root = str(tmp_path / "store")
    with MessageStore(root, mapped_file_size_consume_queue=UNIT * 50, mapped_file_size_commit_log=64 * 1024) as store:
        for i in range(400):
            store.put_message(Message("T", b"m%d" % i, tags="even" if i % 2 == 0 else "odd")).check()
        store.wait_dispatched()
        cq = store.consume_queues.get("T", 0)
        assert len(cq.files.files) == 8 and cq.queue_map is None
        assert bytes(store.look_message_by_queue_offset("T", 0, 7).body) == b"m7"
        assert cq.queue_map is not None and len(cq.queue_map) == 8
        kept = cq.queue_map
        for start in (0, 45, 49, 50, 120, 349):
            got = store.read_messages("T", 0, start, 60)
            assert got.bodies() == [b"m%d" % i for i in range(start, min(start + 60, (start // 50 + 1) * 50))]
            evens = store.get_message("g", "T", 0, start, 32, tags="even")
            assert all(int(bytes(m.body)[1:]) % 2 == 0 for m in evens)
            assert len(evens) > 0 or start % 50 == 49  # a get ends at its file's end (49: odd)
            assert store.get_message_store_timestamp("T", 0, start) > 0
        assert cq.queue_map is kept  # reused while the file list is the same
        store.put_message(Message("T", b"more")).check()
        store.wait_dispatched()
        assert bytes(store.look_message_by_queue_offset("T", 0, 3).body) == b"m3"
        cq._forget_queue_map()  # what a removal of files calls
        assert cq.queue_map is None
        assert bytes(store.look_message_by_queue_offset("T", 0, 3).body) == b"m3"
