"""StoreSnapshot: a read-only view of what a store has dispatched, for bulk readers, on a
store shut down cleanly, on a store a node serves, and refused on a crashed one."""

from __future__ import annotations

import os
import struct

import pytest

from mqstore import Message, MessageStore
from mqstore.queue._arrow import BatchColumns
from mqstore.queue.snapshot import StoreNotReadableError, StoreSnapshot
from mqstore.twin import arrow as twin

CFG = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 100}


def _fill(store: MessageStore, n: int, queues: int = 2) -> None:
    for i in range(n):
        store.put_message(Message("T", b"m%d" % i, queue_id=i % queues, keys=[f"k{i}"])).check()


def _bodies(snap: StoreSnapshot, topic: str, queue_id: int, start: int, end: int) -> list[bytes]:
    cols = BatchColumns(["body", "queue_offset"])
    cols.add_units(snap.record_source(), snap.units(topic, queue_id, start, end), snap.min_phy)
    rows = twin.buffers_to_rows(cols.buffers(), cols.rows)
    assert [r["queue_offset"] for r in rows] == list(range(start, start + len(rows)))
    return [r["body"] for r in rows]


def test_a_clean_store_reads_every_queue_to_its_end(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        _fill(store, 1000)
    with StoreSnapshot(root) as snap:
        assert not snap.live
        assert [(q.key, q.min_offset, q.max_offset) for q in snap.queues()] == [("T/0", 0, 500), ("T/1", 0, 500)]
        assert _bodies(snap, "T", 1, 0, 500) == [b"m%d" % i for i in range(1, 1000, 2)]
        spans = snap.log_spans()
        assert spans[0][0] == 0 and len(spans) > 1 and spans[-1][1] == snap.log_end
        cols = BatchColumns(["body"])
        assert sum(cols.add_span(snap.record_source(), a, b)[0] for a, b in spans) == 1000


def test_a_live_node_is_read_up_to_what_its_dispatcher_published(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, service_mode="processes", **CFG) as node:
        _fill(node, 600)
        assert node.wait_dispatched(timeout_ms=10_000)
        with StoreSnapshot(root) as snap:
            assert snap.live
            ranges = {q.key: (q.min_offset, q.max_offset) for q in snap.queues()}
            assert ranges == {"T/0": (0, 300), "T/1": (0, 300)}
            _fill(node, 50)  # written after the snapshot: not in it
            assert {q.key: q.max_offset for q in snap.queues()} == {"T/0": 300, "T/1": 300}
            assert _bodies(snap, "T", 0, 290, 300) == [b"m%d" % i for i in range(580, 600, 2)]


def test_a_crashed_store_is_refused_naming_why(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        _fill(store, 10)
    open(os.path.join(root, "abort"), "w").close()
    with pytest.raises(StoreNotReadableError, match="not shut down cleanly") as err:
        StoreSnapshot(root)
    assert "recovers" in str(err.value.hint)


def test_units_below_the_first_commitlog_file_are_skipped(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        _fill(store, 2000, queues=1)
    first = sorted(os.listdir(os.path.join(root, "commitlog")))[0]
    os.unlink(os.path.join(root, "commitlog", first))  # as retention does
    with StoreSnapshot(root) as snap:
        (q,) = snap.queues()
        assert q.min_offset > 0 and snap.min_phy == 64 * 1024
        unit = snap.units("T", 0, q.min_offset, q.min_offset + 1)
        assert struct.unpack(">qiq", unit)[0] >= snap.min_phy
        assert _bodies(snap, "T", 0, q.min_offset, q.max_offset) == [b"m%d" % i for i in range(q.min_offset, 2000)]


def test_time_lookup_answers_as_the_store_does(tmp_path):
    """offset_by_time over the read-only view gives what MessageStore.get_offset_in_queue_by_time
    gives, across ConsumeQueue files and for times before, inside and after the queue."""
    import time

    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        for burst in range(12):
            for i in range(30):
                store.put_message(Message("T", b"b%d-%d" % (burst, i), queue_id=0)).check()
            time.sleep(0.003)
        times = sorted({store.look_message_by_queue_offset("T", 0, off).store_timestamp for off in range(0, 360, 7)})
        probes = [times[0] - 5, *times, *(t + 1 for t in times), times[-1] + 100]
        expected = {ts: store.get_offset_in_queue_by_time("T", 0, ts) for ts in probes}
    with StoreSnapshot(root) as snap:
        q = snap.queue("T", 0)
        assert {ts: snap.offset_by_time(q, ts) for ts in probes} == expected
    assert len(set(expected.values())) > 5  # the times spread over the queue


def test_a_closed_stores_log_end_comes_from_its_clean_close_record_when_the_files_agree(tmp_path, monkeypatch):
    """The write position of a closed store: its clean-close record's, without reading the
    CommitLog, when the record agrees with the files; the scan's otherwise (record gone, or
    its tail bytes changed), and both give the same end."""
    import json

    from mqstore.layout import CLEAN_CLOSE_NAME
    from mqstore.queue import snapshot as snapshot_module

    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=64 * 1024) as store:
        _fill(store, 1500)
        wrote = store.max_phy_offset
    record = os.path.join(root, CLEAN_CLOSE_NAME)
    assert json.load(open(record))["wrote"] == wrote
    scans: list[int] = []
    real = snapshot_module.log_files
    monkeypatch.setattr(snapshot_module, "log_files", lambda *a: scans.append(1) or real(*a))
    with StoreSnapshot(root) as snap:
        assert snap.log_end == wrote and not scans  # no scan
    data = json.load(open(record))
    data["tail_crc"] ^= 1  # a record that disagrees with the files is not used
    with open(record, "w") as fh:
        json.dump(data, fh)
    with StoreSnapshot(root) as snap:
        assert snap.log_end == wrote and len(scans) == 1
    os.unlink(record)
    with StoreSnapshot(root) as snap:
        assert snap.log_end == wrote and len(scans) == 2
