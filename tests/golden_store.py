"""A store written the same way every time, and a digest of its bytes with the clock taken out.

The issue of several CommitLogs asks that a store with one CommitLog stays byte for byte what
it was before (test T1 of docs/parallel-commitlogs.md). ``write_golden_store`` puts a fixed
sequence of messages (fixed born timestamps and hosts, a fixed store host, small files so the
CommitLog, the ConsumeQueues and the IndexFiles roll) and closes the store cleanly;
``digest_store`` hashes every file after zeroing what depends on the wall clock (each record's
STORETIMESTAMP, the IndexFiles' time fields and names, the checkpoint's times, the clean-close
record's time and tail CRC). ``tests/data/golden_n1.json`` holds the digest of the store the
code wrote before the CommitLog was split: ``python tests/golden_store.py --write`` rewrites it,
which only a deliberate format change may do.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

from mqstore.layout import MESSAGE_MAGIC_CODE

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_n1.json"
BORN_TS = 1_700_000_000_000
CONFIG: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 300,
    "max_hash_slot_num": 512,
    "max_index_num": 2048,
    "store_host": "10.1.2.3:10911",
    "service_mode": "threads",
}
MESSAGES = 5000
#: STORETIMESTAMP's place in a record with an IPv4 born host (store spec §1.2)
_STORE_TS_AT = 56


def write_golden_store(root: str) -> list[str]:
    """Put the fixed messages into a new store at root, close it cleanly; their msgIds."""
    from mqstore import Message, MessageBatch, MessageStore

    ids: list[str] = []
    with MessageStore(root, **CONFIG) as store:
        i = 0
        while i < MESSAGES:
            topic, qid = ("TopicA", "TopicB", "%RETRY%G1")[i % 3], (i // 3) % 4
            size = (7, 120, 900, 3000, 40)[i % 5] + i % 13
            body = (b"b%05d-" % i + bytes(range(256)) * (size // 256 + 1))[:size]
            props = {"K%d" % (i % 4): "v%d" % i} if i % 7 == 0 else None
            if i % 50 == 49:
                batch = MessageBatch.from_messages(
                    [Message(topic, body + b"%d" % j, queue_id=qid, tags="T%d" % j, keys=["bk%d" % (i + j)],
                             born_timestamp=BORN_TS + i, born_host=("192.168.0.7", 5000)) for j in range(5)])
                r = store.put_messages(batch).check()
                i += 5
            else:
                m = Message(topic, body, queue_id=qid, tags="T%d" % (i % 6), keys=["k%d" % i, "s%d" % (i % 10)],
                            properties=props, born_timestamp=BORN_TS + i, born_host=("192.168.0.7", 5000))
                r = store.put_message(m).check()
                i += 1
            ids.extend(r.msg_id.split(","))
        assert store.wait_dispatched()
    return ids


def _records_without_time(data: bytearray) -> bytearray:
    at = 0
    while at + 8 <= len(data):
        size, magic = struct.unpack_from(">ii", data, at)
        if size <= 0 or magic != MESSAGE_MAGIC_CODE:  # the END_OF_FILE blank, or zeros
            break
        data[at + _STORE_TS_AT:at + _STORE_TS_AT + 8] = bytes(8)
        at += size
    return data


def _index_without_time(data: bytearray, slots: int) -> bytearray:
    data[0:16] = bytes(16)  # beginTimestamp, endTimestamp
    count = struct.unpack_from(">i", data, 36)[0]
    first = 40 + 4 * slots
    for k in range(1, count):  # entry 0 is never used
        at = first + 20 * k
        data[at + 12:at + 16] = bytes(4)  # timeDiff
    return data


def digest_store(root: str) -> dict[str, str]:
    """{relative path: sha256} of the store's files, the clock zeroed (see the module's doc)."""
    rootp = Path(root)
    out: dict[str, str] = {}
    for path in sorted(p for p in rootp.rglob("*") if p.is_file()):
        rel = path.relative_to(rootp).as_posix()
        data = bytearray(path.read_bytes())
        if rel in ("lock", "mqstore.shm") or rel.startswith("config/"):
            continue
        if rel.startswith("commitlog/"):
            data = _records_without_time(data)
        elif rel.startswith("index/"):
            data = _index_without_time(data, CONFIG["max_hash_slot_num"])
            rel = "index/#%d" % sum(1 for k in out if k.startswith("index/"))
        elif rel == "checkpoint":
            data = bytearray(len(data))
        elif rel == "mqstore.clean.json":
            record = json.loads(data)
            record.pop("last_store_timestamp", None)
            record.pop("tail_crc", None)
            data = bytearray(json.dumps(record, sort_keys=True).encode())
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def golden_digest(root: str) -> dict[str, Any]:
    ids = write_golden_store(root)
    return {"files": digest_store(root), "msg_ids": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
            "messages": len(ids)}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        got = golden_digest(os.path.join(d, "store"))
    if sys.argv[1:] == ["--write"]:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    print(json.dumps(got, indent=1, sort_keys=True))
