"""The decoded form of a CommitLog record (spec §1) and the host address helpers.

``mqstore.log._codec.decode_record`` returns ``DecodedRecord``; the pure-Python twin in
``mqstore.twin.codec`` has its own identical-shaped class so the two can be compared
field by field.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"

Host = tuple[str, int]


def encode_host(host: Host) -> bytes:
    """(ip, port) -> the 8-byte (IPv4) or 20-byte (IPv6) BORNHOST/STOREHOST field."""
    ip, port = host
    ip = str(ip)
    if not 0 <= int(port) <= 0x7FFFFFFF:
        raise ValueError(f"port {port!r} of host {host!r} is out of range")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            addr = socket.inet_pton(family, ip)
        except (OSError, TypeError):
            continue
        if family == socket.AF_INET6 and addr[:12] == b"\x00" * 10 + b"\xff\xff":
            addr = addr[12:]  # Java turns an IPv4-mapped address into an Inet4Address
        return addr + int(port).to_bytes(4, "big")
    raise ValueError(f"host {ip!r} is not an IPv4 or IPv6 address")


def decode_host(raw: bytes) -> Host:
    """Inverse of encode_host."""
    port = int.from_bytes(raw[-4:], "big", signed=True)
    if len(raw) == 8:
        return socket.inet_ntop(socket.AF_INET, raw[:4]), port
    return str(ipaddress.IPv6Address(raw[:16])), port


def parse_host_port(text: str) -> Host:
    """'1.2.3.4:10911' or '[::1]:10911' -> (ip, port)."""
    text = text.strip()
    if text.startswith("["):
        ip, sep, port = text[1:].partition("]:")
    else:
        ip, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r} is not host:port (IPv6 as [addr]:port)")
    encode_host((ip, int(port)))
    return ip, int(port)


def is_ipv6(host: Host) -> bool:
    return len(encode_host(host)) == 20


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """Every field of one CommitLog record, in table order of spec §1.2."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes | None
    topic: str
    properties: dict[str, str]
    properties_string: str
    #: the ConsumeQueue tags code of TAGS (spec §1.6; 0 without tags), computed by the decoder
    tags_code: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def msg_id(self) -> str:
        ip, port = self.store_host
        addr = ipaddress.ip_address(ip).packed if self.sys_flag & 0x20 else socket.inet_pton(socket.AF_INET, ip)
        return (addr + port.to_bytes(4, "big", signed=True)
                + self.physical_offset.to_bytes(8, "big", signed=True)).hex().upper()

    @property
    def is_v2(self) -> bool:
        return self.magic == -626843477

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & 0xC
