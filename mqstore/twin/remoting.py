"""Pure-Python twin (test oracle) of ``mqstore.remoting._remoting``: RocketMQ's remoting frame and its two
header serializations (docs/rocketmq-remoting-spec.md §1).

A frame is ``totalLength (4) | serializeType << 24 | headerLength (4) | header | body``, big-endian,
``totalLength`` counting everything after itself. The JSON header is a flat object (``code``,
``extFields``, ``flag``, ``language``, ``opaque``, ``remark``, ``serializeTypeCurrentRPC``,
``version``, keys in that order as fastjson writes them); the ROCKETMQ header is the binary layout
of RocketMQSerializable. A command here is the tuple
``(code, language, version, opaque, flag, remark, ext_fields)`` plus the body.
"""

from __future__ import annotations

import json
import struct

__all__ = ["FRAME_MAX", "JSON", "LANGUAGES", "ROCKETMQ", "decode_frame", "decode_header", "encode_frame",
           "encode_header"]

JSON = 0
ROCKETMQ = 1
#: NettyDecoder's frame limit (com.rocketmq.remoting.frameMaxLength): totalLength at most this
FRAME_MAX = 16 * 1024 * 1024

#: LanguageCode names by code (spec §1.5)
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST")

Header = tuple  # (code, language, version, opaque, flag, remark, ext_fields)

_INT32 = (-(1 << 31), (1 << 31) - 1)


def _int(value: object, name: str) -> int:
    if type(value) is int:
        n = value
    elif type(value) is _Num and value.lstrip("-").isdigit():
        n = int(value)
    else:
        raise ValueError(f"header field {name} must be a 32-bit integer, not {value!r}")
    if not _INT32[0] <= n <= _INT32[1]:
        raise ValueError(f"header field {name} must be a 32-bit integer, not {value!r}")
    return n


def _ext_value(value: object, key: str) -> str | None:
    """An extFields value as the broker keeps it: a string; a JSON number or boolean becomes its
    JSON text (the C++ client writes some fields as numbers, spec §1.2); null is dropped."""
    if value is None:
        return None
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, str):  # a string, or a number as written (_Num)
        return str(value)
    raise ValueError(f"extFields value of {key!r} must be a string or a number, not {type(value).__name__}")


def decode_header(header: bytes, serialize_type: int) -> Header:
    """The command fields of a header (ValueError naming the problem)."""
    if serialize_type == JSON:
        return _decode_json(header)
    if serialize_type == ROCKETMQ:
        return _decode_rocketmq(header)
    raise ValueError(f"unknown header serialization type {serialize_type}")


class _Num(str):
    """A JSON number as written (an extFields value keeps its text; code, flag ... are ints)."""


#: nesting the JSON header may have (the object itself is depth 1)
MAX_DEPTH = 32


def _depth(v: object) -> int:
    if type(v) is dict:
        return 1 + max((_depth(x) for x in v.values()), default=0)  # type: ignore[attr-defined]
    if type(v) is list:
        return 1 + max((_depth(x) for x in v), default=0)  # type: ignore[attr-defined]
    return 0


def _strings_ok(v: object) -> None:
    """Every string is valid Unicode (no lone surrogate from a \\u escape)."""
    if isinstance(v, str):
        v.encode("utf-8")
    elif type(v) is dict:
        for k, x in v.items():  # type: ignore[attr-defined]
            _strings_ok(k)
            _strings_ok(x)
    elif type(v) is list:
        for x in v:  # type: ignore[attr-defined]
            _strings_ok(x)


def _decode_json(header: bytes) -> Header:
    try:
        obj = json.loads(header.decode("utf-8"), parse_constant=_no_constant, parse_float=_Num, parse_int=_Num)
        _strings_ok(obj)
    except (UnicodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"the JSON header does not parse: {exc}") from None
    if type(obj) is not dict:
        raise ValueError("the JSON header is not an object")
    if _depth(obj) > MAX_DEPTH:
        raise ValueError(f"the JSON header nests deeper than {MAX_DEPTH}")
    code = _int(obj.get("code", 0), "code")
    language = obj.get("language", "JAVA")
    if type(language) is not str:
        raise ValueError(f"header field language must be a string, not {language!r}")
    version = _int(obj.get("version", 0), "version")
    opaque = _int(obj.get("opaque", 0), "opaque")
    flag = _int(obj.get("flag", 0), "flag")
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:  # a number is not a remark either
        raise ValueError("header field remark must be a string")
    ext = obj.get("extFields")
    fields: dict[str, str] = {}
    if ext is not None:
        if type(ext) is not dict:
            raise ValueError("header field extFields must be an object")
        for k, v in ext.items():
            s = _ext_value(v, k)
            if s is not None:
                fields[k] = s
    return code, language, version, opaque, flag, remark, fields


