# cython: language_level=3
# cython: autotestdict=False
"""RocketMQ's request signature on the broker's hot path (PlainAccessValidator.parse,
AclUtils.combineRequestContent and calSignature of 4.9.7). Twin: mqstore.acl.signature.

The content is the values of the extFields sorted by name (Java's String order: UTF-16 code
units, the same as Python's for names below U+E000), ``Signature`` and ``_UNIQUE_KEY_QUERY``
left out, UTF-8, followed by the body; the signature is Base64(HMAC-SHA1(secret, content)).
A request that carries ``_UNIQUE_KEY_QUERY`` also matches when its signature covers that field
(a Java client adds it to QUERY_MESSAGE before its hook signs).

Here the fields are picked and sorted and the values joined without a Python-level loop per
call beyond the one over the dict; the digest is OpenSSL's one-shot HMAC (``_hashlib.hmac_digest``,
what ``hmac.digest`` calls) over the text and the body joined, and a body over STREAM_BODY_BYTES
is fed to an HMAC object after the text instead of being copied.
"""

from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject

import hmac as _hmac
from binascii import b2a_base64 as _b2a_base64

try:
    from _hashlib import hmac_digest as _hmac_digest
except ImportError:  # pragma: no cover - a Python built without OpenSSL
    def _hmac_digest(key, msg, digest):
        return _hmac.digest(key, msg, digest)

cdef str _SIGNATURE = "Signature"
cdef str _UNIQUE = "_UNIQUE_KEY_QUERY"

#: a body longer than this is hashed after the text, not joined to it (a copy saved)
STREAM_BODY_BYTES = 65536
cdef Py_ssize_t _STREAM = 65536


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
    cdef str text
    while PyDict_Next(fields, &pos, &k, &v):
        key = <object>k
        if key == _SIGNATURE or (not with_unique and key == _UNIQUE):
            continue
        keys.append(key)
        if ascii and not (<str>key).isascii():
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


cdef bytes _digest(bytes text, object body, bytes key):
    if not body:
        return _hmac_digest(key, text, "sha1")
    if len(body) > _STREAM:
        mac = _hmac.new(key, text, "sha1")
        mac.update(body)
        return mac.digest()
    return _hmac_digest(key, text + body, "sha1")


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
    cdef bytes d = _hmac_digest(_key(secret_key), data, "sha1")
    return _b2a_base64(d, newline=False).decode("ascii")


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
