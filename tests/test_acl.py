"""RocketMQ 4.9.7's plain ACL (mqstore.acl): plain_acl.yml, the remote address patterns, the
permission each request code needs, check()'s order, the signature of the Java and the real C++
client (its compiled kernel against its Python twin), and the reload on change."""

from __future__ import annotations

import base64
import json
import logging
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from helpers_acl import RecordingServer
from hypothesis import given
from hypothesis import strategies as st

from mqstore.acl import _acl
from mqstore.acl import (ADMIN_CODES_4_9_7, CLIENT_CODES, DENY, PUB, SUB, AclConfigError, AclHolder, PlainAcl,
                         SessionCredentials, as_credentials, check, load_acl, needs_admin, offset_group,
                         offset_refusal, parse_acl, parse_perm, remote_address, resources)
from mqstore.acl import signature as twin
from mqstore.acl.address import AnyAddress, NoAddress, OneAddress, RangeAddress, SomeAddresses, normalize_ip
from mqstore.acl.plain import check_permission

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: RocketMQ 4.9.7's distribution/conf/plain_acl.yml
DISTRIBUTION_YML = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""

#: every RequestCode of 4.9.7 (RequestCode.java)
ALL_CODES_4_9_7 = {
    10: "SEND_MESSAGE", 11: "PULL_MESSAGE", 12: "QUERY_MESSAGE", 13: "QUERY_BROKER_OFFSET",
    14: "QUERY_CONSUMER_OFFSET", 15: "UPDATE_CONSUMER_OFFSET", 17: "UPDATE_AND_CREATE_TOPIC",
    21: "GET_ALL_TOPIC_CONFIG", 22: "GET_TOPIC_CONFIG_LIST", 23: "GET_TOPIC_NAME_LIST", 25: "UPDATE_BROKER_CONFIG",
    26: "GET_BROKER_CONFIG", 27: "TRIGGER_DELETE_FILES", 28: "GET_BROKER_RUNTIME_INFO",
    29: "SEARCH_OFFSET_BY_TIMESTAMP", 30: "GET_MAX_OFFSET", 31: "GET_MIN_OFFSET", 32: "GET_EARLIEST_MSG_STORETIME",
    33: "VIEW_MESSAGE_BY_ID", 34: "HEART_BEAT", 35: "UNREGISTER_CLIENT", 36: "CONSUMER_SEND_MSG_BACK",
    37: "END_TRANSACTION", 38: "GET_CONSUMER_LIST_BY_GROUP", 39: "CHECK_TRANSACTION_STATE",
    40: "NOTIFY_CONSUMER_IDS_CHANGED", 41: "LOCK_BATCH_MQ", 42: "UNLOCK_BATCH_MQ", 43: "GET_ALL_CONSUMER_OFFSET",
    45: "GET_ALL_DELAY_OFFSET", 46: "CHECK_CLIENT_CONFIG", 50: "UPDATE_AND_CREATE_ACL_CONFIG",
    51: "DELETE_ACL_CONFIG", 52: "GET_BROKER_CLUSTER_ACL_INFO", 53: "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG",
    54: "GET_BROKER_CLUSTER_ACL_CONFIG", 100: "PUT_KV_CONFIG", 101: "GET_KV_CONFIG", 102: "DELETE_KV_CONFIG",
    103: "REGISTER_BROKER", 104: "UNREGISTER_BROKER", 105: "GET_ROUTEINFO_BY_TOPIC", 106: "GET_BROKER_CLUSTER_INFO",
    200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", 201: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
    202: "GET_TOPIC_STATS_INFO", 203: "GET_CONSUMER_CONNECTION_LIST", 204: "GET_PRODUCER_CONNECTION_LIST",
    205: "WIPE_WRITE_PERM_OF_BROKER", 206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER", 207: "DELETE_SUBSCRIPTIONGROUP",
    208: "GET_CONSUME_STATS", 209: "SUSPEND_CONSUMER", 210: "RESUME_CONSUMER",
    211: "RESET_CONSUMER_OFFSET_IN_CONSUMER", 212: "RESET_CONSUMER_OFFSET_IN_BROKER",
    213: "ADJUST_CONSUMER_THREAD_POOL", 214: "WHO_CONSUME_THE_MESSAGE", 215: "DELETE_TOPIC_IN_BROKER",
    216: "DELETE_TOPIC_IN_NAMESRV", 219: "GET_KVLIST_BY_NAMESPACE", 220: "RESET_CONSUMER_CLIENT_OFFSET",
    221: "GET_CONSUMER_STATUS_FROM_CLIENT", 222: "INVOKE_BROKER_TO_RESET_OFFSET",
    223: "INVOKE_BROKER_TO_GET_CONSUMER_STATUS", 224: "GET_TOPICS_BY_CLUSTER", 300: "QUERY_TOPIC_CONSUME_BY_WHO",
    301: "REGISTER_FILTER_SERVER", 302: "REGISTER_MESSAGE_FILTER_CLASS", 303: "QUERY_CONSUME_TIME_SPAN",
    304: "GET_SYSTEM_TOPIC_LIST_FROM_NS", 305: "GET_SYSTEM_TOPIC_LIST_FROM_BROKER", 306: "CLEAN_EXPIRED_CONSUMEQUEUE",
    307: "GET_CONSUMER_RUNNING_INFO", 308: "QUERY_CORRECTION_OFFSET", 309: "CONSUME_MESSAGE_DIRECTLY",
    310: "SEND_MESSAGE_V2", 311: "GET_UNIT_TOPIC_LIST", 312: "GET_HAS_UNIT_SUB_TOPIC_LIST",
    313: "GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST", 314: "CLONE_GROUP_OFFSET", 315: "VIEW_BROKER_STATS_DATA",
    316: "CLEAN_UNUSED_TOPIC", 317: "GET_BROKER_CONSUME_STATS", 318: "UPDATE_NAMESRV_CONFIG",
    319: "GET_NAMESRV_CONFIG", 320: "SEND_BATCH_MESSAGE", 321: "QUERY_CONSUME_QUEUE", 322: "QUERY_DATA_VERSION",
    323: "RESUME_CHECK_HALF_MESSAGE", 324: "SEND_REPLY_MESSAGE", 325: "SEND_REPLY_MESSAGE_V2",
    326: "PUSH_REPLY_MESSAGE_TO_CLIENT", 327: "ADD_WRITE_PERM_OF_BROKER", 328: "GET_ALL_PRODUCER_INFO",
    329: "DELETE_EXPIRED_COMMITLOG",
}


def write(path, text: str) -> str:
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(text))
    return str(path)


@pytest.fixture
def acl() -> PlainAcl:
    import yaml
    return parse_acl(yaml.safe_load(DISTRIBUTION_YML), "conf/plain_acl.yml")


def signed(fields: dict[str, str], body: bytes | None = None, ak: str = "RocketMQ", sk: str = "12345678"
           ) -> dict[str, str]:
    return twin.sign_fields(dict(fields), body, ak, sk)


# == plain_acl.yml ===================================================================================

def test_the_distribution_file_loads_as_rocketmq_reads_it(tmp_path):
    acl = load_acl(write(tmp_path / "plain_acl.yml", DISTRIBUTION_YML))
    assert [str(s) for s in acl.global_white] == ["10.10.103.*", "192.168.0.*"]
    a = acl.accounts["RocketMQ"]
    assert a.secret_key == "12345678"  # YAML reads 12345678 as a number; RocketMQ's fastjson makes it text
    assert not a.admin and a.default_topic_perm == DENY and a.default_group_perm == SUB
    assert isinstance(a.white_remote_address, NoAddress)
    assert a.perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB,
                       "%RETRY%groupA": DENY, "%RETRY%groupB": PUB | SUB, "%RETRY%groupC": SUB}
    b = acl.accounts["rocketmq2"]
    assert b.admin and not b.has_perms and b.default_topic_perm == DENY  # absent defaults are DENY
    assert isinstance(b.white_remote_address, RangeAddress) and b.white_remote_address.matches("192.168.1.9")
    assert "12345678" not in repr(a)


def test_an_empty_file_has_no_accounts(tmp_path):
    acl = load_acl(write(tmp_path / "plain_acl.yml", "# nothing yet\n"))
    assert acl.accounts == {} and acl.global_white == ()
    assert "no acl config for accessKey=RocketMQ" in check(acl, 310, signed({"b": "T"}), None, "10.0.0.1")


