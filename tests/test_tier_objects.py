"""mqstore.tier.objects against moto's real S3 server (a child process on 127.0.0.1) and through
a fault-injecting proxy: keys (spec §5.1), round trips, multipart, conditional create, STORE.json
fencing, and the errors and retries of §4.2 / §9."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from mqstore.errors import (ConfigError, NoSuchBucketError, ObjectAlreadyExistsError, ObjectNotFoundError,
                            ObjectStoreError, ObjectStoreTimeoutError, ObjectStoreUnavailableError, TierError)
from mqstore.tier.objects import (Backoff, ObjectStore, claim_store, index_key, manifest_key, new_upload_id,
                                  parse_segment_key, prefix_of, segment_key, store_key)
from tests.helpers_s3 import FaultProxy, S3Bucket, bucket, s3_proxy, s3_server  # noqa: F401

MiB = 1024 * 1024
FAST = Backoff(initial_ms=20, max_ms=80, attempts=5)  # Kafka's shape, test-sized


def _body(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


class _Sleeps:
    """A sleep hook that records the waits and can run an action at the first one (a fault
    healed exactly between the first and the second try: no timing in the test)."""

    def __init__(self, on_first: object = None) -> None:
        self.waits: list[float] = []
        self.on_first = on_first

    def __call__(self, seconds: float) -> None:
        if not self.waits and callable(self.on_first):
            self.on_first()
        self.waits.append(seconds)
        time.sleep(seconds)


# ------------------------------------------------------------------------------------------------
# keys and back-off (no server)


def test_keys_follow_the_spec_layout(bucket: S3Bucket) -> None:
    cfg = bucket.config()
    prefix = prefix_of(cfg)
    assert prefix == "212d6b50_DefaultCluster/broker-a"  # md5("DefaultCluster")[0:8], RocketMQ 5's getHash
    assert prefix_of(bucket.config(object_store_prefix="tiers/prod", broker_cluster_name="c-2",
                                   broker_name="b_1")) == "tiers/prod/caf9334c_c-2/b_1"
    uid = new_upload_id()
    assert len(uid) == 16 and int(uid, 16) >= 0 and uid == uid.lower() and new_upload_id() != uid
    seg = segment_key(prefix, 0, 1 << 30, uid)
    assert seg == f"{prefix}/seg/0/00000000001073741824.{uid}.mqseg"
    assert parse_segment_key(prefix, seg) == (0, 1 << 30, uid)
    parsed = parse_segment_key(prefix, segment_key(prefix, 3, 7, uid))
    assert parsed is not None and (parsed.log, parsed.file_start, parsed.upload_id) == (3, 7, uid)
    assert parse_segment_key(prefix, store_key(prefix)) is None
    assert parse_segment_key("other/prefix", seg) is None
    assert index_key(prefix, 1, "20261202111111123", uid) == f"{prefix}/idx/1/20261202111111123.{uid}.mqidx"
    assert manifest_key(prefix, 42) == f"{prefix}/manifest/00000000000000000042.json"
    assert store_key(prefix) == f"{prefix}/STORE.json"
    with pytest.raises(ValueError, match="16 lower-case hex"):
        segment_key(prefix, 0, 0, "ABCDEF0123456789")
    with pytest.raises(ValueError, match="17 digits"):
        index_key(prefix, 0, "2026", uid)


def test_backoff_is_kafkas() -> None:
    backoff = Backoff()
    assert (backoff.initial_ms, backoff.max_ms, backoff.jitter, backoff.attempts) == (500, 30_000, 0.2, 5)
    rng = random.Random(7)
    for retry, base in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (7, 30.0), (20, 30.0)):
        delays = [backoff.delay_s(retry, rng) for _ in range(200)]
        assert all(base * 0.8 <= d <= base * 1.2 for d in delays), (retry, min(delays), max(delays))
        assert max(delays) - min(delays) > base * 0.2  # jittered, not fixed
    with pytest.raises(ValueError):
        Backoff(attempts=0)


# ------------------------------------------------------------------------------------------------
# round trips


def test_put_get_range_head_list_delete(bucket: S3Bucket) -> None:
    store = ObjectStore(bucket.config(), backoff=FAST)
    uid = new_upload_id()
    key = segment_key(store.prefix, 0, 0, uid)
    body = _body(MiB + 333)
    info = store.put(key, body)
    assert (info.key, info.size, info.multipart) == (key, len(body), False)
    assert store.get(key) == body
    for start, length in ((0, 1), (0, 64), (4096, 65536), (len(body) - 64, 64), (12345, len(body) - 12345)):
        assert store.get_range(key, start, length) == body[start:start + length]
    head = store.head(key)
    assert (head.key, head.size, head.e_tag) == (key, len(body), info.e_tag)
    assert store.exists(key)

    other = segment_key(store.prefix, 0, 1 << 20, new_upload_id())
    store.put(other, memoryview(body)[:1000])
    store.put(store_key(store.prefix), b"{}")
    listed = store.list(f"{store.prefix}/seg/")
    assert [(o.key, o.size) for o in listed] == sorted([(key, len(body)), (other, 1000)])
    assert all(o.last_modified.tzinfo is not None for o in listed)
    assert {o.key for o in store.list(store.prefix)} == {key, other, store_key(store.prefix)}
    assert store.list(f"{store.prefix}/idx") == []
    assert sorted(bucket.keys()) == sorted([key, other, store_key(store.prefix)])  # boto3 agrees

    store.delete(key)
    store.delete(key)  # 404 counts as deleted
    assert not store.exists(key)
    with pytest.raises(ObjectNotFoundError, match=f"get s3://{bucket.name}/{key}: 404 no such key") as err:
        store.get(key)
    assert (err.value.operation, err.value.key) == ("get", key)
    assert isinstance(err.value, TierError) and not err.value.retryable
    with pytest.raises(ObjectNotFoundError, match="head"):
        store.head(key)


def test_async_ranged_reads(bucket: S3Bucket) -> None:
    store = ObjectStore(bucket.config(), backoff=FAST)
    key = f"{store.prefix}/seg/0/x"
    body = _body(2 * MiB, seed=1)
    store.put(key, body)
    ranges = [(i * 65536, 65536) for i in range(0, 32, 3)] + [(len(body) - 10, 10)]

    async def read_all() -> list[bytes]:
        return await asyncio.gather(*(store.get_range_async(key, s, n) for s, n in ranges))

    assert asyncio.run(read_all()) == [body[s:s + n] for s, n in ranges]
    with pytest.raises(ObjectNotFoundError):
        asyncio.run(store.get_range_async(key + "-missing", 0, 10))


def test_a_range_past_the_end_names_both_sizes(bucket: S3Bucket) -> None:
    store = ObjectStore(bucket.config(), backoff=FAST)
    key = f"{store.prefix}/small"
    store.put(key, b"x" * 100)
    with pytest.raises(ObjectStoreError, match=r"get bytes 90\.\.110 of .*small: returned 10 of 20 bytes"):
        store.get_range(key, 90, 20)
    with pytest.raises(ValueError, match="bad range"):
        store.get_range(key, 0, 0)


def test_multipart_above_the_part_size(bucket: S3Bucket) -> None:
    """5 MiB parts (S3's minimum; moto enforces it) of an 11 MiB object: 3 parts, bytes equal,
    no multipart upload left; up to the part size it is one PutObject."""
    store = ObjectStore(bucket.config(tiered_store_upload_concurrency=2), backoff=FAST, part_size=5 * MiB)
    body = _body(11 * MiB, seed=2)
    key = f"{store.prefix}/seg/0/big"
    info = store.put(key, body)
    assert info.multipart and info.size == len(body)
    assert info.e_tag is not None and info.e_tag.strip('"').endswith("-3")
    assert store.get(key) == body
    assert store.get_range(key, 5 * MiB - 10, 20) == body[5 * MiB - 10:5 * MiB + 10]

    # parts streamed from a factory (what the tierer does: the segment built part by part)
    chunks = [body[i:i + 700_000] for i in range(0, len(body), 700_000)]
    streamed = store.put(f"{key}-streamed", lambda: iter(chunks), size=len(body))
    assert streamed.multipart and streamed.size == len(body)
    assert store.get(f"{key}-streamed") == body

    exact = store.put(f"{key}-exact", body[:5 * MiB])
    assert not exact.multipart and exact.e_tag is not None and "-" not in exact.e_tag
    assert bucket.multipart_uploads() == []


def test_conditional_create(bucket: S3Bucket) -> None:
    store = ObjectStore(bucket.config(), backoff=FAST)
    key = manifest_key(store.prefix, 7)
    store.create(key, b"first")
    with pytest.raises(ObjectAlreadyExistsError, match=f"create s3://{bucket.name}/{key}: already exists"):
        store.create(key, b"second")
    assert store.get(key) == b"first"


# ------------------------------------------------------------------------------------------------
# STORE.json fencing (spec §5.1, T10)


def test_store_json_fences_a_prefix_to_one_store(bucket: S3Bucket) -> None:
    cfg = bucket.config(commit_log_count=2, mapped_file_size_commit_log=MiB)
    first, second = os.urandom(16).hex(), os.urandom(16).hex()
    made = claim_store(cfg, first, now_ms=1234)
    assert made == {"store_id": first, "created_ms": 1234, "logs": 2, "mapped_file_size_commit_log": MiB}
    assert claim_store(cfg, first) == made  # the owner again: accepted, STORE.json unchanged
    with pytest.raises(ConfigError) as err:
        claim_store(cfg, second)
    assert first in str(err.value) and second in str(err.value)
    assert f"s3://{bucket.name}/{prefix_of(cfg)}/" in str(err.value)
    # another broker name is another prefix: its own STORE.json
    assert claim_store(bucket.config(broker_name="broker-b"), second)["store_id"] == second
    assert sorted(k for k in bucket.keys() if k.endswith("STORE.json")) == sorted(
        [store_key(prefix_of(cfg)), store_key(prefix_of(bucket.config(broker_name="broker-b")))])

    ObjectStore(cfg).put(store_key(prefix_of(cfg)), b"not json")
    with pytest.raises(ConfigError, match="is not a STORE.json"):
        claim_store(cfg, first)


def test_no_such_bucket_is_named_and_not_retried(bucket: S3Bucket) -> None:
    sleeps = _Sleeps()
    store = ObjectStore(bucket.config(object_store_bucket="no-such-bucket-here"), backoff=FAST, sleep=sleeps)
    with pytest.raises(NoSuchBucketError, match="put s3://no-such-bucket-here/k: no such bucket"):
        store.put("k", b"x")
    assert sleeps.waits == []
    with pytest.raises(ConfigError, match="object_store_bucket is empty"):
        ObjectStore(bucket.config(object_store_bucket=""))


# ------------------------------------------------------------------------------------------------
# faults through the proxy (spec §9, T6)


def test_refused_connections_are_retried_then_succeed(bucket: S3Bucket, s3_proxy: FaultProxy) -> None:
    cfg = bucket.config(endpoint=s3_proxy.endpoint)
    s3_proxy.refuse()
    sleeps = _Sleeps(on_first=lambda: s3_proxy.refuse(False))
    store = ObjectStore(cfg, backoff=FAST, sleep=sleeps)
    body = _body(300_000, seed=3)
    store.put(f"{store.prefix}/a", body)
    assert len(sleeps.waits) == 1  # one refused try, healed, one good try
    assert store.get(f"{store.prefix}/a") == body

    s3_proxy.refuse()
    failing = ObjectStore(cfg, backoff=Backoff(initial_ms=10, max_ms=20, attempts=3))
    with pytest.raises(ObjectStoreUnavailableError, match=r"get s3://.*/a: connection refused.*gave up after 3 tries"):
        failing.get(f"{store.prefix}/a")


def test_503_bursts_are_retried_without_duplicates(bucket: S3Bucket, s3_proxy: FaultProxy) -> None:
    sleeps = _Sleeps()
    store = ObjectStore(bucket.config(endpoint=s3_proxy.endpoint), backoff=FAST, sleep=sleeps)
    key = segment_key(store.prefix, 0, 0, new_upload_id())
    body = _body(200_000, seed=4)
    s3_proxy.fail_next(3)
    store.put(key, body)
    assert s3_proxy.s.answered_503 == 3 and len(sleeps.waits) == 3
    assert all(0.016 <= w <= 0.096 for w in sleeps.waits)  # FAST's back-off: 20, 40, 80 ms +-20 %
    s3_proxy.fail_next(2)
    assert store.get(key) == body
    assert bucket.keys(store.prefix) == [key]  # one object, whatever the retries

    s3_proxy.fail_next(10)
    few = ObjectStore(bucket.config(endpoint=s3_proxy.endpoint), backoff=Backoff(initial_ms=5, max_ms=5, attempts=2))
    with pytest.raises(ObjectStoreUnavailableError, match=r"head s3://.*: 503 Service Unavailable.*after 2 tries") as err:
        few.head(key)
    assert err.value.retryable and err.value.cause.startswith("503")


def test_a_failed_part_aborts_its_upload_and_the_retry_completes(bucket: S3Bucket, s3_proxy: FaultProxy) -> None:
    """A 503 on part 2 of a multipart upload: obstore aborts that upload, the retry makes a new
    one; afterwards one object with the right bytes and no multipart upload left."""
    sleeps = _Sleeps()
    store = ObjectStore(bucket.config(endpoint=s3_proxy.endpoint, tiered_store_upload_concurrency=1),
                        backoff=FAST, sleep=sleeps, part_size=5 * MiB)
    body = _body(11 * MiB, seed=6)
    key = segment_key(store.prefix, 0, 0, new_upload_id())
    s3_proxy.fail_next(1, match=b"partNumber=2")
    info = store.put(key, body)
    assert s3_proxy.s.answered_503 == 1 and len(sleeps.waits) == 1 and info.multipart
    assert store.get(key) == body
    assert bucket.keys(store.prefix) == [key]
    assert bucket.multipart_uploads() == []


def test_a_hung_server_times_out_at_the_request_timeout(bucket: S3Bucket, s3_proxy: FaultProxy) -> None:
    cfg = bucket.config(endpoint=s3_proxy.endpoint, object_store_request_timeout_ms=1000)
    store = ObjectStore(cfg, backoff=Backoff(initial_ms=10, max_ms=10, attempts=2))
    key = f"{store.prefix}/h"
    store.put(key, b"hello")
    s3_proxy.hang()
    started = time.monotonic()
    with pytest.raises(ObjectStoreTimeoutError,
                       match=rf"get s3://{bucket.name}/{key}: timed out \(object_store_request_timeout_ms=1000\)"):
        store.get(key)
    took = time.monotonic() - started
    assert 2 * 0.95 <= took < 20, took  # two tries of 1 s each (generous upper bound: a loaded machine)
    assert s3_proxy.s.hung >= 2
    s3_proxy.hang(False)
    assert store.get(key) == b"hello"


def test_a_response_cut_short_is_detected_and_retried(bucket: S3Bucket, s3_proxy: FaultProxy) -> None:
    body = _body(MiB, seed=5)
    direct = ObjectStore(bucket.config(), backoff=FAST)
    key = f"{direct.prefix}/cut"
    direct.put(key, body)
    once = ObjectStore(bucket.config(endpoint=s3_proxy.endpoint), backoff=Backoff(attempts=1))
    s3_proxy.cut_next(64 * 1024)
    with pytest.raises(ObjectStoreUnavailableError, match=r"get s3://.*/cut: connection dropped \(response cut short"):
        once.get(key)
    s3_proxy.cut_next(300_000)
    with pytest.raises(ObjectStoreUnavailableError, match="cut short"):
        once.get_range(key, 1000, 500_000)

    sleeps = _Sleeps()
    retried = ObjectStore(bucket.config(endpoint=s3_proxy.endpoint), backoff=FAST, sleep=sleeps)
    s3_proxy.cut_next(10_000, count=2)
    assert retried.get(key) == body
    assert s3_proxy.s.cut == 4 and len(sleeps.waits) == 2
