"""Issue 15 items 3b and 4: recovery cross-checks what no CRC covers and repairs what can be
repaired, and ``mqstore recover`` (mqstore.tools.inspection.plan_recovery) predicts exactly what the
open then does.

Every test writes a real store through the public API (a child process that shuts it down
cleanly or is killed with SIGKILL), damages its files, asks for the dry run (the function and
``python -m mqstore recover --json``), checks that the dry run changed nothing, opens the store
and compares the open's RecoveryReport field by field with the plan, then reads every queue
through get_message and runs the invariant checker (mqstore.tools.checker.check_store).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from mqstore import Message, MessageStore
from mqstore.tools.checker import check_store
from mqstore.config import StoreConfig
from mqstore.tools.inspection import plan_recovery
from helpers_store import TEMPLATE_QUEUES as QUEUES, TEMPLATE_TOPICS as TOPICS, Ack, copy_store, template_stores
from helpers_store import read_queue as read_all_of_queue

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = 20
FS = 16 * 1024  # CommitLog file size: 300 messages fill about three files
CQ_UNITS = 20
N = 300
CFG = {"mapped_file_size_commit_log": FS, "max_message_size": 4096, "mapped_file_size_consume_queue": CQ_UNITS * UNIT,
       "message_index_enable": False}
CFG_INDEX = {**CFG, "message_index_enable": True, "max_hash_slot_num": 64, "max_index_num": 400}
CFG_SMALL_INDEX = {**CFG_INDEX, "max_index_num": 40}  # 39 keys per index file: 8 files
CONFIGS = {False: CFG, True: CFG_INDEX, "small": CFG_SMALL_INDEX}
POS_QUEUEID, POS_QUEUEOFFSET, POS_PHYSICALOFFSET = 12, 20, 28  # spec §1.2

@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Template stores by (how, index), written once per module by a child process."""
    return template_stores(tmp_path_factory.mktemp("templates"), CONFIGS, N, flush_index=True)


@pytest.fixture
def store_copy(templates, tmp_path):
    def copy(how: str = "clean", index: bool | str = False) -> tuple[str, list[Ack]]:
        src, acks = templates(how, index)
        root = copy_store(src, str(tmp_path / "store"))
        if how == "clean":
            # these tests are about RocketMQ's recovery scan; after a clean close mqstore's
            # clean-close record stands for it (tests/test_clean_close.py covers that path)
            os.unlink(os.path.join(root, "mqstore.clean.json"))
        return root, acks
    return copy


# -- files ------------------------------------------------------------------------------------
def commitlog_path(root: str, phy: int) -> tuple[str, int]:
    return os.path.join(root, "commitlog", f"{phy - phy % FS:020d}"), phy % FS


