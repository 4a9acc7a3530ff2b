"""The public API as a newcomer meets it (issue 14): every method raises StoreClosedError after
shutdown, argument errors name the argument, every public method and property says what it
does, deprecated aliases warn and still work."""

from __future__ import annotations

import inspect
import multiprocessing
import warnings

import pytest

from helpers_proc import run_in_child

import mqstore
from mqstore import Message, MessageBatch, MessageStore, StoreClosedError
from mqstore.queue._reads import GetMessageResult, MessageView
from mqstore.queue.reads import QueryMessageResult
from mqstore.store import AttachedStore

# plausible arguments for every public method of a store (a wrong argument must not be what fails)
ARGS = {
    "put_message": (Message("T", b"x"),), "put_messages": ([Message("T", b"x")],), "put_bodies": ("T", [b"x"]),
    "put": ("T", b"x"),
    "next_queue_offset": ("T", 0), "positions": (), "stats": (), "flush": (), "commit": (),
    "get_message": ("g", "T", 0, 0), "read_messages": ("T", 0, 0), "look_message_by_offset": (0,), "look_message_by_queue_offset": ("T", 0, 0),
    "get_message_store_timestamp": ("T", 0, 0), "get_offset_in_queue_by_time": ("T", 0, 0),
    "offset_in_queue_by_time": ("T", 0, 0), "get_max_offset_in_queue": ("T", 0),
    "get_min_offset_in_queue": ("T", 0), "get_max_phy_offset": (), "get_min_phy_offset": (),
    "get_earliest_message_time": (), "query_message": ("T", "k"), "execute_delete_files_manually": (), "logs": (),
    "wait_for_messages": ("T", 0, 0, 10), "wait_dispatched": (None, 10),
}
# callable after shutdown on purpose
AFTER_SHUTDOWN_OK = {"shutdown", "close", "open", "attach"}
PROPERTIES = ("max_phy_offset", "min_phy_offset", "dispatch_behind_bytes", "dispatch_lag_ms")


def public_methods(cls: type) -> list[str]:
    return sorted(n for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v))


def test_every_public_method_is_covered_here():
    assert set(public_methods(MessageStore)) == set(ARGS) | AFTER_SHUTDOWN_OK


def _assert_all_refuse(store: MessageStore) -> None:
    for name, args in ARGS.items():
        with pytest.raises(StoreClosedError, match="shut down"):
            getattr(store, name)(*args)
    for name in PROPERTIES:
        with pytest.raises(StoreClosedError):
            getattr(store, name)
    store.shutdown()  # a second shutdown is a no-op
    assert store.closed


def test_every_public_method_raises_store_closed_error_after_shutdown(open_store):
    store = open_store()
    store.put_message(Message("T", b"x")).check()
    store.shutdown()
    _assert_all_refuse(store)


def test_an_attached_store_refuses_the_same_after_its_shutdown(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=1 << 20):
        assert run_in_child(_attached_refuses, root, timeout_s=60) == 0


def _attached_refuses(root: str) -> None:
    store = MessageStore.open(root)
    assert isinstance(store, AttachedStore)
    store.put_message(Message("T", b"x")).check()
    store.shutdown()
    _assert_all_refuse(store)


