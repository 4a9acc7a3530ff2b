"""The ``mqstore`` command (mqstore.tools.cli): verify, info, inspect, dump and recover on real store directories."""

from __future__ import annotations

import hashlib
import io
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
from mqstore.log._shm import STAT_NAMES
from mqstore.tools.checker import check_store
from mqstore.exit_codes import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE
from mqstore.tools.cli import COMMANDS, main
from mqstore.tools.commands.common import ProgressBar

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


def row(out: str, *first: str) -> list[str]:
    """The cells of the first table row of out that starts with the cells first."""
    for line in out.splitlines():
        cells = line.split()
        if cells[:len(first)] == list(first):
            return cells
    raise AssertionError(f"no row starting with {first} in:\n{out}")


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
    extra = {"dump": ["--phy", "0"]}  # dump needs to be told what to show
    for path, why in cases.items():
        for command in COMMANDS:
            if command in ("namesrv", "admin"):
                continue  # serve or ask no store directory (tests/test_namesrv.py, tests/test_broker_admin.py)
            if command in ("node", "broker") and why in ("does not exist", "is an empty directory"):
                continue  # a node (a broker) creates a new store there (tests/test_node.py)
            code, out, err = run(capsys, command, str(path), *extra.get(command, []))
            assert code == EXIT_USAGE and out == ""
            assert err == f"mqstore {command}: not a store: {path} {why}\n", err
    assert sorted(os.listdir(junk)) == ["notes.txt"] and os.listdir(empty) == []


def test_usage_errors(capsys):
    for argv in ([], ["verify"], ["frobnicate", "x"], ["verify", "--bogus", "x"]):
        code, _, err = run(capsys, *argv)
        assert code == EXIT_USAGE and err.startswith("usage: mqstore")
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK and "exit codes" in out
    assert all(name in out for name in ("verify", "info", "inspect", "dump", "recover"))


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
    assert info["entries"] == ["checkpoint", "commitlog", "consumequeue", "lock", "mqstore.clean.json", "mqstore.config.json",
                               "mqstore.shm"]
    assert info["checkpoint"]["physic_msg_timestamp"] > 0
    ctl = info["control_block"]
    assert ctl["state"] == "CLOSED" and ctl["queues"] == 3
    assert ctl["positions"]["wrote"] == ctl["positions"]["flushed"] == check_store(root).valid_end
    assert ctl["stats"]["put_messages"] == 1000 and len(ctl["stats"]) == len(STAT_NAMES)


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

    store.wait_dispatched()
    code, out, _ = run(capsys, "inspect", "--json", store.root)
    inv = json.loads(out)
    assert code == EXIT_OK and inv["status"] == "running" and inv["commitlog"]["end"] == store.max_phy_offset
    assert [q["max_offset"] for q in inv["queues"]] == [100, 100, 100]
    code, out, _ = run(capsys, "dump", store.root, "--topic", "T", "--queue", "2", "--from", "99")
    assert code == EXIT_OK and "payload-" not in out  # bodies only with --body
    assert "queue offset 99: unit phy" in out and "  queue offset        99\n" in out
    code, out, _ = run(capsys, "recover", store.root)
    assert code == EXIT_OK and "WARNING: a store holds the lock" in out and "recovery: abnormal" in out
    fill(store, 10)  # the store is still fully usable
    assert store.next_queue_offset("T", 0) == 104


def test_commands_do_not_modify_the_store(open_store, capsys, tmp_path):
    root = closed_store(open_store, 800)
    before = snapshot(root)
    for argv in (["verify", root], ["verify", "--json", "--no-crc", root], ["info", root], ["info", "--json", root],
                 ["inspect", root], ["inspect", "--json", root], ["dump", root, "--phy", "0", "--count", "900"],
                 ["dump", root, "--topic", "T", "--queue", "1", "--count", "500", "--json", "--body", "hex"],
                 ["recover", root], ["recover", "--json", "--no-crc", root]):
        assert run(capsys, *argv)[0] == EXIT_OK, argv
    assert snapshot(root) == before

    crashed = str(tmp_path / "crashed")  # a crashed store is not recovered by looking at it
    kill_writer(crashed, 300)
    before = snapshot(crashed)
    for argv in (["info", crashed], ["verify", crashed], ["inspect", crashed], ["recover", crashed],
                 ["dump", crashed, "--phy", "0", "--count", "300"]):
        assert run(capsys, *argv)[0] == EXIT_OK, argv
    assert snapshot(crashed) == before


