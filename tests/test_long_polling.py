"""Long polling for readers (spec §12, issue 4 item 6): MessageStore.wait_for_messages blocks in
a futex wait on the control block until the dispatcher (a thread, or the node's dispatcher
process) has built a unit at the awaited queue offset; the wake-up follows long_polling_enable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from mqstore import Message, MessageStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
NODE = {"service_mode": "processes", "mapped_file_size_commit_log": 256 * 1024,
        "mapped_file_size_consume_queue": 20 * 500}

WAITER = textwrap.dedent("""
    import json, resource, sys
    from mqstore import MessageStore
    root, n = sys.argv[1], int(sys.argv[2])
    store = MessageStore.open(root)
    print("ATTACHED", flush=True)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    # nothing arrives for this one: it times out, having slept in the kernel
    idle = store.wait_for_messages("Other", 0, 0, timeout_ms=1500)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    print("IDLE", flush=True)
    got, offset = [], 0
    while offset < n:
        assert store.wait_for_messages("T", 1, offset, timeout_ms=60_000), offset
        r = store.get_message("g", "T", 1, offset, 32)
        got += [bytes(m.body).decode() for m in r]
        offset = r.next_begin_offset
    store.close()
    print(json.dumps({"idle": idle, "idle_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
                      "got": got}))
""")


@pytest.mark.parametrize("long_polling", [True, False])
def test_a_waiting_reader_is_woken_by_dispatch(tmp_path, long_polling):
    root = str(tmp_path / "s")
    with MessageStore(root, long_polling_enable=long_polling) as store:
        assert not store.wait_for_messages("T", 0, 0, timeout_ms=50)  # nothing there: timeout
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(store.wait_for_messages("T", 0, 3, timeout_ms=30_000)))
        waiter.start()
        for i in range(3):
            store.put("T", b"early %d" % i).check()
        store.wait_dispatched()
        assert waiter.is_alive()  # offsets 0..2 exist; it waits for offset 3
        store.put("T", b"the one").check()
        waiter.join(60)
        assert result == [True]
        assert bytes(store.look_message_by_queue_offset("T", 0, 3).body) == b"the one"
        assert store.wait_for_messages("T", 0, 2, timeout_ms=0)  # already there: no wait


def test_default_hold_follows_the_polling_mode(tmp_path):
    with MessageStore(str(tmp_path / "s"), long_polling_enable=False, short_polling_time_mills=30) as store:
        assert not store.wait_for_messages("T", 0, 0)  # held short_polling_time_mills, then nothing


def test_a_consumer_process_waits_on_the_node_dispatcher_process(tmp_path):
    """A consumer in another process long-polls a node: it sleeps in the kernel while nothing
    arrives, and is woken by the dispatcher process for every message the owner puts."""
    root = str(tmp_path / "s")
    n = 200
    with MessageStore(root, **NODE) as node:
        proc = subprocess.Popen([sys.executable, "-c", WAITER, root, str(n)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV)
        assert proc.stdout.readline().strip() == "ATTACHED"
        assert proc.stdout.readline().strip() == "IDLE"
        for i in range(n):
            node.put_message(Message("T", f"m{i}".encode(), queue_id=1)).check()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert res["idle"] is False
    assert res["idle_cpu_s"] < 0.3, "the idle wait burned CPU: it should sleep in a futex wait"
    assert res["got"] == [f"m{i}" for i in range(n)]
