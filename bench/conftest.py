"""Fixtures of the benchmark suite: store directories on the real disk, prebuilt messages,
machine facts, and a closing summary in messages/s with the ratios the project tracks.

Run: ``python -m pytest bench --benchmark-columns=median,ops,rounds -q``
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")

import mqstore  # noqa: E402
from mqstore import Message, MessageStore  # noqa: E402

from bench._common import BODY_SIZES, GROUP_ORDER, MSGS, TOPIC  # noqa: E402

MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}
REPO = Path(__file__).resolve().parent.parent


# -- order: group by group -------------------------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the benchmarks group by group (GROUP_ORDER; collection order within a group), so
    each mqstore benchmark runs next to its baseline under the same disk conditions."""
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("benchmark")
        group = marker.kwargs.get("group") if marker else None
        return GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)

    slots = [i for i, item in enumerate(items) if here in Path(item.path).parents]
    for i, item in zip(slots, sorted((items[i] for i in slots), key=rank)):  # stable; other items stay put
        items[i] = item


# -- where the stores live -------------------------------------------------------------------
def _mount_of(path: str) -> tuple[str, str, str, str]:
    """(mount point, filesystem type, source, super options) of the mount holding path."""
    path = os.path.realpath(path)
    best = ("/", "?", "?", "")
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mnt = left.split()[4].replace("\\040", " ")
                fstype, source, options = (right.split() + ["?", "?", ""])[:3]
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, source, options)
    except OSError:
        pass
    return best


def _disk_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    """A directory on a disk-backed filesystem: $MQSTORE_BENCH_DIR, else pytest's tmp path,
    else /var/tmp when the tmp path is in memory (tmpfs /tmp would measure RAM, not a disk).
    Returns (path, owned) where owned means the suite created it and removes it."""
    env = os.environ.get("MQSTORE_BENCH_DIR")
    if env:
        os.makedirs(env, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="mqstore-bench-", dir=env)), True
    base = tmp_path_factory.mktemp("mqstore-bench")
    if _mount_of(str(base))[1] not in MEMORY_FILESYSTEMS:
        return base, False
    return Path(tempfile.mkdtemp(prefix="mqstore-bench-", dir="/var/tmp")), True


@pytest.fixture(scope="session")
def bench_root(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root, owned = _disk_dir(tmp_path_factory)
    yield root
    if owned:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def work_dir(bench_root: Path, request: pytest.FixtureRequest) -> Any:
    """A fresh directory for one benchmark, removed afterwards (benchmarks write GBs)."""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.node.name)[:80]
    path = Path(tempfile.mkdtemp(prefix=name + "-", dir=bench_root))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def quiesce() -> None:
    """Start every benchmark with no dirty pages left by the one before (os.sync, untimed)."""
    os.sync()


@pytest.fixture
def open_store(work_dir: Path) -> Any:
    """Factory: open_store(**config) -> MessageStore in work_dir. Stores are shut down (final
    flush included, so the next benchmark starts without this one's dirty pages) after the
    benchmark, outside any timing."""
    opened: list[MessageStore] = []

    def factory(**overrides: Any) -> MessageStore:
        store = MessageStore(str(work_dir / f"store{len(opened)}"), **overrides)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.shutdown()


