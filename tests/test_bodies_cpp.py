"""Bodies the real RocketMQ C++ client compressed (issue 26, point 6): the PyPI ``rocketmq`` client
zlib-compresses a body of 4 KiB or more and sets sysFlag bit 0; the store keeps those bytes, and
each of its readers hands the body out as the client sent it: read_messages / get_message
(bodies(), the views), an embedded consumer group, ``mqstore dump`` and the Arrow kernel, with
the stored bytes still there for whoever asks. The client runs in a child process as in
tests/test_broker_cpp.py (whose harness this uses)."""

from __future__ import annotations

import json
import random
import string
import zlib

from helpers_proc import wait_until
from test_broker_cpp import TOPIC_QUEUES, checked_broker, clients, msg, sent_ok  # noqa: F401 (clients: a fixture)

from mqstore import MessageStore
from mqstore.queue._arrow import BatchColumns
from mqstore.broker.consumer import GroupConsumer
from mqstore.queue.snapshot import StoreSnapshot
from mqstore.tools.cli import main
from mqstore.twin import arrow as twin_arrow

import pytest

pytestmark = pytest.mark.multiprocess


def _random_text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + string.digits + " \n") for _ in range(n))


def test_bodies_the_cpp_client_compressed_read_back_as_sent(tmp_path, clients, capsys):  # noqa: F811
    topic = "TopicBig"
    big = {f"big-{i}": _random_text(6000, i) for i in range(2)}
    steps = [msg(topic, body, op="sync", keys=name) for name, body in big.items()]
    steps.append(msg(topic, "small", op="sync", keys="small"))
    sent_by_text = {body.encode() for body in big.values()} | {b"small"}
    root = str(tmp_path / "store")
    with checked_broker(root) as broker:
        producer = clients("producer", "produce", group="PID_big", namesrv=broker.namesrv_address, steps=steps)
        producer.finish(60)
        sent_ok(producer)
        store = broker.store

        def everything() -> list:
            store.wait_dispatched()
            out = []
            for qid in range(TOPIC_QUEUES):
                got = store.read_messages(topic, qid, 0)
                out += [(qid, got)] if got.ok else []
            return out

        wait_until(lambda: sum(len(got) for _, got in everything()) == len(steps), 10, "every message stored")
        bodies, raw, flags, queues = set(), set(), [], []
        for qid, got in everything():
            queues.append(qid)
            bodies.update(got.bodies())
            raw.update(got.bodies(decompress=False))
            flags += [m.sys_flag for m in got]
            for m in got:
                assert bytes(m.body) == m.body_bytes() and bytes(m.raw_body) == m.body_bytes(decompress=False)
            capped = store.get_message("g", topic, qid, 0, 32)
            assert capped.bodies() == got.bodies()
        assert bodies == sent_by_text
        assert sum(f & 1 for f in flags) == 2, "the client compressed the two big bodies (and not the small one)"
        assert {zlib.decompress(b) for b in raw - {b"small"}} == {b.encode() for b in big.values()}
        assert all(len(b) < 6000 for b in raw)

        consumer_store = MessageStore.attach(broker.root)
        try:
            with GroupConsumer(consumer_store, "CID_big", topic) as consumer:
                assert {m.body_bytes() for m in consumer.messages(timeout_s=1)} == sent_by_text
        finally:
            consumer_store.shutdown()

    dumped = set()
    for qid in queues:
        assert main(["dump", root, "--topic", topic, "--queue", str(qid), "--count", "5", "--json",
                     "--body", "text"]) == 0
        for entry in json.loads(capsys.readouterr().out)["records"]:
            rec = entry["record"]
            dumped.add(rec["body"].encode())
            assert rec["body_inflated"] == (rec["body"] != "small") and rec["body_crc_ok"]
    assert dumped == sent_by_text

    with StoreSnapshot(root) as snap:
        found, stored = set(), set()
        for q in snap.queues():
            if not q.key.startswith(topic + "/"):
                continue
            for decompress, into in ((True, found), (False, stored)):
                cols = BatchColumns(["body", "sys_flag"], decompress=decompress)
                cols.add_units(snap.record_source(), snap.units(topic, q.queue_id, q.min_offset, q.max_offset),
                               snap.min_phy)
                into.update(r["body"] for r in twin_arrow.buffers_to_rows(cols.buffers(), cols.rows))
        assert found == sent_by_text and stored == raw
