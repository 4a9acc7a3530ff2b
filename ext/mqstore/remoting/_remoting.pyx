# cython: language_level=3
"""RocketMQ's remoting frame and its two header serializations (docs/rocketmq-remoting-spec.md §1),
in C: the broker front decodes every request and encodes every response here.

A frame is ``totalLength (4) | serializeType << 24 | headerLength (4) | header | body``, big-endian,
``totalLength`` counting everything after itself, at most FRAME_MAX. The JSON header is a flat object
(keys written in fastjson's order: ``code``, ``extFields``, ``flag``, ``language``, ``opaque``,
``remark``, ``serializeTypeCurrentRPC``, ``version``); extFields values are strings on output and
strings, numbers (kept as written) or booleans on input (the C++ client writes some as numbers,
spec §1.2). The ROCKETMQ header is RocketMQSerializable's binary layout (spec §1.4).

Twin: mqstore.twin.remoting (hypothesis parity in tests/test_remoting_codec.py).
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy

from mq_bytes cimport mq_get_i32, mq_put_i32

JSON = 0
ROCKETMQ = 1
#: NettyDecoder's frame limit (com.rocketmq.remoting.frameMaxLength): totalLength at most this
FRAME_MAX = 16 * 1024 * 1024
#: nesting the JSON header may have (the object itself is depth 1)
MAX_DEPTH = 32

#: LanguageCode names by code (spec §1.5)
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST")
cdef dict _LANGUAGE_CODES = {name: i for i, name in enumerate(LANGUAGES)}

cdef enum:
    FIXED = 21   # the ROCKETMQ header's fixed part: code 2, language 1, version 2, opaque 4, flag 4, remark length 4, ext length 4


class FrameError(ValueError):
    """A frame or header that cannot be decoded: the connection that sent it is closed."""


cdef inline int16_t _get_i16(const char *p) noexcept nogil:
    return <int16_t>((<uint8_t>p[0] << 8) | <uint8_t>p[1])


cdef inline void _put_i16(char *p, int v) noexcept nogil:
    p[0] = <char>((v >> 8) & 0xFF)
    p[1] = <char>(v & 0xFF)


@cython.freelist(64)
@cython.final
cdef class RemotingCommand:
    """One request or response: header fields, extFields (str -> str) and body."""

    cdef public int code
    cdef public str language
    cdef public int version
    cdef public int opaque
    cdef public int flag
    cdef public object remark        # str or None
    cdef public dict ext_fields
    cdef public bytes body
    cdef public int serialize_type   # the serialization the command came in (JSON or ROCKETMQ)

    def __init__(self, int code, *, str language="PYTHON", int version=407, int opaque=0, int flag=0, remark=None,
                 ext_fields=None, bytes body=b"", int serialize_type=JSON):
        if remark is not None and type(remark) is not str:
            raise TypeError(f"remark must be a str or None, not {type(remark).__name__}")
        self.code = code
        self.language = language
        self.version = version
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = {} if ext_fields is None else dict(ext_fields)
        self.body = body
        self.serialize_type = serialize_type

    @property
    def is_response(self) -> bool:
        """Bit 0 of flag (RPC_TYPE)."""
        return bool(self.flag & 1)

    @property
    def is_oneway(self) -> bool:
        """Bit 1 of flag (RPC_ONEWAY)."""
        return bool(self.flag & 2)

    def header_tuple(self) -> tuple:
        """(code, language, version, opaque, flag, remark, ext_fields), the twin's form."""
        return (self.code, self.language, self.version, self.opaque, self.flag, self.remark, self.ext_fields)

    def encode(self, serialize_type=None) -> bytes:
        """The whole frame (totalLength included), its header in `serialize_type` (default: the
        one the command has)."""
        cdef int st = self.serialize_type if serialize_type is None else serialize_type
        cdef bytes header
        if st == JSON:
            header = _encode_json(self)
        elif st == ROCKETMQ:
            header = _encode_rocketmq(self)
        else:
            raise ValueError(f"unknown header serialization type {st}")
        cdef Py_ssize_t hlen = PyBytes_GET_SIZE(header), blen = PyBytes_GET_SIZE(self.body)
        if 4 + hlen + blen > FRAME_MAX or hlen > 0xFFFFFF:
            raise ValueError(f"the frame would be {4 + hlen + blen} bytes, more than {FRAME_MAX}")
        cdef bytes out = PyBytes_FromStringAndSize(NULL, 8 + hlen + blen)
        cdef char *p = PyBytes_AS_STRING(out)
        mq_put_i32(p, <int32_t>(4 + hlen + blen))
        mq_put_i32(p + 4, <int32_t>((<uint32_t>st << 24) | <uint32_t>hlen))
        memcpy(p + 8, PyBytes_AS_STRING(header), hlen)
        memcpy(p + 8 + hlen, PyBytes_AS_STRING(self.body), blen)
        return out

    def __repr__(self):
        kind = "response" if self.flag & 1 else "request"
        return (f"RemotingCommand({kind} code={self.code}, opaque={self.opaque}, flag={self.flag}, "
                f"language={self.language!r}, version={self.version}, remark={self.remark!r}, "
                f"ext_fields={self.ext_fields!r}, body={len(self.body)} bytes)")


