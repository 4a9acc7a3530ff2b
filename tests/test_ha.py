"""Master/slave replication (docs/replication.md): RocketMQ's HA wire format against its twin,
a master's HA service and a slave's HA client over loopback (two stores in this process, their
services as threads), SYNC_MASTER's statuses, a restarted slave, a slave holding more than its
master, bad frames from a master, and the same between two nodes (service processes) with the
master's HA process killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageStore
from mqstore.ha import _ha
from mqstore.ha import read_truncation, request_truncation, write_ha_master
from mqstore.status import PutMessageStatus
from mqstore.tools.checker import check_store
from mqstore.twin import ha as twin

from helpers_proc import wait_until
from helpers_store import read_queue

FS = 1 << 20  # 1 MiB CommitLog files: a few thousand messages roll several


@pytest.fixture
def stores(tmp_path):
    """stores(name, **config) -> a MessageStore in tmp_path/name; every one is shut down and
    checked at the end."""
    opened: list[MessageStore] = []

    def make(name: str, **config) -> MessageStore:
        store = MessageStore(str(tmp_path / name), mapped_file_size_commit_log=FS, **config)
        opened.append(store)
        return store

    yield make
    for store in opened:
        if not store.closed:
            store.shutdown()
    for store in opened:
        check_store(store.root, config=store.config).raise_if_failed()


def master_of(stores, name: str = "master", **config) -> MessageStore:
    return stores(name, ha_listen_port=0, **config)


def slave_of(stores, master: MessageStore, name: str = "slave", **config) -> MessageStore:
    return stores(name, broker_role="SLAVE", ha_master_address=f"127.0.0.1:{master.ctl.get('ha_port')}", **config)


def put_many(store: MessageStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        r = store.put_message(Message("T", b"body-%06d-" % i + b"x" * (i % 150), queue_id=i % 4, keys=f"k{i}",
                                      tags="even" if i % 2 == 0 else "odd"))
        assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)


def caught_up(master: MessageStore, slave: MessageStore) -> bool:
    """The slave holds and has dispatched all the master wrote, and so has the master (its
    dispatcher may lag its puts: a slow build once read one message fewer on the master)."""
    end = master.ctl.get("wrote")
    return (slave.ctl.get("wrote") == end and slave.ctl.get("dispatched") == end
            and master.ctl.get("dispatched") == end)


def same_log(master: MessageStore, slave: MessageStore) -> None:
    """Byte-identical CommitLogs up to the slave's end, file by file."""
    end = slave.ctl.get("wrote")
    assert end > 0
    for mf in slave.commitlog.queue.files:
        upto = min(FS, end - mf.file_from)
        if upto <= 0:
            break
        theirs = master.commitlog.queue.get(mf.file_from)
        assert theirs is not None, f"the master has no file {mf.file_from}"
        assert bytes(memoryview(mf)[:upto]) == bytes(memoryview(theirs)[:upto]), f"file {mf.file_from} differs"


def same_messages(master: MessageStore, slave: MessageStore) -> None:
    for q in range(4):
        mine = [(m.queue_offset, bytes(m.body), m.physical_offset) for m in read_queue(master, "T", q)]
        theirs = [(m.queue_offset, bytes(m.body), m.physical_offset) for m in read_queue(slave, "T", q)]
        assert mine == theirs and mine


# -- the wire format -----------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(offset=st.integers(-2**63, 2**63 - 1), size=st.integers(-2**31, 2**31 - 1))
def test_header_and_report_encode_like_the_twin(offset, size):
    assert _ha.header(offset, size) == twin.header(offset, size)
    assert _ha.report(offset) == twin.report(offset)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), start=st.integers(0, 70), end=st.integers(0, 70))
def test_the_last_report_is_read_like_the_twin(data, start, end):
    try:
        want = twin.last_report(data, start, end)
    except ValueError:
        with pytest.raises(ValueError):
            _ha.last_report(data, start, end)
        return
    assert _ha.last_report(data, start, end) == want


