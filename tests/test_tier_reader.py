"""The tier reader (tiered-storage spec §6.4, §7.1, §7.2) against moto's S3 server: a real
store's closed files uploaded as segments (with the manifest and tier queue index records the
tierer writes), then every read compared with the store's own, byte for byte, and the GETs of
each read counted."""

from __future__ import annotations

import os
import random
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from mqstore import Message, MessageStore
from mqstore.errors import CorruptSegmentError, ObjectStoreError
from mqstore.log._codec import check_record
from mqstore.tier._segment import SegmentBuilder, parse_segment
from mqstore.tier.manifest import Manifest
from mqstore.tier.objects import Backoff, ObjectStore, new_upload_id, segment_key
from mqstore.tier.queues import QueueEntry, TierQueueIndex
from mqstore.tier.reader import TierReader
from tests.helpers_s3 import FaultProxy, S3Bucket, bucket, s3_proxy, s3_server  # noqa: F401

FAST = Backoff(initial_ms=20, max_ms=80, attempts=3)
FILE_SIZE = 256 * 1024
TOPICS = ["TopicA", "TopicB", "%RETRY%gr"]
QUEUES = 3
BODY_OFFSET = 88  # BODY of a v1 record with IPv4 hosts (BODYLENGTH at 84)


def valid_length(file: bytes) -> int:
    """Where the file's records end (its END_OF_FILE blank or zeros)."""
    pos = 0
    while pos + 8 <= len(file):
        size, ok = check_record(file, pos, check_crc=False, read_body=False)
        if not ok or size <= 0:
            break
        pos += size
    return pos


def upload_closed_files(root: str, objects: ObjectStore, log: int = 0) -> list[str]:
    """What the tierer does for each closed CommitLog file (docs/tiering.md): COPY_STARTED, the
    segment put, the tier queue index entries synced, COPY_FINISHED. The keys, in file order."""
    cl = os.path.join(root, "commitlog")
    names = sorted(os.listdir(cl))[:-1]  # the last file is the one being written
    keys = []
    with Manifest(root) as manifest:
        for name in names:
            with open(os.path.join(cl, name), "rb") as fh:
                file = fh.read()
            start = int(name)
            seg = SegmentBuilder(file, start, log, valid_length(file))
            upload_id = new_upload_id()
            key = segment_key(objects.prefix, log, start, upload_id)
            manifest.copy_started(log=log, file_start=start, file_size=len(file), upload_id=upload_id, key=key)
            objects.put(key, b"".join(seg.parts(1 << 20)))
            queues = [g for g in seg.directory if not g.no_queue]
            for g in queues:
                with TierQueueIndex(root, g.topic.decode(), g.queue_id, writable=True) as index:
                    index.append(QueueEntry(g.first_queue_offset, g.record_count, log, start, g.min_store_timestamp))
                    index.sync()
            manifest.copy_finished(upload_id, size=seg.size, data_crc32=seg.data_crc, footer_crc32=seg.footer_crc,
                                   first_store_ts=seg.first_store_timestamp, last_store_ts=seg.last_store_timestamp,
                                   record_count=seg.record_count, queues=len(queues))
            keys.append(key)
    return keys


@dataclass
class Tiered:
    root: str
    store: Any
    objects: ObjectStore
    keys: list[str]
    bucket: S3Bucket

    def reader(self, endpoint: str | None = None, **keys: Any) -> TierReader:
        cfg = self.bucket.config(endpoint=endpoint, **keys)
        return TierReader(self.root, cfg, ObjectStore(cfg, backoff=FAST))


@pytest.fixture
def tiered(tmp_path: Any, bucket: S3Bucket) -> Any:
    """A threads-mode store of 256 KiB files: single puts and batches over three topics × three
    queues, bodies of 0..3 KiB and zlib-compressed ones of 5..12 KiB payloads (sysFlag bit 0, as
    the C++ client stores bodies over 4 KiB); every closed file uploaded."""
    root = str(tmp_path / "store")
    store = MessageStore(root, mapped_file_size_commit_log=FILE_SIZE, max_message_size=64 * 1024)
    rnd = random.Random(2028)
    try:
        for i in range(700):
            topic, qid = rnd.choice(TOPICS), rnd.randrange(QUEUES)
            if i % 9 == 4:
                payload = (b"tiered body %d " % i) * rnd.randrange(400, 1000)
                store.put_message(Message(topic, zlib.compress(payload, 5), queue_id=qid, sys_flag=1,
                                          keys=f"k{i}")).check()
            elif i % 40 == 11:
                store.put_messages([Message(topic, rnd.randbytes(200) + bytes([j]), queue_id=qid)
                                    for j in range(4)]).check()
            else:
                store.put_message(Message(topic, rnd.randbytes(rnd.randrange(3000)), queue_id=qid, tags="t")).check()
        store.flush()
        assert store.wait_dispatched()
        objects = ObjectStore(bucket.config(), backoff=FAST)
        keys = upload_closed_files(root, objects)
        assert len(keys) >= 4
        yield Tiered(root, store, objects, keys, bucket)
    finally:
        store.shutdown()