@pytest.mark.parametrize("call, error, needle", [
    (lambda s: s.get_message("g", "T", "0", 0), TypeError, "get_message(): queue_id must be an int"),
    (lambda s: s.get_message("g", "T", 0, "x"), TypeError, "get_message(): offset must be an int"),
    (lambda s: s.get_message("g", 5, 0, 0), TypeError, "get_message(): topic must be a str"),
    (lambda s: s.get_message("g", "T", 2**40, 0), ValueError, "queue_id=1099511627776 is out of range"),
    (lambda s: s.get_message("g", "T", 0, 0, 2**40), ValueError, "max_msg_nums=1099511627776 is out of range"),
    (lambda s: s.get_message("g", "T", 0, 0, tags=5), TypeError, "get_message(): tags must be"),
    (lambda s: s.get_message("g", "T", 0, 0, tags=["A", 1]), TypeError, "the list holds 1"),
    (lambda s: s.get_message("g", "T", 0, 0, tags=[]), ValueError, "tags is an empty list"),
    (lambda s: s.read_messages("T", "0", 0), TypeError, "read_messages(): queue_id must be an int"),
    (lambda s: s.read_messages("T", 0, 0, 2**40), ValueError, "max_msg_nums=1099511627776 is out of range"),
    (lambda s: s.look_message_by_offset("0"), TypeError, "look_message_by_offset(): phy_offset must be an int"),
    (lambda s: s.look_message_by_queue_offset("T", 0, 1.5), TypeError, "queue_offset must be an int"),
    (lambda s: s.get_max_offset_in_queue("T", None), TypeError, "queue_id must be an int"),
    (lambda s: s.get_min_offset_in_queue(b"T", 0), TypeError, "topic must be a str, got bytes"),
    (lambda s: s.get_offset_in_queue_by_time("T", 0, "now"), TypeError, "timestamp must be an int"),
    (lambda s: s.query_message("T", 5), TypeError, "query_message(): key must be a str"),
    (lambda s: s.next_queue_offset("T", "0"), TypeError, "queue_id must be an int"),
    (lambda s: s.wait_for_messages("T", "0", 0, 10), TypeError, "wait_for_messages(): queue_id"),
])
def test_argument_errors_name_the_argument(open_store, call, error, needle):
    store = open_store()
    store.put_message(Message("T", b"x", tags="A")).check()
    store.wait_dispatched()
    with pytest.raises(error) as info:
        call(store)
    assert needle in str(info.value)
    assert store.get_message("g", "T", 0, 0).message_count == 1  # nothing broken


def test_tags_may_be_a_list(open_store):
    store = open_store()
    for tag in ("A", "B", "C"):
        store.put_message(Message("T", tag.encode(), tags=tag)).check()
    store.wait_dispatched()
    assert [bytes(m.body) for m in store.get_message("g", "T", 0, 0, tags=["A", "C"])] == [b"A", b"C"]
    assert [bytes(m.body) for m in store.get_message("g", "T", 0, 0, tags=("B",))] == [b"B"]


def test_bodies_as_bytes_in_one_call(open_store):
    store = open_store()
    bodies = [b"", b"x", bytes(range(256)) * 3] + [b"b%d" % i * i for i in range(27)]  # 30: under the cap of 32
    for i, body in enumerate(bodies):
        store.put_message(Message("T", body, tags="A" if i % 2 else None, properties={"p": "v"} if i % 3 else None,
                                  born_host=("::1", 9) if i % 5 == 0 else None)).check()
    store.wait_dispatched()
    got = store.get_message("g", "T", 0, 0, 64)
    assert got.bodies() == [bytes(m.body) for m in got] == [m.body_bytes() for m in got] == bodies
    view = store.look_message_by_queue_offset("T", 0, 2)
    assert view is not None and view.body_bytes() == bytes(view.body) == bodies[2]
    assert store.get_message("g", "T", 0, len(bodies), 4).bodies() == []  # nothing found: no bodies
    # records(): the whole records, concatenated (a pull response's body), as the views see them
    assert got.records() == b"".join(bytes(m.buffer) for m in got)
    assert len(got.records()) == sum(got.sizes_list)
    assert store.get_message("g", "T", 0, len(bodies), 4).records() == b""


