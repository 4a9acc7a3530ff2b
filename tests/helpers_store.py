"""Reading a store back in tests: the helpers several test files share."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqstore.status import GetMessageStatus

REPO = str(Path(__file__).resolve().parents[1])


def read_queue(store: Any, topic: str, qid: int, *, batch: int = 32, consecutive: bool = True) -> list[Any]:
    """Every message of a queue through get_message, from its min to its max offset: each get
    must be FOUND and (consecutive) move next_begin_offset on by the messages it returned; a
    queue with filler units (skipped offsets) reads with consecutive=False."""
    lo, hi = store.get_min_offset_in_queue(topic, qid), store.get_max_offset_in_queue(topic, qid)
    got: list[Any] = []
    offset = lo
    while offset < hi:
        r = store.get_message("g", topic, qid, offset, batch)
        assert r.status == GetMessageStatus.FOUND, f"{topic}/{qid} @ {offset}: {r.status}"
        got.extend(r)
        assert not consecutive or r.next_begin_offset == offset + len(r)
        offset = r.next_begin_offset
    return got


def read_bodies(store: Any, topic: str = "T", queues: int = 2, *, batch: int = 64) -> dict[int, list[bytes]]:
    """The bodies of queues 0..queues-1 from offset 0 until a get finds nothing more (queues
    with no message are left out)."""
    out: dict[int, list[bytes]] = {}
    for q in range(queues):
        off = 0
        while True:
            r = store.get_message("g", topic, q, off, batch)
            if r.status.name != "FOUND":
                break
            out.setdefault(q, []).extend(bytes(m.body) for m in r)
            off = r.next_begin_offset
    return out


# -- template stores written by a child process (tests/test_corruption.py, test_recovery_repairs.py)
TEMPLATE_WRITER = """
import json, os, signal, sys
from mqstore import Message, MessageStore
root, how, cfg, n, flush_index = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
store = MessageStore(root, **cfg)
acks = []
for i in range(n):
    topic, qid = "AB"[i % 2], (i // 2) % 3
    body = b"m%d-" % i + b"x" * (i % 97)
    r = store.put_message(Message(topic, body, queue_id=qid, keys=["k%d" % i])).check()
    acks.append((i, topic, qid, r.queue_offset, r.wrote_offset, r.wrote_bytes))
assert store.wait_dispatched()
store.consume_queues.flush()
if flush_index and store.index is not None:
    store.index.flush()
if how == "clean":
    store.shutdown()
print(json.dumps(acks)); sys.stdout.flush()
if how == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""
#: the template stores' topics and queues: message i goes to topic "AB"[i % 2], queue (i // 2) % 3
TEMPLATE_TOPICS = ("A", "B")
TEMPLATE_QUEUES = 3


@dataclass(frozen=True)
class Ack:
    """A message the template writer had acknowledged: its number, queue, queue offset,
    physical offset and size."""

    i: int
    topic: str
    qid: int
    qoff: int
    phy: int
    size: int

    @property
    def body(self) -> bytes:
        return b"m%d-" % self.i + b"x" * (self.i % 97)


def template_stores(base: Path, configs: dict[Any, dict[str, Any]], n: int, *,
                    flush_index: bool = False) -> Callable[..., tuple[str, list[Ack]]]:
    """get(how, key) -> (root, acks): a store of n messages written under base with
    configs[key] by a child process that then shuts down ("clean") or SIGKILLs itself
    ("killed"); each is written once and then reused."""
    made: dict[tuple[str, Any], tuple[str, list[Ack]]] = {}

    def get(how: str, key: Any = False) -> tuple[str, list[Ack]]:
        if (how, key) not in made:
            root = str(base / f"{how}-{key}")
            proc = subprocess.run([sys.executable, "-c", TEMPLATE_WRITER, root, how, json.dumps(configs[key]), str(n),
                                   "1" if flush_index else "0"], capture_output=True, text=True, timeout=120,
                                  cwd=REPO)
            assert proc.returncode == (-signal.SIGKILL if how == "killed" else 0), proc.stderr
            made[(how, key)] = root, [Ack(*a) for a in json.loads(proc.stdout)]
        return made[(how, key)]

    return get


def copy_store(src: str, dst: str) -> str:
    """dst, replaced by a copy of the store at src (hypothesis runs several examples per test)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst
