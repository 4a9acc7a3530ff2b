"""No byte sequence in a store file crashes the process: every field of real records is set to
hostile values (lengths near 2^31, negative, zero, off by one, IPv6 host bits on IPv4 records,
bad magic) and every parser is run over the result (scan, decode, the dispatch parser, the Arrow
kernel, a store opening and recovering it, every read of every queue, the checker). The parsers
run in a child process, so a segfault fails the test instead of killing the run; the child
names the mutation it was at."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

from mqstore import Message, MessageBatch, MessageStore
from mqstore.log._codec import encode_batch_body

pytestmark = pytest.mark.multiprocess

FS = 64 * 1024
CFG = {"mapped_file_size_commit_log": FS, "mapped_file_size_consume_queue": 20 * 64, "max_message_size": 8192,
       "max_hash_slot_num": 64, "max_index_num": 256}

# (name, offset from the record start, struct format); variable positions are computed per record
FIXED = [("TOTALSIZE", 0, ">i"), ("MAGIC", 4, ">i"), ("BODYCRC", 8, ">i"), ("QUEUEID", 12, ">i"),
         ("FLAG", 16, ">i"), ("QUEUEOFFSET", 20, ">q"), ("PHYSICALOFFSET", 28, ">q"), ("SYSFLAG", 36, ">i"),
         ("BORNTIMESTAMP", 40, ">q"), ("STORETIMESTAMP", 56, ">q")]
INT_VALUES = [0, -1, 1, 90, 91, 2**31 - 1, -(2**31), 0x7FFFFFF0, 0x30, 0xF0]
SHORT_VALUES = [0, -1, 0x7FFF, -0x8000, 1, 200]
BYTE_VALUES = [0, 0xFF, 0x7F, 0x80, 1]


def _records(path: str) -> list[tuple[int, int]]:
    """(position, size) of the records at the start of a CommitLog file."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos + 8 <= len(data):
        size, magic = struct.unpack_from(">ii", data, pos)
        if magic not in (-626843481, -626843477) or size <= 0:
            break
        out.append((pos, size))
        pos += size
    return out


def _mutations(path: str) -> list[tuple[str, int, bytes]]:
    """(description, file position, bytes to write) for every field of the first records."""
    data = open(path, "rb").read()
    muts = []
    for index, (pos, size) in enumerate(_records(path)[:4]):
        for name, off, fmt in FIXED:
            values = INT_VALUES if fmt == ">i" else [0, -1, 2**63 - 1, 2**31, -(2**62)]
            for v in values:
                muts.append((f"record {index} {name}={v}", pos + off, struct.pack(fmt, v)))
        sys_flag = struct.unpack_from(">i", data, pos + 36)[0]
        body_at = 48 + (20 if sys_flag & 0x10 else 8) + 8 + (20 if sys_flag & 0x20 else 8) + 12
        body_len = struct.unpack_from(">i", data, pos + body_at)[0]
        for v in INT_VALUES + [body_len + 1, body_len - 1, size]:
            muts.append((f"record {index} BODYLEN={v}", pos + body_at, struct.pack(">i", v)))
        topic_at = pos + body_at + 4 + body_len
        for v in BYTE_VALUES:
            muts.append((f"record {index} TOPICLEN={v}", topic_at, bytes([v])))
        topic_len = data[topic_at]
        for v in SHORT_VALUES:
            muts.append((f"record {index} PROPLEN={v}", topic_at + 1 + topic_len, struct.pack(">h", v)))
        muts.append((f"record {index} topic bytes = NUL and '/'", topic_at + 1, b"\x00/"[:topic_len]))
        muts.append((f"record {index} topic bytes = invalid UTF-8", topic_at + 1, b"\xff\xfe"[:topic_len]))
    return muts


