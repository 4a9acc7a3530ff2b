"""The broker front's codes (docs/rocketmq-remoting-spec.md §2, §3.1): the numbers RocketMQ 4.9.7
uses, the short names of SEND_MESSAGE_V2, and the answer a send gets for every put status."""

from __future__ import annotations

import pytest

from mqstore.broker.codes import SEND_V2_FIELDS, RequestCode, ResponseCode, put_response, send_fields
from mqstore.status import PutMessageStatus as S


def test_the_codes_are_rocketmqs():
    assert (RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT,
            RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) == \
        (10, 11, 34, 105, 310, 320)
    assert (ResponseCode.SYSTEM_BUSY, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.FLUSH_DISK_TIMEOUT,
            ResponseCode.TOPIC_NOT_EXIST, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
            ResponseCode.NO_MESSAGE, ResponseCode.FLOW_CONTROL) == (2, 3, 10, 17, 19, 21, 208, 215)


def test_v2_send_headers_are_expanded_to_the_long_names():
    short = {"a": "pg", "b": "T", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000", "h": "0",
             "i": "TAGS\x01x\x02", "j": "0", "k": "false", "l": "16", "m": "false", "n": "broker-a", "zz": "kept"}
    long = send_fields(RequestCode.SEND_MESSAGE_V2, short)
    assert long["producerGroup"] == "pg" and long["topic"] == "T" and long["queueId"] == "1"
    assert long["batch"] == "false" and long["brokerName"] == "broker-a" and long["zz"] == "kept"
    assert set(SEND_V2_FIELDS) == set("abcdefghijklmn")
    assert send_fields(RequestCode.SEND_BATCH_MESSAGE, short) == long
    assert send_fields(RequestCode.SEND_MESSAGE, {"topic": "T"}) == {"topic": "T"}


@pytest.mark.parametrize("status, code, stored", [
    (S.PUT_OK, 0, True), (S.FLUSH_DISK_TIMEOUT, 10, True), (S.FLUSH_SLAVE_TIMEOUT, 12, True),
    (S.SLAVE_NOT_AVAILABLE, 11, True), (S.CREATE_MAPEDFILE_FAILED, 1, False), (S.MESSAGE_ILLEGAL, 13, False),
    (S.PROPERTIES_SIZE_EXCEEDED, 13, False), (S.SERVICE_NOT_AVAILABLE, 14, False), (S.OS_PAGECACHE_BUSY, 2, False),
    (S.UNKNOWN_ERROR, 1, False), (S.LMQ_CONSUME_QUEUE_NUM_EXCEEDED, 1, False),
])
def test_every_put_status_has_an_answer(status, code, stored):
    got, remark = put_response(status)
    assert got == code and status.is_stored is stored
    assert (remark is None) is stored, "a stored message is answered without a remark, a refused one with its cause"


def test_the_remark_names_the_cause():
    code, remark = put_response(S.MESSAGE_ILLEGAL, "topic 'a b' has a character not allowed", max_message_size=1024)
    assert code == ResponseCode.MESSAGE_ILLEGAL
    assert "msg body length limit 1024B" in remark and remark.endswith("(topic 'a b' has a character not allowed)")
    assert put_response(S.FLUSH_DISK_TIMEOUT, "the flush failed: Input/output error (errno 5)") == \
        (ResponseCode.FLUSH_DISK_TIMEOUT, "the flush failed: Input/output error (errno 5)")
    assert "[PC_SYNCHRONIZED]broker busy" in put_response(S.OS_PAGECACHE_BUSY)[1]
    assert "the broker's disk is full [0.97]" in put_response(S.SERVICE_NOT_AVAILABLE, disk_util="0.97")[1]
