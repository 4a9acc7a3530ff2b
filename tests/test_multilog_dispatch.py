"""dispatch_logs_in_parallel (docs/parallel-commitlogs.md): with several CommitLogs each log is
dispatched on its own, by a dispatcher process per log in a node and a reput thread per log in
the threads mode; what waits on dispatch or wakes it (long polling, wait_dispatched, the idle
sleep, WRITE_LOGICS_QUEUE_ERROR, the start-up dispatch) works with several dispatchers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from mqstore import Message, MessageStore
from mqstore.tools.checker import check_store
from mqstore.twin.logs import log_of_queue

from helpers_proc import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
FS = 64 * 1024  # CommitLog files: every log rolls

# A writer process attached to the node: puts n messages into queues w*4 .. w*4+3 of topic P
# (both logs get queues of every writer), one ack line (queue, queue offset, physical offset)
# each; with a second count it says PAUSE after the first n, waits for a line, puts the rest.
_WRITER = """
import sys
from mqstore import MessageStore, Message
root, w, n, more = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = MessageStore.open(root)
assert store.attached
for i in range(n + more):
    if i == n and more:
        print("PAUSE", flush=True)
        sys.stdin.readline()
    q = w * 4 + i % 4
    r = store.put_message(Message("P", b"w%d-%d-" % (w, i) + b"p" * (i % 1500), queue_id=q))
    assert r.ok, r
    print(q, r.queue_offset, r.wrote_offset, flush=True)
store.close()
"""


def _body(w: int, i: int) -> bytes:
    return b"w%d-%d-" % (w, i) + b"p" * (i % 1500)


def _check_queues(store: Any, writers: int, total: int, acks: list[tuple[int, int, int]]) -> None:
    """Every queue of P reads back exactly what its writer put, in order, at the queue and
    physical offsets the puts answered, every unit in the queue's own log."""
    for w in range(writers):
        for j in range(4):
            q = w * 4 + j
            got = store.read_messages("P", q, 0, 100_000)
            assert [bytes(b) for b in got.bodies()] == [_body(w, i) for i in range(j, total, 4)], f"queue {q}"
            assert {p >> 56 for p in got.physical_offsets} == {log_of_queue("P", q, 2)}
            assert sorted((qo, phy) for qq, qo, phy in acks if qq == q) == list(enumerate(got.physical_offsets))


def _acks(out: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, line.split())) for line in out.splitlines() if line != "PAUSE"]  # type: ignore[misc]


def _mapped(pid: int) -> set[str]:
    """The files a process maps."""
    with open(f"/proc/{pid}/maps", encoding="utf-8") as fh:
        return {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}


