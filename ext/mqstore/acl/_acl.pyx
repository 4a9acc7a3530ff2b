# cython: language_level=3
# cython: autotestdict=False
"""RocketMQ's request signature on the broker's hot path (PlainAccessValidator.parse,
AclUtils.combineRequestContent and calSignature of 4.9.7). Twin: mqstore.acl.signature.

The content is the values of the extFields sorted by name (Java's String order: UTF-16 code
units, the same as Python's for names below U+E000), ``Signature`` and ``_UNIQUE_KEY_QUERY``
left out, UTF-8, followed by the body; the signature is Base64(HMAC-SHA1(secret, content)).
A request that carries ``_UNIQUE_KEY_QUERY`` also matches when its signature covers that field
(a Java client adds it to QUERY_MESSAGE before its hook signs).

Here nothing is joined or copied: the names are picked from the dict and sorted in C (ASCII
names, the only kind clients send; others sort in Python by their UTF-16), each value's UTF-8
and then the body go straight into SHA-1 (ext/include/mq_sha1.h: the SHA extensions where the
CPU has them), whose inner and outer HMAC states are keyed once per secret and copied per
request as 5 words. hashlib's OpenSSL objects cost more per call than the hashing of a few
hundred bytes (5.3 us for a signed send's check before, against ~1 us now).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    bint PyUnicode_Check(object o)
    bint PyUnicode_IS_ASCII(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    void* PyUnicode_DATA(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL

cdef extern from "mq_sha1.h" nogil:
    ctypedef struct mq_sha1_ctx:
        uint32_t h[5]
        uint64_t length
        uint32_t used
        unsigned char block[64]
    int mq_sha1_shani_enabled
    void mq_sha1_init(mq_sha1_ctx* ctx)
    void mq_sha1_update(mq_sha1_ctx* ctx, const void* data, size_t n)
    void mq_sha1_final(mq_sha1_ctx* ctx, unsigned char* out)

cdef str _SIGNATURE = "Signature"
cdef str _UNIQUE = "_UNIQUE_KEY_QUERY"

#: the HMAC-SHA1 block size (RFC 2104)
DEF BLOCK = 64
#: at most this many fields are sorted in C; a request with more sorts in Python
DEF MAX_FIELDS = 64
#: secret -> its keyed (inner, outer) SHA-1 states, as the bytes of two mq_sha1_ctx; a few
#: accounts' secrets, cleared if it ever grows past this
KEYED_SECRETS_MAX = 1024
cdef dict _keyed = {}
cdef const char* _B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _utf16(str key):
    return key.encode("utf-16-be", "surrogatepass")


def sha1_digest(object data, bint portable=False):
    """SHA-1 of data (a buffer) by this module's SHA-1; ``portable`` uses the C rounds even where
    the CPU has the SHA extensions (for the parity test against hashlib)."""
    global mq_sha1_shani_enabled
    cdef Py_buffer view
    cdef mq_sha1_ctx ctx
    cdef unsigned char out[20]
    cdef int was = mq_sha1_shani_enabled
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if portable:
            mq_sha1_shani_enabled = 0
        mq_sha1_init(&ctx)
        mq_sha1_update(&ctx, view.buf, <size_t>view.len)
        mq_sha1_final(&ctx, out)
    finally:
        mq_sha1_shani_enabled = was
        PyBuffer_Release(&view)
    return PyBytes_FromStringAndSize(<char*>out, 20)


def sha1_uses_cpu_extensions():
    """Whether this CPU's SHA extensions hash the blocks (known after the first hash)."""
    cdef unsigned char out[20]
    cdef mq_sha1_ctx ctx
    if mq_sha1_shani_enabled < 0:
        mq_sha1_init(&ctx)
        mq_sha1_update(&ctx, b"x" * 64, 64)
        mq_sha1_final(&ctx, out)
    return mq_sha1_shani_enabled == 1


cdef bytes _states(bytes key):
    """The SHA-1 states after the inner and the outer pad of key (two mq_sha1_ctx, as bytes)."""
    states = _keyed.get(key)
    if states is not None:
        return <bytes>states
    cdef unsigned char k[BLOCK]
    cdef unsigned char pad[BLOCK]
    cdef mq_sha1_ctx both[2]
    cdef Py_ssize_t n = PyBytes_GET_SIZE(key), i
    for i in range(BLOCK):
        k[i] = 0
    if n > BLOCK:
        mq_sha1_init(&both[0])
        mq_sha1_update(&both[0], PyBytes_AS_STRING(key), <size_t>n)
        mq_sha1_final(&both[0], k)
    else:
        memcpy(k, PyBytes_AS_STRING(key), <size_t>n)
    for i in range(BLOCK):
        pad[i] = k[i] ^ 0x36
    mq_sha1_init(&both[0])
    mq_sha1_update(&both[0], pad, BLOCK)
    for i in range(BLOCK):
        pad[i] = k[i] ^ 0x5C
    mq_sha1_init(&both[1])
    mq_sha1_update(&both[1], pad, BLOCK)
    states = PyBytes_FromStringAndSize(<char*>both, sizeof(both))
    if len(_keyed) >= KEYED_SECRETS_MAX:
        _keyed.clear()
    _keyed[key] = states
    return <bytes>states


