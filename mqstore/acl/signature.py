"""RocketMQ's request signature (AclClientRPCHook, AclUtils, AclSigner; acl module of 4.9.7), the
pure-Python twin of the compiled ``mqstore.acl._acl``.

A Java client signs a request by HMAC-SHA1 over the values of its extFields sorted by name
(``AccessKey`` and ``SecurityToken`` among them, ``Signature`` left out; a TreeMap, so Java's
UTF-16 order), followed by the body; the Base64 of the digest goes into the ``Signature`` ext
field, the key into ``AccessKey``. The C++ client (ClientRPCHook, 1.2.x and 2.x) signs the same
way over ``AccessKey``, ``OnsChannel`` (its channel, "" unless set) and its header's fields
(a std::map: byte order, the same as Java's for ASCII names), then sends exactly those fields
plus ``Signature``; integers go on the wire as JSON numbers, which a broker reads back as the
same decimal text. So one check accepts both: the broker (PlainAccessValidator.parse)
recomputes the signature over the extFields it received, leaving out ``Signature`` and
``_UNIQUE_KEY_QUERY`` (a Java client adds that flag to QUERY_MESSAGE before its hook signs, so
a request carrying it is also accepted when the signature covers it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from mqstore.acl import _acl as _kernel  # SessionCredentials.sign: the digest in the compiled kernel

__all__ = ["ACCESS_KEY", "ONS_CHANNEL", "SECRET_KEY", "SECURITY_TOKEN", "SIGNATURE", "UNIQUE_KEY_QUERY",
           "SessionCredentials", "as_credentials", "calc_signature", "java_sorted", "request_content",
           "sign_fields", "signature_matches"]

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: the C++ client's channel field (SessionCredentials::ONSChannelKey): signed and sent like any field
ONS_CHANNEL = "OnsChannel"
#: MixAll.UNIQUE_MSG_QUERY_FLAG: the broker leaves it out of what it checks
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


@dataclass(frozen=True)
class SessionCredentials:
    """A client's credentials (SessionCredentials): the account's AccessKey and SecretKey of the
    broker's plain_acl.yml, and an optional SecurityToken sent (and signed) with every request."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    def __post_init__(self) -> None:
        for name in ("access_key", "secret_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, not {value!r}")
        if self.security_token is not None and not isinstance(self.security_token, str):
            raise ValueError(f"security_token must be a str or None, not {self.security_token!r}")

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        token = "" if self.security_token is None else ", security_token='***'"
        return f"SessionCredentials(access_key={self.access_key!r}, secret_key='***'{token})"

    def sign(self, fields: dict[str, str], body: bytes | None) -> dict[str, str]:
        """fields with AccessKey (SecurityToken) and the Signature added (in place; returned):
        sign_fields, with the digest taken by the compiled kernel (mqstore.acl._acl, whose twin
        sign_fields is)."""
        fields[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            fields[SECURITY_TOKEN] = self.security_token
        fields.pop(SIGNATURE, None)
        fields[SIGNATURE] = _kernel.request_signature(fields, body, self.secret_key)
        return fields


def as_credentials(credentials: SessionCredentials | tuple[str, str] | tuple[str, str, str] | None
                   ) -> SessionCredentials | None:
    """A client constructor's ``credentials`` argument: a SessionCredentials, an
    (access_key, secret_key[, security_token]) tuple, or None (requests go unsigned)."""
    if credentials is None or isinstance(credentials, SessionCredentials):
        return credentials
    if isinstance(credentials, tuple) and len(credentials) in (2, 3):
        return SessionCredentials(*credentials)
    raise ValueError("credentials must be a SessionCredentials or an (access_key, secret_key) tuple, not "
                     f"{type(credentials).__name__}")


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def java_sorted(keys: list[str]) -> list[str]:
    """keys in Java's String order (UTF-16 code units; the same as Python's for names below U+E000)."""
    if all(k.isascii() for k in keys):
        return sorted(keys)
    return sorted(keys, key=_utf16)


def _text(fields: Mapping[str, str], keys: list[str]) -> bytes:
    text = "".join([fields[k] for k in java_sorted(keys)])
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: Java's getBytes(UTF_8) writes '?'
        return text.encode("utf-8", "replace")


def request_content(fields: Mapping[str, str], body: bytes | None, *, with_unique_key_query: bool = False) -> bytes:
    """AclUtils.combineRequestContent as the broker builds it: the sorted fields' values (not their
    names), UTF-8, then the body; ``Signature`` and (unless with_unique_key_query)
    ``_UNIQUE_KEY_QUERY`` are left out."""
    keys = [k for k in fields if k != SIGNATURE and (with_unique_key_query or k != UNIQUE_KEY_QUERY)]
    data = _text(fields, keys)
    return data + body if body else data


def calc_signature(data: bytes, secret_key: str | bytes) -> str:
    """AclUtils.calSignature: Base64(HMAC-SHA1(secret, data))."""
    key = secret_key.encode("utf-8") if isinstance(secret_key, str) else secret_key
    return base64.b64encode(hmac.new(key, data, hashlib.sha1).digest()).decode("ascii")


def sign_fields(fields: dict[str, str], body: bytes | None, access_key: str, secret_key: str,
                security_token: str | None = None) -> dict[str, str]:
    """AclClientRPCHook.doBeforeRequest: ``fields`` with AccessKey (and SecurityToken) and the
    Signature over them and the body added (in place; returned). The fields must be the ones
    that go on the wire (SEND_MESSAGE_V2's one-letter names). ``_UNIQUE_KEY_QUERY`` is left out
    of the signature, as a 4.9.7 broker checks it."""
    fields[ACCESS_KEY] = access_key
    if security_token is not None:
        fields[SECURITY_TOKEN] = security_token
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = calc_signature(request_content(fields, body), secret_key)
    return fields


def signature_matches(fields: Mapping[str, str], body: bytes | None, secret_key: str | bytes) -> bool:
    """Whether the request's Signature is the one its fields and body make with secret_key
    (compared in constant time); with ``_UNIQUE_KEY_QUERY`` among the fields, a signature that
    covers it is accepted too."""
    given = fields.get(SIGNATURE)
    if given is None:
        return False
    given_bytes = given.encode("utf-8", "replace")
    if hmac.compare_digest(given_bytes, calc_signature(request_content(fields, body), secret_key).encode("ascii")):
        return True
    if UNIQUE_KEY_QUERY in fields:
        content = request_content(fields, body, with_unique_key_query=True)
        return hmac.compare_digest(given_bytes, calc_signature(content, secret_key).encode("ascii"))
    return False
