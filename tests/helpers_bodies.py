"""Bodies stored compressed as RocketMQ's producers store them (mqstore.compression): the
compressors of each sysFlag compression type, and hypothesis strategies of stored bodies, good
and broken, for the parity tests of the readers' kernels against their twins."""

from __future__ import annotations

import io
import zlib
from typing import Any

import lz4.frame
import zstandard
from hypothesis import strategies as st

#: how each kind is flagged in sysFlag (bit 0 and RocketMQ 5's type bits 8-10)
FLAGS = {"none": 0x0, "zlib": 0x1, "zlib-typed": 0x301, "lz4": 0x101, "zstd": 0x201, "zstd-sized": 0x201}
COMPRESSION_BITS = 0x701


def compress(payload: bytes, kind: str) -> bytes:
    """payload as a producer of that kind stores it: zlib at level 5 (the 4.x clients and the C++
    client), an LZ4 frame (Lz4Compressor's LZ4FrameOutputStream), a zstd frame without its
    content size (ZstdCompressor's ZstdOutputStream) or with it."""
    if kind == "none":
        return payload
    if kind in ("zlib", "zlib-typed"):
        return zlib.compress(payload, 5)
    if kind == "lz4":
        return bytes(lz4.frame.compress(payload))
    if kind == "zstd-sized":
        return bytes(zstandard.ZstdCompressor(level=5).compress(payload))
    if kind == "zstd":
        out = io.BytesIO()
        with zstandard.ZstdCompressor(level=5).stream_writer(out, closefd=False) as writer:
            writer.write(payload)
        return out.getvalue()
    raise ValueError(kind)


def with_flag(sys_flag: int, kind: str) -> int:
    """sys_flag with its compression bits set for kind (the other bits kept)."""
    return (sys_flag & ~COMPRESSION_BITS) | FLAGS[kind]


PAYLOADS = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: (t * 7).encode()))


@st.composite
def good_bodies(draw: Any) -> tuple[str, bytes, bytes]:
    """(kind, payload, stored body) of a body that inflates."""
    kind = draw(st.sampled_from(sorted(FLAGS)))
    payload = draw(PAYLOADS)
    return kind, payload, compress(payload, kind)


@st.composite
def broken_bodies(draw: Any) -> tuple[int, bytes]:
    """(compression bits, stored body) of a body flagged compressed that does not inflate: not
    the type's data, cut short, or a type RocketMQ does not define (4-7)."""
    kind = draw(st.sampled_from(["zlib", "zlib-typed", "lz4", "zstd"]))
    good = compress(draw(st.binary(min_size=1, max_size=200)), kind)
    how = draw(st.sampled_from(["garbage", "cut", "unknown type"]))
    if how == "garbage":
        return FLAGS[kind], draw(st.binary(min_size=1, max_size=60).filter(lambda b: b[:1] not in (b"\x78", b"\x04",
                                                                                                   b"\x28")))
    if how == "cut":
        return FLAGS[kind], good[:draw(st.integers(1, len(good) - 1))]
    return 0x1 | draw(st.integers(4, 7)) << 8, good


def stored_bodies() -> Any:
    """(compression bits, stored body): good ones (more often) and broken ones."""
    good = good_bodies().map(lambda t: (FLAGS[t[0]], t[2]))
    return st.one_of(good, good, good, broken_bodies())


def with_stored_body(fields: dict[str, Any]) -> Any:
    """A strategy: record fields (tests/test_twin_codec.records) whose body is stored as a kind
    of producer stores it, with the sysFlag bits to match (flatmap)."""
    return good_bodies().map(lambda t: {**fields, "body": t[2], "sys_flag": with_flag(fields["sys_flag"], t[0])})