frames = st.lists(st.tuples(st.integers(0, 2**40), st.binary(max_size=300)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(items=frames, cuts=st.lists(st.integers(1, 97), max_size=20), junk=st.binary(max_size=12))
def test_the_slave_reads_frames_like_the_twin(items, cuts, junk):
    stream = b"".join(twin.header(phy, len(body)) + body for phy, body in items) + junk
    mine, theirs = _ha.SlaveReader(4096), twin.SlaveReader(4096)
    got_mine, got_theirs = [], []
    pos = 0
    for n in cuts + [len(stream)]:
        chunk = stream[pos:pos + n]
        pos += len(chunk)
        for reader, got in ((mine, got_mine), (theirs, got_theirs)):
            reader.feed(chunk)
            while True:
                try:
                    frame = reader.next()
                except ValueError as exc:
                    got.append(("error", str(exc)))
                    break
                if frame is None:
                    break
                got.append((frame[0], bytes(frame[1])))
        if got_mine and got_mine[-1][0] == "error":
            break
    assert got_mine == got_theirs
    assert [g for g in got_mine if g[0] != "error"] == [(phy, body) for phy, body in items][:len(got_mine)]


def test_a_frame_that_cannot_fit_the_buffer_is_refused():
    reader = _ha.SlaveReader(1024)
    reader.feed(_ha.header(0, 5000))
    with pytest.raises(ValueError, match="5000 bytes at CommitLog offset 0: it cannot fit the 1024-byte read buffer"):
        reader.next()
    reader = _ha.SlaveReader(1024)
    reader.feed(_ha.header(7, -1))
    with pytest.raises(ValueError, match="-1 bytes"):
        reader.next()


# -- a master and its slaves ---------------------------------------------------------------------
def test_a_slave_holds_what_its_master_holds(stores):
    master = master_of(stores)
    slave = slave_of(stores, master)
    put_many(master, 12_000)  # ~2.5 MB: three files
    wait_until(lambda: caught_up(master, slave), what="the slave to catch up")
    assert len(slave.commitlog.queue.files) >= 3
    same_log(master, slave)
    same_messages(master, slave)
    assert [m.physical_offset for m in slave.query_message("T", "k4321").messages] == \
        [m.physical_offset for m in master.query_message("T", "k4321").messages] != []
    assert master.ctl.get("confirmed") == master.ctl.get("wrote")
    (conn,) = master.ha.status()
    assert conn["ack_offset"] == master.ctl.get("wrote") and conn["lag_bytes"] == 0
    assert slave.ha.status()["connected"] and slave.ha.status()["frames"] > 0
    # a slave takes no puts of its own (SERVICE_NOT_AVAILABLE naming the role)
    r = slave.put_message(Message("T", b"x"))
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "slave" in r.detail


def test_two_slaves_follow_one_master(stores):
    master = master_of(stores)
    a, b = slave_of(stores, master, "a"), slave_of(stores, master, "b")
    wait_until(lambda: master.ctl.get("ha_slaves") == 2, what="two slaves connected")
    put_many(master, 3000)
    wait_until(lambda: caught_up(master, a) and caught_up(master, b), what="both slaves to catch up")
    for slave in (a, b):
        same_log(master, slave)
        same_messages(master, slave)


def test_a_restarted_slave_catches_up_from_its_end(stores, tmp_path):
    master = master_of(stores)
    slave = slave_of(stores, master)
    put_many(master, 2000)
    wait_until(lambda: caught_up(master, slave))
    stopped_at = slave.ctl.get("wrote")
    slave.shutdown()
    wait_until(lambda: master.ctl.get("ha_slaves") == 0, what="the master to see the slave go")
    put_many(master, 3000, start=2000)
    slave = slave_of(stores, master, "slave")  # the same directory, reopened
    wait_until(lambda: caught_up(master, slave), what="the restarted slave to catch up")
    (conn,) = master.ha.status()
    assert conn["request_offset"] == stopped_at  # it asked from its end, not from 0
    same_log(master, slave)
    same_messages(master, slave)


def test_sync_master_waits_for_its_slave(stores):
    master = master_of(stores, broker_role="SYNC_MASTER", slave_timeout=300)
    r = master.put_message(Message("T", b"alone"))
    assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE and "no slave is connected" in r.detail
    slave = slave_of(stores, master)
    wait_until(lambda: master.ctl.get("ha_slaves") == 1)
    for i in range(300):
        r = master.put_message(Message("T", b"m%d" % i, queue_id=i % 4))
        assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)
        assert master.ctl.get("confirmed") >= r.wrote_offset + r.wrote_bytes  # the slave has it when PUT_OK
    wait_until(lambda: caught_up(master, slave))
    same_log(master, slave)
    # SYNC_MASTER puts of many threads at once: every one PUT_OK, each confirmed
    results = []

    def producer(k: int) -> None:
        for i in range(100):
            results.append(master.put_message(Message("T", b"t%d-%d" % (k, i), queue_id=k % 4)))

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 800 and all(r.status is PutMessageStatus.PUT_OK for r in results)
    slave.shutdown()
    wait_until(lambda: master.ctl.get("ha_slaves") == 0)
    r = master.put_message(Message("T", b"gone"))
    assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    # stored all the same: the status says its replication is not confirmed
    assert master.look_message_by_offset(r.wrote_offset) is not None
    slave = slave_of(stores, master)  # restarted: it catches up from its end, and puts wait for it again
    wait_until(lambda: master.ctl.get("ha_slaves") == 1)
    r = master.put_message(Message("T", b"back"))
    assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)
    assert slave.ctl.get("wrote") >= r.wrote_offset + r.wrote_bytes
    wait_until(lambda: caught_up(master, slave))
    same_log(master, slave)


