"""A full disk heals (issue 15 item 2), on a real tmpfs the test mounts in a private mount
namespace: default retention frees the space puts filled, a store and a node open on a disk
with no free block (the control block is laid out again in place, the configuration is not
rewritten), and the flags a full disk raises (DISK_FULL, WRITE_LOGICS_QUEUE_ERROR,
WRITE_INDEX_FILE_ERROR) clear once there is room again, so puts resume without a restart.
Each child ends with the invariant checker on the store it wrote."""

from __future__ import annotations

import textwrap

import pytest

from helpers_fs import CHILD_HELPERS, run_in_tmpfs, tmpfs_supported


pytestmark = [pytest.mark.multiprocess, pytest.mark.skipif(not tmpfs_supported(),
                                reason="needs a tmpfs in a private mount namespace (root + unshare)")]


def test_default_retention_frees_a_disk_filled_by_puts(tmp_path):
    """Puts of keyed 1 KiB messages fill a 24 MiB disk until a CommitLog file cannot be
    created; with RocketMQ's default retention (72 h, 04:00, forcibly above 85 %) the cleaner
    deletes the oldest files within seconds and puts resume: the newest message is readable,
    the oldest are gone below the queue's new min offset."""
    out = run_in_tmpfs(CHILD_HELPERS + textwrap.dedent(r'''
        import time
        from mqstore import Message, MessageStore
        from mqstore.tools.checker import check_store

        root = os.path.join(TMPFS, "store")
        cfg = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 6000,
                   max_hash_slot_num=1024, max_index_num=100000)
        out = {}
        s = MessageStore(root, **cfg)
        body = b"b" * 1024
        acked = 0
        refusal = None
        t0 = time.monotonic()
        for i in range(200_000):
            r = s.put_message(Message("T", body, keys=f"k{i}"))
            if r.status.name != "PUT_OK":
                refusal = [r.status.name, str(r.detail)]
                break
            acked += 1
        out["acked"] = acked
        out["refusal"] = refusal
        out["fill_s"] = time.monotonic() - t0
        seen = set()
        healed = None
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            seen.update(s.ctl.running_flags())
            r = s.put_message(Message("T", b"after", keys="after"))
            if r.status.name == "PUT_OK":
                healed = time.monotonic() - t0 - out["fill_s"]
                break
            time.sleep(0.1)
        out["healed_after_s"] = healed
        out["flags_seen"] = sorted(seen)
        s.wait_dispatched()
        out["min_offset"] = s.get_min_offset_in_queue("T", 0)
        out["max_offset"] = s.get_max_offset_in_queue("T", 0)
        r = s.get_message("g", "T", 0, out["max_offset"] - 1, 1)
        out["last"] = [r.status.name, [bytes(m.body) for m in r][:1] == [b"after"]]
        out["files"] = len(os.listdir(os.path.join(root, "commitlog")))
        s.shutdown()
        rep = check_store(root)
        out["check"] = [rep.ok, [str(p) for p in rep.problems][:5]]
        emit(out)
    '''), tmp_path / "mnt", size="24m", timeout=120)
    assert out["acked"] > 10_000
    assert out["refusal"][0] in ("CREATE_MAPEDFILE_FAILED", "SERVICE_NOT_AVAILABLE"), out["refusal"]
    assert out["healed_after_s"] is not None and out["healed_after_s"] < 30, out
    assert out["min_offset"] > 0 and out["max_offset"] == out["acked"] + 1
    assert out["last"] == ["FOUND", True]
    assert out["check"] == [True, []]


