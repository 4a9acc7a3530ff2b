"""The concurrent dispatch (spec §10.2) on real stores: the ConsumeQueue files and the index it
builds are the serial mode's, byte for byte; re-dispatch is idempotent; a store it wrote
passes the checker after reopening; and the arrival notification follows
long_polling_enable (spec §12)."""

from __future__ import annotations

import os
import random
import shutil
import threading

import pytest

from mqstore import Message, MessageStore
from mqstore.tools.checker import check_store

# 64 KiB CommitLog files (a blank at the end of each), 50 units per ConsumeQueue file, and
# index files of 300 entries, so that every kind of file rolls many times
CFG = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024,
       "mapped_file_size_consume_queue": 50 * 20, "max_hash_slot_num": 64, "max_index_num": 300}
TOPICS = ["T0", "T1", "T%|_2", "Topic-with-a-longer-name"]


def message(i: int, rng: random.Random) -> Message:
    props: dict[str, str] = {}
    if i % 3:
        props["TAGS"] = rng.choice(["A", "B", "täg", "C"])
    if i % 4 == 0:
        props["DELAY"] = str(rng.randrange(0, 5))  # goes to SCHEDULE_TOPIC_XXXX
    keys = rng.choice([None, [f"k{i}"], [f"k{i}", "shared", "ключ"], ["  ", f"x{i % 7}"]])
    sys_flag = rng.choice([0, 0, 0, 0x4, 0x8, 0xC])  # prepared and rollback get no unit
    return Message(rng.choice(TOPICS), os.urandom(rng.choice([0, 10, 100, 900, 3000])), queue_id=rng.randrange(3),
                   properties=props or None, keys=keys, sys_flag=sys_flag)


def all_keys() -> list[str]:
    return ["shared", "ключ", *[f"k{i}" for i in range(0, 1200, 37)], *[f"x{i}" for i in range(7)]]


@pytest.fixture(scope="module")
def written_log(tmp_path_factory):
    """A store of ~1200 messages (single puts and batches) written with the serial reput."""
    root = str(tmp_path_factory.mktemp("log") / "store")
    rng = random.Random(20)
    with MessageStore(root, **CFG) as store:
        i = 0
        while i < 1200:
            if i % 50 == 0:
                batch = [Message("T1", b"batched-%d" % j, queue_id=2, keys=[f"k{i + j}"]) for j in range(8)]
                store.put_messages(batch).check()
                i += 8
            else:
                store.put_message(message(i, rng)).check()
                i += 1
        assert store.wait_dispatched()
    return root


def files_under(root: str, sub: str) -> dict[str, bytes]:
    out = {}
    for where, _, names in os.walk(os.path.join(root, sub)):
        for name in names:
            path = os.path.join(where, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def index_files(root: str) -> list[bytes]:
    """Index files in name order (their names are creation times, so only the order counts)."""
    d = os.path.join(root, "index")
    return [open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))]


def rebuilt(log_root: str, dst: str, **mode) -> tuple[dict[str, bytes], list[bytes], dict[tuple[str, str], list[int]]]:
    """A copy of the log with ConsumeQueues and index deleted, opened in mode (the open
    re-dispatches everything and raises the topic-queue table): the files and key queries."""
    shutil.copytree(log_root, dst)
    shutil.rmtree(os.path.join(dst, "consumequeue"))
    shutil.rmtree(os.path.join(dst, "index"))
    with MessageStore(dst, **CFG, **mode) as store:
        assert store.recovery.redispatched_records > 1000
        queries = {(t, k): [m.physical_offset for m in store.query_message(t, k, 64).messages] for t in TOPICS for k in all_keys()}
        table = {(t, q): store.next_queue_offset(t, q) for t in TOPICS for q in range(3)}
    check_store(dst, config=store.config).raise_if_failed()
    return files_under(dst, "consumequeue"), index_files(dst), {**queries, **{k: [v] for k, v in table.items()}}


@pytest.mark.parametrize("batch_bytes,threads", [(1, 3), (700, 1), (700, 4), (64 * 1024, 2), (4 << 20, 16)],
                         ids=["one-record-batches", "700B-1thread", "700B-4threads", "file-sized", "default"])
def test_concurrent_dispatch_builds_the_serial_files(written_log, tmp_path, batch_bytes, threads):
    online = files_under(written_log, "consumequeue"), index_files(written_log)
    serial = rebuilt(written_log, str(tmp_path / "serial"))
    concurrent = rebuilt(written_log, str(tmp_path / "concurrent"), enable_build_consume_queue_concurrently=True,
                         dispatch_batch_bytes=batch_bytes, batch_dispatch_request_thread_pool_nums=threads)
    assert concurrent[0] == serial[0] == online[0]  # every ConsumeQueue file, byte for byte
    assert concurrent[1] == serial[1] == online[1]  # every index file, in order
    assert concurrent[2] == serial[2]  # key queries and the rebuilt topic-queue table
    assert any(serial[2][(t, "shared")] for t in TOPICS) and len(serial[1]) > 3


