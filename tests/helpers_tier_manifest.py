"""A deterministic stream of tier manifest records and tier queue index entries, and the child
process that writes it (tests/test_tier_manifest.py SIGKILLs it at random moments).

Record number seq (from 1) is fixed by seq alone: segment i = (seq - 1) // 5 goes COPY_STARTED,
MPU, COPY_FINISHED (its queue index entry appended and synced first); the two records after it
retire segment i - 2 (DELETE_STARTED, DELETE_FINISHED, then the queue index cut) or, for the
first two segments, copy index object i. A restarted child continues from the manifest's last
sequence number, so what survives every kill must be a prefix of this one stream.

Run as ``python tests/helpers_tier_manifest.py TIER_DIR COMPACT_BYTES MAX_SEQ``; it prints
``M <seq>`` after each record is fsynced, ``Q <i>`` after segment i's index entry is synced and
``C <i>`` after the cut that follows segment i's retirement is synced.
"""

from __future__ import annotations

import sys
from typing import Any

from mqstore.tier.manifest import Manifest, ManifestState
from mqstore.tier.queues import QueueEntry, TierQueueIndex

FILE_SIZE = 1 << 20
TOPIC, QUEUE_ID = "TopicA", 3


def uid(i: int, kind: str = "seg") -> str:
    return f"{i:015x}{'a' if kind == 'seg' else 'b'}"


def planned(seq: int) -> dict[str, Any]:
    """The payload of record seq."""
    i, step = divmod(seq - 1, 5)
    if step == 0:
        return {"op": "COPY_STARTED", "log": 0, "file_start": i * FILE_SIZE, "file_size": FILE_SIZE,
                "upload_id": uid(i), "key": f"seg/0/{i * FILE_SIZE:020d}.{uid(i)}.mqseg", "created_ms": 1000 + i}
    if step == 1:
        return {"op": "MPU", "upload_id": uid(i), "mpu_id": f"mpu-{i}"}
    if step == 2:
        return {"op": "COPY_FINISHED", "upload_id": uid(i), "size": 4096 + i, "data_crc32": i * 7919 % 2**32,
                "footer_crc32": i * 104729 % 2**32, "first_store_ts": 10_000 * i, "last_store_ts": 10_000 * i + 999,
                "record_count": 100, "queues": 1, "ms": 2000 + i}
    if i >= 2:
        op = "DELETE_STARTED" if step == 3 else "DELETE_FINISHED"
        return {"op": op, "upload_id": uid(i - 2), "ms": 3000 + i}
    if step == 3:
        return {"op": "INDEX_COPY_STARTED", "log": 0, "name": f"{i:017d}", "upload_id": uid(i, "idx"),
                "key": f"idx/0/{i:017d}.{uid(i, 'idx')}.mqidx", "created_ms": 4000 + i}
    return {"op": "INDEX_COPY_FINISHED", "upload_id": uid(i, "idx"), "size": 100 + i, "crc32": i, "begin_ts": i,
            "end_ts": i + 1, "ms": 5000 + i}


def queue_entry(i: int) -> QueueEntry:
    return QueueEntry(100 * i, 100, 0, i * FILE_SIZE, 10_000 * i)


def expected_state(upto: int) -> ManifestState:
    """The state after records 1 .. upto of the stream, applied in memory."""
    state = ManifestState()
    for seq in range(1, upto + 1):
        state.apply(seq, planned(seq))
    return state


def main(tier_dir: str, compact_bytes: int, max_seq: int) -> None:
    manifest = Manifest(tier_dir, compact_bytes=compact_bytes)
    index = TierQueueIndex(tier_dir, TOPIC, QUEUE_ID, writable=True)
    while manifest.last_seq < max_seq:
        seq = manifest.last_seq + 1
        payload = planned(seq)
        i, step = divmod(seq - 1, 5)
        if payload["op"] == "COPY_FINISHED":
            index.append(queue_entry(i))
            index.sync()
            print(f"Q {i}", flush=True)
        op = payload.pop("op")
        manifest.append(op, **payload)
        print(f"M {seq}", flush=True)
        if op == "DELETE_FINISHED":
            index.cut_front(lambda e, i=i: e.file_start < (i - 1) * FILE_SIZE)
            print(f"C {i}", flush=True)
    manifest.close()
    index.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
