"""ControlBlock (shared-memory cells, wake-ups, put lock, topic-queue table) and ofd_lock.

Cross-process behaviour is checked with real child processes that attach to the same file.
Timing assertions are generous upper bounds only.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mqstore.log import _shm
from mqstore.log._shm import (
    HEADER_SIZE,
    LOCK_MUTEX,
    LOCK_SPIN,
    SLOT_SIZE,
    STAT_NAMES,
    STATE_BUILDING,
    STATE_CLOSED,
    STATE_READY,
    ControlBlock,
    control_block_size,
    ofd_is_locked,
    ofd_lock,
    ofd_unlock,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ["spin", "mutex"]

_CHILD_PRELUDE = """\
import os, sys, time
from mqstore.log._shm import ControlBlock, ofd_lock
def say(s):
    print(s, flush=True)
def hear():
    return sys.stdin.readline().strip()
"""


class Child:
    """A child Python talking line by line over stdin/stdout."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD_PRELUDE + textwrap.dedent(code)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"child said nothing within {timeout} s (expected {prefix!r})")
        if line is None or not line.startswith(prefix):
            self.proc.kill()
            pytest.fail(f"child said {line!r}, expected {prefix!r}; stderr:\n{self.proc.stderr.read()}")
        return line

    def silent_for(self, seconds: float) -> bool:
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        self.lines.put(line)
        return False

    def send(self, line: str = "go") -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill9(self) -> None:
        """SIGKILL and reap."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)

    def finish(self, timeout: float = 20.0) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def children():
    started: list[Child] = []

    def start(code: str) -> Child:
        c = Child(code)
        started.append(c)
        return c

    yield start
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
        c.proc.wait(timeout=20)


@pytest.fixture
def make_cb(tmp_path):
    made: list[ControlBlock] = []

    def make(kind: str = "spin", slots: int = 64, name: str = "mqstore.shm", sync_flush: bool = False,
             file_size: int = 1 << 20) -> ControlBlock:
        cb = ControlBlock.create(str(tmp_path / name), table_slots=slots, file_size=file_size, lock_kind=kind,
                                 sync_flush=sync_flush)
        made.append(cb)
        return cb

    yield make
    for cb in made:
        cb.close()


def in_thread(fn, *args):
    """Run fn in a daemon thread; returns (done event, result list)."""
    done = threading.Event()
    out: list = []

    def run():
        try:
            out.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001
            out.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


# -- create / attach --------------------------------------------------------------------------

def test_create_header(make_cb, tmp_path):
    cb = make_cb("mutex", slots=128, sync_flush=True, file_size=12345)
    assert os.listdir(tmp_path) == ["mqstore.shm"], "the temporary file was renamed into place"
    assert cb.size == control_block_size(128) == HEADER_SIZE + 128 * SLOT_SIZE
    assert os.path.getsize(cb.path) == cb.size
    assert os.stat(cb.path).st_blocks * 512 >= cb.size, "allocated up front"
    assert cb.table_slots == 128 and cb.table_count == 0
    assert cb.file_size == 12345
    assert cb.lock_kind == "mutex" and cb.sync_flush is True
    assert cb.owner_pid == os.getpid()
    assert cb.state == STATE_BUILDING and cb.generation == 0
    cb.mark_ready()
    assert cb.state == STATE_READY and cb.generation == 1
    cb.mark_closed()
    assert cb.state == STATE_CLOSED
    assert (LOCK_SPIN, LOCK_MUTEX) == (0, 1)
    spin = make_cb("spin", name="other.shm")
    assert spin.lock_kind == "spin" and spin.sync_flush is False


@pytest.mark.parametrize("slots", [0, 32, 63, 65, 100])
def test_create_rejects_bad_table_slots(tmp_path, slots):
    with pytest.raises(ValueError, match="power of two"):
        ControlBlock.create(str(tmp_path / "c"), table_slots=slots, file_size=1, lock_kind="spin", sync_flush=False)
    assert os.listdir(tmp_path) == []


def test_create_rejects_bad_lock_kind(tmp_path):
    with pytest.raises(ValueError, match="lock_kind"):
        ControlBlock.create(str(tmp_path / "c"), table_slots=64, file_size=1, lock_kind="rw", sync_flush=False)
    assert os.listdir(tmp_path) == []


def test_create_replaces_an_old_block(make_cb):
    old = make_cb()
    old.set("wrote", 999)
    old.table_set("t", 1, 5)
    new = make_cb()
    assert new.get("wrote") == 0 and new.table_get("t", 1) is None
    assert old.get("wrote") == 999, "the old mapping keeps its (now unlinked) file"


def test_attach_sees_the_same_cells(make_cb):
    cb = make_cb("mutex", slots=128, file_size=777)
    cb.set("wrote", 4242)
    cb.table_set("TopicA", 3, 17)
    other = ControlBlock.attach(cb.path)
    try:
        assert other.size == cb.size and other.table_slots == 128 and other.file_size == 777
        assert other.lock_kind == "mutex"
        assert other.get("wrote") == 4242
        assert other.table_get("TopicA", 3) == 17
        other.advance("flushed", 100)
        assert cb.get("flushed") == 100
        other.table_set("TopicB", 0, 1)
        assert cb.table_get("TopicB", 0) == 1 and cb.table_count == 2
    finally:
        other.close()


def test_attach_readonly_reads_live_cells_and_refuses_writes(make_cb):
    """A monitor's attach: O_RDONLY + PROT_READ, so it needs no write permission (the block is
    chmod 0444 here; run as root that shows nothing) and no method of it can change the block."""
    cb = make_cb(file_size=777)
    cb.mark_ready()
    cb.set("wrote", 4242)
    cb.add_stat("put_messages", 3)
    cb.set_running_flag("DISK_FULL")
    os.chmod(cb.path, 0o444)
    ro = ControlBlock.attach(cb.path, readonly=True)
    try:
        assert ro.readonly and not cb.readonly
        assert ro.file_size == 777 and ro.generation == 1 and ro.state == STATE_READY
        assert ro.created_ms == cb.created_ms > 0
        assert ro.positions() == cb.positions() and ro.stats() == cb.stats()
        assert ro.running_flags() == ["DISK_FULL"] and ro.lock_holder is None
        cb.advance("wrote", 5000)
        cb.add_stat("put_messages")
        assert ro.get("wrote") == 5000 and ro.stats()["put_messages"] == 4, "the same shared pages"
        writes = [lambda: ro.set("wrote", 1), lambda: ro.advance("flushed", 1), lambda: ro.add_stat("rolls"),
                  lambda: ro.max_stat("flush_ns_max", 1), lambda: ro.set_stat("rolls", 1),
                  lambda: ro.set_running_flag("DISK_FULL", False), lambda: ro.mark_ready(), lambda: ro.mark_closed(),
                  lambda: ro.notify("flush"), lambda: ro.broadcast("flushed"), lambda: ro.wait_notified("flush", 0),
                  lambda: ro.acquire_put_lock(), lambda: ro.release_put_lock(), lambda: ro.table_set("t", 0, 1)]
        for write in writes:
            with pytest.raises(ValueError, match="attached read-only"):
                write()
        assert cb.positions()["wrote"] == 5000 and cb.state == STATE_READY and cb.running_flags() == ["DISK_FULL"]
    finally:
        ro.close()
        os.chmod(cb.path, 0o644)


def test_attach_rejects_bad_magic(make_cb):
    cb = make_cb()
    with open(cb.path, "r+b") as fh:
        fh.write(b"NOTMAGIC")
    with pytest.raises(ValueError, match="not an mqstore control block"):
        ControlBlock.attach(cb.path)


def test_attach_rejects_other_layout_version(make_cb):
    cb = make_cb()
    with open(cb.path, "r+b") as fh:
        fh.seek(8)
        fh.write((99).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="version"):
        ControlBlock.attach(cb.path)


def test_attach_rejects_wrong_size(make_cb):
    cb = make_cb()
    with open(cb.path, "ab") as fh:
        fh.write(b"\0" * SLOT_SIZE)
    with pytest.raises(ValueError, match="header says"):
        ControlBlock.attach(cb.path)
    os.truncate(cb.path, HEADER_SIZE + 10 * SLOT_SIZE)
    with pytest.raises(ValueError, match="header says"):
        ControlBlock.attach(cb.path)
    os.truncate(cb.path, 100)
    with pytest.raises(ValueError, match="too small"):
        ControlBlock.attach(cb.path)


def test_attach_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        ControlBlock.attach(str(tmp_path / "nope"))


def test_closed_block_raises(make_cb):
    cb = make_cb()
    cb.close()
    with pytest.raises(ValueError, match="closed"):
        cb.get("wrote")
    with pytest.raises(ValueError, match="closed"):
        cb.table_get("t", 0)
    cb.close()  # twice is harmless


# -- cells ------------------------------------------------------------------------------------

def test_positions_get_set_advance(make_cb):
    cb = make_cb()
    assert cb.positions() == {"wrote": 0, "committed": 0, "flushed": 0, "dispatched": 0, "confirmed": 0,
                              "min_phy": 0}
    assert cb.get("alloc_ready_upto") == -1 and cb.get("alloc_request_upto") == -1
    cb.set("wrote", 1000)
    assert cb.get("wrote") == 1000
    assert cb.advance("wrote", 1500) == 1500
    assert cb.advance("wrote", 1200) == 1500, "advance never moves backwards"
    assert cb.advance("wrote", 1500) == 1500
    assert cb.get("wrote") == 1500
    cb.set("wrote", 10)  # set may (owner rebuilding the block)
    assert cb.get("wrote") == 10
    assert cb.advance("alloc_ready_upto", 0) == 0
    assert cb.advance("flushed", -5) == 0
    cb.set("confirmed", 2**62)
    assert cb.positions()["confirmed"] == 2**62
    cb.set("min_phy", -1)
    assert cb.get("min_phy") == -1
    with pytest.raises(KeyError):
        cb.get("no_such_cell")


def test_advance_is_atomic_across_threads(make_cb):
    cb = make_cb()

    def worker(base):
        for i in range(2000):
            cb.advance("dispatched", base + i * 4)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cb.get("dispatched") == 3 + 1999 * 4


def test_stats(make_cb):
    cb = make_cb()
    stats = cb.stats()
    assert list(stats) == list(STAT_NAMES) and set(stats.values()) == {0}
    cb.add_stat("put_requests")
    cb.add_stat("put_requests", 4)
    cb.add_stat("put_bytes", 1000)
    cb.max_stat("lock_hold_ns_max", 50)
    cb.max_stat("lock_hold_ns_max", 20)
    cb.max_stat("lock_hold_ns_max", 70)
    cb.set_stat("flush_ns_last", 9)
    cb.set_stat("flush_ns_last", 3)
    s = cb.stats()
    assert s["put_requests"] == 5 and s["put_bytes"] == 1000
    assert s["lock_hold_ns_max"] == 70
    assert s["flush_ns_last"] == 3
    with pytest.raises(ValueError):
        cb.add_stat("no_such_stat")


def test_running_flags(make_cb):
    cb = make_cb()
    assert cb.running_flags() == []
    cb.set_running_flag("DISK_FULL")
    cb.set_running_flag("NOT_WRITEABLE")
    cb.set_running_flag("DISK_FULL")
    assert sorted(cb.running_flags()) == ["DISK_FULL", "NOT_WRITEABLE"]
    assert cb.get("running_flags") == _shm.RUNNING_FLAGS["DISK_FULL"] | _shm.RUNNING_FLAGS["NOT_WRITEABLE"]
    cb.set_running_flag("DISK_FULL", False)
    cb.set_running_flag("NOT_READABLE", False)  # clearing an unset flag
    assert cb.running_flags() == ["NOT_WRITEABLE"]
    with pytest.raises(KeyError):
        cb.set_running_flag("BOGUS")


# -- topic-queue table ----------------------------------------------------------------------

def test_table_set_get_items(make_cb):
    cb = make_cb()
    assert cb.table_get("TopicTest", 0) is None
    cb.table_set("TopicTest", 0, 10)
    cb.table_set("TopicTest", 1, 20)
    cb.table_set("TopicTes", 0, 30)  # a prefix is another topic
    cb.table_set("TopicTest", -1, 40)
    assert cb.table_get("TopicTest", 0) == 10
    assert cb.table_get("TopicTest", 1) == 20
    assert cb.table_get("TopicTes", 0) == 30
    assert cb.table_get("TopicTest", -1) == 40
    assert cb.table_get("TopicTest", 2) is None
    assert cb.table_get("TopicTestX", 0) is None
    cb.table_set("TopicTest", 0, 11)  # update in place
    assert cb.table_get("TopicTest", 0) == 11
    assert cb.table_count == 4
    assert sorted(cb.table_items()) == sorted([("TopicTest", 0, 11), ("TopicTest", 1, 20), ("TopicTes", 0, 30),
                                               ("TopicTest", -1, 40)])


def test_table_non_ascii_topics(make_cb):
    cb = make_cb()
    topics = ["主题-测试", "Ünïcödé", "emoji-\U0001F600", "a" * 127, "主" * 42]  # 127 and 126 UTF-8 bytes
    for i, t in enumerate(topics):
        cb.table_set(t, i, 100 + i)
    for i, t in enumerate(topics):
        assert cb.table_get(t, i) == 100 + i
    assert sorted(cb.table_items()) == sorted((t, i, 100 + i) for i, t in enumerate(topics))
    other = ControlBlock.attach(cb.path)
    try:
        assert other.table_get("主题-测试", 0) == 100
    finally:
        other.close()


def test_table_rejects_topics_longer_than_127_utf8_bytes(make_cb):
    cb = make_cb()
    with pytest.raises(ValueError, match="127"):
        cb.table_set("a" * 128, 0, 1)
    with pytest.raises(ValueError, match="127"):
        cb.table_set("主" * 43, 0, 1)  # 43 chars, 129 bytes
    assert cb.table_count == 0
    assert cb.table_get("a" * 128, 0) is None
    assert cb.table_get("主" * 100, 0) is None


def test_table_full(make_cb):
    cb = make_cb(slots=64)
    usable = 64 - 64 // 8
    assert usable == 56
    for q in range(usable):
        cb.table_set("T", q, q * 10)
    assert cb.table_count == 56
    with pytest.raises(OverflowError, match="full"):
        cb.table_set("T", 56, 0)
    with pytest.raises(OverflowError):
        cb.table_set("Other", 0, 0)
    cb.table_set("T", 7, 777)  # existing queues still update
    assert cb.table_get("T", 7) == 777
    assert cb.table_get("T", 56) is None
    assert cb.table_count == 56
    items = cb.table_items()
    assert len(items) == 56
    assert {q for _, q, _ in items} == set(range(56))
    for q in range(usable):
        assert cb.table_get("T", q) == (777 if q == 7 else q * 10)


# -- wake-ups -----------------------------------------------------------------------------------

def test_notify_before_wait_is_not_lost(make_cb):
    cb = make_cb()
    cb.notify("flush")
    t0 = time.monotonic()
    assert cb.wait_notified("flush", 10_000) is True
    assert time.monotonic() - t0 < 5


def test_wait_times_out(make_cb):
    cb = make_cb()
    t0 = time.monotonic()
    assert cb.wait_notified("flush", 50) is False
    assert time.monotonic() - t0 < 5


def test_notifications_coalesce_and_are_consumed(make_cb):
    cb = make_cb()
    for _ in range(3):
        cb.notify("commit")
    assert cb.wait_notified("commit", 10_000) is True
    assert cb.wait_notified("commit", 30) is False, "one pending flag: three notifies wake once"
    cb.notify("commit")
    assert cb.wait_notified("commit", 10_000) is True


def test_channels_are_independent(make_cb):
    cb = make_cb()
    cb.notify("alloc")
    assert cb.wait_notified("flush", 30) is False
    assert cb.wait_notified("alloc", 10_000) is True
    with pytest.raises(KeyError):
        cb.notify("nope")


def test_notify_from_another_thread_wakes_the_waiter(make_cb):
    cb = make_cb()
    other = ControlBlock.attach(cb.path)  # a second mapping of the same block
    try:
        def later():
            time.sleep(0.1)
            other.notify("dispatch")

        threading.Thread(target=later, daemon=True).start()
        t0 = time.monotonic()
        assert cb.wait_notified("dispatch", 20_000) is True
        assert time.monotonic() - t0 < 10
    finally:
        time.sleep(0.15)
        other.close()


def test_wait_position(make_cb):
    cb = make_cb()
    cb.set("flushed", 100)
    assert cb.wait_position("flushed", 100, "flushed", 10_000) is True
    t0 = time.monotonic()
    assert cb.wait_position("flushed", 101, "flushed", 50) is False
    assert time.monotonic() - t0 < 5


def test_wait_position_woken_by_broadcast_from_a_thread(make_cb):
    cb = make_cb()

    def later():
        time.sleep(0.1)
        cb.set("flushed", 50)  # not there yet: a broadcast alone does not end the wait
        cb.broadcast("flushed")
        time.sleep(0.1)
        cb.advance("flushed", 200)
        cb.broadcast("flushed")

    done, out = in_thread(cb.wait_position, "flushed", 200, "flushed", 20_000)
    done2, out2 = in_thread(cb.wait_position, "flushed", 150, "flushed", 20_000)  # every waiter is woken
    seq = cb.channel_seq("flushed")
    threading.Thread(target=later, daemon=True).start()
    assert done.wait(10) and done2.wait(10)
    assert out == [True] and out2 == [True]
    assert cb.channel_seq("flushed") == (seq + 2) & 0xFFFFFFFF


def test_wait_position_broadcast_below_target_keeps_waiting(make_cb):
    cb = make_cb()
    done, out = in_thread(cb.wait_position, "wrote", 1000, "flushed", 300)
    time.sleep(0.05)
    cb.set("wrote", 10)
    cb.broadcast("flushed")
    assert done.wait(10)
    assert out == [False]


def test_wait_seq_change(make_cb):
    cb = make_cb()
    seen = cb.channel_seq("alloc_done")
    assert cb.wait_seq_change("alloc_done", seen, 30) is False
    done, out = in_thread(cb.wait_seq_change, "alloc_done", seen, 20_000)
    time.sleep(0.05)
    cb.broadcast("alloc_done")
    assert done.wait(10) and out == [True]
    assert cb.wait_seq_change("alloc_done", seen, 10_000) is True, "already changed: no wait"


def test_wait_position_woken_from_another_process(make_cb, children):
    cb = make_cb()
    child = children(f"""
        cb = ControlBlock.attach({cb.path!r})
        say("ready")
        hear()
        time.sleep(0.2)
        cb.advance("flushed", 4096)
        cb.broadcast("flushed")
        say("done")
        hear()
    """)
    child.expect("ready")
    child.send()
    t0 = time.monotonic()
    assert cb.wait_position("flushed", 4096, "flushed", 20_000) is True
    assert time.monotonic() - t0 < 10
    child.expect("done")
    assert child.finish() == 0


def test_notify_from_another_process(make_cb, children):
    cb = make_cb()
    child = children(f"""
        cb = ControlBlock.attach({cb.path!r})
        say("ready")
        hear()
        time.sleep(0.2)
        cb.notify("clean")
        say("done")
        hear()
    """)
    child.expect("ready")
    child.send()
    t0 = time.monotonic()
    assert cb.wait_notified("clean", 20_000) is True
    assert time.monotonic() - t0 < 10
    child.expect("done")
    assert child.finish() == 0


# -- put lock --------------------------------------------------------------------------------------

def lock_once_within(cb: ControlBlock, seconds: float = 10.0) -> bool:
    """acquire_put_lock + release_put_lock in one thread (the mutex kind must be released by its
    owner thread); fails the test if the acquire blocks longer than seconds. Returns whether
    the acquire reported a takeover."""
    def once():
        took_over = cb.acquire_put_lock()
        cb.release_put_lock()
        return took_over

    done, out = in_thread(once)
    if not done.wait(seconds):
        pytest.fail(f"acquire_put_lock blocked for more than {seconds} s")
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@pytest.mark.parametrize("kind", KINDS)
def test_put_lock_uncontended(make_cb, kind):
    cb = make_cb(kind)
    assert cb.lock_holder is None
    assert cb.acquire_put_lock() is False
    if kind == "spin":
        assert cb.lock_holder[0] == os.getpid()
    assert cb.get("lock_begin_time_ms") > 0
    cb.release_put_lock()
    assert cb.get("lock_begin_time_ms") == 0
    assert cb.lock_holder is None
    assert cb.acquire_put_lock() is False
    cb.release_put_lock()


@pytest.mark.parametrize("kind", KINDS)
def test_put_lock_excludes_threads(make_cb, kind):
    cb = make_cb(kind)
    counter = {"in": 0, "max": 0, "n": 0}

    def worker():
        for _ in range(200):
            cb.acquire_put_lock()
            counter["in"] += 1
            counter["max"] = max(counter["max"], counter["in"])
            counter["n"] += 1
            counter["in"] -= 1
            cb.release_put_lock()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert counter["n"] == 600 and counter["max"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_put_lock_excludes_across_processes(make_cb, children, kind):
    cb = make_cb(kind)
    child = children(f"""
        cb = ControlBlock.attach({cb.path!r})
        assert cb.acquire_put_lock() is False
        say("locked")
        hear()
        cb.release_put_lock()
        say("released")
        hear()
        t0 = time.monotonic()
        took_over = cb.acquire_put_lock()
        say(f"acquired {{took_over}}")
        cb.release_put_lock()
        hear()
    """)
    child.expect("locked")
    if kind == "spin":
        assert cb.lock_holder[0] == child.pid
    # 1. the child holds it: the parent blocks until the child releases
    release = threading.Event()

    def parent_put():
        took_over = cb.acquire_put_lock()
        release.wait(30)
        cb.release_put_lock()  # released by the owning thread (required by the mutex kind)
        return took_over

    done, out = in_thread(parent_put)
    assert not done.wait(0.3) and not out, "the parent took the lock the child holds"
    child.send()
    child.expect("released")
    # 2. now the parent's thread holds it: the child blocks until the parent releases
    deadline = time.monotonic() + 10
    while cb.get("lock_begin_time_ms") == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert cb.get("lock_begin_time_ms") != 0, "the parent never got the lock after the child released it"
    child.send()
    assert child.silent_for(0.3), "the child took the lock the parent holds"
    release.set()
    assert done.wait(10) and out == [False]
    assert child.expect("acquired") == "acquired False"
    child.send()
    assert child.finish() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_page_cache_busy(make_cb, kind):
    cb = make_cb(kind)
    assert cb.page_cache_busy(0) is False, "nobody holds the lock"
    cb.acquire_put_lock()
    try:
        time.sleep(0.15)
        assert cb.page_cache_busy(50) is True
        assert cb.page_cache_busy(600_000) is False
    finally:
        cb.release_put_lock()
    assert cb.page_cache_busy(0) is False


def kill_lock_holder(children, cb):
    """A child process takes the put lock and is killed with SIGKILL while holding it."""
    child = children(f"""
        cb = ControlBlock.attach({cb.path!r})
        cb.acquire_put_lock()
        say("locked")
        time.sleep(120)
    """)
    child.expect("locked")
    child.kill9()


@pytest.mark.parametrize("kind", KINDS)
def test_put_lock_taken_over_from_killed_holder(make_cb, children, kind):
    cb = make_cb(kind)
    kill_lock_holder(children, cb)
    assert lock_once_within(cb) is True, "the lock is reported as taken over from a dead holder"
    assert lock_once_within(cb) is False, "a normal acquire afterwards"
    # and another process can still take it normally
    c2 = children(f"""
        cb = ControlBlock.attach({cb.path!r})
        say(f"acquired {{cb.acquire_put_lock()}}")
        cb.release_put_lock()
    """)
    assert c2.expect("acquired") == "acquired False"
    assert c2.finish() == 0


_ZOMBIE_SCRIPT = """
import os, subprocess, sys, time
from mqstore.log._shm import ControlBlock
path, kind = sys.argv[1], sys.argv[2]
cb = ControlBlock.create(path, table_slots=64, file_size=4096, lock_kind=kind, sync_flush=False)
holder = subprocess.Popen([sys.executable, "-c",
    "import sys, time\\nfrom mqstore.log._shm import ControlBlock\\n"
    f"cb = ControlBlock.attach({path!r})\\ncb.acquire_put_lock()\\nprint('locked', flush=True)\\ntime.sleep(120)"],
    stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "locked"
os.kill(holder.pid, 9)
# the holder is dead but not reaped yet (a zombie): exactly what a parent sees right after
# its worker crashed, before it gets to waitpid
while open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)
print("takeover", cb.acquire_put_lock(), flush=True)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_put_lock_taken_over_from_unreaped_dead_holder(tmp_path, kind):
    """A holder that died but is not yet reaped by its parent (zombie) is dead: the parent's
    own next put must take the lock over instead of blocking forever."""
    try:
        r = subprocess.run([sys.executable, "-c", _ZOMBIE_SCRIPT, str(tmp_path / "ctl"), kind], capture_output=True,
                           text=True, timeout=4, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind}: acquire_put_lock blocked on a lock held by a dead (zombie) process")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "takeover True"


