"""Crash safety by killing real writer processes with SIGKILL at random points (design.md).

A child process puts messages and prints each acknowledgement; the parent kills it after a
random delay, reopens the store (abnormal recovery: the abort file is there), runs the
invariant checker and looks up every acknowledged message at its physical offset.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore import Message, MessageStore
from mqstore.log._codec import decode_record
from mqstore.tools.checker import check_store
from mqstore.config import StoreConfig
from helpers_store import read_queue as read_all_of_queue

pytestmark = pytest.mark.multiprocess

WRITER = textwrap.dedent("""
    import sys
    from mqstore import MessageStore, Message
    root, flush, lock, batch = sys.argv[1], sys.argv[2], sys.argv[3] == "mutex", int(sys.argv[4])
    store = MessageStore(root, mapped_file_size_commit_log=65536, max_message_size=16384,
                         flush_disk_type=flush, use_reentrant_lock_when_put_message=lock)
    out = sys.stdout
    i = int(sys.argv[5])
    out.write("READY\\n"); out.flush()
    while True:
        if batch:
            msgs = [Message("C", b"%d-" % (i + k) + b"p" * ((i + k) % 300), queue_id=(i % 3)) for k in range(batch)]
            r = store.put_messages(msgs)
            n = batch
        else:
            r = store.put_message(Message("C", b"%d-" % i + b"p" * (i % 300), queue_id=i % 3))
            n = 1
        if r.ok:
            out.write(f"{i} {n} {r.wrote_offset} {r.queue_offset}\\n"); out.flush()
        i += n
""")


def run_and_kill(root: str, flush: str, lock: str, batch: int, start: int, delay: float) -> list[tuple[int, int, int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, root, flush, lock, str(batch), str(start)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    acks = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4:  # the last line may be cut by the kill
            acks.append(tuple(map(int, parts)))
    return acks


def verify_acknowledged(root: str, acks) -> int:
    with MessageStore(root, mapped_file_size_commit_log=65536, max_message_size=16384) as store:
        assert not store.last_exit_ok  # the abort file survived the kill
        queue = store.commitlog.queue
        for i, n, phy, qoff in acks:
            for k in range(n):
                mf = queue.find_mapped_file_by_offset(phy)
                assert mf is not None, f"acknowledged message {i + k} at {phy} is gone"
                view = mf.view(phy - mf.file_from, mf.file_size - (phy - mf.file_from))
                try:
                    rec = decode_record(view)
                finally:
                    view.release()
                assert rec.body.startswith(b"%d-" % (i + k)) and rec.queue_offset == qoff + k
                phy += rec.total_size
        next_start = max((i + n for i, n, _, _ in acks), default=0) + 10_000
    check_store(root).raise_if_failed()
    return next_start


@pytest.mark.parametrize("flush,lock,batch", [
    ("SYNC_FLUSH", "mutex", 0), ("ASYNC_FLUSH", "spin", 0), ("ASYNC_FLUSH", "mutex", 5), ("SYNC_FLUSH", "spin", 4)])
def test_sigkill_writer_at_random_points(tmp_path, flush, lock, batch):
    rng = random.Random(f"{flush}{lock}{batch}")
    root = str(tmp_path / "store")
    start = 0
    total = 0
    for _ in range(3):
        acks = run_and_kill(root, flush, lock, batch, start, rng.uniform(0.05, 0.6))
        total += len(acks)
        start = verify_acknowledged(root, acks)
    assert total > 0
    report = check_store(root).raise_if_failed()
    assert all(s.first_offset == 0 for s in report.queues.values())


def test_sigkill_while_holding_the_put_lock(tmp_path):
    """A process dies inside the lock: the store is rebuilt on reopen and nothing is lost."""
    root = str(tmp_path / "store")
    code = textwrap.dedent(f"""
        import os, signal
        from mqstore import MessageStore, Message
        s = MessageStore({root!r}, mapped_file_size_commit_log=65536)
        for i in range(100):
            s.put_message(Message("L", b"%d" % i)).check()
        s.ctl.acquire_put_lock()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], timeout=60)
    with MessageStore(root, mapped_file_size_commit_log=65536) as store:
        assert store.recovery.records == 100
        assert store.put_message(Message("L", b"after")).check().queue_offset == 100
    check_store(root).raise_if_failed()