def test_sync_master_times_out_on_a_slave_that_stops_answering(stores):
    """A frozen slave: a socket that connects, reports its end once and never again."""
    master = master_of(stores, broker_role="SYNC_MASTER", slave_timeout=300)
    frozen = socket.create_connection(("127.0.0.1", master.ctl.get("ha_port")))
    try:
        frozen.sendall(_ha.report(0))
        wait_until(lambda: master.ctl.get("ha_slaves") == 1)
        t0 = time.monotonic()
        r = master.put_message(Message("T", b"waits"))
        waited = time.monotonic() - t0
        assert r.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT and "slave_timeout=300 ms" in r.detail
        assert 0.25 < waited < 5
    finally:
        frozen.close()


@pytest.mark.parametrize("mode", ["threads", pytest.param("processes", marks=pytest.mark.multiprocess)])
def test_a_slave_holding_more_than_its_master_is_cut_back_to_the_masters_end(stores, tmp_path, mode):
    """The master crashes having lost its last records, which its slave holds: the slave cuts
    its log, queues and index back to the master's end, says how much it dropped, and follows
    the master from there."""
    slave = stores("slave", broker_role="SLAVE", service_mode=mode)  # follows what ha_master says

    def follow(master: MessageStore) -> None:
        write_ha_master(slave.root, f"127.0.0.1:{master.ctl.get('ha_port')}")

    first = master_of(stores, "first")
    follow(first)
    put_many(first, 1000)
    wait_until(lambda: caught_up(first, slave), what="the slave to catch up")
    first.shutdown()
    shutil.copytree(first.root, tmp_path / "second")  # what the master's disk will still hold
    first = master_of(stores, "first")
    follow(first)
    put_many(first, 500, start=1000)  # the slave gets these; the master will lose them
    wait_until(lambda: caught_up(first, slave), what="the slave to catch up again")
    held = slave.ctl.get("wrote")
    first.shutdown()
    second = master_of(stores, "second")
    kept = second.ctl.get("wrote")
    assert 0 < kept < held
    follow(second)
    wait_until(lambda: read_truncation(slave.root) is not None, timeout_s=30, what="the slave to truncate")
    done = read_truncation(slave.root)
    assert (done["offset"], done["end"], done["dropped_bytes"]) == (kept, held, held - kept)
    assert sum(done["queue_units_dropped"].values()) == 500 and done["index_entries_dropped"] >= 500
    assert not os.path.exists(os.path.join(slave.root, "ha_truncate"))  # the request was carried out
    put_many(second, 300, start=2000)
    wait_until(lambda: caught_up(second, slave), timeout_s=30, what="the slave to follow the master again")
    same_log(second, slave)
    same_messages(second, slave)
    assert [m.queue_offset for m in read_queue(slave, "T", 0)] == list(range(250 + 75))
    assert slave.query_message("T", "k1200").messages == []  # the lost record's key is gone
    assert [bytes(m.body)[:11] for m in slave.query_message("T", "k2100").messages] == [b"body-002100"]
    def said() -> dict:  # what the slave's HA service reports (ha.json, `mqstore node status`)
        with open(os.path.join(slave.root, "ha.json"), encoding="utf-8") as fh:
            return json.load(fh)

    wait_until(lambda: (said().get("truncated") or {}).get("dropped_bytes") == held - kept, what="the status")


