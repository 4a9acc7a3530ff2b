"""RocketMQ's request signature (AclClientRPCHook, AclUtils; acl module of 4.9.7).

A client signs a request by HMAC-SHA1 over the values of its header fields sorted by name
(``AccessKey`` and ``SecurityToken`` among them, ``Signature`` left out), followed by the body;
the Base64 of the digest goes into the ``Signature`` ext field, the key into ``AccessKey``. The
broker (PlainAccessValidator.parse) recomputes it over the ext fields it received, leaving out
``Signature`` and ``_UNIQUE_KEY_QUERY``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["ACCESS_KEY", "SECURITY_TOKEN", "SIGNATURE", "UNIQUE_KEY_QUERY", "calc_signature", "request_content",
           "sign_fields", "signature_matches"]

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: MixAll.UNIQUE_MSG_QUERY_FLAG: the broker leaves it out of what it checks
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


def request_content(fields: Mapping[str, str], body: bytes | None) -> bytes:
    """AclUtils.combineRequestContent: the sorted fields' values (not their names), UTF-8, then
    the body; ``Signature`` and ``_UNIQUE_KEY_QUERY`` are left out."""
    text = "".join(fields[k] for k in sorted(fields) if k != SIGNATURE and k != UNIQUE_KEY_QUERY)
    data = text.encode("utf-8")
    return data + body if body else data


def calc_signature(data: bytes, secret_key: str) -> str:
    """AclUtils.calSignature: Base64(HMAC-SHA1(secret, data))."""
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), data, hashlib.sha1).digest()).decode("ascii")


def sign_fields(fields: dict[str, str], body: bytes | None, access_key: str, secret_key: str,
                security_token: str | None = None) -> dict[str, str]:
    """AclClientRPCHook.doBeforeRequest: ``fields`` with AccessKey (and SecurityToken) and the
    Signature over them and the body added (in place; returned)."""
    fields[ACCESS_KEY] = access_key
    if security_token is not None:
        fields[SECURITY_TOKEN] = security_token
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = calc_signature(request_content(fields, body), secret_key)
    return fields


def signature_matches(fields: Mapping[str, str], body: bytes | None, secret_key: str) -> bool:
    """Whether the request's Signature is the one its fields and body make with secret_key
    (compared in constant time)."""
    given = fields.get(SIGNATURE)
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"),
                               calc_signature(request_content(fields, body), secret_key).encode("ascii"))