def test_concurrent_redispatch_is_idempotent(written_log, tmp_path):
    root = str(tmp_path / "store")
    shutil.copytree(written_log, root)
    with MessageStore(root, **CFG, enable_build_consume_queue_concurrently=True, dispatch_batch_bytes=2000) as store:
        store.reput.shutdown()
        store.consume_queues.flush()
        queries = {(t, k): [m.physical_offset for m in store.query_message(t, k, 64).messages] for t in TOPICS for k in all_keys()}
        before = files_under(root, "consumequeue")
        stats = store.stats()
        store.dispatcher.reset(0)  # replay the whole log through the batches
        assert store.dispatcher.dispatch_available() > 1000
        store.consume_queues.flush()
        assert files_under(root, "consumequeue") == before
        # (like build_index, the keys of the newest indexed message are put again: queries dedupe them)
        assert {(t, k): [m.physical_offset for m in store.query_message(t, k, 64).messages]
                for t in TOPICS for k in all_keys()} == queries
        after = store.stats()
        assert after["dispatch_units"] == stats["dispatch_units"]  # nothing appended twice
        assert after["dispatch_batches"] - stats["dispatch_batches"] > 30


def test_store_written_in_concurrent_mode_reopens_clean(open_store, store_dir):
    cfg = {**CFG, "enable_build_consume_queue_concurrently": True, "dispatch_batch_bytes": 3000}
    store = open_store(**cfg)
    rng = random.Random(3)
    writers = [threading.Thread(target=lambda k=k: [store.put_message(message(k * 1000 + i, rng)).check()
                                                    for i in range(300)]) for k in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert store.wait_dispatched()
    table = {(t, q): store.next_queue_offset(t, q) for t in TOPICS for q in range(3)}
    store.shutdown()
    check_store(store_dir, config=store.config).raise_if_failed()
    again = open_store(**cfg)  # checked once more when the test ends
    assert {(t, q): again.get_max_offset_in_queue(t, q) for t in TOPICS for q in range(3)} == table
    assert sum(table.values()) > 300


@pytest.mark.parametrize("damage", ["magic", "lengths"])
def test_a_record_that_does_not_parse_is_skipped_as_in_serial_mode(open_store, damage):
    store = open_store(**CFG)
    store.reput.shutdown()
    results = [store.put_message(Message("T0", b"m" * (i % 300), keys=[f"k{i}"])).check() for i in range(400)]
    bad = results[57]
    fs = store.config.mapped_file_size_commit_log
    mf = store.commitlog.queue.get(bad.wrote_offset - bad.wrote_offset % fs)
    if damage == "magic":  # the cut's pre-check stops at it
        at = bad.wrote_offset % fs + 4
    else:  # PROPERTIESLENGTH: only the parse finds it (lengths disagree with TOTALSIZE)
        view = store.look_message_by_offset(bad.wrote_offset)
        at = bad.wrote_offset % fs + bad.wrote_bytes - 2 - len(view.properties_string.encode())
    original = mf.read(at, 2)
    mf.write_at(at, b"\x7f\x00")
    outcome = {}
    for concurrent in (False, True):
        store.consume_queues.destroy_all()
        store.dispatcher.reset(0)
        store.dispatcher.concurrent = concurrent
        store.dispatcher.batch_bytes = 900
        before = store.stats()
        store.dispatcher.dispatch_available()
        after = store.stats()
        cq = store.consume_queues.get("T0", 0)
        outcome[concurrent] = ([cq.unit(q) for q in range(cq.max_offset_in_queue)], store.dispatcher.dispatched,
                               {k: after[k] - before[k] for k in ("dispatch_errors", "dispatch_skipped_bytes",
                                                                  "dispatch_records")})
    assert outcome[True] == outcome[False]
    units, dispatched, stats = outcome[True]
    assert stats["dispatch_errors"] == 1 and stats["dispatch_skipped_bytes"] > 0
    assert dispatched == store.ctl.get("committed")
    # the rest of the damaged file is skipped (its offsets become fillers), later files are not
    skipped = [q for q, unit in enumerate(units) if unit[1] == 0x7FFFFFFF]
    assert len(units) == 400 and skipped[0] == 57 and 0 < len(skipped) < 400 - 57
    # repair the record and rebuild the queues, for the checker that runs when the test ends
    mf.write_at(at, original)
    store.consume_queues.destroy_all()
    store.dispatcher.reset(0)
    assert store.dispatcher.dispatch_available() == 400


@pytest.mark.parametrize("long_polling", [True, False])
@pytest.mark.parametrize("concurrent", [False, True])
def test_arrival_notification_follows_long_polling_enable(open_store, long_polling, concurrent):
    store = open_store(**{**CFG, "mapped_file_size_commit_log": 1 << 20, "long_polling_enable": long_polling,
                          "enable_build_consume_queue_concurrently": concurrent, "dispatch_batch_bytes": 4096})
    store.reput.shutdown()
    for i in range(300):
        store.put_message(Message("T0", b"x" * 200, queue_id=i % 3)).check()
    seq = store.ctl.channel_seq("dispatched")
    before = store.stats()["dispatch_batches"]
    assert store.dispatcher.dispatch_available() == 300
    batches = store.stats()["dispatch_batches"] - before
    woken = (store.ctl.channel_seq("dispatched") - seq) % (1 << 32)
    if long_polling:
        assert batches > 1 if concurrent else batches >= 1
        assert woken == batches  # one wake-up per applied batch
    else:
        assert woken == 1  # only once caught up, for wait_dispatched()
    assert store.dispatcher.dispatch_available() == 0
    assert (store.ctl.channel_seq("dispatched") - seq) % (1 << 32) == woken  # nothing new, nobody woken
