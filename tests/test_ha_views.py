"""Replication as the commands show it (docs/replication.md "Watching it"): ``mqstore stats`` and
``mqstore node status`` on a master store and its slave (the control block's HA cells and each
HA service's ha.json), and ``mqstore admin status`` on a master broker and its slave broker
(GET_BROKER_RUNTIME_INFO's replication keys)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from mqstore import Message, MessageStore
from mqstore.ha import _ha
from mqstore.ha.master import read_ha_status, write_status
from mqstore.status import PutMessageStatus
from mqstore.tools.cli import main
from mqstore.tools.stats import replication_lines

from helpers_broker import free_port, running_broker, send_raw
from helpers_proc import wait_until
from test_ha import stores  # noqa: F401  (the fixture)


def put_many(store: MessageStore, n: int) -> None:
    for i in range(n):
        r = store.put_message(Message("T", b"body-%06d" % i + b"x" * (i % 100), queue_id=i % 4))
        assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, _ = capsys.readouterr()
    return code, out


def stats_json(capsys: pytest.CaptureFixture[str], root: str) -> dict:
    code, out = run(capsys, "stats", root, "--once", "--interval", "0.05", "--json")
    assert code == 0
    return json.loads(out)


# -- mqstore stats and node status on stores -------------------------------------------------------
def test_stats_shows_each_slave_of_a_master_and_the_slaves_master(stores, capsys):
    # a long housekeeping interval: the frozen slave below is not dropped while the test looks
    master = stores("master", ha_listen_port=0, ha_housekeeping_interval=600_000)
    port = master.ctl.get("ha_port")
    slave = stores("slave", broker_role="SLAVE", ha_master_address=f"127.0.0.1:{port}")
    put_many(master, 3000)
    end = master.ctl.get("wrote")
    wait_until(lambda: slave.ctl.get("dispatched") == end, what="the slave to catch up")
    # a second "slave" that reports holding nothing and never again: it lags by the whole log
    frozen = socket.create_connection(("127.0.0.1", port))
    try:
        frozen.sendall(_ha.report(0))
        frozen_peer = "%s:%d" % frozen.getsockname()

        def settled() -> dict | None:
            ha = read_ha_status(master.root)
            if ha is None:
                return None
            by_peer = {s["slave"]: s for s in ha["slaves"]}
            if len(by_peer) != 2 or frozen_peer not in by_peer or by_peer[frozen_peer]["ack_offset"] != 0:
                return None
            (real,) = [s for peer, s in by_peer.items() if peer != frozen_peer]
            return ha if real["ack_offset"] == end and real["lag_bytes"] == 0 else None

        wait_until(settled, what="the master's ha.json to list both slaves")
        fig = stats_json(capsys, master.root)
        rep = fig["replication"]
        assert rep["role"] == "master" and rep["ha_port"] == port and rep["ha_slaves"] == 2
        assert rep["confirmed"] == end == fig["positions"]["confirmed"] and rep["fall_behind_bytes"] == 0
        assert rep["ha_report_ms"] > 0 and rep["last_report_ago_ms"] >= 0
        assert rep["service"]["role"] == "master" and rep["service"]["port"] == port
        slaves = {s["slave"]: s for s in rep["service"]["slaves"]}
        frozen_fig = slaves.pop(frozen_peer)
        (real_peer, real_fig), = slaves.items()
        assert real_fig["ack_offset"] == end and real_fig["lag_bytes"] == 0 and real_fig["lag_ms"] == 0
        assert frozen_fig["ack_offset"] == 0 and frozen_fig["lag_bytes"] == end and frozen_fig["lag_ms"] >= 0
        assert all(s["rate_bytes_per_s"] >= 0 for s in (real_fig, frozen_fig))

        code, out = run(capsys, "stats", master.root, "--once", "--interval", "0.05")
        assert code == 0
        lines = [line.strip() for line in out.splitlines()]
        assert any(line.startswith(f"replication: master, HA port {port}, 2 slave(s) connected, last report ")
                   for line in lines), out
        assert f"confirmed {end:,} (the highest offset a slave reported), 0 bytes behind the log's end" in lines
        assert any(line.startswith(f"slave {real_peer}: offset {end:,}, lag 0 bytes / 0 ms, ") for line in lines)
        assert any(line.startswith(f"slave {frozen_peer}: offset 0, lag {end:,} bytes / ") for line in lines)

        # node status reads the same ha.json and words it the same way
        code, out = run(capsys, "node", "status", master.root)
        assert f"replication: master, HA port {port}, 2 slave(s) connected" in out
        assert f"slave {frozen_peer}: offset 0, lag {end:,} bytes / " in out
    finally:
        frozen.close()

    wait_until(lambda: (read_ha_status(slave.root) or {}).get("offset") == end and
               (read_ha_status(slave.root) or {}).get("connected"), what="the slave's ha.json")
    rep = stats_json(capsys, slave.root)["replication"]
    assert rep["role"] == "slave" and rep["fall_behind_bytes"] is None
    assert rep["service"]["master"] == f"127.0.0.1:{port}" and rep["service"]["connected"] is True
    assert rep["service"]["offset"] == end and rep["service"]["last_error"] is None
    assert rep["service"]["diverged"] is None and rep["service_age_ms"] >= 0
    code, out = run(capsys, "stats", slave.root, "--once", "--interval", "0.05")
    assert f"  replication: slave of 127.0.0.1:{port}, offset {end:,}, connected" in out.splitlines()
    code, out = run(capsys, "node", "status", slave.root, "--json")
    assert json.loads(out)["replication"]["master"] == f"127.0.0.1:{port}"


def test_stats_says_why_a_slave_is_not_connected(stores, capsys):
    nobody = f"127.0.0.1:{free_port()}"  # a port nothing listens on
    slave = stores("slave", broker_role="SLAVE", ha_master_address=nobody)
    wait_until(lambda: (read_ha_status(slave.root) or {}).get("last_error"), what="the slave's failed connect")
    rep = stats_json(capsys, slave.root)["replication"]
    assert rep["role"] == "slave" and rep["service"]["connected"] is False
    assert rep["service"]["master"] == nobody and "cannot connect" in rep["service"]["last_error"]
    code, out = run(capsys, "stats", slave.root, "--once", "--interval", "0.05")
    assert code == 0
    words = " ".join(out.split())  # the line is wrapped at 100 columns
    assert (f"replication: slave of {nobody}, offset 0, not connected (cannot connect to the master's HA service "
            f"at {nobody}") in words


def test_a_store_that_does_not_replicate_shows_no_replication(stores, capsys):
    store = stores("plain")
    put_many(store, 10)
    fig = stats_json(capsys, store.root)
    assert fig["replication"] == {"role": None, "ha_port": 0, "ha_slaves": 0, "ha_report_ms": 0,
                                  "last_report_ago_ms": None, "confirmed": fig["positions"]["confirmed"],
                                  "fall_behind_bytes": None, "service": None, "service_age_ms": None}
    code, out = run(capsys, "stats", store.root, "--once", "--interval", "0.05")
    assert code == 0 and "replication" not in out


def test_an_ha_json_left_by_a_process_that_is_gone_is_not_shown(stores, capsys):
    store = stores("plain")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=60)
    slave_status = {"role": "slave", "master": "127.0.0.1:1", "connected": True, "offset": 0, "time_ms": 1}
    write_status(store.root, {**slave_status, "pid": int(gone.stdout)})
    assert os.path.exists(os.path.join(store.root, "ha.json")) and read_ha_status(store.root) is None
    assert stats_json(capsys, store.root)["replication"]["role"] is None
    write_status(store.root, {**slave_status, "pid": os.getpid()})  # a live writer: shown, with its age
    rep = stats_json(capsys, store.root)["replication"]
    assert rep["role"] == "slave" and rep["service_age_ms"] > 10_000
    code, out = run(capsys, "stats", store.root, "--once", "--interval", "0.05")
    assert "replication: slave of 127.0.0.1:1, offset 0, connected (ha.json written " in out
    os.unlink(os.path.join(store.root, "ha.json"))


def test_replication_lines_word_a_divergence_and_a_master_without_its_status():
    slave = {"role": "slave", "service": {"role": "slave", "master": "127.0.0.1:5", "connected": False, "offset": 900,
                                          "last_error": None, "diverged": "this slave's CommitLog ends at 900, ..."},
             "service_age_ms": 500}
    assert replication_lines(slave) == [
        "replication: slave of 127.0.0.1:5, offset 900, not connected (connecting)",
        "  DIVERGED: this slave's CommitLog ends at 900, ..."]
    master = {"role": "master", "ha_port": 0, "ha_slaves": 0, "last_report_ago_ms": None, "confirmed": 10,
              "fall_behind_bytes": 5, "service": None, "service_age_ms": None}
    assert replication_lines(master) == [
        "replication: master, HA service not listening, 0 slave(s) connected, no report yet",
        "  confirmed 10 (the highest offset a slave reported), 5 bytes behind the log's end"]
    assert replication_lines({"role": None}) == []


# -- mqstore admin status on brokers ---------------------------------------------------------------
def admin_status(capsys: pytest.CaptureFixture[str], address: str) -> dict:
    code, out = run(capsys, "admin", "status", "--broker", address, "--json")
    assert code == 0
    return json.loads(out)


@pytest.mark.multiprocess
def test_admin_status_shows_a_master_broker_and_its_slave(tmp_path, capsys):
    with running_broker(str(tmp_path / "master")) as master:
        namesrv = master.controller.namesrv_addrs[0]
        ha_port = master.store.ctl.get("ha_port")
        with running_broker(str(tmp_path / "slave"), broker_role="SLAVE", broker_id=1, namesrv_addr=namesrv) as slave:
            assert all(code == 0 for code, _, _ in send_raw(master.address, "TopicHA", [b"m%d" % i for i in range(50)]))
            end = master.store.ctl.get("wrote")
            wait_until(lambda: slave.store.ctl.get("dispatched") == end, 30, what="the slave to hold the master's log")

            def master_settled() -> dict | None:
                out = admin_status(capsys, master.address)
                table = out["table"]
                keys = [k for k in table if k.startswith("haSlaveAckOffset_")]
                ok = (table["haSlaveCount"] == "1" and len(keys) == 1 and table[keys[0]] == str(end)
                      and table["haSlaveLagBytes_" + keys[0].partition("_")[2]] == "0")
                return out if ok else None

            out = wait_until(master_settled, 30, what="the master's runtime info to show its slave")
            table = out["table"]
            (peer,) = [k.partition("_")[2] for k in table if k.startswith("haSlaveAckOffset_")]
            assert table["haServerAddr"] == f"127.0.0.1:{ha_port}" and table["slaveFallBehindMuch"] == "0"
            assert int(table["haLastReportTimestamp"]) > 0 and table["confirmed"] == str(end)
            assert table[f"haSlaveLagMs_{peer}"] == "0" and float(table[f"haSlaveBytesPerSecond_{peer}"]) >= 0
            rep = out["replication"]
            assert rep["role"] == "master" and rep["ha_port"] == ha_port and rep["ha_slaves"] == 1
            assert rep["fall_behind_bytes"] == 0 and rep["service"]["slaves"][0]["slave"] == peer
            assert "masterAddr" not in table and "haMasterAddress" not in table

            code, text = run(capsys, "admin", "status", "--broker", master.address)
            lines = text.splitlines()
            assert code == 0 and any(line.split() == ["slaveFallBehindMuch", "0"] for line in lines)
            assert f"replication: master, HA port {ha_port}, 1 slave(s) connected, last report " in text
            assert f"  slave {peer}: offset {end:,}, lag 0 bytes / 0 ms, " in text
            assert not any(line.startswith(f"haSlave{what}_") for line in lines
                           for what in ("AckOffset", "LagBytes", "LagMs", "BytesPerSecond")), "worded, not listed"

            def slave_settled() -> dict | None:
                out = admin_status(capsys, slave.address)
                table = out["table"]
                ok = (table["masterAddr"] == master.address and table["haConnected"] == "true"
                      and table["haReportedOffset"] == str(end))
                return out if ok else None

            out = wait_until(slave_settled, 30, what="the slave's runtime info to show its master")
            table = out["table"]
            assert table["haMasterAddress"] == f"127.0.0.1:{ha_port}"
            assert table["haLastError"] == "" and table["haDiverged"] == ""
            assert "slaveFallBehindMuch" not in table and "haServerAddr" not in table
            assert out["replication"]["role"] == "slave" and out["replication"]["service"]["connected"] is True
            code, text = run(capsys, "admin", "status", "--broker", slave.address)
            assert code == 0
            assert (f"replication: slave of 127.0.0.1:{ha_port} (broker {master.address}), offset {end:,}, "
                    "connected") in text.splitlines()