CHILD = textwrap.dedent('''
    import os, shutil, sys, warnings
    warnings.simplefilter("ignore")
    from mqstore import MessageStore, MQStoreError
    from mqstore.log._codec import decode_record
    from mqstore.log._scan import scan_records
    from mqstore.queue._reput import BatchParser
    from mqstore.queue._arrow import BatchColumns, RecordSource
    from mqstore.tools.checker import check_store

    src, work, cfg = sys.argv[1], sys.argv[2], eval(sys.argv[3])
    muts = eval(open(sys.argv[4]).read())
    tolerated = (MQStoreError, ValueError, UnicodeDecodeError, OverflowError, OSError, IndexError, KeyError)

    def attempt(what, fn):
        try:
            fn()
        except tolerated:
            pass

    def reads(store):
        for cq in list(store.consume_queues):
            offset = store.get_min_offset_in_queue(cq.topic, cq.queue_id)
            for _ in range(50):
                got = store.get_message("g", cq.topic, cq.queue_id, offset, 32)
                for m in got:
                    for field in ("topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp",
                                  "reconsume_times", "prepared_transaction_offset", "properties", "tags", "keys"):
                        attempt(field, lambda: getattr(m, field))
                    attempt("body", lambda: bytes(m.body))
                    attempt("decode", lambda: m.decode(check_crc=True))
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset
        for phy in range(0, min(store.get_max_phy_offset(), 4096), 1):
            attempt("look", lambda: store.look_message_by_offset(phy))
        for key in ("k0", "k1", "k2", "k3"):
            attempt("query", lambda: [bytes(m.body) for m in store.query_message("T0", key).messages])

    for i, (what, pos, patch) in enumerate(muts):
        print(i, what, flush=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        log = os.path.join(work, "commitlog", "0" * 20)
        with open(log, "r+b") as fh:
            fh.seek(pos)
            fh.write(patch)
        data = open(log, "rb").read()
        attempt("scan", lambda: scan_records(data, 0, 0, len(data), True))
        attempt("scan", lambda: scan_records(data, 0, 0, len(data), False))
        for at in range(0, 2048, 1):
            attempt("decode", lambda: decode_record(data, at, check_crc=False))
        parser = BatchParser()
        def parse():
            stop, reason, n = parser.cut(data, 0, len(data), 1 << 20)
            parser.parse(data, 0, 0, stop, n)
        attempt("reput", parse)
        def arrow():
            cols = BatchColumns()
            cols.add_span(RecordSource(0, len(data), [data]), 0, len(data))
            cols.buffers()
        attempt("arrow", arrow)
        attempt("check", lambda: check_store(work))
        if os.path.exists(os.path.join(src, "abort")) or i % 2:
            open(os.path.join(work, "abort"), "wb").close()  # abnormal recovery too
        try:
            store = MessageStore(work, **cfg)
        except MQStoreError:  # refused with a named cause (NotAStoreError, ...); never a crash or ValueError
            continue
        try:
            reads(store)
        finally:
            store.shutdown()
        attempt("check", lambda: check_store(work))
        for dirpath, dirnames, filenames in os.walk(os.path.dirname(work)):
            assert dirpath.startswith(work) or dirpath == os.path.dirname(work), dirpath
        escaped = sorted(set(os.listdir(os.path.dirname(work))) - {"work", "mutations.txt"})
        assert not escaped, f"files outside the store: {escaped}"
        for topic in os.listdir(os.path.join(work, "consumequeue")):
            assert topic.replace("%", "").replace("|", "").replace("_", "").replace("-", "").isalnum(), topic
    print("done", flush=True)
''')


@pytest.fixture(scope="module")
def source_store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("hostile") / "src")
    with MessageStore(root, **CFG) as store:
        for i in range(6):
            store.put_message(Message("T0", b"body-%d" % i, queue_id=i % 2, tags="A", keys=[f"k{i}"],
                                      properties={"p": "v"})).check()
        store.put_message(Message("T1", b"v6", born_host=("::1", 5))).check()
        store.put_messages(MessageBatch("T2", encode_batch_body([(b"x%d" % i, {"b": "1"}, 0) for i in range(3)])))
        assert store.wait_dispatched()
    return root


def test_the_minimal_input_that_crashed_scan_records_is_invalid_not_a_crash():
    """BODYLEN 0x7FFFFFFF in a 110-byte record wrapped the 32-bit length check."""
    from mqstore.log._scan import scan_records

    data = bytes.fromhex(
        "0000006edaa320a703dcefb700000005000000000000000244efe1ed000000de1e5274a2000000100000000000"
        "000000000000000000000000000000000000010000000200000000000000007f0000010000000100000000000000"
        "00000000007fffffff3106e4b8ade696870000")
    assert scan_records(data, 1048576, 0, 110, False) == (0, "invalid", 0, -1)