def read_all(reader: TierReader, topic: str, qid: int, max_count: int = 1000) -> tuple[int, list[bytes], int]:
    """(first offset, every record, calls) of a queue read through get_messages from 0."""
    first = reader.min_offset(topic, qid)
    assert first is not None
    got: list[bytes] = []
    offset, calls = first, 0
    while calls < 10_000:
        res = reader.get_messages(topic, qid, offset, max_count)
        if res is None:
            break
        assert res.first_offset == offset and res.next_offset == offset + len(res) and len(res) >= 1
        got.extend(bytes(r) for r in res.records)
        offset, calls = res.next_offset, calls + 1
    return first, got, calls


def test_every_message_of_every_queue_reads_back_byte_for_byte(tiered: Tiered) -> None:
    with tiered.reader() as reader:
        total = compressed = 0
        for topic in TOPICS:
            for qid in range(QUEUES):
                first, got, calls = read_all(reader, topic, qid)
                assert first == tiered.store.get_min_offset_in_queue(topic, qid) == 0
                assert len(got) == reader.max_offset(topic, qid)
                want = [bytes(b) for b in tiered.store.read_messages(topic, qid, first, len(got)).buffers()]
                assert got == want
                assert calls <= len(tiered.keys)  # one call per segment at these sizes
                total += len(got)
                compressed += sum(1 for r in got if struct.unpack_from(">i", r, 36)[0] & 1)
        assert total > 500 and compressed > 40
        # batches smaller than a segment's group, and the size threshold
        for max_count in (1, 7, 64):
            _first, got, _calls = read_all(reader, "TopicA", 1, max_count)
            assert got == [bytes(b) for b in tiered.store.read_messages("TopicA", 1, 0, len(got)).buffers()]
    with tiered.reader(read_ahead_message_size_threshold=5000) as small:
        res = small.get_messages("TopicB", 2, 3, 1000)
        assert res is not None and 1 <= len(res) and (len(res) == 1 or sum(len(r) for r in res.records) <= 5000)
        _first, got, _calls = read_all(small, "TopicB", 2)
        assert got == [bytes(b) for b in tiered.store.read_messages("TopicB", 2, 0, len(got)).buffers()]
    # offsets past the tier, queues it never held
    with tiered.reader() as reader:
        end = reader.max_offset("TopicA", 0)
        assert end is not None and reader.get_messages("TopicA", 0, end) is None
        assert reader.get_messages("NoSuchTopic", 0, 0) is None and reader.min_offset("NoSuchTopic", 0) is None


def test_look_message_by_offset_for_every_record(tiered: Tiered) -> None:
    with tiered.reader() as reader:
        phys = []
        for topic in TOPICS:
            for qid in range(QUEUES):
                n = reader.max_offset(topic, qid) or 0
                res = tiered.store.read_messages(topic, qid, 0, n)
                phys.extend(zip(res.physical_offsets, (bytes(b) for b in res.buffers())))
        assert len(phys) > 500
        with ThreadPoolExecutor(4) as pool:  # the GETs overlap; each answer checked below
            got = list(pool.map(reader.look_message_by_offset, [p for p, _ in phys]))
        for (phy, want), rec in zip(phys, got):
            assert rec is not None and rec.physical_offset == phy and bytes(rec.record) == want, phy
            assert bytes(tiered.store.look_message_by_offset(phy).buffer) == want
        # not a record start, and past the tier
        assert reader.look_message_by_offset(phys[0][0] + 1) is None
        last = max(p for p, _ in phys)
        assert reader.look_message_by_offset(last + 10 * FILE_SIZE) is None


def test_offset_by_time_agrees_with_the_store(tiered: Tiered) -> None:
    with tiered.reader() as reader:
        checked = 0
        for topic in TOPICS:
            for qid in range(QUEUES):
                n = reader.max_offset(topic, qid) or 0
                views = list(tiered.store.read_messages(topic, qid, 0, n))
                stamps = sorted({v.store_timestamp for v in views})
                for ts in [stamps[0] - 1000, *stamps, *(s + 1 for s in stamps)]:
                    want = tiered.store.get_offset_in_queue_by_time(topic, qid, ts)
                    if want <= n:  # the local record after the tier's last one takes part
                        nxt = tiered.store.get_message_store_timestamp(topic, qid, n)  # -1: none
                        got = reader.offset_by_time(topic, qid, ts, next_store_ts=nxt if nxt >= 0 else None)
                        assert got == want, (topic, qid, ts)
                        checked += 1
                # without the local record: the tier's last record is the nearest
                assert reader.offset_by_time(topic, qid, stamps[-1] + 10**6) == n - 1
        assert checked > 300
        assert reader.offset_by_time("NoSuchTopic", 1, 0) is None
        assert reader.earliest_time() == tiered.store.get_earliest_message_time()


