"""StoreCheckpoint (spec §5.1): a 4 KiB mapped file of timestamps and offsets."""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time

log = logging.getLogger("mqstore.checkpoint")

SIZE = 4096
FUTURE_SLACK_MS = 24 * 3600 * 1000  # a timestamp later than now + this is not a real store time
FIELDS = ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp", "master_flushed_offset",
           "confirm_phy_offset")


def read_checkpoint_file(path: str) -> dict[str, int]:
    """The fields of a checkpoint file, read without opening it for writing (StoreCheckpoint
    maps it read-write and extends a short file). Raises ValueError for a short file."""
    with open(path, "rb") as f:
        data = f.read(8 * len(FIELDS))
    if len(data) < 8 * len(FIELDS):
        raise ValueError(f"{path} is {len(data)} bytes, too short for a checkpoint")
    return dict(zip(FIELDS, struct.unpack(f">{len(FIELDS)}q", data)))


class StoreCheckpoint:
    """``ROOT/checkpoint``: big-endian longs at 0, 8, 16 (4.9) and 24, 32 (5.x)."""

    def __init__(self, path: str) -> None:
        self.path = path
        #: True when the file did not exist (a new store, or a lost checkpoint)
        self.created = not os.path.exists(path)
        #: what was wrong with the file when it was opened ("" if nothing); its fields are
        #: then all reset to 0, which makes an abnormal recovery check the whole CommitLog
        self.damage = ""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < SIZE:
                if 0 < size:
                    self.damage = f"{path} was {size} bytes, not {SIZE}"
                os.posix_fallocate(fd, 0, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        if not self.damage:
            self.damage = self._implausible()
        if self.damage:
            log.error("checkpoint: %s; its timestamps are reset to 0 (an abnormal recovery then checks the "
                      "whole CommitLog)", self.damage)
            self._map[:8 * len(FIELDS)] = bytes(8 * len(FIELDS))
            self._map.flush()

    def _implausible(self) -> str:
        """A timestamp no store can have written: negative, or after now + one day."""
        limit = time.time_ns() // 1_000_000 + FUTURE_SLACK_MS
        for i, name in enumerate(FIELDS[:3]):
            value = self._get(i)
            if value < 0 or value > limit:
                return f"{name} is {value}, not a store time"
        return ""

    def _get(self, index: int) -> int:
        return struct.unpack_from(">q", self._map, index * 8)[0]

    def _set(self, index: int, value: int) -> None:
        struct.pack_into(">q", self._map, index * 8, value)

    physic_msg_timestamp = property(lambda s: s._get(0), lambda s, v: s._set(0, v))
    logics_msg_timestamp = property(lambda s: s._get(1), lambda s, v: s._set(1, v))
    index_msg_timestamp = property(lambda s: s._get(2), lambda s, v: s._set(2, v))
    master_flushed_offset = property(lambda s: s._get(3), lambda s, v: s._set(3, v))
    confirm_phy_offset = property(lambda s: s._get(4), lambda s, v: s._set(4, v))

    @property
    def min_timestamp(self) -> int:
        """max(0, min(physic, logics) - 3000) (spec §5.1)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    def to_dict(self) -> dict[str, int]:
        return {name: self._get(i) for i, name in enumerate(FIELDS)}

    def flush(self) -> None:
        self._map.flush()

    def close(self) -> None:
        if not self._map.closed:
            self._map.flush()
            self._map.close()
