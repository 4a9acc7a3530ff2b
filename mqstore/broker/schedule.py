"""Delayed delivery: the service that puts due messages of SCHEDULE_TOPIC_XXXX back into their real
topic and queue (docs/rocketmq-remoting-spec.md §2.4.9; RocketMQ 4.9.7's
``store/.../schedule/ScheduleMessageService``, synchronous delivery).

The store already does the other half (docs/rocketmq-store-spec.md §9.2, §3): a put whose DELAY
level is > 0 is stored in SCHEDULE_TOPIC_XXXX, queue level - 1, with REAL_TOPIC and REAL_QID, and
its ConsumeQueue unit's tags code is its delivery time. This service walks each level's queue
from the level's offset, in order; for each message that is due it puts the real message
(``messageTimeup``) and moves the offset past it; the first message not yet due ends the level's
pass. A put that fails is retried later and never skipped, so a level keeps its order.

The offsets are kept in ``<root>/config/delayOffset.json`` as RocketMQ writes it (fastjson's pretty
format of a DelayOffsetSerializeWrapper, integer level keys unquoted:
``{"offsetTable":{1:12,2:0}}``), each flush interval and at stop.

Decisions where RocketMQ has a quirk (docs/rocketmq-remoting-spec.md §2.4.9):

* RocketMQ's delivered record keeps the properties string of the scheduled one, DELAY, REAL_TOPIC
  and REAL_QID included (messageTimeup clears DELAY from the map after the string was made). The
  delivered record here keeps REAL_TOPIC and REAL_QID too, but not DELAY (a put carrying DELAY > 0
  would be scheduled again), and carries WAIT=false: messageTimeup sets it so the put does not
  wait for a synchronous flush, and this store takes the wait from that property.
* A record the level's queue points at that is gone (retention), fails its checks, names no
  deliverable REAL_TOPIC / REAL_QID, or names RMQ_SYS_TRANS_HALF_TOPIC is skipped and logged.
  RocketMQ skips one it cannot read and the RMQ_SYS_TRANS_HALF_TOPIC one too, but delivers a
  damaged body unchecked and retries one without REAL_TOPIC / REAL_QID forever, blocking its level.
* A put that fails blocks its level for DELAY_FOR_A_WHILE (100 ms, what 4.9.7's synchronous
  delivery waits), a pass that raises for DELAY_FOR_A_PERIOD (10 s). A put whose status says the
  message is stored but not yet flushed counts as delivered (a retry would store it twice).
* The store clamps DELAY at level 18 whatever ``message_delay_level`` holds, so every one of the 18
  queues is walked; a level above the configured ones has the highest configured level's delay.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqstore.log._message import Message
from mqstore.broker.requests import wall_ms
from mqstore.errors import ConfigError, CorruptRecordError, StoreClosedError
from mqstore.queue.consume_queue import queue_problem

if TYPE_CHECKING:
    from mqstore.store import StoreBase

__all__ = ["DELAY_FOR_A_PERIOD_MS", "DELAY_FOR_A_WHILE_MS", "LevelStats", "MAX_DELAY_LEVEL", "SCHEDULE_TOPIC",
           "ScheduleMessageService", "decode_delay_offsets", "encode_delay_offsets"]

log = logging.getLogger("mqstore.schedule")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: the store puts DELAY levels above this one at this one (queues 0..17 of SCHEDULE_TOPIC_XXXX)
MAX_DELAY_LEVEL = 18
#: RocketMQ retries a level whose put failed after DELAY_FOR_A_WHILE (100 ms) ...
DELAY_FOR_A_WHILE_MS = 100
#: ... and one whose pass raised after DELAY_FOR_A_PERIOD (10 s)
DELAY_FOR_A_PERIOD_MS = 10_000
#: flushDelayOffsetInterval's default
FLUSH_DELAY_OFFSET_INTERVAL_MS = 10_000
#: how long the thread sleeps at most when nothing is due, so new messages are seen soon
IDLE_WAIT_MS = 100
#: messages one level delivers in one pass before the other levels get their turn
PASS_LIMIT = 1024
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"

_UNQUOTED_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")
_DECIMAL = re.compile(r"-?\d+")


# -- delayOffset.json ----------------------------------------------------------------------------
def encode_delay_offsets(table: dict[int, int]) -> str:
    """delayOffset.json as RocketMQ writes it: fastjson's pretty format (tab indent) of a
    DelayOffsetSerializeWrapper, whose Integer keys fastjson writes unquoted, right after the
    brace (its MapSerializer breaks the line only before a String key), levels in ascending order
    as its ConcurrentHashMap iterates small integers."""
    if not table:
        return '{\n\t"offsetTable":{}\n}'
    entries = ",".join(f"{level}:{offset}" for level, offset in sorted(table.items()))
    return '{\n\t"offsetTable":{' + entries + "\n\t}\n}"


def decode_delay_offsets(text: str) -> dict[int, int]:
    """The offsetTable of a delayOffset.json: integer level keys quoted or not (fastjson writes
    them bare), integer offsets. ValueError saying what is wrong."""
    try:
        obj = json.loads(_UNQUOTED_KEY.sub(r'\1"\2"\3', text))
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if type(obj) is not dict:
        raise ValueError("not a JSON object")
    table = obj.get("offsetTable", {})
    if table is None:
        table = {}
    if type(table) is not dict:
        raise ValueError("offsetTable is not an object")
    out: dict[int, int] = {}
    for key, value in table.items():
        if not _DECIMAL.fullmatch(key):
            raise ValueError(f"offsetTable key {key!r} is not an integer level")
        if type(value) is str and _DECIMAL.fullmatch(value):
            value = int(value)
        if type(value) is not int:
            raise ValueError(f"offsetTable[{key}] = {value!r} is not an integer offset")
        out[int(key)] = value
    return out


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        return "\x00" + str(exc)  # not UTF-8: decodes as damaged


def load_delay_offsets(path: str) -> dict[int, int]:
    """The offsets of `path`, as RocketMQ's ConfigManager.load reads a config file: a missing or
    empty file gives its .bak (or nothing when there is none), a damaged one its .bak; ConfigError
    naming the file when the .bak is needed and is damaged too, or missing for a damaged file."""
    text = _read_text(path)
    bak = path + ".bak"
    problem = None
    if text:
        try:
            return decode_delay_offsets(text)
        except ValueError as exc:
            problem = str(exc)
            log.warning("%s cannot be read (%s); loading %s", path, problem, bak)
    bak_text = _read_text(bak)
    if not bak_text:
        if problem is not None:
            raise ConfigError(f"{path} cannot be read ({problem}) and there is no {bak} to fall back on")
        return {}
    try:
        return decode_delay_offsets(bak_text)
    except ValueError as exc:
        first = f"{path} cannot be read ({problem}) and " if problem is not None else f"{path} is missing and "
        raise ConfigError(f"{first}{bak} cannot be read either ({exc})") from None


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_whole(path: str, text: str) -> None:
    """Write text to path whole (RocketMQ's MixAll.string2File, made atomic): into path.tmp,
    synced; the previous content kept as path.bak (itself replaced whole); then the rename."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    previous = _read_text(path)
    if previous is not None:
        bak_tmp = path + ".bak.tmp"
        with open(bak_tmp, "w", encoding="utf-8") as fh:
            fh.write(previous)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(bak_tmp, path + ".bak")
    os.replace(tmp, path)
    _fsync_dir(directory)


# -- the service -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LevelStats:
    """One delay level as an admin view shows it."""

    level: int
    delay_ms: int
    offset: int          # the next queue offset the level delivers
    max_offset: int      # the level's queue end (what is scheduled so far)
    delivered: int       # messages delivered since the service was made
    skipped: int         # records skipped as undeliverable since then
    blocked: str | None  # why the head message's last put failed (retried later), or None
    retry_at_ms: int     # when a blocked level tries again (0: not blocked)

    @property
    def pending(self) -> int:
        return max(0, self.max_offset - self.offset)


class ScheduleMessageService:
    """Delivers the delayed messages of `store`; offsets in ``<root>/config/delayOffset.json``.

    ``start()`` runs the delivery thread, ``stop()`` ends it and writes the offsets; ``deliver()``
    is one pass over every level (what the thread calls). ``levels_ms`` gives the delay of each
    level (default: the store's ``message_delay_level``); the tags codes the store computed with its
    own levels say when a message is due."""

    def __init__(self, store: StoreBase, root: str | os.PathLike[str], *, levels_ms: Sequence[int] | None = None,
                 flush_interval_ms: int = FLUSH_DELAY_OFFSET_INTERVAL_MS, idle_wait_ms: int = IDLE_WAIT_MS,
                 put_retry_ms: int = DELAY_FOR_A_WHILE_MS, error_retry_ms: int = DELAY_FOR_A_PERIOD_MS,
                 clock_ms: Callable[[], int] = wall_ms) -> None:
        self.store = store
        self.path = os.path.join(os.fspath(root), "config", "delayOffset.json")
        levels = tuple(store.config.delay_levels_ms if levels_ms is None else levels_ms)
        if not levels or any(type(d) is not int or d <= 0 for d in levels):
            raise ValueError(f"levels_ms must be one or more positive ints (ms), not {levels_ms!r}")
        self.levels_ms = levels[:MAX_DELAY_LEVEL]
        for name, value in (("flush_interval_ms", flush_interval_ms), ("idle_wait_ms", idle_wait_ms),
                            ("put_retry_ms", put_retry_ms), ("error_retry_ms", error_retry_ms)):
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive int (ms), not {value!r}")
        self.flush_interval_ms = flush_interval_ms
        self.idle_wait_ms = idle_wait_ms
        self.put_retry_ms = put_retry_ms
        self.error_retry_ms = error_retry_ms
        self.clock_ms = clock_ms
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._offsets: dict[int, int] = load_delay_offsets(self.path)
        self._persisted: dict[int, int] | None = None
        self._delivered = dict.fromkeys(range(1, MAX_DELAY_LEVEL + 1), 0)
        self._skipped = dict.fromkeys(range(1, MAX_DELAY_LEVEL + 1), 0)
        self._blocked: dict[int, str] = {}
        self._retry_at: dict[int, int] = {}
        self._next_due_ms: int | None = None
        self._more = False
        self.error: BaseException | None = None
        self._correct_offsets()

    # -- levels and offsets
    def delay_of(self, level: int) -> int:
        """The delay (ms) of a level; above the configured levels, the highest one's (the store's
        dispatch computes those messages' delivery times with it)."""
        return self.levels_ms[min(level, len(self.levels_ms)) - 1]

    @property
    def delay_level_table(self) -> dict[int, int]:
        """level -> delay (ms), the configured levels (delayLevelTable)."""
        return {level: delay for level, delay in enumerate(self.levels_ms, 1)}

    def offset_table(self) -> dict[int, int]:
        """level -> the next queue offset to deliver, the levels that have one (offsetTable)."""
        with self._lock:
            return dict(self._offsets)

    def _correct_offsets(self) -> None:
        """A loaded offset outside its queue's [min, max] is moved to the nearest end
        (correctDelayOffset), once the dispatcher has caught up with the CommitLog."""
        if not self.store.wait_dispatched(timeout_ms=5000):
            log.warning("delay offsets not checked against the queues: the dispatcher is behind")
            return
        for level, offset in list(self._offsets.items()):
            if not 1 <= level <= MAX_DELAY_LEVEL:
                continue  # kept and written back as RocketMQ does; no queue of the store has it
            lo = self.store.get_min_offset_in_queue(SCHEDULE_TOPIC, level - 1)
            hi = self.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1)
            fixed = min(max(offset, lo), hi)
            if fixed != offset:
                log.error("delay level %d: offset %d is outside its queue [%d, %d]; corrected to %d",
                          level, offset, lo, hi, fixed)
                self._offsets[level] = fixed

    # -- delivery
    def deliver(self, now_ms: int | None = None) -> int:
        """One pass: every level delivers its due messages in order (at most PASS_LIMIT each);
        returns how many were delivered. StoreClosedError when the store is shut down."""
        with self._lock:
            now = self.clock_ms() if now_ms is None else now_ms
            self._next_due_ms = None
            self._more = False
            total = 0
            for level in range(1, MAX_DELAY_LEVEL + 1):
                retry_at = self._retry_at.get(level, 0)
                if retry_at > now:
                    self._due(retry_at)
                    continue
                try:
                    total += self._deliver_level(level, now)
                except StoreClosedError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the level waits; the others go on
                    log.exception("delay level %d: delivery failed; retried in %d ms", level, self.error_retry_ms)
                    self._block(level, f"{type(exc).__name__}: {exc}", now + self.error_retry_ms)
            return total

    def _due(self, at_ms: int) -> None:
        if self._next_due_ms is None or at_ms < self._next_due_ms:
            self._next_due_ms = at_ms

    def _block(self, level: int, why: str, retry_at: int) -> None:
        self._blocked[level] = why
        self._retry_at[level] = retry_at
        self._due(retry_at)

    def _deliver_level(self, level: int, now: int) -> int:
        store = self.store
        qid = level - 1
        offset = self._offsets.get(level, 0)
        hi = store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid)
        if offset >= hi:
            if offset > hi and store.dispatch_behind_bytes == 0:  # not a queue the dispatcher is still building
                log.error("delay level %d: offset %d is past its queue's end %d; corrected", level, offset, hi)
                self._offsets[level] = hi
            return 0
        lo = store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid)
        if offset < lo:
            log.error("delay level %d: offset %d is below its queue's min %d (retention); corrected", level, offset, lo)
            offset = self._offsets[level] = lo
        cq = store.consume_queues.get(SCHEDULE_TOPIC, qid)
        if cq is None:
            return 0
        max_deliver = now + self.delay_of(level)
        delivered = handled = 0
        while offset < hi:
            if handled >= PASS_LIMIT or self._stop.is_set():
                self._more = True
                break
            unit = cq.unit(offset)
            if unit is None:
                self._due(now + self.put_retry_ms)  # not readable yet (or just deleted): look again
                break
            phy, _size, deliver_at = unit
            if deliver_at > max_deliver:
                deliver_at = now  # a delivery time further than the level's delay: the clock went back
            if deliver_at > now:
                self._due(deliver_at)
                break
            message = self._real_message(level, offset, phy)
            if message is not None:
                result = store.put_message(message)
                if not result.status.is_stored:
                    why = f"{result.status.name}: {result.detail}"
                    if self._blocked.get(level) != why:
                        log.warning("delay level %d: the put of queue offset %d (%s/%d) failed (%s); "
                                    "retried in %d ms", level, offset, message.topic, message.queue_id, why,
                                    self.put_retry_ms)
                    self._block(level, why, now + self.put_retry_ms)
                    break
                delivered += 1
                self._delivered[level] += 1
            else:
                self._skipped[level] += 1
            handled += 1
            offset += 1
            self._offsets[level] = offset
            self._blocked.pop(level, None)
            self._retry_at.pop(level, None)
        return delivered

    def _real_message(self, level: int, offset: int, phy: int) -> Message | None:
        """The message to put for the scheduled record at phy (messageTimeup), or None when the
        record cannot be delivered (logged; the caller skips it)."""
        where = f"delay level {level}, queue offset {offset}, CommitLog offset {phy}"
        try:
            view = self.store.look_message_by_offset(phy)
        except CorruptRecordError as exc:
            log.error("%s: the record fails its checks (%s); skipped", where, exc)
            return None
        if view is None:
            log.warning("%s: no record there any more; skipped", where)
            return None
        record = view.decode(read_body=True)
        props = dict(record.properties)
        props.pop("DELAY", None)
        real_topic = props.get("REAL_TOPIC")
        real_qid = props.get("REAL_QID", "")
        problem = None
        if real_topic is None:
            problem = "it has no REAL_TOPIC"
        elif not _DECIMAL.fullmatch(real_qid):
            problem = f"its REAL_QID {real_qid!r} is not a queue id"
        else:
            problem = queue_problem(real_topic, int(real_qid))
        if problem is None and real_topic == TRANS_HALF_TOPIC:
            problem = f"its real topic is {TRANS_HALF_TOPIC}"
        if problem is not None:
            log.error("%s: cannot be delivered (%s); skipped", where, problem)
            return None
        assert real_topic is not None
        props["WAIT"] = "false"
        return Message(real_topic, record.body or b"", queue_id=int(real_qid), flag=record.flag, properties=props,
                       born_timestamp=record.born_timestamp, born_host=record.born_host, sys_flag=record.sys_flag,
                       reconsume_times=record.reconsume_times)

    # -- the thread
    def start(self) -> None:
        """Run the delivery thread (a daemon); RuntimeError when it already runs."""
        if self._thread is not None:
            raise RuntimeError("the schedule service is already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mqstore-schedule", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the thread (waiting at most timeout_s for it) and write the offsets."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.error("the schedule service did not stop within %.0f s", timeout_s)
        if thread is None or not thread.is_alive():
            self._stop.clear()  # deliver() called after stop() delivers in full
        self.persist()

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_ms / 1000
        while not self._stop.is_set():
            try:
                self.deliver()
            except StoreClosedError:
                log.info("the store is shut down: the schedule service stops delivering")
                break
            except Exception as exc:  # noqa: BLE001 - kept for the owner, the loop goes on
                self.error = exc
                log.exception("schedule service pass failed")
                self._stop.wait(self.error_retry_ms / 1000)
                continue
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + self.flush_interval_ms / 1000
                try:
                    self.persist(only_if_changed=True)
                except OSError as exc:
                    self.error = exc
                    log.exception("cannot write %s", self.path)
            if self._more:
                continue
            wait = self.idle_wait_ms
            if self._next_due_ms is not None:
                wait = min(wait, max(0, self._next_due_ms - self.clock_ms()))
            self._stop.wait(wait / 1000)

    # -- persistence and stats
    def offsets_json(self) -> str:
        """delayOffset.json's text of the offsets now (GET_ALL_DELAY_OFFSET answers it)."""
        with self._lock:
            return encode_delay_offsets(dict(self._offsets))

    def replace_offsets(self, table: dict[int, int]) -> None:
        """Every level's offset, as a slave takes its master's (SlaveSynchronize); written at once."""
        with self._lock:
            self._offsets = dict(table)
        self.persist(only_if_changed=True)

    def persist(self, *, only_if_changed: bool = False) -> None:
        """Write delayOffset.json whole (the old one kept as .bak)."""
        with self._lock:
            table = dict(self._offsets)
        if only_if_changed and table == self._persisted:
            return
        _write_whole(self.path, encode_delay_offsets(table))
        self._persisted = table

    def stats(self) -> list[LevelStats]:
        """Every configured level, and any level above them that has messages or an offset."""
        out = []
        with self._lock:
            for level in range(1, MAX_DELAY_LEVEL + 1):
                hi = self.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1)
                offset = self._offsets.get(level, 0)
                if level > len(self.levels_ms) and not hi and level not in self._offsets:
                    continue
                out.append(LevelStats(level, self.delay_of(level), offset, hi, self._delivered[level],
                                      self._skipped[level], self._blocked.get(level), self._retry_at.get(level, 0)))
        return out

    def running_stats(self) -> dict[str, str]:
        """RocketMQ's buildRunningStats: ``scheduleMessageOffset_<level>`` = "offset,maxOffset" for
        each level of the offset table (GET_BROKER_RUNTIME_INFO shows them)."""
        with self._lock:
            table = sorted(self._offsets.items())
        out = {}
        for level, offset in table:
            hi = self.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1) if 1 <= level <= MAX_DELAY_LEVEL else 0
            out[f"scheduleMessageOffset_{level}"] = f"{offset},{hi}"
        return out
