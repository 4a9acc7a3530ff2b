"""Bodies as the producer sent them: a stored body flagged compressed (sysFlag bit 0) is inflated
the way RocketMQ's clients do before it is handed to a user.

RocketMQ's producers (Java, the C++ client of PyPI ``rocketmq``, mqstore.client's Producer)
zlib-compress a body of 4 KiB or more and set ``COMPRESSED_FLAG``; the store keeps those bytes
as they came (BODYCRC is over them). RocketMQ 5 adds the compression type in sysFlag bits 8-10
(MessageSysFlag, common/compression/CompressionType): 1 LZ4 (an LZ4 frame, LZ4FrameOutputStream),
2 ZSTD (a zstd frame, ZstdOutputStream), 3 ZLIB; 0 with ``COMPRESSED_FLAG`` set is zlib too (the
type of every 4.x producer). Like MessageDecoder.decode, only a non-empty body with
``COMPRESSED_FLAG`` is inflated; type bits without the flag mean nothing.

zlib is the standard library's (the kernels call C zlib directly, ext/mq_inflate.pxd); LZ4 and
ZSTD need the PyPI packages ``lz4`` and ``zstandard`` (``pip install 'mqstore[compression]'``).
A record that needs one that is not installed raises ``CompressionLibraryMissingError`` naming
it, rather than handing out compressed bytes as if they were the body. A body that does not
inflate raises ``BodyDecompressError`` naming where the record is. Either way the stored bytes
are untouched and can still be read as they are (``decompress=False``, ``MessageView.raw_body``).

This module is the one Python place that inflates a body: the store's Python readers, the
client's pure-Python twin and the kernels (for LZ4 and ZSTD, and to word their errors) call it.
"""

from __future__ import annotations

import re
import threading
import zlib
from typing import Any

from mqstore.errors import BodyDecompressError, CompressionLibraryMissingError

__all__ = ["COMPRESSED_FLAG", "COMPRESSION_LZ4_TYPE", "COMPRESSION_TYPE_COMPARATOR", "COMPRESSION_ZLIB_TYPE",
           "COMPRESSION_ZSTD_TYPE", "MAX_INFLATED_BYTES", "compression_of", "inflate_body", "inflate_failed",
           "inflated_too_big", "record_where"]

#: MessageSysFlag.COMPRESSED_FLAG: the body is stored compressed
COMPRESSED_FLAG = 0x1
#: MessageSysFlag's compression types (RocketMQ 5), in sysFlag bits 8-10
COMPRESSION_LZ4_TYPE = 0x1 << 8
COMPRESSION_ZSTD_TYPE = 0x2 << 8
COMPRESSION_ZLIB_TYPE = 0x3 << 8
COMPRESSION_TYPE_COMPARATOR = 0x7 << 8
#: the most bytes one body may inflate to: RocketMQ's producers compress bodies of at most their
#: maxMessageSize (4 MiB by default), so more is a damaged or hostile body, refused before it
#: takes a reader's memory (RocketMQ's clients have no such bound)
MAX_INFLATED_BYTES = 256 << 20

_TYPES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}
_PACKAGES = {"lz4": "lz4", "zstd": "zstandard"}
#: compressed bytes fed to the zstd decompressor at a time, so that a body past
#: MAX_INFLATED_BYTES is stopped within a bounded overshoot (zstandard's streaming API has no
#: output bound of its own)
_ZSTD_SLICE = 1 << 12
#: a zstd decompression context per thread (one costs about as much to make as a 6 KB body to
#: inflate; a context serves one call at a time)
_local = threading.local()


def compression_of(sys_flag: int) -> str | None:
    """How a record's body is stored: None (as sent), "zlib", "lz4", "zstd", or "type N" for a
    type value RocketMQ does not define (4-7, which no reader can inflate)."""
    if not sys_flag & COMPRESSED_FLAG:
        return None
    value = (sys_flag & COMPRESSION_TYPE_COMPARATOR) >> 8
    return _TYPES.get(value, f"type {value}")


def record_where(topic: Any, queue_id: int, queue_offset: int, physical_offset: int) -> str:
    """How an error names a record: topic/queue, queue offset and physical offset."""
    if isinstance(topic, (bytes, bytearray, memoryview)):
        topic = bytes(topic).decode("utf-8", errors="replace")
    return f"the message at queue offset {queue_offset} of {topic}/{queue_id} (physical offset {physical_offset})"


#: how a reader names a record in errors: a str, or the arguments of record_where (so a reader
#: formats nothing unless a body fails)
Where = str | tuple[Any, int, int, int]


def _describe(where: Where) -> str:
    return where if isinstance(where, str) else record_where(*where)


def inflate_failed(kind: str, reason: str, where: Where) -> BodyDecompressError:
    """The error for a body flagged compressed (kind) that does not inflate (reason)."""
    return BodyDecompressError(f"the body of {_describe(where)} is flagged compressed but does not inflate "
                               f"({kind}): {reason}")


