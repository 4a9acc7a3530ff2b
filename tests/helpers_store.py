"""Reading a store back in tests: the helpers several test files share."""

from __future__ import annotations

from typing import Any

from mqstore.status import GetMessageStatus


def read_queue(store: Any, topic: str, qid: int, *, batch: int = 32, consecutive: bool = True) -> list[Any]:
    """Every message of a queue through get_message, from its min to its max offset: each get
    must be FOUND and (consecutive) move next_begin_offset on by the messages it returned; a
    queue with filler units (skipped offsets) reads with consecutive=False."""
    lo, hi = store.get_min_offset_in_queue(topic, qid), store.get_max_offset_in_queue(topic, qid)
    got: list[Any] = []
    offset = lo
    while offset < hi:
        r = store.get_message("g", topic, qid, offset, batch)
        assert r.status == GetMessageStatus.FOUND, f"{topic}/{qid} @ {offset}: {r.status}"
        got.extend(r)
        assert not consecutive or r.next_begin_offset == offset + len(r)
        offset = r.next_begin_offset
    return got


def read_bodies(store: Any, topic: str = "T", queues: int = 2, *, batch: int = 64) -> dict[int, list[bytes]]:
    """The bodies of queues 0..queues-1 from offset 0 until a get finds nothing more (queues
    with no message are left out)."""
    out: dict[int, list[bytes]] = {}
    for q in range(queues):
        off = 0
        while True:
            r = store.get_message("g", topic, q, off, batch)
            if r.status.name != "FOUND":
                break
            out.setdefault(q, []).extend(bytes(m.body) for m in r)
            off = r.next_begin_offset
    return out
