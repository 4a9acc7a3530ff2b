"""`mqstore node` stops cleanly on Ctrl-C (SIGINT to its whole process group, as a terminal sends
it) or SIGTERM (to the owner) at any moment, start-up included, with producers writing or not:
exit 0, no traceback, no `abort`, no service process left, and the next open finds a clean
shutdown (nothing re-dispatched, the index not rebuilt). Also an embedded owner interrupted
while it opens. Real processes and real signals, at seeded random moments (issue 14)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from mqstore import Message, MessageStore
from mqstore.tools.checker import check_store

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
SETTINGS = ["--set=mapped_file_size_commit_log=1048576", "--set=mapped_file_size_consume_queue=20000",
            "--set=max_hash_slot_num=1000", "--set=max_index_num=4000", "--set=flush_disk_type=SYNC_FLUSH"]
PRODUCER = """
import sys, time
from mqstore import Message, MessageStore, StoreClosedError
root = sys.argv[1]
try:
    store = MessageStore.attach(root)
except Exception:
    sys.exit(0)  # the node stopped before this producer attached
deadline = time.monotonic() + 30
i = 0
while time.monotonic() < deadline:
    r = store.put_message(Message("Sig", b"m%d" % i, queue_id=i % 2, keys=[f"k{i}"]))
    if not r.status.is_stored:
        break  # the owner is shutting down: SERVICE_NOT_AVAILABLE
    i += 1
store.shutdown()
"""


class Lines:
    """The lines a stream produced so far, read by a thread."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, needle: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines):
                return True
            time.sleep(0.005)
        return False

    def text(self) -> str:
        self._thread.join(10)
        return "".join(self.lines)


def service_pids(root: str) -> list[int]:
    """Service processes of a node on root, found in /proc (their command line names it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if b"--service" in args and root.encode() in args:
            pids.append(int(entry))
    return pids


def assert_clean_reopen(root: str) -> None:
    assert not os.path.exists(os.path.join(root, "abort"))
    assert service_pids(root) == []
    check_store(root).raise_if_failed()
    with MessageStore(root) as store:
        rec = store.recovery
        assert rec.clean_shutdown, rec.summary()
        assert rec.redispatched_records == 0 and not rec.index_files_deleted and not rec.index_damage, rec.summary()


def run_node(root: str, rng: random.Random, *, producers: int, how: str) -> bool:
    """One node, signalled at a random moment; True when the signal came while it was opening."""
    node = subprocess.Popen([sys.executable, "-m", "mqstore", "node", root, *SETTINGS], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = Lines(node.stdout), Lines(node.stderr)
    procs = []
    try:
        assert err.wait_for("opening", 30), err.text()  # Python is up and the command runs
        for _ in range(producers):
            procs.append(subprocess.Popen([sys.executable, "-c", PRODUCER, root], env=ENV,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        # anywhere from recovery through the services starting to a node at work
        time.sleep(rng.uniform(0, 1.5))
        if how == "sigterm":
            node.send_signal(signal.SIGTERM)
        else:
            os.killpg(node.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            if how == "twice":
                time.sleep(rng.uniform(0, 0.3))
                os.killpg(node.pid, signal.SIGINT)
        code = node.wait(90)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    stderr = err.text()
    assert code == 0, f"exit {code}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "stopped cleanly" in out.text()
    for p in procs:
        assert b"Traceback" not in p.stderr.read()
    return "once the store is open" in stderr


@pytest.mark.slow
def test_a_node_stops_cleanly_on_signals_at_random_moments(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20_000,
                      max_hash_slot_num=1000, max_index_num=4000) as store:
        for i in range(20_000):  # something to recover and re-check at every start
            store.put_message(Message("Sig", b"x" * 100, queue_id=i % 4, keys=[f"p{i}"])).check()
    rng = random.Random(14)
    during_start = 0
    for i in range(12):
        during_start += run_node(root, rng, producers=i % 3, how=("sigint", "sigterm", "twice")[i % 3])
        assert_clean_reopen(root)
    assert during_start >= 2  # some signals came during recovery or while the services started


def test_an_embedded_owner_interrupted_while_it_opens_leaves_no_process_and_no_abort(tmp_path):
    """KeyboardInterrupt in a program while MessageStore(..., service_mode="processes") starts its
    service processes: the half-open store is shut down the normal way."""
    root = str(tmp_path / "store")
    script = f"""
import os, signal, sys, threading
sys.path.insert(0, {ROOT!r})
from mqstore import MessageStore
import mqstore.node as node

real_spawn = node.Supervisor._spawn
def spawn(self, sp):
    real_spawn(self, sp)
    if sp.kind == "dispatcher":  # two services are running, two are not started yet
        os.kill(os.getpid(), signal.SIGINT)
node.Supervisor._spawn = spawn
try:
    MessageStore({root!r}, service_mode="processes", mapped_file_size_commit_log=1 << 20)
except KeyboardInterrupt:
    print("interrupted")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.stdout.strip() == "interrupted", proc.stderr[-3000:]
    assert_clean_reopen(root)

