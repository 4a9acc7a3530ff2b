"""The tierer's copy loop (mqstore.tier.service.Tierer, tiered-storage spec §4.1–§4.3) against
moto's S3 server: a real MessageStore's closed files copied one per pass, each object parsed and
compared byte for byte with its file, the manifest and the tier queue index checked against the
bucket and the ConsumeQueues; a 503 burst failing a copy that the next pass redoes with a new
upload id; a tierer SIGKILLed between COPY_STARTED and COPY_FINISHED cleaned by the next one."""

from __future__ import annotations

import os
import random
import signal
import struct
import time
from typing import Any

import pytest

from mqstore import Message, MessageStore
from mqstore.layout import BLANK_MAGIC_CODE, CONTROL_BLOCK_NAME
from mqstore.tier._segment import parse_footer, parse_trailer
from mqstore.tier.manifest import COPY_FINISHED, COPY_STARTED, DELETE_FINISHED, load_state
from mqstore.tier.objects import Backoff, ObjectStore, parse_segment_key, prefix_of
from mqstore.tier.queues import TierQueueIndex, iter_queue_indexes
from mqstore.tier.service import Tierer
from tests.helpers_proc import run_in_child
from tests.helpers_s3 import FaultProxy, S3Bucket, bucket, s3_proxy, s3_server  # noqa: F401

FILE_SIZE = 256 * 1024
FAST = Backoff(initial_ms=5, max_ms=20, attempts=3)
TOPICS = ("TopicA", "TopicB", "TopicC")


def fill(root: str, cfg: Any, n: int = 700, seed: int = 28) -> MessageStore:
    """A threads-mode store of small files: puts and batches over 3 topics × 4 queues, all
    flushed and dispatched; left open (its control block is what the tierer reads)."""
    store = MessageStore(root, cfg)
    rnd = random.Random(seed)
    for i in range(n):
        topic, qid = rnd.choice(TOPICS), rnd.randrange(4)
        body = rnd.randbytes(rnd.randrange(64, 3000))
        if i % 40 == 9:
            store.put_messages([Message(topic, body[:200] + bytes([j]), queue_id=qid) for j in range(4)]).check()
        else:
            store.put_message(Message(topic, body, queue_id=qid, tags="t")).check()
    store.flush()
    store.wait_dispatched()
    return store


def closed_files(store: MessageStore) -> int:
    """How many files are closed: those below the write position (the allocator may have
    created the next ones already)."""
    return store.ctl.get("wrote") // FILE_SIZE


def run_until_copied(tierer: Tierer, closed: int, passes: int = 40) -> None:
    for _ in range(passes):
        tierer.run_once()
        if len(load_state(tierer.root).copied_segments(0)) == closed:
            return
    raise AssertionError(f"{closed} closed files not copied in {passes} passes: {load_state(tierer.root).uploads}")


def index_entries(root: str) -> int:
    """How many entries the tier queue indexes hold."""
    total = 0
    for topic, qid, _path in iter_queue_indexes(root):
        with TierQueueIndex(root, topic, qid) as index:
            total += len(index)
    return total


