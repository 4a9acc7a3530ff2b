"""What inflating compressed bodies costs (issue 26, point 6): the Arrow kernel's body column
(``BatchColumns(["body"], decompress=...)``, what the Spark source builds) over 4,000 records of
6 KB text bodies, stored as sent, zlib-compressed at level 5 (what the C++ client and every 4.x
producer send), as an LZ4 frame and as a zstd frame (RocketMQ 5's types), read with and
without inflation. Compare a kind's ``as stored`` and ``as sent`` rows: the difference is the
inflation (C zlib in the kernel; LZ4 and ZSTD through the ``lz4`` and ``zstandard`` packages).

Run: ``python -m pytest bench/test_bodies.py --benchmark-columns=median,rounds -q``
"""

from __future__ import annotations

import random
import string
import zlib

import pytest

from bench._common import record_rate
from mqstore.queue import _arrow
from mqstore.log._codec import encode_record

RECORDS = 4000
BODY = 6000
LOG_SIZE = 64 << 20
GROUP = "Arrow body column: 4000 x 6 KB text bodies"


def _text(rng: random.Random, words: list[str]) -> bytes:
    return " ".join(rng.choice(words) for _ in range(BODY // 4)).encode()[:BODY]


@pytest.fixture(scope="module")
def payloads() -> list[bytes]:
    rng = random.Random(26)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(2000)]
    return [_text(rng, words) for _ in range(RECORDS)]


def _stored(kind: str, payload: bytes) -> tuple[bytes, int]:
    if kind == "zlib":
        return zlib.compress(payload, 5), 0x1
    if kind == "lz4":
        import lz4.frame
        return lz4.frame.compress(payload), 0x101
    if kind == "zstd":
        import zstandard
        return zstandard.ZstdCompressor(level=5).compress(payload), 0x201
    return payload, 0


@pytest.mark.benchmark(group=GROUP)
@pytest.mark.parametrize("decompress", [False, True], ids=["as stored", "as sent"])
@pytest.mark.parametrize("kind", ["none", "zlib", "lz4", "zstd"])
def test_body_column(benchmark, payloads, kind, decompress):
    log, pos = bytearray(LOG_SIZE), 0
    for payload in payloads:
        body, sys_flag = _stored(kind, payload)
        record = encode_record(topic="T", body=body, sys_flag=sys_flag, physical_offset=pos, body_crc=None)
        log[pos:pos + len(record)] = record
        pos += len(record)
    source = _arrow.RecordSource(0, LOG_SIZE, [log])

    def batch() -> int:
        cols = _arrow.BatchColumns(["body"], decompress=decompress)
        return cols.add_span(source, 0, pos)[0]

    assert benchmark.pedantic(batch, rounds=5, iterations=1) == RECORDS
    record_rate(benchmark, f"{kind}, {'as sent' if decompress else 'as stored'}", RECORDS,
                stored_mb=round(pos / 1e6, 1), inflated_mb=round(RECORDS * BODY / 1e6, 1))
