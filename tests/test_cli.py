"""The ``mqstore`` command (mqstore.cli): verify and info on real store directories."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mqstore import Message, MessageStore
from mqstore.checker import check_store
from mqstore.cli import COMMANDS, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, main

REPO = str(Path(__file__).resolve().parents[1])
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)}
SMALL = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024}


def fill(store: MessageStore, n: int, queues: int = 3) -> None:
    for i in range(n):
        store.put_message(Message("T", b"payload-%05d-" % i + b"x" * 80, queue_id=i % queues)).check()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def closed_store(open_store, n: int = 1000) -> str:
    store = open_store()
    fill(store, n)
    store.shutdown()
    return store.root


def snapshot(root: str) -> dict[str, tuple[int, int, str]]:
    """(size, mtime_ns, sha256) of every file under root."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns,
                                                hashlib.sha256(Path(path).read_bytes()).hexdigest())
    return out


def kill_writer(root: str, n: int) -> None:
    """A child puts n messages and SIGKILLs itself: the store is left crashed (abort file)."""
    code = textwrap.dedent(f"""
        import os, signal
        from mqstore import MessageStore, Message
        s = MessageStore({root!r}, mapped_file_size_commit_log={SMALL['mapped_file_size_commit_log']})
        for i in range({n}):
            s.put_message(Message("T", b"k" * 100, queue_id=i % 2)).check()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=CHILD_ENV, capture_output=True, timeout=60)
    assert r.returncode == -9, r.stderr


# -- verify -------------------------------------------------------------------------------
def test_verify_clean_store(open_store, capsys):
    root = closed_store(open_store)
    code, out, err = run(capsys, "verify", root)
    assert code == EXIT_OK and err == ""
    assert out.startswith(f"store {root}: OK\n")
    assert "shut down cleanly" in out and "1,000 records" in out
    assert "T-0: offsets 0..333 (334 records)" in out and "T-2: offsets 0..332 (333 records)" in out
    assert "positions: wrote=" in out and "PROBLEM" not in out


def test_verify_json(open_store, capsys):
    root = closed_store(open_store, 500)
    code, out, _ = run(capsys, "verify", "--json", root)
    report = json.loads(out)
    assert code == EXIT_OK
    assert report["ok"] is True and report["problems"] == [] and report["status"] == "clean"
    assert report["records"] == 500 and report["check_crc"] is True
    assert report["control_block"]["wrote"] == report["valid_end"]
    assert [(q["topic"], q["queue_id"], q["count"]) for q in report["queues"]] == [("T", 0, 167), ("T", 1, 167),
                                                                                   ("T", 2, 166)]


def flip_body_byte(root: str, index: int) -> str:
    """Flip one byte inside the body of message index; returns the CommitLog file's name."""
    cdir = os.path.join(root, "commitlog")
    needle = b"payload-%05d-" % index
    for name in sorted(os.listdir(cdir)):
        path = os.path.join(cdir, name)
        data = bytearray(Path(path).read_bytes())
        at = data.find(needle)
        if at >= 0:
            data[at + len(needle) + 5] ^= 0xFF
            Path(path).write_bytes(data)
            return name
    raise AssertionError(f"message {index} not found")


def test_verify_corrupted_record(open_store, capsys, tmp_path):
    root = closed_store(open_store, 1000)
    broken = str(tmp_path / "broken")
    shutil.copytree(root, broken)  # the fixture checks the original at teardown
    name = flip_body_byte(broken, 990)  # in the last file that holds records

    code, out, err = run(capsys, "verify", broken)
    assert code == EXIT_PROBLEMS and err == ""
    assert "PROBLEM(S)" in out.splitlines()[0]
    problems = [line for line in out.splitlines() if line.startswith("  PROBLEM ")]
    assert problems and f"PROBLEM {name} @ " in problems[0] and "body CRC" in problems[0]
    assert "990 records" in out  # the scan stops at the damaged record

    code, out, _ = run(capsys, "verify", "--json", broken)
    report = json.loads(out)
    assert code == EXIT_PROBLEMS and report["ok"] is False
    assert report["problems"][0]["where"] == name and "body CRC" in report["problems"][0]["message"]

    # without CRCs the flipped body byte goes unnoticed: --no-crc really turns them off
    code, out, _ = run(capsys, "verify", "--no-crc", broken)
    assert code == EXIT_OK and "(CRC not checked)" in out


def test_verify_not_a_store(tmp_path, capsys):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    afile = tmp_path / "afile"
    afile.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {junk: "is not empty and holds no store files (found: notes.txt)", tmp_path / "missing": "does not exist",
             afile: "is a file, not a store directory", empty: "is an empty directory"}
    for path, why in cases.items():
        for command in COMMANDS:
            code, out, err = run(capsys, command, str(path))
            assert code == EXIT_USAGE and out == ""
            assert err == f"mqstore {command}: not a store: {path} {why}\n", err
    assert sorted(os.listdir(junk)) == ["notes.txt"] and os.listdir(empty) == []


def test_usage_errors(capsys):
    for argv in ([], ["verify"], ["frobnicate", "x"], ["verify", "--bogus", "x"]):
        code, _, err = run(capsys, *argv)
        assert code == EXIT_USAGE and err.startswith("usage: mqstore")
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK and "verify" in out and "info" in out and "exit codes" in out


def test_verify_crashed_store_tolerates_a_torn_tail(tmp_path, capsys):
    root = str(tmp_path / "crashed")
    kill_writer(root, 700)
    code, out, _ = run(capsys, "verify", root)
    assert code == EXIT_OK, out
    assert "did not shut down cleanly" in out and "700 records" in out

    # a record torn by the crash: bytes after the end that do not parse; the next open cuts them
    end = check_store(root, allow_torn_tail=True).valid_end
    size = SMALL["mapped_file_size_commit_log"]
    path = os.path.join(root, "commitlog", f"{end - end % size:020d}")
    # check_store accepts a torn tail only in the last file, so drop the empty file(s) the
    # allocator may have created ahead before the kill (it calls a torn record followed by a
    # pre-allocated file "corrupt record in a file that is not the last")
    for name in os.listdir(os.path.join(root, "commitlog")):
        if name.isdigit() and int(name) > end:
            os.unlink(os.path.join(root, "commitlog", name))
    with open(path, "r+b") as f:
        f.seek(end % size)
        f.write(b"\x00\x00\x01\x00\xda\xa3\x20\xa7torn")
    code, out, _ = run(capsys, "verify", root)
    assert code == EXIT_OK and "torn tail: 12 bytes after the end of the log" in out, out
    # the same bytes after a clean shutdown are corruption
    os.unlink(os.path.join(root, "abort"))
    code, out, _ = run(capsys, "verify", root)
    assert code == EXIT_PROBLEMS and "bytes after the end of the log are not zero" in out


# -- info ---------------------------------------------------------------------------------
def test_info_closed_store(open_store, capsys):
    root = closed_store(open_store, 1000)
    code, out, err = run(capsys, "info", root)
    assert code == EXIT_OK and err == ""
    assert "status: not running; shut down cleanly" in out and "lock file: free, abort file: absent" in out
    for name in sorted(os.listdir(os.path.join(root, "commitlog"))):
        assert f"    {name}          65,536" in out
    assert "physic_msg_timestamp" in out and "state CLOSED" in out and f"owner pid {os.getpid()}" in out
    assert "3 of 16,384 queue slots used" in out and "put_messages=1000" in out

    code, out, _ = run(capsys, "info", "--json", root)
    info = json.loads(out)
    assert code == EXIT_OK
    assert info["status"] == "clean" and info["lock_held"] is False and info["abort_file"] is False
    assert info["entries"] == ["checkpoint", "commitlog", "consumequeue", "lock", "mqstore.shm"]
    assert info["checkpoint"]["physic_msg_timestamp"] > 0
    ctl = info["control_block"]
    assert ctl["state"] == "CLOSED" and ctl["queues"] == 3
    assert ctl["positions"]["wrote"] == ctl["positions"]["flushed"] == check_store(root).valid_end
    assert ctl["stats"]["put_messages"] == 1000 and len(ctl["stats"]) == 40


def test_info_and_verify_while_the_store_is_held_open(open_store, capsys):
    store = open_store()
    fill(store, 300)
    store.flush()
    code, out, _ = run(capsys, "info", store.root)
    assert code == EXIT_OK
    assert f"status: running: a store holds the lock (owner pid {os.getpid()})" in out
    assert "lock file: held, abort file: present" in out and "state READY" in out

    code, out, _ = run(capsys, "info", "--json", store.root)
    info = json.loads(out)
    assert info["status"] == "running" and info["lock_held"] is True and info["abort_file"] is True
    assert info["control_block"]["positions"]["wrote"] == store.max_phy_offset
    assert info["control_block"]["stats"]["put_messages"] == 300

    code, out, _ = run(capsys, "verify", "--json", store.root)
    report = json.loads(out)
    assert code == EXIT_OK and report["status"] == "running" and report["records"] == 300
    assert report["control_block"]["wrote"] == store.max_phy_offset
    fill(store, 10)  # the store is still fully usable
    assert store.next_queue_offset("T", 0) == 104


def test_commands_do_not_modify_the_store(open_store, capsys, tmp_path):
    root = closed_store(open_store, 800)
    before = snapshot(root)
    for argv in (["verify", root], ["verify", "--json", "--no-crc", root], ["info", root], ["info", "--json", root]):
        assert run(capsys, *argv)[0] == EXIT_OK
    assert snapshot(root) == before

    crashed = str(tmp_path / "crashed")  # a crashed store is not recovered by looking at it
    kill_writer(crashed, 300)
    before = snapshot(crashed)
    assert run(capsys, "info", crashed)[0] == EXIT_OK and run(capsys, "verify", crashed)[0] == EXIT_OK
    assert snapshot(crashed) == before


# -- the console entry --------------------------------------------------------------------
def run_module(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mqstore.cli", *argv], cwd=REPO, env=CHILD_ENV,
                          capture_output=True, text=True, timeout=timeout)


def test_console_entry_through_a_subprocess(open_store, tmp_path):
    root = closed_store(open_store, 200)
    r = run_module("verify", root)
    assert r.returncode == EXIT_OK and r.stdout.startswith(f"store {root}: OK") and r.stderr == ""
    r = run_module("verify", str(tmp_path))
    assert r.returncode == EXIT_USAGE and r.stdout == ""
    assert r.stderr.startswith("mqstore verify: not a store: ") and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.slow
def test_verify_while_another_process_writes(tmp_path):
    """A store written by another process right now verifies clean, again and again."""
    root = str(tmp_path / "live")
    stop = tmp_path / "stop"
    code = textwrap.dedent(f"""
        import os, time
        from mqstore import MessageStore, Message
        s = MessageStore({root!r}, mapped_file_size_commit_log={SMALL['mapped_file_size_commit_log']})
        print("ready", flush=True)
        i = 0
        while not os.path.exists({str(stop)!r}):
            s.put_message(Message("L", b"w" * (50 + i % 300), queue_id=i % 4)).check()
            i += 1
            if i % 50 == 0:
                time.sleep(0.001)
        s.shutdown()
        print("wrote", i, flush=True)
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=CHILD_ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        time.sleep(0.2)
        for _ in range(5):
            r = run_module("verify", "--json", root)
            assert r.returncode == EXIT_OK, r.stdout + r.stderr
            report = json.loads(r.stdout)
            assert report["status"] == "running" and report["records"] > 0
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    written = int(out.split()[-1])
    r = run_module("verify", "--json", root)
    report = json.loads(r.stdout)
    assert r.returncode == EXIT_OK and report["status"] == "clean" and report["records"] == written