def cq_units(root: str) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(topic, queue id) -> [(queue offset, physical offset)] read from the ConsumeQueue files."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    cq_root = os.path.join(root, "consumequeue")
    for topic in os.listdir(cq_root):
        for qid in os.listdir(os.path.join(cq_root, topic)):
            rows = []
            for name in sorted(os.listdir(os.path.join(cq_root, topic, qid))):
                with open(os.path.join(cq_root, topic, qid, name), "rb") as fh:
                    b = fh.read()
                for j in range(0, len(b) - 19, 20):
                    phy, size, _tags = struct.unpack_from(">qiq", b, j)
                    if size > 0 and phy >= 0:
                        rows.append((int(name) // 20 + j // 20, phy))
            out[(topic, int(qid))] = rows
    return out


def check_tier(root: str, cfg: Any, s3: S3Bucket) -> list[str]:
    """Every segment object parses, its records are the local file's byte for byte, the
    manifest names it COPY_FINISHED with its size and CRCs, every object has a manifest entry,
    and the tier queue indexes hold exactly the ConsumeQueue units of the copied files. The
    copied upload ids."""
    prefix = prefix_of(cfg)
    state = load_state(root)
    copied = {s.file_start: s for s in state.copied_segments(0)}
    keys = s3.keys(prefix + "/seg/")
    assert sorted(s.key for s in copied.values()) == sorted(keys), "objects without a COPY_FINISHED, or the reverse"
    for key in keys:
        parsed = parse_segment_key(prefix, key)
        assert parsed is not None
        seg = copied[parsed.file_start]
        assert seg.upload_id == parsed.upload_id and seg.state == COPY_FINISHED
        obj = s3.s3.get_object(Bucket=s3.name, Key=key)["Body"].read()
        trailer = parse_trailer(obj[-64:])
        footer = parse_footer(obj[trailer.data_len:trailer.data_len + trailer.footer_len], trailer)
        assert (seg.size, seg.data_crc32, seg.footer_crc32, seg.record_count) == (
            len(obj), trailer.data_crc, trailer.footer_crc, trailer.record_count)
        assert trailer.file_start == parsed.file_start == seg.file_start and seg.file_size == FILE_SIZE
        with open(os.path.join(root, "commitlog", f"{seg.file_start:020d}"), "rb") as fh:
            file = fh.read()
        covered = 0
        for i in range(trailer.record_count):
            file_pos, data_pos = struct.unpack_from(">II", footer.phy_index, 8 * i)
            size = struct.unpack_from(">i", file, file_pos)[0]
            assert obj[data_pos:data_pos + size] == file[file_pos:file_pos + size]
            covered += size
        assert covered == trailer.data_len == trailer.valid_len
        assert struct.unpack_from(">i", file, trailer.valid_len + 4)[0] == BLANK_MAGIC_CODE  # ends at the blank
    # the tier queue indexes against the ConsumeQueues
    ends = {s.file_start: s.file_end for s in copied.values()}
    want: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for q, rows in cq_units(root).items():
        picked = [(qo, start) for qo, phy in rows for start, end in ends.items() if start <= phy < end]
        if picked:
            want[q] = picked
    got: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for topic, qid, _path in iter_queue_indexes(root):
        with TierQueueIndex(root, topic, qid) as index:
            got[(topic, qid)] = [(e.first_queue_offset + k, e.file_start)
                                 for e in index.entries() for k in range(e.record_count)]
    assert got == want
    return [s.upload_id for s in copied.values()]


@pytest.fixture
def store_cfg(bucket: S3Bucket) -> dict[str, Any]:
    return {"mapped_file_size_commit_log": FILE_SIZE, "max_message_size": 16 * 1024}


def test_every_closed_file_is_copied_once_and_matches(tmp_path: Any, bucket: S3Bucket, store_cfg: dict) -> None:
    root = str(tmp_path / "store")
    cfg = bucket.config(**store_cfg)
    store = fill(root, cfg)
    try:
        closed = closed_files(store)
        assert closed >= 4
        with Tierer(root, store.config, store.ctl, objects=ObjectStore(store.config, backoff=FAST)) as tierer:
            first = tierer.run_once()
            assert len(first.copied) == 1 and first.copied[0].file_start == 0   # one file per log per pass
            run_until_copied(tierer, closed)
            last = tierer.run_once()
            assert not last.copied and not last.failed and "not closed" in last.waiting[0]
            assert tierer.copied_upto(0) == closed * FILE_SIZE                  # the open file is not copied
        check_tier(root, store.config, bucket)
        assert bucket.keys(prefix_of(cfg) + "/STORE.json")
        # more puts close the open file: the next pass copies it and nothing else
        rnd = random.Random(5)
        while closed_files(store) == closed:
            store.put_message(Message("TopicA", rnd.randbytes(2000), queue_id=1)).check()
        store.flush()
        store.wait_dispatched()
        with Tierer(root, store.config, store.ctl, objects=ObjectStore(store.config, backoff=FAST)) as tierer:
            report = tierer.run_once()
            assert [c.file_start for c in report.copied] == [closed * FILE_SIZE] and not report.recovered
        check_tier(root, store.config, bucket)
    finally:
        store.shutdown()


def test_upload_delay_holds_a_closed_file_back(tmp_path: Any, bucket: S3Bucket, store_cfg: dict) -> None:
    root = str(tmp_path / "store")
    cfg = bucket.config(tiered_store_upload_delay_ms=3_600_000, **store_cfg)
    store = fill(root, cfg, n=250)
    try:
        with Tierer(root, store.config, store.ctl) as tierer:
            report = tierer.run_once()
            assert not report.copied and "closed less than" in report.waiting[0]
            later = tierer.run_once(now_ms=int(time.time() * 1000) + 3_700_000)
            assert [c.file_start for c in later.copied] == [0]
    finally:
        store.shutdown()


def test_with_a_slave_connected_only_confirmed_bytes_are_copied(tmp_path: Any, bucket: S3Bucket,
                                                                 store_cfg: dict) -> None:
    """spec §4.1: never tier bytes a slave does not have (the store's own control block, its HA
    cells set as a connected slave would)."""
    root = str(tmp_path / "store")
    store = fill(root, bucket.config(**store_cfg), n=450)
    try:
        assert closed_files(store) >= 2
        store.ctl.set("ha_slaves", 1)
        with Tierer(root, store.config, store.ctl) as tierer:
            report = tierer.run_once()
            assert not report.copied and "confirmed" in report.waiting[0]
            store.ctl.advance("confirmed", FILE_SIZE + 10)
            assert [c.file_start for c in tierer.run_once().copied] == [0]
            report = tierer.run_once()
            assert not report.copied and "confirmed" in report.waiting[0]
            store.ctl.set("ha_slaves", 0)                                   # no slave: confirmed is not waited for
            assert [c.file_start for c in tierer.run_once().copied] == [FILE_SIZE]
    finally:
        store.ctl.set("ha_slaves", 0)
        store.shutdown()


def test_a_damaged_file_is_refused_before_anything_is_recorded(tmp_path: Any, bucket: S3Bucket,
                                                                store_cfg: dict) -> None:
    root = str(tmp_path / "store")
    store = fill(root, bucket.config(**store_cfg), n=250)
    try:
        path = os.path.join(root, "commitlog", f"{0:020d}")
        with open(path, "r+b") as fh:
            second = struct.unpack(">i", fh.read(4))[0]
            fh.seek(second + 4)
            fh.write(b"\x00\x00\x00\x00")                                   # the second record's magic
        with Tierer(root, store.config, store.ctl) as tierer:
            report = tierer.run_once()
            (failed,) = report.failed
            assert failed.upload_id is None and f"file position {second}" in (failed.error or "")
            assert not load_state(root).uploads and not bucket.keys(prefix_of(store.config) + "/seg/")
    finally:
        store.shutdown()


def test_a_503_burst_fails_a_copy_and_the_next_pass_redoes_it(tmp_path: Any, bucket: S3Bucket,
                                                               s3_proxy: FaultProxy, store_cfg: dict) -> None:
    root = str(tmp_path / "store")
    cfg = bucket.config(endpoint=s3_proxy.endpoint, **store_cfg)
    store = fill(root, cfg, n=400)
    try:
        closed = closed_files(store)
        assert closed >= 2
        with Tierer(root, store.config, store.ctl, objects=ObjectStore(store.config, backoff=FAST)) as tierer:
            s3_proxy.fail_next(1, match=b"PUT ")                          # retried within the copy
            assert len(tierer.run_once().copied) == 1 and s3_proxy.s.answered_503 == 1
            s3_proxy.fail_next(FAST.attempts, match=b"PUT ")
            report = tierer.run_once()
            assert not report.copied and len(report.failed) == 1 and "503" in (report.failed[0].error or "")
            failed = report.failed[0]
            assert s3_proxy.s.answered_503 == 1 + FAST.attempts
            upload = load_state(root).uploads[failed.upload_id]
            assert upload.state == DELETE_FINISHED and not upload.copied
            assert failed.key not in bucket.keys()
            assert tierer.copied_upto(0) == FILE_SIZE                         # the failed file holds it back
            again = tierer.run_once()
            assert [c.file_start for c in again.copied] == [failed.file_start]
            assert again.copied[0].upload_id != failed.upload_id
            run_until_copied(tierer, closed)
        assert failed.upload_id not in check_tier(root, store.config, bucket)
    finally:
        store.shutdown()


def _tierer_killed_at(root: str, cfg_keys: dict[str, Any], kill_at: str) -> None:
    """A child process: a Tierer on the store's control block (attached read-only, as a service
    process would) that SIGKILLs itself at kill_at, after writing a marker file."""
    from mqstore.config import StoreConfig
    from mqstore.log._shm import ControlBlock

    ctl = ControlBlock.attach(os.path.join(root, CONTROL_BLOCK_NAME), readonly=True)
    original = getattr(Tierer, kill_at)

    def hooked(self: Tierer, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        with open(os.path.join(root, "killed-at"), "w") as fh:
            fh.write(kill_at)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(Tierer, kill_at, hooked)
    Tierer(root, StoreConfig(**cfg_keys), ctl, objects=ObjectStore(StoreConfig(**cfg_keys), backoff=FAST)).run_once()


@pytest.mark.parametrize("kill_at", ["_put", "_write_queue_entries"])
def test_a_tierer_killed_mid_copy_is_cleaned_by_the_next(tmp_path: Any, bucket: S3Bucket, store_cfg: dict,
                                                         kill_at: str) -> None:
    root = str(tmp_path / "store")
    keys = {"tiered_storage_level": "NOT_IN_DISK", "object_store_bucket": bucket.name,
            "object_store_endpoint": bucket.endpoint, "object_store_allow_http": True, **store_cfg}
    store = fill(root, bucket.config(**store_cfg), n=300)
    try:
        assert run_in_child(_tierer_killed_at, root, keys, kill_at, timeout_s=60) == -signal.SIGKILL
        with open(os.path.join(root, "killed-at")) as fh:
            assert fh.read() == kill_at
        (crashed,) = load_state(root).uploads.values()
        assert crashed.state == COPY_STARTED and crashed.file_start == 0
        assert bucket.keys(crashed.key) == [crashed.key]                       # uploaded, never finished
        if kill_at == "_write_queue_entries":
            assert index_entries(root) > 0
        with Tierer(root, store.config, store.ctl, objects=ObjectStore(store.config, backoff=FAST)) as tierer:
            assert [a.upload_id for a in tierer.recover()] == [crashed.upload_id]
            assert index_entries(root) == 0
            assert crashed.key not in bucket.keys()
            report = tierer.run_once()
            assert not report.recovered
            assert [c.file_start for c in report.copied] == [0] and report.copied[0].upload_id != crashed.upload_id
        assert load_state(root).uploads[crashed.upload_id].state == DELETE_FINISHED
        assert crashed.key not in bucket.keys()
        assert crashed.upload_id not in check_tier(root, store.config, bucket)
    finally:
        store.shutdown()