def inflated_too_big(kind: str, where: Where, limit: int) -> BodyDecompressError:
    """The error for a body that inflates past limit (MAX_INFLATED_BYTES) bytes."""
    return inflate_failed(kind, f"it inflates past {limit} bytes (mqstore.compression.MAX_INFLATED_BYTES)", where)


def inflate_body(body: Any, sys_flag: int, where: Where = "the record") -> bytes:
    """The body as the producer sent it: body (the stored bytes: bytes or any buffer) inflated
    per sys_flag, or as bytes when it is not flagged compressed (or empty). where names the
    record in errors. BodyDecompressError when it does not inflate, has an unknown type or
    inflates past MAX_INFLATED_BYTES; CompressionLibraryMissingError when LZ4 or ZSTD is needed
    and its package is not installed."""
    kind = compression_of(sys_flag)
    if kind is None or not len(body):
        return bytes(body)
    if kind == "zlib":
        return _zlib(body, where)
    if kind == "lz4":
        return _lz4(body, where)
    if kind == "zstd":
        return _zstd(body, where)
    raise inflate_failed(kind, f"sysFlag 0x{sys_flag & 0xFFFFFFFF:X} names compression {kind}, which RocketMQ "
                         "does not define (1 LZ4, 2 ZSTD, 3 or 0 ZLIB)", where)


_ZLIB_ERROR = re.compile(r"Error (-?\d+) while decompressing data(?:: (.*))?", re.S)


def _zlib_reason(exc: zlib.error) -> str:
    """zlib's own reason, as C zlib words it for the kernels (ext/mq_inflate.pxd)."""
    text = str(exc)
    m = _ZLIB_ERROR.fullmatch(text)
    if m is None:
        return text
    if m.group(2):
        return m.group(2)
    return "it needs a preset dictionary" if m.group(1) == "2" else "not zlib data"


def _whole(kind: str, out: bytes, eof: bool, where: Where) -> bytes:
    """out, when it is a whole body: within MAX_INFLATED_BYTES, the stream or frame ended."""
    if len(out) > MAX_INFLATED_BYTES:
        raise inflated_too_big(kind, where, MAX_INFLATED_BYTES)
    if not eof:
        raise inflate_failed(kind, f"the {'stream' if kind == 'zlib' else 'frame'} is cut short", where)
    return out


def _zlib(body: Any, where: Where) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, MAX_INFLATED_BYTES + 1)
    except zlib.error as exc:
        raise inflate_failed("zlib", _zlib_reason(exc), where) from None
    return _whole("zlib", out, inflater.eof, where)


def _library(kind: str, where: Where) -> Any:
    package = _PACKAGES[kind]
    try:
        if kind == "lz4":
            import lz4.frame as module
        else:
            import zstandard as module
    except ImportError:
        raise CompressionLibraryMissingError(
            f"the body of {_describe(where)} is {kind.upper()}-compressed and inflating it needs the PyPI package "
            f"{package}, which is not installed: pip install {package} (or 'mqstore[compression]')") from None
    return module


def _lz4(body: Any, where: Where) -> bytes:
    frame = _library("lz4", where)
    inflater = frame.LZ4FrameDecompressor()
    data = bytes(body)
    # the output in growing steps: python-lz4 allocates max_length at once, and a frame from
    # Java's LZ4FrameOutputStream does not say its content size
    parts, total, step = [], 0, max(1 << 16, 4 * len(data))
    try:
        while True:
            part = inflater.decompress(data, max_length=min(step, MAX_INFLATED_BYTES + 1 - total))
            data = b""
            parts.append(part)
            total += len(part)
            if inflater.eof or inflater.needs_input or not part or total > MAX_INFLATED_BYTES:
                break
            step *= 2
    except RuntimeError as exc:  # lz4.frame reports damaged frames as RuntimeError
        raise inflate_failed("lz4", str(exc), where) from None
    return _whole("lz4", b"".join(parts), inflater.eof, where)


def _zstd(body: Any, where: Where) -> bytes:
    zstandard = _library("zstd", where)
    context = getattr(_local, "zstd", None)
    if context is None:
        context = _local.zstd = zstandard.ZstdDecompressor()
    inflater = context.decompressobj()
    data = memoryview(body).cast("B")
    parts, total = [], 0
    try:
        for at in range(0, len(data), _ZSTD_SLICE):
            part = inflater.decompress(data[at:at + _ZSTD_SLICE])
            total += len(part)
            if total > MAX_INFLATED_BYTES:
                raise inflated_too_big("zstd", where, MAX_INFLATED_BYTES)
            parts.append(part)
            if inflater.eof:
                break
    except zstandard.ZstdError as exc:
        raise inflate_failed("zstd", str(exc), where) from None
    return _whole("zstd", b"".join(parts), inflater.eof, where)