def test_a_store_opens_on_a_full_disk_and_its_flags_clear_when_space_returns(tmp_path):
    """No free block at all: the store opens (its control block laid out again in place), a
    ConsumeQueue file that cannot be created raises WRITE_LOGICS_QUEUE_ERROR and an index step
    that cannot be allocated WRITE_INDEX_FILE_ERROR, each refusing puts with a detail naming it;
    once the ballast file is deleted both clear by themselves and the held-up message is
    dispatched, a key put afterwards is found."""
    out = run_in_tmpfs(CHILD_HELPERS + textwrap.dedent(r'''
        import time
        import mqstore.queue.index as ix
        from mqstore import Message, MessageStore
        from mqstore.tools.checker import check_store

        ix.ALLOCATE_STEP = 16 * 1024
        root = os.path.join(TMPFS, "store")
        cfg = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 6000,
                   disk_space_warning_level_ratio=100, disk_space_clean_forcibly_ratio=100,
                   max_hash_slot_num=1024, max_index_num=100000)
        ballast = os.path.join(TMPFS, "ballast")

        def flags(s):
            return s.ctl.running_flags()

        live_checks = []

        def live_check():
            rep = check_store(root, quiescent=False, config=s.config)
            live_checks.append([str(p) for p in rep.problems][:3])

        out = {}
        s = MessageStore(root, **cfg)
        for i in range(10):
            s.put_message(Message("A", b"a%d" % i)).check()
        s.shutdown()
        out["free_blocks"] = fill(ballast)
        t0 = time.monotonic()
        s = MessageStore(root, **cfg)
        out["open_s"] = time.monotonic() - t0
        out["reused"] = s.ctl.reused
        fill(ballast)  # the open took the clean-close record's block: none is left for the first page of B's queue file
        r = s.put_message(Message("B", b"x"))
        out["put_b"] = r.status.name
        out["cq_flag"] = wait_for(lambda: "WRITE_LOGICS_QUEUE_ERROR" in flags(s))
        r = s.put_message(Message("A", b"y"))
        out["refused"] = [r.status.name, str(r.detail)]
        os.unlink(ballast)
        out["cq_cleared"] = wait_for(lambda: "WRITE_LOGICS_QUEUE_ERROR" not in flags(s))
        out["b_found"] = s.get_message("g", "B", 0, 0, 32).status.name
        live_check()
        out["after_cq"] = s.put_message(Message("A", b"z")).status.name
        # the index
        fill(ballast)
        statuses = []
        for i in range(3000):
            r = s.put_message(Message("A", b"k", keys=f"k{i}"))
            statuses.append(r.status.name)
            if r.status.name != "PUT_OK":
                out["index_refused"] = str(r.detail)
                break
            if i % 50 == 49:
                s.wait_dispatched()  # the dispatcher meets the index's full step while puts still come
        out["index_flag"] = wait_for(lambda: "WRITE_INDEX_FILE_ERROR" in flags(s))
        out["keyed_ok"] = statuses.count("PUT_OK")
        os.unlink(ballast)
        out["index_cleared"] = wait_for(lambda: "WRITE_INDEX_FILE_ERROR" not in flags(s))
        live_check()
        out["late"] = s.put_message(Message("A", b"late", keys="late")).status.name
        s.wait_dispatched()
        out["late_found"] = repr(s.query_message("A", "late", 32, 0, 2**62))
        out["index_errors"] = s.ctl.stats()["index_errors"]
        out["live_checks"] = live_checks
        s.shutdown()
        rep = check_store(root)
        out["check"] = [rep.ok, [str(p) for p in rep.problems][:5]]
        emit(out)
    '''), tmp_path / "mnt", size="24m", timeout=120)
    assert out["free_blocks"] == 0
    assert out["reused"] and out["open_s"] < 10
    assert out["put_b"] == "PUT_OK" and out["cq_flag"]
    assert out["refused"][0] == "SERVICE_NOT_AVAILABLE" and "WRITE_LOGICS_QUEUE_ERROR" in out["refused"][1]
    assert out["cq_cleared"] and out["b_found"] == "FOUND" and out["after_cq"] == "PUT_OK"
    assert out["index_flag"] and "WRITE_INDEX_FILE_ERROR" in out.get("index_refused", ""), out
    assert out["index_errors"] > 0
    assert out["live_checks"] == [[], []]  # the checker on the running store after each heal
    assert out["index_cleared"] and out["late"] == "PUT_OK" and "queue_offset" in out["late_found"]
    assert out["check"] == [True, []]


