"""The guarded NameServer (docs/security.md): a broker name registered from one address
cannot be taken by another while its registering connection is open, an UNREGISTER_BROKER comes
from that connection or carries a valid signature, a NameServer given broker accounts takes signed
registrations only, a broker's routes go when its connection closes (RocketMQ's onChannelDestroy),
the embedded NameServer answers while the broker's controller loop is busy, and a taken NameServer
port is one line and exit 2. Loopback only, free ports, every wait bounded."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import zlib
from typing import Any

import pytest
from helpers_broker import LOOPBACK, ROOT, BrokerProcess, free_port, running_broker
from helpers_proc import wait_until

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.acl.signature import sign_fields
from mqstore.broker.codes import RequestCode, ResponseCode

BODY = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
    "dataVersion": {"counter": 1, "timestamp": 5},
    "topicConfigTable": {"TBW102": {"topicName": "TBW102", "readQueueNums": 8, "writeQueueNums": 8, "perm": 7},
                         "TopicGuard": {"topicName": "TopicGuard", "readQueueNums": 4, "writeQueueNums": 4,
                                        "perm": 6}}}}).encode()
AK, SK = "rocketmq2", "12345678"


class Conn:
    """One blocking connection to a NameServer, kept open (as a broker keeps its own)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.frames = FrameReader()
        self.opaque = 0

    def call(self, code: int, fields: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
        self.opaque += 1
        self.sock.sendall(RemotingCommand(code, language="JAVA", version=407, opaque=self.opaque,
                                          ext_fields=fields, body=body).encode())
        while (got := self.frames.next()) is None:
            data = self.sock.recv(65536)
            assert data, "the NameServer closed the connection"
            self.frames.feed(data)
        return got

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def registration(name: str, broker_id: int, addr: str, *, signed_with: tuple[str, str] | None = None,
                 cluster: str = "DefaultCluster") -> dict[str, str]:
    fields = {"brokerName": name, "brokerAddr": addr, "clusterName": cluster, "haServerAddr": "",
              "brokerId": str(broker_id), "compressed": "false", "bodyCrc32": str(zlib.crc32(BODY) & 0x7FFFFFFF)}
    return sign_fields(fields, BODY, *signed_with) if signed_with else fields


def unregistration(name: str, broker_id: int, addr: str, *, signed_with: tuple[str, str] | None = None,
                   cluster: str = "DefaultCluster") -> dict[str, str]:
    fields = {"brokerName": name, "brokerAddr": addr, "clusterName": cluster, "brokerId": str(broker_id)}
    return sign_fields(fields, None, *signed_with) if signed_with else fields


def route(address: str, topic: str = "TBW102") -> dict[str, dict[int, str]]:
    """broker name -> {broker id: address} of the topic's route ({} when there is none)."""
    with Conn(address) as c:
        got = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if got.code == ResponseCode.TOPIC_NOT_EXIST:
        return {}
    assert got.code == ResponseCode.SUCCESS, (got.code, got.remark)
    return {b["brokerName"]: {int(k): v for k, v in b["brokerAddrs"].items()}
            for b in json.loads(got.body)["brokerDatas"]}


# == the hijack =================================================================================

def test_an_impostor_cannot_take_a_live_brokers_name_nor_unregister_it(tmp_path):
    """The attack found on loopback: an anonymous REGISTER_BROKER with the broker's name, id 0 and
    another address replaced the real broker in the route (both clients then went to the
    impostor), and an anonymous UNREGISTER_BROKER removed the route. Both are refused now, naming
    why, and the route still names the real broker."""
    with running_broker(str(tmp_path / "real"), broker_name="broker-a") as broker:
        ns = broker.namesrv_address
        assert route(ns) == {"broker-a": {0: broker.address}}
        impostor = f"{LOOPBACK}:{free_port()}"
        with Conn(ns) as c:
            got = c.call(RequestCode.REGISTER_BROKER, registration("broker-a", 0, impostor), BODY)
            assert got.code == ResponseCode.NO_PERMISSION, (got.code, got.remark)
            assert "broker-a" in got.remark and "0" in got.remark and broker.address in got.remark, got.remark
            assert route(ns) == {"broker-a": {0: broker.address}}, "the impostor took the route"
            got = c.call(RequestCode.UNREGISTER_BROKER, unregistration("broker-a", 0, broker.address))
            assert got.code == ResponseCode.NO_PERMISSION, (got.code, got.remark)
            assert broker.address in got.remark
            assert route(ns) == {"broker-a": {0: broker.address}}, "an anonymous unregistration removed the route"
        # the real broker's own registrations still go through (its connection holds the name)
        before = broker.controller.registrations
        broker._call(broker.controller.register_all())
        assert broker.controller.registrations == before + 1
        assert route(ns) == {"broker-a": {0: broker.address}}


# == the route table's rules =====================================================================

def test_the_route_table_keeps_a_held_name_and_address_and_forgets_a_closed_connections():
    from mqstore.broker.routes import BROKER_CHANNEL_EXPIRED_MS, RouteRefused, RouteTable, parse_register_body

    body = parse_register_body(BODY)
    real, impostor = object(), object()
    t = RouteTable()
    t.register_broker("C", "a:1", "broker-a", 0, "", body, 0, channel=real)
    t.register_broker("C", "b:1", "broker-b", 0, "", body, 0, channel=impostor)
    with pytest.raises(RouteRefused, match="broker broker-a id 0 is registered from a:1"):
        t.register_broker("C", "z:1", "broker-a", 0, "", body, 10, channel=impostor)
    with pytest.raises(RouteRefused, match="a:1 is registered"):  # the same address, from another connection
        t.register_broker("C", "a:1", "broker-x", 0, "", body, 10, channel=impostor)
    with pytest.raises(RouteRefused, match="only that connection, or a signed request"):
        t.unregister_broker("C", "a:1", "broker-a", 0, channel=impostor)
    # an unregistration naming another broker's name and id with one's own address removes nothing of it
    t.unregister_broker("C", "b:1", "broker-a", 0, channel=impostor)
    assert t.brokers["broker-a"]["brokerAddrs"] == {0: "a:1"} and t.brokers["broker-b"]["brokerAddrs"] == {0: "b:1"}
    assert [b["brokerName"] for b in t.route("TBW102")["brokerDatas"]] == ["broker-a", "broker-b"]
    t.unregister_broker("C", "b:1", "broker-b", 0, channel=impostor)
    assert [b["brokerName"] for b in t.route("TBW102")["brokerDatas"]] == ["broker-a"]
    t.register_broker("C", "a:1", "broker-a", 0, "", body, 20, channel=real)  # its own connection: always
    # expired (its broker silent for 120 s, the connection half open): the name can be taken
    later = 20 + BROKER_CHANNEL_EXPIRED_MS + 1
    t.register_broker("C", "z:1", "broker-a", 0, "", body, later, channel=impostor)
    assert t.brokers["broker-a"]["brokerAddrs"] == {0: "z:1"}
    assert t.channel_closed(real) == ["a:1"] and t.brokers["broker-a"]["brokerAddrs"] == {0: "z:1"}
    assert t.channel_closed(impostor) == ["z:1"] and t.route("TBW102") is None and t.clusters == {}
    t.unregister_broker("C", "q:1", "broker-q", 0, verified=True)  # nothing registered there: nothing to do


# == signatures ==================================================================================

def test_a_name_server_with_broker_accounts_takes_signed_registrations_only():
    """Unsigned, unknown key, wrong secret, a body changed after signing: NO_PERMISSION naming
    why, nothing registered. Signed: registered; an unsigned UNREGISTER (even on the registering
    connection) refused, a signed one from another connection taken. Accounts given as a
    function are asked again for each request (an ACL file re-read)."""
    from mqstore.broker.namesrv import NameServerThread

    accounts = {AK: SK}
    ns = NameServerThread(LOOPBACK, 0, accounts=lambda: accounts)
    ns.start()
    address = f"{LOOPBACK}:{ns.port}"
    try:
        with Conn(address) as c:
            for fields, body, why in (
                    (registration("broker-s", 0, "127.0.0.1:1"), BODY, "no AccessKey"),
                    (registration("broker-s", 0, "127.0.0.1:1", signed_with=("nobody", SK)), BODY,
                     "AccessKey nobody is not a broker account"),
                    (registration("broker-s", 0, "127.0.0.1:1", signed_with=(AK, "wrong")), BODY,
                     "signature does not match"),
                    (registration("broker-s", 0, "127.0.0.1:1", signed_with=(AK, SK)), BODY.replace(b"8", b"9"),
                     "signature does not match")):
                got = c.call(RequestCode.REGISTER_BROKER, {**fields, "bodyCrc32": "0"}, body)
                assert got.code == ResponseCode.NO_PERMISSION and why in got.remark, (got.code, got.remark)
            assert route(address) == {}
            got = c.call(RequestCode.REGISTER_BROKER, registration("broker-s", 0, "127.0.0.1:1", signed_with=(AK, SK)),
                         BODY)
            assert got.code == ResponseCode.SUCCESS, got.remark
            assert route(address) == {"broker-s": {0: "127.0.0.1:1"}}
            got = c.call(RequestCode.UNREGISTER_BROKER, unregistration("broker-s", 0, "127.0.0.1:1"))
            assert got.code == ResponseCode.NO_PERMISSION and "no AccessKey" in got.remark
            with Conn(address) as other:
                got = other.call(RequestCode.UNREGISTER_BROKER,
                                 unregistration("broker-s", 0, "127.0.0.1:1", signed_with=(AK, SK)))
                assert got.code == ResponseCode.SUCCESS, got.remark
            assert route(address) == {}
            accounts = {"another": "secret"}
            got = c.call(RequestCode.REGISTER_BROKER, registration("broker-s", 0, "127.0.0.1:1", signed_with=(AK, SK)),
                         BODY)
            assert got.code == ResponseCode.NO_PERMISSION and "not a broker account" in got.remark
    finally:
        ns.close()


@pytest.mark.multiprocess
def test_a_broker_signs_with_its_inner_account(tmp_path):
    """A broker with inner_access_key / inner_secret_key registers with a NameServer that trusts
    that account; one with another secret is refused (and not in the route). A broker's embedded
    NameServer trusts the broker's own account: the broker is registered, an anonymous
    registration of another name is refused."""
    from mqstore.broker.namesrv import NameServerThread

    ns = NameServerThread(LOOPBACK, 0, accounts={AK: SK})
    ns.start()
    address = f"{LOOPBACK}:{ns.port}"
    try:
        with running_broker(str(tmp_path / "good"), broker_name="broker-g", namesrv_addr=address, front_processes=1,
                            inner_access_key=AK, inner_secret_key=SK) as good, \
                running_broker(str(tmp_path / "bad"), broker_name="broker-b", namesrv_addr=address, front_processes=1,
                               inner_access_key=AK, inner_secret_key="wrong") as bad:
            assert route(address) == {"broker-g": {0: good.address}}
            assert good.controller.registrations >= 1 and bad.controller.registrations == 0
    finally:
        ns.close()
    with running_broker(str(tmp_path / "embedded"), broker_name="broker-e", front_processes=1,
                        inner_access_key=AK, inner_secret_key=SK) as broker:
        assert route(broker.namesrv_address) == {"broker-e": {0: broker.address}}
        with Conn(broker.namesrv_address) as c:
            got = c.call(RequestCode.REGISTER_BROKER, registration("broker-z", 0, "127.0.0.1:1"), BODY)
        assert got.code == ResponseCode.NO_PERMISSION and "no AccessKey" in got.remark
        assert route(broker.namesrv_address) == {"broker-e": {0: broker.address}}


# == liveness ====================================================================================

@pytest.mark.multiprocess
def test_a_killed_brokers_route_goes_with_its_connection_and_its_name_is_free_again(tmp_path):
    """broker-k (``mqstore broker``, a real process) holds its name: an impostor is refused.
    SIGKILLed, its connection closes and its route goes at once (not after the 120 s expiry:
    RocketMQ's onChannelDestroy); a new broker-k on another port and directory then registers."""
    from mqstore.broker.namesrv import NameServerThread

    ns = NameServerThread(LOOPBACK, 0)
    ns.start()
    address = f"{LOOPBACK}:{ns.port}"
    try:
        settings = {"broker_name": "broker-k", "namesrv_addr": address, "front_processes": 1}
        proc = BrokerProcess(str(tmp_path / "first"), **settings)
        try:
            assert route(address) == {"broker-k": {0: proc.address}}
            with Conn(address) as c:
                got = c.call(RequestCode.REGISTER_BROKER, registration("broker-k", 0, f"{LOOPBACK}:{free_port()}"),
                             BODY)
                assert got.code == ResponseCode.NO_PERMISSION and proc.address in got.remark, got.remark
            proc.kill()
            t = time.monotonic()
            wait_until(lambda: route(address) == {}, 10, "broker-k's route gone")
            print(f"route gone {time.monotonic() - t:.3f} s after the SIGKILL")
        finally:
            proc.kill()
        with BrokerProcess(str(tmp_path / "second"), **settings) as second:
            assert second.address != proc.address
            assert route(address) == {"broker-k": {0: second.address}}
            assert second.stop() == 0
        assert route(address) == {}, "a clean stop unregisters"
    finally:
        ns.close()


@pytest.mark.multiprocess
def test_a_broker_registers_again_at_once_when_its_connection_is_lost(tmp_path):
    """The NameServer closes the broker's connection (its routes go with it): the broker opens
    another and registers again at once, not at its next period (30 s)."""
    from mqstore.broker.namesrv import NameServerThread

    ns = NameServerThread(LOOPBACK, 0)
    ns.start()
    address = f"{LOOPBACK}:{ns.port}"
    try:
        with running_broker(str(tmp_path / "b"), broker_name="broker-r", namesrv_addr=address,
                            front_processes=1) as broker:
            assert route(address) == {"broker-r": {0: broker.address}}
            before = broker.controller.registrations
            ns.call(lambda: [w.close() for w in list(ns.server._conns)])
            wait_until(lambda: broker.controller.registrations > before, 5, "a new registration")
            assert route(address) == {"broker-r": {0: broker.address}}
    finally:
        ns.close()


# == the embedded NameServer's own loop ===========================================================

@pytest.mark.multiprocess
def test_the_embedded_name_server_answers_while_the_controller_loop_is_busy(tmp_path):
    """The controller's loop blocked (a 3 s synchronous sleep) or busy (3 s of Python work) in
    the broker's process: a route query to the embedded NameServer still answers within 1 s."""
    def blocked(work: Any) -> float:
        async def hold() -> None:
            work()
        fut = asyncio.run_coroutine_threadsafe(hold(), broker._loop)
        time.sleep(0.2)  # the loop is in it
        t = time.monotonic()
        assert route(broker.namesrv_address) == {"broker-a": {0: broker.address}}
        took = time.monotonic() - t
        assert not fut.done(), "the controller's loop was not held the whole time"
        fut.result(10)
        return took

    def spin(seconds: float = 3.0) -> None:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1

    with running_broker(str(tmp_path / "b"), front_processes=1) as broker:
        slept = blocked(lambda: time.sleep(3))
        spun = blocked(spin)
        print(f"route query with the controller loop asleep: {slept * 1000:.1f} ms, busy: {spun * 1000:.1f} ms")
        assert slept < 1 and spun < 1


# == a taken port ==================================================================================

def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "mqstore", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.multiprocess
def test_a_taken_name_server_port_is_one_line_and_exit_2(tmp_path):
    """``mqstore broker`` whose namesrv_listen_port is taken, and ``mqstore namesrv`` whose
    --listen-port is: one line naming the port and its setting, exit 2 (it said "cannot read
    the store")."""
    with socket.socket() as holder:
        holder.bind((LOOPBACK, 0))
        holder.listen()
        port = holder.getsockname()[1]
        got = _run_cli("broker", str(tmp_path / "store"), "--set", f"namesrv_listen_port={port}", "--set",
                       "listen_port=0", "--set", f"bind_address={LOOPBACK}", "--set", f"broker_ip1={LOOPBACK}",
                       "--set", "front_processes=1")
        assert got.returncode == 2, (got.returncode, got.stderr)
        errors = [line for line in got.stderr.splitlines() if line.startswith("mqstore broker:")]
        assert errors == [f"mqstore broker: the NameServer port {port} (namesrv_listen_port) on {LOOPBACK} is taken: "
                          "Address already in use (hint: stop what holds the port, or give the setting another "
                          "port (0 = any free one))"], got.stderr
        assert got.stderr.splitlines()[-1] == errors[0] and "Traceback" not in got.stderr
        got = _run_cli("namesrv", "--host", LOOPBACK, "--listen-port", str(port))
        assert got.returncode == 2, (got.returncode, got.stderr)
        assert got.stderr.splitlines() == [f"mqstore namesrv: the NameServer port {port} (--listen-port) on {LOOPBACK} "
                                           "is taken: Address already in use (hint: stop what holds the port, or give "
                                           "the setting another port (0 = any free one))"]


def test_mqstore_namesrv_acl_trusts_the_files_admin_accounts(tmp_path):
    """``mqstore namesrv --acl plain_acl.yml``: the accounts with admin: true are the brokers'
    (an unsigned registration refused, one signed by such an account taken), as the ACL in force
    has them (a change of the file is read again); a file without one is refused naming it
    (exit 2), not served as an open NameServer."""
    from mqstore.tools.commands.namesrv import broker_accounts

    acl = tmp_path / "plain_acl.yml"
    acl.write_text("globalWhiteRemoteAddresses:\n  - 10.10.103.*\naccounts:\n"
                   "  - accessKey: RocketMQ\n    secretKey: '12345678'\n    admin: false\n"
                   f"  - accessKey: {AK}\n    secretKey: '{SK}'\n    admin: true\n")
    current = broker_accounts(str(acl))
    assert current() == {AK: SK}
    acl.write_text("accounts:\n  - accessKey: brokers\n    secretKey: another-secret\n    admin: true\n")
    wait_until(lambda: current() == {"brokers": "another-secret"}, 5, "the changed file read again")
    acl.write_text(f"accounts:\n  - accessKey: {AK}\n    secretKey: '{SK}'\n    admin: true\n")
    wait_until(lambda: current() == {AK: SK}, 5, "the changed file read again")

    port = free_port()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "mqstore", "namesrv", "--host", LOOPBACK, "--listen-port", str(port),
                             "--acl", str(acl)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def connected() -> Conn | None:
            assert proc.poll() is None, proc.communicate()
            try:
                return Conn(f"{LOOPBACK}:{port}")
            except OSError:
                return None
        with wait_until(connected, 20, "mqstore namesrv listening") as c:
            got = c.call(RequestCode.REGISTER_BROKER, registration("broker-f", 0, "127.0.0.1:1"), BODY)
            assert got.code == ResponseCode.NO_PERMISSION and "no AccessKey" in got.remark, got.remark
            got = c.call(RequestCode.REGISTER_BROKER, registration("broker-f", 0, "127.0.0.1:1", signed_with=(AK, SK)),
                         BODY)
            assert got.code == ResponseCode.SUCCESS, got.remark
            assert route(f"{LOOPBACK}:{port}") == {"broker-f": {0: "127.0.0.1:1"}}
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0

    none = tmp_path / "none.yml"
    none.write_text("accounts:\n  - accessKey: RocketMQ\n    secretKey: '12345678'\n")
    got = _run_cli("namesrv", "--host", LOOPBACK, "--listen-port", "0", "--acl", str(none))
    assert got.returncode == 2 and got.stderr.splitlines() == [
        f"mqstore namesrv: --acl {none}: no account with admin: true (the brokers' accounts a NameServer trusts)"], \
        got.stderr
