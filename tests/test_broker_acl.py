"""The broker with acl_enable (docs/security.md): RocketMQ 4.9.7's plain ACL checked in the fronts
through the request table's ACL column, against mqstore.client's credentials, raw requests as an
attacker sends them, and the real C++ client's set_session_credentials."""

from __future__ import annotations

import asyncio
import platform
import re
import socket
import time

import pytest
from helpers_broker import running_broker
from helpers_proc import wait_until

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.acl.signature import sign_fields
from mqstore.client import MQClientError, PullConsumer, SyncProducer
from mqstore.client.message import MessageQueue
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess

ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: RocketMQ
    secretKey: "12345678"
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TopicA=PUB|SUB
      - TopicRO=SUB
    groupPerms:
      - CID_DENIED=DENY
  - accessKey: rocketmq2
    secretKey: "87654321"
    whiteRemoteAddress:
    admin: true
"""
USER = ("RocketMQ", "12345678")
ADMIN = ("rocketmq2", "87654321")


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("acl")
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL)
    with running_broker(str(base / "store"), acl_enable=True, acl_file=str(acl_file), front_processes=1) as broker:
        with SyncProducer("PID_ADMIN", broker.namesrv_address, credentials=ADMIN) as admin:
            for topic in ("TopicA", "TopicRO", "TopicB"):
                admin.send(topic, b"seed")
        broker.acl_file = acl_file  # type: ignore[attr-defined]
        yield broker


def _request(address: str, cmd: RemotingCommand, timeout_s: float = 10.0) -> RemotingCommand:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(cmd.encode())
        frames = FrameReader()
        while (answer := frames.next()) is None:
            data = sock.recv(65536)
            assert data, "the broker closed the connection"
            frames.feed(data)
    return answer


def _signed(code: int, fields: dict[str, str], credentials: tuple[str, str] | None, body: bytes = b"",
            opaque: int = 1) -> RemotingCommand:
    fields = dict(fields)
    if credentials is not None:
        sign_fields(fields, body, *credentials)
    return RemotingCommand(code, opaque=opaque, ext_fields=fields, body=body)


def _max_offset(store, topic: str) -> int:
    store.wait_dispatched()
    return sum(store.get_max_offset_in_queue(topic, q) for q in range(8))


# -- producers ------------------------------------------------------------------------------------

def test_a_producer_with_its_keys_sends(acl_broker):
    with SyncProducer("PID_USER", acl_broker.namesrv_address, credentials=USER) as producer:
        result = producer.send("TopicA", b"allowed")
    assert result.status.name == "SEND_OK"


@pytest.mark.parametrize(("credentials", "topic", "named"), [
    (None, "TopicA", "no AccessKey"),
    (("RocketMQ", "wrong-secret"), "TopicA", "signature"),
    (("nobody", "12345678"), "TopicA", "no acl config for accessKey=nobody"),
    (USER, "TopicRO", "PUB"),
    (USER, "TopicB", "PUB"),  # defaultTopicPerm DENY
])
def test_a_send_without_the_right_keys_or_permission_is_refused_and_stores_nothing(acl_broker, credentials, topic,
                                                                                   named):
    before = _max_offset(acl_broker.store, topic)
    with SyncProducer("PID_USER", acl_broker.namesrv_address, credentials=credentials) as producer:
        with pytest.raises(MQClientError) as caught:
            producer.send(topic, b"refused")
    assert caught.value.code == ResponseCode.NO_PERMISSION
    assert named in str(caught.value)
    assert _max_offset(acl_broker.store, topic) == before


# -- consumers ------------------------------------------------------------------------------------

def test_a_consumer_with_its_keys_pulls_and_commits_and_one_without_cannot(acl_broker):
    async def run(credentials: tuple[str, str] | None) -> int:
        async with PullConsumer("CID_A", acl_broker.namesrv_address, credentials=credentials) as consumer:
            mq = MessageQueue("TopicA", acl_broker.config.broker_name, 0)
            found = 0
            for queue in await consumer.queues("TopicA"):
                result = await consumer.pull(queue, 0, 32)
                found += len(result.messages)
            await consumer.commit(mq, 0)
            return found

    assert asyncio.run(run(USER)) >= 1
    with pytest.raises(MQClientError) as caught:
        asyncio.run(run(None))
    assert caught.value.code == ResponseCode.NO_PERMISSION


def test_a_group_denied_cannot_pull(acl_broker):
    fields = {"consumerGroup": "CID_DENIED", "topic": "TopicA", "queueId": "0", "queueOffset": "0",
              "maxMsgNums": "1", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
              "subscription": "*", "subVersion": "0"}
    got = _request(acl_broker.address, _signed(RequestCode.PULL_MESSAGE, fields, USER))
    assert got.code == ResponseCode.NO_PERMISSION and "CID_DENIED" in (got.remark or "")


# -- what the attacks did -----------------------------------------------------------------------------

def test_anonymous_and_non_admin_topic_changes_are_refused(acl_broker):
    """Regression: an anonymous UPDATE_AND_CREATE_TOPIC set a live topic read-only."""
    fields = {"topic": "TopicA", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "8",
              "perm": "4", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}
    for who in (None, USER):
        got = _request(acl_broker.address, _signed(RequestCode.UPDATE_AND_CREATE_TOPIC, fields, who))
        assert got.code == ResponseCode.NO_PERMISSION, (who, got.remark)
    assert acl_broker.controller.topics.get("TopicA")["perm"] == 6
    got = _request(acl_broker.address, _signed(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                               {**fields, "topic": "TopicMadeByAdmin", "perm": "6"}, ADMIN))
    assert got.code == ResponseCode.SUCCESS, got.remark
    assert acl_broker.controller.topics.get("TopicMadeByAdmin") is not None


def test_anonymous_offset_resets_and_consumer_lists_are_refused(acl_broker):
    """Regression: an anonymous UPDATE_CONSUMER_OFFSET reset another group's offsets and
    GET_CONSUMER_CONNECTION_LIST handed out every consumer's id and address."""
    update = {"consumerGroup": "CID_A", "topic": "TopicA", "queueId": "0", "commitOffset": str(2**63 - 1)}
    got = _request(acl_broker.address, _signed(RequestCode.UPDATE_CONSUMER_OFFSET, update, None))
    assert got.code == ResponseCode.NO_PERMISSION
    assert acl_broker.controller.offsets.query("CID_A", "TopicA", 0) != 2**63 - 1
    for code, fields in ((RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "CID_A"}),
                         (RequestCode.GET_BROKER_RUNTIME_INFO, {}), (RequestCode.GET_ALL_CONSUMER_OFFSET, {}),
                         (RequestCode.GET_ALL_TOPIC_CONFIG, {})):
        for who, named in ((None, "no AccessKey"), (USER, "need admin permission")):
            got = _request(acl_broker.address, _signed(code, fields, who))
            assert got.code == ResponseCode.NO_PERMISSION and named in (got.remark or ""), (code, who, got.remark)
        got = _request(acl_broker.address, _signed(code, fields, ADMIN))
        assert got.code != ResponseCode.NO_PERMISSION, (code, got.remark)


