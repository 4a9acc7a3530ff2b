"""The broker front's send fast path (mqstore.broker._front) against the general path it stands in
for (send_fields, check_header, field, int_field in mqstore/broker): whatever ``parse_send``
takes, the general path takes too and reads the same values from; a request it declines goes
the general way, which serves it or names what is wrong."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.broker._front import parse_send, send_ok_response
from mqstore.remoting._remoting import JSON, ROCKETMQ, RemotingCommand, decode_frame
from mqstore.broker.codes import SEND_V2_FIELDS, send_fields
from mqstore.broker.requests import BadField, check_header, field, int_field
from mqstore.protocol import RequestCode, ResponseCode

LONG_NAMES = ["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
              "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch"]
SHORT = {v: k for k, v in SEND_V2_FIELDS.items()}

numbers = st.one_of(st.integers(0, 10**9 - 1).map(str), st.integers(-2**63, 2**64).map(str),
                    st.sampled_from(["", "+1", "-0", " 1", "1 ", "007", "1" * 10, "9" * 19, "١٢", "0x1", "1e3"]),
                    st.text(max_size=6))
values = {"producerGroup": st.sampled_from(["PG", ""]), "topic": st.sampled_from(["T", "Topic_1", ""]),
          "defaultTopic": st.just("TBW102"), "properties": st.sampled_from(["", "TAGS\x01a\x02", "WAIT\x01false\x02"]),
          "unitMode": st.sampled_from(["false", "true"]),
          "batch": st.sampled_from(["false", "true", "1", "False", ""])}


@st.composite
def send_requests(draw):
    code = draw(st.sampled_from([RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2]))
    fields = {}
    for name in LONG_NAMES:
        if draw(st.booleans()) or (name in ("producerGroup", "topic", "queueId") and draw(st.booleans())):
            fields[name] = draw(values.get(name, numbers))
    if code == RequestCode.SEND_MESSAGE_V2:
        fields = {SHORT[k]: v for k, v in fields.items()}
    return code, fields


def general(code: int, ext: dict[str, str]) -> tuple | None:
    """What the general path reads from a send header, or None when it refuses it or takes it as a batch."""
    f = send_fields(code, ext)
    try:
        check_header(RequestCode.SEND_MESSAGE, f)
        topic = field(f, "topic")
        field(f, "producerGroup")
        if f.get("batch", "false").lower() in ("true", "1"):
            return None
        return (topic, int_field(f, "queueId"), int_field(f, "sysFlag", 0), int_field(f, "bornTimestamp", 0),
                int_field(f, "flag", 0), int_field(f, "reconsumeTimes", 0), f.get("properties"))
    except BadField:
        return None


@settings(max_examples=3000, deadline=None)
@given(send_requests())
def test_what_the_fast_path_takes_the_general_path_reads_alike(request):
    code, ext = request
    fast = parse_send(code, ext)
    if fast is not None:
        assert fast == general(code, ext)


def test_well_formed_sends_take_the_fast_path():
    v1 = {"producerGroup": "PG", "topic": "T", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4", "queueId": "3",
          "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "7", "properties": "TAGS\x01a\x02",
          "reconsumeTimes": "2", "unitMode": "false", "maxReconsumeTimes": "16", "batch": "false"}
    want = ("T", 3, 0, 1700000000000, 7, 2, "TAGS\x01a\x02")
    assert parse_send(RequestCode.SEND_MESSAGE, v1) == want
    assert parse_send(RequestCode.SEND_MESSAGE_V2, {SHORT[k]: v for k, v in v1.items()}) == want
    assert parse_send(RequestCode.SEND_MESSAGE, {"producerGroup": "PG", "topic": "T", "queueId": "0"}) == \
        ("T", 0, 0, 0, 0, 0, None)
    # the general path's business: batches, names of the other code, signs, 10 digits, a missing field
    assert parse_send(RequestCode.SEND_BATCH_MESSAGE, {SHORT[k]: v for k, v in v1.items()}) is None
    assert parse_send(RequestCode.SEND_MESSAGE_V2, v1) is None
    for name, value in (("batch", "true"), ("queueId", "-1"), ("flag", "2147483647"), ("sysFlag", "+0"),
                        ("maxReconsumeTimes", "x")):
        assert parse_send(RequestCode.SEND_MESSAGE, {**v1, name: value}) is None, name
    for name in ("producerGroup", "topic", "queueId"):
        assert parse_send(RequestCode.SEND_MESSAGE, {k: v for k, v in v1.items() if k != name}) is None, name


def test_the_send_response_in_the_requests_serialization():
    for serialize in (JSON, ROCKETMQ):
        request = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=77, serialize_type=serialize)
        got = decode_frame(send_ok_response(request, ResponseCode.SUCCESS, "7F0000010000ABCD", 2, 41))
        assert (got.code, got.opaque, got.flag, got.serialize_type, got.language) == (0, 77, 1, serialize, "JAVA")
        assert got.ext_fields == {"msgId": "7F0000010000ABCD", "queueId": "2", "queueOffset": "41",
                                  "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


@settings(max_examples=500, deadline=None)
@given(serialize=st.sampled_from([JSON, ROCKETMQ]), code=st.sampled_from([0, 10, 11, 12]),
       msg_id=st.one_of(st.text("0123456789ABCDEF,", max_size=70), st.text(max_size=8)),
       queue_id=st.integers(0, 2**31 - 1), offset=st.integers(-2**63, 2**63 - 1), opaque=st.integers(-2**31, 2**31 - 1))
def test_the_send_response_is_the_bytes_remoting_command_makes(serialize, code, msg_id, queue_id, offset, opaque):
    request = RemotingCommand(RequestCode.SEND_MESSAGE, opaque=opaque, serialize_type=serialize)
    want = RemotingCommand(code, language="JAVA", version=407, opaque=opaque, flag=1, serialize_type=serialize,
                           ext_fields={"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(offset),
                                       "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}).encode()
    assert send_ok_response(request, code, msg_id, queue_id, offset) == want
