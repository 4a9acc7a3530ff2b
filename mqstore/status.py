"""Status values of the hot path, with RocketMQ's names (spec §9.1, §9.3).

The numbers are defined once, in ext/include/mq_status.h, which the compiled kernels use;
the enums here must hold the same names and numbers (tests/test_status_codes.py compares
them with ``mqstore.log._commitlog._C_STATUS_CODES``, the codes as compiled). Add or change a
code in both places."""

from __future__ import annotations

from enum import IntEnum


class _Status(IntEnum):
    """An IntEnum that prints as its name (``print(result.status)`` shows ``PUT_OK``, not 0);
    a numeric format spec (``f"{status:d}"``) still gives the number."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        if spec and spec[-1] in "bcdoxXneEfFgG%":
            return int.__format__(self, spec)
        return format(self.name, spec)


class PutMessageStatus(_Status):
    """PutMessageStatus of RocketMQ 4.9.7. Only PUT_OK is "ok"; FLUSH_DISK_TIMEOUT,
    FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE mean the message is stored but its
    durability or replication was not confirmed."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPEDFILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGECACHE_BUSY = 8
    UNKNOWN_ERROR = 9
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = 10

    @property
    def is_stored(self) -> bool:
        """True when the bytes are in the CommitLog (possibly not yet durable)."""
        return self in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                        PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE)


class AppendMessageStatus(_Status):
    """Result of one append into a mapped file (RocketMQ AppendMessageStatus)."""

    PUT_OK = 0
    END_OF_FILE = 1
    MESSAGE_SIZE_EXCEEDED = 2
    PROPERTIES_SIZE_EXCEEDED = 3
    UNKNOWN_ERROR = 4


HINTS = {
    PutMessageStatus.FLUSH_DISK_TIMEOUT: "the message is stored but was not flushed within sync_flush_timeout; "
    "check the disk (flush errors are counted in stats)",
    PutMessageStatus.SERVICE_NOT_AVAILABLE: "the store is shut down, a slave, or not writable (disk full or an "
    "earlier write error); see running_flags",
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: "the next CommitLog file could not be created: free disk space or "
    "check that the allocate service is running",
    PutMessageStatus.MESSAGE_ILLEGAL: "fix the message: see the result's detail",
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: "properties must encode to at most 32767 UTF-8 bytes",
    PutMessageStatus.OS_PAGECACHE_BUSY: "the store is busy (another put held the lock longer than "
    "os_page_cache_busy_time_out_mills, or the transient store pool has no free buffer): retry later",
}


class GetMessageStatus(_Status):
    """GetMessageStatus of RocketMQ 4.9.7 (spec §11), and mqstore's MESSAGE_CORRUPTED.

    MESSAGE_CORRUPTED (not in RocketMQ; check_crc_on_read): the first message the get would
    return fails its body CRC (or its header does not parse). The result holds no message,
    its ``detail`` names the message's physical and queue offsets, and next_begin_offset is
    that queue offset, so nothing is skipped unless the consumer decides to (next_begin_offset
    + 1). Messages before a damaged one come back as usual (FOUND), ending before it."""

    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8
    MESSAGE_CORRUPTED = 9