def patch(path: str, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def snapshot(root: str) -> dict[str, bytes]:
    """Every file under root with its bytes (the dry run must change none)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


def by_phy(acks: list[Ack]) -> list[Ack]:
    return sorted(acks, key=lambda a: a.phy)


# -- the comparison -----------------------------------------------------------------------------
def dry_run(root: str, cfg: dict) -> dict:
    """plan_recovery and ``mqstore recover --json``: both change nothing and agree; returns
    the JSON plan."""
    before = snapshot(root)
    plan = plan_recovery(root)
    r = subprocess.run([sys.executable, "-m", "mqstore", "recover", "--json", root], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode in (0, 1), r.stderr
    out = json.loads(r.stdout)
    assert snapshot(root) == before, "the dry run changed a file"
    assert out["report"] == {k: v for k, v in plan.report.to_dict().items() if k != "elapsed_ms"}
    assert r.returncode == (1 if out["drops_data"] else 0)
    return out


def read_queue(store: MessageStore, topic: str, qid: int) -> list[tuple[int, int, bytes]]:
    return [(m.queue_offset, m.physical_offset, bytes(m.body)) for m in read_all_of_queue(store, topic, qid, consecutive=False)]


def open_and_compare(root: str, plan: dict, acks: list[Ack], lost: set[int], cfg: dict = CFG, *,
                     keys: bool = False) -> dict:
    """Open root: its report is the plan's; every ack not in lost is readable at its queue
    offset, nothing else is; with keys, query_message finds exactly the kept keys. Then the
    checker passes. Returns the open's report."""
    with MessageStore(root, **cfg) as store:
        report = {k: v for k, v in store.recovery.to_dict().items() if k != "elapsed_ms"}
        assert report == plan["report"]
        for topic in TOPICS:
            for qid in range(QUEUES):
                want = [(a.qoff, a.phy, a.body) for a in sorted(acks, key=lambda a: a.qoff)
                        if (a.topic, a.qid) == (topic, qid) and a.i not in lost]
                assert read_queue(store, topic, qid) == want, f"{topic}/{qid}"
        if keys:
            for a in acks:
                hits = [m.physical_offset for m in store.query_message(a.topic, f"k{a.i}").messages]
                assert hits == ([] if a.i in lost else [a.phy]), f"key k{a.i}"
    check_store(root, config=StoreConfig(**cfg)).raise_if_failed()
    return report


# -- A: header fields no CRC covers -------------------------------------------------------------
HEADER_DAMAGE = {
    "PHYSICALOFFSET + 1": (POS_PHYSICALOFFSET, lambda a: struct.pack(">q", a.phy + 1), "PHYSICALOFFSET"),
    "PHYSICALOFFSET of another record": (POS_PHYSICALOFFSET, lambda a: struct.pack(">q", a.phy - a.size),
                                         "PHYSICALOFFSET"),
    "QUEUEID -1": (POS_QUEUEID, lambda a: struct.pack(">i", -1), "QUEUEID"),
    "QUEUEID -2^31": (POS_QUEUEID, lambda a: struct.pack(">i", -(2 ** 31)), "QUEUEID"),
}


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGE))
@pytest.mark.parametrize("where", ["last file", "first file"])
def test_a_record_whose_header_contradicts_its_place_ends_the_log(store_copy, how, damage, where):
    """A record that parses and whose body CRC matches, but whose PHYSICALOFFSET is not its
    offset or whose QUEUEID is negative, is not trusted: the log ends before it as at a bad
    CRC, the report says which field, and the dry run says the same."""
    root, acks = store_copy(how)
    log = by_phy(acks)
    victim = log[-10] if where == "last file" else log[20]
    at, value, field_name = HEADER_DAMAGE[damage]
    path, pos = commitlog_path(root, victim.phy)
    patch(path, pos + at, value(victim))
    plan = dry_run(root, CFG)
    rep = plan["report"]
    assert rep["valid_end"] == victim.phy and rep["stop_reason"] == "invalid"
    assert field_name in rep["stop_detail"] and os.path.basename(path) in rep["stop_detail"]
    assert plan["drops_data"] is True
    lost = {a.i for a in acks if a.phy >= victim.phy}
    report = open_and_compare(root, plan, acks, lost)
    assert report["records"] <= N - len(lost)


def test_a_record_whose_header_contradicts_its_place_is_reported_by_verify(store_copy):
    root, acks = store_copy("clean")
    victim = by_phy(acks)[-10]
    path, pos = commitlog_path(root, victim.phy)
    patch(path, pos + POS_QUEUEID, struct.pack(">i", -7))
    problems = check_store(root, config=StoreConfig(**CFG)).problems
    assert any(p.offset == victim.phy and "QUEUEID -7 is negative" in p.message for p in problems), problems


