"""What check_crc_on_read costs (issue 15 item 3): getMessage and a look-up through the public
API with the body CRC check on and off, over one store of 1 KiB bodies.

One store of CRC_MSGS messages of 1 KiB in one queue is written once per module (untimed) and
dispatched; every benchmark switches the setting on the running reader
(``store.reader.config = store.config.replace(check_crc_on_read=...)``) and then consumes the
whole queue with get_message batches of 32, taking per message either nothing (``results``:
what a broker forwarding record slices does) or a copy of the body (``bodies``: what a Python
consumer does), or looks up LOOKUPS random queue offsets. Compare the medians of the ``on``
and ``off`` rows of a kind: the difference is the check.

Run: ``python -m pytest bench/test_crc_on_read.py --benchmark-only -q``
"""

from __future__ import annotations

import random
import tempfile

import pytest

from bench._common import drain_queue, one_queue_store, record_rate
from mqstore.queue._search import CRC_FOLDED

CRC_MSGS = 50_000
LOOKUPS = 10_000
GROUP_GET = "get_message with check_crc_on_read, 50k x 1 KiB in one queue"
GROUP_LOOK = "look_message_by_queue_offset with check_crc_on_read, 10k x 1 KiB"
TOPIC = "CrcTopic"


@pytest.fixture(scope="module")
def crc_store(bench_root, bodies):
    store = one_queue_store(tempfile.mkdtemp(prefix="crc-store-", dir=bench_root), TOPIC, bodies["1KiB"], CRC_MSGS)
    yield store
    store.shutdown()


def consume_queue(get, take) -> int:
    """Read the whole queue with getMessage batches of 32; take(result) -> messages handled."""
    return drain_queue(get, TOPIC, take)


def take_bodies(res) -> int:
    n = 0
    for m in res:
        _body = bytes(m.body)  # a consumer that reads the body copies it out
        n += 1
    return n


def _set_check(store, on: bool) -> None:
    store.reader.config = store.config.replace(check_crc_on_read=on)
    assert store.reader.check_crc_on_read is on


@pytest.mark.benchmark(group=GROUP_GET)
@pytest.mark.parametrize("take", [len, take_bodies], ids=["results", "bodies"])
@pytest.mark.parametrize("check", [False, True], ids=["off", "on"])
def test_get_message_crc(benchmark, crc_store, check, take):
    _set_check(crc_store, check)
    name = "results" if take is len else "bodies"
    try:
        assert benchmark.pedantic(consume_queue, args=(crc_store.get_message, take), rounds=20,
                                  warmup_rounds=2) == CRC_MSGS
    finally:
        _set_check(crc_store, True)
    record_rate(benchmark, f"get_message/batch32-1KiB-{name}/crc-{'on' if check else 'off'}", CRC_MSGS,
                crc_folded=CRC_FOLDED)
    if not benchmark.disabled:
        benchmark.extra_info["us_per_get_median"] = round(benchmark.stats.stats.median / (CRC_MSGS / 32) * 1e6, 3)


@pytest.mark.benchmark(group=GROUP_LOOK)
@pytest.mark.parametrize("check", [False, True], ids=["off", "on"])
def test_look_message_by_queue_offset_crc(benchmark, crc_store, check):
    rng = random.Random(7)
    offsets = [rng.randrange(CRC_MSGS) for _ in range(LOOKUPS)]
    look = crc_store.look_message_by_queue_offset
    _set_check(crc_store, check)

    def run():
        for q in offsets:
            look(TOPIC, 0, q)

    try:
        benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    finally:
        _set_check(crc_store, True)
    record_rate(benchmark, f"look_message_by_queue_offset-1KiB/crc-{'on' if check else 'off'}", LOOKUPS,
                crc_folded=CRC_FOLDED)
    if not benchmark.disabled:
        benchmark.extra_info["us_per_lookup_median"] = round(benchmark.stats.stats.median / LOOKUPS * 1e6, 3)
