"""Pure-Python twin of ``mqstore.queue._arrow``: the row values a batch of CommitLog records gives
(the oracle of the parity tests; the body as the producer sent it, or as stored with
``decompress=False``: ``mqstore.twin.reads.body_as_sent``), and a reader of the kernel's Arrow-layout buffers back into
rows (so the tests compare values without needing pyarrow).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from typing import Any

from mqstore.twin.codec import DecodedRecord
from mqstore.twin.reads import body_as_sent

COLUMNS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "store_size", "born_timestamp",
           "store_timestamp", "born_host", "store_host", "tags", "keys", "msg_id", "properties", "body",
           "reconsume_times", "sys_flag")
INT32_COLUMNS = ("queue_id", "store_size", "reconsume_times", "sys_flag")
INT64_COLUMNS = ("queue_offset", "commitlog_offset", "born_timestamp", "store_timestamp")
STRING_COLUMNS = ("topic", "born_host", "store_host", "msg_id")
NULLABLE_STRING_COLUMNS = ("tags", "keys")


def host_text(host: tuple[str, int], v6: bool) -> str:
    """'a.b.c.d:port' / '[v6]:port', the address formatted by inet_ntop as the kernel does."""
    ip, port = host
    if v6:
        return f"[{socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, ip))}]:{port}"
    return f"{ip}:{port}"


def row(rec: DecodedRecord, decompress: bool = True, body: bool = True) -> dict[str, Any]:
    """The values of one record in the columns of a batch (the body only when body is true:
    a batch without the body column inflates nothing)."""
    props = rec.properties
    return {
        "topic": rec.topic,
        "queue_id": rec.queue_id,
        "queue_offset": rec.queue_offset,
        "commitlog_offset": rec.physical_offset,
        "store_size": rec.total_size,
        "born_timestamp": rec.born_timestamp * 1000,
        "store_timestamp": rec.store_timestamp * 1000,
        "born_host": host_text(rec.born_host, bool(rec.sys_flag & 0x10)),
        "store_host": host_text(rec.store_host, bool(rec.sys_flag & 0x20)),
        "tags": props.get("TAGS"),
        "keys": props.get("KEYS"),
        "msg_id": rec.msg_id,
        "properties": list(props.items()),
        "body": body_as_sent(rec, rec.physical_offset, decompress) if body else None,
        "reconsume_times": rec.reconsume_times,
        "sys_flag": rec.sys_flag,
    }


def rows(records: Iterable[DecodedRecord], columns: Iterable[str] = COLUMNS,
         decompress: bool = True) -> list[dict[str, Any]]:
    wanted = tuple(columns)
    return [{k: v for k, v in row(rec, decompress, "body" in wanted).items() if k in wanted} for rec in records]


def _strings(offsets: Any, data: Any, n: int, text: bool) -> list[Any]:
    offs = struct.unpack(f"<{n + 1}i", bytes(offsets))
    data = bytes(data)
    out = [data[offs[i]:offs[i + 1]] for i in range(n)]
    return [b.decode("utf-8") for b in out] if text else out


def buffers_to_rows(buffers: dict[str, tuple[Any, ...]], n: int) -> list[dict[str, Any]]:
    """Rows from the kernel's buffers (``BatchColumns.buffers()``), read as Arrow would."""
    cols: dict[str, list[Any]] = {}
    for name, bufs in buffers.items():
        if name in INT32_COLUMNS:
            cols[name] = list(struct.unpack(f"<{n}i", bytes(bufs[0])))
        elif name in INT64_COLUMNS:
            cols[name] = list(struct.unpack(f"<{n}q", bytes(bufs[0])))
        elif name in STRING_COLUMNS or name == "body":
            cols[name] = _strings(bufs[0], bufs[1], n, name != "body")
        elif name in NULLABLE_STRING_COLUMNS:
            validity, offsets, data, nulls = bufs
            values = _strings(offsets, data, n, True)
            if validity is not None:
                validity = bytes(validity)
                values = [v if validity[i // 8] >> (i % 8) & 1 else None for i, v in enumerate(values)]
            assert sum(v is None for v in values) == nulls
            cols[name] = values
        elif name == "properties":
            list_offsets, key_offsets, key_data, value_offsets, value_data = bufs
            lo = struct.unpack(f"<{n + 1}i", bytes(list_offsets))
            pairs = lo[n]
            keys = _strings(key_offsets, key_data, pairs, True)
            values = _strings(value_offsets, value_data, pairs, True)
            cols[name] = [list(zip(keys[lo[i]:lo[i + 1]], values[lo[i]:lo[i + 1]])) for i in range(n)]
        else:
            raise ValueError(f"unknown column {name!r}")
    return [{name: cols[name][i] for name in cols} for i in range(n)]


def take_within(sizes: list[int], max_rows: int = 0, max_bytes: int = 0) -> int:
    """How many of the records (by size, in order) one Arrow batch takes: at most max_rows
    (0: no limit), their sizes adding up to at most max_bytes (0: no limit), the first always.
    The twin of the bounds of BatchColumns.add_span and cut_units."""
    taken = total = 0
    for size in sizes:
        if max_rows and taken >= max_rows:
            break
        if max_bytes and taken and total + size > max_bytes:
            break
        total += size
        taken += 1
    return taken


def cut_units(units: bytes, start: int, max_rows: int = 0, max_bytes: int = 0) -> int:
    """The twin of mqstore.queue._arrow.cut_units: the end (exclusive) of the batch of 20-byte
    ConsumeQueue units that starts at unit index start; fillers count as rows of no bytes."""
    n = len(units) // 20
    if not 0 <= start <= n:
        raise ValueError(f"start {start} is outside the {n} units")
    sizes = []
    for i in range(start, n):
        size = int.from_bytes(units[i * 20 + 8:i * 20 + 12], "big", signed=True)
        sizes.append(0 if size == 0x7FFFFFFF or size < 0 else size)
    return start + take_within(sizes, max_rows, max_bytes)


#: the columns ConsumeQueue units and their queue say without the records
QUEUE_COLUMNS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "store_size")


def queue_rows(units: bytes, topic: str, queue_id: int, first_offset: int, min_phy: int = 0,
               columns: Iterable[str] = QUEUE_COLUMNS) -> tuple[list[dict[str, Any]], int]:
    """The twin of BatchColumns.add_queue_units: (the rows of the 20-byte units of queue
    topic/queue_id, the first at first_offset; the units skipped below min_phy). Filler units
    (phy 0, size 0x7FFFFFFF) are skipped and keep their queue offset."""
    wanted = tuple(columns)
    if any(c not in QUEUE_COLUMNS for c in wanted):
        raise ValueError(f"columns {wanted} need the records")
    out, below = [], 0
    for i in range(len(units) // 20):
        phy, size, _ = struct.unpack_from(">qiq", units, i * 20)
        if phy == 0 and size == 0x7FFFFFFF:
            continue
        if phy < min_phy:
            below += 1
            continue
        row = {"topic": topic, "queue_id": queue_id, "queue_offset": first_offset + i, "commitlog_offset": phy,
               "store_size": size}
        out.append({k: v for k, v in row.items() if k in wanted})
    return out, below