def test_hostile_field_values_never_crash_a_parser(source_store, tmp_path):
    path = os.path.join(source_store, "commitlog", "0" * 20)
    muts = _mutations(path)
    assert len(muts) > 300
    spec = tmp_path / "mutations.txt"
    spec.write_text(repr(muts))
    proc = subprocess.run([sys.executable, "-c", CHILD, source_store, str(tmp_path / "work"), repr(CFG), str(spec)],
                          capture_output=True, text=True, timeout=900)
    last = proc.stdout.strip().splitlines()[-1:] or ["(nothing)"]
    assert proc.returncode == 0, f"the parsers died ({proc.returncode}) at mutation {last[0]}:\n{proc.stderr[-3000:]}"
    assert last == ["done"]
    shutil.rmtree(tmp_path / "work", ignore_errors=True)


@pytest.mark.parametrize("bad_topic", [b"\x00/", b"..", b"\xff\xfe", b"a/"])
def test_a_record_whose_topic_cannot_be_a_queue_is_skipped_and_dispatch_goes_on(tmp_path, bad_topic):
    """Issue 15: a NUL in a topic made dispatch fail forever (WRITE_LOGICS_QUEUE_ERROR refused
    every later put in every process). A record whose queue cannot exist gets no unit, is
    counted and logged, and every other record is dispatched."""
    from mqstore.tools.checker import check_store

    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        for i in range(4):
            store.put_message(Message("T0" if i != 1 else "XY", b"m%d" % i)).check()
        assert store.wait_dispatched()
        victim = store.look_message_by_queue_offset("XY", 0, 0).physical_offset
    path = os.path.join(root, "commitlog", "0" * 20)
    data = open(path, "rb").read()
    at = data.index(b"\x02XY", victim)  # TOPICLEN then the topic
    with open(path, "r+b") as fh:
        fh.seek(at + 1)
        fh.write(bad_topic)
    shutil.rmtree(os.path.join(root, "consumequeue"))  # everything is dispatched again
    with MessageStore(root, **CFG) as store:
        assert store.stats()["dispatch_skipped_records"] == 1
        assert store.positions()["dispatched"] == store.get_max_phy_offset()
        assert [bytes(m.body) for m in store.get_message("g", "T0", 0, 0)] == [b"m0", b"m2", b"m3"]
        after = store.put_message(Message("T0", b"after")).check()  # puts are not refused
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("T0", 0) == after.queue_offset + 1
    assert sorted(os.listdir(os.path.join(root, "consumequeue"))) == ["T0"]
    check_store(root).raise_if_failed()


@pytest.mark.parametrize("lock", ["spin", "mutex"])
def test_a_new_owner_breaks_the_lock_of_a_writer_frozen_inside_it(tmp_path, caplog, monkeypatch, lock):
    """Issue 15: a writer stopped (SIGSTOP) inside the put lock kept a new owner waiting forever
    after a crash, logging nothing. The new owner waits a bounded time, kills the frozen
    holder (it must never resume writing into files that owner recovers) and says so."""
    import logging
    import signal
    import time

    from mqstore import store as store_module
    from mqstore.procs import stopped

    monkeypatch.setattr(store_module, "STOPPED_HOLDER_WAIT_S", 1.0)
    root = str(tmp_path / "s")
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from mqstore import Message, MessageStore
        store = MessageStore({root!r}, use_reentrant_lock_when_put_message={lock == 'mutex'}, **{CFG!r})
        for i in range(50):
            store.put_message(Message("T", b"m%d" % i)).check()
        print("ready", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    holder = None
    try:
        assert owner.stdout.readline().strip() == "ready"
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, signal
            from mqstore.log._shm import ControlBlock
            ctl = ControlBlock.attach({os.path.join(root, "mqstore.shm")!r})
            ctl.acquire_put_lock()            # a writer inside the lock ...
            os.kill(os.getpid(), signal.SIGSTOP)  # ... frozen there
        """)])
        deadline = time.monotonic() + 30
        while not stopped(holder.pid):
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.01)
        owner.kill()  # the owner crashes
        owner.wait()
        caplog.set_level(logging.ERROR, logger="mqstore.store")
        t0 = time.monotonic()
        with MessageStore(root, **CFG) as store:
            assert time.monotonic() - t0 < 20
            assert store.get_max_offset_in_queue("T", 0) == 50
            store.put_message(Message("T", b"after")).check()
        assert holder.wait(10) == -signal.SIGKILL
        assert any(f"pid {holder.pid}" in r.getMessage() and "stopped" in r.getMessage() for r in caplog.records)
    finally:
        for p in (owner, holder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    from mqstore.tools.checker import check_store

    check_store(root).raise_if_failed()
