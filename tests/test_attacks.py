"""The attacks of the network issue against a real ``mqstore broker`` process with ACL and the
broker account on (mqstore.tools.attack, short and bounded, loopback): it stays up, its memory
and descriptors come back, a well-behaved client keeps sending through every attack, and each
attack meets the refusal it should."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers_broker import ROOT, BrokerProcess, free_port

from mqstore.protocol import ResponseCode
from mqstore.tools.attack import ATTACKS, Target, run_attacks

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ACL = """\
accounts:
  - accessKey: control
    secretKey: control-secret
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AttackControl=PUB|SUB
  - accessKey: cluster
    secretKey: cluster-secret
    admin: true
"""


def test_every_attack_is_survived_and_refused(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    port, ha_port = free_port(), free_port()
    settings = dict(listen_port=port, ha_listen_port=ha_port, acl_enable="true", acl_file=str(acl),
                    inner_access_key="cluster", inner_secret_key="cluster-secret",
                    server_channel_max_idle_time_seconds=1, max_connections_per_ip=300)
    with BrokerProcess(str(tmp_path / "store"), **settings) as broker:
        target = Target(broker.address, broker.pid, broker.namesrv_address, f"127.0.0.1:{ha_port}")
        reports = {r.name: r for r in run_attacks(
            target, list(ATTACKS), seconds=2.0, sample_s=0.5, credentials=("control", "control-secret"),
            options={"hold": {"count": 1000}, "slowloris": {"count": 50}, "topics": {"count": 200}})}
        log = broker.log_text()
    for name, r in reports.items():
        assert r.alive, name
        assert r.control_errors == 0, (name, r)
        assert r.control_msg_s["during"] > 0 and r.control_msg_s["after"] > 0, (name, r.control_msg_s)
        assert r.rss_mb["after"] - r.rss_mb["before"] < 150, (name, r.rss_mb)
        assert r.fds["after"] - r.fds["before"] < 60, (name, r.fds)
    assert reports["garbage"].outcome["closed_by_broker"] >= reports["garbage"].outcome["frames"] * 0.9
    assert reports["hold"].outcome["refused"] > 0 or reports["hold"].outcome["still_open"] < 1000
    assert reports["pipeline"].outcome["broker_stopped_reading"], reports["pipeline"].outcome
    assert reports["slowloris"].outcome["closed_by_broker"] > 0, reports["slowloris"].outcome
    assert set(reports["admin"].outcome["answer_codes"].values()) == {ResponseCode.NO_PERMISSION}
    assert set(reports["topics"].outcome["answer_codes"]) == {ResponseCode.NO_PERMISSION}
    hijack = reports["hijack"].outcome
    assert hijack["register_code"] != ResponseCode.SUCCESS and hijack["unregister_code"] != ResponseCode.SUCCESS
    assert hijack["route_addrs"] == [broker.address], hijack
    assert reports["ha"].outcome["log_bytes_received"] == 0 and reports["ha"].outcome["challenged"]
    assert len(log.splitlines()) < 400, f"{len(log.splitlines())} log lines for the attacks"


def test_the_tool_refuses_addresses_other_than_loopback():
    proc = subprocess.run([sys.executable, "-m", "mqstore.tools.attack", "--broker", "10.1.2.3:10911", "--pid", "1",
                           "--namesrv", "10.1.2.3:9876", "--seconds", "0.1", "--attack", "garbage"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and "loopback only" in proc.stderr + proc.stdout