cdef inline bint _ascii_less(object a, object b):
    cdef Py_ssize_t na = PyUnicode_GET_LENGTH(a), nb = PyUnicode_GET_LENGTH(b)
    cdef int c = memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), <size_t>(na if na < nb else nb))
    return c < 0 or (c == 0 and na < nb)


cdef inline bint _left_out(object key, bint with_unique):
    """Whether the signature leaves this (ASCII) name out: Signature, and _UNIQUE_KEY_QUERY unless
    with_unique."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(key)
    if n == 9:
        return memcmp(PyUnicode_DATA(key), b"Signature", 9) == 0
    if n == 17 and not with_unique:
        return memcmp(PyUnicode_DATA(key), b"_UNIQUE_KEY_QUERY", 17) == 0
    return False


cdef Py_ssize_t _pick(dict fields, bint with_unique, PyObject** names, PyObject** values) except -2:
    """The fields the signature covers into names and values, sorted by name; -1 when a name is
    not ASCII or there are more than MAX_FIELDS (then the caller sorts in Python)."""
    cdef PyObject* k
    cdef PyObject* v
    cdef PyObject* tk
    cdef PyObject* tv
    cdef Py_ssize_t pos = 0, n = 0, i, j
    while PyDict_Next(fields, &pos, &k, &v):
        if not PyUnicode_Check(<object>k):
            raise TypeError(f"an extField's name must be a str, not {type(<object>k).__name__}")
        if not PyUnicode_IS_ASCII(<object>k):
            return -1
        if _left_out(<object>k, with_unique):
            continue
        if n == MAX_FIELDS:
            return -1
        names[n] = k
        values[n] = v
        n += 1
    for i in range(1, n):  # insertion sort: a request has a dozen fields
        tk, tv = names[i], values[i]
        j = i - 1
        while j >= 0 and _ascii_less(<object>tk, <object>names[j]):
            names[j + 1], values[j + 1] = names[j], values[j]
            j -= 1
        names[j + 1], values[j + 1] = tk, tv
    return n


cdef list _sorted_by_utf16(dict fields, bint with_unique):
    """_sorted_values for the fields _pick does not sort: names in Java's order by their UTF-16."""
    keys = [key for key in fields if key != _SIGNATURE and (with_unique or key != _UNIQUE)]
    keys.sort(key=_utf16)
    return [fields[key] for key in keys]


cdef list _sorted_values(dict fields, bint with_unique):
    """The values of the fields the signature covers, in their names' Java order."""
    cdef PyObject* names[MAX_FIELDS]
    cdef PyObject* values[MAX_FIELDS]
    cdef Py_ssize_t n = _pick(fields, with_unique, names, values), i
    if n >= 0:
        return [<object>values[i] for i in range(n)]
    return _sorted_by_utf16(fields, with_unique)


cdef void _feed_value(mq_sha1_ctx* ctx, object value) except *:
    """Feed one value's UTF-8 to ctx (a lone surrogate as '?', as Java writes it)."""
    cdef Py_ssize_t size
    cdef const char* utf8
    if not PyUnicode_Check(value):
        raise TypeError(f"an extField's value must be a str, not {type(value).__name__}")
    if PyUnicode_IS_ASCII(value):
        mq_sha1_update(ctx, PyUnicode_DATA(value), <size_t>PyUnicode_GET_LENGTH(value))
        return
    try:
        utf8 = PyUnicode_AsUTF8AndSize(value, &size)
    except UnicodeEncodeError:
        encoded = (<str>value).encode("utf-8", "replace")
        mq_sha1_update(ctx, PyBytes_AS_STRING(encoded), <size_t>PyBytes_GET_SIZE(encoded))
        return
    mq_sha1_update(ctx, utf8, <size_t>size)


cdef void _feed_text(mq_sha1_ctx* ctx, dict fields, bint with_unique) except *:
    """Feed the sorted fields' values, UTF-8, to ctx."""
    cdef PyObject* names[MAX_FIELDS]
    cdef PyObject* values[MAX_FIELDS]
    cdef Py_ssize_t n = _pick(fields, with_unique, names, values), i
    if n >= 0:
        for i in range(n):
            _feed_value(ctx, <object>values[i])
        return
    for value in _sorted_by_utf16(fields, with_unique):
        _feed_value(ctx, value)