def test_a_node_starts_on_a_full_disk(tmp_path):
    """The same start with service processes: the node opens on a disk with no free block and
    serves puts and reads once a queue file could be created."""
    out = run_in_tmpfs(CHILD_HELPERS + textwrap.dedent(r'''
        import time
        from mqstore import Message, MessageStore
        from mqstore.tools.checker import check_store

        root = os.path.join(TMPFS, "store")
        cfg = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 6000,
                   disk_space_warning_level_ratio=100, disk_space_clean_forcibly_ratio=100,
                   max_hash_slot_num=1024, max_index_num=100000, service_mode="processes")
        ballast = os.path.join(TMPFS, "ballast")

        def flags(s):
            return s.ctl.running_flags()

        out = {}
        s = MessageStore(root, **cfg)
        for i in range(10):
            s.put_message(Message("A", b"a%d" % i)).check()
        s.shutdown()
        out["free_blocks"] = fill(ballast)
        t0 = time.monotonic()
        s = MessageStore(root, **cfg)
        out["open_s"] = time.monotonic() - t0
        out["reused"] = s.ctl.reused
        r = s.put_message(Message("B", b"x"))
        out["put_b"] = r.status.name
        out["cq_flag"] = wait_for(lambda: "WRITE_LOGICS_QUEUE_ERROR" in flags(s))
        r = s.put_message(Message("A", b"y"))
        out["refused"] = [r.status.name, str(r.detail)]
        os.unlink(ballast)
        out["cq_cleared"] = wait_for(lambda: "WRITE_LOGICS_QUEUE_ERROR" not in flags(s))
        out["b_found"] = s.get_message("g", "B", 0, 0, 32).status.name
        out["after_cq"] = s.put_message(Message("A", b"z")).status.name
        s.shutdown()
        rep = check_store(root)
        out["check"] = [rep.ok, [str(p) for p in rep.problems][:5]]
        emit(out)
    '''), tmp_path / "mnt", size="24m", timeout=120)
    assert out["free_blocks"] == 0 and out["reused"]
    assert out["put_b"] == "PUT_OK" and out["cq_cleared"] and out["b_found"] == "FOUND"
    assert out["after_cq"] == "PUT_OK"
    assert out["check"] == [True, []]


def test_a_writer_attached_to_the_old_block_never_writes_after_it_is_laid_out_again(tmp_path):
    """An attached writer outlives its owner (SIGKILL); the new owner, on a full disk, lays the
    same control block file out again: the old writer's puts are refused, naming why, and
    nothing it tries lands in the log."""
    out = run_in_tmpfs(CHILD_HELPERS + textwrap.dedent(r'''
        import signal, subprocess, time
        from mqstore import Message, MessageStore
        from mqstore.tools.checker import check_store
        root = os.path.join(TMPFS, "store")
        cfg = dict(mapped_file_size_commit_log=1 << 20, max_hash_slot_num=1024, max_index_num=10000)
        code = (f"import time; from mqstore import MessageStore; s = MessageStore({root!r}, **{cfg!r}); "
                "print('ready', flush=True); time.sleep(120)")
        owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert owner.stdout.readline().strip() == "ready"
        old = MessageStore.open(root)
        first = old.put_message(Message("T", b"before")).status.name
        owner.kill()
        owner.wait()
        fill(os.path.join(TMPFS, "ballast"))
        new = MessageStore(root, **cfg)
        reused = new.ctl.reused
        r = old.put_message(Message("T", b"stale"))
        # the open deleted an empty pre-allocated CommitLog file, and T's queue file needs one
        # page of it: full again, the new owner refuses puts as soon as its disk check sees it
        fill(os.path.join(TMPFS, "ballast"))
        wait_for(lambda: "DISK_FULL" in new.ctl.running_flags())
        full = new.put_message(Message("T", b"refused")).status.name
        os.unlink(os.path.join(TMPFS, "ballast"))
        deadline = time.monotonic() + 20
        while (ok := new.put_message(Message("T", b"new")).status.name) != "PUT_OK" and time.monotonic() < deadline:
            time.sleep(0.05)
        again = old.put_message(Message("T", b"stale")).status.name
        new.wait_dispatched()
        bodies = [bytes(m.body) for m in new.get_message("g", "T", 0, 0, 32)]
        old.shutdown()
        new.shutdown()
        rep = check_store(root)
        emit(dict(first=first, reused=reused, stale=[r.status.name, str(r.detail)], full=full, ok=ok, again=again, bodies=[b.decode() for b in bodies],
                  check=[rep.ok, [str(p) for p in rep.problems][:5]]))
    '''), tmp_path / "mnt", size="16m", timeout=120)
    assert out["first"] == "PUT_OK" and out["reused"]
    assert out["stale"][0] == "SERVICE_NOT_AVAILABLE" and "new owner" in out["stale"][1], out
    assert out["full"] == "SERVICE_NOT_AVAILABLE" and out["again"] == "SERVICE_NOT_AVAILABLE"
    assert out["ok"] == "PUT_OK" and out["bodies"] == ["before", "new"]
    assert out["check"] == [True, []]
