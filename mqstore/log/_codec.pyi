"""Type stubs for the compiled ``mqstore.log._codec`` (ext/mqstore/log/_codec.pyx).

CommitLog record codec, byte-for-byte as RocketMQ 4.9.7 (spec §1, §5.3).
"""

from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address, IPv6Address
from typing import Final, TypeAlias

from _typeshed import ReadableBuffer

from mqstore.log.record import DecodedRecord

# (ip, port); the ip is anything whose str() is an IPv4 or IPv6 address (mqstore.log.record.encode_host).
_Host: TypeAlias = tuple[str | IPv4Address | IPv6Address, int]

# Properties as accepted by the encoders: a map (serialized in Java HashMap order; None
# values are skipped) or an exact properties string.
_Properties: TypeAlias = Mapping[str, str | None] | str | None

MESSAGE_MAGIC_CODE: Final = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2: Final = -626843477  # 0xDAA320AB
BLANK_MAGIC_CODE: Final = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH: Final = 8
BORNHOST_V6_FLAG: Final = 0x10
STOREHOSTADDRESS_V6_FLAG: Final = 0x20
MAX_TOPIC_BYTES_V1: Final = 127
MAX_PROPERTIES_BYTES: Final = 32767

def crc32(data: ReadableBuffer) -> int:
    """crc32(bytes) & 0x7FFFFFFF, RocketMQ's body CRC (spec §1.5)."""

def crc32_update(crc: int, data: ReadableBuffer) -> int:
    """Plain CRC-32 (zlib) continued from crc; equals zlib.crc32(data, crc)."""

def java_string_hash(s: str) -> int:
    """Java String.hashCode (UTF-16 code units, signed 32-bit) (spec §1.6)."""

def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tags code of a TAGS value; 0 for none (spec §1.6)."""

def java_hashmap_order(keys: Iterable[str]) -> list[str]:
    """Iteration order of a java.util.HashMap into which keys were put in this order."""

def properties_to_string(props: Mapping[str, str | None] | None, java_order: bool = True) -> str:
    """Map -> properties string (spec §1.4); Java HashMap order unless java_order is False."""

def string_to_properties(s: str) -> dict[str, str]:
    """Properties string -> map with RocketMQ's parsing rules (spec §1.4)."""

def record_length(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0, v2: bool = False) -> int:
    """calMsgLength (spec §1.2)."""

def msg_id(store_host: _Host, physical_offset: int) -> str:
    """Offset message id: hex of store address + port + physical offset (spec §1.2)."""

def encode_record(
    *,
    topic: str,
    body: ReadableBuffer,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: _Host = ("127.0.0.1", 0),
    store_timestamp: int = 0,
    store_host: _Host = ("127.0.0.1", 0),
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    properties: _Properties = None,
    body_crc: int | None = None,
    v2: bool = False,
) -> bytes:
    """Encode one CommitLog record from all of its fields (spec §1.2, §1.8).

    properties: a dict (serialized in Java HashMap order) or an exact properties string.
    The IPv6 sysflag bits follow the host address families.
    """

def decode_record(
    buf: ReadableBuffer, offset: int = 0, *, check_crc: bool = True, read_body: bool = True
) -> DecodedRecord:
    """Decode the record at offset into a DecodedRecord (spec §1.2, §1.8).

    Raises CorruptRecordError naming what is wrong: blank record, bad magic, truncation,
    length mismatch, CRC mismatch, bad UTF-8.
    """

def check_record(
    buf: ReadableBuffer, offset: int = 0, *, check_crc: bool = True, read_body: bool = True
) -> tuple[int, bool]:
    """checkMessageAndReturnSize (spec §5.3): (total_size, True) for a valid record, (0, True)
    for a blank, (-1, False) for a bad magic / CRC / truncation, (total_size, False) when
    TOTALSIZE disagrees with the fields."""

def encode_batch_body(messages: Iterable[tuple[ReadableBuffer, _Properties, int]]) -> bytes:
    """Client batch body, MessageDecoder.encodeMessages (spec §1.10): for each
    (body, properties, flag): [totalSize][magic=0][bodyCRC=0][flag][bodyLen][body][propsLen][props]."""

def decode_batch_body(data: ReadableBuffer) -> list[tuple[int, bytes, str]]:
    """Inverse of encode_batch_body: [(flag, body, properties_string)]."""

def batch_inner_properties(inner: str, batch: str) -> str:
    """Properties of an inner batch message as stored (spec §9.4)."""