def test_read_messages_past_the_first_1024_keeps_every_message(open_store):
    # the result's arrays start at 1024 entries and grow while the scan collects: a grow must
    # keep what was collected (it once copied none of it, leaving offset 0 / size 0 entries)
    store = open_store()
    for start in range(0, 3000, 500):
        store.put_messages([Message("T", b"%05d" % i) for i in range(start, start + 500)]).check()
    store.wait_dispatched()
    got = store.read_messages("T", 0, 0, 3000)
    assert len(got) == 3000 and got.next_begin_offset == 3000
    assert got.bodies() == [b"%05d" % i for i in range(3000)]
    assert len(set(got.physical_offsets)) == 3000 and got.records() == b"".join(bytes(m.buffer) for m in got)


def test_read_messages_is_get_message_without_the_transfer_caps(open_store):
    store = open_store()
    for start in range(0, 1000, 100):
        store.put_messages([Message("T", b"%05d" % i, tags="A" if i % 3 else "B")
                            for i in range(start, start + 100)]).check()
    for _ in range(100):
        store.put_message(Message("T", b"z" * 4000)).check()  # 400 KiB: over the 256 KiB cap
    store.wait_dispatched()
    assert len(store.get_message("g", "T", 0, 0, 1000)) == 32  # RocketMQ's cap, kept for get_message
    got = store.read_messages("T", 0, 0, 1000)
    assert got.status.name == "FOUND" and len(got) == 1000 and got.next_begin_offset == 1000
    assert got.bodies() == [b"%05d" % i for i in range(1000)]
    assert store.read_messages("T", 0, 1000).bodies() == [b"z" * 4000] * 100  # 1024 asked, 100 there
    tagged = store.read_messages("T", 0, 0, 2000, tags="B")
    assert tagged.bodies() == [b"%05d" % i for i in range(0, 1000, 3)]
    assert store.read_messages("T", 0, 1100).status.name == "OFFSET_OVERFLOW_ONE"


@pytest.mark.parametrize("max_msg_nums", [0, -1])
def test_max_msg_nums_below_one_returns_one_message_like_rocketmq(open_store, max_msg_nums):
    store = open_store()
    for i in range(3):
        store.put_message(Message("T", b"%d" % i)).check()
    store.wait_dispatched()
    got = store.get_message("g", "T", 0, 0, max_msg_nums)  # crashed the process before
    assert got.message_count == 1 and got.next_begin_offset == 1


def test_deprecated_aliases_warn_and_work(open_store):
    store = open_store()
    r = store.put_message(Message("T", b"x")).check()
    view = store.look_message_by_offset(r.wrote_offset)
    with pytest.warns(DeprecationWarning, match="physical_offset"):
        assert view.phy == view.physical_offset == r.wrote_offset
    with pytest.warns(DeprecationWarning, match="total_size"):
        assert view.size == view.total_size == r.wrote_bytes
    assert MessageStore.close is MessageStore.shutdown


def _undocumented(cls: type) -> list[str]:
    missing = []
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        doc = inspect.getdoc(member) or ""
        # Cython's embedsignature puts the signature on the first line of __doc__
        text = doc.split("\n", 1)[1] if doc.startswith(f"{name}(") else doc
        if not text.strip() and (callable(member) or isinstance(member, property) or inspect.isgetsetdescriptor(member)):
            missing.append(name)
    return missing


@pytest.mark.parametrize("cls", [MessageStore, AttachedStore, Message, mqstore.MessageBatch, mqstore.PutMessageResult,
                                 mqstore.StoreConfig, MessageView, GetMessageResult, QueryMessageResult],
                         ids=lambda c: c.__name__)
def test_every_public_method_and_property_has_a_docstring(cls):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert _undocumented(cls) == []


def test_an_attached_store_refuses_a_setting_it_chose_that_differs_from_the_owners_even_the_default(tmp_path):
    """Issue 15: flush_disk_type=ASYNC_FLUSH (the default) given to an attach whose owner runs
    SYNC_FLUSH was accepted silently."""
    root = str(tmp_path / "s")
    with MessageStore(root, flush_disk_type="SYNC_FLUSH", mapped_file_size_commit_log=1 << 20):
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            assert pool.apply(_attach_with, (root, {"flush_disk_type": "ASYNC_FLUSH"})).startswith("ConfigError")
            assert pool.apply(_attach_with, (root, {"flush_disk_type": "SYNC_FLUSH"})) == "attached"


