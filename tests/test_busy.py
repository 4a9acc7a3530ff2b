"""OS_PAGECACHE_BUSY across processes (issue 4 item 3): a put lock held too long by another
process makes every process's puts fail fast; a dead holder is not "busy" (it is taken over)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore import MessageStore
from mqstore.tools.soak import freeze, thaw

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

HOLDER = textwrap.dedent("""
    import os, sys, time
    from mqstore.log._shm import ControlBlock
    ctl = ControlBlock.attach(os.path.join(sys.argv[1], "mqstore.shm"))
    ctl.acquire_put_lock()
    print("HELD", flush=True)
    sys.stdin.readline()
    ctl.release_put_lock()
    print("RELEASED", flush=True)
""")


@pytest.mark.parametrize("lock", ["spin", "mutex"])
def test_a_lock_held_too_long_in_another_process_makes_puts_busy(tmp_path, lock):
    root = str(tmp_path / "s")
    with MessageStore(root, os_page_cache_busy_time_out_mills=100,
                      use_reentrant_lock_when_put_message=(lock == "mutex")) as store:
        store.put("T", b"before").check()
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=ENV)
        try:
            assert holder.stdout.readline().strip() == "HELD"
            time.sleep(0.3)  # past os_page_cache_busy_time_out_mills
            r = store.put("T", b"refused")
            assert r.status.name == "OS_PAGECACHE_BUSY" and "held the lock longer than 100 ms" in r.detail
            assert store.stats()["page_cache_busy"] >= 1
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "RELEASED"
        finally:
            holder.kill()
            holder.wait(30)
        store.put("T", b"after").check()
        store.wait_dispatched()
        assert [bytes(m.body) for m in store.get_message("g", "T", 0, 0, 32)] == [b"before", b"after"]


@pytest.mark.parametrize("lock", ["spin", "mutex"])
def test_a_holder_killed_inside_the_lock_is_not_busy_but_taken_over(tmp_path, lock):
    root = str(tmp_path / "s")
    with MessageStore(root, os_page_cache_busy_time_out_mills=100,
                      use_reentrant_lock_when_put_message=(lock == "mutex")) as store:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=ENV)
        assert holder.stdout.readline().strip() == "HELD"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        time.sleep(0.3)
        store.put("T", b"taken over").check()
        assert store.stats()["lock_takeovers"] == 1


def test_sync_puts_flush_themselves_while_the_flusher_process_is_stopped(tmp_path):
    """SYNC_FLUSH in a node: a put flushes on its own side when no other thread of its process
    is flushing, so it is acknowledged with the flusher process stopped (SIGSTOP); a put whose
    process is already flushing waits (futex on the control block) for that flush or the
    flusher, and with neither coming returns FLUSH_DISK_TIMEOUT after sync_flush_timeout, the
    message stored; once the flusher runs again everything is flushed."""
    root = str(tmp_path / "s")
    with MessageStore(root, service_mode="processes", flush_disk_type="SYNC_FLUSH", sync_flush_timeout=300,
                      mapped_file_size_commit_log=256 * 1024) as node:
        node.put("T", b"ok").check()
        flusher = node.supervisor.pids()["flusher"]
        freeze(flusher)
        try:
            node.put("T", b"flushed by its putter").check()
            assert node.positions()["flushed"] == node.positions()["wrote"]
            with node.commitlog._flush_lock:  # a flush of this process that never ends
                r = node.put("T", b"not flushed in time")
            assert r.status.name == "FLUSH_DISK_TIMEOUT" and "sync_flush_timeout=300" in r.detail
            assert node.stats()["flush_timeouts"] == 1
            assert node.positions()["flushed"] < node.positions()["wrote"]
        finally:
            thaw(flusher)
        node.put("T", b"flushed again").check()
        pos = node.positions()
        assert pos["flushed"] == pos["wrote"]
        node.wait_dispatched()
        assert [bytes(m.body) for m in node.get_message("g", "T", 0, 0, 32)] == [
            b"ok", b"flushed by its putter", b"not flushed in time", b"flushed again"]