# -- decoding ----------------------------------------------------------------------------------

def decode_frame(frame) -> RemotingCommand:
    """The command of one whole frame (totalLength included); FrameError naming the problem."""
    cdef const unsigned char[::1] v = memoryview(frame).cast("B")
    cdef Py_ssize_t n = v.shape[0]
    if n < 8:
        raise FrameError(f"a frame is at least 8 bytes, got {n}")
    cdef const char *p = <const char *>&v[0]
    cdef int32_t total = mq_get_i32(p)
    if total < 4 or total > FRAME_MAX:
        raise FrameError(f"frame length {total} is outside 4 .. {FRAME_MAX}")
    if total != n - 4:
        raise FrameError(f"frame length {total} but {n - 4} bytes follow it")
    return _decode_after_length(p + 4, total)


cdef RemotingCommand _decode_after_length(const char *p, Py_ssize_t total):
    """The command of the `total` bytes after a frame's length field."""
    cdef uint32_t mark = <uint32_t>mq_get_i32(p)
    cdef Py_ssize_t hlen = mark & 0xFFFFFF
    if hlen > total - 4:
        raise FrameError(f"header length {hlen} runs past the frame ({total - 4} bytes after the length fields)")
    cdef RemotingCommand cmd = _decode_header(p + 4, hlen, (mark >> 24) & 0xFF)
    cmd.body = PyBytes_FromStringAndSize(p + 4 + hlen, total - 4 - hlen)
    return cmd


cdef RemotingCommand _decode_header(const char *h, Py_ssize_t n, int serialize_type):
    """A command with the fields of the header at h (no body yet)."""
    cdef RemotingCommand cmd = RemotingCommand.__new__(RemotingCommand)
    cmd.serialize_type = serialize_type
    cmd.language = "JAVA"
    cmd.remark = None
    cmd.ext_fields = {}
    if serialize_type == JSON:
        _decode_json(cmd, h, n)
    elif serialize_type == ROCKETMQ:
        _decode_rocketmq(cmd, h, n)
    else:
        raise FrameError(f"unknown header serialization type {serialize_type}")
    return cmd


def decode_header(header, int serialize_type) -> tuple:
    """(code, language, version, opaque, flag, remark, ext_fields) of a header alone."""
    cdef const unsigned char[::1] v = memoryview(header).cast("B")
    cdef const char *p = NULL
    if v.shape[0]:
        p = <const char *>&v[0]
    return _decode_header(p, v.shape[0], serialize_type).header_tuple()