@pytest.mark.parametrize("kind", ["duplicate", "gap"])
def test_a_queue_offset_out_of_sequence_does_not_cut_the_log(store_copy, kind):
    """The decision for QUEUEOFFSET (mqstore.queue.recovery's docstring): a record whose queue offset
    is not the next of its queue is no reason to cut the log (its CRC matches and it sits where
    it should). The dispatch that rebuilds the queue gives a duplicate offset no unit and a
    skipped one a filler unit; verify names the record."""
    root, acks = store_copy("clean")
    queue = sorted((a for a in acks if (a.topic, a.qid) == ("A", 1)), key=lambda a: a.qoff)
    victim = queue[30]
    new = victim.qoff - 1 if kind == "duplicate" else victim.qoff + 1
    path, pos = commitlog_path(root, victim.phy)
    patch(path, pos + POS_QUEUEOFFSET, struct.pack(">q", new))
    shutil.rmtree(os.path.join(root, "consumequeue", "A", "1"))  # the queue is rebuilt from the log
    plan = dry_run(root, CFG)
    rep = plan["report"]
    assert rep["valid_end"] == max(a.phy + a.size for a in acks) and rep["records"] == N and not rep["stop_detail"]
    with MessageStore(root, **CFG) as store:
        assert {k: v for k, v in store.recovery.to_dict().items() if k != "elapsed_ms"} == rep
        got = read_queue(store, "A", 1)
    bodies = [b for _, _, b in got]
    if kind == "duplicate":
        # offset victim.qoff - 1 was already built: the victim gets no unit; the next record's
        # offset skips victim.qoff, which becomes a filler (read as nothing)
        assert victim.body not in bodies and len(got) == len(queue) - 1
    else:
        assert victim.body in bodies and [q for q, _, b in got if b == victim.body] == [new]
    problems = check_store(root, config=StoreConfig(**CFG)).problems
    assert any(p.offset == victim.phy and ("duplicate" in p.message or "gap before" in p.message)
               for p in problems), problems


# -- B: what recovery repairs, as the dry run predicts ----------------------------------------------
def data_files(root: str) -> list[str]:
    """The CommitLog files holding data, in order."""
    d = os.path.join(root, "commitlog")
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as fh:
            if fh.read(8) != bytes(8):
                out.append(os.path.join(d, name))
    return out


