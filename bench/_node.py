"""A node and writer processes for the benchmarks of the multi-process node (issue 4).

``Node`` runs ``mqstore node`` on a store directory in its own process (the owner and its
allocator, flusher, dispatcher and cleaner processes). ``Writers`` starts K writer processes
that attach with ``MessageStore.open`` and build their messages once; each round the
benchmark process tells all of them to go (one line on each stdin) and waits until all have
answered, so a round's time is the time K processes need to put their share together. The
benchmark process itself does nothing meanwhile but wait on pipes (and, for the lag
benchmark, sample the control block).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from mqstore.procs import proc_stat

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

# A writer process. Commands (one line each), answers one JSON line:
#   put N        N x put_message, one message object per put (prebuilt)  -> {"ns": ...}
#                (every command answers "bad": the statuses other than PUT_OK it met, counted)
#   batch N B    N messages as put_messages batches of B                  -> {"ns": ...}
#   lat N        N x put_message, each timed; latencies of the puts next to a roll (a put
#                whose wrote_offset is in another CommitLog file than the one before) and
#                of the others                                            -> {"ns", "roll", "steady", "rolls"}
#   quit
WRITER = textwrap.dedent("""
    import json, os, sys, time
    from array import array
    from mqstore import Message, MessageStore
    root, wid, size, per_round, roll_window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    store = MessageStore.open(root)
    body = os.urandom(size)
    msgs = [Message("BenchTopic", body, queue_id=wid) for _ in range(per_round)]
    file_size = store.config.mapped_file_size_commit_log
    put, put_batch, now = store.put_message, store.put_messages, time.perf_counter_ns
    bad = {}

    def tally(r):
        if not r.ok:
            bad[r.status.name] = bad.get(r.status.name, 0) + 1

    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        n = int(cmd[1])
        if cmd[0] == "put":
            t0 = now()
            for m in msgs[:n]:
                tally(put(m))
            out = {"ns": now() - t0}
        elif cmd[0] == "batch":
            b = int(cmd[2])
            batches = [msgs[i:i + b] for i in range(0, n, b)]
            t0 = now()
            for chunk in batches:
                tally(put_batch(chunk))
            out = {"ns": now() - t0}
        elif cmd[0] == "lat":
            lat = array("q", bytes(8 * n))
            files = array("q", bytes(8 * n))
            t_all = now()
            for i in range(n):
                m = msgs[i % per_round]
                t0 = now()
                r = put(m)
                lat[i] = now() - t0
                files[i] = r.wrote_offset // file_size if r.ok else -1
                if not r.ok:
                    tally(r)
            elapsed = now() - t_all
            rolls = [i for i in range(1, n) if files[i] != files[i - 1]]
            near = set()
            for i in rolls:
                near.update(range(max(0, i - roll_window), min(n, i + roll_window)))
            out = {"ns": elapsed, "rolls": len(rolls),
                   "roll": sorted(lat[i] for i in near),
                   "steady": sorted(lat[i] for i in range(n) if i not in near)}
        else:
            out = {"error": f"unknown command {cmd[0]!r}"}
        out["bad"] = bad
        print(json.dumps(out), flush=True)
    store.close()
""")


class Node:
    """``mqstore node ROOT --set k=v ...`` in a process of its own, stopped with SIGTERM."""

    def __init__(self, root: str, **settings: Any) -> None:
        self.root = root
        args = [sys.executable, "-m", "mqstore.tools.cli", "node", root]
        args += [f"--set={k}={v}" for k, v in settings.items()]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "owner pid" not in line:
            self.proc.wait(30)
            raise RuntimeError(f"the node did not start (exit {self.proc.returncode}): {line!r}")
        self.pids = {"owner": self.proc.pid}
        for part in line.strip().split(": ", 1)[1].split(", ")[1:]:
            self.pids[part.split()[0]] = int(part.split()[-1])
        self.proc.stdout.readline()  # the recovery summary

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


class Writers:
    """K attached writer processes, each putting its share of a round on its own queue."""

    def __init__(self, root: str, k: int, per_round: int, *, size: int = 100, roll_window: int = 1000) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", WRITER, root, str(w), str(size), str(per_round),
                                        str(roll_window)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
                      for w in range(k)]
        self.pids = {f"writer{w}": json.loads(self._line(p))["ready"] for w, p in enumerate(self.procs)}

    @staticmethod
    def _line(p: subprocess.Popen[str]) -> str:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"writer process {p.pid} exited ({p.wait(30)})")
        return line

    def run(self, command: str) -> list[dict[str, Any]]:
        """Send command to every writer at once; wait for all answers."""
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(command + "\n")
            p.stdin.flush()
        answers = [json.loads(self._line(p)) for p in self.procs]
        for a in answers:
            if a.get("error") or a.get("bad"):
                raise AssertionError(f"a writer reported {a}")
        return answers

    def close(self) -> None:
        for p in self.procs:
            try:
                assert p.stdin is not None
                p.stdin.write("quit\n")
                p.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.wait(60)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each process (all its threads) so far."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            fields = proc_stat(pid)
            out[name] = (int(fields[11]) + int(fields[12])) / hz
        except FileNotFoundError:
            out[name] = 0.0
    return out


def _machine_ticks() -> tuple[int, int]:
    """(idle + iowait, all) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)


class CpuMeter:
    """Per-process CPU use between start() and stop(), as % of one core, and how much of the
    whole machine stayed idle meanwhile (what the processes left unused, kernel threads such
    as writeback included in the busy part)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.total: dict[str, float] = {k: 0.0 for k in pids}
        self.wall = 0.0
        self.idle_ticks = 0
        self.all_ticks = 0
        self._t0 = 0.0
        self._c0: dict[str, float] = {}
        self._m0 = (0, 0)

    def start(self) -> None:
        self._c0 = cpu_seconds(self.pids)
        self._m0 = _machine_ticks()
        self._t0 = time.monotonic()

    def stop(self) -> None:
        c1 = cpu_seconds(self.pids)
        m1 = _machine_ticks()
        self.wall += time.monotonic() - self._t0
        self.idle_ticks += m1[0] - self._m0[0]
        self.all_ticks += m1[1] - self._m0[1]
        for k in self.pids:
            self.total[k] += c1[k] - self._c0[k]

    def percent(self) -> dict[str, float]:
        return {k: round(100 * v / self.wall, 1) for k, v in self.total.items()} if self.wall else {}

    def machine_idle_percent(self) -> float:
        return round(100 * self.idle_ticks / self.all_ticks, 1) if self.all_ticks else 0.0


def percentile(sorted_values: list[int], q: float) -> int:
    """The q-quantile (0..1) of an ascending list (nearest rank)."""
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values))) - 1))]
