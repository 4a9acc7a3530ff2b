"""The attacks of the network issue against a real ``mqstore broker`` process (mqstore.tools.attack,
short and bounded, loopback): with the ACL and the broker account on, and again with both off,
where the topic caps, the NameServer's held-name rule and the fronts' back-pressure are what
stop them. Either way the broker stays up, its memory and descriptors come back, a well-behaved
client keeps sending through every attack, and each attack meets the refusal it should."""

from __future__ import annotations

import subprocess
import sys

import pytest
import json
import socket

from helpers_broker import ROOT, BrokerProcess, free_port

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.broker.topics import TopicConfigs
from mqstore.protocol import RequestCode, ResponseCode
from mqstore.tools.attack import ATTACKS, RECOVERED_FRACTION, AttackReport, Target, run_attacks

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
    _assert_survived(reports)
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


def _assert_survived(reports: dict[str, AttackReport]) -> None:
    """The broker up, its memory and descriptors bounded, the control client never failing and
    sending during and after each attack."""
    for name, r in reports.items():
        assert r.alive, name
        assert r.control_errors == 0, (name, r)
        assert r.control_msg_s["during"] > 0 and r.control_msg_s["after"] > 0, (name, r.control_msg_s)
        assert r.rss_mb["after"] - r.rss_mb["before"] < 150, (name, r.rss_mb)
        assert r.fds["after"] - r.fds["before"] < 60, (name, r.fds)


def _topic_count(address: str) -> int:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG, opaque=1, ext_fields={}).encode())
        frames = FrameReader()
        while (answer := frames.next()) is None:
            data = sock.recv(1 << 20)
            assert data, "the broker closed the connection"
            frames.feed(data)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return len(json.loads(answer.body)["topicConfigTable"])


def test_with_the_acl_off_the_caps_the_held_name_and_back_pressure_stop_the_attacks(tmp_path):
    """No ACL and no broker account (a developer's default): an anonymous client may create and
    change topics and offsets, as RocketMQ lets it. The topic flood then meets the caps: SYSTEM_BUSY
    past auto_create_topic_max_per_second, TOPIC_NOT_EXIST past auto_create_topic_max_per_connection
    (a new connection goes on) and, with admin creations on top, max_topic_count, which the broker
    never passes; the route hijack meets the held-name rule; the pipelining client back-pressure."""
    room = 30  # topics the attacks may create next to the startup ones and the control topic
    max_topics = len(TopicConfigs(str(tmp_path / "probe")).table) + 1 + room
    port = free_port()
    settings = dict(listen_port=port, max_topic_count=max_topics, auto_create_topic_max_per_second=5,
                    auto_create_topic_max_per_connection=4)
    with BrokerProcess(str(tmp_path / "store"), **settings) as broker:
        target = Target(broker.address, broker.pid, broker.namesrv_address)
        reports = {r.name: r for r in run_attacks(
            target, ["pipeline", "topics", "admin", "hijack"], seconds=2.0, sample_s=0.5,
            options={"topics": {"count": 300, "connections": 20},
                     "admin": {"topic": "AttackVictim", "creations": room + 10}})}
        topics = _topic_count(broker.address)
        log = broker.log_text()
    _assert_survived(reports)
    for name, r in reports.items():  # the control client's rate comes back after each attack
        assert r.control_msg_s["after"] >= r.control_msg_s["before"] / RECOVERED_FRACTION, (name, r.control_msg_s)
    assert reports["pipeline"].outcome["broker_stopped_reading"], reports["pipeline"].outcome
    flood = reports["topics"].outcome
    assert set(flood["answer_codes"]) <= {ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY,
                                          ResponseCode.TOPIC_NOT_EXIST}, flood
    assert flood["refused_by"].get("auto_create_topic_max_per_second", 0) > 0, flood
    assert flood["refused_by"].get("auto_create_topic_max_per_connection", 0) > 0 and flood["connections"] > 1, flood
    assert set(flood["refused_by"]) <= {"auto_create_topic_max_per_second", "auto_create_topic_max_per_connection",
                                        "max_topic_count"}, flood
    # the burst and 5 a second for about 2 s: a fraction of the room
    assert flood["answer_codes"].get(ResponseCode.SUCCESS, 0) <= 5 + 5 * 4, flood
    admin = reports["admin"].outcome
    assert admin["answer_codes"]["topic_read_only"] == ResponseCode.SUCCESS, admin  # no ACL: served
    assert admin["creation_codes"].get(ResponseCode.SYSTEM_ERROR, 0) >= 10, admin
    assert set(admin["creations_refused_by"]) == {"max_topic_count"}, admin
    assert topics == max_topics
    hijack = reports["hijack"].outcome
    assert hijack["register_code"] == ResponseCode.NO_PERMISSION, hijack
    assert hijack["unregister_code"] == ResponseCode.NO_PERMISSION, hijack
    assert hijack["route_addrs"] == [broker.address], hijack
    assert len(log.splitlines()) < 400, f"{len(log.splitlines())} log lines for the attacks"


def test_the_tool_refuses_addresses_other_than_loopback():
    proc = subprocess.run([sys.executable, "-m", "mqstore.tools.attack", "--broker", "10.1.2.3:10911", "--pid", "1",
                           "--namesrv", "10.1.2.3:9876", "--seconds", "0.1", "--attack", "garbage"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and "loopback only" in proc.stderr + proc.stdout
