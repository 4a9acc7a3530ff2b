"""The remoting frame codec (issue 18 item 3, docs/rocketmq-remoting-spec.md §1): the compiled
mqstore.remoting._remoting against its pure-Python twin mqstore.twin.remoting (hypothesis), what the real
C++ client sends, and the frames a broker must refuse."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.remoting import _remoting as R
from mqstore.twin import remoting as T

INT16 = st.integers(-(1 << 15), (1 << 15) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=20)


@st.composite
def headers(draw, rocketmq: bool = False) -> tuple:
    code = draw(INT16 if rocketmq else INT32)
    language = draw(st.sampled_from(T.LANGUAGES) if rocketmq else st.one_of(st.sampled_from(T.LANGUAGES), TEXT))
    version = draw(INT16 if rocketmq else INT32)
    remark = draw(st.one_of(st.none(), TEXT))
    fields = draw(st.dictionaries(TEXT, TEXT, max_size=6))
    return code, language, version, draw(INT32), draw(INT32), remark, fields


def command(h: tuple, body: bytes = b"", serialize_type: int = R.JSON) -> R.RemotingCommand:
    code, language, version, opaque, flag, remark, fields = h
    return R.RemotingCommand(code, language=language, version=version, opaque=opaque, flag=flag, remark=remark,
                             ext_fields=fields, body=body, serialize_type=serialize_type)


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except ValueError:  # FrameError is one
        return "error", None


@settings(max_examples=300)
@given(h=headers(), body=st.binary(max_size=64))
def test_json_frames_match_the_twin_both_ways(h, body):
    frame = command(h, body).encode()
    assert frame == T.encode_frame(h, body, T.JSON)
    got = R.decode_frame(frame)
    assert got.header_tuple() == T.decode_frame(frame)[0] == h
    assert (got.body, got.serialize_type) == (body, R.JSON)


@settings(max_examples=300)
@given(h=headers(rocketmq=True), body=st.binary(max_size=64))
def test_rocketmq_frames_match_the_twin_both_ways(h, body):
    frame = command(h, body).encode(R.ROCKETMQ)
    assert frame == T.encode_frame(h, body, T.ROCKETMQ)
    got = R.decode_frame(frame)
    assert got.header_tuple() == T.decode_frame(frame)[0]
    assert got.body == body and got.serialize_type == R.ROCKETMQ
    # an empty remark, key or value decodes as null (RocketMQSerializable)
    code, language, version, opaque, flag, remark, fields = h
    assert got.remark == (remark or None)
    assert got.ext_fields == {k: v for k, v in fields.items() if k and v}


@settings(max_examples=500)
@given(data=st.binary(max_size=80), serialize_type=st.sampled_from([0, 1, 2]))
def test_arbitrary_header_bytes_decode_or_fail_as_the_twin_does(data, serialize_type):
    assert outcome(R.decode_header, data, serialize_type) == outcome(T.decode_header, data, serialize_type)


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), TEXT,
              st.floats(allow_nan=False, allow_infinity=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=12)


@st.composite
def json_headers(draw) -> bytes:
    """JSON objects with the header's keys (right or wrong types) and others, spaced as any
    JSON writer may space them (the C++ client ends its header with a newline)."""
    keys = draw(st.lists(st.sampled_from(["code", "flag", "opaque", "version", "language", "remark", "extFields",
                                          "serializeTypeCurrentRPC", "other"]), max_size=9))
    obj = {}
    for k in keys:
        if k in ("code", "flag", "opaque", "version"):
            obj[k] = draw(st.one_of(INT32, JSON_VALUES))
        elif k == "extFields":
            obj[k] = draw(st.one_of(st.dictionaries(TEXT, st.one_of(TEXT, st.integers(-(1 << 40), 1 << 40),
                                                                    st.booleans(), st.none(), JSON_VALUES),
                                                    max_size=5), JSON_VALUES))
        else:
            obj[k] = draw(JSON_VALUES)
    sep = draw(st.sampled_from([(",", ":"), (", ", ": "), (",\n", " :\t")]))
    text = json.dumps(obj, separators=sep, ensure_ascii=draw(st.booleans()))
    return (draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", "\n", " \r\n"]))).encode()


@settings(max_examples=500)
@given(header=json_headers())
def test_json_headers_of_any_shape_decode_or_fail_as_the_twin_does(header):
    assert outcome(R.decode_header, header, R.JSON) == outcome(T.decode_header, header, T.JSON)


def test_what_the_cpp_client_sends_decodes():
    """Json::FastWriter output as the C++ client writes it (spec §1.2, E1): compact, a trailing
    newline inside the header length, numbers and strings mixed in extFields, remark ""."""
    header = (b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"x/y+z=",'
              b'"batch":"false","bornTimestamp":"1700000000000","defaultTopic":"TBW102","defaultTopicQueueNums":4,'
              b'"flag":0,"producerGroup":"pg","queueId":3,"reconsumeTimes":"0","sysFlag":0,"topic":"T",'
              b'"unitMode":"false"},"flag":0,"language":"CPP","opaque":12,"remark":"","version":63}\n')
    frame = struct.pack(">ii", 4 + len(header) + 5, len(header)) + header + b"hello"
    cmd = R.decode_frame(frame)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark) == (10, "CPP", 63, 12, 0, "")
    assert cmd.ext_fields["queueId"] == "3" and cmd.ext_fields["defaultTopicQueueNums"] == "4"
    assert cmd.ext_fields["bornTimestamp"] == "1700000000000" and cmd.body == b"hello"
    assert not cmd.is_response and not cmd.is_oneway


def test_a_response_for_the_cpp_client_has_string_ext_fields_and_json_numbers():
    """The C++ client reads code/flag/opaque/version as JSON numbers and extFields values only
    when they are strings (spec §1.2)."""
    cmd = R.RemotingCommand(0, language="JAVA", version=407, opaque=12, flag=1,
                            ext_fields={"msgId": "AB", "queueId": "3", "queueOffset": "7"})
    frame = cmd.encode()
    total, mark = struct.unpack_from(">ii", frame)
    assert total == len(frame) - 4 and mark >> 24 == 0
    obj = json.loads(frame[8:8 + (mark & 0xFFFFFF)])
    assert obj == {"code": 0, "extFields": {"msgId": "AB", "queueId": "3", "queueOffset": "7"}, "flag": 1,
                   "language": "JAVA", "opaque": 12, "serializeTypeCurrentRPC": "JSON", "version": 407}
    assert list(obj) == sorted(obj), "fastjson writes the keys in alphabetical order"
    assert R.decode_frame(frame).is_response


def jframe(header: bytes, serialize_type: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header), serialize_type << 24 | len(header)) + header


@pytest.mark.parametrize("frame, needle", [
    (b"\x00\x00\x00", "at least 8 bytes"),
    (struct.pack(">ii", 0, 0), "frame length 0 is outside 4"),
    (struct.pack(">ii", R.FRAME_MAX + 1, 0), "outside 4 .. 16777216"),
    (struct.pack(">ii", 9, 0), "frame length 9 but 4 bytes follow"),
    (struct.pack(">ii", 4, 5), "header length 5 runs past the frame"),
    (jframe(b"{}", 2), "unknown header serialization type 2"),
    (jframe(b"{]"), "the JSON header does not parse"),
    (jframe(b'{"code":1}'), None),
    (jframe(b'{"code":2147483648}'), "code must be a 32-bit integer"),
    (jframe(b'{"code":1.0}'), "code must be a 32-bit integer"),
    (jframe(b'{"code":1} x'), "bytes after the header object"),
    (jframe(b'{"remark":"\\ud800"}'), "lone surrogate"),
    (jframe(b'{"remark":"a\x01"}'), "control character"),
    (jframe(b'{"extFields":{"a":[]}}'), "extFields value of 'a' must be a string"),
    (jframe(bytes(20), 1), "shorter than its 21-byte fixed part"),
])
def test_bad_frames_are_refused_naming_the_cause(frame, needle):
    if needle is None:
        assert R.decode_frame(frame).code == 1
        return
    with pytest.raises(R.FrameError, match=needle.replace("(", r"\(").replace("+", r"\+")):
        R.decode_frame(frame)


def test_nesting_is_bounded():
    deep = b'{"other":' + b"[" * 40 + b"]" * 40 + b"}"
    with pytest.raises(R.FrameError, match="nests deeper than 32"):
        R.decode_header(deep, R.JSON)
    with pytest.raises(ValueError, match="nests deeper than 32"):
        T.decode_header(deep, T.JSON)


@settings(max_examples=100)
@given(hs=st.lists(headers(), min_size=1, max_size=5), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_the_frame_reader_returns_the_frames_however_the_bytes_arrive(hs, cuts):
    frames = [command(h, b"b%d" % i).encode() for i, h in enumerate(hs)]
    stream = b"".join(frames)
    reader = R.FrameReader()
    got = []
    pos = 0
    for cut in sorted(cuts) + [len(stream)]:
        cut = min(cut, len(stream))
        if cut > pos:
            reader.feed(stream[pos:cut])
            pos = cut
        while (cmd := reader.next()) is not None:
            got.append(cmd)
    assert [c.header_tuple() for c in got] == list(hs)
    assert [c.body for c in got] == [b"b%d" % i for i in range(len(hs))] and reader.buffered == 0


def test_the_frame_reader_refuses_an_oversized_frame_before_it_arrives():
    reader = R.FrameReader()
    reader.feed(struct.pack(">i", R.FRAME_MAX + 1))
    with pytest.raises(R.FrameError, match="outside 4 .. 16777216"):
        reader.next()
    reader = R.FrameReader()
    reader.feed(struct.pack(">i", 3) + b"abc")
    with pytest.raises(R.FrameError, match="frame length 3"):
        reader.next()


def test_encode_refuses_what_the_rocketmq_header_cannot_hold():
    with pytest.raises(ValueError, match="16 bits"):
        R.RemotingCommand(40000).encode(R.ROCKETMQ)
    with pytest.raises(ValueError, match="unknown header serialization type 3"):
        R.RemotingCommand(1).encode(3)
    with pytest.raises(ValueError, match="more than 16777216"):
        R.RemotingCommand(1, body=bytes(R.FRAME_MAX)).encode()
