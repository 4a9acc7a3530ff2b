"""Issue 15 item 6a: the commands that only read a store (``mqstore verify``, ``inspect``,
``dump``, ``recover``, ``info``) open no store file for writing, so they work on a read-only
mount.

Each command runs as a subprocess (``python -m mqstore ...``) on a real read-only bind mount of
a store, made in a private mount namespace (``unshare -m``: ``mount --bind SRC DST`` then
``mount -o remount,ro,bind DST``), so the mount exists only for that child. It must exit as it
does on the writable directory and print the same (with the mount point for the directory).
Needs root (or CAP_SYS_ADMIN) and util-linux's ``unshare``; skipped otherwise.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from mqstore import Message, MessageStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FS = 16 * 1024
CFG = {"mapped_file_size_commit_log": FS, "mapped_file_size_consume_queue": 20 * 20, "max_message_size": 4096,
       "max_hash_slot_num": 64, "max_index_num": 400}

# mount SRC read-only on DST, check that it is read-only, then run the command
_RO_SCRIPT = ('mount --bind "$1" "$2" && mount -o remount,ro,bind "$2" && '
              'if touch "$2/.mqstore-ro-probe" 2>/dev/null; then echo "mount is writable" >&2; exit 97; fi; '
              'shift 2; exec "$@"')


@functools.cache
def ro_bind_supported() -> str:
    """"" if a read-only bind mount can be made in a private mount namespace here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    src, dst = tempfile.mkdtemp(prefix="mq-ro-src-"), tempfile.mkdtemp(prefix="mq-ro-dst-")
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", _RO_SCRIPT, "sh", src, dst,
                            "true"], capture_output=True, text=True, timeout=20)
        return "" if r.returncode == 0 else f"cannot make a read-only bind mount: {r.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a read-only bind mount: {exc}"
    finally:
        os.rmdir(src)
        os.rmdir(dst)


pytestmark = [pytest.mark.multiprocess, pytest.mark.skipif(ro_bind_supported() != "", reason=ro_bind_supported() or "supported")]


def run_rw(root: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mqstore", *argv, root], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def run_ro(src: str, mountpoint: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """The command on mountpoint, a read-only bind mount of src in a private mount namespace."""
    os.makedirs(mountpoint, exist_ok=True)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", _RO_SCRIPT, "sh", src, mountpoint,
                           sys.executable, "-m", "mqstore", *argv, mountpoint], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def snapshot(root: str) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = (st.st_mtime_ns, fh.read())
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A cleanly shut down store (with index files and a control block), and a crashed one
    whose last CommitLog file was cut short (the dry run maps a repaired copy of it)."""
    base = tmp_path_factory.mktemp("ro")
    clean = str(base / "clean")
    with MessageStore(clean, **CFG) as store:
        for i in range(300):
            store.put_message(Message("T", b"m%d-" % i + b"x" * (i % 90), queue_id=i % 3, keys=[f"k{i}"])).check()
        assert store.wait_dispatched()
    crashed = str(base / "crashed")
    shutil.copytree(clean, crashed)
    open(os.path.join(crashed, "abort"), "wb").close()
    cdir = os.path.join(crashed, "commitlog")
    last = max((n for n in os.listdir(cdir) if open(os.path.join(cdir, n), "rb").read(8) != bytes(8)))
    path = os.path.join(cdir, last)
    size = len(open(path, "rb").read().rstrip(b"\x00"))
    os.truncate(path, size - 40)
    for name in os.listdir(cdir):
        if name > last:
            os.unlink(os.path.join(cdir, name))
    return {"clean": clean, "crashed": crashed}


COMMANDS = [
    ("verify",),
    ("verify", "--json"),
    ("verify", "--deep", "--json"),
    ("info", "--json"),
    ("inspect",),
    ("inspect", "--json"),
    ("dump", "--phy", "0", "--body", "text"),
    ("dump", "--topic", "T", "--queue", "1", "--from", "3", "--count", "5", "--json"),
    ("recover",),
    ("recover", "--json"),
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
@pytest.mark.parametrize("which", ["clean", "crashed"])
def test_read_only_commands_work_on_a_read_only_mount(stores, tmp_path, which, argv):
    src = stores[which]
    before = snapshot(src)
    mountpoint = str(tmp_path / "ro")
    ro = run_ro(src, mountpoint, *argv)
    rw = run_rw(src, *argv)
    assert ro.returncode != 97, "the bind mount was writable"
    assert "Read-only file system" not in ro.stderr and "cannot read the store" not in ro.stderr, ro.stderr
    # the crashed store lost records its control block and queues still name: verify reports
    # that, recover says the open drops data
    want = 1 if which == "crashed" and argv[0] in ("verify", "recover") else 0
    assert ro.returncode == rw.returncode == want, (ro.stderr, rw.stderr)
    expected = rw.stdout.replace(src, mountpoint)
    if "--json" in argv:
        assert json.loads(ro.stdout) == json.loads(expected)
    else:
        assert ro.stdout == expected
    assert snapshot(src) == before


def test_the_crashed_store_plan_names_the_cut_file(stores, tmp_path):
    """On the read-only mount the dry run still plans the repair of the cut file (from a
    scratch copy) instead of refusing the store."""
    r = run_ro(stores["crashed"], str(tmp_path / "ro"), "recover", "--json")
    plan = json.loads(r.stdout)
    assert r.returncode == 1 and plan["report"]["short_files"] and plan["report"]["mode"] == "abnormal"
    assert plan["drops_data"] is True
