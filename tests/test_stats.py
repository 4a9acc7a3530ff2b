"""``mqstore stats`` (mqstore.tools.stats): live figures read from a store's control block only.

The live tests run a real writer in another OS process and the command in a third; the rate
arithmetic is tested as the pure function it is, on hand-made snapshots.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mqstore import Message, MessageStore
from mqstore.log._shm import STAT_NAMES
from mqstore.exit_codes import EXIT_OK, EXIT_USAGE
from mqstore.tools.cli import main
from mqstore.tools.stats import Snapshot, StatsReader, figures, format_lines, rates, render

REPO = str(Path(__file__).resolve().parents[1])
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)}
SMALL = {"mapped_file_size_commit_log": 256 * 1024, "max_message_size": 16 * 1024}

WRITER = textwrap.dedent("""
    import os, sys, time
    from mqstore import MessageStore, Message
    root, stop, flush = sys.argv[1:4]
    s = MessageStore(root, mapped_file_size_commit_log=256 * 1024, flush_disk_type=flush)
    size = s.put_message(Message("L", b"w" * 100, queue_id=0)).check().wrote_bytes
    print("ready", size, flush=True)
    n = 1
    while not os.path.exists(stop):
        s.put_message(Message("L", b"w" * 100, queue_id=n % 4)).check()
        n += 1
        if n % 20 == 0:
            time.sleep(0.001)  # a steady trickle, not a disk-filling flood
    s.shutdown()
    print("wrote", n, flush=True)
""")


def stats_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mqstore.tools.cli", "stats", *argv], cwd=REPO, env=CHILD_ENV,
                          capture_output=True, text=True, timeout=60)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


# -- a store written by another process ---------------------------------------------------
def test_counters_read_while_another_process_puts_never_show_more_messages_than_requests(tmp_path):
    # a put bumps put_requests before put_messages before put_bytes; a reader that took them
    # first to last saw a put that began and ended between its two loads (CI, once in ~2,000)
    from mqstore.log._shm import ControlBlock
    root, stop = str(tmp_path / "live"), tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, root, str(stop), "ASYNC_FLUSH"], cwd=REPO,
                              env=CHILD_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, size = writer.stdout.readline().split()
        assert ready == "ready", writer.stderr.read()
        ctl = ControlBlock.attach(os.path.join(root, "mqstore.shm"), readonly=True)
        seen = set()
        for _ in range(200_000):
            c = ctl.stats()
            assert c["put_requests"] >= c["put_messages"] and c["put_bytes"] <= c["put_messages"] * int(size), c
            seen.add(c["put_messages"])
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert len(seen) > 10  # the reads overlapped the puts


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_stats_of_a_store_another_process_writes(tmp_path, flush):
    root, stop = str(tmp_path / "live"), tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, root, str(stop), flush], cwd=REPO, env=CHILD_ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, size = writer.stdout.readline().split()
        assert ready == "ready", writer.stderr.read()
        size = int(size)
        r = stats_cli(root, "--json", "--count", "2", "--interval", "0.2")
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    total = int(out.split()[-1])
    assert r.returncode == EXIT_OK and r.stderr == "", r.stderr
    first, second = samples = json_lines(r.stdout)
    for s in samples:
        assert s["status"] == "running" and s["running"] and s["note"] is None
        assert s["owner_pid"] == writer.pid and s["state"] == "READY" and s["generation"] == 1
        assert s["flush_disk_type"] == flush and s["running_flags"] == []
        rt = s["rates"]
        assert not rt["restarted"] and rt["interval_s"] > 0
        assert rt["puts_per_s"] > 0 and rt["messages_per_s"] > 0 and rt["bytes_per_s"] > 0
        assert rt["lock_acquires_per_s"] > 0 and rt["lock_hold_avg_us"] is not None
        assert s["deltas"]["put_messages"] > 0 and all(d is not None and d >= 0 for d in s["deltas"].values())
        c, p = s["counters"], s["positions"]
        assert set(c) == set(STAT_NAMES)
        # one record size, and the counters were read before the positions
        assert c["put_bytes"] % size == 0 and c["put_messages"] <= total
        assert c["put_requests"] >= c["put_messages"] and c["put_bytes"] <= p["wrote"]
        assert p["min_phy"] <= p["dispatched"] <= p["committed"] <= p["wrote"]
        assert p["flushed"] <= p["committed"]
        assert s["dispatch_behind_bytes"] == p["committed"] - p["dispatched"] >= 0 and s["dispatch_lag_ms"] >= 0
        if flush == "SYNC_FLUSH":  # every put waits for its flush
            assert s["deltas"]["group_commit_waits"] > 0 and rt["flushes_per_s"] > 0
            assert rt["flush_avg_ms"] is not None and rt["group_commit_wait_avg_ms"] is not None
    assert all(second["counters"][n] >= first["counters"][n] for n in STAT_NAMES if n != "flush_ns_last")
    assert second["counters"]["put_messages"] - first["counters"]["put_messages"] == second["deltas"]["put_messages"]

    # stopped: the last values, exactly what was put, and rates of nothing
    r = stats_cli(root, "--json", "--once", "--interval", "0.05")
    assert r.returncode == EXIT_OK, r.stderr
    [s] = json_lines(r.stdout)
    assert s["status"] == "clean" and not s["running"] and s["state"] == "CLOSED"
    assert s["note"].startswith("no owner is running") and str(writer.pid) in s["note"]
    c, p = s["counters"], s["positions"]
    assert c["put_requests"] == c["put_messages"] == total and c["put_bytes"] == total * size
    assert p["wrote"] == p["committed"] == p["flushed"] == p["dispatched"] and c["dispatch_records"] == total
    assert s["dispatch_behind_bytes"] == 0 and s["unflushed_bytes"] == 0
    assert all(d == 0 for d in s["deltas"].values()) and s["rates"]["puts_per_s"] == 0


@pytest.fixture
def stopped_store(open_store) -> MessageStore:
    """A store that was written and shut down cleanly."""
    store = open_store()
    for i in range(50):
        store.put_message(Message("T", b"x" * 50, queue_id=i % 2)).check()
    store.shutdown()
    return store


def test_stats_reads_without_changing_anything(stopped_store):
    """Read-only: the block's bytes and every store file stay as they were."""
    store = stopped_store
    before = tree(store.root)
    r = stats_cli(store.root, "--count", "2", "--interval", "0.05")
    assert r.returncode == EXIT_OK, r.stderr
    assert tree(store.root) == before