@pytest.mark.multiprocess
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one-dispatcher"])
def test_a_node_runs_a_dispatcher_process_per_log(tmp_path, parallel):
    """``mqstore node`` on a store with two CommitLogs: with the key a dispatcher process per
    log (``dispatcher`` and ``dispatcher-1``, each with its pid alive in ``mqstore node
    status``, each mapping only its own log's CommitLog and ConsumeQueue files); without it one
    dispatcher process. Two writer processes put into queues of both logs: every queue reads
    back exactly and in order, the checker passes while the node runs and after it stops."""
    root = str(tmp_path / "s")
    node = subprocess.Popen([sys.executable, "-m", "mqstore.tools.cli", "node", root, "--set=commit_log_count=2",
                             f"--set=mapped_file_size_commit_log={FS}",
                             f"--set=dispatch_logs_in_parallel={'true' if parallel else 'false'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert node.stdout is not None
        line = node.stdout.readline()
        assert "owner pid" in line, node.stderr.read() if node.poll() is not None else line  # type: ignore[union-attr]
        status = subprocess.run([sys.executable, "-m", "mqstore.tools.cli", "node", "status", root, "--json"],
                                capture_output=True, text=True, env=ENV, timeout=60)
        assert status.returncode == 0, status.stderr[-2000:]
        services = json.loads(status.stdout)["services"]
        dispatchers = sorted(k for k in services if k.startswith("dispatcher"))
        assert dispatchers == (["dispatcher", "dispatcher-1"] if parallel else ["dispatcher"]), services
        assert all(services[k]["alive"] for k in services), services
        pids = [services[k]["pid"] for k in dispatchers]
        assert len(set(pids)) == len(pids)
        n = 1200
        writers = [subprocess.Popen([sys.executable, "-c", _WRITER, root, str(w), str(n), "0"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=ENV) for w in range(2)]
        acks = []
        for p in writers:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            acks += _acks(out)
        assert len(acks) == 2 * n
        with MessageStore.open(root) as reader:  # attached: reads what the dispatchers built
            assert reader.attached
            assert reader.wait_dispatched(timeout_ms=60_000)
            _check_queues(reader, 2, n, acks)
            assert all(hi - lo > FS for _, lo, hi in reader.logs()), "both logs rolled"
        if parallel:  # each dispatcher process maps its own log's files, not the other's
            for k, pid in enumerate(pids):
                files = _mapped(pid)
                own = os.path.join(root, "commitlog" if k == 0 else f"commitlog-{k}") + os.sep
                other = os.path.join(root, "commitlog-1" if k == 0 else "commitlog") + os.sep
                assert any(f.startswith(own) for f in files) and not any(f.startswith(other) for f in files), k
                queues = {f.split(os.sep)[-2] for f in files if f.startswith(os.path.join(root, "consumequeue", "P"))}
                assert queues and {log_of_queue("P", int(q), 2) for q in queues} == {k}, (k, queues)
        check_store(root, quiescent=False).raise_if_failed()
    finally:
        node.send_signal(signal.SIGTERM)
        node.communicate(timeout=120)
    assert node.returncode == 0
    check_store(root).raise_if_failed()


@pytest.mark.multiprocess
def test_a_killed_dispatcher_of_one_log_leaves_the_other_dispatching_and_catches_up(tmp_path):
    """A node with two CommitLogs and the key: log 1's dispatcher process is SIGKILLed and its
    restart held back (the supervisor's exit hook waits). Meanwhile a writer process puts into
    both logs: log 0's dispatcher dispatches all of its log, log 1's position does not move, a
    pull held on a log-1 queue waits. Released, the supervisor starts a new log-1 dispatcher
    (another pid), which catches up: the held pull is woken, every queue reads back exactly and
    in order, the store-wide checker passes while the node runs and after it stops."""
    root = str(tmp_path / "s")
    n, more = 800, 800
    store = MessageStore(root, commit_log_count=2, mapped_file_size_commit_log=FS, service_mode="processes",
                         dispatch_logs_in_parallel=True)
    hold, held = threading.Event(), threading.Event()
    writer = None
    try:
        sup = store.supervisor
        assert sup is not None and {"dispatcher", "dispatcher-1"} <= set(sup.pids())
        original = sup.on_exit

        def on_exit(kind: str, code: int) -> None:
            if kind == "dispatcher-1":
                held.set()
                hold.wait(120)
            if original is not None:
                original(kind, code)

        sup.on_exit = on_exit
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, root, "0", str(n), str(more)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        assert writer.stdout is not None and writer.stdin is not None
        lines = []
        while (line := writer.stdout.readline().strip()) != "PAUSE":
            assert line, writer.stderr.read()  # type: ignore[union-attr]
            lines.append(line)
        assert store.wait_dispatched(timeout_ms=60_000)
        victim = sup.pids()["dispatcher-1"]
        os.kill(victim, signal.SIGKILL)
        assert held.wait(60), "the supervisor did not see the dispatcher of log 1 exit"
        log1 = [q for q in range(4) if log_of_queue("P", q, 2) == 1]
        waiting_at = store.get_max_offset_in_queue("P", log1[0])
        woken: list[bool] = []
        waiter = threading.Thread(target=lambda: woken.append(store.wait_for_messages("P", log1[0], waiting_at,
                                                                                      timeout_ms=120_000)))
        waiter.start()
        dispatched1 = store.ctl.get("dispatched", log=1)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err[-3000:]
        acks = _acks("\n".join(lines) + "\n" + out)
        assert len(acks) == n + more
        # log 0 keeps dispatching; nobody dispatches log 1
        assert store.ctl.wait_position("dispatched", store.ctl.get("committed", log=0), "dispatched", 60_000, log=0)
        assert store.ctl.get("committed", log=1) > store.ctl.get("dispatched", log=1) == dispatched1
        assert waiter.is_alive() and not woken
        hold.set()
        new = wait_until(lambda: sup.pids()["dispatcher-1"] not in (victim, -1) and sup.pids()["dispatcher-1"], 60,
                         "a new dispatcher of log 1")
        assert os.path.exists(f"/proc/{new}")
        assert store.wait_dispatched(timeout_ms=60_000)
        waiter.join(60)
        assert woken == [True], "the held pull on a log-1 queue was not woken by the restarted dispatcher"
        assert sup.pids()["dispatcher"] > 0 and store.ctl.running_flags() == []
        _check_queues(store, 1, n + more, acks)
        check_store(root, quiescent=False).raise_if_failed()
    finally:
        hold.set()
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        store.shutdown()
    assert not os.path.exists(os.path.join(root, "abort"))
    check_store(root).raise_if_failed()


def test_threads_mode_runs_a_reput_per_log_each_woken_by_its_own_puts(tmp_path, monkeypatch):
    """The threads mode with three CommitLogs and the key: a reput thread per log (reput,
    reput-1, reput-2). Writer threads put into 12 queues: each reads back exactly and in order
    in its own log. Once every reput sleeps idle (its own bit of the idle cell; the sleep made
    a minute long), a put into a log-2 queue wakes log 2's reput alone: it is dispatched at
    once while the other two stay asleep. A pull held on a queue of each log is woken. After a
    clean reopen (the start-up dispatch of each log) the same, and the checker passes."""
    from mqstore.services import reput

    monkeypatch.setattr(reput, "IDLE_SLEEP_MS", 60_000.0)
    root = str(tmp_path / "s")
    n = 3
    queues = [(topic, q) for topic in ("TopicA", "TopicB") for q in range(6)]
    sent: dict[tuple[str, int], list[bytes]] = {key: [] for key in queues}
    lock = threading.Lock()

    def writer(store: Any, w: int) -> None:
        for i in range(500):
            topic, q = queues[(w * 5 + i) % len(queues)]
            body = b"w%d-%d-" % (w, i) + b"x" * (i % 900)
            with lock:
                assert store.put_message(Message(topic, body, queue_id=q)).ok
                sent[(topic, q)].append(body)

    def check(store: Any) -> None:
        assert store.wait_dispatched(timeout_ms=30_000)
        for (topic, q), bodies in sent.items():
            got = store.read_messages(topic, q, 0, 10_000)
            assert [bytes(b) for b in got.bodies()] == bodies, f"{topic}/{q}"
            assert {p >> 56 for p in got.physical_offsets} <= {log_of_queue(topic, q, n)}

    with MessageStore(root, commit_log_count=n, mapped_file_size_commit_log=FS, dispatch_logs_in_parallel=True) as store:
        assert [r.name for r in store.reputs] == ["reput", "reput-1", "reput-2"]
        assert {t.name for t in threading.enumerate()} >= {"mqstore-reput", "mqstore-reput-1", "mqstore-reput-2"}
        threads = [threading.Thread(target=writer, args=(store, w)) for w in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        check(store)
        assert all(hi > lo for _, lo, hi in store.logs())
        every = 0b111 << 32
        wait_until(lambda: store.ctl.get("dispatch_idle") == every, 30, "every reput asleep")
        topic, q = next(key for key in queues if log_of_queue(*key, n) == 2)
        r = store.put_message(Message(topic, b"wakes log 2", queue_id=q))
        sent[(topic, q)].append(b"wakes log 2")
        assert store.wait_dispatched(r.wrote_offset, timeout_ms=30_000), "the put did not wake log 2's reput"
        assert store.ctl.get("dispatch_idle") & (0b11 << 32) == 0b11 << 32, "the other logs' reputs were woken"
        # a pull held on a queue of each log is woken by that log's reput
        for k in range(n):
            topic, q = next(key for key in queues if log_of_queue(*key, n) == k)
            at = store.get_max_offset_in_queue(topic, q)
            woken: list[bool] = []
            waiter = threading.Thread(target=lambda t=topic, qq=q, a=at: woken.append(
                store.wait_for_messages(t, qq, a, timeout_ms=30_000)))
            waiter.start()
            assert store.put_message(Message(topic, b"pull %d" % k, queue_id=q)).ok
            sent[(topic, q)].append(b"pull %d" % k)
            waiter.join(60)
            assert woken == [True], f"the held pull on log {k}'s queue was not woken"
        check(store)
    check_store(root).raise_if_failed()
    with MessageStore(root, dispatch_logs_in_parallel=True) as store:
        assert store.last_exit_ok
        check(store)
    check_store(root).raise_if_failed()


def test_a_logs_dispatch_error_keeps_the_flag_until_that_log_gets_through(tmp_path):
    """Two CommitLogs, a reput per log, each failing (a queue of its log whose directory is a
    file): WRITE_LOGICS_QUEUE_ERROR is set naming both logs. When log 0's gets through, the
    flag stays (log 1 still fails) and puts stay refused; when log 1's does, it clears, both
    messages are dispatched and puts are accepted again."""
    root = tmp_path / "s"
    bad = {k: next(q for q in range(10) if log_of_queue("Bad", q, 2) == k) for k in (0, 1)}
    with MessageStore(str(root), commit_log_count=2, mapped_file_size_commit_log=FS,
                      dispatch_logs_in_parallel=True) as store:
        (root / "consumequeue" / "Bad").mkdir(parents=True)
        for k, q in bad.items():
            (root / "consumequeue" / "Bad" / str(q)).write_bytes(b"not a directory")
        offsets = {k: store.put_message(Message("Bad", b"log %d" % k, queue_id=q)).wrote_offset
                   for k, q in bad.items()}
        ctl = store.ctl
        wait_until(lambda: ctl.log_running_flag("WRITE_LOGICS_QUEUE_ERROR", 0)
                   and ctl.log_running_flag("WRITE_LOGICS_QUEUE_ERROR", 1), 30, "both logs' dispatch failing")
        assert "WRITE_LOGICS_QUEUE_ERROR" in ctl.running_flags()
        os.unlink(root / "consumequeue" / "Bad" / str(bad[0]))
        assert store.wait_dispatched(offsets[0], timeout_ms=30_000)
        wait_until(lambda: not ctl.log_running_flag("WRITE_LOGICS_QUEUE_ERROR", 0), 30, "log 0 through")
        assert "WRITE_LOGICS_QUEUE_ERROR" in ctl.running_flags(), "log 0's reput cleared log 1's failure"
        refused = store.put_message(Message("Other", b"refused"))
        assert not refused.ok and "WRITE_LOGICS_QUEUE_ERROR" in str(refused.detail)
        os.unlink(root / "consumequeue" / "Bad" / str(bad[1]))
        wait_until(lambda: "WRITE_LOGICS_QUEUE_ERROR" not in ctl.running_flags(), 30, "the flag cleared")
        assert store.wait_dispatched(timeout_ms=30_000)
        for k, q in bad.items():
            assert [bytes(b) for b in store.read_messages("Bad", q, 0, 10).bodies()] == [b"log %d" % k]
        assert store.put_message(Message("Other", b"accepted")).ok
    check_store(str(root)).raise_if_failed()
