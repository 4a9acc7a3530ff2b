"""Status codes have one C definition (ext/include/mq_status.h) that mqstore.status agrees with,
and the dispatch kernel's queue cache survives a failed growth (issue 16 item 2).

The kernels cimport the codes from mq_status.h (through ext/mq_status.pxd); mqstore.log._commitlog
exports them as compiled (``_C_STATUS_CODES``). A code added, renamed or renumbered on one side
only fails here.
"""

from __future__ import annotations

import enum
import inspect
import re
import struct
from pathlib import Path

import pytest

from mqstore import status
from mqstore.log._commitlog import _C_STATUS_CODES
from mqstore.queue._dispatch import DispatchKernel, _fail_next_grow_allocation
from mqstore.status import AppendMessageStatus, GetMessageStatus, PutMessageStatus
from helpers_mem import mem_queue_class
from mqstore.twin.codec import MESSAGE_MAGIC_CODE, record_length

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "ext" / "include" / "mq_status.h"
PXD = ROOT / "ext" / "mq_status.pxd"
LISTS = {"MQ_PUT_STATUS_LIST": "PutMessageStatus", "MQ_GET_STATUS_LIST": "GetMessageStatus",
         "MQ_APPEND_STATUS_LIST": "AppendMessageStatus"}


def python_enums() -> dict[str, type[enum.IntEnum]]:
    """Every status enum mqstore.status defines (an IntEnum with members)."""
    return {name: cls for name, cls in vars(status).items()
            if inspect.isclass(cls) and issubclass(cls, enum.IntEnum) and cls.__module__ == status.__name__
            and len(cls.__members__) > 0}


