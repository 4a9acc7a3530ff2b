"""The tier manifest and the tier queue index (tiered-storage spec §4.2–§4.4, §6.1, §6.2):
framing, the state machine, torn tails and bad records, compaction, recovery actions, the
copied-up-to mark, STORE_ID, the queue index against a brute-force list, and crash safety with
a real child process SIGKILLed at random moments."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_tier_manifest import FILE_SIZE, QUEUE_ID, TOPIC, expected_state, planned, queue_entry
from mqstore.errors import ManifestError, ManifestTransitionError, TierError
from mqstore.layout import log_base
from mqstore.queue.consume_queue import queue_problem
from mqstore.tier.manifest import (
    COPY_FINISHED, COPY_STARTED, DELETE_FINISHED, DELETE_STARTED, GAP, INDEX_COPY_FINISHED, INDEX_COPY_STARTED,
    INDEX_DELETE_FINISHED, INDEX_DELETE_STARTED, MANIFEST_NAME, MPU, SNAPSHOT_NAME, Manifest, Step,
    encode_record, load_state, records_of, recovery_actions, scan_records, store_id,
)
from mqstore.tier.queues import ENTRY_SIZE, QueueEntry, TierQueueIndex, drop_segment_entries, queue_index_path

S = 1 << 20  # file size used below


def uid(n: int) -> str:
    return f"{n:016x}"


def start(m: Manifest, n: int, file_no: int | None = None, log: int = 0) -> int:
    file_start = log_base(log) + (n if file_no is None else file_no) * S
    return m.copy_started(log=log, file_start=file_start, file_size=S, upload_id=uid(n), key=f"k{n}", created_ms=n)


def finish(m: Manifest, n: int) -> int:
    return m.copy_finished(uid(n), size=100 + n, data_crc32=n, footer_crc32=n + 1, first_store_ts=10 * n,
                           last_store_ts=10 * n + 9, record_count=5, queues=2, ms=n)


def copy(m: Manifest, n: int, file_no: int | None = None, log: int = 0) -> None:
    start(m, n, file_no, log)
    finish(m, n)


@pytest.fixture
def tdir(tmp_path):
    return str(tmp_path / "store" / "tier")


def log_path(tdir: str) -> str:
    return os.path.join(tdir, MANIFEST_NAME)


def every_op(m: Manifest) -> None:
    """One of each op: a segment copied and deleted, a segment copying with an MPU, an index
    object copied and deleted, a gap."""
    copy(m, 1, 0)
    start(m, 2, 1)
    m.mpu(uid(2), "mpu-2")
    m.delete_started(uid(1), ms=7)
    m.delete_finished(uid(1), ms=8)
    m.index_copy_started(log=0, name="20261202111111111", upload_id=uid(3), key="idx3", created_ms=3)
    m.index_copy_finished(uid(3), size=48, crc32=9, begin_ts=1, end_ts=2, ms=4)
    m.delete_started(uid(3), ms=5)
    m.delete_finished(uid(3), ms=6)
    m.gap(log=1, file_start=log_base(1), file_end=log_base(1) + S, reason="deleted before copy", ms=9)


# -- framing and round trips -------------------------------------------------------------------


def test_records_are_framed_as_the_spec_says_and_read_back(tdir):
    with Manifest(tdir) as m:
        every_op(m)
        state_before = m.state
    data = open(log_path(tdir), "rb").read()
    pos, seqs, ops = 0, [], []
    while pos < len(data):  # struct only, as spec §4.4's table
        length, crc, seq = struct.unpack_from(">IIQ", data, pos)
        body = data[pos + 16:pos + 16 + length]
        assert zlib.crc32(body) == crc
        ops.append(json.loads(body.decode("utf-8"))["op"])
        seqs.append(seq)
        pos += 16 + length
    assert pos == len(data)
    assert seqs == list(range(1, 12))
    assert ops == [COPY_STARTED, COPY_FINISHED, COPY_STARTED, MPU, DELETE_STARTED, DELETE_FINISHED,
                   INDEX_COPY_STARTED, INDEX_COPY_FINISHED, INDEX_DELETE_STARTED, INDEX_DELETE_FINISHED, GAP]
    loaded = load_state(tdir)
    assert loaded == state_before and loaded.last_seq == 11
    with Manifest(os.path.dirname(tdir)) as again:  # the store root works too
        assert again.state == state_before
        seg = again.state.segments(0)[1 * S]
        assert (seg.state, seg.mpu_id, seg.upload_id, seg.key, seg.created_ms) == (COPY_STARTED, "mpu-2", uid(2), "k2", 2)
        done = again.state.uploads[uid(1)]
        assert (done.state, done.size, done.data_crc32, done.footer_crc32, done.first_store_ts, done.last_store_ts,
                done.record_count, done.queues, done.finished_ms, done.delete_started_ms, done.delete_finished_ms) == \
            (DELETE_FINISHED, 101, 1, 2, 10, 19, 5, 2, 1, 7, 8)
        assert list(again.state.index_objects(0)) == ["20261202111111111"]
        assert [(g.log, g.file_start, g.reason) for g in again.state.gaps_of(1)] == [(1, log_base(1), "deleted before copy")]
        assert again.append(GAP, log=1, file_start=log_base(1) + S, file_end=log_base(1) + 2 * S, reason="x") == 12


def test_seqs_written_are_strictly_increasing_across_reopen(tdir):
    for n in range(4):
        with Manifest(tdir) as m:
            copy(m, n)
    assert [seq for seq, _ in records_of(tdir)] == list(range(1, 9))


def test_bad_fields_are_refused_before_anything_is_written(tdir):
    m = Manifest(tdir)
    cases = [
        (dict(op=COPY_STARTED, log=0, file_start=0, file_size=S, upload_id="XYZ", key="k", created_ms=0), "16 lower-case hex"),
        (dict(op=COPY_STARTED, log=0, file_start=0, file_size=S, upload_id=uid(1), created_ms=0), "'key'"),
        (dict(op=COPY_STARTED, log=0, file_start=0, file_size=S, upload_id=uid(1), key="k", created_ms=0, x=1), "'x'"),
        (dict(op=COPY_STARTED, log=0, file_start=-1, file_size=S, upload_id=uid(1), key="k", created_ms=0), "file_start"),
        (dict(op=COPY_STARTED, log=0, file_start=True, file_size=S, upload_id=uid(1), key="k", created_ms=0), "file_start"),
        (dict(op=COPY_STARTED, log=0, file_start=0, file_size=0, upload_id=uid(1), key="k", created_ms=0), "file_size is 0"),
        (dict(op=COPY_STARTED, log=99, file_start=0, file_size=S, upload_id=uid(1), key="k", created_ms=0), "log 99"),
        (dict(op="COPY_DONE", upload_id=uid(1)), "unknown manifest op 'COPY_DONE'"),
        (dict(op=GAP, log=0, file_start=S, file_end=S, reason="r"), "not past"),
        (dict(op="SNAPSHOT", upto=3), "unknown manifest op 'SNAPSHOT'"),
    ]
    for payload, words in cases:
        op = payload.pop("op")
        with pytest.raises(ManifestTransitionError, match=words):
            m.append(op, **payload)
    assert os.path.getsize(log_path(tdir)) == 0 and m.last_seq == 0
    start(m, 1)
    with pytest.raises(ManifestTransitionError, match="not a CRC-32"):
        m.copy_finished(uid(1), size=1, data_crc32=2**32, footer_crc32=0, first_store_ts=0, last_store_ts=0,
                        record_count=1, queues=1)
    m.close()
    with pytest.raises(TierError, match="closed"):
        start(m, 2)


# -- the state machine -------------------------------------------------------------------------

#: the states one upload can be in, and how to reach each from nothing
SEGMENT_PATHS = {
    "(none)": [],
    "COPY_STARTED": [COPY_STARTED],
    "COPY_STARTED with MPU": [COPY_STARTED, MPU],
    "COPY_FINISHED": [COPY_STARTED, COPY_FINISHED],
    "DELETE_STARTED": [COPY_STARTED, COPY_FINISHED, DELETE_STARTED],
    "DELETE_STARTED after a failed copy": [COPY_STARTED, DELETE_STARTED],
    "DELETE_FINISHED": [COPY_STARTED, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED],
}
LEGAL = {
    "(none)": {COPY_STARTED},
    "COPY_STARTED": {MPU, COPY_FINISHED, DELETE_STARTED},
    "COPY_STARTED with MPU": {COPY_FINISHED, DELETE_STARTED},
    "COPY_FINISHED": {DELETE_STARTED},
    "DELETE_STARTED": {DELETE_FINISHED},
    "DELETE_STARTED after a failed copy": {DELETE_FINISHED},
    "DELETE_FINISHED": set(),
}
INDEX_OF = {COPY_STARTED: INDEX_COPY_STARTED, COPY_FINISHED: INDEX_COPY_FINISHED, DELETE_STARTED: INDEX_DELETE_STARTED,
            DELETE_FINISHED: INDEX_DELETE_FINISHED, MPU: MPU}


def fields(op: str, n: int) -> dict:
    return {
        COPY_STARTED: dict(log=0, file_start=n * S, file_size=S, upload_id=uid(n), key=f"k{n}", created_ms=1),
        MPU: dict(upload_id=uid(n), mpu_id=f"mpu{n}"),
        COPY_FINISHED: dict(upload_id=uid(n), size=1, data_crc32=2, footer_crc32=3, first_store_ts=4, last_store_ts=5,
                            record_count=6, queues=7),
        DELETE_STARTED: dict(upload_id=uid(n)), DELETE_FINISHED: dict(upload_id=uid(n)),
        INDEX_COPY_STARTED: dict(log=0, name=f"{n:017d}", upload_id=uid(n), key=f"i{n}", created_ms=1),
        INDEX_COPY_FINISHED: dict(upload_id=uid(n), size=1, crc32=2, begin_ts=3, end_ts=4),
        INDEX_DELETE_STARTED: dict(upload_id=uid(n)), INDEX_DELETE_FINISHED: dict(upload_id=uid(n)),
    }[op]


@pytest.mark.parametrize("kind", ["segment", "index"])
def test_every_transition_legal_and_illegal(tdir, kind):
    m = Manifest(tdir)
    n = 0
    for state_name, path in SEGMENT_PATHS.items():
        for op in [COPY_STARTED, MPU, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED]:
            n += 1
            real = (lambda o: o) if kind == "segment" else INDEX_OF.__getitem__
            for step in path:
                m.append(real(step), **fields(real(step), n))
            size = os.path.getsize(log_path(tdir))
            if op in LEGAL[state_name]:
                m.append(real(op), **fields(real(op), n))
                assert m.state.uploads[uid(n)].state == (COPY_STARTED if op == MPU else op)
                continue
            with pytest.raises(ManifestTransitionError) as err:
                m.append(real(op), **fields(real(op), n))
            text = str(err.value)
            assert uid(n) in text, text
            old = state_name.split(" ")[0]
            assert old in text and (op in text), (state_name, op, text)
            assert os.path.getsize(log_path(tdir)) == size  # nothing written
    m.close()
    assert load_state(tdir).last_seq == m.last_seq


def test_an_op_of_the_other_kind_and_a_second_copy_of_a_file_are_refused(tdir):
    m = Manifest(tdir)
    m.index_copy_started(log=0, name="1" * 17, upload_id=uid(1), key="i")
    with pytest.raises(ManifestTransitionError, match=f"upload {uid(1)}: COPY_FINISHED names a segment .*index"):
        m.append(COPY_FINISHED, **fields(COPY_FINISHED, 1))
    start(m, 2, 0)
    with pytest.raises(ManifestTransitionError, match=f"upload {uid(3)}: .*while upload {uid(2)}.* is COPY_STARTED"):
        start(m, 3, 0)
    m.delete_started(uid(2))
    start(m, 3, 0)  # the failed copy is being deleted: the file may be copied again
    finish(m, 3)
    with pytest.raises(ManifestTransitionError, match="GAP .*covers upload .*COPY_FINISHED"):
        m.gap(log=0, file_start=0, file_end=S, reason="r")
    m.gap(log=0, file_start=5 * S, file_end=7 * S, reason="deleted before copy")
    with pytest.raises(ManifestTransitionError, match="inside the GAP"):
        start(m, 6)
    with pytest.raises(ManifestTransitionError, match="MPU in state COPY_FINISHED"):
        m.mpu(uid(3), "late")


# -- torn tails and bad records ----------------------------------------------------------------


def test_a_torn_last_record_is_cut_at_every_length(tdir):
    m = Manifest(tdir)
    every_op(m)
    m.close()
    whole = open(log_path(tdir), "rb").read()
    records, good, torn = scan_records(whole)
    last_len = len(encode_record(records[-1][0], records[-1][1]))
    base = len(whole) - last_len
    before = expected = None
    for cut in range(1, last_len):
        with open(log_path(tdir), "wb") as fh:
            fh.write(whole[:base + cut])
        reader = load_state(tdir)  # a reader leaves the file as it is
        assert reader.last_seq == 10 and os.path.getsize(log_path(tdir)) == base + cut
        if before is None:
            before = reader
        assert reader == before
        owner = Manifest(tdir)  # the owner cuts it
        assert os.path.getsize(log_path(tdir)) == base and owner.torn is not None
        owner.gap(log=1, file_start=log_base(1), file_end=log_base(1) + S, reason="again", ms=1)
        owner.close()
        expected = load_state(tdir)
        assert expected.last_seq == 11
    # a last record whose CRC fails, and zero-filled tails (a header of zeros has a matching CRC)
    flipped = bytearray(whole)
    flipped[-3] ^= 0x40
    for data, seq, size in ((bytes(flipped), 10, base), (whole + b"\0" * 4096, 11, len(whole)),
                            (whole + b"\0" * 5, 11, len(whole)), (whole + b"\0" * 16, 11, len(whole))):
        with open(log_path(tdir), "wb") as fh:
            fh.write(data)
        assert load_state(tdir).last_seq == seq
        with Manifest(tdir) as owner:
            assert owner.last_seq == seq and owner.torn is not None
        assert os.path.getsize(log_path(tdir)) == size


def test_a_bad_record_before_the_last_stops_the_load_naming_its_sequence_number(tdir):
    m = Manifest(tdir)
    every_op(m)
    m.close()
    whole = open(log_path(tdir), "rb").read()
    records, _, _ = scan_records(whole)
    offsets = [0]
    for seq, payload in records:
        offsets.append(offsets[-1] + len(encode_record(seq, payload)))
    for k in range(len(records) - 1):  # every record but the last
        seq = records[k][0]
        for at in (offsets[k] + 4, offsets[k] + 16, offsets[k + 1] - 1):  # CRC field, payload start, payload end
            bad = bytearray(whole)
            bad[at] ^= 0x01
            with open(log_path(tdir), "wb") as fh:
                fh.write(bad)
            for load in (load_state, Manifest):
                with pytest.raises(ManifestError, match=f"sequence number {seq} .*not a torn tail"):
                    load(tdir)
            assert open(log_path(tdir), "rb").read() == bytes(bad)  # nothing cut
    # a damaged length field before the last record: past the end, short of it, past the limit
    for k in range(len(records) - 1):
        seq = records[k][0]
        length = struct.unpack_from(">I", whole, offsets[k])[0]
        for new_length in (length ^ 1, length ^ 0x100, length + (len(whole) - offsets[k + 1]), length ^ 0x40000000,
                           length + len(whole)):
            bad = bytearray(whole)
            struct.pack_into(">I", bad, offsets[k], new_length)
            with open(log_path(tdir), "wb") as fh:
                fh.write(bad)
            with pytest.raises(ManifestError, match=f"sequence number {seq} .*not a torn tail"):
                Manifest(tdir)
            assert open(log_path(tdir), "rb").read() == bytes(bad)
    # a record whose CRC is right but whose JSON is not, before the last
    bad_json = framed(b"{not json", 2)
    with open(log_path(tdir), "wb") as fh:
        fh.write(whole[:offsets[1]] + bad_json + whole[offsets[1]:])
    with pytest.raises(ManifestError, match="sequence number 2 .*not UTF-8 JSON"):
        load_state(tdir)
    # a sequence number that does not increase
    with open(log_path(tdir), "wb") as fh:
        fh.write(whole + encode_record(3, {"op": GAP, "log": 2, "file_start": 0, "file_end": 1, "reason": "r"}))
    with pytest.raises(ManifestError, match="sequence number 3 .*does not follow sequence number 11"):
        load_state(tdir)
    # a record the state machine refuses
    with open(log_path(tdir), "wb") as fh:
        fh.write(whole + encode_record(12, {"op": COPY_FINISHED, **fields(COPY_FINISHED, 1)}))
    with pytest.raises(ManifestError, match=f"sequence number 12 is refused: upload {uid(1)}: DELETE_FINISHED → "
                                            "COPY_FINISHED"):
        load_state(tdir)


def framed(body: bytes, seq: int) -> bytes:
    return struct.pack(">IIQ", len(body), zlib.crc32(body), seq) + body


# -- compaction --------------------------------------------------------------------------------


def test_compaction_keeps_the_live_state_and_reloads_equal(tdir):
    m = Manifest(tdir, compact_bytes=3000)
    rng = random.Random(5)
    states = []
    for n in range(60):
        copy(m, n, n)
        if n >= 3 and rng.random() < 0.7:
            victim = n - 3
            if m.state.uploads[uid(victim)].state == COPY_FINISHED:
                m.delete_started(uid(victim))
                m.delete_finished(uid(victim))
        states.append((m.last_seq, m.state.live_json(), m.copied_upto(0)))
    assert m.compactions >= 3
    data = open(log_path(tdir), "rb").read()
    first = scan_records(data)[0][0]
    assert first[1]["op"] == "SNAPSHOT" and first[1]["upto"] == first[0]
    reloaded = load_state(tdir)
    assert reloaded == m.state
    assert reloaded.live_json() == states[-1][1] and reloaded.copied_upto(0) == states[-1][2] == 60 * S
    m.compact()
    m.close()
    with pytest.raises(TierError, match="owned by another Manifest"):
        with Manifest(tdir), Manifest(tdir):
            pass
    again = Manifest(tdir, compact_bytes=3000)
    assert again.state == m.state and again.copied_upto(0) == 60 * S
    assert not any(u.state == DELETE_FINISHED for u in again.state.uploads.values())
    assert os.path.getsize(log_path(tdir)) == len(encode_record(m.last_seq, {"op": "SNAPSHOT", "upto": m.last_seq}))


def test_a_crash_between_the_snapshot_rename_and_the_log_rename_loads_the_same(tdir):
    m = Manifest(tdir)
    for n in range(5):
        copy(m, n)
    m.delete_started(uid(0))
    m.delete_finished(uid(0))
    old_log = open(log_path(tdir), "rb").read()
    before = m.state.live_json()
    m.compact()
    m.close()
    with open(log_path(tdir), "wb") as fh:  # the old log again: the snapshot is newer
        fh.write(old_log)
    for name in (MANIFEST_NAME, SNAPSHOT_NAME):  # and leftovers of a compaction cut short
        with open(os.path.join(tdir, name + ".tmp"), "wb") as fh:
            fh.write(b"half")
    state = Manifest(tdir).state
    assert state.live_json() == before and state.last_seq == 12
    assert not os.path.exists(os.path.join(tdir, MANIFEST_NAME + ".tmp"))
    # a log compacted past its snapshot (the snapshot lost) is refused
    snap = open(os.path.join(tdir, SNAPSHOT_NAME), "rb").read()
    os.unlink(os.path.join(tdir, SNAPSHOT_NAME))
    with open(log_path(tdir), "wb") as fh:
        fh.write(encode_record(12, {"op": "SNAPSHOT", "upto": 12}))
    with pytest.raises(ManifestError, match="snapshot at sequence number 12"):
        load_state(tdir)
    with open(os.path.join(tdir, SNAPSHOT_NAME), "wb") as fh:
        fh.write(snap[:-1])
    with pytest.raises(ManifestError, match="not one whole SNAPSHOT record"):
        load_state(tdir)


# -- recovery actions --------------------------------------------------------------------------


def test_recovery_actions_for_each_crashed_state(tdir):
    m = Manifest(tdir)
    start(m, 1, 0)  # crashed before the MPU record (or a single PUT)
    start(m, 2, 1)
    m.mpu(uid(2), "mpu-2")  # crashed mid-upload
    copy(m, 3, 2)  # done: nothing to do
    copy(m, 4, 3)
    m.delete_started(uid(4))  # crashed during retention's delete
    start(m, 5, 4)
    m.mpu(uid(5), "mpu-5")
    m.delete_started(uid(5))  # crashed cleaning a failed copy: its MPU may still be open
    copy(m, 6, 5)
    m.delete_started(uid(6))
    m.delete_finished(uid(6))  # done
    m.index_copy_started(log=0, name="1" * 17, upload_id=uid(7), key="i7")
    m.index_copy_started(log=0, name="2" * 17, upload_id=uid(8), key="i8")
    m.index_copy_finished(uid(8), size=1, crc32=1, begin_ts=1, end_ts=1)
    m.delete_started(uid(8))
    got = {a.upload_id: a for a in recovery_actions(m.state)}
    assert list(got) == [uid(1), uid(2), uid(4), uid(5), uid(7), uid(8)]
    requeue = (Step.RECORD_DELETE_STARTED, Step.DELETE_OBJECT, Step.RECORD_DELETE_FINISHED, Step.DROP_QUEUE_ENTRIES,
               Step.REQUEUE)
    assert got[uid(1)].steps == requeue and got[uid(1)].mpu_id is None and got[uid(1)].file_start == 0
    assert got[uid(2)].steps == (Step.RECORD_DELETE_STARTED, Step.ABORT_MPU, *requeue[1:]) and got[uid(2)].mpu_id == "mpu-2"
    assert got[uid(4)].steps == (Step.DELETE_OBJECT, Step.RECORD_DELETE_FINISHED) and got[uid(4)].mpu_id is None
    assert got[uid(5)].steps == (Step.ABORT_MPU, Step.DELETE_OBJECT, Step.RECORD_DELETE_FINISHED)
    assert got[uid(7)].kind == "index" and got[uid(7)].index_name == "1" * 17
    assert got[uid(7)].steps == (Step.RECORD_DELETE_STARTED, Step.DELETE_OBJECT, Step.RECORD_DELETE_FINISHED,
                                 Step.REQUEUE)
    assert got[uid(8)].steps == (Step.DELETE_OBJECT, Step.RECORD_DELETE_FINISHED)
    assert (got[uid(2)].key, got[uid(2)].log, got[uid(2)].state) == ("k2", 0, COPY_STARTED)
    # carrying them out (the records; the network is the tierer's) leaves nothing to do
    for action in recovery_actions(m.state):
        for step in action.steps:
            if step == Step.RECORD_DELETE_STARTED:
                m.delete_started(action.upload_id)
            elif step == Step.RECORD_DELETE_FINISHED:
                m.delete_finished(action.upload_id)
    assert recovery_actions(m.state) == [] and recovery_actions(load_state(tdir)) == []
    start(m, 9, 0)  # the re-queued file, with a new upload id
    assert m.copied_upto(0) == 0


# -- copied_upto -------------------------------------------------------------------------------


def test_copied_upto_is_the_end_of_the_contiguous_copied_prefix(tdir):
    m = Manifest(tdir, compact_bytes=10**9)
    assert m.copied_upto(0) == 0 and m.copied_upto(3) == log_base(3)
    start(m, 10, 0)
    assert m.copied_upto(0) == 0
    finish(m, 10)
    assert m.copied_upto(0) == S
    copy(m, 12, 2)  # a hole at file 1
    assert m.copied_upto(0) == S
    start(m, 11, 1)  # being copied: still a hole
    assert m.copied_upto(0) == S
    m.delete_started(uid(11))
    m.delete_finished(uid(11))  # the copy failed
    assert m.copied_upto(0) == S
    start(m, 13, 1)
    finish(m, 13)
    assert m.copied_upto(0) == 3 * S
    m.gap(log=0, file_start=3 * S, file_end=5 * S, reason="deleted before copy")  # a gap counts as passed
    copy(m, 14, 5)
    assert m.copied_upto(0) == 6 * S
    m.delete_started(uid(10))
    m.delete_finished(uid(10))  # tier retention deleted a copied segment: still passed
    assert m.copied_upto(0) == 6 * S
    # another log, starting past its base (tiering switched on late), with a failed first file
    start(m, 20, 7, log=1)
    copy(m, 21, 8, log=1)
    assert m.copied_upto(1) == log_base(1) + 7 * S
    m.delete_started(uid(20))
    m.delete_finished(uid(20))
    assert m.copied_upto(1) == log_base(1) + 7 * S  # the failed file still holds it back
    m.compact()  # its DELETE_FINISHED uploads are dropped, the marks are kept
    assert m.copied_upto(0) == 6 * S and m.copied_upto(1) == log_base(1) + 7 * S
    assert load_state(tdir).copied_upto(1) == log_base(1) + 7 * S
    copy(m, 22, 7, log=1)
    assert m.copied_upto(1) == log_base(1) + 9 * S
    assert load_state(tdir).copied_upto(1) == log_base(1) + 9 * S


# -- STORE_ID ----------------------------------------------------------------------------------


def _store_id_child(tdir: str, out) -> None:  # a spawned process
    out.put(store_id(tdir))


def test_store_id_is_created_once(tdir):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_store_id_child, args=(tdir, out)) for _ in range(4)]
    for p in procs:
        p.start()
    ids = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(set(ids)) == 1 and len(ids[0]) == 32 and int(ids[0], 16) >= 0
    assert store_id(tdir) == ids[0] and sorted(os.listdir(tdir)) == ["STORE_ID"]
    with open(os.path.join(tdir, "STORE_ID"), "w") as fh:
        fh.write("not an id\n")
    with pytest.raises(TierError, match="not a store id"):
        store_id(tdir)


# -- the tier queue index ----------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["..", ".", "a/b", "", "a\0b", "x" * 256, "ü", "a b"])
def test_hostile_topic_names_are_refused_like_a_consumequeue_directory(tdir, topic):
    assert queue_problem(topic, 0) is not None
    with pytest.raises(TierError, match="no tier queue index for topic"):
        TierQueueIndex(tdir, topic, 0, writable=True)
    assert not os.path.exists(os.path.join(tdir, "queues"))


def test_queue_index_paths_are_the_consumequeue_names(tdir):
    assert queue_index_path(tdir, "%RETRY%g|1", 7) == os.path.join(tdir, "queues", "%RETRY%g|1", "7")
    for bad in (-1, 2**31, True):
        with pytest.raises(TierError):
            queue_index_path(tdir, "T", bad)


class Model:
    """The brute-force twin: a list of live entries."""

    def __init__(self) -> None:
        self.entries: list[QueueEntry] = []

    def find(self, qo):
        return next((e for e in self.entries if e.first_queue_offset <= qo < e.end_queue_offset), None)

    def find_after(self, qo):
        return next((e for e in self.entries if e.end_queue_offset > qo), None)

    def find_by_time(self, ts):
        if not self.entries:
            return None
        below = [e for e in self.entries if e.min_store_ts < ts]
        return below[-1] if below else self.entries[0]


ops_strategy = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.integers(1, 50), st.integers(0, 20), st.integers(1, 3)),
    st.tuples(st.just("retry"), st.integers(1, 50)),  # the last segment's entry again (a crashed copy)
    st.tuples(st.just("cut"), st.integers(0, 8)),
    st.tuples(st.just("drop_last"),),
    st.tuples(st.just("reopen"),),
    st.tuples(st.just("torn"), st.integers(1, ENTRY_SIZE - 1)),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=ops_strategy, probes=st.lists(st.integers(-5, 2000), min_size=1, max_size=12))
def test_queue_index_against_a_brute_force_list(tmp_path_factory, ops, probes):
    tdir = str(tmp_path_factory.mktemp("qi") / "tier")
    w = TierQueueIndex(tdir, "T", 1, writable=True)
    r = TierQueueIndex(tdir, "T", 1)  # a reader beside the writer
    model = Model()
    next_offset, next_file, next_ts = 0, 0, 0
    for op in ops:
        if op[0] == "append":
            _, gap, count, ts_step, file_step = op
            e = QueueEntry(next_offset + gap, count, 0, next_file * S, next_ts + ts_step)
            w.append(e)
            model.entries.append(e)
            next_offset, next_file, next_ts = e.end_queue_offset, next_file + file_step, e.min_store_ts
        elif op[0] == "retry" and model.entries:  # the last entry is live when any is (dead ones lead)
            last = model.entries[-1]
            e = QueueEntry(last.first_queue_offset, op[1], last.log, last.file_start, last.min_store_ts)
            w.append(e)  # replaces the last one
            model.entries[-1] = e
            next_offset = e.end_queue_offset
        elif op[0] == "cut":
            if model.entries:
                keep_from = model.entries[min(op[1], len(model.entries) - 1)].file_start
                dead = [e for e in model.entries if e.file_start < keep_from]
                assert w.cut_front(lambda e: e.file_start < keep_from) == len(dead)
                model.entries = [e for e in model.entries if e.file_start >= keep_from]
                on_disk = os.path.getsize(w.path) // ENTRY_SIZE
                assert (on_disk - len(model.entries)) * 2 <= on_disk  # more than half dead is rewritten
        elif op[0] == "drop_last":
            if model.entries:
                last = model.entries.pop()
                assert w.drop_segment(last.log, last.file_start) == 1
        elif op[0] == "reopen":
            w.close()
            w = TierQueueIndex(tdir, "T", 1, writable=True)
        elif op[0] == "torn":
            w.sync()
            with open(w.path, "ab") as fh:
                fh.write(b"\x7f" * op[1])
            assert r.entries() == model.entries  # the reader ignores it
            w.close()
            w = TierQueueIndex(tdir, "T", 1, writable=True)  # the writer cuts it
            assert os.path.getsize(w.path) % ENTRY_SIZE == 0
        assert r.entries() == w.entries() == model.entries
        assert len(r) == len(model.entries)
    for probe in probes:
        assert r.find(probe) == model.find(probe), probe
        assert r.find_after(probe) == model.find_after(probe), probe
        ts = probe * 3
        assert r.find_by_time(ts) == model.find_by_time(ts), ts
    assert r.min_offset() == (model.entries[0].first_queue_offset if model.entries else None)
    assert r.max_offset() == (model.entries[-1].end_queue_offset if model.entries else None)
    w.close()
    r.close()


def test_queue_index_refuses_entries_out_of_order_and_rewrites_when_half_is_dead(tdir):
    w = TierQueueIndex(tdir, "T", 0, writable=True)
    for i in range(10):
        w.append(QueueEntry(10 * i, 10, 0, i * S, i))
    with pytest.raises(TierError, match="does not follow"):
        w.append(QueueEntry(95, 10, 0, 10 * S, 9))
    with pytest.raises(TierError, match="does not follow"):
        w.append(QueueEntry(100, 10, 0, 8 * S, 9))
    with pytest.raises(TierError, match="record count >= 1"):
        w.append(QueueEntry(100, 0, 0, 10 * S, 9))
    r = TierQueueIndex(tdir, "T", 0)
    assert r.find(55).file_start == 5 * S
    ino = os.stat(w.path).st_ino
    assert w.cut_front(lambda e: e.file_start < 5 * S) == 5  # half: marked in place
    assert os.stat(w.path).st_ino == ino and os.path.getsize(w.path) == 10 * ENTRY_SIZE
    assert r.find(45) is None and r.find(55).file_start == 5 * S and r.min_offset() == 50
    assert w.cut_front(lambda e: e.file_start < 6 * S) == 1  # past half: rewritten
    assert os.path.getsize(w.path) == 4 * ENTRY_SIZE and not os.path.exists(w.path + ".tmp")
    assert r.min_offset() == 60 and r.find(65).file_start == 6 * S  # the reader follows the new file
    w.append(QueueEntry(100, 10, 0, 10 * S, 10))
    assert r.max_offset() == 110 and r.find(105).file_start == 10 * S
    other = TierQueueIndex(tdir, "U", 2, writable=True)
    other.append(QueueEntry(0, 1, 0, 10 * S, 10))
    other.sync()
    assert drop_segment_entries(tdir, 0, 10 * S) == 2
    assert r.max_offset() == 100 and TierQueueIndex(tdir, "U", 2).entries() == []
    with pytest.raises(TierError, match="not open for writing"):
        r.append(QueueEntry(200, 1, 0, 20 * S, 1))


# -- crash safety with a real process ----------------------------------------------------------


def _spawn(root: str, compact_bytes: int, max_seq: int) -> subprocess.Popen:
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.Popen([sys.executable, os.path.join(here, "helpers_tier_manifest.py"), root, str(compact_bytes),
                             str(max_seq)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path):
    seed = os.environ.get("MQSTORE_SEED", str(random.randrange(1 << 30)))
    print(f"MQSTORE_SEED={seed}")
    rng = random.Random(seed)
    root = str(tmp_path / "store")
    acked = {"M": 0, "Q": -1, "C": -1}
    max_seq, rounds, compact_bytes = 100_000, 10, 2048
    compactions_seen = 0
    for round_no in range(rounds):
        proc = _spawn(root, compact_bytes, max_seq)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        target = acked["M"] + rng.randint(1, 60)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                if any(line.startswith("M ") and int(line.split()[1]) >= target for line in list(lines)):
                    break
                time.sleep(0.001)
            assert proc.poll() is None, f"round {round_no}: the child ended: {proc.stderr.read()}"  # type: ignore[union-attr]
            time.sleep(rng.random() * 0.01)  # somewhere inside the next records
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            reader.join(30)
        for line in lines:
            if line.endswith("\n"):
                what, value = line.split()
                acked[what] = max(acked[what], int(value))
        assert acked["M"] >= target
        # every load succeeds and holds a prefix of the stream that contains every acknowledged record
        reader_view = load_state(root)
        with Manifest(root, compact_bytes=compact_bytes) as owner:
            state = owner.state
        k = state.last_seq
        assert acked["M"] <= k <= acked["M"] + 1, (seed, round_no, acked, k)
        assert reader_view == state  # a reader leaves the torn tail out as the owner cuts it
        assert state == expected_state(k), (seed, round_no, k)
        if scan_records(open(os.path.join(root, "tier", MANIFEST_NAME), "rb").read())[0][0][1]["op"] == "SNAPSHOT":
            compactions_seen += 1
        entries = TierQueueIndex(root, TOPIC, QUEUE_ID).entries()
        if not entries:  # before the first segment's entry
            assert acked["Q"] == -1 and not state.copied_segments(0), (seed, round_no, acked)
            continue
        first = entries[0].file_start // FILE_SIZE
        assert entries == [queue_entry(i) for i in range(first, first + len(entries))], (seed, round_no)
        last = first + len(entries) - 1
        assert acked["Q"] <= last <= k // 5, (seed, round_no, acked, last)  # nothing acked lost, nothing invented
        if acked["C"] >= 0:
            assert first >= acked["C"] - 1, (seed, round_no, acked, first)
        for seg in state.copied_segments(0):  # every COPY_FINISHED segment has its entry
            assert first <= seg.file_start // FILE_SIZE <= last, (seed, round_no, seg)
        assert planned(5 * last + 1)["upload_id"] in state.uploads  # no entry before its COPY_STARTED
    assert compactions_seen >= 1, seed
