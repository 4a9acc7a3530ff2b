"""Remote address patterns of plain_acl.yml (RemoteAddressStrategyFactory of RocketMQ 4.9.7):
``whiteRemoteAddress`` of an account and the entries of ``globalWhiteRemoteAddresses``.

=============================  ==================================================================
pattern                        matches
=============================  ==================================================================
blank (absent, "")             nothing (BlankRemoteAddressStrategy)
``*``, ``*.*.*.*``,            every address (NullRemoteAddressStrategy)
``*:*:*:*:*:*:*:*``
``192.168.0.1``, ``::1``       that address (OneRemoteAddressStrategy; IPv6 in any spelling)
``192.168.0.{1,2}``            the listed last parts (MultipleRemoteAddressStrategy), IPv6 too:
                               ``1050::5:600:300c:{1,2}``
``192.168.0.1,192.168.0.2``    the listed addresses
``192.168.*.*``, ``10.*.*.*``  any value from that part on (RangeRemoteAddressStrategy)
``192.168.0.1-10``,            a range of one part (the parts after it ``*``)
``192.168.1-10.*``
``1050::5:600:300c:*``,        IPv6: the last group any, a range (hex) of the last group, or a
``1050::5:600:300c:1-ff``,     range of the seventh and the eighth any
``1050::5:600:1-ff:*``
=============================  ==================================================================

Differences from RocketMQ, each where RocketMQ accepts a pattern and then matches it oddly: a
range pattern's parts after the range must be ``*`` (RocketMQ ignores them: ``1.2.*.5`` would
match 1.2.9.9), a range may be ``0-0`` (RocketMQ ignores it and fails every match), and an
IPv4-mapped IPv6 remote address (``::ffff:10.0.0.1``, from a dual-stack socket) is matched as
the IPv4 address it carries.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ANY_ADDRESS", "NO_ADDRESS", "AnyAddress", "NoAddress", "OneAddress", "RangeAddress", "RemoteAddress",
           "SomeAddresses", "normalize_ip", "remote_address"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=4096)  # a broker's clients are few; parsing one costs microseconds
def normalize_ip(ip: str) -> IPAddress | None:
    """The address of a remote IP string ("10.0.0.1", "::1", "[::1]", "::ffff:10.0.0.1" read as
    10.0.0.1); None for one that is not an IP address."""
    text = ip.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


class RemoteAddress:
    """A pattern's strategy: ``match(addr)`` with a normalize_ip() result."""

    pattern: str

    def match(self, addr: IPAddress | None) -> bool:
        raise NotImplementedError

    def matches(self, ip: str) -> bool:
        """match() for an IP string."""
        return self.match(normalize_ip(ip))

    def __str__(self) -> str:
        return self.pattern


@dataclass(frozen=True, eq=False)
class NoAddress(RemoteAddress):
    """A blank pattern: matches nothing."""

    pattern: str = ""

    def match(self, addr: IPAddress | None) -> bool:
        return False


@dataclass(frozen=True, eq=False)
class AnyAddress(RemoteAddress):
    """``*``: matches every address."""

    pattern: str = "*"

    def match(self, addr: IPAddress | None) -> bool:
        return True


NO_ADDRESS = NoAddress()
ANY_ADDRESS = AnyAddress()


@dataclass(frozen=True, eq=False)
class OneAddress(RemoteAddress):
    pattern: str
    address: IPAddress

    def match(self, addr: IPAddress | None) -> bool:
        return addr == self.address


@dataclass(frozen=True, eq=False)
class SomeAddresses(RemoteAddress):
    pattern: str
    addresses: frozenset[IPAddress]

    def match(self, addr: IPAddress | None) -> bool:
        return addr in self.addresses


@dataclass(frozen=True, eq=False)
class RangeAddress(RemoteAddress):
    """The first ``len(prefix)`` parts (IPv4 bytes or IPv6 groups) equal prefix and the next one
    lies in [start, end]; the rest are any."""

    pattern: str
    version: int
    prefix: tuple[int, ...]
    start: int
    end: int

    def match(self, addr: IPAddress | None) -> bool:
        if addr is None or addr.version != self.version:
            return False
        if self.version == 4:
            parts: tuple[int, ...] = tuple(addr.packed)
        else:
            packed = addr.packed
            parts = tuple((packed[i] << 8) | packed[i + 1] for i in range(0, 16, 2))
        n = len(self.prefix)
        return parts[:n] == self.prefix and self.start <= parts[n] <= self.end


def _one(text: str, pattern: str) -> IPAddress:
    """An address as commons-validator's isValidInet4Address / isValidInet6Address accepts it."""
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        where = "" if text.strip() == pattern.strip() else f" in {pattern!r}"
        raise ValueError(f"{text.strip()!r}{where} is not an IPv4 or IPv6 address") from None


def _some(items: Iterable[str], pattern: str) -> SomeAddresses:
    addrs = [_one(item, pattern) for item in items if item.strip()]
    if not addrs:
        raise ValueError(f"{pattern!r} lists no address")
    return SomeAddresses(pattern, frozenset(addrs))