def test_a_request_tampered_after_signing_is_refused(acl_broker):
    fields = {"topic": "TopicA", "queueId": "0"}
    cmd = _signed(RequestCode.GET_MAX_OFFSET, fields, USER)
    assert _request(acl_broker.address, cmd).code == ResponseCode.SUCCESS
    cmd.ext_fields["queueId"] = "1"
    got = _request(acl_broker.address, cmd)
    assert got.code == ResponseCode.NO_PERMISSION and "signature" in (got.remark or "")


# -- the file -----------------------------------------------------------------------------------------

def test_the_acl_file_is_reloaded_when_it_changes(acl_broker):
    acl_file = acl_broker.acl_file
    original = acl_file.read_text()
    with SyncProducer("PID_USER", acl_broker.namesrv_address, credentials=USER) as producer:
        with pytest.raises(MQClientError):
            producer.send("TopicB", b"not yet")
        try:
            acl_file.write_text(original.replace("      - TopicRO=SUB", "      - TopicRO=SUB\n      - TopicB=PUB"))

            def sends() -> bool:
                try:
                    return producer.send("TopicB", b"now allowed").status.name == "SEND_OK"
                except MQClientError:
                    return False
            wait_until(sends, 20, "the reloaded ACL letting TopicB through", every_s=0.2)
            acl_file.write_text("accounts: [this is not: valid")  # a bad version keeps the last good one
            time.sleep(1.0)  # two of the fronts' reload checks (every 0.5 s)
            assert producer.send("TopicB", b"still allowed").status.name == "SEND_OK"
        finally:
            acl_file.write_text(original)
    wait_until(lambda: _request(acl_broker.address, _signed(RequestCode.SEND_MESSAGE, {
        "producerGroup": "P", "topic": "TopicB", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0"}, USER)).code == ResponseCode.NO_PERMISSION,
               20, "the original ACL back in force", every_s=0.2)


def test_a_broker_with_acl_on_and_no_acl_file_does_not_start(tmp_path):
    with pytest.raises(Exception, match="plain_acl.yml"):
        with running_broker(str(tmp_path / "s"), acl_enable=True):
            pass


# -- the real C++ client --------------------------------------------------------------------------------

cpp = pytest.mark.skipif(platform.machine() != "x86_64", reason="the rocketmq wheel exists for x86_64 Linux only")


#: what the C++ client's log says of a failed request: a send's answer (processSendResponse: the
#: broker's remark and code), a send attempt given up, a send that found no connection (while
#: another of the client's threads held its connection table), a pull's answer (the MQException
#: pullMessageSync threw: remark and code), a pull given up (every failed pull, answered or not),
#: and the broker's refusal of a consumer's rebalance (findConsumerIds) or of its unregistering
_CPP_SEND_ANSWER = re.compile(r"processSendResponse error remark:(?P<remark>.*), error code:(?P<code>-?\d+)\[")
_CPP_SEND_FAILED = "send failed of times:"
_CPP_NO_TRANSPORT = re.compile(r"GetTransport of:\S+ get timed_mutex timeout")
_CPP_PULL_ANSWER = re.compile(r"\(error\):msg: (?P<remark>.*?),error:(?P<code>-?\d+),in file <[^>]*> line:\d+"
                              r"\[pullMessageSync:")
_CPP_PULL_FAILED = re.compile(r"\(error\):msg: The pullResult NULL ofMessageQueue \[")
_CPP_REBALANCE_ANSWER = re.compile(r"\(error\):msg: (?P<remark>.*?),error:(?P<code>-?\d+),in file <[^>]*> line:\d+"
                                   r"\[findConsumerIds:")
_CPP_UNREGISTER_ANSWER = re.compile(r"unregisterClient fail:(?P<remark>.*),(?P<code>-?\d+)\[unregisterClient:")
NO_TRANSPORT = "no connection yet"


def _cpp_failed_attempts(log: str, kind: str) -> list[tuple[int, str] | str | None]:
    """Every failed send or pull attempt (kind "send" or "pull") the C++ client's log shows, in
    order: the broker's (code, remark) when it answered; NO_TRANSPORT for a send the client failed
    before sending (no connection yet); None for one failed without a word (a pull gets none for
    an unanswered request)."""
    answer_re, failed = (_CPP_SEND_ANSWER, _CPP_SEND_FAILED) if kind == "send" else (_CPP_PULL_ANSWER, None)
    out: list[tuple[int, str] | str | None] = []
    pending: tuple[int, str] | str | None = None
    for line in log.splitlines():
        if (m := answer_re.search(line)) is not None:
            pending = (int(m["code"]), m["remark"])
        elif kind == "send" and _CPP_NO_TRANSPORT.search(line):
            pending = NO_TRANSPORT
        elif (failed in line) if failed else _CPP_PULL_FAILED.search(line) is not None:
            out.append(pending)
            pending = None
    return out


def _answers(log: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    return [(int(m["code"]), m["remark"]) for m in pattern.finditer(log)]


def _assert_all_refused(attempts: list[tuple[int, str] | str | None], named: str, what: str,
                        unanswered: str | None = NO_TRANSPORT) -> None:
    """Every attempt the broker answered was refused with NO_PERMISSION and a remark naming
    ``named``, at least one was answered, and the ones it did not answer (``unanswered``: a
    send's are NO_TRANSPORT, a pull's None) came first, before the client's first connection to
    the broker was up: no attempt failed in another way."""
    answered = [i for i, a in enumerate(attempts) if isinstance(a, tuple)]
    assert answered, f"{what}: no attempt answered by the broker: {attempts}"
    first = answered[0]
    assert all(a == unanswered for a in attempts[:first]), f"{what}: {attempts}"
    assert all(isinstance(a, tuple) and a[0] == ResponseCode.NO_PERMISSION and named in a[1]
               for a in attempts[first:]), f"{what}: {attempts}"


def _cpp_producer(tmp_path, namesrv: str, name: str, credentials: tuple[str, str] | None, topic: str,
                  count: int = 3, retry_first_s: float = 0) -> tuple[list[dict], str]:
    """A C++ producer's send_sync of count messages (bodies NAME-i): its "sent" events and its log.
    retry_first_s: the first send is tried again for that long (the client fails a send at once,
    unsent, while another of its threads connects to the broker: test_broker_cpp)."""
    from test_broker_cpp import ClientProc

    steps: list[dict[str, object]] = [{"op": "sync", "topic": topic, "body": f"{name}-{i}"} for i in range(count)]
    steps[0]["retry_for_s"] = retry_first_s
    spec: dict = {"group": "PID_CPP", "namesrv": namesrv, "steps": steps}
    if credentials is not None:
        spec["credentials"] = list(credentials)
    proc = ClientProc(str(tmp_path), name, "produce", **spec)
    try:
        proc.finish(90)
        return proc.events("sent"), proc.client_log()
    finally:
        proc.kill()


@cpp
def test_the_cpp_producer_with_session_credentials(acl_broker, tmp_path):
    """set_session_credentials: the right key sends; a wrong secret, no credentials, a topic the
    account has SUB only on and a topic DENY by its defaultTopicPerm are each refused with
    NO_PERMISSION naming what was missing, and nothing is stored.

    The C++ client reports every failed send as "No route info of this topic: T" (its
    DefaultMQProducer::sendDefaultImpl throws that once its retries are spent, whatever made them
    fail), so the error alone cannot tell an ACL refusal from a missing route: the client's log
    must show the route found (the NameServer does not check the ACL, as 4.9.7's) and every
    failed attempt answered 16 with the expected remark, but for attempts the client failed
    itself before its first connection to the broker was up (it logs those: NO_TRANSPORT)."""
    namesrv = acl_broker.namesrv_address
    ok, log = _cpp_producer(tmp_path, namesrv, "right", USER, "TopicA", retry_first_s=30)
    assert len(ok) == 3 and all("error" not in e and e["status"] == 0 for e in ok), (ok, log[-3000:])
    assert _answers(log, _CPP_SEND_ANSWER) == []

    for name, credentials, topic, named in (
            ("wrong", ("RocketMQ", "nope"), "TopicA", "check signature failed for accessKey=RocketMQ"),
            ("anonymous", None, "TopicA", "no AccessKey in the request (code 10)"),
            ("readonly", USER, "TopicRO", "no PUB permission for topic:TopicRO: accessKey=RocketMQ has only SUB"),
            ("denied", USER, "TopicB", "topic:TopicB is DENY for accessKey=RocketMQ (by its defaultTopicPerm): "
                                       "no PUB permission")):
        before = _max_offset(acl_broker.store, topic)
        refused, log = _cpp_producer(tmp_path, namesrv, name, credentials, topic)
        assert len(refused) == 3, (name, refused)
        assert all(e.get("error", "").startswith(f"ProducerSendSyncFailed: No route info of this topic: {topic},")
                   for e in refused), (name, refused)
        assert f"updateTopicRouteInfoFromNameServer changed:{topic}" in log, (name, log[-3000:])  # a route
        attempts = _cpp_failed_attempts(log, "send")
        assert len(attempts) >= len(refused), (name, attempts)
        _assert_all_refused(attempts, named, name)
        assert _max_offset(acl_broker.store, topic) == before, name


def _cpp_pull(tmp_path, namesrv: str, name: str, group: str, topic: str, credentials: tuple[str, str] | None,
              max_pulls: int) -> tuple[list[dict], set[str], str]:
    """A C++ pull consumer's bounded pulls of every queue of topic from offset 0 (test_broker_cpp's
    max_pulls: the wheel's own pull() would pull a refused queue forever): its "pull" events, the
    bodies it received, its log."""
    from test_broker_cpp import ClientProc

    spec: dict = {"group": group, "namesrv": namesrv, "topic": topic, "max_pulls": max_pulls}
    if credentials is not None:
        spec["credentials"] = list(credentials)
    proc = ClientProc(str(tmp_path), name, "pull", **spec)
    try:
        proc.finish(120)
        return proc.events("pull"), {m["body"] for m in proc.messages()}, proc.client_log()
    finally:
        proc.kill()


@cpp
def test_the_cpp_pull_consumer_with_session_credentials(acl_broker, tmp_path):
    """The same bounded pulls of a C++ pull consumer: with the right key they bring the messages;
    with a wrong secret, on a topic the account has no SUB on (DENY by defaultTopicPerm), and for a
    group DENY in its groupPerms, every pull fails, nothing is received, and the client's log shows
    every pull that reached the broker answered NO_PERMISSION (16) naming what was missing."""
    namesrv = acl_broker.namesrv_address
    bodies = {f"cpp-pull-{i}" for i in range(4)}
    with SyncProducer("PID_USER", namesrv, credentials=USER) as producer:
        for body in sorted(bodies):
            assert producer.send("TopicA", body.encode()).status.name == "SEND_OK"
    assert _max_offset(acl_broker.store, "TopicB") >= 1  # the refused topic has messages to pull

    # up to 10 pulls a queue: the first ones may fail unanswered while the client connects
    pulls, got, log = _cpp_pull(tmp_path, namesrv, "pull-right", "CID_CPP_PULL", "TopicA", USER, 10)
    assert bodies <= got, (got, pulls, log[-4000:])
    assert _answers(log, _CPP_PULL_ANSWER) == [], log[-4000:]
    assert {p["status"] for p in pulls} <= {"FOUND", "NO_NEW_MSG", "BROKER_TIMEOUT"}, pulls

    for name, group, topic, credentials, named in (
            ("pull-wrong", "CID_CPP_PULL", "TopicA", ("RocketMQ", "nope"),
             "check signature failed for accessKey=RocketMQ"),
            ("pull-no-sub", "CID_CPP_PULL", "TopicB", USER,
             "topic:TopicB is DENY for accessKey=RocketMQ (by its defaultTopicPerm): no SUB permission"),
            ("pull-group-denied", "CID_DENIED", "TopicA", USER,
             "group:CID_DENIED is DENY for accessKey=RocketMQ (by its groupPerms): no SUB permission")):
        pulls, got, log = _cpp_pull(tmp_path, namesrv, name, group, topic, credentials, 3)
        assert got == set(), (name, got)
        # every queue pulled 3 times, every pull failed (BROKER_TIMEOUT: the C API's status for a
        # pull that threw or got no answer)
        assert len(pulls) == 3 * 4 and all(p["status"] == "BROKER_TIMEOUT" for p in pulls), (name, pulls)
        attempts = _cpp_failed_attempts(log, "pull")
        assert len(attempts) == len(pulls), (name, attempts, pulls)
        _assert_all_refused(attempts, named, name, unanswered=None)


@cpp
def test_a_cpp_push_consumer_with_a_wrong_secret_gets_nothing_while_one_with_the_key_gets_every_message(
        acl_broker, tmp_path):
    """Two C++ push consumers of one group on TopicA started together, one with a wrong secret:
    the one with the key receives every message sent before; the other receives nothing over the
    same time and 3 s more: the broker refuses its heartbeats, its rebalance's consumer list (so
    it takes no queue) and its unregistering, answering NO_PERMISSION naming the signature."""
    from test_broker_cpp import ClientProc

    namesrv = acl_broker.namesrv_address
    bodies = {f"cpp-push-{i}" for i in range(4)}
    with SyncProducer("PID_USER", namesrv, credentials=USER) as producer:
        for body in sorted(bodies):
            assert producer.send("TopicA", body.encode()).status.name == "SEND_OK"
    # one group: all that differs is the secret (were the wrong one let in, it would take queues)
    wrong = ClientProc(str(tmp_path), "push-wrong", "push", group="CID_CPP_PUSH", namesrv=namesrv,
                       topic="TopicA", credentials=["RocketMQ", "nope"])
    right = ClientProc(str(tmp_path), "push-right", "push", group="CID_CPP_PUSH", namesrv=namesrv,
                       topic="TopicA", credentials=list(USER))
    try:
        right.wait_for(lambda c: bodies <= {m["body"] for m in c.messages()}, 120, "every message sent")
        wrong.wait_for(lambda c: c.events("started"), 60, "its start")
        # the refused consumer had as long as the other took, and 3 s more, to receive anything
        time.sleep(3.0)
        wrong.stop(60)
        right.stop(60)
        assert wrong.messages() == [], wrong.messages()
        # the logs are written out once the children ended: the wrong one's consumer list (its
        # rebalance) and its unregistering at the end were answered, and refused naming why (an
        # error of the client's own, such as a request made before its connection was up, has
        # code -1: no answer); the other's consumer list was never refused
        log = wrong.client_log()
        answers = [(code, remark) for code, remark in
                   _answers(log, _CPP_REBALANCE_ANSWER) + _answers(log, _CPP_UNREGISTER_ANSWER) if code != -1]
        assert answers and all(code == ResponseCode.NO_PERMISSION and
                               "check signature failed for accessKey=RocketMQ" in remark
                               for code, remark in answers), (answers, log[-3000:])
        assert [a for a in _answers(right.client_log(), _CPP_REBALANCE_ANSWER) if a[0] != -1] == []
    finally:
        wrong.kill()
        right.kill()


@cpp
def test_the_cpp_producer_sends_in_plain_to_a_permissive_tls_broker(tmp_path):
    """tls_server_mode=permissive (docs/security.md): the C++ client, which has no TLS, sends with
    its key in plain to the broker's port and finds its route at the embedded NameServer in plain,
    while both ports answer TLS clients too (the ports really are TLS ones)."""
    from helpers_tls import exchange, make_pki

    from mqstore.tls import client_context

    pki = make_pki(tmp_path / "pki")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    tls = {"tls_server_mode": "permissive", "tls_server_cert_path": pki.server_cert,
           "tls_server_key_path": pki.server_key}
    with running_broker(str(tmp_path / "store"), acl_enable=True, acl_file=str(acl_file), front_processes=1,
                        **tls) as broker:
        with SyncProducer("PID_ADMIN", broker.namesrv_address, credentials=ADMIN) as admin:
            assert admin.send("TopicA", b"seed").status.name == "SEND_OK"

        def over_tls(address: str, cmd: RemotingCommand) -> RemotingCommand:
            host, _, port = address.rpartition(":")
            ctx = client_context(trust_cert_path=pki.ca)
            with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10),
                                 server_hostname=host) as sock:
                assert sock.version() in ("TLSv1.2", "TLSv1.3")
                answer = exchange(sock, cmd)
            assert answer is not None, f"{address} closed the TLS connection"
            return answer

        route = over_tls(broker.namesrv_address, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                  ext_fields={"topic": "TopicA"}))
        assert route.code == ResponseCode.SUCCESS, route.remark
        before = _max_offset(broker.store, "TopicA")

        sent, log = _cpp_producer(tmp_path, broker.namesrv_address, "plain", USER, "TopicA", retry_first_s=30)
        assert len(sent) == 3 and all("error" not in e and e["status"] == 0 for e in sent), (sent, log[-3000:])
        assert _max_offset(broker.store, "TopicA") == before + 3
        stored: set[str] = set()
        for q in range(8):
            got = broker.store.read_messages("TopicA", q, 0, 100)
            if got.ok:
                stored |= {body.decode() for body in got.bodies()}
        assert {"plain-0", "plain-1", "plain-2"} <= stored
        # a TLS client reads the offsets the plain one moved
        total = 0
        for q in range(8):
            got = over_tls(broker.address, _signed(RequestCode.GET_MAX_OFFSET, {"topic": "TopicA", "queueId": str(q)},
                                                   USER, opaque=q + 1))
            assert got.code == ResponseCode.SUCCESS, got.remark
            total += int(got.ext_fields["offset"])
        assert total == before + 3


def test_the_embedded_namesrv_takes_registrations_from_the_acls_admin_accounts_only(acl_broker):
    """The broker registers itself (its routes work above: every client found it); another
    broker must sign with an account of the ACL that is admin."""
    import json

    fields = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:1", "brokerName": "broker-x",
              "brokerId": "0", "haServerAddr": "", "compressed": "false", "bodyCrc32": "0"}
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {}, "dataVersion": {
        "timestamp": 0, "counter": 0}}, "filterServerList": []}).encode()
    namesrv = acl_broker.namesrv_address
    for who in (None, USER):
        got = _request(namesrv, _signed(RequestCode.REGISTER_BROKER, fields, who, body))
        assert got.code == ResponseCode.NO_PERMISSION, (who, got.remark)
    got = _request(namesrv, _signed(RequestCode.REGISTER_BROKER, fields, ADMIN, body))
    assert got.code == ResponseCode.SUCCESS, got.remark


def test_the_request_tables_acl_column_agrees_with_the_validator():
    """The table says which codes are admin; the ACL's own list (every code a plain client never
    sends) says the same for every code the broker serves."""
    from mqstore.acl.validator import needs_admin
    from mqstore.broker.table import REQUESTS, Access, Server

    for code, spec in REQUESTS.items():
        if spec.server in (Server.FRONT, Server.CONTROLLER):
            assert (spec.access is Access.ADMIN) == needs_admin(code), spec.name
