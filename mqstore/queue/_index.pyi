"""Type stubs for the compiled ``mqstore.queue._index`` (ext/mqstore/queue/_index.pyx).

IndexFile (spec §4.1-§4.3): the hash index of one ``ROOT/index/<yyyyMMddHHmmssSSS>`` file:
a 40-byte header, ``hash_slot_num`` 4-byte slots, ``index_num`` 20-byte entries (entry #0 unused).
"""

from typing import Final, Protocol

from _typeshed import ReadableBuffer

from typing_extensions import disjoint_base

from mqstore.log._mapped import MappedFile

INDEX_HEADER_SIZE: Final = 40
HASH_SLOT_SIZE: Final = 4
INDEX_SIZE: Final = 20

class _Mapping(Protocol):
    """A wrapper IndexFile takes instead of a MappedFile: ``mapped`` is the MappedFile (at least
    ``file_size`` bytes), the rest is the wrapper's (mqstore.queue.index's carries the file's name)."""

    @property
    def mapped(self) -> MappedFile: ...
    @property
    def file_size(self) -> int: ...
    @property
    def file_name(self) -> str: ...
    def hold(self) -> bool: ...
    def release(self) -> None: ...
    def flush_range(self, start: int, end: int) -> None: ...
    def destroy(self, interval_forcibly_ms: int = ...) -> bool: ...

def index_key_hash(key: str) -> int:
    """|Java String.hashCode(key)|, with abs(Integer.MIN_VALUE) (still negative in Java) mapped
    to 0 (spec §4.2, Appendix B): "polygenelubricants" -> 0, "TopicTest#key1" -> 1655984460."""

def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """spec §4.1: 40 + 4 * slots + 20 * entries (420000040 bytes with the defaults)."""

@disjoint_base
class IndexFile:
    """One index file over a mapped file (spec §4).

    ``IndexFile(mapped_file, hash_slot_num, index_num, end_phy_offset=0, end_timestamp=0)``
    starts a NEW file: if the header's indexCount is 0 (a zero-filled file) it is initialised
    with begin = end = (end_phy_offset, end_timestamp) (the previous file's end, spec §4.2),
    hashSlotCount 0 and indexCount 1, written through to the mapping. A header whose
    indexCount is already >= 1 is an existing file and is read as it is (the end_* arguments are
    then ignored). ``IndexFile.load`` opens an existing file and never writes the header.
    The mapped file's size must be ``index_file_size(hash_slot_num, index_num)``.
    """

    def refresh_header(self) -> None:
        """Re-read the header another process keeps writing through (followers)."""
    def __init__(
        self, mapped_file: MappedFile | _Mapping, hash_slot_num: int, index_num: int, end_phy_offset: int = 0, end_timestamp: int = 0
    ) -> None: ...
    @classmethod
    def load(cls, mapped_file: MappedFile | _Mapping, hash_slot_num: int, index_num: int) -> IndexFile:
        """An existing index file: the header is read from the mapping, nothing is written.
        An indexCount of 0 (RocketMQ created the file but never put a key) counts as 1, one
        above index_num (a damaged header) counts as index_num."""

    # -- writing (spec §4.2)
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """spec §4.2 putKey: add key -> phy_offset at the head of its slot's chain; the header
        is written through at once. False when the file is full (indexCount >= index_num).
        Raises ValueError if the file was destroyed or closed."""

    def put_key_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """put_key with the key's index_key_hash already computed (0 <= key_hash)."""

    def put_key_hashes(self, keys: ReadableBuffer, start: int = 0) -> int:
        """put_key_hash for each (phy_offset, store_timestamp, key_hash) triple of native int64s
        in keys, from triple number start, skipping triples below end_phy_offset; returns the
        number of the first triple not consumed (fewer than all when the file became full)."""

    # -- reading (spec §4.3)
    def select_phy_offset(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """spec §4.3 selectPhyOffset: commit log offsets of the entries in key's chain whose
        hash equals key's and whose time (begin + timeDiff s) is in [begin, end], newest first,
        at most max_num. Hash-only match: callers re-check the real key of each record.
        Empty if the file is being destroyed."""

    def is_time_matched(self, begin: int, end: int) -> bool:
        """spec §4.3 isTimeMatched: [begin, end] overlaps [begin_timestamp, end_timestamp]."""

    @property
    def is_write_full(self) -> bool:
        """indexCount >= index_num: no entry is left (spec §4.2)."""

    # -- header (spec §4.1)
    @property
    def begin_timestamp(self) -> int: ...
    @property
    def end_timestamp(self) -> int: ...
    @property
    def begin_phy_offset(self) -> int: ...
    @property
    def end_phy_offset(self) -> int: ...
    @property
    def hash_slot_count(self) -> int: ...
    @property
    def index_count(self) -> int: ...
    @property
    def hash_slot_num(self) -> int: ...
    @property
    def index_num(self) -> int: ...
    @property
    def mapped_file(self) -> _Mapping: ...
    @property
    def file_name(self) -> str: ...

    # -- durability and lifetime
    def flush(self) -> bool:
        """msync the whole file (the header is already written through). False if the file is
        being destroyed; OSError if the flush fails."""

    def destroy(self, interval_forcibly_ms: int) -> bool:
        """Delete the file through its mapped file (spec §6.1 destroy): True once it is gone;
        False while a reader still holds it (call again; forced after the interval)."""