cdef class FrameReader:
    """Frames out of a byte stream: feed() what the socket gave, then next() until None.
    FrameError on a frame whose length is outside 4 .. FRAME_MAX (read before the frame
    arrives, so an oversized frame is refused without buffering it) or whose header does not
    decode; the connection should then be closed."""

    cdef bytearray buf
    cdef Py_ssize_t pos

    def __cinit__(self):
        self.buf = bytearray()
        self.pos = 0

    def feed(self, data) -> None:
        if self.pos and self.pos == len(self.buf):
            del self.buf[:]
            self.pos = 0
        elif self.pos > 65536:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as frames."""
        return len(self.buf) - self.pos

    def next(self):
        """The next whole frame's command, or None until more bytes arrive."""
        cdef Py_ssize_t n = len(self.buf) - self.pos
        if n < 4:
            return None
        cdef char *base = self.buf
        cdef const char *p = base + self.pos
        cdef int32_t total = mq_get_i32(p)
        if total < 4 or total > FRAME_MAX:
            raise FrameError(f"frame length {total} is outside 4 .. {FRAME_MAX}")
        if n < 4 + total:
            return None
        cmd = _decode_after_length(p + 4, total)
        self.pos += 4 + total
        return cmd


# -- the ROCKETMQ header -------------------------------------------------------------------------

cdef str _utf8(const char *p, Py_ssize_t n, str what):
    try:
        return PyUnicode_DecodeUTF8(p, n, "strict")
    except UnicodeDecodeError:
        raise FrameError(f"{what} is not UTF-8") from None


cdef int _decode_rocketmq(RemotingCommand cmd, const char *h, Py_ssize_t n) except -1:
    if n < FIXED:
        raise FrameError(f"the ROCKETMQ header is {n} bytes, shorter than its 21-byte fixed part")
    cmd.code = _get_i16(h)
    cdef int lang = <uint8_t>h[2]
    cmd.language = LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER"
    cmd.version = _get_i16(h + 3)
    cmd.opaque = mq_get_i32(h + 5)
    cmd.flag = mq_get_i32(h + 9)
    cdef int32_t rlen = mq_get_i32(h + 13)
    cdef Py_ssize_t pos = 17
    if rlen < 0 or rlen > n - pos:
        raise FrameError(f"the ROCKETMQ header's remark length {rlen} runs past the header ({n} bytes)")
    cmd.remark = _utf8(h + pos, rlen, "the remark") if rlen else None
    pos += rlen
    if pos + 4 > n:
        raise FrameError("the ROCKETMQ header ends before its extFields length")
    cdef int32_t elen = mq_get_i32(h + pos)
    pos += 4
    if elen < 0 or elen > n - pos:
        raise FrameError(f"the ROCKETMQ header's extFields length {elen} runs past the header ({n} bytes)")
    cdef Py_ssize_t end = pos + elen
    cdef int16_t klen
    cdef int32_t vlen
    cdef dict fields = cmd.ext_fields
    while pos < end:
        if pos + 2 > end:
            raise FrameError("an extFields entry of the ROCKETMQ header is cut short")
        klen = _get_i16(h + pos)
        pos += 2
        if klen < 0 or pos + klen + 4 > end:
            raise FrameError("an extFields entry of the ROCKETMQ header is cut short")
        key = _utf8(h + pos, klen, "an extFields key")
        pos += klen
        vlen = mq_get_i32(h + pos)
        pos += 4
        if vlen < 0 or pos + vlen > end:
            raise FrameError("an extFields entry of the ROCKETMQ header is cut short")
        value = _utf8(h + pos, vlen, "an extFields value")
        pos += vlen
        if klen and vlen:  # a 0-length string decodes as null: the entry is dropped
            fields[key] = value
    return 0


