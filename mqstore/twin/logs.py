"""Pure-Python oracle of the queue-to-CommitLog binding (ext/include/mq_ctl.h mq_log_of_queue),
written from the design (docs/parallel-commitlogs.md "Queue to log binding")."""

from __future__ import annotations

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_U64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h


def log_of_queue(topic: str, queue_id: int, log_count: int) -> int:
    """(fnv1a64(topic) + (uint32) queue_id) mod log_count, the sum taken modulo 2^64."""
    if log_count <= 1:
        return 0
    return ((fnv1a64(topic.encode("utf-8")) + (queue_id & 0xFFFFFFFF)) & _U64) % log_count