# -- the console entry --------------------------------------------------------------------
def run_module(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mqstore.tools.cli", *argv], cwd=REPO, env=CHILD_ENV,
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


# -- inspect ------------------------------------------------------------------------------
INDEXED = {"max_hash_slot_num": 100, "max_index_num": 400}  # index files of 8,440 bytes, not 420 MB


def put_keyed(store: MessageStore, n: int, topic: str = "K", queues: int = 2) -> list:
    """n messages with tags and keys (so index files exist); returns the put results."""
    return [store.put_message(Message(topic, b"body-%05d" % i, queue_id=i % queues, tags="TagA" if i % 2 else "TagB",
                                      keys=f"key{i} other{i}")).check() for i in range(n)]


def test_inspect_lists_files_queues_and_index(open_store, capsys):
    store = open_store(**INDEXED)
    fill(store, 900)
    results = put_keyed(store, 300)
    store.wait_dispatched()
    end, first_k1 = store.max_phy_offset, results[1].wrote_offset
    store.shutdown()
    root = store.root

    code, out, err = run(capsys, "inspect", "--json", root)
    inv = json.loads(out)
    assert code == EXIT_OK and err == "" and inv["status"] == "clean"
    files = inv["commitlog"]["files"]
    names = sorted(n for n in os.listdir(os.path.join(root, "commitlog")) if n.isdigit())
    assert [f["name"] for f in files] == names and inv["commitlog"]["end"] == end
    assert all(f["stop_reason"] == "blank" and f["wrote"] == 65536 for f in files if f["file_from"] + 65536 <= end)
    holding = [f for f in files if f["file_from"] <= end < f["file_from"] + 65536]
    assert len(holding) == 1 and holding[0]["file_from"] + holding[0]["wrote"] == end
    assert sum(f["records"] for f in files) == 1200 and all(f["flushed"] == f["wrote"] for f in files)
    queues = {(q["topic"], q["queue_id"]): q for q in inv["queues"]}
    assert sorted(queues) == [("K", 0), ("K", 1), ("T", 0), ("T", 1), ("T", 2)]
    assert inv["topics"] == {"K": {"queues": 2, "messages": 300}, "T": {"queues": 3, "messages": 900}}
    k1 = queues[("K", 1)]
    assert (k1["min_offset"], k1["max_offset"], k1["messages"]) == (0, 150, 150)
    assert k1["min_phy_offset"] == first_k1 and k1["max_phy_offset"] == results[-1].wrote_offset
    assert k1["files"][0]["wrote"] == 150 * 20 and k1["files"][0]["dirty_bytes"] == 0
    index = inv["index_files"]
    # 600 keys, 399 entries per file: two files; index_count counts the unused entry #0
    assert [f["index_count"] for f in index] == [400, 600 - 399 + 1] and all(f["size"] == 8440 for f in index)
    assert index[0]["begin_timestamp"] == results[0].store_timestamp
    assert index[-1]["end_phy_offset"] == results[-1].wrote_offset

    code, out, _ = run(capsys, "inspect", root)
    assert code == EXIT_OK
    assert f"commitlog: {len(names)} file(s) of 65,536 bytes, records from 0 to {end:,}, flushed to {end:,}" in out
    assert row(out, names[0]) == [names[0], "0", "65,536", "65,536", str(files[0]["records"]), "blank"]
    last = holding[0]
    assert row(out, last["name"])[1:] == [f"{last['file_from']:,}", f"{last['wrote']:,}", f"{last['wrote']:,}",
                                          str(last["records"]), "end", "of", "log"]
    assert "topics: 2, queues: 5, messages: 1,200" in out
    assert row(out, "K", "1") == ["K", "1", "0", "150", "150", f"{first_k1:,}", f"{results[-1].wrote_offset:,}", "1"]
    assert row(out, "K/1") == ["K/1", "0" * 20, "0", "6,000,000", "3,000", "150", "-"]
    assert row(out, index[1]["name"])[1:2] == ["8,440"] and row(out, index[1]["name"])[-1] == "202"


def test_inspect_text_shortens_long_lists(open_store, capsys):
    store = open_store()
    for q in range(30):
        store.put_message(Message("Many", b"x", queue_id=q)).check()
    store.wait_dispatched()
    store.shutdown()
    code, out, _ = run(capsys, "inspect", store.root)
    assert code == EXIT_OK and "queues: 30" in out
    assert out.count("... 10 more queues (--json lists all)") == 1  # 15..24
    shown = [int(line.split()[1]) for line in out.splitlines() if line.startswith("    Many ")]
    assert shown == [*range(15), *range(25, 30)]
    inv = json.loads(run(capsys, "inspect", "--json", store.root)[1])
    assert [q["queue_id"] for q in inv["queues"]] == list(range(30))


# -- dump ---------------------------------------------------------------------------------
def test_dump_by_physical_offset_shows_every_field(open_store, capsys):
    store = open_store()
    fill(store, 560)  # about one file, so the walk below crosses into the next
    born = ("10.1.2.3", 4567)
    r = store.put_message(Message("Dump", "héllo\x01".encode(), queue_id=2, flag=7, tags="TagA", keys="k1 k2",
                                  properties={"color": "red"}, born_host=born, reconsume_times=3)).check()
    fill(store, 100)
    store.shutdown()

    code, out, err = run(capsys, "dump", store.root, "--phy", str(r.wrote_offset), "--json", "--body", "hex")
    assert code == EXIT_OK and err == ""
    got = json.loads(out)["records"]
    assert len(got) == 1 and got[0]["note"] is None
    rec = got[0]["record"]
    assert (rec["topic"], rec["queue_id"], rec["queue_offset"], rec["physical_offset"]) == (
        "Dump", 2, 0, r.wrote_offset)
    assert (rec["total_size"], rec["flag"], rec["sys_flag"], rec["reconsume_times"]) == (r.wrote_bytes, 7, 0, 3)
    assert rec["store_timestamp"] == r.store_timestamp and rec["born_host"] == "10.1.2.3:4567"
    assert rec["properties"] == {"TAGS": "TagA", "KEYS": "k1 k2", "color": "red"}
    assert rec["tags"] == "TagA" and rec["tags_code"] == 2598919 and rec["keys"] == ["k1", "k2"]
    assert rec["msg_id"] == r.msg_id and rec["body_crc_ok"] is True and rec["computed_body_crc"] == rec["body_crc"]
    assert rec["body"] == "héllo\x01".encode().hex() and rec["body_length"] == 7
    assert rec["sys_flag_names"] == ["TRANSACTION_NOT"] and rec["version"] == "V1"

    code, out, _ = run(capsys, "dump", store.root, "--phy", str(r.wrote_offset), "--body", "text")
    assert code == EXIT_OK
    assert out.startswith(f"record at {r.wrote_offset:,} (file 00000000000000065536, position "
                          f"{r.wrote_offset - 65536:,})\n")
    for line in ("  topic               Dump", "  flag                7", "  tags                TagA (tags code 2598919)",
                 "  keys                k1 k2", f"  msg id              {r.msg_id}", "  reconsume times     3",
                 "  body                7 bytes", "    héllo\\x01", "(ok)"):
        assert line in out, line


def test_dump_walks_records_across_files(open_store, capsys):
    store = open_store()
    results = [store.put_message(Message("W", b"w" * 200, queue_id=0)).check() for _ in range(400)]
    store.shutdown()
    # the last records of the first file, then the first of the second (the blank is skipped)
    last_in_first = max(i for i, r in enumerate(results) if r.wrote_offset < 65536)
    start = last_in_first - 2
    code, out, _ = run(capsys, "dump", store.root, "--phy", str(results[start].wrote_offset), "--count", "5", "--json")
    got = json.loads(out)["records"]
    assert code == EXIT_OK
    assert [e["physical_offset"] for e in got] == [r.wrote_offset for r in results[start:start + 5]]
    assert [e["record"]["queue_offset"] for e in got] == list(range(start, start + 5))
    assert [e["file"] for e in got] == ["00000000000000000000"] * 3 + ["00000000000000065536"] * 2
    # --count past the end of the log stops there
    code, out, _ = run(capsys, "dump", store.root, "--phy", str(results[-2].wrote_offset), "--count", "10")
    assert code == EXIT_OK and out.count("record at ") == 2 and out.endswith("(2 of 10 shown: the log ends there)\n")


def test_dump_by_queue_offset(open_store, capsys):
    store = open_store()
    fill(store, 300)  # T-1 holds messages 1, 4, 7, ...
    store.wait_dispatched()
    phys = {i: store.get_message("g", "T", 1, i, 1).physical_offsets[0] for i in range(100)}
    store.shutdown()
    code, out, _ = run(capsys, "dump", store.root, "--topic", "T", "--queue", "1", "--from", "5", "--count", "3",
                       "--json", "--body", "text")
    got = json.loads(out)
    assert code == EXIT_OK and (got["min_offset"], got["max_offset"]) == (0, 100)
    assert [e["queue_offset"] for e in got["records"]] == [5, 6, 7]
    assert [e["unit"]["phy_offset"] for e in got["records"]] == [phys[5], phys[6], phys[7]]
    assert [e["record"]["body"][:14] for e in got["records"]] == ["payload-00016-", "payload-00019-", "payload-00022-"]
    assert all(e["note"] is None and e["unit"]["size"] == e["record"]["total_size"] for e in got["records"])
    # default --from: the queue's min offset; --count past the end stops at the queue's end
    code, out, _ = run(capsys, "dump", store.root, "--topic", "T", "--queue", "1")
    assert code == EXIT_OK and out.startswith(f"queue offset 0: unit phy {phys[0]:,}, size ")
    code, out, _ = run(capsys, "dump", store.root, "--topic", "T", "--queue", "1", "--from", "98", "--count", "5")
    assert code == EXIT_OK and out.count("record at ") == 2 and "(2 of 5 shown: the queue ends there)" in out


def test_dump_shows_a_body_crc_mismatch(open_store, capsys, tmp_path):
    store = open_store()
    fill(store, 50)
    store.wait_dispatched()
    phy = store.get_message("g", "T", 1, 3, 1).physical_offsets[0]  # message 10
    store.shutdown()
    broken = str(tmp_path / "broken")
    shutil.copytree(store.root, broken)
    flip_body_byte(broken, 10)
    code, out, _ = run(capsys, "dump", broken, "--phy", str(phy))
    assert code == EXIT_OK and "MISMATCH: the body's CRC is " in out
    rec = json.loads(run(capsys, "dump", broken, "--phy", str(phy), "--json")[1])["records"][0]["record"]
    assert rec["body_crc_ok"] is False and rec["computed_body_crc"] != rec["body_crc"]


def test_dump_bad_offsets_name_the_cause(open_store, capsys):
    store = open_store()
    results = [store.put_message(Message("B", b"b" * 300, queue_id=i % 2)).check() for i in range(250)]
    store.wait_dispatched()
    end = store.max_phy_offset
    store.shutdown()
    root = store.root
    first = results[0]
    in_first = [r for r in results if r.wrote_offset < 65536]
    blank = in_first[-1].wrote_offset + in_first[-1].wrote_bytes  # where file 0's END_OF_FILE blank starts
    cases = {
        ("--phy", str(first.wrote_offset + 1)):
            f"offset 1 is not on a record boundary: it falls inside the record at 0 (TOTALSIZE {first.wrote_bytes}); "
            f"the next record is at {first.wrote_bytes}",
        ("--phy", str(end)): f"offset {end} is past the end of the log at {end}",
        ("--phy", str(10**9)): f"offset {10**9} is past the end of the log at {end}",
        ("--phy", "-5"): "offset -5 is negative",
        ("--phy", str(blank + 3)): f"offset {blank + 3} is in the END_OF_FILE blank of file 00000000000000000000 "
                                   f"(from {blank}); the next record is at 65536",
        ("--topic", "Nope", "--queue", "0"): "unknown queue Nope/0: no consumequeue/Nope/0 directory (queues: B/0, B/1)",
        ("--topic", "B", "--queue", "7"): "unknown queue B/7: no consumequeue/B/7 directory (queues: B/0, B/1)",
        ("--topic", "B", "--queue", "1", "--from", "125"): "queue offset 125 is out of range: B/1 holds offsets 0..124",
        ("--topic", "B", "--queue", "1", "--from", "-1"): "queue offset -1 is out of range: B/1 holds offsets 0..124",
        ("--topic", "B"): "--topic needs --queue Q",
        ("--phy", "0", "--from", "3"): "--queue and --from go with --topic, not with --phy",
    }
    for argv, why in cases.items():
        code, out, err = run(capsys, "dump", root, *argv)
        assert code == EXIT_USAGE and out == "", argv
        assert err.startswith(f"mqstore dump: {why}") and err.count("\n") == 1, err
    for argv in (["--count", "0", "--phy", "0"], ["--phy", "0", "--topic", "B"], []):
        code, _, err = run(capsys, "dump", root, *argv)
        assert code == EXIT_USAGE and err.startswith("usage: mqstore dump"), argv


# -- recover ------------------------------------------------------------------------------
def report_of(store: MessageStore) -> dict:
    return {k: v for k, v in store.recovery.to_dict().items() if k != "elapsed_ms"}


def test_recover_after_a_clean_shutdown_plans_nothing(open_store, capsys):
    root = closed_store(open_store, 900)
    before = snapshot(root)
    code, out, err = run(capsys, "recover", root)
    assert code == EXIT_OK and err == ""
    assert out.startswith(f"store {root}: recovery dry run (nothing was changed)\n")
    assert "recovery: normal" in out and "verdict: opening would drop nothing that was written" in out
    assert "re-dispatch 0 bytes (0 records)" in out
    plan = json.loads(run(capsys, "recover", "--json", root)[1])
    assert snapshot(root) == before
    assert plan["drops_data"] is False and plan["report"]["deleted_files"] == []
    assert plan["report"]["dispatch_from"] == plan["report"]["valid_end"]
    store = open_store(root)  # the real open does what the dry run said
    assert report_of(store) == plan["report"]
    assert plan["report"]["valid_end"] == store.max_phy_offset
    assert plan["report"]["stop_reason"] == "clean-close record" and plan["report"]["records"] == 0  # no scan


def crash_writer(root: str, n: int, config: dict, pause_every: int = 0) -> list[tuple[int, int, int, int]]:
    """A child puts n keyed messages into 2 queues (pausing 5 ms after every pause_every
    of them, so store timestamps differ), waits for dispatch and SIGKILLs itself; returns
    (phy, size, queue_id, queue_offset) of every message."""
    code = textwrap.dedent(f"""
        import json, os, signal, sys, time
        from mqstore import MessageStore, Message
        s = MessageStore({root!r}, **{config!r})
        out = []
        for i in range({n}):
            r = s.put_message(Message("T", b"m" * 150, queue_id=i % 2, keys=f"key{{i}}")).check()
            out.append((r.wrote_offset, r.wrote_bytes, i % 2, r.queue_offset))
            if {pause_every} and i % {pause_every or 1} == 0:
                time.sleep(0.005)
        s.wait_dispatched()
        sys.stdout.write(json.dumps(out))
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=CHILD_ENV, capture_output=True, timeout=60)
    assert r.returncode == -9, r.stderr
    return [tuple(m) for m in json.loads(r.stdout)]


def test_recover_dry_run_matches_the_real_open_after_a_torn_tail(tmp_path, capsys):
    """Power loss: the ConsumeQueues reached the disk, the CommitLog's last records did not
    (the first of them torn); queue 0 also ends in a torn unit. The dry run changes nothing
    and predicts exactly what the open then reports."""
    root = str(tmp_path / "torn")
    config = {**SMALL, **INDEXED, "mapped_file_size_consume_queue": 2000}
    msgs = crash_writer(root, 900, config)
    torn_phy, torn_size = msgs[-5][0], msgs[-5][1]
    size = SMALL["mapped_file_size_commit_log"]
    path = os.path.join(root, "commitlog", f"{torn_phy - torn_phy % size:020d}")
    with open(path, "r+b") as f:
        f.seek(torn_phy % size)
        head = f.read(30)
        f.seek(torn_phy % size)
        f.write(head + bytes(size - torn_phy % size - 30))  # 30 bytes of the record survive
    for name in os.listdir(os.path.join(root, "commitlog")):  # and no later file
        if int(name) > torn_phy:
            os.unlink(os.path.join(root, "commitlog", name))
    qdir = os.path.join(root, "consumequeue", "T", "0")
    qlast = os.path.join(qdir, sorted(os.listdir(qdir))[-1])
    units_in_last = (450 * 20) % 2000 // 20 or 100
    with open(qlast, "r+b") as f:
        f.seek(units_in_last * 20)
        f.write((12345).to_bytes(8, "big") + bytes(4) + (7).to_bytes(8, "big"))  # phyOffset set, size 0: torn
    with open(os.path.join(root, "checkpoint"), "r+b") as f:  # no index file was flushed: all go at the open
        f.seek(16)
        f.write(bytes(8))

    before = snapshot(root)
    r = run_module("recover", "--json", root)
    assert r.returncode == EXIT_PROBLEMS and r.stderr == "", r.stderr
    plan = json.loads(r.stdout)
    code, out, _ = run(capsys, "recover", root)
    assert code == EXIT_PROBLEMS
    assert snapshot(root) == before

    lost = msgs[-5:]
    expected_units = {f"T/{q}": sum(1 for m in lost if m[2] == q) for q in (0, 1)}
    rep = plan["report"]
    assert rep["valid_end"] == torn_phy and rep["mode"] == "abnormal"
    assert rep["dropped_bytes"] == len(head.rstrip(b"\x00")) and rep["deleted_files"] == []
    assert rep["queue_units_dropped"]["T/1"] == expected_units["T/1"]
    assert rep["queue_units_dropped"]["T/0"] >= expected_units["T/0"]  # (+1 where the torn unit is counted)
    queues = {(q["topic"], q["queue_id"]): q for q in plan["queues"]}
    # zeroed after the kept end of T/0: the units of the lost records, then the torn unit
    assert queues[("T", 0)]["bytes_zeroed"] == 20 * (expected_units["T/0"] + 1)
    assert queues[("T", 0)]["kept_offset"] == 450 - expected_units["T/0"]
    assert queues[("T", 1)]["kept_offset"] == 450 - expected_units["T/1"]
    assert plan["drops_data"] is True and plan["redispatch_bytes"] == torn_phy - rep["dispatch_from"]
    assert sorted(plan["index_files_destroyed"]) == sorted(os.listdir(os.path.join(root, "index")))
    assert f"valid end {torn_phy:,}" in out and "verdict: opening would drop" in out
    assert f"would zero {rep['dropped_bytes']} bytes after the valid end" in out

    store = MessageStore(root, **config)
    try:
        assert report_of(store) == rep
        assert store.get_max_offset_in_queue("T", 1) == 450 - expected_units["T/1"]  # rebuilt up to the valid end
        assert not os.path.exists(os.path.join(root, "index", plan["index_files_destroyed"][0]))
    finally:
        store.shutdown()


def test_recover_abnormal_start_follows_the_checkpoint(tmp_path, capsys):
    root = str(tmp_path / "cp")
    msgs = crash_writer(root, 1500, {**SMALL, **INDEXED}, pause_every=50)  # files' first records: distinct ms
    size = SMALL["mapped_file_size_commit_log"]
    third = next(m for m in msgs if m[0] >= 2 * size)  # the first record of the third file
    ts = json.loads(run(capsys, "dump", root, "--phy", str(third[0]), "--json")[1])["records"][0]["record"][
        "store_timestamp"]
    with open(os.path.join(root, "checkpoint"), "r+b") as f:  # as if flushed up to there
        f.write((ts + 3000).to_bytes(8, "big") * 2)
    before = snapshot(root)
    code, out, _ = run(capsys, "recover", "--json", root)
    plan = json.loads(out)
    assert code == EXIT_OK and snapshot(root) == before
    assert plan["scan_start"] == 2 * size and plan["report"]["first_file_scanned"] == f"{2 * size:020d}"
    assert plan["min_timestamp"] == ts and plan["scan_start_timestamp"] == ts
    assert plan["report"]["records"] == sum(1 for m in msgs if m[0] >= 2 * size)
    code, out, _ = run(capsys, "recover", root)
    assert f"the scan starts at {2 * size:020d} (offset {2 * size:,}" in out and "recovery: abnormal" in out
    store = MessageStore(root, **SMALL, **INDEXED)
    try:
        assert report_of(store) == plan["report"]
    finally:
        store.shutdown()


# -- verify: queues and index ------------------------------------------------------------
def test_verify_lists_consume_queues_index_files_and_notes(open_store, capsys):
    store = open_store(**INDEXED)
    fill(store, 30)
    put_keyed(store, 250)
    store.shutdown()
    code, out, _ = run(capsys, "verify", store.root)
    assert code == EXIT_OK
    assert "consumequeues: 5 (every record of the log has its unit)" in out
    assert "    T/0      0   10     10        0     0        0      1" in out
    assert "index: 2 file(s), 0 entries checked" in out and "header only" in out
    assert "note: index/" in out and "only its header was checked" in out
    report = json.loads(run(capsys, "verify", "--json", store.root)[1])
    cqs = {(q["topic"], q["queue_id"]): q for q in report["consume_queues"]}
    assert cqs[("K", 0)]["units"] == 125 and cqs[("K", 0)]["max_offset"] == 125 and cqs[("T", 2)]["units"] == 10
    assert report["queues_complete_checked"] is True and report["index_entries"] == 0
    assert [f["index_count"] for f in report["index_files"]] == [400, 500 - 399 + 1]
    assert len(report["notes"]) == 2 and all("max_hash_slot_num=5000000" in n for n in report["notes"])


# -- progress -----------------------------------------------------------------------------
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_only(open_store, capsys, monkeypatch):
    root = closed_store(open_store, 1500)  # several CommitLog files
    os.unlink(os.path.join(root, "mqstore.clean.json"))  # so that the recovery scans them (a RocketMQ store)
    tty = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["recover", root]) == EXIT_OK
    drawn = tty.getvalue()
    assert "\rrecover: [" in drawn and "] commitlog 3 of 3 (100 %)" in drawn
    assert drawn.endswith("\r") and drawn.rsplit("\r", 2)[-2].strip() == ""  # the line is cleared at the end
    assert main(["verify", root]) == EXIT_OK
    files = len(os.listdir(os.path.join(root, "commitlog")))
    scanned = f"{files * 65536 / 2**20:.1f} MiB"
    assert f"] CommitLog {scanned} of {scanned} (100 %)" in tty.getvalue()  # verify: a percentage of the bytes
    assert "] ConsumeQueues " in tty.getvalue()
    assert main(["inspect", root]) == EXIT_OK
    assert "\rinspect: [" in tty.getvalue() and "] consumequeues " in tty.getvalue()
    tty.truncate(0)
    tty.seek(0)
    for command in ("recover", "verify", "inspect"):
        assert main([command, "--json", root]) == EXIT_OK
    assert tty.getvalue() == ""  # nothing with --json
    out, err = capsys.readouterr()
    assert "recovery dry run" in out and err == ""  # not a terminal: nothing on the real stderr


def test_progress_bar_redraws_in_place():
    stream = io.StringIO()
    bar = ProgressBar("x", stream)
    bar("files", 0, 4)
    bar("files", 1, 4)  # within REDRAW_S of the last draw: skipped
    bar("files", 4, 4)  # done: always drawn
    bar.close()
    first, last = "\rx: [" + "." * 30 + "] files 0 of 4 (0 %)", "\rx: [" + "#" * 30 + "] files 4 of 4 (100 %)"
    assert stream.getvalue() == first + last.ljust(len(first)) + "\r" + " " * (len(last) - 1) + "\r"


def test_a_missing_commitlog_file(open_store, capsys, tmp_path):
    """inspect and dump still show what is there; recover says the open would fail."""
    root = closed_store(open_store, 1000)
    gap = str(tmp_path / "gap")
    shutil.copytree(root, gap)  # the fixture checks the original at teardown
    os.unlink(os.path.join(gap, "commitlog", "00000000000000065536"))
    code, out, _ = run(capsys, "inspect", "--json", gap)
    assert code == EXIT_OK
    assert [f["file_from"] for f in json.loads(out)["commitlog"]["files"]][:2] == [0, 131072]
    code, out, err = run(capsys, "dump", gap, "--phy", "70000")
    assert code == EXIT_USAGE
    assert err.startswith("mqstore dump: offset 70000 is in CommitLog file 00000000000000065536, which is missing")
    code, out, _ = run(capsys, "dump", gap, "--phy", "131072", "--json")
    assert code == EXIT_OK and json.loads(out)["records"][0]["record"]["physical_offset"] == 131072
    code, out, err = run(capsys, "recover", gap)
    assert code == EXIT_USAGE and out == ""
    assert err == (f"mqstore recover: not a store: {gap}/commitlog: files 00000000000000000000 and "
                   f"00000000000000131072 are not contiguous: opening the store would fail\n")
