"""``mqstore admin`` against a running broker: status, topics, topic-create, groups, group."""

from __future__ import annotations

import json

import pytest

from mqstore import MessageStore
from mqstore.broker.consumer import GroupConsumer
from mqstore.tools.cli import main

from helpers_broker import free_port, running_broker, send_raw

pytestmark = pytest.mark.multiprocess


def admin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["admin", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_admin_reports_topics_groups_and_lag(tmp_path, capsys) -> None:
    with running_broker(str(tmp_path / "store")) as broker:
        addr = ["--broker", broker.address]
        assert all(code == 0 for code, _, _ in send_raw(broker.address, "Orders", [b"o%d" % i for i in range(10)]))
        store = MessageStore.attach(broker.root)
        try:
            consumer = GroupConsumer(store, "CID_ADMIN", "Orders")
            got = []
            for _ in range(50):  # a poll returns what is dispatched so far
                got += consumer.poll(32, 0.2)
                if len(got) >= 10:
                    break
            assert len(got) == 10
            consumer.commit()
            # 3 more the group has not read: its lag
            send_raw(broker.address, "Orders", [b"late"] * 3, queue_id=1)

            code, out, _ = admin(capsys, "status", *addr, "--json")
            table = json.loads(out)["table"]
            assert code == 0 and table["brokerAddr"] == broker.address and table["frontProcesses"] == "2"
            assert table["embeddedConsumers"] == "1" and int(table["put_messages"]) == 13
            # a master with no slave: its HA address, none connected, every byte since the open unconfirmed
            ha_port = broker.store.ctl.get("ha_port")
            assert table["haServerAddr"] == f"127.0.0.1:{ha_port}" and table["haSlaveCount"] == "0"
            assert table["slaveFallBehindMuch"] == str(int(table["commitLogMaxOffset"]) - int(table["confirmed"]))
            assert table["haLastReportTimestamp"] == "0" and "masterAddr" not in table
            code, out, _ = admin(capsys, "status", *addr)
            assert code == 0 and any(line.split() == ["haSlaveCount", "0"] for line in out.splitlines())
            assert f"replication: master, HA port {ha_port}, 0 slave(s) connected, no report yet" in out

            code, out, _ = admin(capsys, "topics", *addr, "--json")
            topics = {t["topic"]: t for t in json.loads(out)["topics"]}
            assert code == 0 and topics["Orders"]["messages"] == 13 and topics["Orders"]["read_queues"] == 4
            assert "%RETRY%CID_ADMIN" in topics and "TBW102" in topics

            code, out, _ = admin(capsys, "topic-create", "Made", "--queues", "3", *addr)
            assert code == 0 and "Made: 3 queues" in out
            code, out, _ = admin(capsys, "topics", *addr)
            assert code == 0 and any(line.split()[:3] == ["Made", "3", "3"] for line in out.splitlines())

            for _ in range(50):  # the commit is oneway: let the controller take it
                code, out, _ = admin(capsys, "group", "CID_ADMIN", *addr, "--json")
                detail = json.loads(out)
                if sum(q["consumer_offset"] for q in detail["queues"]) == 10:
                    break
            lag = {q["queue"]: q["lag"] for q in detail["queues"]}
            assert lag == {0: 0, 1: 3, 2: 0, 3: 0}
            assert [c["clientId"] for c in detail["clients"]] == [consumer.client_id]

            code, out, _ = admin(capsys, "groups", *addr)
            assert code == 0
            row = next(line for line in out.splitlines() if line.startswith("CID_ADMIN"))
            assert row.split()[:3] == ["CID_ADMIN", "1", "3"]
            consumer.close()
        finally:
            store.shutdown()


def test_admin_names_an_unreachable_broker_and_a_refusal(tmp_path, capsys) -> None:
    code, _, err = admin(capsys, "status", "--broker", f"127.0.0.1:{free_port()}")
    assert code == 2 and "cannot ask 127.0.0.1:" in err
    with running_broker(str(tmp_path / "store")) as broker:
        code, _, err = admin(capsys, "topic-create", "bad topic!", "--broker", broker.address)
        assert code == 1 and "code 1" in err and "illegal characters" in err


def test_admin_signs_with_an_account_of_the_acl(tmp_path, capsys, monkeypatch) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text('accounts:\n  - accessKey: operator\n    secretKey: "operator-secret"\n    admin: true\n'
                   '  - accessKey: producer\n    secretKey: "producer-secret"\n    admin: false\n')
    monkeypatch.delenv("MQSTORE_SECRET_KEY", raising=False)
    with running_broker(str(tmp_path / "store"), acl_enable=True, acl_file=str(acl)) as broker:
        addr = ["--broker", broker.address]
        code, _, err = admin(capsys, "status", *addr)
        assert code == 1 and "code 16" in err and "AccessKey" in err
        code, _, err = admin(capsys, "status", "--access-key", "operator", *addr)
        assert code == 2 and "MQSTORE_SECRET_KEY" in err
        monkeypatch.setenv("MQSTORE_SECRET_KEY", "producer-secret")
        code, _, err = admin(capsys, "topic-create", "Guarded", "--access-key", "producer", *addr)
        assert code == 1 and "admin" in err
        monkeypatch.setenv("MQSTORE_SECRET_KEY", "operator-secret")
        code, out, err = admin(capsys, "topic-create", "Guarded", "--access-key", "operator", *addr)
        assert code == 0, err
        assert broker.controller.topics.get("Guarded") is not None