def test_get_counts_cold_and_warm(tiered: Tiered) -> None:
    """§6.4: a batch read is footer + data cold, one GET warm; a phy look-up footer + phy index
    + record cold, two warm; a time look-up at most one data GET warm; min offset and earliest
    time none."""
    with tiered.reader() as reader:
        assert reader.get_messages("TopicA", 0, 0, 16) is not None and reader.gets == 2
        assert reader.get_messages("TopicA", 0, 5, 16) is not None and reader.gets == 3
        assert reader.get_messages("TopicB", 1, 0, 16) is not None and reader.gets == 4  # same segment
        assert len(reader.footers) == 1
        reader.min_offset("TopicC", 0), reader.earliest_time(), reader.max_offset("TopicA", 0)
        assert reader.gets == 4
        phy = tiered.store.read_messages("TopicA", 0, 0, 1).physical_offsets[0]
        assert reader.look_message_by_offset(phy) is not None and reader.gets == 6  # warm: 2
        last_key_phy = int(tiered.keys[-1].rsplit("/", 1)[1].split(".")[0])  # the last segment: cold
        assert reader.look_message_by_offset(last_key_phy) is not None and reader.gets == 9
        before = reader.gets
        ts = tiered.store.read_messages("TopicA", 0, 3, 1)[0].store_timestamp
        reader.offset_by_time("TopicA", 0, ts)
        assert reader.gets - before <= 1
    # a footer longer than the first tail GET: two footer GETs, the same records
    with tiered.reader() as ref, TierReader(tiered.root, tiered.bucket.config(), tiered.objects,
                                            footer_guess=100) as short:
        a, b = ref.get_messages("%RETRY%gr", 2, 0, 50), short.get_messages("%RETRY%gr", 2, 0, 50)
        assert a is not None and b is not None and short.gets == 3
        assert [bytes(r) for r in a.records] == [bytes(r) for r in b.records]
    # the cache is bounded by bytes, least recently used out first
    with tiered.reader() as big:
        read_all(big, "TopicA", 0)
        costs = [big.footers.get(k).cost for k in tiered.keys]  # type: ignore[union-attr]
        assert len(big.footers) == len(tiered.keys) and big.footers.bytes == sum(costs)
    cap = max(costs) * 5 // 2
    with TierReader(tiered.root, tiered.bucket.config(), tiered.objects, footer_cache_bytes=cap) as small:
        for topic in TOPICS:
            read_all(small, topic, 0)
        assert 0 < small.footers.bytes <= cap and 1 <= len(small.footers) <= 2
        assert tiered.keys[-1] in small.footers and tiered.keys[0] not in small.footers  # the oldest went first
        before = small.gets
        small.get_messages("TopicA", 0, 0, 1)  # an evicted footer is fetched again
        assert small.gets == before + 2


