"""AllocateMappedFileService (spec §6.3) with a real MappedFileQueue and ControlBlock."""

from __future__ import annotations

import errno
import os
import time

import pytest

from helpers_fs import run_in_tmpfs, tmpfs_supported
from helpers_mem import mapping_kb
from mqstore.log._mapped import MappedFile
from mqstore.log._shm import ControlBlock
from mqstore.log.mapped_file_queue import MappedFileQueue
from mqstore.services.allocate import AllocateMappedFileService, AllocateRequest

FS = 64 * 1024


def name(offset: int) -> str:
    return f"{offset:020d}"


class Env:
    def __init__(self, tmp_path):
        self.dir = str(tmp_path / "commitlog")
        self.ctl = ControlBlock.create(str(tmp_path / "mqstore.shm"), table_slots=64, file_size=FS, lock_kind="spin",
                                       sync_flush=False)
        self.queue = MappedFileQueue(self.dir, FS)
        self.queue.load()
        self.services: list[AllocateMappedFileService] = []

    def service(self, *, start: bool = True, **overrides) -> AllocateMappedFileService:
        kw = {"warm": False, "sync_flush": False, "warm_flush_least_pages": 4096, "wait_timeout_ms": 10_000}
        kw.update(overrides)
        svc = AllocateMappedFileService(self.ctl, self.queue, **kw)
        self.services.append(svc)
        if start:
            svc.start()
        return svc

    def on_disk(self) -> list[str]:
        return sorted(os.listdir(self.dir))

    def wait_ready(self, offset: int, timeout_ms: float = 10_000) -> bool:
        return self.ctl.wait_position("alloc_ready_upto", offset, "alloc_done", timeout_ms)

    def close(self):
        for svc in self.services:
            svc.shutdown()
        self.queue.close()
        self.ctl.close()


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def test_returns_next_and_precreates_next_next(env):
    svc = env.service()
    mf = svc.put_request_and_return_mapped_file(0, FS)
    assert isinstance(mf, MappedFile), mf
    assert mf.file_from == 0 and mf.file_size == FS
    assert env.queue.get(0) is mf, "the returned file joins the queue"
    assert os.path.getsize(os.path.join(env.dir, name(0))) == FS
    # next-next is created ahead, on disk, but not yet part of the queue
    assert env.wait_ready(FS), "next-next was not pre-created"
    assert env.on_disk() == [name(0), name(FS)]
    assert env.queue.get(FS) is None
    assert env.ctl.get("alloc_request_upto") == FS

    t0 = time.monotonic()
    mf2 = svc.put_request_and_return_mapped_file(FS, 2 * FS)
    assert time.monotonic() - t0 < 5
    assert isinstance(mf2, MappedFile) and mf2.file_from == FS
    assert env.queue.get(FS) is mf2
    assert [f.file_from for f in env.queue] == [0, FS]
    assert env.wait_ready(2 * FS)
    assert env.on_disk() == [name(0), name(FS), name(2 * FS)], "no temporary files either"
    stats = env.ctl.stats()
    assert stats["alloc_count"] == 3
    assert stats["roll_waits"] == 2 and stats["alloc_errors"] == 0


def test_without_next_next_only_next_is_created(env):
    svc = env.service()
    mf = svc.put_request_and_return_mapped_file(3 * FS, None)
    assert isinstance(mf, MappedFile) and mf.file_from == 3 * FS
    time.sleep(0.1)
    assert env.on_disk() == [name(3 * FS)]


def test_existing_file_is_mapped_not_allocated(env):
    MappedFile.create(os.path.join(env.dir, name(0)), FS).close()
    svc = env.service()
    mf = svc.put_request_and_return_mapped_file(0, FS)
    assert isinstance(mf, MappedFile) and mf.file_from == 0
    assert env.queue.get(0) is mf
    assert env.wait_ready(FS), "next-next is still requested"
    assert env.ctl.stats()["alloc_count"] == 1


def test_priority_order(env):
    svc = env.service(start=False)
    for offset in (3 * FS, FS, 2 * FS):
        svc.prefetch(offset)
    svc.prefetch(FS)  # already requested: not queued twice
    assert [r.offset for r in svc._pending] == [FS, 2 * FS, 3 * FS], "smaller start offset first"
    big = AllocateRequest(9 * FS, os.path.join(env.dir, "elsewhere"), 2 * FS)
    svc._pending.add(big)
    assert svc._pending[0] is big, "larger files first"
    assert big.priority < AllocateRequest(0, "x", FS).priority
    svc._pending.remove(big)
    # the service takes them in that order
    for i, offset in enumerate((FS, 2 * FS, 3 * FS)):
        svc.run_once()
        assert env.on_disk() == [name(o) for o in (FS, 2 * FS, 3 * FS)[: i + 1]]
        assert env.ctl.get("alloc_ready_upto") == offset
    for req in list(svc._table.values()):
        req.mapped_file.destroy(0)