@pytest.mark.parametrize("kind", KINDS)
def test_page_cache_not_busy_after_holder_died(make_cb, children, kind):
    """spec §9.2: beginTimeInLock is 0 when no put holds the lock. A holder killed inside the
    lock leaves it set; since puts check page_cache_busy before taking the lock (and so before
    any takeover), a dead holder must not make the store report OS_PAGECACHE_BUSY."""
    cb = make_cb(kind)
    kill_lock_holder(children, cb)
    time.sleep(0.2)
    assert cb.page_cache_busy(100) is False, "no live process holds the put lock"


# -- ofd_lock ----------------------------------------------------------------------------------------

def test_ofd_lock_second_open_in_same_process(tmp_path):
    path = str(tmp_path / "lock")
    fd1 = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fd2 = os.open(path, os.O_RDWR)
    try:
        assert ofd_lock(fd1) is True
        assert ofd_lock(fd1) is True, "re-locking through the same open file description"
        assert ofd_is_locked(fd1) is False, "no conflicting holder for the owner itself"
        assert ofd_lock(fd2) is False, "a second open file description conflicts, even in one process"
        assert ofd_is_locked(fd2) is True
        fd1_dup = os.dup(fd1)
        assert ofd_lock(fd1_dup) is True, "a dup shares the description"
        os.close(fd1_dup)
        assert ofd_lock(fd2) is False, "closing a dup keeps the lock"
        ofd_unlock(fd1)
        assert ofd_lock(fd2) is True
        assert ofd_lock(fd1) is False
    finally:
        os.close(fd1)
        os.close(fd2)
    fd3 = os.open(path, os.O_RDWR)
    try:
        assert ofd_lock(fd3) is True, "closing the holder's last descriptor releases the lock"
    finally:
        os.close(fd3)
    with pytest.raises(OSError):
        ofd_lock(-1)


