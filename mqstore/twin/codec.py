"""Pure-Python twin (test oracle) of the CommitLog record codec.

Follows spec §1 (record format), §5.3 (``checkMessageAndReturnSize``) and
Appendix B (Java semantics) of ``docs/rocketmq-store-spec.md``, i.e.
Apache RocketMQ 4.9.7 ``CommitLog`` / ``MessageDecoder``. The reader also
accepts the 5.x V2 magic (2-byte topic length), as 5.x readers do.

Written for clarity, not speed. Java behaviours that look odd are reproduced on
purpose and marked ``QUIRK``; where this module deliberately refuses something
RocketMQ would silently corrupt, it says ``REFUSE``.

Integers are big-endian; "int" is signed 32-bit, "long" signed 64-bit,
"short" signed 16-bit.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mqstore.errors import CorruptRecordError

__all__ = [
    "MESSAGE_MAGIC_CODE", "MESSAGE_MAGIC_CODE_V2", "BLANK_MAGIC_CODE", "END_FILE_MIN_BLANK_LENGTH",
    "COMPRESSED_FLAG", "MULTI_TAGS_FLAG", "TRANSACTION_NOT_TYPE", "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_COMMIT_TYPE", "TRANSACTION_ROLLBACK_TYPE", "BORNHOST_V6_FLAG",
    "STOREHOSTADDRESS_V6_FLAG", "NEED_UNWRAP_FLAG", "INNER_BATCH_FLAG",
    "PROPERTY_KEYS", "PROPERTY_TAGS", "PROPERTY_WAIT_STORE_MSG_OK", "PROPERTY_DELAY_TIME_LEVEL",
    "PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_QUEUE_ID",
    "NAME_VALUE_SEPARATOR", "PROPERTY_SEPARATOR",
    "crc32", "java_string_hash", "tags_code", "java_hashmap_order", "properties_to_string",
    "string_to_properties", "record_length", "msg_id", "encode_record", "DecodedRecord",
    "decode_record", "check_record", "encode_batch_body", "decode_batch_body",
    "batch_inner_properties", "topic_problem", "properties_problem",
]

# --------------------------------------------------------------------------------------------
# Constants (spec §1.1, §1.3, §1.4)
# --------------------------------------------------------------------------------------------

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7 as Java int
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB (5.x)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8

COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

_SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_TRANSACTION_TYPE_MASK = 0xC
_MAX_TOPIC_BYTES_V1 = 127  # 1-byte signed length
_MAX_TOPIC_BYTES_V2 = 32767  # 2-byte signed length
_MAX_PROPERTIES_BYTES = 32767  # 2-byte signed length

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def _to_int32(value: int) -> int:
    """Wrap an arbitrary Python int to a Java int (two's complement, 32 bits)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


# --------------------------------------------------------------------------------------------
# CRC, hashes, tagsCode (spec §1.5, §1.6, Appendix B)
# --------------------------------------------------------------------------------------------


def crc32(data: bytes | bytearray | memoryview) -> int:
    """``UtilAll.crc32``: standard CRC-32 (zlib) of ``data``, masked to 31 bits (never negative)."""
    return zlib.crc32(data) & 0x7FFFFFFF


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: ``h = 31*h + c`` over UTF-16 code units, signed 32-bit wrap.

    Characters outside the BMP count as two code units (a surrogate pair). Lone
    surrogates in ``s`` are hashed as the single code unit they are.
    """
    h = 0
    for (unit,) in struct.iter_unpack(">H", s.encode("utf-16-be", "surrogatepass")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return _to_int32(h)


def tags_code(tags: str | None) -> int:
    """``tagsString2tagsCode``: the Java hashCode of the TAGS value; 0 for ``None`` or ``""``."""
    if not tags:
        return 0
    return java_string_hash(tags)


# --------------------------------------------------------------------------------------------
# java.util.HashMap iteration order
# --------------------------------------------------------------------------------------------

_HASHMAP_INITIAL_CAPACITY = 16
_HASHMAP_TREEIFY_THRESHOLD = 8
_HASHMAP_MIN_TREEIFY_CAPACITY = 64


def _hashmap_spread(key: str) -> int:
    """``HashMap.hash``: ``h ^ (h >>> 16)`` with h the hashCode as unsigned 32 bits."""
    h = java_string_hash(key) & 0xFFFFFFFF
    return h ^ (h >> 16)


def java_hashmap_order(keys: list[str]) -> list[str]:
    """Iteration order of a default ``java.util.HashMap`` after ``put``-ting ``keys`` in order.

    Java iterates bucket by bucket (bucket = ``spread(hash) & (capacity-1)``) and,
    inside a bucket, in insertion order; resizes split each bucket preserving that
    order, so the final order is a stable sort of the distinct keys by their bucket
    at the final capacity. The capacity starts at 16 and doubles whenever the size
    exceeds 0.75 * capacity (so n keys need the smallest power of two >= 16 with
    n <= 0.75 * capacity).

    Also reproduced (QUIRK, from ``HashMap.treeifyBin``): when a bucket receives
    its 9th entry while the table is smaller than 64, Java doubles the table
    instead of building a tree. Real treeification (tables >= 64) is ignored: the
    bucket keeps insertion order, whereas Java would move the tree root first.

    A key repeated in ``keys`` keeps its first position (``put`` of an existing key
    replaces the value in place).
    """
    distinct: list[str] = []
    seen: set[str] = set()
    capacity = _HASHMAP_INITIAL_CAPACITY
    bucket_sizes: dict[int, int] = {}
    for key in keys:
        if key in seen:
            continue
        seen.add(key)
        distinct.append(key)
        spread = _hashmap_spread(key)
        index = spread & (capacity - 1)
        bucket_sizes[index] = bucket_sizes.get(index, 0) + 1
        resize = False
        if bucket_sizes[index] > _HASHMAP_TREEIFY_THRESHOLD and capacity < _HASHMAP_MIN_TREEIFY_CAPACITY:
            capacity *= 2  # treeifyBin() on a small table resizes instead
            resize = True
        if len(distinct) > capacity * 3 // 4:  # ++size > threshold
            capacity *= 2
            resize = True
        if resize:
            bucket_sizes = {}
            for k in distinct:
                i = _hashmap_spread(k) & (capacity - 1)
                bucket_sizes[i] = bucket_sizes.get(i, 0) + 1
    mask = capacity - 1
    return sorted(distinct, key=lambda k: _hashmap_spread(k) & mask)


# --------------------------------------------------------------------------------------------
# Properties (spec §1.4)
# --------------------------------------------------------------------------------------------


def properties_to_string(props: Mapping[str, str | None] | None, java_order: bool = True) -> str:
    """``MessageDecoder.messageProperties2String``.

    ``name + '\\x01' + value + '\\x02'`` for each entry whose value is not ``None``,
    with the final ``'\\x02'`` removed. Entries are visited in Java HashMap order
    (``java_order=True``; entries with a ``None`` value still count for the HashMap
    capacity) or in the mapping's own order. ``None``/empty mapping -> ``""``.
    Names and values are used verbatim (separators inside them are not escaped).
    """
    if not props:
        return ""
    names = list(props)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"property names must be str, got {type(name).__name__}: {name!r}")
    if java_order:
        names = java_hashmap_order(names)
    parts: list[str] = []
    for name in names:
        value = props[name]
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"property {name!r} must have a str value, got {type(value).__name__}")
        parts.append(name + NAME_VALUE_SEPARATOR + value)
    return PROPERTY_SEPARATOR.join(parts)


_TOPIC_CHARS = frozenset("%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def topic_problem(topic: str | None, max_length: int = 127) -> str | None:
    """``TopicValidator.validateTopic`` of 4.9.7: why topic cannot be put, or None.

    Not blank, only ``^[%|a-zA-Z0-9_-]+$``, at most max_length characters. REFUSE: the store
    applies it to every put (RocketMQ's broker and client do; its store does not), because a
    topic names a directory under ``consumequeue/``."""
    if not topic:
        return "topic is empty"
    for i, ch in enumerate(topic):
        if ch not in _TOPIC_CHARS:
            shown = topic if len(topic) <= 40 else topic[:37] + "..."
            return (f"topic {shown!r} has the character {ch!r} at index {i}; RocketMQ topics use "
                    "only letters, digits and %|_- (^[%|a-zA-Z0-9_-]+$)")
    if len(topic) > max_length:
        return f"topic is {len(topic)} characters, more than {max_length} (max_topic_length)"
    return None


def properties_problem(props: Mapping[object, object]) -> str | None:
    """Why props cannot be stored so that ``string_to_properties`` gives them back, or None.

    REFUSE where RocketMQ corrupts silently: a name or value holding a separator
    (``\\x01``, ``\\x02``) splits into other pairs, and a pair with an empty name or value
    is skipped by the decoder. A name must be a str; a value is stored as ``str(value)``;
    None values are left out, as ``properties_to_string`` does."""
    for key, value in props.items():
        if value is None:
            continue
        if not isinstance(key, str):
            return f"property name {key!r} is a {type(key).__name__}, not a str"
        text = str(value)
        if not key:
            return f"a property name is empty (its value {text[:40]!r})"
        if NAME_VALUE_SEPARATOR in key or PROPERTY_SEPARATOR in key:
            return f"property name {key!r} contains a separator character (\\x01 or \\x02)"
        if not text:
            return f"property {key!r} has an empty value, which RocketMQ's decoder drops"
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            return f"property {key!r} has a value containing a separator character (\\x01 or \\x02)"
    return None


def string_to_properties(s: str) -> dict[str, str]:
    """``MessageDecoder.string2messageProperties``.

    Split on ``'\\x02'``; a segment counts only if its first ``'\\x01'`` leaves a
    non-empty name and a non-empty value (value = everything after that first
    ``'\\x01'``); other segments are silently skipped. A later duplicate name
    overwrites the value (the dict keeps the first position).
    """
    result: dict[str, str] = {}
    length = len(s)
    index = 0
    while index < length:
        new_index = s.find(PROPERTY_SEPARATOR, index)
        if new_index < 0:
            new_index = length
        if new_index - index >= 3:
            kv_sep = s.find(NAME_VALUE_SEPARATOR, index)
            if index < kv_sep < new_index - 1:
                result[s[index:kv_sep]] = s[kv_sep + 1:new_index]
        index = new_index + 1
    return result


def batch_inner_properties(inner: str, batch: str) -> str:
    """Properties of one record produced from a batch (spec §9.4).

    ``inner + '\\x02' + batch`` when both are non-empty and ``inner`` does not
    already end with ``'\\x02'``; otherwise plain concatenation.
    """
    if inner and batch and not inner.endswith(PROPERTY_SEPARATOR):
        return inner + PROPERTY_SEPARATOR + batch
    return inner + batch


# --------------------------------------------------------------------------------------------
# Lengths, hosts, msgId
# --------------------------------------------------------------------------------------------


def record_length(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0, v2: bool = False) -> int:
    """``CommitLog.calMsgLength`` (spec §1.2): TOTALSIZE of a record with these variable parts.

    Host sizes come from the V6 bits of ``sys_flag``; negative body/properties
    lengths count as 0 (as in Java); V2 uses a 2-byte topic length. The sum is
    wrapped to a Java int like the Java expression (only matters near 2 GiB).
    """
    born_len = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store_len = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    length = (
        4  # TOTALSIZE
        + 4  # MAGICCODE
        + 4  # BODYCRC
        + 4  # QUEUEID
        + 4  # FLAG
        + 8  # QUEUEOFFSET
        + 8  # PHYSICALOFFSET
        + 4  # SYSFLAG
        + 8  # BORNTIMESTAMP
        + born_len  # BORNHOST
        + 8  # STORETIMESTAMP
        + store_len  # STOREHOSTADDRESS
        + 4  # RECONSUMETIMES
        + 8  # PREPARED_TRANSACTION_OFFSET
        + 4 + max(body_len, 0)  # BODY
        + (2 if v2 else 1) + topic_len  # TOPIC
        + 2 + max(props_len, 0)  # PROPERTIES
    )
    return _to_int32(length)


def _host_to_bytes(what: str, host: object) -> tuple[bytes, int, bool]:
    """``(ip, port)`` -> (address bytes, port, is_ipv6), following Java's ``InetAddress`` rules.

    IPv4-mapped IPv6 literals (``::ffff:a.b.c.d``) become IPv4, as Java's
    ``InetAddress.getByName`` returns an ``Inet4Address`` for them. A ``%scope``
    suffix and surrounding ``[...]`` are accepted (the scope is not stored).
    Host names are refused: this codec does no DNS.
    """
    if not isinstance(host, tuple) or len(host) != 2:
        raise ValueError(f"{what} must be an (ip, port) tuple, got {host!r}")
    ip, port = host
    if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        addr = ip
    elif isinstance(ip, str):
        text = ip[1:-1] if ip.startswith("[") and ip.endswith("]") else ip
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(f"{what} address {ip!r} is not an IPv4/IPv6 literal") from None
    else:
        raise ValueError(f"{what} address must be a str, got {type(ip).__name__}: {ip!r}")
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"{what} port must be an int in 0..65535, got {port!r}")
    return addr.packed, port, isinstance(addr, ipaddress.IPv6Address)


def _check_long(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not _LONG_MIN <= value <= _LONG_MAX:
        raise ValueError(f"{what} must be a Java long (int in {_LONG_MIN}..{_LONG_MAX}), got {value!r}")
    return value


def _check_int(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{what} must be a Java int (int in {_INT_MIN}..{_INT_MAX}), got {value!r}")
    return value


def _msg_id_from_bytes(addr: bytes, port: int, physical_offset: int) -> str:
    return (addr + struct.pack(">iq", _to_int32(port), physical_offset)).hex().upper()


def msg_id(store_host: tuple[str, int], physical_offset: int) -> str:
    """Offset message id (``MessageDecoder.createMessageId``): uppercase hex of
    store address bytes + port (int) + physical offset (long); 32 hex chars for
    IPv4, 56 for IPv6."""
    addr, port, _ = _host_to_bytes("store_host", store_host)
    return _msg_id_from_bytes(addr, port, _check_long("physical_offset", physical_offset))


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _utf8(what: str, text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} cannot be encoded as UTF-8 (lone surrogate?): {exc}") from None


def _properties_text(properties: Mapping[str, str | None] | str | None) -> str:
    if properties is None:
        return ""
    if isinstance(properties, str):
        return properties
    if isinstance(properties, Mapping):
        return properties_to_string(properties, java_order=True)
    raise TypeError(f"properties must be a dict, a str or None, got {type(properties).__name__}")


def _properties_bytes(properties: Mapping[str, str | None] | str | None) -> bytes:
    data = _utf8("properties", _properties_text(properties))
    if len(data) > _MAX_PROPERTIES_BYTES:
        raise ValueError(
            f"properties are {len(data)} UTF-8 bytes; the 2-byte length allows at most {_MAX_PROPERTIES_BYTES}"
            " (RocketMQ: PROPERTIES_SIZE_EXCEEDED)")
    return data


def _body_bytes(body: object) -> bytes:
    if isinstance(body, str) or not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes-like, got {type(body).__name__}")
    return bytes(body)


def encode_record(*, topic: str, body: bytes, queue_id: int = 0, flag: int = 0, queue_offset: int = 0,
                  physical_offset: int = 0, sys_flag: int = 0, born_timestamp: int = 0,
                  born_host: tuple[str, int] = ("127.0.0.1", 0), store_timestamp: int = 0,
                  store_host: tuple[str, int] = ("127.0.0.1", 0), reconsume_times: int = 0,
                  prepared_transaction_offset: int = 0,
                  properties: Mapping[str, str | None] | str | None = None,
                  body_crc: int | None = None, v2: bool = False) -> bytes:
    """Encode one CommitLog record (spec §1.2; V2 per §1.8) exactly as the broker writes it.

    ``properties`` as a mapping is serialized in Java HashMap order; as a str it
    is used verbatim. ``body_crc=None`` means ``crc32(body)``. The two host V6
    bits of ``sys_flag`` are forced to match the hosts. Raises ``ValueError``
    when a field does not fit (REFUSE: a V1 topic over 127 UTF-8 bytes, which
    RocketMQ would wrap into a negative length byte) and ``TypeError`` for
    arguments of the wrong type.
    """
    topic_b = _utf8("topic", topic)
    max_topic = _MAX_TOPIC_BYTES_V2 if v2 else _MAX_TOPIC_BYTES_V1
    if len(topic_b) > max_topic:
        raise ValueError(
            f"topic is {len(topic_b)} UTF-8 bytes; a {'V2' if v2 else 'V1'} record allows at most {max_topic}"
            + ("" if v2 else " (use v2=True for longer topics)"))
    body_b = _body_bytes(body)
    props_b = _properties_bytes(properties)
    _check_int("queue_id", queue_id)
    _check_int("flag", flag)
    _check_long("queue_offset", queue_offset)
    _check_long("physical_offset", physical_offset)
    _check_int("sys_flag", sys_flag)
    _check_long("born_timestamp", born_timestamp)
    _check_long("store_timestamp", store_timestamp)
    _check_int("reconsume_times", reconsume_times)
    _check_long("prepared_transaction_offset", prepared_transaction_offset)
    body_crc = crc32(body_b) if body_crc is None else _check_int("body_crc", body_crc)
    born_addr, born_port, born_v6 = _host_to_bytes("born_host", born_host)
    store_addr, store_port, store_v6 = _host_to_bytes("store_host", store_host)

    sys_flag &= ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    if born_v6:
        sys_flag |= BORNHOST_V6_FLAG
    if store_v6:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG

    exact_total = (record_length(0, 0, 0, sys_flag, v2)  # fixed part, no wrap possible
                   + len(body_b) + len(topic_b) + len(props_b))
    if exact_total > _INT_MAX:
        raise ValueError(f"record would be {exact_total} bytes; TOTALSIZE is a Java int (max {_INT_MAX})")
    magic = MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE

    out = bytearray()
    out += struct.pack(">iiiiiqqiq", exact_total, magic, body_crc, queue_id, flag, queue_offset,
                       physical_offset, sys_flag, born_timestamp)
    out += born_addr + struct.pack(">i", born_port)
    out += struct.pack(">q", store_timestamp)
    out += store_addr + struct.pack(">i", store_port)
    out += struct.pack(">iqi", reconsume_times, prepared_transaction_offset, len(body_b))
    out += body_b
    out += struct.pack(">h" if v2 else ">b", len(topic_b)) + topic_b
    out += struct.pack(">h", len(props_b)) + props_b
    assert len(out) == exact_total
    return bytes(out)


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodedRecord:
    """One parsed CommitLog record. Hosts are ``(ip, port)`` with ``ip`` in Python's
    canonical text form (IPv6 compressed, e.g. ``"fe80::2"``)."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes | None  # None when decoded with read_body=False
    topic: str
    properties: dict[str, str]
    properties_string: str

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        """KEYS split on ``" "``, empty pieces dropped (as IndexService does)."""
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def tags_code(self) -> int:
        """Hash of TAGS (§1.6). The SCHEDULE_TOPIC_XXXX deliver-time substitution needs the
        store's delay table and is not applied here."""
        return tags_code(self.tags)

    @property
    def msg_id(self) -> str:
        """Offset msgId from the stored store-host bytes (width chosen by the V6 sys_flag bit)."""
        ip, port = self.store_host
        if self.sys_flag & STOREHOSTADDRESS_V6_FLAG:
            addr = ipaddress.IPv6Address(ip).packed
        else:
            addr = ipaddress.IPv4Address(ip).packed
        return _msg_id_from_bytes(addr, port, self.physical_offset)

    @property
    def is_v2(self) -> bool:
        return self.magic == MESSAGE_MAGIC_CODE_V2

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & _TRANSACTION_TYPE_MASK


class _Fail(Exception):
    """Internal: parsing stopped. ``size`` is what checkMessageAndReturnSize returns."""

    def __init__(self, size: int, message: str) -> None:
        super().__init__(message)
        self.size = size


class _Blank(Exception):
    """Internal: the record is an end-of-file blank."""

    def __init__(self, total_size: int) -> None:
        super().__init__(total_size)
        self.total_size = total_size


class _Reader:
    """A cursor over a byte buffer that raises ``_Fail(-1, ...)`` on reads past the end
    (Java: ``BufferUnderflowException`` -> caught -> ``DispatchRequest(-1, false)``)."""

    def __init__(self, mv: memoryview, start: int) -> None:
        self.mv = mv
        self.start = start
        self.pos = start

    def _need(self, n: int, what: str) -> int:
        at = self.pos
        if n > len(self.mv) - at:
            have = max(len(self.mv) - at, 0)
            raise _Fail(-1, f"truncated record at offset {self.start}: {what} needs {n} bytes at offset {at},"
                            f" only {have} available")
        self.pos = at + n
        return at

    def unpack(self, fmt: str, what: str) -> int:
        at = self._need(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.mv, at)[0]

    def take(self, n: int, what: str) -> bytes:
        at = self._need(n, what)
        return bytes(self.mv[at:at + n])

    def skip(self, n: int, what: str) -> None:
        self._need(n, what)


def _host_text(addr: bytes) -> str:
    return str(ipaddress.IPv4Address(addr) if len(addr) == 4 else ipaddress.IPv6Address(addr))


def _parse(mv: memoryview, offset: int, check_crc: bool, read_body: bool, strict_utf8: bool,
           check_delay: bool) -> DecodedRecord:
    """Follow ``checkMessageAndReturnSize`` step by step (same order of reads and checks).

    Raises ``_Blank`` for a blank record and ``_Fail(size, message)`` where Java
    returns ``DispatchRequest(size, false)``. With ``strict_utf8`` a topic or
    properties that are not valid UTF-8 fail with size -1; otherwise they are
    decoded with U+FFFD replacement like Java's ``new String(bytes, UTF_8)``.
    With ``check_delay`` a SCHEDULE_TOPIC_XXXX record whose DELAY property is not
    a Java int fails with size -1 (``Integer.parseInt`` throws in Java).
    """
    r = _Reader(mv, offset)
    total_size = r.unpack(">i", "TOTALSIZE")
    magic = r.unpack(">i", "MAGICCODE")
    if magic == BLANK_MAGIC_CODE:
        raise _Blank(total_size)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise _Fail(-1, f"bad magic code 0x{magic & 0xFFFFFFFF:08X} at offset {offset + 4}"
                        f" (record at offset {offset})")
    v2 = magic == MESSAGE_MAGIC_CODE_V2
    # QUIRK: Java allocates `byte[] bytesContent = new byte[totalSize]` and copies the hosts, the
    # body (when read), the topic and the properties into it; a negative TOTALSIZE or any of those
    # fields being longer than TOTALSIZE throws -> (-1, false) before the length comparison.
    if total_size < 0:
        raise _Fail(-1, f"negative TOTALSIZE {total_size} in record at offset {offset}")

    def fits_scratch(n: int, what: str) -> None:
        if n > total_size:
            raise _Fail(-1, f"{what} ({n} bytes) is longer than TOTALSIZE {total_size}"
                            f" in record at offset {offset}")

    body_crc = r.unpack(">i", "BODYCRC")
    queue_id = r.unpack(">i", "QUEUEID")
    flag = r.unpack(">i", "FLAG")
    queue_offset = r.unpack(">q", "QUEUEOFFSET")
    physical_offset = r.unpack(">q", "PHYSICALOFFSET")
    sys_flag = r.unpack(">i", "SYSFLAG")
    born_timestamp = r.unpack(">q", "BORNTIMESTAMP")
    born_addr_len = 16 if sys_flag & BORNHOST_V6_FLAG else 4
    fits_scratch(born_addr_len + 4, "BORNHOST")
    born_addr = r.take(born_addr_len, "BORNHOST address")
    born_port = r.unpack(">i", "BORNHOST port")
    store_timestamp = r.unpack(">q", "STORETIMESTAMP")
    store_addr_len = 16 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 4
    fits_scratch(store_addr_len + 4, "STOREHOSTADDRESS")
    store_addr = r.take(store_addr_len, "STOREHOSTADDRESS address")
    store_port = r.unpack(">i", "STOREHOSTADDRESS port")
    reconsume_times = r.unpack(">i", "RECONSUMETIMES")
    prepared_transaction_offset = r.unpack(">q", "PREPARED_TRANSACTION_OFFSET")
    body_len = r.unpack(">i", "BODYLENGTH")

    body: bytes | None = b""
    if body_len > 0:  # QUIRK: a negative BODYLENGTH is treated as an empty body
        if read_body:
            fits_scratch(body_len, "BODY")
            body = r.take(body_len, "BODY")
            # QUIRK: the CRC is only verified for a non-empty body.
            if check_crc:
                actual = crc32(body)
                if actual != body_crc:
                    raise _Fail(-1, f"body CRC mismatch in record at offset {offset}: stored {body_crc},"
                                    f" computed {actual}")
        else:
            r.skip(body_len, "BODY")
            body = None
    elif not read_body:
        body = None

    topic_len = r.unpack(">h" if v2 else ">b", "TOPICLENGTH")
    if topic_len < 0:
        raise _Fail(-1, f"negative topic length {topic_len} in record at offset {offset}")
    fits_scratch(topic_len, "TOPIC")
    topic_raw = r.take(topic_len, "TOPIC")
    props_len = r.unpack(">h", "PROPERTIESLENGTH")
    props_raw = b""
    if props_len > 0:  # QUIRK: a negative PROPERTIESLENGTH means "no properties"
        fits_scratch(props_len, "PROPERTIES")
        props_raw = r.take(props_len, "PROPERTIES")

    def text(raw: bytes, what: str) -> str:
        if not strict_utf8:
            return raw.decode("utf-8", "replace")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Fail(-1, f"{what} of record at offset {offset} is not valid UTF-8: {exc}") from None

    topic = text(topic_raw, "topic")
    properties_string = text(props_raw, "properties")
    properties = string_to_properties(properties_string)
    if check_delay and topic == _SCHEDULE_TOPIC:
        delay = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay is not None and _java_parse_int(delay) is None:
            # QUIRK: Integer.parseInt throws before the length comparison -> (-1, false)
            raise _Fail(-1, f"DELAY property {delay!r} of {_SCHEDULE_TOPIC} record at offset {offset}"
                            " is not a Java int")

    expected = record_length(body_len, topic_len, props_len, sys_flag, v2)
    if total_size != expected:
        raise _Fail(total_size, f"TOTALSIZE {total_size} of record at offset {offset} does not match the"
                                f" length computed from its fields ({expected}: body {body_len},"
                                f" topic {topic_len}, properties {props_len}, sysFlag 0x{sys_flag & 0xFFFFFFFF:X})")
    return DecodedRecord(
        total_size=total_size, magic=magic, body_crc=body_crc, queue_id=queue_id, flag=flag,
        queue_offset=queue_offset, physical_offset=physical_offset, sys_flag=sys_flag,
        born_timestamp=born_timestamp, born_host=(_host_text(born_addr), born_port),
        store_timestamp=store_timestamp, store_host=(_host_text(store_addr), store_port),
        reconsume_times=reconsume_times, prepared_transaction_offset=prepared_transaction_offset,
        body=body, topic=topic, properties=properties, properties_string=properties_string)


def _byte_view(buf: object) -> memoryview:
    mv = memoryview(buf)  # type: ignore[arg-type]
    if mv.ndim != 1 or mv.itemsize != 1 or mv.format not in ("B", "b", "c"):
        mv = mv.cast("B")
    return mv


def _check_offset(offset: object) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    return offset


def decode_record(buf: object, offset: int = 0, *, check_crc: bool = True, read_body: bool = True) -> DecodedRecord:
    """Decode the record starting at ``buf[offset]`` (bytes, bytearray, memoryview or mmap).

    Accepts exactly what :func:`check_record` accepts, plus a strict UTF-8 check
    of topic and properties. Raises :class:`CorruptRecordError` for a blank
    record, a bad magic, a truncated buffer, a TOTALSIZE that disagrees with the
    fields, a body CRC mismatch (only when ``check_crc`` and ``read_body`` and the
    body is non-empty) and invalid UTF-8. ``read_body=False`` leaves ``body=None``.
    A DELAY property that does not parse does not fail here (see check_record).
    """
    _check_offset(offset)
    with _byte_view(buf) as mv:
        try:
            return _parse(mv, offset, check_crc, read_body, strict_utf8=True, check_delay=False)
        except _Blank as blank:
            raise CorruptRecordError(
                f"blank (end-of-file) record at offset {offset} (TOTALSIZE {blank.total_size}): not a message;"
                " use check_record to detect blanks") from None
        except _Fail as fail:
            raise CorruptRecordError(str(fail)) from None


def _java_parse_int(text: str) -> int | None:
    """``Integer.parseInt(text)``, or None where Java throws NumberFormatException.

    Java accepts one leading '+'/'-' and then Unicode decimal digits (Nd), no
    spaces or underscores, and the value must fit an int.
    """
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all(c.isdecimal() for c in digits):
        return None
    value = int("".join(str(int(c)) for c in digits))
    if text[:1] == "-":
        value = -value
    return value if _INT_MIN <= value <= _INT_MAX else None


def check_record(buf: object, offset: int = 0, *, check_crc: bool = True, read_body: bool = True) -> tuple[int, bool]:
    """``CommitLog.checkMessageAndReturnSize`` (spec §5.3) -> ``(size, success)``.

    - blank record -> ``(0, True)`` (whatever its TOTALSIZE);
    - unknown magic -> ``(-1, False)`` (both V1 and the 5.x V2 magic are known);
    - body CRC mismatch (``check_crc`` and ``read_body``, non-empty body) -> ``(-1, False)``;
    - TOTALSIZE != calMsgLength(fields) -> ``(TOTALSIZE, False)``;
    - any read past the end of ``buf`` -> ``(-1, False)``; also (QUIRK, Java's
      ``new byte[totalSize]`` scratch array) a negative TOTALSIZE, a negative topic
      length, or a host/body/topic/properties field longer than TOTALSIZE;
    - (QUIRK) topic ``SCHEDULE_TOPIC_XXXX`` whose DELAY property is not a Java int
      -> ``(-1, False)`` (``Integer.parseInt`` throws);
    - valid -> ``(TOTALSIZE, True)``.
    Invalid UTF-8 in topic/properties does not fail (Java decodes with U+FFFD).
    """
    _check_offset(offset)
    with _byte_view(buf) as mv:
        try:
            record = _parse(mv, offset, check_crc, read_body, strict_utf8=False, check_delay=True)
        except _Blank:
            return 0, True
        except _Fail as fail:
            return fail.size, False
    return record.total_size, True


# --------------------------------------------------------------------------------------------
# Client batch body (spec §1.10)
# --------------------------------------------------------------------------------------------

_BATCH_HEADER = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLen


def encode_batch_body(messages: Iterable[tuple[bytes, Mapping[str, str | None] | str | None, int]]) -> bytes:
    """Client ``MessageDecoder.encodeMessages``: one inner record per ``(body, properties, flag)``:
    ``[int totalSize][int magic=0][int bodyCRC=0][int flag][int bodyLen][body][short propsLen][props]``
    with ``totalSize = 22 + bodyLen + propsLen``. Properties as a mapping are serialized in
    Java HashMap order; a str is used verbatim. REFUSE (ValueError): properties over 32767
    UTF-8 bytes (Java would wrap the short length)."""
    out = bytearray()
    for index, item in enumerate(messages):
        try:
            body, properties, flag = item
        except (TypeError, ValueError):
            raise TypeError(f"batch message {index} must be a (body, properties, flag) tuple") from None
        body_b = _body_bytes(body)
        props_b = _properties_bytes(properties)
        _check_int(f"flag of batch message {index}", flag)
        total = _BATCH_HEADER.size + 2 + len(body_b) + len(props_b)
        if total > _INT_MAX:
            raise ValueError(f"batch message {index} would be {total} bytes; totalSize is a Java int")
        out += _BATCH_HEADER.pack(total, 0, 0, flag, len(body_b)) + body_b
        out += struct.pack(">h", len(props_b)) + props_b
    return bytes(out)


def decode_batch_body(data: bytes | bytearray | memoryview) -> list[tuple[int, bytes, str]]:
    """Split a client batch body into ``(flag, body, properties_string)`` tuples.

    Walks the records the way the broker's ``MessageExtBatchEncoder`` does: only FLAG,
    BODYLENGTH and PROPERTIESLENGTH are used; TOTALSIZE, MAGIC and BODYCRC are read and
    ignored. Raises :class:`CorruptRecordError` when a record is truncated, a length is
    negative, or the properties are not valid UTF-8.
    """
    result: list[tuple[int, bytes, str]] = []
    with _byte_view(data) as mv:
        end = len(mv)
        pos = 0
        while pos < end:
            start = pos

            def need(n: int, what: str) -> None:
                if n > end - pos:
                    raise CorruptRecordError(
                        f"truncated batch message at offset {start}: {what} needs {n} bytes at offset {pos},"
                        f" only {end - pos} available")

            need(_BATCH_HEADER.size, "header")
            _total, _magic, _crc, flag, body_len = _BATCH_HEADER.unpack_from(mv, pos)
            pos += _BATCH_HEADER.size
            if body_len < 0:
                raise CorruptRecordError(f"negative body length {body_len} in batch message at offset {start}")
            need(body_len, "body")
            body = bytes(mv[pos:pos + body_len])
            pos += body_len
            need(2, "properties length")
            (props_len,) = struct.unpack_from(">h", mv, pos)
            pos += 2
            if props_len < 0:
                raise CorruptRecordError(f"negative properties length {props_len} in batch message at offset {start}")
            need(props_len, "properties")
            try:
                props = bytes(mv[pos:pos + props_len]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(
                    f"properties of batch message at offset {start} are not valid UTF-8: {exc}") from None
            pos += props_len
            result.append((flag, body, props))
    return result