def _no_constant(name: str) -> object:
    raise ValueError(f"the JSON header does not parse: {name} is not JSON")


def _decode_rocketmq(header: bytes) -> Header:
    n = len(header)
    if n < 21:
        raise ValueError(f"the ROCKETMQ header is {n} bytes, shorter than its 21-byte fixed part")
    code, lang, version, opaque, flag, rlen = struct.unpack_from(">hBhiii", header, 0)
    pos = 17
    if rlen < 0 or rlen > n - pos:
        raise ValueError(f"the ROCKETMQ header's remark length {rlen} runs past the header ({n} bytes)")
    remark = header[pos:pos + rlen].decode("utf-8") if rlen else None
    pos += rlen
    if pos + 4 > n:
        raise ValueError("the ROCKETMQ header ends before its extFields length")
    (elen,) = struct.unpack_from(">i", header, pos)
    pos += 4
    if elen < 0 or elen > n - pos:
        raise ValueError(f"the ROCKETMQ header's extFields length {elen} runs past the header ({n} bytes)")
    end = pos + elen
    fields: dict[str, str] = {}
    while pos < end:
        if pos + 2 > end:
            raise ValueError("an extFields entry of the ROCKETMQ header is cut short")
        (klen,) = struct.unpack_from(">h", header, pos)
        pos += 2
        if klen < 0 or pos + klen + 4 > end:
            raise ValueError("an extFields entry of the ROCKETMQ header is cut short")
        key = header[pos:pos + klen].decode("utf-8")
        pos += klen
        (vlen,) = struct.unpack_from(">i", header, pos)
        pos += 4
        if vlen < 0 or pos + vlen > end:
            raise ValueError("an extFields entry of the ROCKETMQ header is cut short")
        value = header[pos:pos + vlen].decode("utf-8")
        pos += vlen
        if klen and vlen:  # a 0-length string decodes as null: the entry is dropped
            fields[key] = value
    language = LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER"
    return code, language, version, opaque, flag, remark, fields


def _json_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def encode_header(h: Header, serialize_type: int) -> bytes:
    """The header bytes of command h (keys in fastjson's order; remark left out when None)."""
    code, language, version, opaque, flag, remark, fields = h
    if serialize_type == JSON:
        parts = [f'"code":{code}',
                 '"extFields":{' + ",".join(f"{_json_string(k)}:{_json_string(v)}" for k, v in fields.items()) + "}",
                 f'"flag":{flag}', f'"language":{_json_string(language)}', f'"opaque":{opaque}']
        if remark is not None:
            parts.append(f'"remark":{_json_string(remark)}')
        parts += ['"serializeTypeCurrentRPC":"JSON"', f'"version":{version}']
        return ("{" + ",".join(parts) + "}").encode("utf-8")
    if serialize_type == ROCKETMQ:
        lang = LANGUAGES.index(language) if language in LANGUAGES else LANGUAGES.index("OTHER")
        r = remark.encode("utf-8") if remark else b""
        pairs = [(k.encode("utf-8"), v.encode("utf-8")) for k, v in fields.items()]
        if not -32768 <= code <= 32767 or not -32768 <= version <= 32767 or any(len(kb) > 32767 for kb, _ in pairs):
            raise ValueError("the ROCKETMQ header holds code, version and key lengths in 16 bits")
        ext = b"".join(struct.pack(">h", len(kb)) + kb + struct.pack(">i", len(vb)) + vb for kb, vb in pairs)
        return struct.pack(">hBhiii", code, lang, version, opaque, flag, len(r)) + r + struct.pack(">i", len(ext)) + ext
    raise ValueError(f"unknown header serialization type {serialize_type}")


def encode_frame(h: Header, body: bytes, serialize_type: int = JSON) -> bytes:
    """The whole frame, totalLength included."""
    header = encode_header(h, serialize_type)
    return struct.pack(">ii", 4 + len(header) + len(body), serialize_type << 24 | len(header)) + header + body


def decode_frame(frame: bytes) -> tuple[Header, bytes, int]:
    """(header, body, serialize type) of one whole frame (totalLength included)."""
    if len(frame) < 8:
        raise ValueError(f"a frame is at least 8 bytes, got {len(frame)}")
    total, mark = struct.unpack_from(">ii", frame, 0)
    if total < 4 or total > FRAME_MAX:
        raise ValueError(f"frame length {total} is outside 4 .. {FRAME_MAX}")
    if total != len(frame) - 4:
        raise ValueError(f"frame length {total} but {len(frame) - 4} bytes follow it")
    serialize_type, hlen = (mark >> 24) & 0xFF, mark & 0xFFFFFF
    if hlen > total - 4:
        raise ValueError(f"header length {hlen} runs past the frame ({total - 4} bytes after the length fields)")
    header = frame[8:8 + hlen]
    return decode_header(header, serialize_type), frame[8 + hlen:], serialize_type