@pytest.mark.skipif(not tmpfs_supported(), reason="needs a tmpfs in a private mount namespace (root + unshare)")
def test_enospc_returns_a_detail_naming_errno_and_file(tmp_path):
    out = run_in_tmpfs("""
        from mqstore.log._shm import ControlBlock
        from mqstore.log.mapped_file_queue import MappedFileQueue
        from mqstore.services.allocate import AllocateMappedFileService
        out = {}
        ctl = ControlBlock.create(os.path.join(TMPFS, "mqstore.shm"), table_slots=64, file_size=1,
                                  lock_kind="spin", sync_flush=False)

        def service(directory, fs):
            q = MappedFileQueue(os.path.join(TMPFS, directory), fs)
            q.load()
            svc = AllocateMappedFileService(ctl, q, warm=False, sync_flush=False, warm_flush_least_pages=4096,
                                            wait_timeout_ms=10000)
            svc.start()
            return q, svc

        # 1. the very next file does not fit
        q, svc = service("big", 2 << 20)
        r = svc.put_request_and_return_mapped_file(0, 2 << 20)
        out["big"] = r if isinstance(r, str) else "file"
        svc.shutdown()
        out["big_ls"] = sorted(os.listdir(os.path.join(TMPFS, "big")))

        # 2. the next file fits, next-next does not
        fs = 640 << 10
        errors_before = ctl.get("alloc_error_count")
        q, svc = service("commitlog", fs)
        r = svc.put_request_and_return_mapped_file(0, fs)
        out["first"] = r if isinstance(r, str) else r.file_name
        # wait until the pre-allocation of next-next has failed
        out["prealloc_failed"] = ctl.wait_position("alloc_error_count", errors_before + 1, "alloc_done", 10000)
        r = svc.put_request_and_return_mapped_file(fs, 2 * fs)
        out["second"] = r if isinstance(r, str) else "file"
        out["errno"] = ctl.get("alloc_error_errno")
        out["error_count"] = ctl.get("alloc_error_count")
        out["stat_errors"] = ctl.stats()["alloc_errors"]
        svc.shutdown()  # the thread has stopped: no allocation is in flight any more
        out["ls"] = sorted(os.listdir(os.path.join(TMPFS, "commitlog")))
        emit(out)
    """, tmp_path / "mnt", size="1m")
    enospc = os.strerror(errno.ENOSPC)
    assert isinstance(out["big"], str) and out["big"] != "file", out
    assert name(0) in out["big"] and enospc in out["big"] and str(errno.ENOSPC) in out["big"], out["big"]
    assert out["big_ls"] == [], "nothing (no temp file) left after ENOSPC"
    assert out["first"] == name(0)
    second = out["second"]
    assert second != "file" and name(640 << 10) in second and enospc in second and str(errno.ENOSPC) in second, out
    assert out["errno"] == errno.ENOSPC
    assert out["prealloc_failed"] is True
    assert out["error_count"] >= 2 and out["stat_errors"] == out["error_count"]
    assert out["ls"] == [name(0)]


def test_shutdown_destroys_never_taken_files(env):
    svc = env.service()
    mf = svc.put_request_and_return_mapped_file(0, FS)
    assert isinstance(mf, MappedFile)
    mf.append(b"taken and written")
    assert env.wait_ready(FS)
    assert env.on_disk() == [name(0), name(FS)]
    svc.shutdown()
    assert svc.error is None
    assert env.on_disk() == [name(0)], "the pre-allocated next-next was never taken: destroyed"
    assert mf.read(0, 17) == b"taken and written", "the taken file is untouched"


def test_timeout_when_service_not_started(env):
    svc = env.service(start=False, wait_timeout_ms=50)
    t0 = time.monotonic()
    r = svc.put_request_and_return_mapped_file(0, FS)
    assert time.monotonic() - t0 < 5
    assert isinstance(r, str), r
    assert "50 ms" in r and name(0) in r
    assert env.on_disk() == []
    # the request stays queued (spec §6.3): once the service runs, the same call succeeds
    svc.wait_timeout_ms = 10_000
    svc.start()
    mf = svc.put_request_and_return_mapped_file(0, FS)
    assert isinstance(mf, MappedFile) and mf.file_from == 0


def test_warm_on_allocation(env):
    svc = env.service(warm=True, sync_flush=True, warm_flush_least_pages=4)
    mf = svc.put_request_and_return_mapped_file(0, None)
    assert isinstance(mf, MappedFile)
    assert svc.last_warm is not None
    assert svc.last_warm["pages"] == FS // 4096
    assert abs(svc.last_warm["forces"] - (FS // 4096 // 4 + 1)) <= 1
    assert env.ctl.stats()["warm_ns_total"] > 0
    mf.munlock()


@pytest.mark.parametrize("warm", [False, True], ids=["populate", "warm"])
def test_new_files_are_paged_in_off_the_writer(env, warm):
    """Without warm-up the service populates each file after handing it out (no page of it
    is dirtied); with warm-up the file is touched, flushed and locked before it is ready."""
    svc = env.service(warm=warm)
    mf = svc.put_request_and_return_mapped_file(0, FS)
    deadline = time.monotonic() + 10
    while mapping_kb(mf.path)["Rss"] < FS // 1024 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mapping_kb(mf.path)["Rss"] == FS // 1024
    assert mf.read(0, FS) == bytes(FS)