@pytest.mark.parametrize("mode", ["threads", pytest.param("processes", marks=pytest.mark.multiprocess)])
def test_an_empty_slave_follows_a_master_whose_first_files_were_cleaned(stores, mode):
    master = master_of(stores, delete_when="00;01;02;03;04;05;06;07;08;09;10;11;12;13;14;15;16;17;18;19;20;21;"
                                           "22;23", disk_space_warning_level_ratio=100,
                       disk_space_clean_forcibly_ratio=100)
    put_many(master, 12000)  # about three 1 MiB files
    files = master.commitlog.queue.files
    assert len(files) >= 3
    old = time.time() - 100 * 3600  # older than file_reserved_time (72 h)
    for mf in files[:2]:
        os.utime(mf.path, (old, old))
    start = files[2].file_from
    wait_until(lambda: (master.execute_delete_files_manually(), master.get_min_phy_offset() == start)[1],
               timeout_s=30, what="the master's cleaner to delete its first two files")
    slave = slave_of(stores, master, service_mode=mode)  # reports 0: its log starts at the master's first file
    wait_until(lambda: caught_up(master, slave), timeout_s=30, what="the slave to catch up")
    put_many(master, 500, start=12000)
    wait_until(lambda: caught_up(master, slave), timeout_s=30, what="the slave to follow")
    assert slave.get_min_phy_offset() == start
    same_log(master, slave)
    same_messages(master, slave)
    assert slave.get_min_offset_in_queue("T", 0) == master.get_min_offset_in_queue("T", 0) > 0


def test_a_truncation_asked_for_before_a_stop_is_done_at_the_next_open(stores):
    master = master_of(stores)
    slave = slave_of(stores, master)
    put_many(master, 400)
    wait_until(lambda: caught_up(master, slave), what="the slave to catch up")
    cut = next(m.physical_offset for m in read_queue(slave, "T", 1) if m.queue_offset == 50)
    end = slave.ctl.get("wrote")
    slave.shutdown()
    request_truncation(slave.root, cut, end, "127.0.0.1:1")  # its HA client asked, then the slave stopped
    slave = stores("slave", broker_role="SLAVE")
    done = read_truncation(slave.root)
    assert (done["offset"], done["dropped_bytes"], done["master"]) == (cut, end - cut, "127.0.0.1:1")
    assert slave.ctl.get("wrote") == cut and slave.get_max_offset_in_queue("T", 1) == 50
    assert slave.get_max_offset_in_queue("T", 0) == 51  # message 200 of queue 0 came before the cut


def fake_master(replies: list[bytes]) -> tuple[socket.socket, threading.Thread, list[bytes]]:
    """A listener that, per connection, reads the slave's first report and sends `replies`."""
    server = socket.create_server(("127.0.0.1", 0))
    reports: list[bytes] = []

    def serve() -> None:
        server.settimeout(10)
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            try:
                reports.append(conn.recv(8))
                for reply in replies:
                    conn.sendall(reply)
                time.sleep(0.5)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return server, t, reports


@pytest.mark.parametrize("reply, why", [
    (_ha.header(0, 64 << 20), "cannot fit"),
    (_ha.header(4096, 3) + b"abc", "from offset 4096, but this log ends at 0"),
])
def test_a_bad_frame_from_the_master_drops_the_connection_not_the_store(stores, reply, why):
    server, t, reports = fake_master([reply])
    try:
        slave = stores("slave", broker_role="SLAVE", ha_master_address=f"127.0.0.1:{server.getsockname()[1]}")
        wait_until(lambda: slave.ha.last_error is not None and why in slave.ha.last_error, what=why)
        assert reports == [_ha.report(0)]
        assert slave.ctl.get("wrote") == 0
    finally:
        server.close()
        t.join(10)