def tree(root: str) -> dict[str, tuple[int, str]]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = (os.stat(path).st_mtime_ns, hashlib.sha256(Path(path).read_bytes())
                                                .hexdigest())
    return out


# -- output forms -------------------------------------------------------------------------
def test_plain_blocks_without_a_terminal(stopped_store):
    store = stopped_store
    r = stats_cli(store.root, "--count", "2", "--interval", "0.05")
    assert r.returncode == EXIT_OK and "\x1b" not in r.stdout
    blocks = r.stdout.split("\n\n")
    assert len(blocks) == 2 and all(b.startswith(f"store {store.root}") for b in blocks)
    assert "NOTE: no owner is running: it shut down cleanly." in blocks[0]
    assert "    messages" in blocks[1] and "events (interval/total): lock hold warnings 0/0" in blocks[1]


def test_table_redraws_in_place_on_a_terminal(stopped_store):
    store = stopped_store
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mqstore.tools.cli", "stats", store.root, "--count", "2",
                             "--interval", "0.05"], cwd=REPO, env={**CHILD_ENV, "COLUMNS": "300"}, stdout=slave,
                            stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=60) == EXIT_OK, proc.stderr.read()
    screen = b"".join(chunks).decode().replace("\r\n", "\n")
    # three frames: at once (no rates yet), then one per sample, each after "up to the frame's
    # first line (CPL), clear to the end of the screen (ED)"
    first, *redraws = re.split(r"\x1b\[(\d+)F\x1b\[J", screen)
    assert "\x1b" not in "".join(redraws[1::2])
    assert first.startswith(f"store {store.root}  ") and "rates: not yet" in first
    height = len(first.splitlines())
    assert redraws[0::2] == [str(height)] * 2
    for frame in redraws[1::2]:
        assert frame.startswith(f"store {store.root}  ") and " rates over " in frame and len(frame.splitlines()) == height


def test_running_flags_and_owner_of_a_store_open_here(open_store, capsys):
    store = open_store()
    store.put("T", b"x").check()
    store.ctl.set_running_flag("DISK_FULL")
    try:
        assert main(["stats", store.root, "--once", "--interval", "0.01", "--json"]) == EXIT_OK
        [s] = json_lines(capsys.readouterr().out)
        assert s["running_flags"] == ["DISK_FULL"] and s["owner_pid"] == os.getpid() and s["status"] == "running"
        assert main(["stats", store.root, "--once", "--interval", "0.01"]) == EXIT_OK
        assert "running flags: DISK_FULL" in capsys.readouterr().out
    finally:
        store.ctl.set_running_flag("DISK_FULL", False)


