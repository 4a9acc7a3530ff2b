"""Type stubs for the compiled ``mqstore.broker._conns`` (ext/mqstore/broker/_conns.pyx).

A broker's open client connections, counted in shared memory by all its front processes: one
slot array per front, admitted against the sums over every front.
"""

from typing import Final

from typing_extensions import Buffer, disjoint_base

HEADER_SIZE: Final = 64
ADMITTED: Final = 0
OVER_TOTAL: Final = 1
OVER_PER_IP: Final = 2

def table_size(fronts: int, ip_slots: int) -> int:
    """Bytes of a table for ``fronts`` front processes with ``ip_slots`` address counters each."""

def address_slot(ip: str, ip_slots: int) -> int:
    """The counter a source address counts in: FNV-1a 64 of its UTF-8 text, modulo ip_slots."""

@disjoint_base
class ConnectionTable:
    """The table laid out in ``buffer`` (writable, at least ``table_size`` bytes)."""

    def __init__(self, buffer: Buffer) -> None: ...
    @property
    def fronts(self) -> int: ...
    @property
    def ip_slots(self) -> int: ...
    @staticmethod
    def format(buffer: Buffer, fronts: int, ip_slots: int) -> ConnectionTable:
        """Lay out an empty table in buffer (the owner, before any front maps it)."""
    def reset(self, front: int) -> None:
        """Zero front's array: a front starting (its predecessor's connections died with it)."""
    def admit(self, front: int, ip: str, max_total: int, max_per_ip: int) -> int:
        """ADMITTED (counted in front's array), or OVER_TOTAL / OVER_PER_IP (nothing counted)."""
    def release(self, front: int, ip: str) -> bool:
        """A connection front admitted from ip closed; False when front's array holds none from ip's slot."""
    def total(self) -> int:
        """The broker's open connections (every front's)."""
    def held(self, ip: str) -> int:
        """The broker's open connections counted in ip's slot."""
    def front_total(self, front: int) -> int:
        """front's open connections."""
