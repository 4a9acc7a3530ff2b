"""A broker with acl_enable moves a consumer group's offsets only for an admin account or one that
lists the group in groupPerms with SUB (docs/security.md "Offsets are the group's"): an
account's defaultGroupPerm lets it pull from any group, not move any group's offsets. Checked
with mqstore.client, raw requests (UPDATE_CONSUMER_OFFSET, and a pull carrying a commit) and the
real C++ push consumer, whose offset commits still work for an account listing its group."""

from __future__ import annotations

import asyncio
import platform
import socket
import time

import pytest
from helpers_broker import running_broker
from helpers_proc import wait_until

from mqstore._remoting import FrameReader, RemotingCommand
from mqstore.acl.signature import sign_fields
from mqstore.client import MQClientError, PullConsumer, SyncProducer
from mqstore.client.message import MessageQueue
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess

TOPIC = "TopicOffsets"
ACL = f"""\
accounts:
  - accessKey: consumer
    secretKey: consumer-secret
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB|SUB
    groupPerms:
      - CID_OWN=SUB
      - CID_CPP_OWN=SUB
  - accessKey: cluster
    secretKey: cluster-secret
    admin: true
"""
CONSUMER = ("consumer", "consumer-secret")
ADMIN = ("cluster", "cluster-secret")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("acl-offsets")
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL)
    with running_broker(str(base / "store"), acl_enable=True, acl_file=str(acl_file), front_processes=1) as broker:
        with SyncProducer("PID_OFFSETS", broker.namesrv_address, credentials=ADMIN) as admin:
            for i in range(8):
                admin.send(TOPIC, f"seed-{i}".encode())
        yield broker


def _request(address: str, code: int, fields: dict[str, str], credentials: tuple[str, str]) -> RemotingCommand:
    fields = sign_fields(dict(fields), None, *credentials)
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(RemotingCommand(code, opaque=1, ext_fields=fields).encode())
        frames = FrameReader()
        while (answer := frames.next()) is None:
            data = sock.recv(65536)
            assert data, "the broker closed the connection"
            frames.feed(data)
    return answer


def _update(group: str, offset: int) -> dict[str, str]:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": "0", "commitOffset": str(offset)}


def _commit(broker, group: str, offset: int, credentials: tuple[str, str]) -> None:
    async def run() -> None:
        async with PullConsumer(group, broker.namesrv_address, credentials=credentials) as consumer:
            await consumer.commit(MessageQueue(TOPIC, broker.config.broker_name, 0), offset)
    asyncio.run(run())


def test_an_account_listing_its_group_commits_its_offsets(broker):
    _commit(broker, "CID_OWN", 3, CONSUMER)
    assert broker.controller.offsets.query("CID_OWN", TOPIC, 0) == 3


def test_an_account_with_only_the_default_group_perm_cannot_move_a_groups_offsets(broker):
    """Regression: with defaultGroupPerm SUB an account could reset any group's offsets."""
    _commit(broker, "CID_VICTIM", 2, ADMIN)  # an admin may
    assert broker.controller.offsets.query("CID_VICTIM", TOPIC, 0) == 2
    with pytest.raises(MQClientError) as caught:
        _commit(broker, "CID_VICTIM", 2**63 - 1, CONSUMER)
    assert caught.value.code == ResponseCode.NO_PERMISSION
    assert "moving the offsets of group:CID_VICTIM" in str(caught.value)
    assert "defaultGroupPerm" in str(caught.value)
    got = _request(broker.address, RequestCode.UPDATE_CONSUMER_OFFSET, _update("CID_VICTIM", 0), CONSUMER)
    assert got.code == ResponseCode.NO_PERMISSION, got.remark
    assert broker.controller.offsets.query("CID_VICTIM", TOPIC, 0) == 2
    # reading the group's offsets and pulling for it need no more than before
    got = _request(broker.address, RequestCode.QUERY_CONSUMER_OFFSET,
                   {"consumerGroup": "CID_VICTIM", "topic": TOPIC, "queueId": "0"}, CONSUMER)
    assert got.code == ResponseCode.SUCCESS and got.ext_fields["offset"] == "2", got.remark


def _pull(group: str, sys_flag: int, commit_offset: int) -> dict[str, str]:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
            "sysFlag": str(sys_flag), "commitOffset": str(commit_offset), "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0"}


def test_a_pull_carrying_a_commit_is_an_offset_update(broker):
    """PullSysFlag's commit bit makes the master store the pull's commitOffset: refused, pull and
    all, for a group the account has only by default; a pull without it is served."""
    _commit(broker, "CID_PULLED", 1, ADMIN)
    got = _request(broker.address, RequestCode.PULL_MESSAGE, _pull("CID_PULLED", 0x1 | 0x4, 6), CONSUMER)
    assert got.code == ResponseCode.NO_PERMISSION and "moving the offsets of group:CID_PULLED" in (got.remark or "")
    got = _request(broker.address, RequestCode.PULL_MESSAGE, _pull("CID_PULLED", 0x4, 6), CONSUMER)
    assert got.code == ResponseCode.SUCCESS, got.remark
    assert broker.controller.offsets.query("CID_PULLED", TOPIC, 0) == 1
    got = _request(broker.address, RequestCode.PULL_MESSAGE, _pull("CID_OWN", 0x1 | 0x4, 1), CONSUMER)
    assert got.code == ResponseCode.SUCCESS, got.remark
    wait_until(lambda: broker.controller.offsets.query("CID_OWN", TOPIC, 0) == 1, 10, "the pull's commit stored")


# -- the real C++ client ------------------------------------------------------------------------------

@pytest.mark.skipif(platform.machine() != "x86_64", reason="the rocketmq wheel exists for x86_64 Linux only")
def test_the_cpp_push_consumers_commits_work_for_an_account_listing_its_group(broker, tmp_path):
    """Its pulls' commits and its UPDATE_CONSUMER_OFFSET at shutdown store the group's offsets
    up to every queue's end; the same consumer on a group the account has only by default
    consumes what its first pulls bring and moves no offset."""
    from test_broker_cpp import ClientProc

    store = broker.store
    store.wait_dispatched()
    ends = {q: store.get_max_offset_in_queue(TOPIC, q) for q in range(8)}
    ends = {q: end for q, end in ends.items() if end > 0}
    for group in ("CID_CPP_OWN", "CID_CPP_DEFAULT"):
        push = ClientProc(str(tmp_path), group, "push", group=group, namesrv=broker.namesrv_address, topic=TOPIC,
                          credentials=list(CONSUMER))
        try:
            got = push.wait_messages(8, 60)
            assert {f"seed-{i}" for i in range(8)} <= {m["body"] for m in got}
            if group == "CID_CPP_OWN":
                wait_until(lambda: all(broker.controller.offsets.query(group, TOPIC, q) == end
                                       for q, end in ends.items()), 30, "the C++ consumer's offsets committed")
            push.stop()  # its shutdown sends UPDATE_CONSUMER_OFFSET (oneway) for every queue
        finally:
            push.kill()
    time.sleep(1.0)  # the last oneway commits served, or refused
    assert {q: broker.controller.offsets.query("CID_CPP_OWN", TOPIC, q) for q in ends} == ends
    assert all(broker.controller.offsets.query("CID_CPP_DEFAULT", TOPIC, q) == -1 for q in range(8))
