"""Crash safety by killing real writer processes with SIGKILL at random points (design.md).

A child process puts messages and prints each acknowledgement; the parent kills it after a
random delay, reopens the store (abnormal recovery: the abort file is there), runs the
invariant checker and looks up every acknowledged message at its physical offset.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore import Message, MessageStore
from mqstore._codec import decode_record
from mqstore.checker import check_store

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