def test_reader_follows_a_reopened_store(open_store):
    """Each open lays out a new block: the reader re-attaches, and the rates across the reopen
    are None (the counters restarted), never negative."""
    store = open_store()
    for _ in range(10):
        store.put("T", b"x").check()
    with StatsReader(store.root) as reader:
        before = reader.snapshot()
        store.shutdown()
        store = open_store()
        store.put("T", b"y").check()
        after = reader.snapshot()
        assert after.incarnation != before.incarnation and after.created_ms >= before.created_ms
        assert (before.counters["put_messages"], after.counters["put_messages"]) == (10, 1)
        r = rates(before, after)
        assert r.restarted and r.puts_per_s is None and set(r.deltas.values()) == {None}
        assert "reopened between the samples" in " ".join(format_lines(figures(before, after))[:2])
        again = reader.snapshot()
        assert rates(after, again).deltas["put_messages"] == 0


# -- not a store --------------------------------------------------------------------------
def test_not_a_store(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = stats_cli(str(tmp_path))
    assert r.returncode == EXIT_USAGE and r.stdout == ""
    assert r.stderr == f"mqstore stats: not a store: {tmp_path} is not empty and holds no store files (found: " \
                       "notes.txt)\n"
    r = stats_cli(str(tmp_path / "missing"))
    assert r.returncode == EXIT_USAGE and r.stderr.startswith("mqstore stats: not a store: ")
    (tmp_path / "rocketmq").mkdir()
    (tmp_path / "rocketmq" / "commitlog").mkdir()
    r = stats_cli(str(tmp_path / "rocketmq"))
    assert r.returncode == EXIT_USAGE and r.stderr.count("\n") == 1
    assert "has no control block (mqstore.shm)" in r.stderr


def test_usage_errors(open_store, capsys):
    root = open_store().root
    for argv in (["--interval", "0"], ["--interval", "x"], ["--count", "0"], ["--once", "--count", "2"]):
        assert main(["stats", root, *argv]) == EXIT_USAGE
        assert "error" in capsys.readouterr().err
    with pytest.raises(ValueError, match="interval"):
        render(root, interval=0)


# -- the arithmetic, on hand-made snapshots -----------------------------------------------
def snap(t_s: float, *, created_ms: int = 1_000, generation: int = 1, inode: int = 7, status: str = "running",
         positions: dict[str, int] | None = None, timestamps: dict[str, int] | None = None,
         **counters: int) -> Snapshot:
    return Snapshot(
        root="/s", mono_ns=int(t_s * 1e9), wall_ms=2_000 + int(t_s * 1000), status=status, owner_pid=42,
        state="READY", generation=generation, created_ms=created_ms, block_inode=inode, lock_kind="spin",
        sync_flush=False, file_size=1 << 20, queues=1,
        positions={"wrote": 0, "committed": 0, "flushed": 0, "dispatched": 0, "confirmed": 0, "min_phy": 0,
                   **(positions or {})},
        timestamps={"last_store_timestamp": 0, "dispatched_store_timestamp": 0, "flushed_store_timestamp": 0,
                    **(timestamps or {})},
        running_flags=(), lock_holder_pid=None, lock_begin_ms=0,
        error_cells={"flush_error_count": 0, "flush_last_errno": 0, "alloc_error_count": 0, "alloc_error_errno": 0},
        counters={name: counters.get(name, 0) for name in STAT_NAMES})


def test_rates_between_two_snapshots():
    a = snap(10.0, put_requests=100, put_messages=150, put_bytes=15_000, lock_acquires=100,
             lock_hold_ns_total=200_000, lock_hold_ns_max=9_000, flush_count=4, flush_ns_total=8_000_000,
             flush_ns_max=3_000_000, alloc_count=1, alloc_ns_total=5_000_000, alloc_ns_max=5_000_000)
    b = snap(12.0, put_requests=300, put_messages=550, put_bytes=55_000, lock_acquires=300,
             lock_hold_ns_total=600_000, lock_hold_ns_max=12_000, flush_count=6, flush_ns_total=12_000_000,
             flush_ns_max=3_000_000, alloc_count=1, alloc_ns_total=5_000_000, alloc_ns_max=5_000_000,
             flush_ns_last=1_000_000)
    r = rates(a, b)
    assert r.interval_s == 2.0 and not r.restarted
    assert (r.puts_per_s, r.messages_per_s, r.bytes_per_s) == (100.0, 200.0, 20_000.0)
    assert r.lock_acquires_per_s == 100.0 and r.lock_hold_avg_us == 2.0
    assert r.lock_hold_max_us == 12.0, "the max rose in the interval: that is the interval's max"
    assert r.flushes_per_s == 1.0 and r.flush_avg_ms == 2.0
    assert r.flush_max_ms is None, "no new high: the interval's max is only bounded by the since-open max"
    assert r.allocs_per_s == 0.0 and r.alloc_avg_ms is None and r.alloc_max_ms is None
    assert r.group_commit_wait_avg_ms is None and r.roll_wait_avg_ms is None
    assert "flush_ns_last" not in r.deltas and r.deltas["put_bytes"] == 40_000


def test_no_negative_rates_when_the_store_restarted():
    a = snap(1.0, put_requests=1_000_000, put_messages=1_000_000, put_bytes=10**9, lock_hold_ns_max=50_000)
    for b in (snap(2.0, created_ms=5_000, put_requests=10, put_messages=10, put_bytes=1_000),
              snap(2.0, generation=2, put_requests=10, put_messages=10, put_bytes=1_000),
              snap(2.0, inode=8, put_requests=2_000_000, put_messages=2_000_000, put_bytes=2 * 10**9)):
        r = rates(a, b)
        assert r.restarted
        values = [v for f, v in dataclasses.asdict(r).items() if f not in ("interval_s", "restarted", "deltas")]
        assert values == [None] * len(values) and set(r.deltas.values()) == {None}
        assert figures(a, b)["deltas"] == r.deltas


def test_a_counter_that_went_back_gives_no_rate():
    r = rates(snap(1.0, put_requests=50, put_messages=50), snap(2.0, put_requests=40, put_messages=60))
    assert not r.restarted and r.puts_per_s is None and r.deltas["put_requests"] is None
    assert r.messages_per_s == 10.0


def test_no_time_between_samples_gives_no_rate():
    r = rates(snap(1.0, put_requests=5), snap(1.0, put_requests=9))
    assert r.puts_per_s is None and r.deltas["put_requests"] == 4


def test_dispatch_figures_of_a_snapshot():
    s = snap(1.0, positions={"wrote": 900, "committed": 900, "dispatched": 600},
             timestamps={"last_store_timestamp": 5_250, "dispatched_store_timestamp": 5_000})
    assert (s.dispatch_behind_bytes, s.dispatch_lag_ms, s.unflushed_bytes) == (300, 250, 900)
    caught_up = snap(1.0, positions={"wrote": 900, "committed": 900, "dispatched": 900},
                     timestamps={"last_store_timestamp": 5_250, "dispatched_store_timestamp": 5_000})
    assert (caught_up.dispatch_behind_bytes, caught_up.dispatch_lag_ms) == (0, 0)


def test_format_lines_before_and_after_a_second_sample():
    a = snap(1.0, put_requests=10, put_messages=10, put_bytes=1_000, flush_errors=1, status="crashed")
    first = format_lines(figures(None, a))
    assert "rates: not yet" in first[0] and any(line.startswith("  NOTE: no owner is running: the last run did not")
                                                for line in first)
    assert any(line.split()[:4] == ["puts", "-", "-", "10"] for line in first)
    assert any("flush errors -/1" in line for line in first), "other events once they happened"
    b = snap(2.0, put_requests=30, put_messages=30, put_bytes=3_000, flush_errors=1, status="crashed")
    lines = format_lines(figures(a, b))
    assert "rates over 1.00 s" in lines[0]
    assert any(line.split()[:4] == ["puts", "20", "20", "30"] for line in lines)
    assert all(len(line) <= 100 for line in lines)


@pytest.mark.parametrize("width, height", [(100, None), (80, None), (80, 24), (60, 24), (80, 12), (40, 8)])
def test_the_screen_fits_narrow_and_short_terminals_without_cutting_words(width, height):
    """Issue 14: at 80 columns words were cut, and a short terminal scrolled."""
    a = snap(1.0, put_requests=10, put_messages=10, put_bytes=1_000, flush_errors=1, status="crashed",
             lock_acquires=10, lock_hold_ns_total=10_000, flush_count=5, flush_ns_total=5_000_000,
             positions={"wrote": 123_456_789_012, "committed": 123_456_789_012, "flushed": 123_456_000_000,
                        "dispatched": 123_456_789_012, "min_phy": 1 << 30})
    b = snap(2.0, put_requests=30_000, put_messages=3_000_000, put_bytes=3_000_000_000, flush_errors=1,
             status="crashed", lock_acquires=30_000, lock_hold_ns_total=90_000_000, flush_count=900,
             flush_ns_total=9_000_000_000, positions={"wrote": 223_456_789_012, "committed": 223_456_789_012,
                                                      "flushed": 223_456_000_000, "dispatched": 223_456_789_000,
                                                      "min_phy": 1 << 30})
    fig = figures(a, b)
    wide = format_lines(fig)
    lines = format_lines(fig, width, height)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    if height is not None:
        assert len(lines) <= height
        if len(wide) > height:
            assert lines[-1].startswith("(") and "more line(s)" in lines[-1]
            if height >= 12:
                assert any("positions" in line for line in lines), "the important parts are kept"
            assert lines[0].startswith("store /s")
    words = {w for line in wide for w in line.split()}
    marker = {w for w in lines[-1].split()} if lines[-1].startswith("(") else set()
    cut = [w for line in lines for w in line.split() if w not in words and w not in marker]
    assert cut == [], f"words cut at {width} columns: {cut}"