cdef bytes _encode_rocketmq(RemotingCommand cmd):
    if not -32768 <= cmd.code <= 32767 or not -32768 <= cmd.version <= 32767:
        raise ValueError("the ROCKETMQ header holds code, version and key lengths in 16 bits")
    cdef int lang = _LANGUAGE_CODES.get(cmd.language, 7)  # OTHER
    cdef bytes remark = (<str>cmd.remark).encode("utf-8") if cmd.remark else b""
    cdef list parts = []
    cdef Py_ssize_t ext_len = 0
    cdef bytes kb, vb
    for k, v in cmd.ext_fields.items():
        kb = (<str?>k).encode("utf-8")
        vb = (<str?>v).encode("utf-8")
        if PyBytes_GET_SIZE(kb) > 32767:
            raise ValueError("the ROCKETMQ header holds code, version and key lengths in 16 bits")
        parts.append(kb)
        parts.append(vb)
        ext_len += 6 + PyBytes_GET_SIZE(kb) + PyBytes_GET_SIZE(vb)
    cdef Py_ssize_t rlen = PyBytes_GET_SIZE(remark)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, FIXED + rlen + ext_len)
    cdef char *p = PyBytes_AS_STRING(out)
    _put_i16(p, cmd.code)
    p[2] = <char>lang
    _put_i16(p + 3, cmd.version)
    mq_put_i32(p + 5, cmd.opaque)
    mq_put_i32(p + 9, cmd.flag)
    mq_put_i32(p + 13, <int32_t>rlen)
    memcpy(p + 17, PyBytes_AS_STRING(remark), rlen)
    p += 17 + rlen
    mq_put_i32(p, <int32_t>ext_len)
    p += 4
    cdef Py_ssize_t i, m
    for i in range(0, len(parts), 2):
        kb = parts[i]
        vb = parts[i + 1]
        m = PyBytes_GET_SIZE(kb)
        _put_i16(p, <int>m)
        memcpy(p + 2, PyBytes_AS_STRING(kb), m)
        p += 2 + m
        m = PyBytes_GET_SIZE(vb)
        mq_put_i32(p, <int32_t>m)
        memcpy(p + 4, PyBytes_AS_STRING(vb), m)
        p += 4 + m
    return out


# -- the JSON header -----------------------------------------------------------------------------

# value kinds
cdef enum:
    V_STRING = 1
    V_NUMBER = 2
    V_TRUE = 3
    V_FALSE = 4
    V_NULL = 5
    V_NESTED = 6


cdef inline int _hex(char ch) noexcept nogil:
    if 48 <= ch <= 57:
        return ch - 48
    if 97 <= ch <= 102:
        return ch - 97 + 10
    if 65 <= ch <= 70:
        return ch - 65 + 10
    return -1


