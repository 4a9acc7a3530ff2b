"""Run a child Python on a real, small tmpfs (a full disk on demand).

The tmpfs is mounted in a private mount namespace (``unshare -m``), so it exists only for the
child and vanishes with it: nothing is mounted in the test process and nothing can leak. The
child sees the mount point as the global ``TMPFS`` (``os``, ``sys`` and ``json`` are already
imported) and reports a JSON-able result with ``emit(obj)``; :func:`run_in_tmpfs` returns it.

Needs root (or CAP_SYS_ADMIN) and ``unshare`` from util-linux; :func:`tmpfs_supported` says
whether this machine can do it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
_MARK = "@@MQ-RESULT@@"

_PRELUDE = f"""\
import json, os, sys
TMPFS = os.environ["MQ_TMPFS"]
def emit(obj):
    sys.stdout.write({_MARK!r} + json.dumps(obj) + "\\n")
    sys.stdout.flush()
"""


@functools.cache
def tmpfs_supported() -> bool:
    """True if a tmpfs can be mounted in a private mount namespace here."""
    if shutil.which("unshare") is None:
        return False
    d = tempfile.mkdtemp(prefix="mq-tmpfs-probe-")
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1"', "sh", d],
                           capture_output=True, timeout=10)
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.rmdir(d)


#: prepended to every child: a ballast file that takes every free block, and polling
CHILD_HELPERS = r"""
import time


def fill(path):
    # zeros appended until the disk refuses a single byte; returns the free blocks left
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 20, 1 << 16, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return os.statvfs(TMPFS).f_bavail


def wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()

"""


def run_in_tmpfs(code: str, mountpoint: str | os.PathLike[str], *, size: str = "1m", timeout: float = 30.0,
                 env: dict[str, str] | None = None) -> object:
    """Mount a fresh tmpfs of ``size`` on ``mountpoint`` in a private mount namespace, run
    ``code`` there in a child Python (cwd = the repository, ``mqstore`` importable) and return
    what it passed to ``emit``. Fails (AssertionError) if the child fails or emits nothing."""
    mountpoint = os.fspath(mountpoint)
    os.makedirs(mountpoint, exist_ok=True)
    script = _PRELUDE + textwrap.dedent(code)
    child_env = {**os.environ, **(env or {}), "MQ_TMPFS": mountpoint,
                 "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)}
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs -o size="$1" tmpfs "$2" && exec "$3" -c "$4"', "sh", size, mountpoint, sys.executable,
           script]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=child_env)
    assert r.returncode == 0, f"tmpfs child failed (rc={r.returncode}):\n{r.stdout}\n{r.stderr}"
    results = [line[len(_MARK):] for line in r.stdout.splitlines() if line.startswith(_MARK)]
    assert results, f"tmpfs child emitted nothing:\n{r.stdout}\n{r.stderr}"
    return json.loads(results[-1])
