"""Type stubs for the compiled ``mqstore.acl._acl`` (ext/mqstore/acl/_acl.pyx).

RocketMQ's request signature on the broker's hot path: the content (the extFields' values
sorted by name, Signature and _UNIQUE_KEY_QUERY left out, UTF-8, then the body) and
Base64(HMAC-SHA1) compared in constant time. Twin: mqstore.acl.signature.
"""

from typing import Final

from _typeshed import ReadableBuffer

KEYED_SECRETS_MAX: Final[int]

def request_content(fields: dict[str, str], body: ReadableBuffer | None,
                    with_unique_key_query: bool = False) -> bytes:
    """The bytes a request's signature covers."""

def calc_signature(data: ReadableBuffer, secret_key: str | bytes) -> str:
    """Base64(HMAC-SHA1(secret_key, data))."""

def request_signature(fields: dict[str, str], body: ReadableBuffer | None, secret_key: str | bytes) -> str:
    """The Signature a client puts on a request (the content's HMAC-SHA1, Base64)."""

def signature_matches(fields: dict[str, str], body: ReadableBuffer | None, secret_key: str | bytes) -> bool:
    """Whether fields["Signature"] is the one the fields and body make with secret_key."""

def sha1_digest(data: ReadableBuffer, portable: bool = False) -> bytes:
    """SHA-1 of data by the kernel's SHA-1 (ext/include/mq_sha1.h); portable skips the CPU's SHA
    extensions."""

def sha1_uses_cpu_extensions() -> bool:
    """Whether this CPU's SHA extensions hash the blocks."""