@cython.final
cdef class _Json:
    """A parser of the header object: the known keys, extFields, and any other value checked
    and skipped (nesting at most MAX_DEPTH)."""

    cdef const char *p
    cdef const char *end
    cdef object value    # the str of the last string or number parsed

    cdef inline void ws(self) noexcept:
        while self.p < self.end and (self.p[0] == 32 or self.p[0] == 9 or self.p[0] == 10
                                     or self.p[0] == 13):
            self.p += 1

    cdef inline bint eat(self, char ch) noexcept:
        self.ws()
        if self.p < self.end and self.p[0] == ch:
            self.p += 1
            return True
        return False

    cdef int bad(self, str what) except -1:
        raise FrameError(f"the JSON header does not parse: {what}")

    cdef int u4(self) except -2:
        """The 4 hex digits after \\u."""
        cdef int v = 0, d, i
        if self.end - self.p < 4:
            self.bad("a \\u escape is cut short")
        for i in range(4):
            d = _hex(self.p[i])
            if d < 0:
                self.bad("a \\u escape has a non-hex digit")
            v = v * 16 + d
        self.p += 4
        return v

    cdef str string(self):
        """A JSON string (the opening quote already eaten)."""
        cdef const char *start = self.p
        cdef bytearray out = None
        cdef char ch
        cdef int cp, lo
        while True:
            if self.p >= self.end:
                self.bad("a string is not closed")
            ch = self.p[0]
            if ch == 34:
                if out is None:
                    s = _utf8(start, self.p - start, "the JSON header")
                else:
                    out += (<char *>start)[:self.p - start]
                    s = _utf8(out, len(out), "the JSON header")
                self.p += 1
                return s
            if <unsigned char>ch < 0x20:
                self.bad("a control character inside a string")
            if ch != 92:
                self.p += 1
                continue
            if out is None:
                out = bytearray()
            out += (<char *>start)[:self.p - start]
            self.p += 1
            if self.p >= self.end:
                self.bad("a string is not closed")
            ch = self.p[0]
            self.p += 1
            if ch == 34 or ch == 92 or ch == 47:
                out.append(ch)
            elif ch == 98:
                out.append(8)
            elif ch == 102:
                out.append(12)
            elif ch == 110:
                out.append(10)
            elif ch == 114:
                out.append(13)
            elif ch == 116:
                out.append(9)
            elif ch == 117:
                cp = self.u4()
                if 0xD800 <= cp <= 0xDBFF:
                    if self.end - self.p >= 6 and self.p[0] == 92 and self.p[1] == 117:
                        self.p += 2
                        lo = self.u4()
                        if not 0xDC00 <= lo <= 0xDFFF:
                            self.bad("a \\u escape holds a lone surrogate")
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    else:
                        self.bad("a \\u escape holds a lone surrogate")
                elif 0xDC00 <= cp <= 0xDFFF:
                    self.bad("a \\u escape holds a lone surrogate")
                out += chr(cp).encode("utf-8")
            else:
                self.bad("an unknown escape in a string")
            start = self.p

    cdef inline void digits(self) noexcept:
        while self.p < self.end and 48 <= self.p[0] <= 57:
            self.p += 1

    cdef str number(self):
        """A JSON number, as written."""
        cdef const char *start = self.p
        if self.p < self.end and self.p[0] == 45:
            self.p += 1
        if self.p >= self.end or not (48 <= self.p[0] <= 57):
            self.bad("a number has no digits")
        if self.p[0] == 48:
            self.p += 1
        else:
            self.digits()
        if self.p < self.end and self.p[0] == 46:
            self.p += 1
            if self.p >= self.end or not (48 <= self.p[0] <= 57):
                self.bad("a number has no digits after its point")
            self.digits()
        if self.p < self.end and (self.p[0] == 101 or self.p[0] == 69):
            self.p += 1
            if self.p < self.end and (self.p[0] == 43 or self.p[0] == 45):
                self.p += 1
            if self.p >= self.end or not (48 <= self.p[0] <= 57):
                self.bad("a number has no digits in its exponent")
            self.digits()
        return (<char *>start)[:self.p - start].decode("ascii")

    cdef bint word(self, bytes w) noexcept:
        cdef Py_ssize_t n = PyBytes_GET_SIZE(w), i
        cdef const char *q = PyBytes_AS_STRING(w)
        if self.end - self.p < n:
            return False
        for i in range(n):
            if self.p[i] != q[i]:
                return False
        self.p += n
        return True

    cdef int val(self, int depth) except -1:
        """One JSON value: its kind; self.value holds the str of a string or number."""
        self.ws()
        if self.p >= self.end:
            self.bad("a value is missing")
        cdef char ch = self.p[0]
        self.value = None
        if ch == 34:
            self.p += 1
            self.value = self.string()
            return V_STRING
        if ch == 45 or 48 <= ch <= 57:
            self.value = self.number()
            return V_NUMBER
        if self.word(b"true"):
            return V_TRUE
        if self.word(b"false"):
            return V_FALSE
        if self.word(b"null"):
            return V_NULL
        if ch == 123 or ch == 91:
            self.nested(depth + 1)
            self.value = None
            return V_NESTED
        self.bad(f"unexpected character {chr(<unsigned char>ch)!r}")
        return -1

    cdef int nested(self, int depth) except -1:
        """An object or array nobody reads (its keys and values still checked)."""
        if depth > MAX_DEPTH:
            self.bad(f"the header nests deeper than {MAX_DEPTH}")
        if self.p[0] == 91:
            self.p += 1
            if self.eat(93):
                return 0
            while True:
                self.val(depth)
                if self.eat(93):
                    return 0
                if not self.eat(44):
                    self.bad("an array is not closed")
        self.p += 1
        if self.eat(125):
            return 0
        while True:
            self.key()
            self.val(depth)
            if self.eat(125):
                return 0
            if not self.eat(44):
                self.bad("an object is not closed")

    cdef str key(self):
        if not self.eat(34):
            self.bad("an object key is not a string")
        k = self.string()
        if not self.eat(58):
            self.bad("a ':' is missing after an object key")
        return k

    cdef int ext_fields(self, dict fields) except -1:
        """The extFields object (its '{' eaten): strings and numbers as written, booleans as
        "true"/"false", null drops the key."""
        cdef int kind
        if self.eat(125):
            return 0
        while True:
            k = self.key()
            kind = self.val(2)
            if kind == V_STRING or kind == V_NUMBER:
                fields[k] = self.value
            elif kind == V_TRUE:
                fields[k] = "true"
            elif kind == V_FALSE:
                fields[k] = "false"
            elif kind == V_NULL:
                fields.pop(k, None)
            else:
                raise FrameError(f"extFields value of {k!r} must be a string or a number, not an object or array")
            if self.eat(125):
                return 0
            if not self.eat(44):
                self.bad("an object is not closed")