cdef void _hmac(bytes key, dict fields, bint with_text, bint with_unique, object body,
                unsigned char* out) except *:
    """HMAC-SHA1(key, [the fields' content] + body) into out[20]."""
    cdef bytes states = _states(key)
    cdef mq_sha1_ctx ctx[2]
    cdef unsigned char inner[20]
    cdef Py_buffer view
    memcpy(ctx, PyBytes_AS_STRING(states), sizeof(ctx))
    if with_text:
        _feed_text(&ctx[0], fields, with_unique)
    if body is not None:
        PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
        mq_sha1_update(&ctx[0], view.buf, <size_t>view.len)
        PyBuffer_Release(&view)
    mq_sha1_final(&ctx[0], inner)
    mq_sha1_update(&ctx[1], inner, 20)
    mq_sha1_final(&ctx[1], out)


cdef inline void _base64_20(const unsigned char* d, unsigned char* out):
    """Base64 of 20 bytes into out[28] (with its one '=')."""
    cdef int i, o = 0
    cdef uint32_t t
    for i in range(0, 18, 3):
        t = (<uint32_t>d[i] << 16) | (<uint32_t>d[i + 1] << 8) | d[i + 2]
        out[o] = _B64[(t >> 18) & 63]
        out[o + 1] = _B64[(t >> 12) & 63]
        out[o + 2] = _B64[(t >> 6) & 63]
        out[o + 3] = _B64[t & 63]
        o += 4
    t = (<uint32_t>d[18] << 16) | (<uint32_t>d[19] << 8)
    out[24] = _B64[(t >> 18) & 63]
    out[25] = _B64[(t >> 12) & 63]
    out[26] = _B64[(t >> 6) & 63]
    out[27] = b'='


cdef inline bytes _key(object secret_key):
    if isinstance(secret_key, str):
        return (<str>secret_key).encode("utf-8")
    return bytes(secret_key)


cdef str _signature(bytes key, dict fields, bint with_text, bint with_unique, object body):
    cdef unsigned char digest[20]
    cdef unsigned char text[28]
    _hmac(key, fields, with_text, with_unique, body, digest)
    _base64_20(digest, text)
    return (<char*>text)[:28].decode("ascii")


def request_content(dict fields, object body, bint with_unique_key_query=False):
    """The bytes a request's signature covers: the sorted fields' values, UTF-8, then the body
    (Signature and, unless with_unique_key_query, _UNIQUE_KEY_QUERY left out)."""
    text = "".join(_sorted_values(fields, with_unique_key_query))
    try:
        content = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: Java's getBytes(UTF_8) writes '?'
        content = text.encode("utf-8", "replace")
    if body:
        return content + bytes(body)
    return content


def calc_signature(object data, object secret_key):
    """Base64(HMAC-SHA1(secret_key, data)); secret_key as str (UTF-8) or bytes."""
    return _signature(_key(secret_key), None, False, False, data)


def request_signature(dict fields, object body, object secret_key):
    """The Signature a client puts on a request (AclClientRPCHook): Base64(HMAC-SHA1) of the
    fields' content (Signature and _UNIQUE_KEY_QUERY left out) and the body, not copied."""
    return _signature(_key(secret_key), fields, True, False, body)


cdef bint _matches(bytes key, dict fields, bint with_unique, object body, const unsigned char* given) except -1:
    cdef unsigned char digest[20]
    cdef unsigned char mine[28]
    cdef unsigned char diff = 0
    cdef int i
    _hmac(key, fields, True, with_unique, body, digest)
    _base64_20(digest, mine)
    for i in range(28):  # constant time
        diff |= mine[i] ^ given[i]
    return diff == 0


def signature_matches(dict fields, object body, object secret_key):
    """Whether fields["Signature"] is the one the fields and body make with secret_key (str or
    bytes), compared in constant time."""
    given = fields.get(_SIGNATURE)
    if given is None or not isinstance(given, str):
        return False
    # Base64 of 20 bytes is 28 ASCII characters: nothing else can match
    if not PyUnicode_IS_ASCII(given) or PyUnicode_GET_LENGTH(given) != 28:
        return False
    cdef const unsigned char* given_text = <const unsigned char*>PyUnicode_DATA(given)
    cdef bytes key = _key(secret_key)
    if _matches(key, fields, False, body, given_text):
        return True
    if _UNIQUE in fields:
        return _matches(key, fields, True, body, given_text)
    return False