# -- inputs ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def spark() -> Any:
    """One local[2] Spark session (2 GiB driver) for the Spark benchmarks, mqstore registered."""
    pytest.importorskip("pyspark")
    from mqstore.spark import session

    spark = session("local[2]", **{"spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


@pytest.fixture(scope="session")
def bodies() -> dict[str, bytes]:
    """One random body per size, shared by every benchmark (mqstore and baselines)."""
    return {name: os.urandom(size) for name, size in BODY_SIZES.items()}


@pytest.fixture(scope="session")
def messages(bodies: dict[str, bytes]) -> Any:
    """messages(size_name) -> MSGS Message objects (built once, outside any timing)."""
    cache: dict[str, list[Message]] = {}

    def get(size: str) -> list[Message]:
        if size not in cache:
            body = bodies[size]
            cache[size] = [Message(TOPIC, body, queue_id=0) for _ in range(MSGS)]
            # settle the new objects into the oldest GC generation now, so the first benchmark
            # does not pay for promoting them (full collections) inside its timed rounds
            gc.collect()
        return cache[size]

    return get


# -- machine facts ---------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _touch_rates(n: int = 256 << 20) -> tuple[float, float]:
    """GB/s of memset over fresh anonymous memory (every page faulted in and zeroed by the
    kernel first) and over the same memory again (plain memory bandwidth). Page faults on
    fresh memory are what a CommitLog without warm-up pays for every new page."""
    import ctypes
    import mmap
    m = mmap.mmap(-1, n)
    buf = (ctypes.c_char * n).from_buffer(m)
    try:
        rates = []
        for _ in range(2):
            t0 = time.perf_counter()
            ctypes.memset(ctypes.addressof(buf), 1, n)
            rates.append(n / (time.perf_counter() - t0) / 1e9)
        return rates[0], rates[1]
    finally:
        del buf
        m.close()


def machine_facts(bench_dir: str) -> dict[str, str]:
    cpuinfo = _read("/proc/cpuinfo")
    model = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines() if l.startswith("model name")), "?")
    flags = next((l for l in cpuinfo.splitlines() if l.startswith("flags")), "")
    mem_kb = next((int(l.split()[1]) for l in _read("/proc/meminfo").splitlines() if l.startswith("MemTotal")), 0)
    mnt, fstype, source, fs_options = _mount_of(bench_dir)
    dev = os.path.basename(os.path.realpath(source)) if source.startswith("/dev/") else ""
    journal = ""
    if fstype in ("ext3", "ext4") and dev and os.path.isdir("/proc/fs/jbd2"):
        journal = ", journal" if any(n.startswith(dev + "-") for n in os.listdir("/proc/fs/jbd2")) else ", no journal"
    block = dev.rstrip("0123456789") if dev and not os.path.exists(f"/sys/block/{dev}") else dev
    if block and not os.path.exists(f"/sys/block/{block}") and block.endswith("p"):
        block = block[:-1]  # nvme0n1p1 -> nvme0n1
    rotational = _read(f"/sys/block/{block}/queue/rotational") if block else "?"
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    try:
        import lmdb
        lmdb_v = f"py-lmdb {lmdb.__version__}, LMDB {'.'.join(map(str, lmdb.version()))}"
    except ImportError:
        lmdb_v = "not installed"
    first_touch, retouch = _touch_rates()
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "mqstore", "ext")
    return {
        "cpu": f"{model} x {os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)"
               + (" [virtualized]" if " hypervisor" in flags else ""),
        "memory": f"{mem_kb / 1048576:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "bench dir": f"{bench_dir} on {mnt} ({fstype}, {source}"
                     + (f", {'rotational' if rotational == '1' else 'non-rotational'}" if rotational in "01" else "")
                     + f"{journal}; {fs_options})",
        "page faults": f"first touch of fresh memory {first_touch:.1f} GB/s, memset of faulted memory "
                       f"{retouch:.1f} GB/s",
        "load average": _read("/proc/loadavg"),
        "dirty ratios": f"vm.dirty_background_ratio={_read('/proc/sys/vm/dirty_background_ratio')} "
                        f"vm.dirty_ratio={_read('/proc/sys/vm/dirty_ratio')}",
        "mlock": "root (CAP_IPC_LOCK, no limit)" if os.geteuid() == 0 else
                 f"RLIMIT_MEMLOCK={'unlimited' if memlock == resource.RLIM_INFINITY else f'{memlock >> 10} KiB'}",
        "mqstore": f"{mqstore.__version__} @ {commit}" + (" + local changes" if dirty else ""),
        "baselines": f"{lmdb_v}; SQLite {sqlite3.sqlite_version}",
    }


_FACTS: dict[str, str] = {}


@pytest.fixture(scope="session", autouse=True)
def print_machine_facts(request: pytest.FixtureRequest, bench_root: Path) -> dict[str, str]:
    """Print the machine facts once, before the first benchmark (also kept in the
    --benchmark-json/--benchmark-save output and repeated in the closing summary)."""
    _FACTS.update(machine_facts(str(bench_root)))
    if _mount_of(str(bench_root))[1] in MEMORY_FILESYSTEMS:
        _FACTS["WARNING"] = "bench dir is in memory; set MQSTORE_BENCH_DIR to a disk directory"
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is not None:
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            tr.ensure_newline()
            tr.section("machine", sep="-")
            for k, v in _FACTS.items():
                tr.write_line(f"{k:>13}: {v}")
    return _FACTS


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    machine_info["mqstore_bench"] = dict(_FACTS)


# -- closing summary -------------------------------------------------------------------------
TARGETS = [
    # (label, numerator cases, denominator case, target)
    ("put_message 100 B async / lmdb", ["put_message/100B/mutex", "put_message/100B/spin",
                                        "put_message/100B/mutex/flusher-idle", "put_message/100B/spin/flusher-idle"],
     "lmdb/append", 2.0),
    ("put_messages (batch 100, 1000) / lmdb", ["put_messages/batch100", "put_messages/batch1000"],
     "lmdb/append", 5.0),
    ("sync flush one-per-flush / SQLite WAL FULL one-per-commit", ["sync_flush/100B"], "sqlite/wal-full-1", 1.0),
    ("2 writer processes / 1 (spin)", ["node/writers-2/spin"], "node/writers-1/spin", 1.7),
    ("2 writer processes / 1 (mutex)", ["node/writers-2/mutex"], "node/writers-1/mutex", 1.7),
    ("SYNC_FLUSH 16 producer processes / lmdb fsync per 100 puts",
     ["node/sync/batch100/16-producers", "node/sync/batch1/16-producers"], "lmdb/sync-batch100", 1.5),
    ("Spark count(), mqstore / Parquet", ["spark/mqstore/count"], "spark/parquet/count", 0.5),
    ("Spark aggregate over every body, mqstore / Parquet", ["spark/mqstore/aggregate"], "spark/parquet/aggregate", 0.5),
]
#: figures checked in the summary: (case prefix, extra_info key, label, limit, "max" | "min")
NODE_LIMITS = [
    ("node/lag/", "lag_ms_p99", "dispatch lag p99 (ms)", 10, "max"),
    ("node/latency/", "p999_roll_over_steady", "put latency p99.9 around a roll / steady", 2.0, "max"),
    ("node/idle", "cpu_percent_all", "idle node CPU (% of one core, all its processes)", 1.0, "max"),
    ("spark/mqstore/", "msgs_per_s_median", "Spark reading mqstore (messages/s)", 500_000, "min"),
]


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    from bench._peers import terminal_summary as peers_summary

    peers_summary(terminalreporter, config)  # bench/test_peers.py: one table, mqstore next to its peers
    session = getattr(config, "_benchmarksession", None)
    every = [b for b in getattr(session, "benchmarks", []) if "case" in b.extra_info]
    benches = [b for b in every if "msgs_per_s_median" in b.extra_info]
    if not every:
        return
    if not benches:
        _node_summary(terminalreporter, every)
        return
    tr = terminalreporter
    by_case = {b.extra_info["case"]: b.extra_info for b in benches}
    tr.section("mqstore bench summary (messages/s: median round; mean = all msgs / all time)", sep="-")
    _FACTS["load average at end"] = _read("/proc/loadavg")
    for k in ("cpu", "bench dir", "mqstore", "page faults", "load average", "load average at end"):
        if k in _FACTS:
            tr.write_line(f"{k}: {_FACTS[k]}")
    w = max(len(c) for c in by_case)
    tr.write_line(f"{'case':<{w}}  {'median msg/s':>12}  {'mean msg/s':>11}")
    for case, info in by_case.items():
        line = f"{case:<{w}}  {info['msgs_per_s_median']:>12,}  {info['msgs_per_s_mean']:>11,}"
        if "roll_wait_ms_max" in info:
            line += (f"  rolls={info['rolls']} roll_wait_max={info['roll_wait_ms_max']:.2f} ms"
                     f" lock_hold_max={info['lock_hold_ms_max']:.2f} ms"
                     f" (median round {info['lock_hold_ms_median_round_max']:.2f} ms)")
        elif "flushes_per_msg" in info:
            line += f"  flushes/msg={info['flushes_per_msg']:.2f}"
        tr.write_line(line)
    tr.write_line("")
    for label, nums, den, target in TARGETS:
        if den not in by_case:
            continue
        d = by_case[den]["msgs_per_s_median"]
        for num in nums:
            if num in by_case:
                ratio = by_case[num]["msgs_per_s_median"] / d
                mean_ratio = by_case[num]["msgs_per_s_mean"] / by_case[den]["msgs_per_s_mean"]
                verdict = "meets" if ratio >= target else f"MISSES by {target / ratio:.2f}x"
                tr.write_line(f"{label}: {num} = {ratio:.2f}x {den} (by means {mean_ratio:.2f}x; target >= "
                              f"{target:g}x, {verdict})")
    for mode in ("sustained", "allocator-idle"):
        cold, warm = by_case.get(f"roll/{mode}/no-warmup"), by_case.get(f"roll/{mode}/warmup")
        if cold and warm:
            tr.write_line(f"roll stall ({mode}), without / with warm-up: roll_wait_max {cold['roll_wait_ms_max']:.2f}"
                          f" / {warm['roll_wait_ms_max']:.2f} ms; lock_hold_max {cold['lock_hold_ms_max']:.2f} / "
                          f"{warm['lock_hold_ms_max']:.2f} ms (median round {cold['lock_hold_ms_median_round_max']:.2f}"
                          f" / {warm['lock_hold_ms_median_round_max']:.2f} ms); {cold['msgs_per_s_median']:,} / "
                          f"{warm['msgs_per_s_median']:,} msg/s")
    _node_summary(tr, every)
    if sys.flags.optimize:
        tr.write_line("note: python -O strips the per-round sanity asserts")


def _node_summary(tr: Any, benches: list[Any]) -> None:
    """The node's figures that are not rates: dispatch lag, latency around rolls, idle CPU,
    and where the CPU went while writer processes ran."""
    for b in benches:
        info = b.extra_info
        case = info["case"]
        if "cpu_percent" in info and case.startswith("node/writers-"):
            cpu = ", ".join(f"{k} {v:g}" for k, v in info["cpu_percent"].items())
            tr.write_line(f"{case}: CPU % of a core: {cpu}; machine idle {info.get('machine_idle_percent', 0):g} %; "
                          f"lock hold mean {info['lock_hold_ns_mean']:g} ns")
        if case.startswith("node/sync/") and "msgs_per_flush" in info:
            tr.write_line(f"{case}: {info['msgs_per_flush']:g} messages per flush, flush {info['flush_us_mean']:g} us")
        for prefix, key, label, limit, kind in NODE_LIMITS:
            if case.startswith(prefix) and key in info:
                ok = info[key] <= limit if kind == "max" else info[key] >= limit
                tr.write_line(f"{label}: {case} = {info[key]:g} (target {'<=' if kind == 'max' else '>='} {limit:g}, "
                              f"{'meets' if ok else 'MISSES'})")