cdef int _int32(int kind, object text, str name) except? -1:
    if kind == V_NUMBER:
        s = <str>text
        if s.lstrip("-").isdigit():
            n = int(s)
            if -2147483648 <= n <= 2147483647:
                return n
    raise FrameError(f"header field {name} must be a 32-bit integer")


cdef int _decode_json(RemotingCommand cmd, const char *h, Py_ssize_t n) except -1:
    cdef _Json j = _Json.__new__(_Json)
    j.p = h
    j.end = h + n
    cdef int kind
    cdef int code = 0, version = 0, opaque = 0, flag = 0
    language = "JAVA"
    remark = None
    cdef dict fields = {}
    if not j.eat(123):
        j.bad("the header is not an object")
    if not j.eat(125):
        while True:
            k = j.key()
            if k == "extFields":
                j.ws()
                if j.p < j.end and j.p[0] == 123:
                    j.p += 1
                    fields = {}
                    j.ext_fields(fields)
                else:
                    if j.val(1) != V_NULL:
                        raise FrameError("header field extFields must be an object")
                    fields = {}
            else:
                kind = j.val(1)
                if k == "code":
                    code = _int32(kind, j.value, "code")
                elif k == "version":
                    version = _int32(kind, j.value, "version")
                elif k == "opaque":
                    opaque = _int32(kind, j.value, "opaque")
                elif k == "flag":
                    flag = _int32(kind, j.value, "flag")
                elif k == "language":
                    if kind != V_STRING:
                        raise FrameError("header field language must be a string")
                    language = j.value
                elif k == "remark":
                    if kind == V_STRING:
                        remark = j.value
                    elif kind == V_NULL:
                        remark = None
                    else:
                        raise FrameError("header field remark must be a string")
            if j.eat(125):
                break
            if not j.eat(44):
                j.bad("an object is not closed")
    j.ws()
    if j.p != j.end:
        j.bad("bytes after the header object")
    cmd.code = code
    cmd.version = version
    cmd.opaque = opaque
    cmd.flag = flag
    cmd.language = language
    cmd.remark = remark
    cmd.ext_fields = fields
    return 0


#: the escapes json.dumps writes in short form; other control characters become \u00XX
cdef dict _SHORT_ESCAPES = {34: b'\\"', 92: b'\\\\', 10: b'\\n', 13: b'\\r', 9: b'\\t', 8: b'\\b', 12: b'\\f'}


cdef inline void _json_str(bytearray out, str s):
    """s as a JSON string, escaped as Python's json.dumps(ensure_ascii=False) does."""
    cdef Py_ssize_t n, i, start = 0
    cdef const char *p = PyUnicode_AsUTF8AndSize(s, &n)
    cdef unsigned char ch
    out.append(34)
    for i in range(n):
        ch = <unsigned char>p[i]
        if ch >= 0x20 and ch != 34 and ch != 92:
            continue
        out += (<char *>p)[start:i]
        esc = _SHORT_ESCAPES.get(ch)
        out += esc if esc is not None else b'\\u%04x' % ch
        start = i + 1
    out += (<char *>p)[start:n]
    out.append(34)


cdef bytes _encode_json(RemotingCommand cmd):
    cdef bytearray out = bytearray(b'{"code":')
    out += b"%d" % cmd.code
    out += b',"extFields":{'
    cdef bint first = True
    for k, v in cmd.ext_fields.items():
        if not first:
            out.append(44)
        first = False
        _json_str(out, <str?>k)
        out.append(58)
        _json_str(out, <str?>v)
    out += b'},"flag":%d,"language":' % cmd.flag
    _json_str(out, cmd.language)
    out += b',"opaque":%d' % cmd.opaque
    if cmd.remark is not None:
        out += b',"remark":'
        _json_str(out, <str>cmd.remark)
    out += b',"serializeTypeCurrentRPC":"JSON","version":%d}' % cmd.version
    return bytes(out)