def _attach_with(root: str, settings: dict) -> str:
    try:
        store = MessageStore.open(root, **settings)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"
    store.shutdown()
    return "attached"


def test_every_public_name_resolves_and_the_package_loads_lazily():
    import subprocess
    import sys

    for name in mqstore.__all__:
        assert getattr(mqstore, name) is not None
    assert set(mqstore.__all__) <= set(dir(mqstore))
    out = subprocess.run([sys.executable, "-c", "import sys, mqstore; print('mqstore.store' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # the command line starts without loading the store


def test_python_dash_m_mqstore_and_version_and_truthful_help():
    import subprocess
    import sys

    version = subprocess.run([sys.executable, "-m", "mqstore", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"mqstore {mqstore.__version__}"
    helptext = " ".join(subprocess.run([sys.executable, "-m", "mqstore", "--help"], capture_output=True,
                                       text=True).stdout.split())
    assert "'node' owns a store and writes it" in helptext and "only read" in helptext
    assert "node" in helptext.split("positional arguments:")[1]


def test_put_bodies_is_a_batch_without_messages(open_store):
    store = open_store()
    r = store.put_bodies("T", [b"a", bytearray(b"bb"), memoryview(b"ccc")], 1, tags="X", properties={"p": "v"})
    assert r.check().queue_offset == 0 and r.msg_num == 3
    assert store.put_bodies("T", iter([b"d"]), 1).check().queue_offset == 3
    store.wait_dispatched()
    got = store.read_messages("T", 1, 0)
    assert got.bodies() == [b"a", b"bb", b"ccc", b"d"]
    assert [m.tags for m in got] == ["X", "X", "X", None] and got[0].properties["p"] == "v"
    assert len(store.get_message("g", "T", 1, 0, tags="X")) == 3
    for bad, status, needle in (([], "MESSAGE_ILLEGAL", "empty"), ([b"a", 5], "MESSAGE_ILLEGAL", "body 1 is a int"),
                                ([b"x" * 20000], "MESSAGE_ILLEGAL", "max_message_size")):
        res = store.put_bodies("T", bad)
        assert res.status.name == status and needle in str(res.detail), res.detail
    assert store.put_bodies("bad topic", [b"a"]).status.name == "MESSAGE_ILLEGAL"
    assert store.put_bodies("T", [b"a"], properties={"a\x01": "b"}).status.name == "MESSAGE_ILLEGAL"
    assert store.put_bodies("T", [b"a"], properties={"DELAY": "3"}).status.name == "MESSAGE_ILLEGAL"
    too_long = store.put_bodies("T", [b"a"], properties={"k": "x" * 40000})
    assert too_long.status.name == "MESSAGE_ILLEGAL" and "more than 32767" in str(too_long.detail)
    assert store.get_max_offset_in_queue("T", 1) == 4  # nothing refused was stored


def test_a_message_batch_from_messages_puts_like_the_messages(open_store):
    store = open_store()
    msgs = [Message("T", b"m%d" % i, queue_id=2, tags="A", properties={"k": str(i)}) for i in range(5)]
    batch = MessageBatch.from_messages(msgs)  # raised AttributeError before (a private field read)
    assert (batch.topic, batch.queue_id) == ("T", 2)
    assert store.put_messages(batch).check().msg_num == 5
    store.wait_dispatched()
    got = store.read_messages("T", 2, 0)
    assert got.bodies() == [m.body for m in msgs] and [m.properties["k"] for m in got] == ["0", "1", "2", "3", "4"]
    with pytest.raises(TypeError):
        MessageBatch.from_messages([msgs[0], b"not a message"])