def cut_last_file(root: str, acks: list[Ack], k: int, into: int = 30) -> tuple[str, Ack, int]:
    """Cut the last CommitLog file holding data `into` bytes into the k-th last record;
    returns (its path, that record, the non-zero bytes of it that are left)."""
    victim = by_phy(acks)[-k]
    path, pos = commitlog_path(root, victim.phy)
    assert path == data_files(root)[-1]
    with open(path, "rb") as fh:
        fh.seek(pos)
        left = len(fh.read(into).rstrip(b"\x00"))
    os.truncate(path, pos + into)
    return path, victim, left


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("empty_size", [0, 4096, FS])
def test_cut_last_file_followed_by_an_empty_preallocated_file(store_copy, how, empty_size):
    """(1) The last file written to cut short and, after it, a file the allocator made ahead
    that holds nothing (a crash can leave it shorter than allocated, down to 0 bytes): the
    open extends both, keeps what precedes the cut, deletes the empty file, and the dry run
    says exactly that."""
    root, acks = store_copy(how)
    path, victim, left = cut_last_file(root, acks, 4)
    nxt = os.path.join(root, "commitlog", f"{int(os.path.basename(path)) + FS:020d}")
    if os.path.exists(nxt):
        os.unlink(nxt)
    with open(nxt, "wb") as fh:
        fh.truncate(empty_size)
    plan = dry_run(root, CFG)
    rep = plan["report"]
    assert rep["valid_end"] == victim.phy and rep["dropped_bytes"] == left > 0
    assert rep["short_files"] == [f"{os.path.basename(path)} ({victim.phy % FS + 30} of {FS} bytes)"]
    assert rep["short_empty_files"] == ([] if empty_size == FS else
                                        [f"{os.path.basename(nxt)} ({empty_size} of {FS} bytes)"])
    assert rep["deleted_files"] == [os.path.basename(nxt)] and rep["deleted_data_files"] == []
    assert plan["commitlog_files"][-1] == os.path.basename(nxt)
    lost = {a.i for a in acks if a.phy >= victim.phy}
    open_and_compare(root, plan, acks, lost)
    assert not os.path.exists(nxt) and os.path.getsize(path) == FS


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("cut", ["inside a record", "on a record boundary", "to nothing"])
def test_cut_last_file_alone(store_copy, how, cut):
    """(2) The last file cut short and nothing after it: `mqstore recover` plans what the open
    does (it refused the store before, exit 2)."""
    root, acks = store_copy(how)
    d = os.path.join(root, "commitlog")
    last = data_files(root)[-1]
    for name in os.listdir(d):  # no file after the last one written to
        if os.path.join(d, name) > last:
            os.unlink(os.path.join(d, name))
    in_last = [a for a in by_phy(acks) if commitlog_path(root, a.phy)[0] == last]
    if cut == "inside a record":
        victim = in_last[-3]
        os.truncate(last, victim.phy % FS + 50)
    elif cut == "on a record boundary":
        victim = in_last[-3]
        os.truncate(last, victim.phy % FS)
    else:
        victim = in_last[0]
        os.truncate(last, 0)
    r = subprocess.run([sys.executable, "-m", "mqstore", "recover", root], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert r.returncode == 1 and "CommitLog files cut short" not in r.stderr, r.stderr
    plan = dry_run(root, CFG)
    rep = plan["report"]
    assert rep["valid_end"] == victim.phy
    # a file cut to nothing holds no data: it is indistinguishable from an empty one
    assert len(rep["short_empty_files" if cut == "to nothing" else "short_files"]) == 1
    lost = {a.i for a in acks if a.phy >= victim.phy}
    open_and_compare(root, plan, acks, lost)


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("where", ["inside the blank's header", "after the blank's header"])
def test_full_last_file_cut_inside_its_end_of_file_blank(store_copy, how, where):
    """A full file (ended by its END_OF_FILE blank) cut inside the blank, the file after it
    allocated and empty: the cut file was cut, not written with another size (the blank's
    TOTALSIZE reaches past the cut), so the open keeps its records."""
    root, acks = store_copy(how)
    files = data_files(root)
    full, last = files[-2], files[-1]
    with open(full, "rb") as fh:
        data = fh.read()
    from mqstore.log._scan import scan_records
    blank = scan_records(data, 0, 0, len(data), False)[0]
    assert FS - blank >= 8
    lost = {a.i for a in acks if a.phy >= int(os.path.basename(last))}
    with open(last, "r+b") as fh:  # the records of the last file never reached the disk
        fh.write(bytes(FS))
    os.truncate(full, blank + (5 if where == "inside the blank's header" else 8))
    plan = dry_run(root, CFG)
    rep = plan["report"]
    assert len(rep["short_files"]) == 1
    assert rep["valid_end"] == (int(os.path.basename(full)) + blank if where == "inside the blank's header"
                                else int(os.path.basename(last)))
    open_and_compare(root, plan, acks, lost)


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("size", [0, 100, "half"])
def test_truncated_index_file_is_dropped_and_rebuilt(store_copy, how, size):
    """(3) The store's index file cut short: the open deleted nothing and refused the store
    while the dry run said nothing. The store's mqstore.config.json vouches for the index
    geometry, so a file of another size is damage: deleted and rebuilt from the CommitLog;
    every key is found again."""
    root, acks = store_copy(how, index=True)
    idir = os.path.join(root, "index")
    names = sorted(os.listdir(idir))
    assert len(names) == 1
    path = os.path.join(idir, names[0])
    os.truncate(path, os.path.getsize(path) // 2 if size == "half" else size)
    plan = dry_run(root, CFG_INDEX)
    rep = plan["report"]
    assert rep["index_files_deleted"][:1] == names and rep["index_damage"]
    assert rep["dispatch_from"] == 0  # (after a crash the scan starts there anyway: rebuild_from stays -1)
    assert rep["rebuild_from"] == (0 if how == "clean" else -1)
    open_and_compare(root, plan, acks, set(), CFG_INDEX, keys=True)


# (4) a lost ConsumeQueue file and a shortened log
@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("which", ["first", "middle", "last"])
@pytest.mark.parametrize("keep", [60, 150, 250])
def test_lost_consume_queue_file_and_a_shortened_log(store_copy, how, which, keep):
    """A queue's file deleted and the CommitLog cut after its keep-th record (the files after
    it gone): every message before the cut is readable at its queue offset, the lost units
    rebuilt from the log; the dry run predicts it."""
    root, acks = store_copy(how)
    qdir = os.path.join(root, "consumequeue", "A", "0")
    names = sorted(os.listdir(qdir))
    assert len(names) >= 3
    os.unlink(os.path.join(qdir, names[{"first": 0, "middle": 1, "last": -1}[which]]))
    victim = by_phy(acks)[keep]
    path, pos = commitlog_path(root, victim.phy)
    for name in os.listdir(os.path.join(root, "commitlog")):
        if int(name) > victim.phy:
            os.unlink(os.path.join(root, "commitlog", name))
    os.truncate(path, pos + 30)
    plan = dry_run(root, CFG)
    assert plan["report"]["valid_end"] == victim.phy
    lost = {a.i for a in acks if a.phy >= victim.phy}
    open_and_compare(root, plan, acks, lost)


# (5) damaged hash slots
SLOTS = CFG_SMALL_INDEX["max_hash_slot_num"]


def index_paths(root: str) -> list[str]:
    d = os.path.join(root, "index")
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


def index_header(path: str) -> tuple[int, int, int, int, int, int]:
    with open(path, "rb") as fh:
        return struct.unpack(">qqqqii", fh.read(40))


def slot_table(path: str) -> list[int]:
    with open(path, "rb") as fh:
        fh.seek(40)
        return list(struct.unpack(f">{SLOTS}i", fh.read(4 * SLOTS)))


def entry_hash(path: str, n: int) -> int:
    with open(path, "rb") as fh:
        fh.seek(40 + 4 * SLOTS + 20 * n)
        return struct.unpack(">i", fh.read(4))[0]


def kept_index_file(root: str) -> str:
    """An index file the next open keeps after this crash (it ends by the checkpoint's
    indexMsgTimestamp: flushed whole)."""
    with open(os.path.join(root, "checkpoint"), "rb") as fh:
        fh.seek(16)
        index_ts = struct.unpack(">q", fh.read(8))[0]
    kept = [p for p in index_paths(root) if 0 < index_header(p)[1] <= index_ts]
    assert len(kept) >= 2, "the writer flushed no full index file"
    return kept[len(kept) // 2]


def damage_slot(path: str, kind: str) -> int:
    """Damage one used hash slot of path; returns the slot."""
    table = slot_table(path)
    count = index_header(path)[5]
    slot = next(i for i, v in enumerate(table) if v > 0)
    if kind == "zeroed":
        value = 0
    elif kind == "flipped high bit":
        value = table[slot] ^ (1 << 20)
    else:  # another entry of the file, of another hash slot: the counts still add up
        value = next(n for n in range(count - 1, 0, -1) if entry_hash(path, n) % SLOTS != slot)
    patch(path, 40 + 4 * slot, struct.pack(">i", value))
    return slot


def verify(root: str, *args: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "mqstore", "verify", "--json", *args, root], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("kind", ["zeroed", "flipped high bit"])
def test_damaged_hash_slot_is_rebuilt_by_an_abnormal_open(store_copy, kind):
    """After a crash the open checks the slot tables of the index files it keeps against
    their headers (plan_index_load): a zeroed slot or one pointing past the file's entries
    makes the file damaged: it and the newer files are deleted and rebuilt from the log, as
    the dry run says. verify --deep finds the damage first (the default check does not look
    at the slots of a crashed store)."""
    root, acks = store_copy("killed", index="small")
    path = kept_index_file(root)
    slot = damage_slot(path, kind)
    code, report = verify(root)
    assert code == 0, report["problems"]
    code, report = verify(root, "--deep")
    assert code == 1 and report["deep"] and any(
        p["where"] == f"index/{os.path.basename(path)}" and f"hash slot {slot}" in p["message"]
        for p in report["problems"]), report["problems"]
    assert any("mqstore-spark rebuild" in h for h in report["hints"])
    plan = dry_run(root, CFG_SMALL_INDEX)
    rep = plan["report"]
    assert rep["index_files_deleted"][0] == os.path.basename(path)
    assert any("hash slot" in d for d in rep["index_damage"]), rep["index_damage"]
    open_and_compare(root, plan, acks, set(), CFG_SMALL_INDEX, keys=True)
    assert verify(root, "--deep")[0] == 0


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("kind", ["zeroed", "another entry"])
def test_damaged_hash_slot_is_found_by_verify_and_the_hint_rebuilds_it(store_copy, how, kind):
    """Damage the open does not look for (a normal open trusts its index files; after a crash
    a slot that points at another entry still fits the header): verify --deep names the slot
    and hints how to rebuild; following the hint (the file cut to 0 bytes, then an open)
    rebuilds it and every key is found again."""
    root, acks = store_copy(how, index="small")
    path = kept_index_file(root) if how == "killed" else index_paths(root)[len(index_paths(root)) // 2]
    slot = damage_slot(path, kind)
    code, report = verify(root, "--deep")
    name = os.path.basename(path)
    assert code == 1 and any(p["where"] == f"index/{name}" and f"hash slot {slot}" in p["message"]
                             for p in report["problems"]), report["problems"]
    hint = next(h for h in report["hints"] if "truncate -s 0" in h)
    assert f"index/{name}" in hint
    plan = dry_run(root, CFG_SMALL_INDEX)
    if how == "clean" or kind == "another entry":
        assert not plan["report"]["index_damage"]  # the open does not see it
    os.truncate(path, 0)  # the hint
    plan = dry_run(root, CFG_SMALL_INDEX)
    assert plan["report"]["index_files_deleted"][0] == name
    open_and_compare(root, plan, acks, set(), CFG_SMALL_INDEX, keys=True)
    assert verify(root, "--deep")[0] == 0


def test_verify_deep_reads_whole_files_past_the_end_of_the_log(store_copy):
    """The default check looks at the first bytes of a file past the end of the log (allocated
    ahead, empty); --deep reads all of it."""
    root, _ = store_copy("clean")
    last = data_files(root)[-1]
    ahead = os.path.join(root, "commitlog", f"{int(os.path.basename(last)) + FS:020d}")
    with open(ahead, "wb") as fh:
        fh.truncate(FS)
    patch(ahead, 5000, b"\x01")
    assert verify(root)[0] == 0
    code, report = verify(root, "--deep")
    assert code == 1 and any(p["where"] == os.path.basename(ahead) and "holds data" in p["message"]
                             for p in report["problems"]), report["problems"]


def test_a_queue_offset_far_past_its_queue_is_skipped_and_the_queue_goes_on(store_copy):
    """A flipped high byte in QUEUEOFFSET (no CRC covers it): the rebuild gives that record no unit
    and no fillers (dispatch refuses offsets more than MAX_GAP_UNITS past the queue's end), the
    topic-queue table is not raised to it, so the next put continues the real sequence; verify
    names the record."""
    root, acks = store_copy("clean")
    queue = sorted((a for a in acks if (a.topic, a.qid) == ("A", 1)), key=lambda a: a.qoff)
    victim = queue[30]
    path, pos = commitlog_path(root, victim.phy)
    patch(path, pos + POS_QUEUEOFFSET, struct.pack(">q", victim.qoff + (1 << 40)))
    shutil.rmtree(os.path.join(root, "consumequeue", "A", "1"))  # the queue is rebuilt from the log
    with MessageStore(root, **CFG) as store:
        got = read_queue(store, "A", 1)
        assert victim.body not in [b for _, _, b in got] and len(got) == len(queue) - 1
        assert [q for q, _, _ in got] == [a.qoff for a in queue if a is not victim], "no fillers, no shift"
        assert store.stats()["dispatch_skipped_records"] >= 1
        r = store.put_message(Message("A", b"after", queue_id=1)).check()
        assert r.queue_offset == queue[-1].qoff + 1
    problems = check_store(root, config=StoreConfig(**CFG)).problems
    assert any(p.offset == victim.phy for p in problems), problems
