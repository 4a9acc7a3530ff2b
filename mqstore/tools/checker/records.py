"""Records by physical offset: what ConsumeQueue units and index entries are checked against."""

from __future__ import annotations

import struct

from mqstore.log._codec import java_string_hash, string_to_properties
from mqstore.queue._index import index_key_hash
from mqstore.log._mapped import MappedFile
from mqstore.layout import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, log_base, log_of

TX_MASK = 0xC
TX_PREPARED = 0x4
TX_ROLLBACK = 0xC

BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
MIN_RECORD_SIZE = 91

RECORD_CACHE_MAX = 1 << 20  # records parsed for unit / entry checks kept for reuse

_HEAD = struct.Struct(">iiiiiqqi")  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class _Record:
    """The fields of one CommitLog record that units and index entries are checked against."""

    __slots__ = ("total_size", "topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "properties",
                 "_key_hashes")

    def __init__(self, total_size: int, topic: str, queue_id: int, queue_offset: int, sys_flag: int,
                 store_timestamp: int, properties: dict[str, str]) -> None:
        self.total_size = total_size
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.sys_flag = sys_flag
        self.store_timestamp = store_timestamp
        self.properties = properties
        self._key_hashes: dict[int, str] | None = None

    @property
    def tags_code(self) -> int:
        tags = self.properties.get("TAGS")
        return java_string_hash(tags) if tags else 0

    def index_keys(self) -> list[str]:
        """The index keys of spec §4.4: topic#UNIQ_KEY, then topic#k for each KEYS word."""
        keys = []
        uniq = self.properties.get("UNIQ_KEY")
        if uniq:
            keys.append(f"{self.topic}#{uniq}")
        keys.extend(f"{self.topic}#{k}" for k in self.properties.get("KEYS", "").split(" ") if k)
        return keys

    def key_hashes(self) -> dict[int, str]:
        if self._key_hashes is None:
            self._key_hashes = {index_key_hash(k): k for k in self.index_keys()}
        return self._key_hashes


class _Log:
    """The CommitLog files of a check, mapped; parses the record at a physical offset."""

    def __init__(self, file_size: int) -> None:
        self.file_size = file_size
        self.min_offset = 0  # start of the first file: records below were removed by retention
        self.end = 0  # the valid end found by the scan
        self._files: dict[int, MappedFile] = {}
        self._views: dict[int, memoryview] = {}
        self._cache: dict[int, _Record | str] = {}

    def add(self, mf: MappedFile) -> None:
        self._files[mf.file_from] = mf

    def close(self) -> None:
        for view in self._views.values():
            view.release()
        self._views.clear()
        for mf in self._files.values():
            mf.close()
        self._files.clear()
        self._cache.clear()

    def bounds(self, phy: int) -> tuple[int, int]:
        """[min offset, valid end) of the log holding phy (this one)."""
        return self.min_offset, self.end

    def record(self, phy: int) -> _Record | str:
        """The record starting at phy (inside [min_offset, end)), or why there is none."""
        got = self._cache.get(phy)
        if got is None:
            got = self._parse(phy)
            if len(self._cache) < RECORD_CACHE_MAX:
                self._cache[phy] = got
        return got

    def _parse(self, phy: int) -> _Record | str:
        fs = self.file_size
        if fs <= 0:
            return "no CommitLog file holds it"
        base = phy - (phy - self.min_offset) % fs
        view = self._views.get(base)
        if view is None:
            mf = self._files.get(base)
            if mf is None:
                return "no CommitLog file holds it"
            view = self._views[base] = memoryview(mf)
        pos = phy - base
        if pos + 40 > fs:
            return "no record starts there (too close to the end of its file)"
        total, magic, _crc, qid, _flag, qoff, phy_field, sf = _HEAD.unpack_from(view, pos)
        if magic == BLANK_MAGIC_CODE:
            return "an END_OF_FILE blank is there, not a record"
        if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
            return f"no record starts there (magic 0x{magic & 0xFFFFFFFF:08X})"
        if phy_field != phy:
            return f"no record starts there (the bytes there say PHYSICALOFFSET {phy_field})"
        end = pos + total
        if total < MIN_RECORD_SIZE or end > fs:
            return f"the record there has an impossible TOTALSIZE {total}"
        born = 20 if sf & BORNHOST_V6_FLAG else 8
        at = pos + 48 + born  # STORETIMESTAMP
        ts = _I64.unpack_from(view, at)[0]
        at += 8 + (20 if sf & STOREHOST_V6_FLAG else 8) + 12  # store host, RECONSUMETIMES, PREPARED_TX_OFFSET
        body_len = _I32.unpack_from(view, at)[0]
        at += 4 + body_len
        if body_len < 0 or at + 3 > end:
            return f"the record there is malformed (BODYLENGTH {body_len})"
        if magic == MESSAGE_MAGIC_CODE_V2:
            topic_len = _I16.unpack_from(view, at)[0]
            at += 2
        else:
            topic_len = view[at]
            at += 1
        if topic_len <= 0 or at + topic_len + 2 > end:
            return f"the record there is malformed (TOPICLENGTH {topic_len})"
        topic = bytes(view[at:at + topic_len]).decode("utf-8", "replace")
        at += topic_len
        props_len = _I16.unpack_from(view, at)[0]
        at += 2
        if props_len < 0 or at + props_len != end:
            return f"the record there is malformed (PROPERTIESLENGTH {props_len})"
        props = string_to_properties(bytes(view[at:end]).decode("utf-8", "replace")) if props_len else {}
        return _Record(total, topic, qid, qoff, sf, ts, props)


class _Logs:
    """The CommitLogs of a store with several (docs/parallel-commitlogs.md), by log id: a unit or
    an index entry is checked against the log its offset names."""

    def __init__(self, logs: list[_Log]) -> None:
        self.logs = logs

    def bounds(self, phy: int) -> tuple[int, int]:
        k = log_of(phy)
        if 0 <= k < len(self.logs):
            return self.logs[k].bounds(phy)
        return log_base(k), log_base(k)  # a log the store does not have: nothing is in it

    def record(self, phy: int) -> _Record | str:
        k = log_of(phy)
        if not 0 <= k < len(self.logs):
            return f"it names CommitLog {k}, and the store has {len(self.logs)}"
        return self.logs[k].record(phy)

    def close(self) -> None:
        for log in self.logs:
            log.close()
