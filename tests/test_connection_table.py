"""The broker's connection table (mqstore.broker._conns, docs/security.md "Limits on every connection"):
the kernel against its pure-Python twin (mqstore.twin.conns) with hypothesis, then what the
fronts rely on: caps over every front's counts, a front's restart forgetting its dead
predecessor's, and the table shared through a memory file as the fronts share it."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.broker import _conns as kernel
from mqstore.broker.limits import IP_SLOTS, BrokerConnectionCounter, connection_table
from mqstore.twin import conns as twin

# a few addresses, so that caps are reached and slots shared
_IPS = st.sampled_from(["127.0.0.1", "127.0.0.2", "10.0.0.7", "::1", "fe80::1", "192.168.1.200", "", "é"])


@st.composite
def _actions(draw: st.DrawFn) -> tuple[int, int, int, int, list[tuple[str, int, str]]]:
    fronts = draw(st.integers(1, 4))
    ip_slots = draw(st.integers(1, 9))
    max_total = draw(st.integers(1, 12))
    max_per_ip = draw(st.integers(1, 6))
    ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "release", "reset"]), st.integers(0, fronts - 1), _IPS),
                        max_size=80))
    return fronts, ip_slots, max_total, max_per_ip, ops


@settings(max_examples=300, deadline=None)
@given(_actions())
def test_the_kernel_and_its_twin_agree(case):
    fronts, ip_slots, max_total, max_per_ip, ops = case
    size = kernel.table_size(fronts, ip_slots)
    assert size == twin.table_size(fronts, ip_slots)
    k_buf, t_buf = bytearray(size), bytearray(size)
    k, t = kernel.ConnectionTable.format(k_buf, fronts, ip_slots), twin.ConnectionTable.format(t_buf, fronts, ip_slots)
    assert k_buf == t_buf
    for op, front, ip in ops:
        if op == "admit":
            assert k.admit(front, ip, max_total, max_per_ip) == t.admit(front, ip, max_total, max_per_ip)
        elif op == "release":
            assert k.release(front, ip) == t.release(front, ip)
        else:
            k.reset(front)
            t.reset(front)
        assert k_buf == t_buf
        assert k.total() == t.total() <= max_total
        assert k.held(ip) == t.held(ip) <= max_per_ip
        assert [k.front_total(f) for f in range(fronts)] == [t.front_total(f) for f in range(fronts)]


@given(st.text(max_size=50), st.integers(1, 5000))
def test_the_address_slot_is_the_twins(ip, ip_slots):
    assert kernel.address_slot(ip, ip_slots) == twin.address_slot(ip, ip_slots)


def test_the_address_slot_is_fnv1a_and_the_same_in_every_process():
    # FNV-1a 64 of "" is its offset basis; of "a", the published test vector
    assert kernel.address_slot("", 1 << 62) == 0xCBF29CE484222325 % (1 << 62)
    assert kernel.address_slot("a", 1 << 62) == 0xAF63DC4C8601EC8C % (1 << 62)
    assert kernel.address_slot("127.0.0.1", IP_SLOTS) != kernel.address_slot("127.0.0.2", IP_SLOTS)


@pytest.mark.parametrize("module", [kernel, twin], ids=["kernel", "twin"])
def test_a_buffer_that_is_not_a_table_is_refused(module):
    with pytest.raises(ValueError, match="no MQCONNS1 magic"):
        module.ConnectionTable(bytearray(module.table_size(2, 8)))
    with pytest.raises(ValueError, match="at least 64 bytes"):
        module.ConnectionTable(bytearray(10))
    buf = bytearray(module.table_size(2, 8))
    module.ConnectionTable.format(buf, 2, 8)
    with pytest.raises(ValueError, match="damaged"):
        module.ConnectionTable(buf[:-8])  # cut short
    with pytest.raises(ValueError, match="needs"):
        module.ConnectionTable.format(bytearray(64), 2, 8)
    with pytest.raises(ValueError):
        module.table_size(0, 8)
    with pytest.raises(IndexError):
        module.ConnectionTable(buf).admit(2, "a", 1, 1)


@pytest.mark.parametrize("module", [kernel, twin], ids=["kernel", "twin"])
def test_caps_hold_over_every_front_and_a_reset_forgets_one_fronts_connections(module):
    table = module.ConnectionTable.format(bytearray(module.table_size(3, IP_SLOTS)), 3, IP_SLOTS)
    assert [table.admit(f, "127.0.0.1", 4, 3) for f in (0, 1, 2, 0)] == [0, 0, 0, module.OVER_PER_IP]
    assert table.admit(1, "127.0.0.2", 4, 3) == module.ADMITTED
    assert table.admit(2, "127.0.0.2", 4, 3) == module.OVER_TOTAL
    assert not table.release(2, "127.0.0.2")  # front 2 holds none from there: nothing changes
    assert table.total() == 4
    table.reset(1)  # front 1 restarted: its two connections died with it
    assert (table.total(), table.held("127.0.0.1"), table.held("127.0.0.2")) == (2, 2, 0)
    assert table.admit(2, "127.0.0.1", 4, 3) == module.ADMITTED


def test_fronts_share_the_table_through_its_memory_file():
    """Two counters on one connection_table fd, as two front processes have them: the caps are
    the broker's, and a front starting again zeroes only its own counts."""
    fd = connection_table(2)
    try:
        front0 = BrokerConnectionCounter(fd, 0, max_total=3, max_per_ip=2)
        front1 = BrokerConnectionCounter(fd, 1, max_total=3, max_per_ip=2)
        assert front0.admit("127.0.0.1") is None and front1.admit("127.0.0.1") is None
        assert "2 connections open to the broker from 127.0.0.1 (max_connections_per_ip 2)" == front0.admit("127.0.0.1")
        assert front1.admit("127.0.0.2") is None
        assert "3 connections open to the broker (max_connections 3)" == front0.admit("127.0.0.3")
        front1 = BrokerConnectionCounter(fd, 1, max_total=3, max_per_ip=2)  # front 1 restarted
        assert front0.total == 1
        assert front0.admit("127.0.0.1") is None and front0.admit("127.0.0.3") is None
        front0.release("127.0.0.3")
        assert front1.total == 2
    finally:
        os.close(fd)
