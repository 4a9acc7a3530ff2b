"""Pure-Python twin (test oracle) of ``mqstore.client._client``: the messages of a pull response body
(docs/rocketmq-remoting-spec.md §2.4.2, §2.6), decoded record by record with the compiled record
codec's ``decode_record`` into a plain dataclass, as the client did before the kernel; and the
message ids (``UniqIdGenerator``), made as the client made them before the kernel.

It lives here and not in ``mqstore.twin`` because it raises the client's MessageDecodeError and
its messages name the client's MessageQueue (``mqstore.twin`` sits below ``mqstore.client``).
tests/test_client_decode.py requires the kernel to give the same fields, and to fail with the
same words, on every body; tests/test_client_ids.py the same ids from the same fixed bytes,
counter and clock readings.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import time
from dataclasses import dataclass

from mqstore.log._codec import decode_record
from mqstore.client.errors import MessageDecodeError
from mqstore.client.protocol import SYSTEM_PROPERTIES
from mqstore.compression import inflate_body
from mqstore.errors import BodyDecompressError
from mqstore.client.route import MessageQueue

__all__ = ["MessageExt", "UniqIdGenerator", "decode_messages"]


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is most of a pulled message's cost
class MessageExt:
    """A message as a pull returns it, decoded from its CommitLog record (§2.6). ``msg_id`` is
    the UNIQ_KEY property when there is one, else ``offset_msg_id``; ``properties`` holds every
    property of the record (system ones included), ``user_properties`` only the user's."""

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    body_crc: int
    broker_name: str = ""

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTIES}

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


def decode_messages(body: bytes, *, broker_name: str = "", address: str = "") -> list[MessageExt]:
    """The messages of a pull response body: whole CommitLog records back to back (§2.4.2, §2.6),
    compressed bodies (sys flag bit 0, with RocketMQ 5's type bits) inflated by
    mqstore.compression. MessageDecodeError naming the offset and the problem when the body holds
    anything else."""
    out: list[MessageExt] = []
    pos, n = 0, len(body)
    where = f" from {address}" if address else ""
    while pos < n:
        try:
            rec = decode_record(body, pos)
        except ValueError as exc:
            raise MessageDecodeError(f"the pull response body{where} has no valid record at byte {pos} of {n}: "
                                     f"{str(exc).split(' (hint:')[0]}") from None
        try:
            raw = inflate_body(rec.body or b"", rec.sys_flag, f"the record at byte {pos}{where}")
        except BodyDecompressError as exc:
            raise MessageDecodeError(exc.args[0]) from None
        offset_id = rec.msg_id
        out.append(MessageExt(
            topic=rec.topic, body=raw, queue_id=rec.queue_id, queue_offset=rec.queue_offset,
            commit_log_offset=rec.physical_offset, msg_id=rec.properties.get("UNIQ_KEY") or offset_id,
            offset_msg_id=offset_id, properties=rec.properties, flag=rec.flag, sys_flag=rec.sys_flag,
            born_timestamp=rec.born_timestamp, born_host=rec.born_host, store_timestamp=rec.store_timestamp,
            store_host=rec.store_host, reconsume_times=rec.reconsume_times, body_crc=rec.body_crc,
            broker_name=broker_name))
        pos += rec.total_size
    return out


def _month_bounds(ms: int) -> tuple[int, int]:
    """(start of the local month holding ms, start of the next), in ms since the epoch."""
    t = time.localtime(ms / 1000)
    start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    nxt = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
    return int(start * 1000), int(nxt * 1000)


class UniqIdGenerator:
    """Message ids like RocketMQ's MessageClientIDSetter.createUniqID: 32 upper-case hex digits of
    IPv4 address (4 bytes), pid (2), a per-process random salt (4; Java uses a class loader's
    hash), ms since the start of the local month (4) and a counter (2). ``fix``, ``counter``
    and ``now_ms`` (the clock reading the month bounds start from) are for tests."""

    def __init__(self, ip: str | None = None, *, fix: bytes | None = None, counter: int = 0,
                 now_ms: int | None = None) -> None:
        if fix is None:
            addr = b""
            if ip is not None:
                try:
                    addr = socket.inet_pton(socket.AF_INET, ip)
                except (OSError, TypeError):
                    addr = b""
            if not addr:  # MessageClientIDSetter.createFakeIP: 4 bytes of the clock
                addr = (time.time_ns() // 1_000_000).to_bytes(8, "big")[4:]
            fix = addr + (os.getpid() & 0xFFFF).to_bytes(2, "big") + random.getrandbits(32).to_bytes(4, "big")
        if type(fix) is not bytes or len(fix) != 10:
            raise ValueError(f"fix must be 10 bytes (ip, pid, salt), not {fix!r}")
        self._fix = fix
        self._counter = itertools.count(counter & 0xFFFF)
        self._start, self._next_start = _month_bounds(time.time_ns() // 1_000_000 if now_ms is None else now_ms)

    @property
    def fix(self) -> bytes:
        return self._fix

    def next(self) -> str:
        return self.next_at(time.time_ns() // 1_000_000)

    def next_at(self, now_ms: int) -> str:
        now = now_ms
        if now >= self._next_start:
            self._start, self._next_start = _month_bounds(now)
        diff = now - self._start
        if -1_000_000 < diff < 0:
            diff = 0  # a clock stepped back a little (NTP)
        diff = ((diff + 2**31) % 2**32) - 2**31
        tail = diff.to_bytes(4, "big", signed=True) + (next(self._counter) & 0xFFFF).to_bytes(2, "big")
        return (self._fix + tail).hex().upper()

    def next_many(self, n: int) -> list[str]:
        if n < 0:
            raise ValueError(f"n must be >= 0, not {n}")
        return [self.next() for _ in range(n)]
