"""The bulk jobs on Spark (issue 5): rebuilding ConsumeQueues and IndexFiles from the CommitLog
(compared byte for byte with what the dispatcher built), per-queue statistics and the Parquet
export, on an mqstore store and on one with only RocketMQ's files; the command."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys

import pytest

from mqstore import Message, MessageStore, StoreLockedError
from mqstore.tools.checker import check_store
from mqstore.spark.jobs import export_parquet, queue_stats, rebuild_queues

pytestmark = pytest.mark.spark

CFG = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 200,
       "max_hash_slot_num": 512, "max_index_num": 2048}


def _fill(store: MessageStore, n: int) -> None:
    for i in range(n):
        props = {"DELAY": "2"} if i % 97 == 0 else None  # delay messages: tags code = delivery time
        store.put_message(Message(f"T{i % 3}", b"x" * (i % 90), queue_id=i % 4, tags=f"t{i % 5}" if i % 7 else None,
                                  keys=f"k{i} j{i}" if i % 2 else None, properties=props)).check()


def _same_tree(a: str, b: str) -> None:
    """Every file of a and b has the same name and bytes."""
    names_a = sorted(os.path.relpath(os.path.join(d, f), a) for d, _, fs in os.walk(a) for f in fs)
    names_b = sorted(os.path.relpath(os.path.join(d, f), b) for d, _, fs in os.walk(b) for f in fs)
    assert names_a == names_b
    _, mismatch, errors = filecmp.cmpfiles(a, b, names_a, shallow=False)
    assert mismatch == errors == []


def _same_index(a: str, b: str) -> None:
    """Index files in name order hold the same bytes (their names are creation times)."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert len(fa) == len(fb) > 1  # the index rolled over at least once
    for x, y in zip(fa, fb):
        assert filecmp.cmp(os.path.join(a, x), os.path.join(b, y), shallow=False), (x, y)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("jobs") / "store")
    with MessageStore(root, **CFG) as s:
        _fill(s, 6000)
    return root


def test_a_rebuild_gives_the_dispatchers_queues_and_index_byte_for_byte(spark, store, tmp_path):
    out = str(tmp_path / "out")
    report = rebuild_queues(spark, store, out=out)
    assert (report.units, report.queues) == (6000, 12 + 1)  # the delay level's SCHEDULE_TOPIC queue
    assert report.commitlog_files == len(os.listdir(os.path.join(store, "commitlog")))
    _same_tree(os.path.join(store, "consumequeue"), os.path.join(out, "consumequeue"))
    _same_index(os.path.join(store, "index"), os.path.join(out, "index"))


def test_a_rebuild_in_place_replaces_lost_queues_and_the_store_reads_again(spark, store, tmp_path):
    root = str(tmp_path / "copy")
    shutil.copytree(store, root)
    shutil.rmtree(os.path.join(root, "consumequeue"))
    shutil.rmtree(os.path.join(root, "index"))
    rebuild_queues(spark, root)
    assert not os.path.exists(os.path.join(root, ".rebuild"))
    _same_tree(os.path.join(store, "consumequeue"), os.path.join(root, "consumequeue"))
    _same_index(os.path.join(store, "index"), os.path.join(root, "index"))
    check_store(root).raise_if_failed()
    with MessageStore(root, **CFG) as s:
        assert s.recovery.redispatched_records == 0
        assert len(s.query_message("T1", "k7", 10, 0, 2**62).messages) == 1


def test_a_rebuild_is_refused_while_a_store_runs_and_into_a_used_directory(spark, tmp_path, store):
    root = str(tmp_path / "live")
    with MessageStore(root, **CFG) as s:
        s.put("T", b"x").check()
        with pytest.raises(StoreLockedError, match="stop it before rebuilding"):
            rebuild_queues(spark, root)
    os.makedirs(tmp_path / "used" / "consumequeue")
    with pytest.raises(Exception, match="a rebuild writes into a fresh directory"):
        rebuild_queues(spark, store, out=str(tmp_path / "used"))


def test_statistics_and_export_agree_with_the_store(spark, store, tmp_path):
    rows = {(r.topic, r.queue_id): r for r in queue_stats(spark, store).collect()}
    with MessageStore(store, **CFG) as s:
        for (topic, q), r in rows.items():
            if topic.startswith("SCHEDULE"):
                continue
            msgs, offset = [], 0
            while (got := s.get_message("g", topic, q, offset, 32)).status.name == "FOUND":
                msgs += [m.decode() for m in got]
                offset = got.next_begin_offset
            assert r.messages == len(msgs) and r.last_offset == len(msgs) - 1
            assert r.bytes == sum(m.total_size for m in msgs)
            assert r.body_bytes == sum(len(m.body) for m in msgs)
            tags = [m.properties.get("TAGS") for m in msgs]
            assert r.untagged == tags.count(None)
            assert r.tag_counts == {t: tags.count(t) for t in set(tags) if t is not None}
    out = str(tmp_path / "pq")
    assert export_parquet(spark, store, out, topics=["T0", "T2"]) == sum(
        r.messages for (t, _), r in rows.items() if t in ("T0", "T2"))
    assert sorted(n for n in os.listdir(out) if n.startswith("topic=")) == ["topic=T0", "topic=T2"]


def test_the_jobs_need_only_rocketmqs_files(spark, tmp_path):
    """A directory as RocketMQ leaves it: no mqstore.config.json, control block, node file or
    clean-close record, and RocketMQ's default ConsumeQueue and index geometry."""
    root = str(tmp_path / "rmq")
    with MessageStore(root, mapped_file_size_commit_log=256 * 1024) as s:
        _fill(s, 1500)
    for name in ("mqstore.config.json", "mqstore.shm", "mqstore.node.json", "mqstore.clean.json"):
        if os.path.exists(os.path.join(root, name)):
            os.unlink(os.path.join(root, name))
    assert sorted(os.listdir(root)) == ["checkpoint", "commitlog", "config", "consumequeue", "index", "lock"] or \
        sorted(os.listdir(root)) == ["checkpoint", "commitlog", "consumequeue", "index", "lock"]
    out = str(tmp_path / "out")
    assert rebuild_queues(spark, root, out=out).units == 1500
    _same_tree(os.path.join(root, "consumequeue"), os.path.join(out, "consumequeue"))
    a, b = sorted(os.listdir(os.path.join(root, "index"))), sorted(os.listdir(os.path.join(out, "index")))
    assert len(a) == len(b) == 1
    assert filecmp.cmp(os.path.join(root, "index", a[0]), os.path.join(out, "index", b[0]), shallow=False)
    assert sum(r.messages for r in queue_stats(spark, root).collect()) == 1500


def test_the_command_prints_statistics_as_json(store):
    proc = subprocess.run([sys.executable, "-m", "mqstore.spark.jobs", "--master", "local[1]", "stats", store,
                           "--topics", "T1", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert [(r["topic"], r["queue_id"]) for r in rows] == [("T1", q) for q in range(4)]
    assert sum(r["messages"] for r in rows) == sum(1 for i in range(6000) if i % 3 == 1 and i % 97)  # not delayed