def test_ofd_lock_released_when_holder_killed(tmp_path, children):
    path = str(tmp_path / "lock")
    with open(path, "wb") as fh:
        fh.write(b"lock")
    child = children(f"""
        fd = os.open({path!r}, os.O_RDWR)
        say(f"locked {{ofd_lock(fd)}}")
        time.sleep(120)
    """)
    assert child.expect("locked") == "locked True"
    fd = os.open(path, os.O_RDWR)
    try:
        assert ofd_lock(fd) is False
        assert ofd_is_locked(fd) is True
        child.kill9()
        assert ofd_is_locked(fd) is False
        assert ofd_lock(fd) is True
    finally:
        os.close(fd)


# -- several CommitLogs: layout version 4 (docs/parallel-commitlogs.md) ------------------------

def test_each_log_has_its_own_cells_starting_at_its_first_offset(tmp_path):
    cb = ControlBlock.create(str(tmp_path / "n.shm"), table_slots=64, file_size=1 << 16, lock_kind="spin",
                             sync_flush=False, log_count=3)
    try:
        assert cb.log_count == 3
        for k in range(3):
            assert cb.positions(log=k) == {n: k << _shm.LOG_SHIFT for n in
                                           ("wrote", "committed", "flushed", "dispatched", "confirmed", "min_phy")}
            assert cb.get("alloc_request_upto", log=k) == cb.get("alloc_ready_upto", log=k) == -1
            assert cb.log_state(k) == "online"
            assert cb.log_stats(k) == dict.fromkeys(_shm.LOG_STAT_NAMES, 0)
        cb.advance("wrote", (1 << 56) + 500, log=1)
        cb.set("flushed", (2 << 56) + 100, log=2)
        assert cb.get("wrote", log=1) == (1 << 56) + 500 and cb.get("wrote") == 0 and cb.get("wrote", log=2) == 2 << 56
        assert cb.get("flushed", log=2) == (2 << 56) + 100 and cb.get("flushed", log=1) == 1 << 56
        cb.set_log_state(2, "offline")
        assert [cb.log_state(k) for k in range(3)] == ["online", "online", "offline"]
        other = ControlBlock.attach(cb.path)
        assert other.log_count == 3 and other.get("wrote", log=1) == (1 << 56) + 500
        other.close()
        with pytest.raises(ValueError, match="log 3 does not exist: the store has 3"):
            cb.get("wrote", log=3)
        with pytest.raises(ValueError, match="running_flags is the store's cell"):
            cb.get("running_flags", log=1)
        with pytest.raises(ValueError, match="'dispatched' channel is the store's"):
            cb.notify("dispatched", log=1)
        with pytest.raises(ValueError, match="state 'gone'"):
            cb.set_log_state(0, "gone")
    finally:
        cb.close()


