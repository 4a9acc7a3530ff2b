"""No byte sequence in a ConsumeQueue or IndexFile crashes the process (issue 15 item 1).

tests/test_hostile_bytes.py sets every field of real CommitLog records to hostile values; this
file does the same for the two derived file kinds, on a real store:

* ConsumeQueue units (8-byte physical offset, 4-byte size, 8-byte tags code): negative, zero,
  beyond the log, in the middle of a record, across a CommitLog file boundary, sizes near
  2^31, fillers, 0xFF units; files truncated to a non-multiple of 20, files of the wrong size,
  longer than the configured size, missing, misaligned, replaced by a directory, queue
  directories whose id is not an int32.
* IndexFile headers (begin/end timestamps, begin/end physical offsets, hash slot count, index
  count: counts beyond the file, negative, zero), hash slots and entries (slots pointing past
  the entries or at the unused entry #0; prev-index chains with cycles of one, two, three and
  seventeen entries, out-of-range and negative indexes; time diffs and offsets out of range),
  files of the wrong size, extra files of zeros, 0xFF or random bytes, staging leftovers.

Each mutated store is, in a child process (a segfault fails the test instead of killing the
run; a per-case watchdog turns a hang into a failure naming the case):

1. read by the kernels directly (the unit scans of mqstore.queue._consumequeue, IndexFile.load and
   select_phy_offset over every hash slot, compared with the pure-Python twin), so header
   checks of the services cannot hide a kernel that trusts the file;
2. read by the CLI tools (verify, inspect, dump, recover) as it is on the disk: they must
   return 0, 1 or 2 and say why when not 0 (index cases: also check_store with the store's
   index geometry, which `mqstore verify` does not know);
3. opened with MessageStore.open (normal recovery on even cases, abnormal on odd ones), which
   must work or raise an MQStoreError subclass, then read with every read of the API on every
   queue (get_message through the whole queue, min/max offsets, look-ups by queue offset, by
   physical offset and by time, query_message by key), shut down and checked again.

Any exception other than an MQStoreError is a failure too (for the fields of a view a damaged
unit points at, ValueError and its kin are the documented refusal).

The CLI runs in the child process itself (``mqstore.tools.cli.main``: one interpreter per command
would cost a quarter of a second each); a sample of the cases also runs ``python -m mqstore``
in real processes, which must end with 0, 1 or 2 and never a signal.

The mutations are drawn from a seeded random generator (SEED), so a failure reproduces; the
child prints each case before running it, so a crash names the mutation. To rerun a kind by
hand: ``python tests/test_hostile_files.py {consumequeue|index} SRC WORK`` with SRC
a store made by build_source (and SRC.json its result).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import mmap
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback
from typing import Any

import pytest

pytestmark = pytest.mark.multiprocess

SEED = 151  # issue 15 item 1
FS = 64 * 1024
CQ_UNITS = 1024
CQ_FS = 20 * CQ_UNITS     # 20480 bytes = 5 pages: a read past a ConsumeQueue file's end may fault
SLOTS, ENTRIES = 64, 190  # 40 + 4 * 64 + 20 * 190 = 4096: an index file is one page, same reason
INDEX_FS = 40 + 4 * SLOTS + 20 * ENTRIES
CFG: dict[str, Any] = {"mapped_file_size_commit_log": FS, "mapped_file_size_consume_queue": CQ_FS,
                       "max_message_size": 8192, "max_hash_slot_num": SLOTS, "max_index_num": ENTRIES}
CASE_TIMEOUT_S = 30       # one case (open, every read, checker, CLI) takes well under a second
REAL_CLI_EVERY = 40       # every so many cases, the CLI also runs as `python -m mqstore`

I32 = [0, -1, 1, 2**31 - 1, -(2**31), 2**31 - 2]
I64 = [0, -1, 2**63 - 1, -(2**63), 2**31, 2**32]
FILLER = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)

Op = tuple  # ("w", rel, pos, bytes) | ("t", rel, size) | ("rm", rel) | ("new", rel, bytes) | ("mkdir", rel)
Case = tuple  # (description, [Op, ...], {"queue": (topic, qid, offset)?, "keys": [...]})


# -- the source store ---------------------------------------------------------------------------
def build_source(root: str) -> dict[str, Any]:
    """A store with a queue of three ConsumeQueue files (T0/0), small queues, an IPv6 record, a
    batch, and keys spread over three index files. Returns what the mutations need."""
    from mqstore import Message, MessageBatch, MessageStore
    from mqstore.log._codec import encode_batch_body

    keys: dict[str, str] = {}
    with MessageStore(root, **CFG) as store:
        for i in range(2300):
            key = [f"k{i}"] if i % 5 == 0 else None
            store.put_message(Message("T0", b"m%d" % i, queue_id=0, tags="A" if i % 2 else "B", keys=key)).check()
            if key:
                keys[key[0]] = "T0"
            if i % 60 == 0:
                store.put_message(Message("T0", b"q1-%d" % i, queue_id=1, keys=[f"q{i}"])).check()
                keys[f"q{i}"] = "T0"
            if i % 90 == 0:
                store.put_message(Message("T1", b"v6-%d" % i, born_host=("::1", 5), keys=[f"v{i}"])).check()
                keys[f"v{i}"] = "T1"
        store.put_messages(MessageBatch("T2", encode_batch_body([(b"x%d" % i, {"b": "1"}, 0) for i in range(3)])))
        assert store.wait_dispatched()
        first = store.get_message_store_timestamp("T0", 0, 0)
        last = store.get_message_store_timestamp("T0", 0, 2299)
        log_end = store.get_max_phy_offset()
    index = sorted(os.listdir(os.path.join(root, "index")))
    assert [os.path.getsize(os.path.join(root, "index", n)) for n in index] == [INDEX_FS] * len(index)
    assert len(index) >= 3, index
    assert sorted(os.listdir(os.path.join(root, "consumequeue", "T0", "0"))) == [
        f"{n * CQ_FS:020d}" for n in range(3)]
    return {"keys": keys, "log_end": log_end, "timestamps": [first, (first + last) // 2, last], "index": index}


def _units(path: str) -> list[tuple[int, int, int]]:
    data = open(path, "rb").read()
    out = []
    for pos in range(0, len(data) - 19, 20):
        unit = struct.unpack_from(">qiq", data, pos)
        if unit[1] <= 0:
            break
        out.append(unit)
    return out


# -- ConsumeQueue mutations ---------------------------------------------------------------------
def cq_mutations(src: str, meta: dict[str, Any], rng: random.Random) -> list[Case]:
    log_end = meta["log_end"]
    files = [("T0", 0, n) for n in range(3)] + [("T0", 1, 0), ("T1", 0, 0), ("T2", 0, 0)]

    def rel(topic: str, qid: int, n: int) -> str:
        return f"consumequeue/{topic}/{qid}/{n * CQ_FS:020d}"

    units = {f: _units(os.path.join(src, rel(*f))) for f in files}

    def pick() -> tuple[tuple[str, int, int], int, tuple[int, int, int]]:
        """A file and a unit in it: the first, the last written, one past it, or one between."""
        f = files[rng.randrange(len(files))] if rng.random() < 0.4 else files[rng.randrange(3)]
        written = len(units[f])
        k = rng.choice([0, written - 1, written, min(written + 1, CQ_UNITS - 1), CQ_UNITS - 1,
                        rng.randrange(max(1, written))])
        k = max(0, min(k, CQ_UNITS - 1))
        real = units[f][k] if k < written else (log_end, 100, 0)
        return f, k, real

    def target(f: tuple[str, int, int], k: int) -> dict[str, Any]:
        return {"queue": (f[0], f[1], f[2] * CQ_UNITS + k)}

    cases: list[Case] = []
    def phy_values(real: tuple[int, int, int]) -> list[int]:
        """Negative, zero, at and past the log's end, inside the unit's record (or before it),
        across a CommitLog file boundary, far beyond the log, near 2^63."""
        return [-1, -(2**63), 2**63 - 1, 0, 1, log_end, log_end + 1, log_end - 1, real[0] + 1,
                real[0] + real[1] // 2, real[0] - 1, FS - 4, 2 * FS - 50, FS * 2**20, 2**31, max(0, real[0] - 1000)]

    def size_values(real: tuple[int, int, int]) -> list[int]:
        """Negative, zero, smaller than any record, near 2^31, off by one, a file and more."""
        return [0, -1, 1, 2**31 - 1, 2**31 - 2, -(2**31), 20, 90, 91, real[1] + 1, real[1] - 1, FS, FS + 1, 8192,
                8193]

    def tags_values(real: tuple[int, int, int]) -> list[int]:
        return [0, -1, 2**63 - 1, -(2**63)]

    for field_name, at, fmt, values in (("phy", 0, ">q", phy_values), ("size", 8, ">i", size_values),
                                        ("tags", 12, ">q", tags_values)):
        for i in range(len(values((0, 100, 0)))):
            for _ in range(2):
                f, k, real = pick()
                v = values(real)[i]
                cases.append((f"{rel(*f)} unit {k} {field_name}={v}",
                              [("w", rel(*f), 20 * k + at, struct.pack(fmt, v))], target(f, k)))
    for what, raw in (("filler", FILLER), ("0xFF", b"\xff" * 20), ("zeros", bytes(20)),
                      ("phy=-1 size=-1", struct.pack(">qiq", -1, -1, 0))):
        for _ in range(3):
            f, k, _real = pick()
            cases.append((f"{rel(*f)} unit {k} = {what}", [("w", rel(*f), 20 * k, raw)], target(f, k)))
    # out of CommitLog order: a unit repeats or precedes the one before it
    for f in files[:3]:
        k = rng.randrange(1, len(units[f]))
        cases.append((f"{rel(*f)} unit {k} = unit {k - 1}",
                      [("w", rel(*f), 20 * k, struct.pack(">qiq", *units[f][k - 1]))], target(f, k)))
        cases.append((f"{rel(*f)} units {k - 1}, {k} swapped", [
            ("w", rel(*f), 20 * (k - 1), struct.pack(">qiq", *units[f][k])),
            ("w", rel(*f), 20 * k, struct.pack(">qiq", *units[f][k - 1]))], target(f, k - 1)))
    # many hostile units at once, every field random
    for _ in range(60):
        ops: list[Op] = []
        for _ in range(rng.choice([2, 5, 20])):
            f, k, real = pick()
            ops.append(("w", rel(*f), 20 * k, struct.pack(">qiq", rng.choice(phy_values(real)),
                                                           rng.choice(size_values(real)),
                                                           rng.choice(tags_values(real)))))
        cases.append((f"{len(ops)} random units", ops, {}))
    # every unit of a file points past the end of the log / into the middle of records
    for f in files[:3]:
        n = len(units[f])
        past = b"".join(struct.pack(">qiq", log_end + 200 * i, 200, 0) for i in range(n))
        cases.append((f"{rel(*f)}: every unit past the log end", [("w", rel(*f), 0, past)], target(f, 0)))
        mid = b"".join(struct.pack(">qiq", u[0] + 7, u[1], u[2]) for u in units[f])
        cases.append((f"{rel(*f)}: every unit 7 bytes into its record", [("w", rel(*f), 0, mid)], target(f, 0)))
    # file sizes and the file set
    for n in range(3):
        f = ("T0", 0, n)
        for size in (0, 7, 19, 21, 20 * 300 + 13, CQ_FS - 1, 1280, CQ_FS + 1, CQ_FS + 20, 2 * CQ_FS):
            cases.append((f"{rel(*f)} truncated to {size}", [("t", rel(*f), size)], target(f, 0)))
        cases.append((f"{rel(*f)} deleted", [("rm", rel(*f))], {}))
        cases.append((f"{rel(*f)} replaced by a directory", [("rm", rel(*f)), ("mkdir", rel(*f))], {}))
    cases.append(("every T0/0 file of 1280 bytes (another configured size)",
                  [("t", rel("T0", 0, n), 1280) for n in range(3)], {}))
    cases.append(("every T0/0 file of 1290 bytes", [("t", rel("T0", 0, n), 1290) for n in range(3)], {}))
    for name, data in ((f"{3 * CQ_FS:020d}", bytes(CQ_FS)), (f"{3 * CQ_FS:020d}", b"\xff" * CQ_FS),
                       (f"{5 * CQ_FS:020d}", FILLER * CQ_UNITS), (f"{100:020d}", bytes(CQ_FS)),
                       (f"{CQ_FS * 2**40:020d}", bytes(CQ_FS)), ("99999999999999999999", bytes(CQ_FS)),
                       (f"{3 * CQ_FS:020d}", struct.pack(">qiq", log_end, 100, 0) * 10)):
        cases.append((f"an extra file T0/0/{name} of {data[:1].hex()}", [("new", f"consumequeue/T0/0/{name}", data)],
                      {}))
    for qid in ("2147483648", "99999999999999999999", "0000", "-1", "abc"):
        cases.append((f"a queue directory T0/{qid}", [("mkdir", f"consumequeue/T0/{qid}"),
                                                       ("new", f"consumequeue/T0/{qid}/{0:020d}",
                                                        struct.pack(">qiq", 0, 100, 0) * 3)], {}))
    for topic in ("%", "a" * 200, "..a", "T\u00ff", "a b"):
        cases.append((f"a topic directory {topic[:20]!r}", [("mkdir", f"consumequeue/{topic}/0"),
                                                             ("new", f"consumequeue/{topic}/0/{0:020d}",
                                                              struct.pack(">qiq", 0, 100, 0) * 3)], {}))
    cases.append(("a topic directory with non-UTF-8 bytes", [("mkdirb", b"consumequeue/T\xff\xfe/0"),
                                                              ("newb", b"consumequeue/T\xff\xfe/0/" + b"0" * 20,
                                                               struct.pack(">qiq", 0, 100, 0) * 3)], {}))
    cases.append(("a queue directory that is a file", [("rmtree", "consumequeue/T1/0"),
                                                        ("new", "consumequeue/T1/0", b"x")], {}))
    cases.append(("a file in the consumequeue root", [("new", "consumequeue/T9", bytes(CQ_FS))], {}))
    return cases


# -- IndexFile mutations ------------------------------------------------------------------------
def index_mutations(src: str, meta: dict[str, Any], rng: random.Random) -> list[Case]:
    from mqstore.queue._index import index_key_hash

    log_end = meta["log_end"]
    names = meta["index"]
    entries_at = 40 + 4 * SLOTS

    def rel(name: str) -> str:
        return f"index/{name}"

    headers = {}
    chains: dict[str, list[tuple[str, int, int]]] = {}  # name -> [(key, slot, entry number)]
    for name in names:
        data = open(os.path.join(src, rel(name)), "rb").read()
        headers[name] = struct.unpack_from(">qqqqii", data, 0)
        count = headers[name][5]
        by_hash: dict[int, int] = {}
        for n in range(1, count):
            by_hash.setdefault(struct.unpack_from(">i", data, entries_at + 20 * n)[0], n)
        found = []
        for key, topic in meta["keys"].items():
            h = index_key_hash(f"{topic}#{key}")
            if h in by_hash:
                found.append((key, h % SLOTS, by_hash[h]))
        chains[name] = found

    def pick() -> tuple[str, str, int, int, int]:
        """A file, a key it holds, the key's slot, the key's entry, the file's indexCount."""
        name = rng.choice([names[0], names[len(names) // 2], names[-1]])
        key, slot, entry = rng.choice(chains[name])
        return name, key, slot, entry, headers[name][5]

    cases: list[Case] = []
    header_fields = [("beginTimestamp", 0, ">q", I64 + [1, meta["timestamps"][2] + 10**12]),
                     ("endTimestamp", 8, ">q", I64 + [1, meta["timestamps"][0] - 1]),
                     ("beginPhyOffset", 16, ">q", I64 + [log_end + 1, 1]),
                     ("endPhyOffset", 24, ">q", I64 + [log_end + 1, 1]),
                     ("hashSlotCount", 32, ">i", I32 + [SLOTS, SLOTS + 1]),
                     ("indexCount", 36, ">i", I32 + [2, ENTRIES - 1, ENTRIES, ENTRIES + 1, ENTRIES + 2, 4096])]
    for field_name, at, fmt, values in header_fields:
        for v in values:
            name, key, *_ = pick()
            cases.append((f"{rel(name)} {field_name}={v}", [("w", rel(name), at, struct.pack(fmt, v))],
                          {"keys": [key]}))
    # every index file says it is full: a slot may then point at entry #indexCount = #index_num,
    # one past the last entry of the file
    cases.append(("every indexCount = index_num, slots pointing at entry index_num", [
        op for name in names for op in (("w", rel(name), 36, struct.pack(">i", ENTRIES)),
                                         *(("w", rel(name), 40 + 4 * s, struct.pack(">i", ENTRIES))
                                           for s in range(SLOTS)))], {}))
    def slot_values(count: int) -> list[int]:
        """An entry number: negative, the unused #0, the file's count and around it, index_num
        and around it (past the file), far past it."""
        return [-1, 0, 1, count - 1, count, count + 1, ENTRIES - 1, ENTRIES, ENTRIES + 1, 2**31 - 1, -(2**31), 4096]

    for i in range(len(slot_values(100))):
        for _ in range(2):
            name, key, slot, entry, count = pick()
            v2 = slot_values(count)[i]
            cases.append((f"{rel(name)} slot {slot} (key {key}) = {v2}",
                          [("w", rel(name), 40 + 4 * slot, struct.pack(">i", v2))], {"keys": [key]}))
    def prev_values(entry: int, count: int) -> list[int]:
        """A previous-entry number: the entry itself (a cycle of one), a newer entry, the
        values of slot_values."""
        return [entry, -1, 0, count, count + 1, ENTRIES - 1, ENTRIES, ENTRIES + 1, 2**31 - 1, -(2**31), entry + 1]

    for i in range(len(prev_values(1, 1))):
        for _ in range(2):
            name, key, slot, entry, count = pick()
            v = prev_values(entry, count)[i]
            cases.append((f"{rel(name)} entry {entry} (key {key}) prev = {v}",
                          [("w", rel(name), entries_at + 20 * entry + 16, struct.pack(">i", v))], {"keys": [key]}))
    for length in (2, 3, 17):  # cycles of two or more entries through the key's chain
        for _ in range(2):
            name, key, slot, entry, count = pick()
            ring = [entry] + rng.sample([n for n in range(1, count) if n != entry], length - 1)
            ring_ops: list[Op] = [("w", rel(name), entries_at + 20 * a + 16, struct.pack(">i", b))
                                  for a, b in zip(ring, ring[1:] + ring[:1])]
            # the ring's entries all carry the key's hash, so the walk keeps matching
            h = struct.unpack_from(">i", open(os.path.join(src, rel(name)), "rb").read(), entries_at + 20 * entry)[0]
            ring_ops += [("w", rel(name), entries_at + 20 * a, struct.pack(">i", h)) for a in ring]
            cases.append((f"{rel(name)} cycle of {length} through entry {entry} (key {key})", ring_ops,
                          {"keys": [key]}))
    for field_name, at, fmt, values in (("timeDiff", 12, ">i", I32),
                                        ("phyOffset", 4, ">q", I64 + [log_end, log_end - 1, 7, FS - 3]),
                                        ("keyHash", 0, ">i", I32)):
        for v in values:
            name, key, slot, entry, count = pick()
            cases.append((f"{rel(name)} entry {entry} (key {key}) {field_name}={v}",
                          [("w", rel(name), entries_at + 20 * entry + at, struct.pack(fmt, v))], {"keys": [key]}))
    # many fields at once
    for _ in range(30):
        ops: list[Op] = []
        keys = []
        for _ in range(rng.choice([3, 10, 40])):
            name, key, slot, entry, count = pick()
            keys.append(key)
            kind = rng.randrange(4)
            if kind == 0:
                ops.append(("w", rel(name), 40 + 4 * slot, struct.pack(">i", rng.choice(slot_values(count)))))
            elif kind == 1:
                ops.append(("w", rel(name), entries_at + 20 * entry + 16,
                            struct.pack(">i", rng.choice(prev_values(entry, count)))))
            elif kind == 2:
                ops.append(("w", rel(name), entries_at + 20 * rng.randrange(ENTRIES), rng.randbytes(20)))
            else:
                field_name, at, fmt, values = rng.choice(header_fields)
                ops.append(("w", rel(name), at, struct.pack(fmt, rng.choice(values))))
        cases.append((f"{len(ops)} random index fields", ops, {"keys": keys}))
    # file sizes and the file set
    for name in (names[0], names[-1]):
        for size in (0, 39, 40, 41, INDEX_FS - 1, INDEX_FS + 1, 2 * INDEX_FS, 40 + 4 * SLOTS):
            cases.append((f"{rel(name)} truncated to {size}", [("t", rel(name), size)], {}))
        cases.append((f"{rel(name)} replaced by a directory", [("rm", rel(name)), ("mkdir", rel(name))], {}))
        cases.append((f"{rel(name)} header zeroed", [("w", rel(name), 0, bytes(40))], {}))
        cases.append((f"{rel(name)} all 0xFF", [("w", rel(name), 0, b"\xff" * INDEX_FS)], {}))
    cases.append((f"{rel(names[1])} deleted", [("rm", rel(names[1]))], {}))
    after = str(int(names[-1]) + 1000)
    for what, data in (("zeros", bytes(INDEX_FS)), ("0xFF", b"\xff" * INDEX_FS),
                       ("random", rng.randbytes(INDEX_FS)), ("header only", open(os.path.join(src, rel(names[-1])),
                                                                                 "rb").read()[:40])):
        cases.append((f"an extra newest index file of {what}", [("new", rel(after), data)], {}))
        cases.append((f"an extra oldest index file of {what}", [("new", rel("00000000000000001"), data)], {}))
    cases.append(("a staging leftover", [("new", rel("000" + after), bytes(INDEX_FS))], {}))
    cases.append(("an index file name of 18 digits", [("new", rel("1" * 18), bytes(INDEX_FS))], {}))
    cases.append(("index is a file", [("rmtree", "index"), ("new", "index", b"x")], {}))
    return cases


def _cycle(i: int, values: list[int]) -> str:
    """values[i], cycling."""
    return str(values[i % len(values)])


# -- the child process --------------------------------------------------------------------------
def _apply(work: str, ops: list[Op]) -> None:
    for op in ops:
        kind = op[0]
        if kind in ("mkdirb", "newb"):
            path: Any = os.path.join(os.fsencode(work), op[1])
        else:
            path = os.path.join(work, op[1])
        if kind == "w":
            with open(path, "r+b") as fh:
                fh.seek(op[2])
                fh.write(op[3])
        elif kind == "t":
            os.truncate(path, op[2])
        elif kind == "rm":
            os.unlink(path)
        elif kind == "rmtree":
            shutil.rmtree(path)
        elif kind in ("mkdir", "mkdirb"):
            os.makedirs(path, exist_ok=True)
        elif kind in ("new", "newb"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(op[2])
        else:  # pragma: no cover
            raise AssertionError(op)


class Child:
    """Runs the cases; collects every exception that is not the documented kind."""

    FIELD_ERRORS = (ValueError, UnicodeDecodeError, OverflowError, IndexError, KeyError)

    def __init__(self, kind: str, src: str, work: str, meta: dict[str, Any]) -> None:
        from mqstore.errors import MQStoreError

        self.kind, self.src, self.work, self.meta = kind, src, work, meta
        self.MQStoreError: type[Exception] = MQStoreError
        self.failures: list[str] = []
        self.case = ""
        self.index = 0
        self.opened = 0
        self.refused: dict[str, int] = {}
        self.slot_keys = self._slot_keys()
        # (offset, size) of every real record: a view of one is not read field by field
        self.records = {(u[0], u[1]) for dirpath, _dirs, files in os.walk(os.path.join(src, "consumequeue"))
                        for name in files for u in _units(os.path.join(dirpath, name))}

    @staticmethod
    def _slot_keys() -> list[str]:
        """One key per hash slot (the kernel-level query walks every chain)."""
        from mqstore.queue._index import index_key_hash

        keys: dict[int, str] = {}
        i = 0
        while len(keys) < SLOTS:
            key = f"T0#s{i}"
            keys.setdefault(index_key_hash(key) % SLOTS, key)
            i += 1
        return [keys[s] for s in range(SLOTS)]

    def fail(self, step: str) -> None:
        self.failures.append(f"{self.case}: {step}: {traceback.format_exc(limit=-4)}")

    def call(self, step: str, fn: Any, *, tolerate: tuple[type[BaseException], ...] = ()) -> Any:
        """fn(); an MQStoreError (or one of tolerate) is a refusal, anything else a failure."""
        try:
            return fn()
        except (self.MQStoreError, *tolerate):
            return None
        except Exception:
            self.fail(step)
            return None

    # -- 1. the kernels on the files as they are
    def kernels(self) -> None:
        from mqstore.queue._consumequeue import order_break, scan_units, truncate_point
        from mqstore.queue._index import IndexFile
        from mqstore.queue.index import _IndexMapping
        from mqstore.twin.consume_queue import order_break as twin_order_break
        from mqstore.twin.index import IndexFile as TwinIndexFile

        log_end = self.meta["log_end"]
        root = os.path.join(self.work, "consumequeue")
        for dirpath, _dirs, files in os.walk(root) if self.kind == "consumequeue" else ():
            for name in files:
                path = os.path.join(dirpath, name)
                data = open(path, "rb").read()
                n = len(data)
                for start, end in ((0, n), (0, n + 40), (20, n - 20), (n, n + 20)):
                    self.call("scan_units", lambda: scan_units(data, start, end), tolerate=(ValueError,))
                    self.call("truncate_point", lambda: truncate_point(data, start, end, log_end),
                              tolerate=(ValueError,))
                got = self.call("order_break", lambda: order_break(data, n, 0, -1, -1), tolerate=(ValueError,))
                want = twin_order_break(data, n, 0, -1, -1)
                if got is not None and got != want:
                    self.failures.append(f"{self.case}: {name}: order_break {got} != the twin's {want}")
        index_dir = os.path.join(self.work, "index")
        if self.kind != "index" or not os.path.isdir(index_dir):
            return
        for name in sorted(os.listdir(index_dir)):
            path = os.path.join(index_dir, name)
            if not os.path.isfile(path) or os.path.getsize(path) != INDEX_FS or len(name) != 17:
                continue
            original = open(path, "rb").read()
            mapping = _IndexMapping.open(path, INDEX_FS)
            try:
                f = IndexFile.load(mapping, SLOTS, ENTRIES)
                twin = TwinIndexFile.load(SLOTS, ENTRIES, bytearray(original))
                for refresh in (False, True):
                    if refresh:
                        f.refresh_header()
                    for key in self.slot_keys:
                        for begin, end in ((0, 2**63 - 1), (-(2**63), 2**63 - 1),
                                           (self.meta["timestamps"][1], 2**63 - 1)):
                            hits = self.call("select_phy_offset", lambda: f.select_phy_offset(key, 10**6, begin, end))
                            if refresh or hits is None:
                                continue
                            expected: list[int] | None
                            try:
                                expected = twin.select_phy_offset(key, 10**6, begin, end)
                            except struct.error:
                                expected = None  # the twin read past the entries: the kernel must not
                            if hits != expected:
                                self.failures.append(f"{self.case}: {name} select_phy_offset({key!r}, {begin}, "
                                                     f"{end}) = {hits[:5]}... ({len(hits)}), the twin's: "
                                                     f"{expected and (expected[:5], len(expected))}")
                    self.call("is_time_matched", lambda: f.is_time_matched(0, 2**63 - 1))
                    self.call("put_key", lambda: f.is_write_full or f.put_key("T0#new", log_end, 1))
            except (ValueError, self.MQStoreError):
                pass
            except Exception:
                self.fail(f"IndexFile {name}")
            finally:
                mapping.close()
                with open(path, "wb") as fh:  # the tools and the store see the file as mutated
                    fh.write(original)

    # -- 2. the read-only tools
    def tools(self, where: dict[str, Any], when: str) -> None:
        from mqstore.tools import cli
        from mqstore.tools.checker import check_store
        from mqstore.config import StoreConfig

        if self.kind == "index" or when != "before the open":
            # `mqstore verify` below checks the store too, but without the store's index geometry
            self.call(f"check_store ({when})", lambda: check_store(self.work, config=StoreConfig().replace(**CFG)))
        if when != "before the open":
            return  # the read-only tools are for damaged stores: they run on the files as they are
        json_ = ["--json"] if self.index % 2 else []  # text and JSON output on alternate cases
        if "queue" in where:
            topic, qid, offset = where["queue"]
            dump = ["dump", self.work, "--topic", topic, "--queue", str(qid), "--from", str(max(0, offset - 2)),
                    "--count", "5", "--body", "hex", *json_]
        else:
            dump = ["dump", self.work, "--topic", "T0", "--queue", "0", "--count", "3", *json_]
        phy = ["dump", self.work, "--phy", _cycle(self.index, [0, 7, self.meta["log_end"], FS - 3])]
        for argv in [["verify", self.work, *json_], ["inspect", self.work, *json_], ["recover", self.work, *json_],
                     dump, phy]:
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    rc = cli.main(argv)
            except Exception:
                self.fail(f"mqstore {' '.join(argv[:1] + argv[2:])} ({when})")
                continue
            if rc not in (0, 1, 2) or (rc and not (out.getvalue() + err.getvalue()).strip()):
                self.failures.append(f"{self.case}: mqstore {argv[0]} ({when}) exited {rc}: {err.getvalue()[-500:]}")

    def real_cli(self) -> None:
        argvs = [["verify", self.work], ["inspect", self.work], ["recover", self.work],
                 ["dump", self.work, "--topic", "T0", "--queue", "0", "--count", "3"]]
        procs = [(argv, subprocess.Popen([sys.executable, "-m", "mqstore", *argv], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)) for argv in argvs]
        for argv, proc in procs:
            out, err = proc.communicate(timeout=CASE_TIMEOUT_S)
            if proc.returncode not in (0, 1, 2) or (proc.returncode and not (out + err).strip()):
                self.failures.append(f"{self.case}: python -m mqstore {argv[0]} exited {proc.returncode}: {err[-800:]}")

    # -- 3. the store
    def store(self, where: dict[str, Any], abnormal: bool) -> None:
        from mqstore import MessageStore

        if abnormal:
            open(os.path.join(self.work, "abort"), "wb").close()
        try:
            store = MessageStore.open(self.work, **CFG)
        except self.MQStoreError as exc:
            kind = type(exc).__name__
            self.refused[kind] = self.refused.get(kind, 0) + 1
            return
        except Exception:
            self.fail("MessageStore.open")
            return
        self.opened += 1
        try:
            self.reads(store, where)
        finally:
            self.call("shutdown", store.shutdown)

    def reads(self, store: Any, where: dict[str, Any]) -> None:
        ts = self.meta["timestamps"]
        queues = sorted({(cq.topic, cq.queue_id) for cq in store.consume_queues})
        for topic, qid in queues + [("T0", 0), ("T0", 7), ("nope", 0)]:
            lo = self.call("min offset", lambda: store.get_min_offset_in_queue(topic, qid))
            hi = self.call("max offset", lambda: store.get_max_offset_in_queue(topic, qid))
            if lo is None or hi is None:
                continue
            offset, steps = lo, 0
            while steps < 200:
                steps += 1
                got = self.call("get_message", lambda: store.get_message("g", topic, qid, offset, 32))
                if got is None:
                    break
                for m in got:
                    self.fields(m)
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset
            self.views("get_message tags", lambda: store.get_message("g", topic, qid, lo, 32, "A"))
            picks = {lo - 1, lo, hi - 1, hi, hi + 1, (lo + hi) // 2, -1, 2**62}
            if "queue" in where and where["queue"][:2] == (topic, qid):
                o = where["queue"][2]
                picks |= {o - 1, o, o + 1}
                self.views("get_message at the damage", lambda: store.get_message("g", topic, qid, o, 32))
            for o in sorted(picks):
                view = self.call("look_message_by_queue_offset",
                                 lambda: store.look_message_by_queue_offset(topic, qid, o))
                if view is not None:
                    self.fields(view)
                self.call("get_message_store_timestamp", lambda: store.get_message_store_timestamp(topic, qid, o))
            for t in [0, -1, 2**63 - 1, -(2**63) + 1, *ts, ts[2] + 1]:
                self.call("get_offset_in_queue_by_time", lambda: store.get_offset_in_queue_by_time(topic, qid, t))
            self.call("get_earliest_message_time", lambda: store.get_earliest_message_time(topic, qid))
        self.call("get_earliest_message_time", lambda: store.get_earliest_message_time())
        log_end = store.get_max_phy_offset()
        for phy in [-1, 0, 1, 7, log_end - 1, log_end, log_end + 1, FS - 3, FS, 2**62]:
            view = self.call("look_message_by_offset", lambda: store.look_message_by_offset(phy))
            if view is not None:
                self.fields(view)
        keys = self.meta["keys"]
        for key in sorted(set(where.get("keys", [])) | {"k0", "k5", "k1000", "k2295", "q0", "v0", "absent"}):
            topic = keys.get(key, "T0")
            for begin, end in ((0, 2**63 - 1), (ts[1], ts[2]), (-(2**63), 2**63 - 1)):
                got = self.call("query_message", lambda: store.query_message(topic, key, 64, begin, end))
                if got is not None:
                    for m in got.messages:
                        self.fields(m)

    def views(self, step: str, fn: Any) -> None:
        """Every view fn() returns, field by field."""
        for m in self.call(step, fn) or ():
            self.fields(m)

    def fields(self, m: Any) -> None:
        """Every field of a view that is not one of the real records (a damaged unit's)."""
        if (m.physical_offset, m.total_size) in self.records:
            return
        for name in ("topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "born_timestamp",
                     "reconsume_times", "prepared_transaction_offset", "properties", "tags", "keys", "body_crc",
                     "flag", "msg_id"):
            self.call(f"view.{name}", lambda: getattr(m, name), tolerate=self.FIELD_ERRORS)
        self.call("view.body", lambda: bytes(m.body), tolerate=self.FIELD_ERRORS)
        self.call("view.buffer", lambda: bytes(m.buffer), tolerate=self.FIELD_ERRORS)
        self.call("view.decode", lambda: m.decode(check_crc=True), tolerate=self.FIELD_ERRORS)

    def run(self, cases: list[Case]) -> None:
        for i, (what, ops, where) in enumerate(cases):
            self.index = i
            self.case = f"case {i} ({what})"
            print(self.case, flush=True)
            faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
            shutil.rmtree(self.work, ignore_errors=True)
            shutil.copytree(self.src, self.work)
            _apply(self.work, ops)
            self.kernels()
            self.tools(where, "before the open")
            if i % REAL_CLI_EVERY == 0:
                self.real_cli()
            self.store(where, abnormal=bool(i % 2))
            self.tools(where, "after the open")
            faulthandler.cancel_dump_traceback_later()
        shutil.rmtree(self.work, ignore_errors=True)


def child_main(kind: str, src: str, work: str) -> None:
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    faulthandler.enable()
    meta = json.load(open(src + ".json"))
    rng = random.Random(f"{SEED}-{kind}")
    cases = (cq_mutations if kind == "consumequeue" else index_mutations)(src, meta, rng)
    child = Child(kind, src, work, meta)
    child.run(cases)
    print(json.dumps({"cases": len(cases), "opened": child.opened, "refused": child.refused,
                      "failures": child.failures}), flush=True)


def run_child(kind: str, src: str, work: str) -> dict[str, Any]:
    """Run the cases of one kind in a child process; its summary (a crash or a hang fails)."""
    proc = subprocess.run([sys.executable, __file__, kind, src, work], capture_output=True, text=True,
                          timeout=600)
    lines = proc.stdout.strip().splitlines() or ["(nothing)"]
    assert proc.returncode == 0, (f"the child died ({proc.returncode}) at {lines[-1]}:\n{proc.stderr[-4000:]}")
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


# -- unit tests of the fixes the fuzz led to ------------------------------------------------------
class _Buffer:
    """An IndexFile mapping whose MappedFile is longer than the file it claims to be: the bytes
    past file_size are bait a read past the entries would find (a real mapping may have another
    file's pages there, or nothing: a segfault)."""

    def __init__(self, file_size: int, extra: int) -> None:
        from mqstore.log._mapped import MappedFile

        self._dir = tempfile.TemporaryDirectory()
        path = os.path.join(self._dir.name, f"{0:020d}")
        self.mapped = MappedFile.create(path, file_size + extra)
        with open(path, "r+b") as f:  # a second shared mapping of the file, for the test to write
            self.data = mmap.mmap(f.fileno(), file_size + extra)
        self.file_size = file_size
        self.file_name = "buffer"

    def hold(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def flush_range(self, start: int, end: int) -> None:
        pass

    def destroy(self, interval_forcibly_ms: int = 0) -> bool:
        return True


def _bait(buf: _Buffer, entry: int, key: str, phy: int) -> None:
    """Entry number `entry` (past the file when >= ENTRIES) matches key and points at phy."""
    from mqstore.queue._index import index_key_hash

    struct.pack_into(">iqii", buf.data, 40 + 4 * SLOTS + 20 * entry, index_key_hash(key), phy, 0, 0)


def _slot(key: str) -> int:
    from mqstore.queue._index import index_key_hash

    return 40 + 4 * (index_key_hash(key) % SLOTS)


def _twin(buf: _Buffer) -> Any:
    from mqstore.twin.index import IndexFile as TwinIndexFile

    return TwinIndexFile.load(SLOTS, ENTRIES, bytearray(buf.data[:buf.file_size]))


def test_a_slot_pointing_at_index_count_of_a_full_index_file_is_not_followed() -> None:
    """A full file has indexCount = index_num; RocketMQ's check (slot > indexCount) lets a slot
    equal to it through, and entry #index_num lies past the end of the file: the kernel read
    20 bytes beyond the mapping (the fuzz: 'slot ... = 190' with index_num 190)."""
    from mqstore.queue._index import IndexFile

    buf = _Buffer(INDEX_FS, 200)
    f = IndexFile(buf, SLOTS, ENTRIES)
    for i in range(ENTRIES - 1):
        assert f.put_key(f"T#k{i}", 1000 + i, 1)
    assert f.index_count == ENTRIES and f.is_write_full
    _bait(buf, ENTRIES, "T#k0", 666)
    struct.pack_into(">i", buf.data, _slot("T#k0"), ENTRIES)
    assert f.select_phy_offset("T#k0", 64, 0, 2**63 - 1) == []
    assert _twin(buf).select_phy_offset("T#k0", 64, 0, 2**63 - 1) == []


def test_a_prev_index_equal_to_index_count_ends_the_chain() -> None:
    from mqstore.queue._index import IndexFile

    buf = _Buffer(INDEX_FS, 200)
    f = IndexFile(buf, SLOTS, ENTRIES)
    for i in range(ENTRIES - 1):
        assert f.put_key("T#same", 1000 + i, 1)
    _bait(buf, ENTRIES, "T#same", 666)
    struct.pack_into(">i", buf.data, 40 + 4 * SLOTS + 20 * 5 + 16, ENTRIES)  # entry 5's prev -> #index_num
    got = f.select_phy_offset("T#same", 1000, 0, 2**63 - 1)
    assert got == [1000 + i for i in range(ENTRIES - 2, 3, -1)], "newest first, down to entry 5"
    assert _twin(buf).select_phy_offset("T#same", 1000, 0, 2**63 - 1) == got


@pytest.mark.parametrize("count", [ENTRIES + 1, ENTRIES + 50, 2**31 - 1])
def test_an_index_count_beyond_the_file_is_clamped_to_index_num(count: int) -> None:
    """A header whose indexCount exceeds index_num let a slot (or a chain) send the walk up to
    indexCount entries, far past the file; IndexService refuses such a header at load, but
    IndexFile.load and refresh_header (a follower) read any header."""
    from mqstore.queue._index import IndexFile

    buf = _Buffer(INDEX_FS, 20 * 60)
    f = IndexFile(buf, SLOTS, ENTRIES)
    assert f.put_key("T#a", 100, 1)
    struct.pack_into(">i", buf.data, 36, count)
    _bait(buf, ENTRIES + 40, "T#a", 666)
    struct.pack_into(">i", buf.data, _slot("T#a"), ENTRIES + 40)
    for g in (IndexFile.load(buf, SLOTS, ENTRIES), f):
        if g is f:
            g.refresh_header()
        assert g.index_count == ENTRIES and g.is_write_full
        assert g.select_phy_offset("T#a", 64, 0, 2**63 - 1) == []
        assert not g.put_key("T#b", 200, 2), "a full file takes no key (no write past the entries)"
    twin = _twin(buf)
    assert twin.index_count == ENTRIES and twin.select_phy_offset("T#a", 64, 0, 2**63 - 1) == []


def test_a_put_over_a_slot_pointing_at_the_entry_being_written_starts_a_new_chain() -> None:
    """The slot of the key holds the number of the entry the put is about to write (a torn put,
    damage): that entry is not written yet, so it is no previous entry."""
    from mqstore.queue._index import IndexFile

    buf = _Buffer(INDEX_FS, 0)
    f = IndexFile(buf, SLOTS, ENTRIES)
    struct.pack_into(">i", buf.data, _slot("T#a"), 1)
    assert f.put_key("T#a", 100, 1)
    assert struct.unpack_from(">iqii", buf.data, 40 + 4 * SLOTS + 20)[3] == 0 and f.hash_slot_count == 1
    twin = _twin(_Buffer(INDEX_FS, 0))
    struct.pack_into(">i", twin.data, _slot("T#a"), 1)
    assert twin.put_key("T#a", 100, 1) and twin.hash_slot_count == 1
    assert twin.data == buf.data


def test_order_break_sees_a_unit_whose_end_overflows_int64() -> None:
    """phyOffset + size of a unit with phyOffset near 2^63 wrapped negative in the kernel, so the
    unit after it passed the order check (the twin, in Python ints, cut there)."""
    from mqstore.queue._consumequeue import order_break, scan_units, truncate_point
    from mqstore.twin.consume_queue import order_break as twin_order_break

    data = struct.pack(">qiq", 2**63 - 10, 100, 0) + struct.pack(">qiq", 5, 100, 0)
    assert order_break(data, 40, 0, -1, -1) == twin_order_break(data, 40, 0, -1, -1) == (0, 2**63 - 1, 0)
    assert scan_units(data[:20], 0, 20) == (20, 2**63 - 1)
    assert truncate_point(data[:20], 0, 20, 2**63 - 1) == (20, 2**63 - 1)


def test_the_unit_scans_stay_inside_their_buffer() -> None:
    from mqstore.queue._consumequeue import scan_units, truncate_point

    data = struct.pack(">qiq", 100, 50, 0) * 2
    assert truncate_point(data, 0, 4000, 2**62) == (40, 150), "end clamped to the buffer"
    assert scan_units(data, 0, 4000) == (40, 150)
    assert truncate_point(data, 0, -5, 2**62) == scan_units(data, 0, -5) == (0, -1)
    assert truncate_point(b"", 0, 20, 2**62) == scan_units(b"", 0, 20) == (0, -1)
    for fn in (lambda: scan_units(data, -20, 40), lambda: truncate_point(data, -20, 40, 2**62)):
        with pytest.raises(ValueError, match="start"):
            fn()


@pytest.fixture(scope="module")
def source_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("hostile_files") / "src")
    meta = build_source(root)
    with open(root + ".json", "w") as fh:
        json.dump(meta, fh)
    return root


@pytest.mark.parametrize("kind", ["consumequeue", "index"])
def test_hostile_files_never_crash_open_reads_checker_or_cli(source_store: str, tmp_path: Any, kind: str) -> None:
    summary = run_child(kind, source_store, str(tmp_path / "work"))
    assert summary["cases"] >= 150
    failures = summary["failures"]
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])
    assert summary["opened"] > summary["cases"] // 2, summary  # most damage is repaired, not refused


if __name__ == "__main__":
    child_main(*sys.argv[1:4])