# -- the read path after a kill: several topics and queues, dispatch running ------------------------

RP_TOPICS = ("TA", "TB", "TC")
RP_QUEUES = 4
#: small files so that the CommitLog, the ConsumeQueues and the index all roll during a round;
#: the ConsumeQueue flush and the checkpoint run every few ms, so a crash finds them anywhere
RP_CONFIG = {
    "mapped_file_size_commit_log": 64 * 1024,
    "max_message_size": 16 * 1024,
    "mapped_file_size_consume_queue": 64 * 20,
    "max_hash_slot_num": 64,
    "max_index_num": 400,
    "message_index_safe": True,
    "flush_interval_consume_queue": 5,
    "flush_consume_queue_least_pages": 0,
    "flush_consume_queue_thorough_interval": 20,
}

RP_WRITER = textwrap.dedent("""
    import json, os, random, signal, sys, time
    from mqstore import Message, MessageStore
    a = json.loads(sys.argv[1])
    rng = random.Random(a["seed"])
    out = sys.stdout
    topics, nq, seq, mode = a["topics"], a["queues"], a["start"], a["mode"]

    refused = {}  # puts not stored, by status (printed before the kill, for the test's message)

    def die():
        for status, count in refused.items():
            out.write("REFUSED_%s %d\\n" % (status, count))
        out.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "cq_flush":
        # die inside the ConsumeQueue flush service: after some queues were flushed, not all
        from mqstore.queue import consume_queue
        real_flush, flushed = consume_queue.ConsumeQueue.flush, [0]
        def flush(self, least_pages=0):
            done = real_flush(self, least_pages)
            flushed[0] += done
            if flushed[0] >= a["kill_after"]:
                die()
            return done
        consume_queue.ConsumeQueue.flush = flush
    elif mode == "at_roll":
        # die at a CommitLog file roll: the blank that ends the full file is written, the write
        # position is at the next file, which does not exist yet (nothing is allocated ahead)
        from mqstore.log import commitlog
        from mqstore.services import allocate
        allocate.AllocateMappedFileService.prefetch = lambda self, offset: None
        real_provide, rolls = commitlog.CommitLog._provide_file, [0]
        def provide(self, offset):
            if offset and offset % self.file_size == 0 and self.queue.get(offset) is None:
                rolls[0] += 1
                if rolls[0] >= a["rolls"]:
                    die()
            return real_provide(self, offset)
        commitlog.CommitLog._provide_file = provide
    elif mode == "checkpoint":
        # die while the checkpoint is written (its fields set, not yet flushed)
        from mqstore.log import checkpoint
        real_cp_flush, calls = checkpoint.StoreCheckpoint.flush, [0]
        def cp_flush(self):
            calls[0] += 1
            if calls[0] >= a["kill_after"]:
                die()
            real_cp_flush(self)
        checkpoint.StoreCheckpoint.flush = cp_flush

    store = MessageStore(a["root"], flush_disk_type=a["flush"], **a["config"])
    fs = store.config.mapped_file_size_commit_log

    def message(topic, qid, s):
        body = ("%s|%d|%d|" % (topic, qid, s)).encode() + b"x" * rng.randrange(0, 700)
        return Message(topic, body, queue_id=qid, keys=["k%d" % s], tags="t%d" % (s % 3))

    def put_one():
        global seq
        topic, qid = rng.choice(topics), rng.randrange(nq)
        n = rng.choice((1, 1, 1, 3, 8)) if a["batches"] else 1
        msgs = [message(topic, qid, seq + k) for k in range(n)]
        r = store.put_messages(msgs) if n > 1 else store.put_message(msgs[0])
        if r.ok:
            out.write("A %s %d %d %d %d %d\\n" % (topic, qid, r.queue_offset, r.wrote_offset, seq, n))
            if a["ack_each"]:
                out.flush()
        else:
            refused[r.status.name] = refused.get(r.status.name, 0) + 1
        seq += n
        return r

    out.write("READY\\n"); out.flush()
    if mode == "burst":
        # a burst of batches in one thread: dispatch runs behind; die before it catches up
        for _ in range(a["burst"]):
            put_one()
        out.write("BEHIND %d\\n" % store.dispatch_behind_bytes)
        die()
    if mode == "roll":
        # die right after the put that opened a new CommitLog file
        rolls = 0
        first = put_one().wrote_offset // fs
        while True:
            r = put_one()
            if r.ok and r.wrote_offset // fs > first:
                first = r.wrote_offset // fs
                rolls += 1
                if rolls >= a["rolls"]:
                    out.write("ROLLED %d\\n" % r.wrote_offset)
                    die()
    for _ in range(a.get("pause_after", 0)):
        put_one()
    if a.get("pause"):
        # let the flush services write a checkpoint older than what follows by more than the
        # 3 s margin of spec §5.1, so the abnormal recovery starts at a later CommitLog file
        out.write("PAUSED %d\\n" % store.max_phy_offset)
        out.flush()
        time.sleep(a["pause"])
    while True:
        put_one()
""")


