"""A stateful hypothesis test of the whole store: random sequences of puts, batch puts, reads,
file rolls, flushes, retention runs, clean reopens and SIGKILLs with recovery, against a model
of what was acknowledged; the invariant checker runs after every step.

The store is owned by a real child process (``CHILD``: one JSON command per line on stdin, one
JSON answer per line on stdout), so a kill is a real SIGKILL of the owner and a reopen a real
recovery. The store flushes synchronously (SYNC_FLUSH), so every acknowledged message must
survive a kill; retention (``clean``: a manual delete with file_reserved_time=0) removes whole
CommitLog files, after which the model drops what lies below each queue's new min offset.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqstore.tools.checker import check_store
from mqstore.config import StoreConfig

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TOPICS = ("TA", "TB")
QUEUES = 2
CONFIG = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 400,
    "max_message_size": 32 * 1024,
    "flush_disk_type": "SYNC_FLUSH",
    "file_reserved_time": 0,
    "delete_commit_log_files_interval": 0,
    "max_hash_slot_num": 256,
    "max_index_num": 4096,
    "topic_queue_table_slots": 64,
}

CHILD = textwrap.dedent("""
    import json, sys
    from mqstore import Message, MessageStore
    store = MessageStore(sys.argv[1], **json.loads(sys.argv[2]))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "put":
            r = store.put_message(Message(cmd["topic"], cmd["body"].encode(), queue_id=cmd["qid"],
                                          keys=cmd["body"]))
            out = {"status": r.status.name, "offset": r.queue_offset}
        elif op == "put_batch":
            r = store.put_messages([Message(cmd["topic"], b.encode(), queue_id=cmd["qid"]) for b in cmd["bodies"]])
            out = {"status": r.status.name, "offset": r.queue_offset, "count": r.msg_num}
        elif op == "get":
            store.wait_dispatched()
            r = store.get_message("g", cmd["topic"], cmd["qid"], cmd["offset"], cmd["n"])
            out = {"status": r.status.name, "bodies": [bytes(m.body).decode() for m in r],
                   "offsets": [m.queue_offset for m in r], "min": store.get_min_offset_in_queue(cmd["topic"], cmd["qid"]),
                   "max": store.get_max_offset_in_queue(cmd["topic"], cmd["qid"])}
        elif op == "key":
            store.wait_dispatched()
            r = store.query_message(cmd["topic"], cmd["key"], 32, 0, 2**62)
            out = {"bodies": [bytes(m.body).decode() for m in r.messages]}
        elif op == "flush":
            out = {"flushed": bool(store.flush())}
        elif op == "clean":
            store.wait_dispatched()
            store.flush()
            store.execute_delete_files_manually()
            report = store.cleaner.clean_once()
            low = {}
            for t in cmd["topics"]:
                for q in range(cmd["queues"]):
                    # the first message a consumer still gets: a queue none of whose units points
                    # at or after the log's new min offset keeps its min offset (RocketMQ's
                    # correctMinOffset finds no unit to move it to), yet its messages are gone
                    r = store.get_message("g", t, q, store.get_min_offset_in_queue(t, q), 1)
                    first = [m.queue_offset for m in r]
                    low[f"{t}/{q}"] = first[0] if first else store.get_max_offset_in_queue(t, q)
            out = {"deleted": report.commitlog_files_deleted, "min": low}
        elif op == "shutdown":
            store.shutdown()
            print(json.dumps({"ok": True}), flush=True)
            break
        print(json.dumps(out), flush=True)