@pytest.mark.parametrize("kind", ["spin", "mutex"])
def test_each_log_has_its_own_put_lock(tmp_path, kind):
    cb = ControlBlock.create(str(tmp_path / "n.shm"), table_slots=64, file_size=1 << 16, lock_kind=kind,
                             sync_flush=False, log_count=2)
    try:
        cb.acquire_put_lock(log=0)
        done, out = in_thread(cb.try_acquire_put_lock, 0)
        assert done.wait(10) and out == [False], "log 0's lock is held"
        done, out = in_thread(cb.try_acquire_put_lock, 1)
        assert done.wait(10) and out == [True], "log 1's lock is another lock"
        cb.release_put_lock(log=0)
        done, out = in_thread(cb.try_acquire_put_lock, 0)
        assert done.wait(10) and out == [True]
    finally:
        cb.close()


def test_a_log_channel_wakes_only_its_log(tmp_path):
    cb = ControlBlock.create(str(tmp_path / "n.shm"), table_slots=64, file_size=1 << 16, lock_kind="spin",
                             sync_flush=False, log_count=2)
    try:
        cb.notify("flush", log=1)
        assert cb.wait_notified("flush", 0, log=0) is False
        assert cb.wait_notified("flush", 0, log=1) is True
        seq = cb.channel_seq("flushed", log=1)
        cb.broadcast("flushed", log=0)
        assert cb.channel_seq("flushed", log=1) == seq
        # a log's position waited for on a store-wide channel (every log's dispatcher broadcasts on it)
        done, out = in_thread(cb.wait_position, "dispatched", (1 << 56) + 10, "dispatched", 60_000, 1)
        cb.set("dispatched", (1 << 56) + 10, log=1)
        cb.broadcast("dispatched")
        assert done.wait(60) and out == [True]
    finally:
        cb.close()


