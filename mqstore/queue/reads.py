"""The read path of a store (spec §11, §3 getOffsetInQueueByTime, §4.4 queryMessage).

``MessageReader`` serves getMessage, lookups by physical offset and by key, time lookups and
the min/max offsets. Messages come back as ``MessageView`` objects: zero-copy views on the
mapped CommitLog files, decoded field by field on access. The scans run in the compiled
kernels (mqstore.queue._consumequeue, mqstore.queue._search).

With ``check_crc_on_read`` every message a read returns has its body CRC checked first
(mqstore.queue._search.first_corrupt / record_status, one C call per getMessage result): see
``MessageReader.verified``, the look-ups of ``ReadKernel`` (mqstore.queue._reads) and ``query_message``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqstore.queue._consumequeue import CQ_STORE_UNIT_SIZE
from mqstore.queue._reads import GetMessageResult, LogMap, MessageView, ReadKernel, record_problem
from mqstore.queue._search import RECORD_OK, first_corrupt, offset_by_time, record_status
from mqstore.errors import CorruptRecordError
from mqstore.layout import log_of
from mqstore.status import GetMessageStatus

if TYPE_CHECKING:
    from mqstore.log.commitlog import CommitLog
    from mqstore.config import StoreConfig
    from mqstore.queue.consume_queue import ConsumeQueue, ConsumeQueueTable

UNIT = CQ_STORE_UNIT_SIZE
log = logging.getLogger("mqstore.reads")


def total_physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        return 8 << 30


@dataclass
class TimeLookup:
    """Result of a time → queue offset lookup, with what the search touched."""

    offset: int
    cq_pages: int = 0
    commitlog_pages: int = 0
    probes: int = 0


@dataclass
class QueryMessageResult:
    """Messages found by key (spec §4.4), ascending by physical offset. ``corrupt_offsets``:
    physical offsets of records the index pointed to that were left out because they are
    damaged (a body CRC mismatch with check_crc_on_read, or bytes that do not decode)."""

    messages: list[MessageView] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0
    corrupt_offsets: list[int] = field(default_factory=list)


class CorruptedMessageResult(GetMessageResult):
    """The result of a getMessage whose first message is damaged (check_crc_on_read): status
    MESSAGE_CORRUPTED, no messages, next_begin_offset = the damaged message's queue offset.

    ``corrupt_physical_offset`` and ``corrupt_queue_offset`` locate the record; ``detail``
    says what is wrong and names both. Reading on from next_begin_offset + 1 skips it."""

    corrupt_physical_offset: int
    corrupt_queue_offset: int
    detail: str

    def __init__(self, next_begin_offset: int, min_offset: int, max_offset: int, *, physical_offset: int,
                 detail: str) -> None:
        super().__init__(GetMessageStatus.MESSAGE_CORRUPTED, next_begin_offset, min_offset, max_offset)
        self.corrupt_physical_offset = physical_offset
        self.corrupt_queue_offset = next_begin_offset
        self.max_phy_offset_pulling = physical_offset
        self.detail = detail

    def __repr__(self) -> str:
        return (f"CorruptedMessageResult(status=MESSAGE_CORRUPTED, next_begin_offset={self.next_begin_offset}, "
                f"min_offset={self.min_offset}, max_offset={self.max_offset}, detail={self.detail!r})")


_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
# what each argument of the read API takes: (types, description, lowest, highest)
_ARGUMENTS: dict[str, tuple[tuple[type, ...], str, int | None, int | None]] = {
    "group": ((str,), "a str (the consumer group)", None, None),
    "topic": ((str,), "a str", None, None),
    "key": ((str,), "a str", None, None),
    "queue_id": ((int,), "an int in 0 .. 2147483647", 0, _INT32_MAX),
    "offset": ((int,), "an int (a queue offset)", -_INT64_MAX, _INT64_MAX),
    "queue_offset": ((int,), "an int (a queue offset)", -_INT64_MAX, _INT64_MAX),
    "phy_offset": ((int,), "an int (a CommitLog byte offset)", -_INT64_MAX, _INT64_MAX),
    "max_msg_nums": ((int,), "an int in 1 .. 2147483647", -_INT32_MAX, _INT32_MAX),
    "max_num": ((int,), "an int in 1 .. 2147483647", -_INT32_MAX, _INT32_MAX),
    "timestamp": ((int,), "an int (ms since the epoch)", -_INT64_MAX, _INT64_MAX),
    "begin": ((int,), "an int (ms since the epoch)", -_INT64_MAX, _INT64_MAX),
    "end": ((int,), "an int (ms since the epoch)", -_INT64_MAX, _INT64_MAX),
    "tags": ((str, type(None)), "a tags expression (\"*\", \"TagA || TagB\"), a list of tags, or None", None, None),
}


def argument_error(method: str, exc: BaseException, **arguments: Any) -> BaseException:
    """The error to raise when a read kernel refused its arguments (TypeError, OverflowError):
    a TypeError or ValueError naming the first argument that is wrong and what it takes, or
    exc itself when every argument looks right (the kernel's own message then stands)."""
    for name, value in arguments.items():
        types, wanted, low, high = _ARGUMENTS[name]
        if isinstance(value, bool) or not isinstance(value, types):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return TypeError(f"{method}(): {name} must be {wanted}, got {type(value).__name__} {shown}")
        if low is not None and high is not None and isinstance(value, int) and not low <= value <= high:
            return ValueError(f"{method}(): {name}={value} is out of range: it must be {wanted}")
    return exc


def check_arguments(method: str, **arguments: Any) -> None:
    """Raise the TypeError or ValueError naming the first wrong argument, if one is wrong
    (callers test the types inline first, so a right call pays nothing more)."""
    error = argument_error(method, _NO_ERROR, **arguments)
    if error is not _NO_ERROR:
        raise error


_NO_ERROR = TypeError()


def tags_expression(tags: Any) -> str:
    """A list (any iterable) of tags as the expression "A || B"; TypeError naming the
    argument when it is not an iterable of non-empty str."""
    try:
        items = list(tags)
    except TypeError:
        raise TypeError(f"get_message(): tags must be {_ARGUMENTS['tags'][1]}, got {type(tags).__name__}") from None
    for tag in items:
        if not isinstance(tag, str) or not tag.strip():
            raise TypeError(f"get_message(): tags must be {_ARGUMENTS['tags'][1]}; the list holds {tag!r}")
    if not items:
        raise ValueError("get_message(): tags is an empty list; use None or \"*\" for every message")
    return " || ".join(items)


def _pinned(files: list[Any]) -> tuple[list[Any], list[memoryview]]:
    """The files still mapped, each pinned by a memoryview (an exported buffer defers munmap):
    retention may delete a ConsumeQueue file meanwhile (spec §14), and the time search reads
    the file without the GIL."""
    kept, pins = [], []
    for mf in files:
        try:
            pins.append(memoryview(mf))
        except ValueError:  # unmapped: deleted since the list was taken
            continue
        kept.append(mf)
    return kept, pins


def _unit_time(m: LogMap, mf: Any, pos: int, min_phy: int) -> int | None:
    phy = int.from_bytes(mf.read(pos, 8), "big", signed=True)
    if phy < min_phy:
        return None
    ts = m.store_timestamp(phy)
    return ts if ts >= 0 else None


def offset_by_time_in_files(files: list[Any], unit_range: Callable[[Any], tuple[int, int]], m: LogMap, min_phy: int,
                            timestamp: int, warm: int, max_offset: int) -> TimeLookup:
    """spec §3 getOffsetInQueueByTime over one queue's mapped files (oldest first):
    unit_range(mf) gives the [lo, hi] unit positions of a file that hold the queue's units,
    m the CommitLog files; max_offset is the answer when no unit qualifies. The file whose
    last unit is at or after timestamp is searched (the C kernel, Kafka's hot/cold split),
    then the nearest-entry rule is applied across the boundary with the file before."""
    if not files:
        return TimeLookup(max_offset)
    chosen = None
    for i, mf in enumerate(files):
        lo, hi = unit_range(mf)
        if hi < lo:
            continue
        chosen = (i, mf, lo, hi)
        last_time = _unit_time(m, mf, hi, min_phy)
        if last_time is not None and last_time >= timestamp:
            break
    if chosen is None:
        return TimeLookup(max_offset)
    i, mf, lo, hi = chosen
    pos, cq_pages, cl_pages, probes = offset_by_time(mf, lo, hi, timestamp, min_phy, m, warm)
    result = TimeLookup((mf.file_from + pos) // UNIT, cq_pages, cl_pages, probes)
    if pos == lo and i > 0:
        # nearest-entry rule across the file boundary: the previous file's last unit
        right = _unit_time(m, mf, pos, min_phy)
        prev: Any = files[i - 1]
        plo, phi = unit_range(prev)
        left = _unit_time(m, prev, phi, min_phy) if phi >= plo else None
        if right is not None and right > timestamp and left is not None and timestamp - left <= right - timestamp:
            result.offset = (prev.file_from + phi) // UNIT
    return result


class MessageReader(ReadKernel):
    """getMessage, the look-ups and the min/max getters run in the compiled ReadKernel (one C
    call each); the time search, query by key and the rest are orchestrated here."""

    def __init__(self, commitlog: CommitLog | list[CommitLog], queues: ConsumeQueueTable,
                 index: Any | None | list[Any], config: StoreConfig) -> None:
        """commitlog and index: the store's, or, for a store with several CommitLogs, a list of
        each log's (docs/parallel-commitlogs.md)."""
        commitlogs = commitlog if isinstance(commitlog, list) else [commitlog]
        super().__init__(queues.by_key, [cl.queue for cl in commitlogs], commitlogs[0].ctl)
        #: every CommitLog by log id; ``commitlog`` is log 0's
        self.commitlogs = commitlogs
        self.commitlog = commitlogs[0]
        self.consume_queues = queues
        #: every log's IndexService (None where the index is off); ``index`` is log 0's
        self.indexes = index if isinstance(index, list) else [index]
        self.index = self.indexes[0]
        self.memory = total_physical_memory()
        self.config = config
        # spec §14: drop the cached map of the CommitLog files as soon as retention deleted
        # some, so their mappings (and disk space) go once no result holds them
        for cl in commitlogs:
            cl.queue.on_files_removed(self._commitlog_files_removed)

    def _commitlog_files_removed(self) -> None:
        self.forget_log_map()

    @property
    def config(self) -> StoreConfig:
        return self._config

    @config.setter
    def config(self, config: StoreConfig) -> None:
        """Take the read limits of config: transfer caps, in-memory share, warm tail bytes."""
        self._config = config
        self.in_memory_limit = self.memory * config.access_message_in_memory_max_ratio // 100
        self.check_crc_on_read = config.check_crc_on_read
        self.warm_bytes = config.time_lookup_warm_bytes
        self.set_transfer_limits(max_bytes_memory=config.max_transfer_bytes_on_message_in_memory,
                                 max_count_memory=config.max_transfer_count_on_message_in_memory,
                                 max_bytes_disk=config.max_transfer_bytes_on_message_in_disk,
                                 max_count_disk=config.max_transfer_count_on_message_in_disk)

    def pickup_store_timestamp(self, phy_offset: int) -> int:
        k = log_of(phy_offset)
        if not 0 <= k < len(self.commitlogs):
            return -1
        cl = self.commitlogs[k]
        if phy_offset < cl.min_offset or phy_offset >= cl.max_offset:
            return -1
        return self.log_map(k).store_timestamp(phy_offset)

    def get_earliest_message_time(self, topic: str | None = None, queue_id: int = 0) -> int:
        """Store time of the first message of a queue, or of the whole store (the earliest of
        every CommitLog's first message); -1 if none."""
        if topic is None:
            times = [self.pickup_store_timestamp(cl.min_offset) for cl in self.commitlogs
                     if cl.min_offset < cl.max_offset]
            return min((t for t in times if t >= 0), default=-1)
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.min_offset_in_queue)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get(topic, queue_id)
        return 0 if cq is None else cq.max_offset_in_queue

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get(topic, queue_id)
        return 0 if cq is None else cq.min_offset_in_queue

    # -- time → queue offset (spec §3, §15) --------------------------------------------------
    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        return self.offset_in_queue_by_time(topic, queue_id, timestamp).offset

    def offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int,
                                warm_bytes: int | None = None) -> TimeLookup:
        """The queue offset whose store time is nearest to timestamp: the earliest exact
        match, else the closer neighbour (ties to the older one). Unknown queue → 0."""
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return TimeLookup(0)
        files, pins = _pinned(cq.files.files)
        try:
            return self._offset_by_time(cq, files, timestamp, warm_bytes)
        finally:
            for pin in pins:
                pin.release()

    def _offset_by_time(self, cq: ConsumeQueue, files: list[Any], timestamp: int,
                        warm_bytes: int | None) -> TimeLookup:
        return offset_by_time_in_files(files, lambda mf: self._unit_range(cq, mf), self.log_map(cq.log_id),
                                       self.commitlogs[cq.log_id].min_offset, timestamp,
                                       self.warm_bytes if warm_bytes is None else warm_bytes,
                                       cq.max_offset_in_queue)

    def _unit_range(self, cq: ConsumeQueue, mf: Any) -> tuple[int, int]:
        file_from = mf.file_from
        lo = max(0, cq.min_logic_offset - file_from)
        end = cq.max_logic_offset - file_from if mf is cq.current_file else mf.wrote_position
        end = min(end, cq.file_size)
        return lo, end - UNIT

    # -- body CRC on read (check_crc_on_read) ---------------------------------------------------
    def verified(self, result: GetMessageResult, group: str, topic: str, queue_id: int, offset: int,
                 max_msg_nums: int, tags: str | None, capped: bool = True) -> GetMessageResult:
        """result (of get_message with these arguments) with every message's body CRC checked
        in one C call. All good: result itself. The first damaged message at index i > 0: the
        get is repeated for the i messages before it (FOUND, next_begin_offset right after
        the last of them, so the next get starts at the damaged one). At index 0: a
        CorruptedMessageResult (MESSAGE_CORRUPTED) naming its physical and queue offsets,
        whose next_begin_offset stays at it. The repeats run only when something is damaged,
        and each result they give is checked again."""
        limit = max_msg_nums
        while len(result):
            phys = result.physical_offsets
            bad, status = first_corrupt(phys, self.log_map(log_of(phys[0])))  # a queue's units: one log
            if bad < 0:
                break
            if bad > 0:
                limit = bad
            elif limit == 1:
                # one message, damaged: the scan stopped right after its unit
                return self._corrupted(result, topic, queue_id, status)
            else:
                limit = 1
            result = ReadKernel.get_message(self, group, topic, queue_id, offset, limit, tags, capped)
        return result

    def _corrupted(self, result: GetMessageResult, topic: str, queue_id: int, status: int) -> CorruptedMessageResult:
        phy = result.physical_offsets[0]
        queue_offset = result.next_begin_offset - 1
        detail = (f"the message at queue offset {queue_offset} of {topic}/{queue_id} (physical offset {phy}) is "
                  f"damaged: {record_problem(status)}; run `mqstore verify` on the store, or read on "
                  f"from queue offset {queue_offset + 1} to skip it")
        log.error("get_message: %s", detail)
        return CorruptedMessageResult(queue_offset, result.min_offset, result.max_offset, physical_offset=phy,
                                      detail=detail)

    # -- by key (spec §4.4) -----------------------------------------------------------------
    def query_message(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryMessageResult:
        """Messages of topic whose KEYS or UNIQ_KEY is key, stored in [begin, end] (ms).
        Every hit of the index is checked against the real key, so a hash collision never
        returns a wrong message.

        Damaged records are skipped, not raised: with check_crc_on_read a matching message
        whose body fails its CRC (or whose header does not parse), and whatever the setting
        a record whose topic or properties do not decode, is left out with an error logged
        and its physical offset listed in the result's ``corrupt_offsets``; the other
        messages are still returned."""
        result = QueryMessageResult()
        indexes = [index for index in self.indexes if index is not None]
        if not indexes:
            return result
        want = max(1, min(max_num, self.config.max_msgs_num_batch))
        phys: set[int] = set()  # a re-dispatched newest entry may repeat
        for index in indexes:  # with several CommitLogs, each log's index (docs/parallel-commitlogs.md)
            found = index.query_offset(topic, key, want, begin, end)
            phys.update(found.phy_offsets)
            if found.index_last_update_timestamp >= result.index_last_update_timestamp:
                result.index_last_update_timestamp = found.index_last_update_timestamp
                result.index_last_update_phy_offset = found.index_last_update_phy_offset
        check = self.check_crc_on_read
        for phy in sorted(phys):
            view = self.look_message_by_offset(phy, check=False)  # checked below, once it matches
            if view is None:
                continue
            try:
                if view.topic != topic:
                    continue
                props = view.properties
                if not (props.get("UNIQ_KEY") == key or key in props.get("KEYS", "").split(" ")):
                    continue
                status = record_status(view.buffer) if check else RECORD_OK
                problem = record_problem(status) if status != RECORD_OK else ""
            except (CorruptRecordError, UnicodeDecodeError) as exc:
                problem = f"its topic or properties do not decode ({exc})"
            if problem:
                log.error("query_message(%r, %r): skipping the record at physical offset %d: it is damaged: %s",
                          topic, key, phy, problem)
                result.corrupt_offsets.append(phy)
                continue
            result.messages.append(view)
        if len(indexes) > 1 and len(result.messages) > want:
            # each log's index gave up to want: the newest want of them, by store time
            newest = sorted(result.messages, key=lambda v: v.store_timestamp, reverse=True)[:want]
            result.messages = sorted(newest, key=lambda v: v.physical_offset)
        return result
