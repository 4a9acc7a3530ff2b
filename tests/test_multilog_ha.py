"""Replication's finer points with several CommitLogs (docs/parallel-commitlogs.md): the broker's
runtime info (GET_BROKER_RUNTIME_INFO, over the remoting protocol) carries every log's
replication keys beside log 0's RocketMQ ones, ``mqstore admin status`` and ``mqstore stats``
word them per log, and ``mqstore admin promote`` checks a slave's store log by log, naming
the log that fails or that is behind its old master's."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from mqstore import Message, MessageStore, PutMessageStatus
from mqstore.layout import log_base
from mqstore.tools.cli import main
from mqstore.twin.logs import log_of_queue

from helpers_broker import running_broker, send_raw
from helpers_proc import wait_until

FILE_SIZE = 64 * 1024


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def spanning_topic(prefix: str) -> str:
    """A topic whose four queues are bound to both of two logs."""
    return next(t for t in (f"{prefix}{i}" for i in range(100)) if {log_of_queue(t, q, 2) for q in range(4)} == {0, 1})


def ends(store: Any) -> list[int]:
    return [store.ctl.get("wrote", log=k) for k in (0, 1)]


# -- the runtime info ----------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_runtime_info_carries_every_logs_replication(tmp_path, capsys):
    topic = spanning_topic("RT")
    with running_broker(str(tmp_path / "master"), commit_log_count=2) as master:
        namesrv = master.controller.namesrv_addrs[0]
        ha_port = master.store.ctl.get("ha_port")
        with running_broker(str(tmp_path / "slave"), broker_role="SLAVE", broker_id=1, namesrv_addr=namesrv,
                            commit_log_count=2) as slave:
            answers = send_raw(master.address, topic, [b"m%03d" % i + b"x" * (i % 50) for i in range(80)])
            assert all(code == 0 for code, _, _ in answers)
            end = ends(master.store)
            assert end[0] > 0 and end[1] > log_base(1), "puts in both logs"
            wait_until(lambda: ends(slave.store) == end, 60, what="the slave to hold both of the master's logs")

            def master_settled() -> dict | None:
                code, out, _ = run(capsys, "admin", "status", "--broker", master.address, "--json")
                assert code == 0
                got = json.loads(out)
                table = got["table"]
                ok = all(table.get(f"haSlaveCount_L{k}") == "1" and table.get(f"slaveFallBehindMuch_L{k}") == "0"
                         and [v for key, v in table.items()
                              if key.startswith("haSlaveAckOffset_") and key.endswith(f"_L{k}")] == [str(end[k])]
                         for k in (0, 1))
                return got if ok else None

            got = wait_until(master_settled, 30, what="the master's runtime info to show its slave in both logs")
            table = got["table"]
            assert table["commitLogCount"] == "2"
            assert table["commitLogMaxOffset"] == str(end[0]), "the RocketMQ key stays log 0's"
            assert [table["commitLogMaxOffset_L0"], table["commitLogMaxOffset_L1"]] == [str(e) for e in end]
            assert table["commitLogMinOffset_L1"] == str(log_base(1))
            assert [table["confirmed_L0"], table["confirmed_L1"]] == [str(e) for e in end]
            assert table["slaveFallBehindMuch"] == "0" and table["haSlaveCount"] == "1"
            # RocketMQ's per-slave keys: log 0's slave only (one connection), as with one log
            plain = {k: v for k, v in table.items() if k.startswith("haSlaveAckOffset_") and "_L" not in k}
            assert list(plain.values()) == [str(end[0])]
            (peer0,) = [k[len("haSlaveAckOffset_"):] for k in plain]
            assert table[f"haSlaveAckOffset_{peer0}_L0"] == str(end[0])
            (peer1,) = [k[len("haSlaveAckOffset_"):-len("_L1")] for k in table
                        if k.startswith("haSlaveAckOffset_") and k.endswith("_L1")]
            assert peer1 != peer0, "a connection per log"
            for k, peer in ((0, peer0), (1, peer1)):
                assert table[f"haSlaveLagBytes_{peer}_L{k}"] == "0" and table[f"haSlaveLagMs_{peer}_L{k}"] == "0"
                assert int(table[f"haLastReportTimestamp_L{k}"]) > 0
            rep = got["replication"]
            assert [(e["log"], e["ha_slaves"], e["confirmed"], e["fall_behind_bytes"]) for e in rep["logs"]] == \
                [(0, 1, end[0], 0), (1, 1, end[1], 0)]
            assert sorted((s["log"], s["slave"], s["ack_offset"]) for s in rep["service"]["slaves"]) == \
                [(0, peer0, end[0]), (1, peer1, end[1])]

            code, text, _ = run(capsys, "admin", "status", "--broker", master.address)
            lines = text.splitlines()
            assert code == 0 and f"replication: master, HA port {ha_port}, 2 CommitLogs, last report " in text
            at = lines.index(f"  CommitLog 1: 1 slave(s) connected, confirmed {end[1]:,} (the highest offset a "
                             "slave reported), 0 bytes behind its end")
            assert lines[at + 1].startswith(f"    slave {peer1}: offset {end[1]:,}, lag 0 bytes / 0 ms, ")
            assert f"  CommitLog 0: 1 slave(s) connected, confirmed {end[0]:,} (the highest offset a slave " \
                   "reported), 0 bytes behind its end" in lines
            assert any(line.split() == ["commitLogMaxOffset_L1", str(end[1])] for line in lines)

            # mqstore stats on the master's store: the same per log, from its control block
            code, out, _ = run(capsys, "stats", master.store.root, "--once", "--interval", "0.05", "--json")
            assert code == 0
            logs = json.loads(out)["replication"]["logs"]
            assert [(e["log"], e["ha_slaves"], e["confirmed"], e["fall_behind_bytes"]) for e in logs] == \
                [(0, 1, end[0], 0), (1, 1, end[1], 0)]
            code, out, _ = run(capsys, "stats", master.store.root, "--once", "--interval", "0.05")
            assert f"CommitLog 1: 1 slave(s) connected, confirmed {end[1]:,}" in out

            def slave_settled() -> dict | None:
                code, out, _ = run(capsys, "admin", "status", "--broker", slave.address, "--json")
                assert code == 0
                got = json.loads(out)
                table = got["table"]
                ok = all(table.get(f"haConnected_L{k}") == "true" and table.get(f"haReportedOffset_L{k}") == str(end[k])
                         for k in (0, 1))
                return got if ok else None

            got = wait_until(slave_settled, 30, what="the slave's runtime info to show both logs connected")
            table = got["table"]
            assert table["haReportedOffset"] == str(end[0]) and table["haConnected"] == "true"
            assert table["haLastError_L1"] == "" and table["haDiverged_L1"] == ""
            assert [table["commitLogMaxOffset_L0"], table["commitLogMaxOffset_L1"]] == [str(e) for e in end]
            assert "slaveFallBehindMuch_L1" not in table and "haSlaveCount_L0" not in table
            assert [(p["offset"], p["connected"]) for p in got["replication"]["service"]["logs"]] == \
                [(end[0], True), (end[1], True)]
            code, text, _ = run(capsys, "admin", "status", "--broker", slave.address)
            lines = text.splitlines()
            assert (f"replication: slave of 127.0.0.1:{ha_port} (broker {master.address}), 2 CommitLogs, "
                    "2 connected") in lines
            assert f"  CommitLog 1: offset {end[1]:,}, connected" in lines


# -- promote -------------------------------------------------------------------------------------
def _put(store: MessageStore, topic: str, queues: list[int], start: int, n: int) -> None:
    for i in range(start, start + n):
        r = store.put_message(Message(topic, b"p%05d-" % i + b"z" * (600 + i % 400), queue_id=queues[i % len(queues)]))
        assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)


@pytest.fixture
def replicated(tmp_path):
    """A stopped master and its stopped slave, both with two logs of 64 KiB files, the slave
    holding all the master had when it stopped; the master then took 20 puts more into log 1.
    (master dir, slave dir, the slave's ends, its records per log, the master's ends)."""
    topic = spanning_topic("PR")
    master = MessageStore(str(tmp_path / "master"), commit_log_count=2, mapped_file_size_commit_log=FILE_SIZE,
                          ha_listen_port=0)
    try:
        port = master.ctl.get("ha_port")
        slave = MessageStore(str(tmp_path / "slave"), commit_log_count=2, mapped_file_size_commit_log=FILE_SIZE,
                             broker_role="SLAVE", ha_master_address=f"127.0.0.1:{port}")
        try:
            _put(master, topic, [0, 1, 2, 3], 0, 600)
            end = ends(master)
            wait_until(lambda: ends(slave) == end and all(slave.ctl.get("dispatched", log=k) == end[k]
                                                          for k in (0, 1)), 60, what="the slave to catch up")
        finally:
            slave.shutdown()
        records = [sum(1 for i in range(600) if log_of_queue(topic, i % 4, 2) == k) for k in (0, 1)]
        _put(master, topic, [q for q in range(4) if log_of_queue(topic, q, 2) == 1], 600, 20)
        master_end = ends(master)
    finally:
        master.shutdown()
    return str(tmp_path / "master"), str(tmp_path / "slave"), end, records, master_end


def test_promote_reports_each_logs_end_and_records(replicated, capsys, tmp_path):
    _, slave, end, records, _ = replicated
    assert all(end[k] - log_base(k) > 3 * FILE_SIZE for k in (0, 1)), "several files in each log"
    copy = str(tmp_path / "copy")
    shutil.copytree(slave, copy)
    code, out, err = run(capsys, "admin", "promote", slave)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"promoted {slave}: its 2 CommitLogs checked, {sum(records):,} records"
    assert lines[1:3] == [f"  CommitLog {k}: ends at {end[k]:,} ({records[k]:,} records checked)" for k in (0, 1)]
    code, out, err = run(capsys, "admin", "promote", copy, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert [(e["log"], e["end"], e["records"], e["torn_tail_bytes"]) for e in got["logs"]] == \
        [(0, end[0], records[0], 0), (1, end[1], records[1], 0)]
    assert got["log_end"] == end[0]


def test_promote_refuses_a_slave_whose_log_is_damaged_naming_it(replicated, capsys, tmp_path):
    _, slave, end, records, _ = replicated
    conf = tmp_path / "slave-broker.conf"
    conf.write_text("brokerRole=SLAVE\nbrokerId=1\n")
    log1 = os.path.join(slave, "commitlog-1")
    first = sorted(n for n in os.listdir(log1) if n.isdigit() and len(n) == 20)[0]
    assert int(first) == log_base(1)
    with open(os.path.join(log1, first), "r+b") as fh:  # a byte of the first record's body, in a full file
        fh.seek(300)
        byte = fh.read(1)
        fh.seek(300)
        fh.write(bytes([byte[0] ^ 0xFF]))
    def files() -> dict[str, int]:  # the lock file aside: promote takes the store's lock
        return {name: os.stat(os.path.join(slave, name)).st_mtime_ns for name in os.listdir(slave) if name != "lock"}

    before = files()
    code, out, err = run(capsys, "admin", "promote", slave, "--config", str(conf))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"mqstore admin promote: {slave} is not promoted: CommitLog 1 failed the check: ")
    assert f"  CommitLog 0: ends at {end[0]:,} ({records[0]:,} records checked), no problem" in lines
    at = next(i for i, line in enumerate(lines) if line.startswith("  CommitLog 1: ends at "))
    assert "problem(s)" in lines[at] and lines[at + 1].startswith(f"    {first} @ ")
    assert conf.read_text() == "brokerRole=SLAVE\nbrokerId=1\n", "nothing changed"
    assert files() == before


def test_promote_against_the_old_masters_store_names_the_log_behind(replicated, capsys, tmp_path):
    master, slave, end, _, theirs = replicated
    assert theirs[0] == end[0] and theirs[1] > end[1]
    copy = str(tmp_path / "copy")
    shutil.copytree(slave, copy)
    code, out, err = run(capsys, "admin", "promote", slave, "--master", master)
    assert code == 1 and out == ""
    behind = (f"CommitLog 1 is {theirs[1] - end[1]:,} bytes behind the master's: it ends at {end[1]:,}, "
              f"the master's at {theirs[1]:,}")
    assert f"  {behind} (--allow-behind promotes it anyway)" in err.splitlines()
    assert "CommitLog 0 is" not in err
    code, out, err = run(capsys, "admin", "promote", slave, "--master", master, "--allow-behind")
    assert code == 0, err
    assert f"  WARNING: {behind} (--allow-behind)" in out.splitlines()
    # a master with another count of logs: refused, naming both counts
    one = MessageStore(str(tmp_path / "one"), mapped_file_size_commit_log=FILE_SIZE)
    one.shutdown()
    code, out, err = run(capsys, "admin", "promote", copy, "--master", str(tmp_path / "one"))
    assert code == 1 and "has 1 CommitLog(s), this slave 2" in err


def test_promote_of_a_one_log_slave_against_its_master(tmp_path, capsys):
    """One CommitLog: promote's words are as before; --master names the log behind too."""
    master = MessageStore(str(tmp_path / "master"), mapped_file_size_commit_log=FILE_SIZE, ha_listen_port=0)
    try:
        slave = MessageStore(str(tmp_path / "slave"), mapped_file_size_commit_log=FILE_SIZE, broker_role="SLAVE",
                             ha_master_address=f"127.0.0.1:{master.ctl.get('ha_port')}")
        try:
            _put(master, "One", [0, 1], 0, 100)
            end = master.ctl.get("wrote")
            wait_until(lambda: slave.ctl.get("dispatched") == end, 60, what="the slave to catch up")
        finally:
            slave.shutdown()
        _put(master, "One", [0, 1], 100, 5)
        theirs = master.ctl.get("wrote")
    finally:
        master.shutdown()
    slave_dir = str(tmp_path / "slave")
    code, out, err = run(capsys, "admin", "promote", slave_dir, "--master", str(tmp_path / "master"))
    assert code == 1 and out == ""
    assert (f"  its CommitLog is {theirs - end:,} bytes behind the master's: it ends at {end:,}, the master's at "
            f"{theirs:,} (--allow-behind promotes it anyway)") in err.splitlines()
    code, out, err = run(capsys, "admin", "promote", slave_dir)
    assert code == 0, err
    assert out.splitlines()[0] == f"promoted {slave_dir}: its CommitLog ends at {end:,} (100 records checked)"
