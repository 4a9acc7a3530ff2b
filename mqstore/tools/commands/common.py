"""What the read-only commands share: tables, sizes, times, JSON, the progress bar, usage errors."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Sequence
from typing import Any, TextIO

from mqstore.log import _shm
from mqstore.errors import MQStoreError
from mqstore.layout import CONTROL_BLOCK_NAME
from mqstore.tools.stats import STATE_NAMES, ms_to_iso
from mqstore.progress import describe

LIST_LIMIT = 20  # text output lists at most this many files / queues; --json lists all


# -- dump ---------------------------------------------------------------------------------
class UsageError(MQStoreError):
    """Options that argparse cannot check alone (which ones go together)."""


# -- shared helpers -----------------------------------------------------------------------
def describe_status(owner: dict[str, Any], ctl: dict[str, Any] | None = None) -> str:
    status = owner["status"]
    if status == "running":
        pid = f" (owner pid {ctl['owner_pid']})" if ctl and "owner_pid" in ctl else ""
        return f"running: a store holds the lock{pid}"
    if status == "crashed":
        return "not running; the last run did not shut down cleanly (abort file present), the next open recovers"
    if status == "clean":
        return "not running; shut down cleanly"
    return "never opened by a store (no lock file)"


def kv(label: str, d: dict[str, Any]) -> str:
    """'label k=v k=v ...' wrapped at 100 columns, continuation lines aligned after the label."""
    return textwrap.fill(" ".join(f"{k}={v}" for k, v in d.items()), 100, initial_indent=label,
                         subsequent_indent=" " * len(label), break_long_words=False, break_on_hyphens=False)


def when(ms: int) -> str:
    """A store / checkpoint time for people: UTC, or "none" for 0 (never written)."""
    return ms_to_iso(ms) if ms > 0 else "none"


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line)


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, what: str, indent: str = "    ",
           limit: int = LIST_LIMIT) -> list[str]:
    """Aligned columns for people: numbers right-aligned with thousands separators, text left-
    aligned. At most limit rows (the first limit - 5 and the last 5), and a line saying how
    many were left off; --json lists all."""
    if not rows:
        return []
    shown: list[Sequence[Any] | None] = list(rows)
    if len(rows) > limit:
        shown = [*rows[:limit - 5], None, *rows[-5:]]
    real = [row for row in shown if row is not None]
    numeric = [all(isinstance(r[i], int) or r[i] is None for r in real) for i in range(len(headers))]
    cells = [[cell(v) for v in row] if row is not None else None for row in shown]
    widths = [max([len(h)] + [len(c[i]) for c in cells if c is not None]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return indent + "  ".join(v.rjust(w) if num else v.ljust(w)
                                  for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(headers)]
    for c in cells:
        out.append(line(c) if c is not None else f"{indent}... {len(rows) - limit} more {what} "
                                                  f"(--json lists all)")
    return out


class ProgressBar:
    """One line on a terminal's stderr, redrawn in place with '\\r' and cleared when done, for
    commands that read many files. Draws at most every REDRAW_S seconds."""

    WIDTH = 30
    REDRAW_S = 0.1

    def __init__(self, command: str, stream: TextIO) -> None:
        self.command = command
        self.stream = stream
        self._last = 0.0
        self._shown = 0
        self._what = ""
        self._what_started = time.monotonic()

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if what != self._what:
            self._what, self._what_started = what, now
        if done < total and now - self._last < self.REDRAW_S:
            return
        self._last = now
        filled = min(self.WIDTH, self.WIDTH * done // total) if total else self.WIDTH
        self.draw(f"{self.command}: [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                  f"{describe(what, done, total, now - self._what_started)}")

    def draw(self, text: str) -> None:
        text = text[:max(20, shutil.get_terminal_size().columns - 1)]  # one line, never wrapped
        self.stream.write("\r" + text.ljust(self._shown))
        self.stream.flush()
        self._shown = len(text)

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0


def progress_bar(args: argparse.Namespace, command: str) -> ProgressBar | None:
    """A bar on stderr if it is a terminal and the output is for people (not --json)."""
    if args.json or not sys.stderr.isatty():
        return None
    return ProgressBar(command, sys.stderr)


def read_control_block(root: str) -> dict[str, Any] | None:
    """Header, positions, running flags and statistics of ROOT/mqstore.shm, or None if absent.

    The block is attached read-only (O_RDONLY, PROT_READ) and every accessor used here is a
    load, so this is safe next to a running owner. {"error": ...} if it cannot be read."""
    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return None
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    try:
        return {
            "state": STATE_NAMES.get(ctl.state, str(ctl.state)),
            "generation": ctl.generation,
            "owner_pid": ctl.owner_pid,
            "lock_kind": ctl.lock_kind,
            "sync_flush": ctl.sync_flush,
            "file_size": ctl.file_size,
            "table_slots": ctl.table_slots,
            "queues": ctl.table_count,
            "positions": ctl.positions(),
            "running_flags": ctl.running_flags(),
            "stats": ctl.stats(),
        }
    finally:
        ctl.close()


def phy_offset_arg(offset: int) -> int | None:
    return None if offset < 0 else offset


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value