""")


class Owner:
    """The child process that owns the store."""

    def __init__(self, root: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, root, json.dumps(CONFIG)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the owner died (exit {self.proc.poll()})"
        return line

    def ask(self, **cmd: object) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def shutdown(self) -> None:
        self.ask(op="shutdown")
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


bodies = st.text(alphabet="abcdefghij", min_size=1, max_size=40)
topics = st.sampled_from(TOPICS)
queue_ids = st.integers(0, QUEUES - 1)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="mq-stateful-")
        self.root = os.path.join(self.dir, "store")
        self.owner: Owner | None = Owner(self.root)
        #: (topic, qid) -> {queue offset: body} of acknowledged messages not removed by retention
        self.model: dict[tuple[str, int], dict[int, str]] = {}
        self.next_offset: dict[tuple[str, int], int] = {}
        self.serial = 0
        self.keyed: set[tuple[str, int, int]] = set()  # (topic, qid, offset) put with KEYS = the body

    def teardown(self) -> None:
        if self.owner is not None and self.owner.proc.poll() is None:
            self.owner.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _body(self, text: str) -> str:
        self.serial += 1
        return f"{text}-{self.serial}"

    def _acked(self, topic: str, qid: int, offset: int, body: str) -> None:
        key = (topic, qid)
        assert offset == self.next_offset.get(key, 0), f"queue offsets of {key} must follow each other"
        self.model.setdefault(key, {})[offset] = body
        self.next_offset[key] = offset + 1

    @rule(topic=topics, qid=queue_ids, text=bodies)
    def put(self, topic: str, qid: int, text: str) -> None:
        assert self.owner is not None
        body = self._body(text)
        r = self.owner.ask(op="put", topic=topic, qid=qid, body=body)
        assert r["status"] == "PUT_OK", r
        self._acked(topic, qid, r["offset"], body)
        self.keyed.add((topic, qid, r["offset"]))

    @rule(topic=topics, qid=queue_ids, texts=st.lists(bodies, min_size=1, max_size=8))
    def put_batch(self, topic: str, qid: int, texts: list[str]) -> None:
        assert self.owner is not None
        batch = [self._body(t) for t in texts]
        r = self.owner.ask(op="put_batch", topic=topic, qid=qid, bodies=batch)
        assert r["status"] == "PUT_OK" and r["count"] == len(batch), r
        for i, body in enumerate(batch):
            self._acked(topic, qid, r["offset"] + i, body)

    @rule(topic=topics, qid=queue_ids)
    def roll(self, topic: str, qid: int) -> None:
        """A body of 30 KiB: a CommitLog file of 64 KiB rolls every second or third one."""
        assert self.owner is not None
        body = self._body("r" * 30_000)
        r = self.owner.ask(op="put", topic=topic, qid=qid, body=body)
        assert r["status"] == "PUT_OK", r
        self._acked(topic, qid, r["offset"], body)

    @rule(topic=topics, qid=queue_ids, data=st.data())
    def get(self, topic: str, qid: int, data: st.DataObject) -> None:
        assert self.owner is not None
        want = self.model.get((topic, qid), {})
        if not want:
            return
        offset = data.draw(st.sampled_from(sorted(want)))
        r = self.owner.ask(op="get", topic=topic, qid=qid, offset=offset, n=16)
        assert r["status"] == "FOUND", r
        expected = [want[o] for o in range(offset, min(offset + 16, self.next_offset[(topic, qid)]))]
        assert r["bodies"][:len(expected)] == expected[:len(r["bodies"])] and r["bodies"], (r, expected)
        assert r["offsets"][0] == offset

    @rule(data=st.data())
    def lookup_key(self, data: st.DataObject) -> None:
        assert self.owner is not None
        keyed = sorted(k for k in self.keyed if k[2] in self.model.get(k[:2], {}))
        if not keyed:
            return
        topic, qid, offset = data.draw(st.sampled_from(keyed))
        body = self.model[(topic, qid)][offset]
        r = self.owner.ask(op="key", topic=topic, key=body)
        assert body in r["bodies"], (body, r)

    @rule()
    def flush(self) -> None:
        assert self.owner is not None
        self.owner.ask(op="flush")

    @rule()
    def clean(self) -> None:
        assert self.owner is not None
        r = self.owner.ask(op="clean", topics=list(TOPICS), queues=QUEUES)
        for name, low in r["min"].items():
            topic, qid = name.split("/")
            key = (topic, int(qid))
            msgs = self.model.get(key, {})
            assert low <= self.next_offset.get(key, 0)
            for o in [o for o in msgs if o < low]:
                del msgs[o]

    @rule()
    def reopen(self) -> None:
        assert self.owner is not None
        self.owner.shutdown()
        self.owner = Owner(self.root)

    @rule()
    def kill_and_recover(self) -> None:
        assert self.owner is not None
        self.owner.kill()
        self.owner = None
        # the crashed store as a new owner finds it, before recovery
        report = check_store(self.root, allow_torn_tail=True, config=StoreConfig(**CONFIG))
        assert report.ok, report.problems[:5]
        self.owner = Owner(self.root)

    @precondition(lambda self: self.owner is not None)
    @invariant()
    def store_is_consistent(self) -> None:
        report = check_store(self.root, quiescent=False, config=StoreConfig(**CONFIG))
        assert report.ok, report.problems[:5]


# no shrinking: every step is a round trip to a process (and a kill a new one), so shrinking a
# failure takes many minutes; the failing sequence hypothesis prints is short enough as it is
StoreMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=25, deadline=None,
                                          phases=[Phase.explicit, Phase.reuse, Phase.generate],
                                          suppress_health_check=[HealthCheck.too_slow])
test_store_machine = StoreMachine.TestCase