@pytest.mark.parametrize("count", [0, 33])
def test_create_refuses_a_log_count_out_of_range(tmp_path, count):
    with pytest.raises(ValueError, match=f"log_count={count} must be 1 .. 32"):
        ControlBlock.create(str(tmp_path / "n.shm"), table_slots=64, file_size=1 << 16, lock_kind="spin",
                            sync_flush=False, log_count=count)


_INSERTER = """
import sys
from mqstore.log._shm import ControlBlock
cb = ControlBlock.attach(sys.argv[1])
me, n = int(sys.argv[2]), int(sys.argv[3])
sys.stdin.readline()  # every inserter starts at once
for i in range(n):
    cb.table_set("T%d" % (i % 7), me * 100000 + i, i + 1)
"""


def test_writers_of_different_logs_insert_queues_at_once(tmp_path):
    """Writers of different CommitLogs hold different locks, so they insert new queues into the
    one table at the same time: a slot is claimed by CAS before it is filled, so no two
    queues share a slot and none is lost. (Without the claim, a round loses a queue about
    every other time on 2 cores: five rounds.)"""
    want = {("T%d" % (i % 7), me * 100000 + i, i + 1) for me in range(4) for i in range(6000)}
    for round_ in range(5):
        cb = ControlBlock.create(str(tmp_path / f"n{round_}.shm"), table_slots=1 << 15, file_size=1 << 16,
                                 lock_kind="spin", sync_flush=False, log_count=4)
        procs = [subprocess.Popen([sys.executable, "-c", _INSERTER, cb.path, str(me), "6000"],
                                  stdin=subprocess.PIPE) for me in range(4)]
        try:
            for p in procs:
                p.stdin.write(b"go\n")
                p.stdin.flush()
            for p in procs:
                assert p.wait(timeout=120) == 0
            items = cb.table_items()
            assert len(items) == len(want) == cb.table_count, f"round {round_}"
            assert set(items) == want
            assert all(cb.table_get(t, q) == n for t, q, n in want)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=20)
            cb.close()