def test_damaged_objects_raise_naming_the_record_and_never_return_it(tiered: Tiered) -> None:
    key = tiered.keys[1]
    obj = bytearray(tiered.objects.get(key))
    trailer, footer = parse_segment(bytes(obj))
    g = next(x for x in footer.groups if not x.no_queue and x.record_count >= 4)
    pos = g.data_start
    for _ in range(2):  # the group's third record
        pos += struct.unpack_from(">i", obj, pos)[0]
    assert struct.unpack_from(">i", obj, pos + 84)[0] > 8
    phy = struct.unpack_from(">q", obj, pos + 28)[0]
    bad = g.first_queue_offset + 2
    obj[pos + BODY_OFFSET + 3] ^= 0x40
    tiered.bucket.s3.put_object(Bucket=tiered.bucket.name, Key=key, Body=bytes(obj))
    topic = g.topic.decode()
    with tiered.reader() as reader:
        res = reader.get_messages(topic, g.queue_id, g.first_queue_offset, 10)
        assert res is not None and res.next_offset == bad and len(res) == 2  # the batch ends before it
        with pytest.raises(CorruptSegmentError, match=rf"{key}.*offset {bad} .*fails its body CRC"):
            reader.get_messages(topic, g.queue_id, bad, 10)
        with pytest.raises(CorruptSegmentError, match=rf"{key}.*physical offset {phy} .*body CRC"):
            reader.look_message_by_offset(phy)
        assert reader.get_messages(topic, g.queue_id, bad + 1, 1) is not None  # the rest still reads
    # a damaged footer: refused before any record is read
    obj2 = bytearray(tiered.objects.get(tiered.keys[2]))
    t2, _f2 = parse_segment(bytes(obj2))
    obj2[t2.data_len + 3] ^= 0x01
    tiered.bucket.s3.put_object(Bucket=tiered.bucket.name, Key=tiered.keys[2], Body=bytes(obj2))
    first_of_file = int(tiered.keys[2].rsplit("/", 1)[1].split(".")[0])
    with tiered.reader() as reader, pytest.raises(CorruptSegmentError, match=rf"{tiered.keys[2]}.*footer CRC"):
        reader.look_message_by_offset(first_of_file)
    # a well-formed object whose trailer CRCs are not the ones the manifest recorded
    obj3 = bytearray(tiered.objects.get(tiered.keys[3]))
    t3 = len(obj3) - 64
    struct.pack_into(">I", obj3, t3 + 48, struct.unpack_from(">I", obj3, t3 + 48)[0] ^ 1)
    struct.pack_into(">I", obj3, t3 + 56, zlib.crc32(bytes(obj3[t3:t3 + 56])))
    tiered.bucket.s3.put_object(Bucket=tiered.bucket.name, Key=tiered.keys[3], Body=bytes(obj3))
    third = int(tiered.keys[3].rsplit("/", 1)[1].split(".")[0])
    with tiered.reader() as reader, pytest.raises(CorruptSegmentError, match="not the object that was copied"):
        reader.look_message_by_offset(third)
    # a cut object: the GET of its tail passes its end, an error naming the key and the range
    cut = tiered.objects.get(tiered.keys[0])[:-1]
    tiered.bucket.s3.put_object(Bucket=tiered.bucket.name, Key=tiered.keys[0], Body=cut)
    with tiered.reader() as reader, pytest.raises(ObjectStoreError, match=rf"{tiered.keys[0]}.*passes the object"):
        reader.get_messages("TopicA", 0, 0)
    assert trailer.record_count > 0


def test_phy_lookups_across_fences(tmp_path: Any, bucket: S3Bucket) -> None:
    """A file of > 8192 records (three phy fences): the records on either side of each fence,
    whose sizes come from the next fence, and a sample of the rest."""
    root = str(tmp_path / "store")
    store = MessageStore(root, mapped_file_size_commit_log=1 << 20, max_message_size=64 * 1024)
    try:
        body = b"x" * 20
        for i in range(120):
            store.put_messages([Message("Tiny", body + bytes([j]), queue_id=i % 2) for j in range(80)]).check()
        store.flush()
        assert store.wait_dispatched()
        objects = ObjectStore(bucket.config(), backoff=FAST)
        keys = upload_closed_files(root, objects)
        assert keys
        _t, footer = parse_segment(objects.get(keys[0]))
        assert len(footer.fences) >= 3
        phys = [p for q in range(2) for p in store.read_messages("Tiny", q, 0, 10_000).physical_offsets if p < 1 << 20]
        phys.sort()
        picks = {phys[k] for k in (0, 4095, 4096, 4097, 8191, 8192, len(phys) - 1)}
        picks |= set(random.Random(7).sample(phys, 60))
        with TierReader(root, bucket.config(), objects) as reader:
            for phy in sorted(picks):
                got = reader.look_message_by_offset(phy)
                assert got is not None and bytes(got.record) == bytes(store.look_message_by_offset(phy).buffer)
    finally:
        store.shutdown()


def test_concurrent_reads_of_one_range_share_one_get(tiered: Tiered, s3_proxy: FaultProxy) -> None:
    with tiered.reader(endpoint=s3_proxy.endpoint) as reader:
        s3_proxy.latency(0.4)  # every GET in flight long enough for all eight threads to join it
        barrier = threading.Barrier(8, timeout=30)
        results: list[list[bytes]] = []
        errors: list[BaseException] = []

        def read() -> None:
            try:
                barrier.wait()
                res = reader.get_messages("TopicA", 2, 0, 40)
                assert res is not None
                results.append([bytes(r) for r in res.records])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads)
        assert len(results) == 8 and all(r == results[0] for r in results) and results[0]
        assert reader.gets == 2 and s3_proxy.s.requests == 2  # one footer GET, one data GET
        want = [bytes(b) for b in tiered.store.read_messages("TopicA", 2, 0, 40).buffers()]
        assert results[0] == want[:len(results[0])]
