# cython: language_level=3
# cython: autotestdict=False
"""RocketMQ's request signature on the broker's hot path (PlainAccessValidator.parse,
AclUtils.combineRequestContent and calSignature of 4.9.7). Twin: mqstore.acl.signature.

The content is the values of the extFields sorted by name (Java's String order: UTF-16 code
units, the same as Python's for names below U+E000), ``Signature`` and ``_UNIQUE_KEY_QUERY``
left out, UTF-8, followed by the body; the signature is Base64(HMAC-SHA1(secret, content)).
A request that carries ``_UNIQUE_KEY_QUERY`` also matches when its signature covers that field
(a Java client adds it to QUERY_MESSAGE before its hook signs).

Here the fields are picked and sorted and the values joined in one pass over the dict, and the
HMAC runs on SHA-1 states keyed once per secret (the inner and outer pads hashed, then copied for
each request: half the cost of a one-shot HMAC, which keys OpenSSL's context every call); the
text and the body are fed to it one after the other, so the body is never copied.
"""

from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject

import hmac as _hmac
from binascii import b2a_base64 as _b2a_base64
from hashlib import sha1 as _sha1

cdef str _SIGNATURE = "Signature"
cdef str _UNIQUE = "_UNIQUE_KEY_QUERY"

#: the HMAC-SHA1 block size, and the pads' bytes (RFC 2104)
cdef Py_ssize_t _BLOCK = 64
cdef bytes _TRANS_36 = bytes([x ^ 0x36 for x in range(256)])
cdef bytes _TRANS_5C = bytes([x ^ 0x5C for x in range(256)])
#: secret -> (inner, outer) SHA-1 states; a few accounts' secrets, cleared if it ever grows past this
KEYED_SECRETS_MAX = 1024
cdef dict _keyed = {}


def _utf16(str key):
    return key.encode("utf-16-be", "surrogatepass")


cdef bytes _text(dict fields, bint with_unique):
    """The sorted fields' values, UTF-8."""
    cdef list keys = []
    cdef bint ascii = True
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* v
    cdef list values
    cdef str text, key
    while PyDict_Next(fields, &pos, &k, &v):
        key = <str?>k
        if key == _SIGNATURE or (not with_unique and key == _UNIQUE):
            continue
        keys.append(key)
        if ascii and not key.isascii():
            ascii = False
    if ascii:
        keys.sort()
    else:
        keys.sort(key=_utf16)
    values = [fields[key] for key in keys]
    text = "".join(values)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: Java's getBytes(UTF_8) writes '?'
        return text.encode("utf-8", "replace")


cdef tuple _states(bytes key):
    """The SHA-1 states after the inner and the outer pad of key."""
    states = _keyed.get(key)
    if states is None:
        k = _sha1(key).digest() if len(key) > _BLOCK else key
        k = k + b"\0" * (_BLOCK - len(k))
        states = (_sha1(k.translate(_TRANS_36)), _sha1(k.translate(_TRANS_5C)))
        if len(_keyed) >= KEYED_SECRETS_MAX:
            _keyed.clear()
        _keyed[key] = states
    return <tuple>states


cdef bytes _digest(bytes text, object body, bytes key):
    """HMAC-SHA1(key, text + body)."""
    cdef tuple states = _states(key)
    inner = states[0].copy()
    inner.update(text)
    if body:
        inner.update(body)
    outer = states[1].copy()
    outer.update(inner.digest())
    return outer.digest()


cdef inline bytes _key(object secret_key):
    if isinstance(secret_key, str):
        return (<str>secret_key).encode("utf-8")
    return bytes(secret_key)


def request_content(dict fields, object body, bint with_unique_key_query=False):
    """The bytes a request's signature covers: the sorted fields' values, UTF-8, then the body
    (Signature and, unless with_unique_key_query, _UNIQUE_KEY_QUERY left out)."""
    cdef bytes text = _text(fields, with_unique_key_query)
    if body:
        return text + body
    return text


def calc_signature(object data, object secret_key):
    """Base64(HMAC-SHA1(secret_key, data)); secret_key as str (UTF-8) or bytes."""
    return _b2a_base64(_digest(b"", data, _key(secret_key)), newline=False).decode("ascii")


def request_signature(dict fields, object body, object secret_key):
    """The Signature a client puts on a request (AclClientRPCHook): Base64(HMAC-SHA1) of the
    fields' content (Signature and _UNIQUE_KEY_QUERY left out) and the body, not copied."""
    return _b2a_base64(_digest(_text(fields, False), body, _key(secret_key)), newline=False).decode("ascii")


def signature_matches(dict fields, object body, object secret_key):
    """Whether fields["Signature"] is the one the fields and body make with secret_key (str or
    bytes), compared in constant time."""
    given = fields.get(_SIGNATURE)
    if given is None:
        return False
    cdef bytes key = _key(secret_key)
    cdef bytes given_bytes = (<str>given).encode("utf-8", "replace") if isinstance(given, str) else b""
    if PyBytes_GET_SIZE(given_bytes) != 28:  # Base64 of 20 bytes: nothing else can match
        return False
    cdef bytes mine = _b2a_base64(_digest(_text(fields, False), body, key), newline=False)
    if _hmac.compare_digest(given_bytes, mine):
        return True
    if _UNIQUE in fields:
        mine = _b2a_base64(_digest(_text(fields, True), body, key), newline=False)
        return _hmac.compare_digest(given_bytes, mine)
    return False