@pytest.mark.parametrize("text, problem", [
    ("accounts: [\n", "is not valid YAML"),
    ("- a\n- b\n", "must be a mapping"),
    ("accounts:\n  - secretKey: 12345678\n", "accounts[0]: accessKey is missing"),
    ("accounts:\n  - accessKey: abcdefg\n", "accounts[0] (accessKey 'abcdefg'): secretKey is missing"),
    ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "accessKey must be longer than 6"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 123456\n", "secretKey must be longer than 6"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 1234567\n    defaultTopicPerm: PUBSUB\n",
     "defaultTopicPerm: 'PUBSUB' is not a permission"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 1234567\n    topicPerms:\n      - topicA=READ\n",
     "topicPerms[0] 'topicA=READ': 'READ' is not a permission"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 1234567\n    groupPerms:\n      - groupA\n",
     "groupPerms[0] must be 'name=PERM'"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 1234567\n    topicPerms: topicA=PUB\n",
     "topicPerms must be a list"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 1234567\n    admin: maybe\n", "admin must be true or false"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: 1234567\n    whiteRemoteAddress: 10.1.*.5\n",
     "whiteRemoteAddress: '10.1.*.5': the parts after a range must be '*'"),
    ("globalWhiteRemoteAddresses:\n  - 300.1.1.1\n", "globalWhiteRemoteAddresses[0]: '300.1.1.1' is not an IPv4"),
    ("globalWhiteRemoteAddresses: 10.1.1.1\n", "globalWhiteRemoteAddresses must be a list"),
    ("accounts:\n  accessKey: abcdefg\n", "accounts must be a list"),
    ("accounts:\n  - accessKey: [1, 2]\n", "accessKey must be a string"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_entry(tmp_path, text, problem):
    path = write(tmp_path / "plain_acl.yml", text)
    with pytest.raises(AclConfigError) as info:
        load_acl(path)
    assert str(info.value).startswith(path + ": ")
    assert problem in str(info.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(AclConfigError, match="plain_acl.yml: no such file"):
        load_acl(tmp_path / "plain_acl.yml")


def test_a_repeated_access_key_keeps_the_first_account_as_rocketmq_does(tmp_path, caplog):
    path = write(tmp_path / "plain_acl.yml", """\
        accounts:
          - {accessKey: abcdefg, secretKey: first-secret, admin: true}
          - {accessKey: abcdefg, secretKey: second-secret, futureKey: 1}
        """)
    with caplog.at_level(logging.WARNING, "mqstore.acl"):
        acl = load_acl(path)
    assert acl.accounts["abcdefg"].secret_key == "first-secret"
    assert "repeated" in caplog.text and "futureKey" in caplog.text


def test_permission_words_and_bits():
    assert [parse_perm(w) for w in ("PUB", "SUB", " PUB|SUB ", "SUB|PUB", "DENY")] == [PUB, SUB, PUB | SUB,
                                                                                        PUB | SUB, DENY]
    with pytest.raises(ValueError):
        parse_perm("PUB | SUB")
    assert check_permission(PUB, PUB | SUB) and check_permission(SUB, SUB) and not check_permission(PUB, SUB)
    assert not check_permission(PUB, DENY | PUB) and check_permission(2, SUB) and not check_permission(2, DENY)


# == remote addresses ================================================================================

@pytest.mark.parametrize("pattern, kind, yes, no", [
    ("", NoAddress, [], ["10.0.0.1"]),
    ("*", AnyAddress, ["10.0.0.1", "::1"], []),
    ("*.*.*.*", AnyAddress, ["1.2.3.4"], []),
    ("*:*:*:*:*:*:*:*", AnyAddress, ["::1"], []),
    ("192.168.0.1", OneAddress, ["192.168.0.1", "::ffff:192.168.0.1"], ["192.168.0.2", "not an ip"]),
    ("::1", OneAddress, ["0:0:0:0:0:0:0:1", "[::1]"], ["127.0.0.1"]),
    ("192.168.0.{1,2}", SomeAddresses, ["192.168.0.1", "192.168.0.2"], ["192.168.0.3"]),
    ("192.168.0.1,10.0.0.1", SomeAddresses, ["10.0.0.1"], ["10.0.0.2"]),
    ("1050::5:600:300c:{1,a}", SomeAddresses, ["1050:0:0:0:5:600:300c:a"], ["1050::5:600:300c:b"]),
    ("192.168.*.*", RangeAddress, ["192.168.9.9", "192.168.0.0"], ["192.169.0.1", "::1"]),
    ("10.*.*.*", RangeAddress, ["10.255.1.2"], ["11.0.0.1"]),
    ("192.168.0.*", RangeAddress, ["192.168.0.255"], ["192.168.1.1"]),
    ("192.168.0.1-10", RangeAddress, ["192.168.0.1", "192.168.0.10"], ["192.168.0.11", "192.168.0.0"]),
    ("192.168.1-10.*", RangeAddress, ["192.168.10.200"], ["192.168.11.1"]),
    ("1050::5:600:300c:*", RangeAddress, ["1050:0:0:0:5:600:300c:ffff"], ["1050::5:600:300d:1"]),
    ("1050::5:600:300c:1-ff", RangeAddress, ["1050::5:600:300c:ff"], ["1050::5:600:300c:100"]),
    ("1050::5:600:1-ff:*", RangeAddress, ["1050::5:600:ff:1234"], ["1050::5:600:100:1"]),
])
def test_address_patterns_match_as_rocketmq_strategies(pattern, kind, yes, no):
    strategy = remote_address(pattern)
    assert isinstance(strategy, kind)
    assert [strategy.matches(ip) for ip in yes] == [True] * len(yes)
    assert [strategy.matches(ip) for ip in no] == [False] * len(no)


@pytest.mark.parametrize("pattern", ["1.2.3", "1.2.3.256", "1.2.*.5", "*.1.2.3", "1.2.3.9-1", "1.2.3.{1,x}",
                                     "1.2.{1,2}.3", "1050::5:*:1", "1050::5:600:300c:1-10000", "host.example"])
def test_a_bad_address_pattern_is_named(pattern):
    with pytest.raises(ValueError, match="'"):
        remote_address(pattern)


def test_remote_ips_are_normalized():
    assert str(normalize_ip("::ffff:10.0.0.1")) == "10.0.0.1"
    assert str(normalize_ip("[fe80::1%eth0]")) == "fe80::1"
    assert normalize_ip("10.0.0.1:9876") is None


# == what each request code needs ====================================================================

def test_admin_is_needed_for_every_code_but_the_clients_own():
    admin = {code for code in ALL_CODES_4_9_7 if needs_admin(code)}
    assert set(ALL_CODES_4_9_7) - admin == set(CLIENT_CODES)
    assert ADMIN_CODES_4_9_7 <= admin
    # the issue's: topic creation and change, consumer lists, runtime info, the config dumps, offset resets
    for code in (17, 25, 26, 215, 200, 207, 203, 28, 21, 43, 45, 201, 212, 222, 220, 307, 314, 106, 206):
        assert needs_admin(code), ALL_CODES_4_9_7[code]
    for code in (10, 310, 320, 11, 14, 15, 38, 34, 35, 36, 41, 42, 30, 31, 29, 32, 33, 12, 37, 105):
        assert not needs_admin(code), ALL_CODES_4_9_7[code]
    assert needs_admin(9999)  # unknown codes too
    assert all(ALL_CODES_4_9_7[c] == n for c, n in CLIENT_CODES.items())


@pytest.mark.parametrize("code, fields, expected", [
    (10, {"topic": "T", "producerGroup": "PG"}, {"T": PUB}),
    (10, {"topic": "%RETRY%CG", "group": "CG"}, {"%RETRY%CG": SUB}),
    (10, {"topic": "%RETRY%CG"}, {"%RETRY%CG": SUB}),  # RocketMQ 5's: the retry topic's own group
    (310, {"a": "PG", "b": "T", "e": "0"}, {"T": PUB}),
    (310, {"a": "CG", "b": "%RETRY%CG"}, {"%RETRY%CG": SUB}),
    (320, {"a": "PG", "b": "T", "m": "true"}, {"T": PUB}),  # checked like V2 (4.9.7 checks nothing)
    (310, {"topic": "T"}, {}),  # a V2 request's topic is "b"
    (36, {"group": "CG", "offset": "1"}, {"%RETRY%CG": SUB}),
    (11, {"topic": "T", "consumerGroup": "CG"}, {"T": SUB, "%RETRY%CG": SUB}),
    (12, {"topic": "T", "key": "k"}, {"T": SUB}),
    (35, {"clientID": "c", "consumerGroup": "CG"}, {"%RETRY%CG": SUB}),
    (35, {"clientID": "c", "producerGroup": "PG", "consumerGroup": ""}, {}),  # the C++ producer's
    (38, {"consumerGroup": "CG"}, {"%RETRY%CG": SUB}),
    (15, {"consumerGroup": "CG", "topic": "T", "queueId": "0", "commitOffset": "5"}, {"%RETRY%CG": SUB, "T": SUB}),
    (14, {"consumerGroup": "CG", "topic": "T"}, {}),
    (30, {"topic": "T", "queueId": "0"}, {}),
    (17, {"topic": "T"}, {}),
])
def test_the_resources_of_each_code(code, fields, expected):
    assert resources(code, fields, None) == expected


def test_heartbeat_resources_come_from_its_body():
    java = json.dumps({"clientID": "c", "producerDataSet": [{"groupName": "PG"}], "consumerDataSet": [
        {"groupName": "CG", "consumeType": "CONSUME_PASSIVELY", "subscriptionDataSet": [
            {"topic": "T1", "subString": "*"}, {"topic": "%RETRY%CG", "subString": "*"}]}]}).encode()
    assert resources(34, {}, java) == {"%RETRY%CG": SUB, "T1": SUB}
    cpp = b'{"clientID":"c","consumerDataSet":[{"groupName":"CG2","consumeType":1}],"producerDataSet":[]}\n'
    assert resources(34, {}, cpp) == {"%RETRY%CG2": SUB}
    assert resources(34, {}, b'{"clientID":"c","producerDataSet":[{"groupName":"PG"}]}') == {}
    with pytest.raises(ValueError, match="HEART_BEAT body"):
        resources(34, {}, b"not json")


# == check(), in PlainAccessValidator.validate's order ===============================================

def test_allowed_by_permission(acl):
    assert check(acl, 310, signed({"a": "PG", "b": "topicB"}, b"x"), b"x", "10.0.0.1") is None
    assert check(acl, 11, signed({"topic": "topicC", "consumerGroup": "groupC"}), None, "10.0.0.1") is None
    assert check(acl, 11, signed({"topic": "topicB", "consumerGroup": "other"}), None, "10.0.0.1") is None


def test_refusals_name_what_is_missing(acl):
    def refusal(code, fields, body=None, ip="10.0.0.1", **kw):
        remark = check(acl, code, signed(fields, body, **kw), body, ip)
        assert remark is not None
        return remark

    assert refusal(310, {"a": "PG", "b": "topicA"}) == \
        "topic:topicA is DENY for accessKey=RocketMQ (by its topicPerms): no PUB permission"
    assert refusal(310, {"a": "PG", "b": "topicC"}) == \
        "no PUB permission for topic:topicC: accessKey=RocketMQ has only SUB (by its topicPerms)"
    assert "topic:other is DENY for accessKey=RocketMQ (by its defaultTopicPerm)" in refusal(310, {"b": "other"})
    assert "group:groupA is DENY" in refusal(11, {"topic": "topicB", "consumerGroup": "groupA"})
    assert "group:groupA is DENY for accessKey=RocketMQ (by its groupPerms): no SUB permission" in \
        refusal(310, {"a": "groupA", "b": "%RETRY%groupA"})
    assert refusal(17, {"topic": "T"}) == "need admin permission for request code 17, but accessKey=RocketMQ is " \
                                          "not admin"
    assert refusal(203, {"consumerGroup": "groupB"}).startswith("need admin permission for request code 203")
    assert refusal(310, {"b": "topicB"}, sk="wrong-secret").startswith("check signature failed for "
                                                                       "accessKey=RocketMQ")
    assert refusal(310, {"b": "topicB"}, ak="nobody12").startswith("no acl config for accessKey=nobody12")
    remark = check(acl, 310, {"b": "topicB"}, None, "10.0.0.1")
    assert remark is not None and remark.startswith("no AccessKey in the request (code 310), and 10.0.0.1 is not "
                                                    "in globalWhiteRemoteAddresses")
    assert "cannot check the permissions" in refusal(34, {}, b"{")


def test_a_tampered_request_fails_the_signature(acl):
    fields = signed({"a": "PG", "b": "topicB"}, b"body")
    assert check(acl, 310, fields, b"body", "10.0.0.1") is None
    assert "check signature failed" in check(acl, 310, fields, b"bodY", "10.0.0.1")
    assert "check signature failed" in check(acl, 310, {**fields, "b": "topicC"}, b"body", "10.0.0.1")
    assert "check signature failed" in check(acl, 310, {**fields, "x": "1"}, b"body", "10.0.0.1")


def test_white_addresses_pass_before_anything_else(acl):
    # the global white list: no AccessKey needed, admin codes too
    assert check(acl, 17, {}, None, "192.168.0.7") is None
    assert check(acl, 17, {}, None, "::ffff:10.10.103.1") is None
    # an account's whiteRemoteAddress: its requests pass without a valid signature
    assert check(acl, 17, {"AccessKey": "rocketmq2", "Signature": "bogus"}, None, "192.168.1.5") is None
    assert "check signature failed" in check(acl, 17, {"AccessKey": "rocketmq2", "Signature": "bogus"}, None,
                                             "192.168.2.5")


def test_admin_accounts(acl):
    # no topicPerms nor groupPerms: every resource
    assert check(acl, 17, signed({"topic": "T"}, ak="rocketmq2"), None, "10.0.0.1") is None
    assert check(acl, 310, signed({"b": "anything"}, ak="rocketmq2"), None, "10.0.0.1") is None
    # with a list, an admin's resources are checked as anyone's (checkPerm)
    import yaml
    listed = parse_acl(yaml.safe_load("""
        accounts:
          - {accessKey: admin-with-list, secretKey: 12345678, admin: true, topicPerms: [T1=SUB]}
    """))
    fields = signed({"b": "T1"}, ak="admin-with-list")
    assert "no PUB permission for topic:T1" in check(listed, 310, fields, None, "10.0.0.1")
    assert check(listed, 17, signed({"topic": "T9"}, ak="admin-with-list"), None, "10.0.0.1") is None


def test_sends_to_the_trace_topic_pass(acl):
    assert check(acl, 310, signed({"a": "PG", "b": "RMQ_SYS_TRACE_TOPIC"}), None, "10.0.0.1") is None


def test_group_resources_use_the_default_group_perm(acl):
    # defaultGroupPerm SUB: any group not listed may pull; a DENY-listed one may not
    assert check(acl, 38, signed({"consumerGroup": "unlisted"}), None, "10.0.0.1") is None
    assert "group:groupA is DENY" in check(acl, 38, signed({"consumerGroup": "groupA"}), None, "10.0.0.1")


# == setting a group's offsets: admin, the group listed, or a live consumer of it (docs/security.md) ==

_UPDATE = {"topic": "topicB", "queueId": "0", "commitOffset": "5"}
_PULL = {"topic": "topicB", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32", "suspendTimeoutMillis": "0",
         "subscription": "*", "subVersion": "0"}


def _nobody(group: str) -> bool:
    return False


@pytest.mark.parametrize("code, fields, group", [
    (15, {"consumerGroup": "CG", **_UPDATE}, "CG"),
    (15, {"consumerGroup": "", **_UPDATE}, None),
    # a pull carrying a commit keeps 4.9.7's rule: no step of mqstore's own
    (11, {"consumerGroup": "CG", **_PULL, "sysFlag": "1", "commitOffset": "7"}, None),
    (11, {"consumerGroup": "CG", **_PULL, "sysFlag": "6", "commitOffset": "7"}, None),
    (14, {"consumerGroup": "CG", "topic": "T", "queueId": "0"}, None),  # a query sets nothing
    (38, {"consumerGroup": "CG"}, None),
])
def test_the_group_whose_offsets_a_request_sets(code, fields, group):
    assert offset_group(code, fields) == group


def test_an_offset_update_by_the_default_group_perm_needs_a_live_consumer_of_the_group(acl):
    """Regression (issue 25, point 8): with defaultGroupPerm SUB, one account could move every
    group's offsets (RocketMQ 4.9.7 lets it). check() keeps 4.9.7's rule; offset_refusal then
    passes an admin, a group listed with SUB (or PUB|SUB), or a client the broker holds as a
    consumer of the group, and refuses anyone else naming the group and why."""
    def update(group: str, ak: str = "RocketMQ", member: Callable[[str], bool] = _nobody) -> str | None:
        fields = signed({"consumerGroup": group, **_UPDATE}, ak=ak)
        return check(acl, 15, fields, None, "10.0.0.1") or offset_refusal(acl, 15, fields, "10.0.0.1", member)

    assert update("groupB") is None and update("groupC") is None  # listed
    refused = update("unlisted")
    assert refused is not None
    assert refused.startswith("setting the offsets of group:unlisted (request code 15) refused: this client is "
                              "not one of unlisted's consumers")
    assert "accessKey=RocketMQ is not admin and does not list unlisted in groupPerms with SUB" in refused
    asked: list[str] = []
    assert update("unlisted", member=lambda g: asked.append(g) or g == "unlisted") is None  # a live consumer
    assert asked == ["unlisted"]
    assert update("unlisted", member=lambda g: g == "other") is not None  # a consumer of another group
    assert "group:groupA is DENY" in (update("groupA", member=lambda g: True) or "")  # DENY stays DENY
    assert update("anything", ak="rocketmq2") is None  # an admin account
    # check() alone is 4.9.7's: SUB on the group by the default is enough
    assert check(acl, 15, signed({"consumerGroup": "unlisted", **_UPDATE}), None, "10.0.0.1") is None


def test_a_pull_that_commits_keeps_the_rule_of_4_9_7(acl):
    """A pull carrying a commit needs SUB on its topic and group, the default included: a C++ push
    consumer whose account has its group by defaultGroupPerm commits with its pulls."""
    for sys_flag in (0x2 | 0x4, 0x1 | 0x2 | 0x4):
        fields = signed({"consumerGroup": "unlisted", **_PULL, "sysFlag": str(sys_flag), "commitOffset": "3"})
        assert check(acl, 11, fields, None, "10.0.0.1") is None
        assert offset_refusal(acl, 11, fields, "10.0.0.1", _nobody) is None
    denied = signed({"consumerGroup": "groupA", **_PULL, "sysFlag": "5", "commitOffset": "3"})
    assert "group:groupA is DENY" in (check(acl, 11, denied, None, "10.0.0.1") or "")


def test_an_admin_with_lists_sets_offsets_by_its_default_group_perm():
    """An admin's default group permission is enough; its DENY is not."""
    import yaml
    listed = parse_acl(yaml.safe_load("""
        accounts:
          - {accessKey: admin-with-list, secretKey: 12345678, admin: true, defaultGroupPerm: SUB,
             topicPerms: [topicB=SUB], groupPerms: [gone=DENY]}
    """))

    def update(group: str) -> str | None:
        fields = signed({"consumerGroup": group, **_UPDATE}, ak="admin-with-list")
        return check(listed, 15, fields, None, "10.0.0.1") or offset_refusal(listed, 15, fields, "10.0.0.1", _nobody)

    assert update("unlisted") is None
    assert "group:gone is DENY" in (update("gone") or "")


def test_white_addresses_still_pass_offset_updates(acl):
    fields = {"consumerGroup": "unlisted", **_UPDATE}
    assert check(acl, 15, fields, None, "192.168.0.7") is None
    assert offset_refusal(acl, 15, fields, "192.168.0.7", _nobody) is None  # globalWhiteRemoteAddresses
    admin_white = signed(fields, ak="rocketmq2")
    assert offset_refusal(acl, 15, admin_white, "192.168.1.9", _nobody) is None  # the account's white address
    anonymous = offset_refusal(acl, 15, fields, "10.0.0.1", _nobody)
    assert anonymous is not None and "the request has no account of the ACL" in anonymous


# == signatures ======================================================================================

def test_the_hmac_sha1_base64_vector():
    # RFC 2202 test case 2: HMAC-SHA1("Jefe", "what do ya want for nothing?")
    expected = base64.b64encode(bytes.fromhex("effcdf6ae5eb2fa2d27416d5f184df9c259a7c79")).decode()
    assert twin.calc_signature(b"what do ya want for nothing?", "Jefe") == expected
    assert _acl.calc_signature(b"what do ya want for nothing?", "Jefe") == expected
    assert _acl.calc_signature(b"what do ya want for nothing?", b"Jefe") == expected


def test_the_content_is_the_sorted_values_then_the_body():
    fields = {"topic": "T", "AccessKey": "ak", "Signature": "s", "_UNIQUE_KEY_QUERY": "true", "a": "1"}
    assert twin.request_content(fields, b"BODY") == b"ak1TBODY"  # AccessKey < a < topic (byte order)
    assert _acl.request_content(fields, b"BODY") == b"ak1TBODY"
    assert twin.request_content(fields, None, with_unique_key_query=True) == b"aktrue1T"  # "_" < "a"
    assert _acl.request_content(fields, None, True) == b"aktrue1T"


def test_keys_sort_in_javas_utf16_order():
    # Java's TreeMap compares UTF-16 code units: a supplementary character (a surrogate pair,
    # 0xD800..) sorts before U+E000..U+FFFF, where Python's code point order puts it after
    fields = {"\ue000": "B", "\U00010000": "A", "z": "C"}
    assert twin.java_sorted(list(fields)) == ["z", "\U00010000", "\ue000"]
    assert twin.request_content(fields, None) == b"CAB" == _acl.request_content(fields, None)


def test_sign_then_match():
    fields = twin.sign_fields({"topic": "T"}, b"b", "ak", "secret", security_token="tok")
    assert fields["AccessKey"] == "ak" and fields["SecurityToken"] == "tok"
    for matches in (twin.signature_matches, _acl.signature_matches):
        assert matches(fields, b"b", "secret")
        assert not matches(fields, b"b", "secreT")
        assert not matches(fields, b"c", "secret")
        assert not matches({k: v for k, v in fields.items() if k != "Signature"}, b"b", "secret")
    # signing again (a retried request) gives the same Signature
    assert twin.sign_fields(dict(fields), b"b", "ak", "secret", security_token="tok") == fields


def test_unique_key_query_is_accepted_signed_or_not():
    base = {"topic": "T", "key": "k", "_UNIQUE_KEY_QUERY": "true"}
    broker_way = twin.sign_fields(dict(base), None, "ak", "secret")  # left out, as a 4.9.7 broker checks
    java_way = dict(base, AccessKey="ak")
    java_way["Signature"] = twin.calc_signature(twin.request_content(java_way, None, with_unique_key_query=True),
                                                "secret")
    for fields in (broker_way, java_way):
        assert twin.signature_matches(fields, None, "secret")
        assert _acl.signature_matches(fields, None, "secret")


def test_credentials():
    c = SessionCredentials("ak", "sk")
    assert as_credentials(("ak", "sk")) == c and as_credentials(None) is None and as_credentials(c) is c
    assert "sk" not in repr(SessionCredentials("ak", "sk", "tok")).replace("'ak'", "")
    with pytest.raises(ValueError, match="secret_key"):
        SessionCredentials("ak", "")
    with pytest.raises(ValueError, match="credentials must be"):
        as_credentials("ak:sk")  # type: ignore[arg-type]


_text = st.text(max_size=12)  # lone surrogates too (written as "?", as Java does)


@given(fields=st.dictionaries(st.one_of(_text, st.sampled_from(["Signature", "_UNIQUE_KEY_QUERY", "AccessKey"])),
                              _text, max_size=8),
       body=st.one_of(st.none(), st.binary(max_size=64)), secret=_text.filter(bool),
       signature=st.one_of(st.none(), _text), with_unique=st.booleans())
def test_kernel_matches_its_twin(fields, body, secret, signature, with_unique):
    assert _acl.request_content(fields, body, with_unique) == twin.request_content(
        fields, body, with_unique_key_query=with_unique)
    data = twin.request_content(fields, body)
    assert _acl.calc_signature(data, secret) == twin.calc_signature(data, secret)
    if signature is not None:
        fields = dict(fields, Signature=signature)
    assert _acl.signature_matches(fields, body, secret) == twin.signature_matches(fields, body, secret)
    signed_fields = twin.sign_fields(dict(fields), body, "ak", secret)
    assert _acl.signature_matches(signed_fields, body, secret) and twin.signature_matches(signed_fields, body, secret)


def test_long_bodies_and_long_secrets():
    body = os.urandom(1 << 20)
    fields = twin.sign_fields({"b": "T"}, body, "ak", "secret")
    assert _acl.signature_matches(fields, body, "secret") and _acl.signature_matches(fields, memoryview(body),
                                                                                      b"secret")
    assert not _acl.signature_matches(fields, body[:-1] + b"!", "secret")
    secret = "s" * 100  # longer than SHA-1's block: hashed first (RFC 2104)
    fields = twin.sign_fields({"b": "T"}, b"x", "ak", secret)
    assert _acl.signature_matches(fields, b"x", secret) and not _acl.signature_matches(fields, b"x", secret[:-1])


@given(data=st.one_of(st.binary(max_size=300), st.integers(0, 5000).map(os.urandom)),
       cuts=st.lists(st.integers(0, 5000), max_size=4))
def test_the_kernels_sha1_is_sha1(data, cuts):
    """mq_sha1.h against hashlib, through the SHA extensions (where this CPU has them) and the
    portable rounds, every length around the 64-byte blocks and the 56-byte padding edge."""
    import hashlib

    expected = hashlib.sha1(data).digest()
    assert _acl.sha1_digest(data) == expected
    assert _acl.sha1_digest(memoryview(data), portable=True) == expected
    # the HMAC feeds the fields' values one by one: a digest over pieces equals one over the whole
    pieces = {f"k{i:02d}": "" for i in range(len(cuts) + 1)}
    text = data.decode("latin-1").encode("ascii", "replace").decode()
    edges = sorted(min(c, len(text)) for c in cuts)
    for i, (lo, hi) in enumerate(zip([0, *edges], [*edges, len(text)])):
        pieces[f"k{i:02d}"] = text[lo:hi]
    assert _acl.request_signature(pieces, b"", "key") == twin.calc_signature(text.encode(), "key")


def test_the_sha1_lengths_around_a_block():
    import hashlib

    for n in range(0, 260):
        data = bytes(range(256))[: n % 256] * (1 + n // 256)
        assert _acl.sha1_digest(data) == _acl.sha1_digest(data, portable=True) == hashlib.sha1(data).digest()
    assert isinstance(_acl.sha1_uses_cpu_extensions(), bool)


# == the real C++ client's signature ==================================================================

CPP_CHILD = r"""
import json, os, sys, time
from rocketmq.client import Message, Producer, PushConsumer
kind, namesrv, group, ak, sk, channel, topic = sys.argv[1:8]
if kind == "producer":
    producer = Producer(group, timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.set_session_credentials(ak, sk, channel)
    producer.start()
    msg = Message(topic)
    msg.set_body("hello acl")
    msg.set_tags("TagA")
    msg.set_keys("key-1")
    result = producer.send_sync(msg)
    print(json.dumps({"status": int(result.status)}), flush=True)
    producer.shutdown()
else:
    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.set_session_credentials(ak, sk, channel)
    consumer.subscribe(topic, lambda msg: None)
    consumer.start()
    time.sleep(2)
    consumer.shutdown()
    print(json.dumps({"status": 0}), flush=True)
os._exit(0)
"""


def _cpp_available() -> str | None:
    if not (platform.machine() == "x86_64" and sys.platform == "linux"):
        return "the rocketmq wheel (librocketmq) exists for x86_64 Linux only"
    try:
        import rocketmq.client  # noqa: F401
    except Exception as exc:  # the wheel missing, or librocketmq not loadable
        return f"the rocketmq wheel cannot be loaded: {exc}"
    return None


@pytest.mark.skipif(_cpp_available() is not None, reason=str(_cpp_available()))
@pytest.mark.parametrize("kind, channel, expected", [("producer", "LOCAL", {105, 10}), ("push", "", {105, 34, 38})])
def test_the_cpp_clients_signatures_verify(tmp_path, kind, channel, expected):
    """The PyPI rocketmq wheel's C++ client (ClientRPCHook: AccessKey, OnsChannel and the header's
    fields sorted, then the body) signs its requests to a recording loopback server (a route
    lookup and a SEND_MESSAGE from the producer; route lookups, HEART_BEAT with its body and
    GET_CONSUMER_LIST_BY_GROUP from the push consumer); each verifies with the secret (the twin,
    the kernel and check()) and fails with another."""
    ak, sk = "cppAccess", "cppSecret123"
    home = tmp_path / "home"
    home.mkdir()
    with RecordingServer() as server:
        proc = subprocess.run([sys.executable, "-c", CPP_CHILD, kind, server.address, "G_ACL", ak, sk, channel,
                               "TopicAcl"], env={**os.environ, "HOME": str(home)}, cwd=tmp_path,
                              capture_output=True, timeout=90)
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
        assert json.loads(proc.stdout.decode().strip().splitlines()[-1])["status"] == 0
        for code in expected:
            server.wait_for(code)
        requests = list(server.requests)
    import yaml
    acl = parse_acl(yaml.safe_load(f"""
        accounts:
          - {{accessKey: {ak}, secretKey: {sk}, defaultTopicPerm: PUB|SUB, defaultGroupPerm: SUB}}
    """))
    wrong = parse_acl({"accounts": [{"accessKey": ak, "secretKey": "not-the-secret", "defaultTopicPerm": "PUB"}]})
    assert {r.code for r in requests} >= expected
    for r in requests:
        assert r.language == "CPP"
        assert r.ext_fields["AccessKey"] == ak and r.ext_fields["OnsChannel"] == channel
        assert twin.signature_matches(r.ext_fields, r.body, sk), (r.code, r.ext_fields)
        assert _acl.signature_matches(r.ext_fields, r.body, sk)
        assert not twin.signature_matches(r.ext_fields, r.body, sk + "x")
        assert not _acl.signature_matches(r.ext_fields, r.body, "cppSecret124")
        assert check(acl, r.code, r.ext_fields, r.body, "127.0.0.1") is None
        assert "check signature failed for accessKey=cppAccess" in check(wrong, r.code, r.ext_fields, r.body,
                                                                         "127.0.0.1")
        if r.body:  # the body is signed
            assert "check signature failed" in check(acl, r.code, r.ext_fields, r.body + b" ", "127.0.0.1")
    if kind == "producer":
        send = next(r for r in requests if r.code == 10)
        assert send.body == b"hello acl" and send.ext_fields["topic"] == "TopicAcl"
        assert resources(10, send.ext_fields) == {"TopicAcl": PUB}
    else:
        heartbeat = next(r for r in requests if r.code == 34)
        assert resources(34, heartbeat.ext_fields, heartbeat.body) == {"%RETRY%G_ACL": SUB, "TopicAcl": SUB}


# == reload on change ================================================================================

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_holder_reloads_when_the_file_changes(tmp_path, caplog):
    path = write(tmp_path / "plain_acl.yml", DISTRIBUTION_YML)
    clock = Clock()
    holder = AclHolder(path, clock=clock)
    first = holder.current()
    assert set(first.accounts) == {"RocketMQ", "rocketmq2"}
    write(path, DISTRIBUTION_YML.replace("rocketmq2", "rocketmq3"))
    assert holder.current() is first  # not looked at before the interval
    clock.now += 0.6
    second = holder.current()
    assert set(second.accounts) == {"RocketMQ", "rocketmq3"} and holder.reloads == 1
    clock.now += 0.6
    assert holder.current() is second  # unchanged: not read again

    # a version that does not load keeps the last good one, logged once
    with caplog.at_level(logging.ERROR, "mqstore.acl"):
        write(path, "accounts: [\n")
        for _ in range(3):
            clock.now += 0.6
            assert holder.current() is second
    assert caplog.text.count("cannot be used") == 1 and "is not valid YAML" in holder.last_error
    # fixed: loaded
    write(path, DISTRIBUTION_YML)
    clock.now += 0.6
    assert set(holder.current().accounts) == {"RocketMQ", "rocketmq2"} and holder.last_error is None
    # removed: the last good one stays, and the error names the file
    os.unlink(path)
    clock.now += 0.6
    assert set(holder.current().accounts) == {"RocketMQ", "rocketmq2"}
    assert "no such file" in holder.last_error


def test_the_holder_refuses_a_bad_file_at_start(tmp_path):
    with pytest.raises(AclConfigError, match="no such file"):
        AclHolder(tmp_path / "plain_acl.yml")
    with pytest.raises(AclConfigError, match="secretKey is missing"):
        AclHolder(write(tmp_path / "bad.yml", "accounts:\n  - accessKey: abcdefg\n"))


def test_the_holder_sees_a_same_size_rewrite(tmp_path):
    path = write(tmp_path / "plain_acl.yml", DISTRIBUTION_YML)
    holder = AclHolder(path, check_interval_s=0)
    write(path, DISTRIBUTION_YML.replace("topicA=DENY", "topicA=SUB "))  # same size
    st0 = os.stat(path)
    os.utime(path, ns=(st0.st_atime_ns, st0.st_mtime_ns + 1_000_000))
    assert holder.current().accounts["RocketMQ"].perms["topicA"] == SUB



@given(fields=st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=6), body=st.binary(max_size=64))
def test_session_credentials_sign_as_the_twin_does(fields, body):
    """SessionCredentials.sign (the kernel's request_signature) against sign_fields (the twin)."""
    from mqstore.acl.signature import SessionCredentials, sign_fields

    mine = SessionCredentials("ak-of-test", "secret-of-test").sign(dict(fields), body)
    assert mine == sign_fields(dict(fields), body, "ak-of-test", "secret-of-test")


def test_send_verdicts_answer_as_check_does(tmp_path):
    """SendVerdicts keeps a send's permission verdict, never its signature: a tampered or
    unsigned send like one that passed is refused as check() refuses it; a reload starts afresh."""
    from mqstore.acl.plain import parse_acl
    from mqstore.acl.signature import sign_fields
    from mqstore.acl.validator import SendVerdicts, check

    def acl(perm: str) -> Any:
        return parse_acl({"accounts": [{"accessKey": "account1", "secretKey": "secret-1", "defaultTopicPerm": perm}]},
                         "plain_acl.yml")

    first, verdicts = acl("PUB"), SendVerdicts()
    fields = {"a": "PG", "b": "T", "e": "0"}
    signed = sign_fields(dict(fields), b"body", "account1", "secret-1")
    for _ in range(3):
        assert verdicts.check(first, 310, dict(signed), b"body", "127.0.0.1") is None
    tampered = {**signed, "e": "1"}
    assert verdicts.check(first, 310, tampered, b"body", "127.0.0.1") == check(first, 310, tampered, b"body",
                                                                               "127.0.0.1") is not None
    assert verdicts.check(first, 310, dict(signed), b"other body", "127.0.0.1") is not None
    assert verdicts.check(first, 310, dict(fields), b"body", "127.0.0.1") is not None  # unsigned
    denied = acl("DENY")
    assert verdicts.check(denied, 310, dict(signed), b"body", "127.0.0.1") is not None