def header_lists() -> dict[str, list[tuple[str, str, int]]]:
    """{enum name: [(C name, Python name, value)]} as written in mq_status.h."""
    text = HEADER.read_text()
    out: dict[str, list[tuple[str, str, int]]] = {}
    for macro, enum_name in LISTS.items():
        m = re.search(rf"#define {macro}\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
        assert m, f"{macro} is missing from {HEADER}"
        out[enum_name] = [(c, py, int(v)) for c, py, v in re.findall(r"X\((\w+),\s*(\w+),\s*(-?\d+)\)", m.group(1))]
    return out


def test_the_status_enums_are_the_ones_in_the_header():
    assert set(python_enums()) == set(_C_STATUS_CODES) == set(LISTS.values())
    assert python_enums() == {"PutMessageStatus": PutMessageStatus, "GetMessageStatus": GetMessageStatus,
                              "AppendMessageStatus": AppendMessageStatus}


@pytest.mark.parametrize("name", sorted(LISTS.values()))
def test_python_members_equal_the_compiled_c_codes(name):
    """Every member of the Python enum equals the C code of its name, and every C code has a
    Python member (aliases included: __members__ lists them)."""
    py = {member: int(value) for member, value in python_enums()[name].__members__.items()}
    c = _C_STATUS_CODES[name]
    assert sorted(set(py) - set(c)) == [], f"{name} members with no code in mq_status.h"
    assert sorted(set(c) - set(py)) == [], f"mq_status.h codes with no {name} member"
    assert py == c


@pytest.mark.parametrize("name", sorted(LISTS.values()))
def test_codes_are_contiguous_from_zero_in_definition_order(name):
    """The kernels turn a code into its member by indexing tuple(enum): no gaps, no aliases,
    and the definition order is the numeric order."""
    cls = python_enums()[name]
    assert [int(m) for m in cls] == list(range(len(cls))) == sorted(_C_STATUS_CODES[name].values())
    assert len(cls.__members__) == len(cls)


def test_the_build_is_the_header():
    """The compiled codes are what mq_status.h says (a stale build fails here), and the .pxd
    declares every C name of the header (the kernels can use each one)."""
    lists = header_lists()
    for name, entries in lists.items():
        assert {py: v for _, py, v in entries} == _C_STATUS_CODES[name], \
            f"{name}: the build differs from {HEADER.name}; rebuild the extensions"
    c_names = [c for entries in lists.values() for c, _, _ in entries]
    assert len(c_names) == len(set(c_names))
    assert all(c.startswith("MQ_") for c in c_names)
    declared = set(re.findall(r"^\s+(MQ_\w+)\s*$", PXD.read_text(), re.M))
    assert declared == set(c_names)


def test_rocketmq_numbers_are_kept():
    """RocketMQ 4.9.7's ordinals (and mqstore's MESSAGE_CORRUPTED after them)."""
    assert _C_STATUS_CODES["PutMessageStatus"]["PUT_OK"] == 0
    assert _C_STATUS_CODES["PutMessageStatus"]["SERVICE_NOT_AVAILABLE"] == 4
    assert _C_STATUS_CODES["PutMessageStatus"]["MESSAGE_ILLEGAL"] == 6
    assert _C_STATUS_CODES["PutMessageStatus"]["LMQ_CONSUME_QUEUE_NUM_EXCEEDED"] == 10
    assert _C_STATUS_CODES["GetMessageStatus"]["FOUND"] == 0
    assert _C_STATUS_CODES["GetMessageStatus"]["NO_MESSAGE_IN_QUEUE"] == 8
    assert _C_STATUS_CODES["GetMessageStatus"]["MESSAGE_CORRUPTED"] == 9
    assert _C_STATUS_CODES["AppendMessageStatus"]["UNKNOWN_ERROR"] == 4


# -- DispatchKernel._grow: a failed allocation keeps the old queue cache -----------------------------

CQ_FILE = 20 * 64  # units per in-memory ConsumeQueue file


MemQueue = mem_queue_class(CQ_FILE)


def record(queue_id: int, queue_offset: int, phy: int) -> bytes:
    """A CommitLog record (spec §1.2) of topic T with no body and no properties."""
    size = record_length(0, 1, 0, 0, False)
    return b"".join([
        struct.pack(">iiiiiqqiq", size, MESSAGE_MAGIC_CODE, 0, queue_id, 0, queue_offset, phy, 0, 0),
        bytes(8), struct.pack(">q", 1_700_000_000_000 + phy), bytes(8), struct.pack(">iqi", 0, 0, 0),
        struct.pack(">B", 1), b"T", struct.pack(">h", 0),
    ])


class Queues:
    """The lookup of a DispatchKernel, counting its calls (a cached queue is not looked up)."""

    def __init__(self) -> None:
        self.queues: dict[int, MemQueue] = {}
        self.lookups = 0

    def __call__(self, topic: str, queue_id: int) -> MemQueue:
        self.lookups += 1
        if queue_id not in self.queues:
            self.queues[queue_id] = MemQueue(topic, queue_id)
        return self.queues[queue_id]


class Log:
    """A CommitLog in memory that records are appended to (a queue takes a unit only for a
    record past the last it indexed, so every dispatch goes on where the last one ended)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def dispatch(self, kernel: DispatchKernel, units: list[tuple[int, int]]) -> int:
        """Append records of (queue_id, queue_offset) and dispatch them; the units appended."""
        start = len(self.data)
        for queue_id, queue_offset in units:
            self.data += record(queue_id, queue_offset, len(self.data))
        stop, reason, records, appended, _ = kernel.dispatch(bytes(self.data), 0, start, len(self.data))
        assert (stop, reason, records) == (len(self.data), "end", len(units))
        return appended


@pytest.fixture
def no_fault():
    yield
    _fail_next_grow_allocation(0)


@pytest.mark.parametrize("which", [1, 2])
def test_a_failed_growth_keeps_the_queue_cache(which, no_fault):
    queues, log = Queues(), Log()
    kernel = DispatchKernel(queues)
    # the first table has 64 slots and grows when a 33rd queue comes (half full)
    assert log.dispatch(kernel, [(q, 0) for q in range(32)]) == 32
    assert queues.lookups == 32
    _fail_next_grow_allocation(which)
    with pytest.raises(MemoryError):
        log.dispatch(kernel, [(32, 0)])
    assert queues.lookups == 33
    # the 32 cached queues are still found, with no look-up, and take units
    assert log.dispatch(kernel, [(q, 1) for q in range(32)]) == 32
    assert queues.lookups == 33
    # the growth succeeds later (the record that failed is dispatched again); every queue is
    # cached afterwards
    size = len(record(0, 0, 0))
    assert kernel.dispatch(bytes(log.data), 0, 32 * size, 33 * size)[1:4] == ("end", 1, 1)
    assert queues.lookups == 34
    assert log.dispatch(kernel, [(q, 2) for q in range(32)] + [(32, 1)]) == 33
    assert queues.lookups == 34
    assert {q.queue_id: q.max_offset_in_queue for q in queues.queues.values()} == \
        {q: 3 if q < 32 else 2 for q in range(33)}
    kernel.forget()
    assert log.dispatch(kernel, [(q, 3) for q in range(32)] + [(32, 2)]) == 33
    assert queues.lookups == 34 + 33


@pytest.mark.parametrize("which", [1, 2])
def test_a_failed_first_allocation_raises_memory_error(which, no_fault):
    _fail_next_grow_allocation(which)
    with pytest.raises(MemoryError):
        DispatchKernel(Queues())
    # the fault fires once
    assert Log().dispatch(DispatchKernel(Queues()), [(0, 0)]) == 1


def test_the_fault_hook_takes_only_known_allocations():
    with pytest.raises(ValueError):
        _fail_next_grow_allocation(3)
    with pytest.raises(ValueError):
        _fail_next_grow_allocation(-1)
