"""mqstore.layout defines each name and constant once for the Python code; the kernels compile
their own copies. These must agree, and the leaf must stay a leaf."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given, strategies as st

from mqstore import layout
from mqstore.log import _codec, _mapped
from mqstore.queue import _consumequeue, _search
from mqstore.twin import codec as twin_codec


def test_the_kernels_compile_the_same_constants():
    assert (layout.MESSAGE_MAGIC_CODE, layout.MESSAGE_MAGIC_CODE_V2, layout.BLANK_MAGIC_CODE) == (
        _codec.MESSAGE_MAGIC_CODE, _codec.MESSAGE_MAGIC_CODE_V2, _codec.BLANK_MAGIC_CODE)
    assert layout.CQ_STORE_UNIT_SIZE == _consumequeue.CQ_STORE_UNIT_SIZE == _search.CQ_STORE_UNIT_SIZE
    assert layout.OS_PAGE_SIZE == _mapped.OS_PAGE_SIZE == _search.OS_PAGE_SIZE
    from mqstore.log import _shm
    assert (layout.LOG_SHIFT, layout.MAX_LOGS) == (_shm.LOG_SHIFT, _shm.LOG_MAX)


def test_the_twins_written_from_the_spec_agree():
    assert (twin_codec.MESSAGE_MAGIC_CODE, twin_codec.BLANK_MAGIC_CODE) == (
        layout.MESSAGE_MAGIC_CODE, layout.BLANK_MAGIC_CODE)


def test_layout_is_a_leaf():
    tree = ast.parse(Path(layout.__file__).read_text(encoding="utf-8"))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert sorted(imported) == ["__future__", "os"]  # the standard library's paths only: nothing of mqstore


def test_no_module_spells_the_names_again():
    root = Path(layout.__file__).parent
    spelled = [f"{p.relative_to(root)}: {line.strip()}" for p in root.rglob("*.py") if p.name != "layout.py"
               and "twin" not in p.parts for line in p.read_text(encoding="utf-8").splitlines()
               if any(f'"{name}"' in line for name in (layout.CONTROL_BLOCK_NAME, layout.CONFIG_NAME,
                                                        layout.NODE_INFO_NAME))]
    assert spelled == []


# -- physical offsets: the log id in bits 56..62 (parallel CommitLogs spec §4.1) ------------------
FILE_SIZES = st.integers(1, 1 << 18).map(lambda pages: pages * 4096)  # any multiple of 4 KiB up to 1 GiB


@given(log_id=st.integers(0, 31), local=st.integers(0, (1 << 56) - 1), file_size=FILE_SIZES)
def test_the_file_holding_an_offset_is_counted_from_its_logs_first_byte(log_id, local, file_size):
    phy = layout.log_base(log_id) + local
    start = layout.file_start_of(phy, file_size)
    # the spec's rule, written out: base(k) + (local // file_size) * file_size
    assert start == (log_id << 56) + (local // file_size) * file_size
    assert start <= phy < start + file_size and layout.log_of(start) == layout.log_of(phy) == log_id
    assert layout.local_of(phy) == local and layout.file_start_of(start, file_size) == start
    if log_id == 0:  # one CommitLog: RocketMQ's own arithmetic, unchanged
        assert start == phy - phy % file_size


def test_past_log_0_the_old_arithmetic_would_name_the_wrong_file():
    phy, file_size = layout.log_base(1) + 5, 12 * 1024  # 2^56 is not a multiple of 12 KiB
    assert layout.file_start_of(phy, file_size) == layout.log_base(1)
    assert phy - phy % file_size != layout.log_base(1)
    assert layout.file_start_of(-1, 4096) == -4096  # before the first byte: log 0's arithmetic


@given(st.text(min_size=1, max_size=40), st.integers(-(2 ** 31), 2 ** 31 - 1), st.integers(1, 32))
def test_the_queue_to_log_binding_matches_its_twin(topic, queue_id, count):
    from mqstore.log import _shm
    from mqstore.twin import logs
    assert _shm.log_of_queue(topic, queue_id, count) == logs.log_of_queue(topic, queue_id, count)
    assert 0 <= _shm.log_of_queue(topic, queue_id, count) < count


@given(st.text(min_size=1, max_size=40), st.integers(2, 8))
def test_a_topic_with_a_multiple_of_n_queues_puts_as_many_in_each_log(topic, count):
    from mqstore.log import _shm
    per_log = [0] * count
    for q in range(8 * count):
        per_log[_shm.log_of_queue(topic, q, count)] += 1
    assert per_log == [8] * count


def test_the_binding_of_a_known_topic():
    from mqstore.twin import logs
    assert logs.fnv1a64(b"") == 0xCBF29CE484222325
    assert logs.fnv1a64(b"a") == 0xAF63DC4C8601EC8C  # FNV-1a 64's published test vector