# -- two nodes -----------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_two_nodes_replicate_and_survive_the_masters_ha_process_killed(stores, capsys):
    master = master_of(stores, service_mode="processes")
    wait_until(lambda: master.ctl.get("ha_port") > 0, what="the master's HA process to listen")
    slave = slave_of(stores, master, service_mode="processes")
    put_many(master, 4000)
    wait_until(lambda: caught_up(master, slave), what="the slave node to catch up")
    ha_pid = master.supervisor.pids()["ha"]
    os.kill(ha_pid, signal.SIGKILL)
    wait_until(lambda: master.supervisor.pids()["ha"] not in (ha_pid, 0), what="the HA process restarted")
    put_many(master, 2000, start=4000)
    wait_until(lambda: caught_up(master, slave), timeout_s=30, what="the slave to catch up after the restart")
    same_log(master, slave)
    same_messages(master, slave)
    # what `mqstore node status` says about both sides (their HA processes' ha.json)
    from mqstore.tools.node_cli import status

    def replication(store: MessageStore) -> dict:
        wait_until(lambda: os.path.exists(os.path.join(store.root, "ha.json")), what="ha.json")
        status(store.root, as_json=True)
        return json.loads(capsys.readouterr().out)["replication"]

    wait_until(lambda: (replication(master) or {}).get("slaves") and
               replication(master)["slaves"][0]["ack_offset"] == master.ctl.get("wrote"), what="the master's status")
    (seen,) = replication(master)["slaves"]
    assert seen["lag_bytes"] == 0 and seen["lag_ms"] == 0
    assert seen["bytes_sent"] == master.ctl.get("wrote") - seen["request_offset"] > 0  # since the restart
    wait_until(lambda: replication(slave)["connected"] and replication(slave)["offset"] == master.ctl.get("wrote"),
               what="the slave's status")
    assert replication(slave)["role"] == "slave"
    status(master.root)
    text = capsys.readouterr().out
    assert "replication: master" in text and "lag 0 bytes / 0 ms" in text


# -- promotion -----------------------------------------------------------------------------------
def test_a_stopped_slave_is_promoted_and_serves_as_the_master(stores, tmp_path, capsys):
    from mqstore.tools.commands.admin import promote

    master = master_of(stores)
    slave = slave_of(stores, master)
    put_many(master, 3000)
    wait_until(lambda: caught_up(master, slave))
    held = {q: slave.get_max_offset_in_queue("T", q) for q in range(4)}
    conf = tmp_path / "broker-b.conf"
    conf.write_text("brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=1\nbrokerRole=SLAVE\n"
                    f"haMasterAddress=127.0.0.1:{master.ctl.get('ha_port')}\n", encoding="utf-8")
    # a running slave is refused: it must be stopped first
    assert promote(slave.root, str(conf)) == 2
    assert "stop the slave first" in capsys.readouterr().err
    slave.shutdown()
    master.shutdown()  # the master is lost
    assert promote(slave.root, str(conf)) == 0
    said = capsys.readouterr().out
    assert f"promoted {slave.root}" in said and "start it as the master" in said
    text = conf.read_text(encoding="utf-8")
    assert "brokerRole=ASYNC_MASTER" in text and "brokerId=0" in text and "haMasterAddress" not in text
    # the promoted store takes puts after what it replicated, its queues going on where they were
    promoted = stores("slave")
    for q in range(4):
        r = promoted.put_message(Message("T", b"after promotion %d" % q, queue_id=q))
        assert r.status is PutMessageStatus.PUT_OK and r.queue_offset == held[q]
    wait_until(lambda: promoted.get_max_offset_in_queue("T", 0) == held[0] + 1, what="the new message dispatched")
    assert bytes(read_queue(promoted, "T", 0)[-1].body) == b"after promotion 0"


def test_a_damaged_slave_is_not_promoted(stores, capsys):
    from mqstore.tools.commands.admin import promote

    master = master_of(stores)
    slave = slave_of(stores, master)
    put_many(master, 500)
    wait_until(lambda: caught_up(master, slave))
    slave.shutdown()
    path = os.path.join(slave.root, "commitlog", "0" * 20)
    with open(path, "rb") as fh:
        at = fh.read(FS).index(b"body-000010-")
    with open(path, "r+b") as fh:  # a byte of the 11th record's body: its CRC no longer matches
        fh.seek(at)
        fh.write(b"B")
    assert promote(slave.root, None) == 1
    err = capsys.readouterr().err
    assert "is not promoted" in err and "past the end of the log" in err
    assert not os.path.exists(os.path.join(slave.root, "lock")) or promote(slave.root, None) == 1
    with open(path, "r+b") as fh:  # put back, for the fixture's check
        fh.seek(at)
        fh.write(b"b")
    assert check_store(slave.root, config=slave.config).ok