def rp_write(root: str, flush: str, mode: str, rng: random.Random, start: int, *, delay: float | None = None,
             **extra) -> tuple[list[tuple[str, int, int, int, int, int]], dict[str, int]]:
    """Run RP_WRITER until it dies (SIGKILL: sent by us after delay, or by itself at its chosen
    point); returns the acknowledged puts (topic, qid, queue_offset, phy, seq, n) and what it
    reported (BEHIND, ROLLED, PAUSED)."""
    args = {"root": root, "flush": flush, "mode": mode, "seed": rng.random(), "start": start,
            "topics": RP_TOPICS, "queues": RP_QUEUES, "config": RP_CONFIG, "batches": True,
            "ack_each": delay is not None, **extra}
    proc = subprocess.Popen([sys.executable, "-c", RP_WRITER, json.dumps(args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        if delay is not None:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"writer exited with {proc.returncode}: {err}"
    acks, info = [], {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "A" and len(parts) == 7:  # the last line may be cut by the kill
            acks.append((parts[1], *map(int, parts[2:])))
        elif len(parts) == 2 and (parts[0] in ("BEHIND", "ROLLED", "PAUSED") or parts[0].startswith("REFUSED_")):
            info[parts[0]] = int(parts[1])
    if not acks:
        info["stderr_tail"] = err[-2000:]  # type: ignore[assignment]
    return acks, info


def units_on_disk(root: str) -> dict[tuple[str, int], int]:
    """Units each ConsumeQueue holds on disk (read before the store is reopened)."""
    from mqstore.queue._consumequeue import scan_units
    found = {}
    base = os.path.join(root, "consumequeue")
    for topic in os.listdir(base) if os.path.isdir(base) else ():
        for qid in os.listdir(os.path.join(base, topic)):
            d = os.path.join(base, topic, qid)
            total = 0
            for name in sorted(os.listdir(d)):
                with open(os.path.join(d, name), "rb") as fh:
                    data = fh.read()
                end, _ = scan_units(data, 0, len(data))
                total += end // 20
                if end < len(data):
                    break
            found[(topic, int(qid))] = total
    return found


def read_queue(store: MessageStore, topic: str, qid: int) -> list:
    """Every message of a queue (helpers_store.read_queue) with the queue offsets checked:
    from 0, consecutive (no gap, no duplicate), each in its queue, nothing after the last."""
    from mqstore.status import GetMessageStatus
    assert store.get_min_offset_in_queue(topic, qid) == 0, f"{topic}/{qid} starts late"
    got = read_all_of_queue(store, topic, qid)
    assert all((m.topic, m.queue_id) == (topic, qid) for m in got)
    hi = store.get_max_offset_in_queue(topic, qid)
    assert [m.queue_offset for m in got] == list(range(hi)), f"{topic}/{qid}: offsets not consecutive"
    assert store.get_message("g", topic, qid, hi, 32).status == GetMessageStatus.OFFSET_OVERFLOW_ONE
    return got


def check_crash_state(root: str):
    """check_store on the files as the kill left them (before recovery; a torn tail allowed)."""
    report = check_store(root, allow_torn_tail=True, config=StoreConfig(**RP_CONFIG))
    assert not report.problems, "\n".join(map(str, report.problems[:20]))
    return report


def verify_read_path(root: str, acks, *, flush: str, rng: random.Random, new_puts: bool = True) -> dict:
    """Reopen after a kill and check every queue through the read path (see read_queue); every
    acknowledged message is at its acknowledged queue offset with its body (SIGKILL keeps the
    page cache, so this holds for ASYNC_FLUSH too; SYNC_FLUSH guarantees it beyond that); keys
    of acknowledged messages are found by query_message; new puts get the next queue offsets.
    Returns the recovery report as a dict."""
    check_crash_state(root)
    acked = {}
    for topic, qid, qoff, phy, seq, n in acks:
        for k in range(n):
            acked[(topic, qid, qoff + k)] = (seq + k, phy if k == 0 else None)
    with MessageStore(root, flush_disk_type=flush, **RP_CONFIG) as store:
        assert not store.last_exit_ok  # the abort file survived the kill
        report = store.recovery.to_dict()
        queues = {(cq.topic, cq.queue_id) for cq in store.consume_queues}
        assert {(t, q) for t, q, _ in acked} <= queues
        for topic, qid in sorted(queues):
            for m in read_queue(store, topic, qid):
                body = bytes(m.body)
                head = body.split(b"|")
                assert head[0].decode() == topic and int(head[1]) == qid, f"{topic}/{qid}: body {body[:40]!r}"
                want = acked.pop((topic, qid, m.queue_offset), None)
                if want is not None:
                    assert int(head[2]) == want[0], f"{topic}/{qid}@{m.queue_offset}: seq {head[2]}, acked {want[0]}"
                    assert want[1] is None or m.physical_offset == want[1]
        assert not acked, f"{len(acked)} acknowledged messages are missing, e.g. {sorted(acked)[:5]}"
        for topic, qid, qoff, phy, seq, n in rng.sample(acks, min(len(acks), 20)):
            hits = store.query_message(topic, f"k{seq}").messages
            assert [m.physical_offset for m in hits] == [phy], f"key k{seq} of {topic}/{qid}@{qoff}"
        if new_puts:
            for topic in RP_TOPICS:
                for qid in range(RP_QUEUES):
                    expect = store.get_max_offset_in_queue(topic, qid)
                    assert store.next_queue_offset(topic, qid) == expect
                    body = f"{topic}|{qid}|-1|after".encode()
                    r = store.put_message(Message(topic, body, queue_id=qid, keys=["after"])).check()
                    assert r.queue_offset == expect
            assert store.wait_dispatched()
            for topic in RP_TOPICS:
                for qid in range(RP_QUEUES):
                    assert bytes(read_queue(store, topic, qid)[-1].body).endswith(b"|after")
    check_store(root, config=StoreConfig(**RP_CONFIG)).raise_if_failed()
    return report


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_sigkill_at_random_points_read_path(tmp_path, flush):
    """Writers of three topics x four queues (single puts and batches) killed at random delays;
    after each kill every queue reads back whole through get_message."""
    rng = random.Random(f"read-path-{flush}")
    root = str(tmp_path / "store")
    total = 0
    for round_no in range(3):
        acks, _ = rp_write(root, flush, "random", rng, round_no * 1_000_000, delay=rng.uniform(0.1, 0.7))
        total += len(acks)
        verify_read_path(root, acks, flush=flush, rng=rng)
    assert total > 0


def test_sigkill_while_dispatch_is_behind(tmp_path):
    """A burst of batches, then SIGKILL before the dispatcher caught up: the queues lack units
    on disk, recovery re-dispatches them and every queue reads back whole."""
    rng = random.Random("dispatch-behind")
    root = str(tmp_path / "store")
    lagged = 0
    for round_no in range(3):
        acks, info = rp_write(root, "ASYNC_FLUSH", "burst", rng, round_no * 1_000_000, burst=rng.randrange(300, 600))
        assert acks and "BEHIND" in info
        on_disk = units_on_disk(root)
        in_log = {}
        for topic, qid, qoff, _, _, n in acks:
            in_log[(topic, qid)] = max(in_log.get((topic, qid), 0), qoff + n)
        behind = sum(max(0, n - on_disk.get(key, 0)) for key, n in in_log.items())
        lagged += behind > 0
        report = verify_read_path(root, acks, flush="ASYNC_FLUSH", rng=rng)
        if behind:
            assert report["redispatched_records"] >= behind
    assert lagged, "the dispatcher was never behind at the kill: the test did not test that"


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_sigkill_right_after_a_commitlog_file_roll(tmp_path, flush):
    """Killed right after the put that opened a new CommitLog file, and (second round) at the
    roll itself: the full file's blank written, the next file not created yet."""
    rng = random.Random(f"roll-{flush}")
    root = str(tmp_path / "store")
    fs = RP_CONFIG["mapped_file_size_commit_log"]
    for round_no in range(2):
        acks, info = rp_write(root, flush, "roll", rng, round_no * 1_000_000, rolls=rng.randrange(1, 3))
        assert info["ROLLED"] % fs == 0  # the put that opened a new file
        assert max(phy for _, _, _, phy, _, _ in acks) == info["ROLLED"]  # it died right after that put
        verify_read_path(root, acks, flush=flush, rng=rng)
        acks, _ = rp_write(root, flush, "at_roll", rng, round_no * 1_000_000 + 500_000, rolls=rng.randrange(1, 3))
        end = max(phy + 1 for _, _, _, phy, _, _ in acks)
        assert not os.path.exists(os.path.join(root, "commitlog", f"{end - end % fs + fs:020d}"))
        verify_read_path(root, acks, flush=flush, rng=rng)


def test_crash_state_at_a_roll_passes_the_checker(tmp_path):
    root = str(tmp_path / "store")
    acks, info = rp_write(root, "ASYNC_FLUSH", "at_roll", random.Random("at-roll"), 0, rolls=1)
    assert acks, info  # no put stored before the first roll: the refusals and the writer's stderr say why
    check_crash_state(root)


@pytest.mark.parametrize("mode", ["cq_flush", "checkpoint"])
def test_sigkill_inside_the_consume_queue_flush(tmp_path, mode):
    """SIGKILL inside the ConsumeQueue flush service: after some queues were flushed (not all),
    or while the checkpoint is being written."""
    rng = random.Random(f"flush-{mode}")
    root = str(tmp_path / "store")
    for round_no in range(2):
        acks, _ = rp_write(root, "ASYNC_FLUSH", mode, rng, round_no * 1_000_000, ack_each=True,
                           kill_after=rng.randrange(3, 30))
        assert acks
        verify_read_path(root, acks, flush="ASYNC_FLUSH", rng=rng)


def test_store_killed_repeatedly_keeps_every_queue_whole(tmp_path):
    """Five rounds of write, SIGKILL, reopen, verify (and write more) on one store; the
    kinds of kill alternate. In the last round the writer pauses long enough for the
    checkpoint to fall behind: the abnormal recovery then scans from a later CommitLog file,
    and still rebuilds every queue."""
    rng = random.Random("repeated")
    root = str(tmp_path / "store")
    plans = [("random", "SYNC_FLUSH", {"delay": rng.uniform(0.1, 0.5)}), ("burst", "ASYNC_FLUSH", {"burst": 300}),
             ("roll", "SYNC_FLUSH", {"rolls": 1}), ("cq_flush", "ASYNC_FLUSH", {"ack_each": True, "kill_after": 10}),
             ("random", "ASYNC_FLUSH", {"delay": 3.3 + rng.uniform(0.8, 1.1), "pause_after": 300, "pause": 3.3})]
    seen = 0
    for round_no, (mode, flush, extra) in enumerate(plans):
        acks, info = rp_write(root, flush, mode, rng, round_no * 1_000_000, **extra)
        seen += len(acks)
        report = verify_read_path(root, acks, flush=flush, rng=rng)
        if "PAUSED" in info:
            assert int(report["first_file_scanned"]) > 0, report
            assert int(report["first_file_scanned"]) <= info["PAUSED"]
    with MessageStore(root, **RP_CONFIG) as store:
        assert store.last_exit_ok
        count = sum(store.get_max_offset_in_queue(t, q) for t in RP_TOPICS for q in range(RP_QUEUES))
        assert count >= seen + len(plans) * len(RP_TOPICS) * RP_QUEUES