def _int_range(text: str, base: int, top: int, pattern: str) -> tuple[int, int]:
    """'*' -> (0, top); 'a-b' -> (a, b) with 0 <= a <= b <= top."""
    if text == "*":
        return 0, top
    lo, sep, hi = text.partition("-")
    try:
        start, end = int(lo.strip(), base), int(hi.strip(), base)
    except ValueError:
        raise ValueError(f"{text!r} in {pattern!r} is not '*' or a range 'start-end'") from None
    if not sep or not 0 <= start <= end <= top or lo.strip().startswith(("+", "-")):
        raise ValueError(f"the range {text!r} in {pattern!r} must be 'start-end' with 0 <= start <= end <= "
                         f"{top if base == 10 else format(top, 'x')}")
    return start, end


def _range_v4(pattern: str) -> RangeAddress:
    parts = [p.strip() for p in pattern.split(".")]
    if len(parts) != 4:
        raise ValueError(f"{pattern!r} is not an IPv4 pattern of four parts like '192.168.0.*' or '192.168.0.1-10'")
    at = next((i for i, p in enumerate(parts) if p == "*" or "-" in p), None)
    if at is None or at == 0:
        raise ValueError(f"{pattern!r}: a range or '*' may stand from the second part on ('10.*.*.*'), or the "
                         "pattern is '*'")
    prefix = []
    for p in parts[:at]:
        if not p.isdigit() or int(p) > 255:
            raise ValueError(f"{p!r} in {pattern!r} is not a number from 0 to 255")
        prefix.append(int(p))
    if any(p != "*" for p in parts[at + 1:]):
        raise ValueError(f"{pattern!r}: the parts after a range must be '*' (say '{'.'.join(parts[:at + 1])}"
                         f"{'.*' * (3 - at)}')")
    start, end = _int_range(parts[at], 10, 255, pattern)
    return RangeAddress(pattern, 4, tuple(prefix), start, end)


def _v6_groups(text: str, count: int, pattern: str) -> tuple[int, ...]:
    """The first `count` groups an IPv6 prefix ('1050::5:600') spells."""
    if "::" in text:
        left, _, right = text.partition("::")
        lg = [g for g in left.split(":") if g] if left else []
        rg = [g for g in right.split(":") if g] if right else []
        if "::" in right or len(lg) + len(rg) >= count:
            raise ValueError(f"{pattern!r} is not an IPv6 pattern: its prefix {text!r} cannot be {count} groups")
        groups = lg + ["0"] * (count - len(lg) - len(rg)) + rg
    else:
        groups = text.split(":") if text else []
    if len(groups) != count:
        raise ValueError(f"{pattern!r}: the groups before the range must be {count} (with '::' for zeros)")
    out = []
    for g in groups:
        try:
            value = int(g, 16)
        except ValueError:
            value = -1
        if not 0 <= value <= 0xFFFF or len(g) > 4 or g.startswith(("+", "-")):
            raise ValueError(f"{g!r} in {pattern!r} is not an IPv6 group (1 to 4 hex digits)")
        out.append(value)
    return tuple(out)


def _pop_group(text: str) -> tuple[str, str]:
    """'A:B:last' -> ('A:B', 'last'); 'A::last' -> ('A::', 'last')."""
    i = text.rfind(":")
    head, last = text[:i], text[i + 1:]
    return (head + ":" if head.endswith(":") else head), last


def _range_v6(pattern: str) -> RangeAddress:
    text = pattern.strip()
    star = text.endswith(":*")
    if text.count("*") > (1 if star else 0):
        raise ValueError(f"{pattern!r}: in an IPv6 pattern '*' may only stand as the last group")
    body = text[:-1] if star else text
    if star and not body.endswith("::"):
        body = body[:-1]
    if "-" not in body:
        return RangeAddress(pattern, 6, _v6_groups(body, 7, pattern), 0, 0xFFFF)
    head, last = _pop_group(body)
    if "-" in head or "-" not in last:
        raise ValueError(f"{pattern!r}: in an IPv6 pattern a range may only be the last group, or the seventh "
                         "before ':*'")
    start, end = _int_range(last, 16, 0xFFFF, pattern)
    return RangeAddress(pattern, 6, _v6_groups(head, 6 if star else 7, pattern), start, end)


def remote_address(pattern: str | None) -> RemoteAddress:
    """The strategy of a whiteRemoteAddress / globalWhiteRemoteAddresses pattern; ValueError
    naming what is wrong with one that is not a pattern."""
    if pattern is None or not pattern.strip():
        return NO_ADDRESS
    text = pattern.strip()
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return ANY_ADDRESS
    if text.endswith("}"):
        head, brace, items = text.rpartition("{")
        if not brace or "}" in head or not items.endswith("}"):
            raise ValueError(f"{pattern!r}: a '{{a,b}}' list must be the last part, like '192.168.1.{{1,2}}'")
        if ":" not in head and len(head.split(".")) != 4:
            raise ValueError(f"{pattern!r}: a '{{a,b}}' list must be the fourth part of an IPv4 address")
        if not head.endswith((".", ":")):
            raise ValueError(f"{pattern!r}: a '{{a,b}}' list must be a whole part, like '192.168.1.{{1,2}}'")
        return _some((head + item.strip() for item in items[:-1].split(",") if item.strip()), pattern)
    if "," in text:
        return _some(text.split(","), pattern)
    if "*" in text or "-" in text:
        return _range_v6(text) if ":" in text else _range_v4(text)
    return OneAddress(pattern, _one(text, pattern))
