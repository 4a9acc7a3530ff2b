"""The Literal types the _shm stub gives control-block names (so mypy catches a misspelt cell,
counter, flag or channel) are exactly the names the compiled block knows."""

from __future__ import annotations

import ast
from pathlib import Path

from mqstore.log import _shm

STUB = Path(_shm.__file__).with_name("_shm.pyi")


def _literal(alias: str) -> set[str]:
    """The strings of ``alias = Literal[...]`` in the stub."""
    for node in ast.parse(STUB.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [alias]:
            assert isinstance(node.value, ast.Subscript) and ast.unparse(node.value.value) == "Literal"
            elements = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            return {e.value for e in elements if isinstance(e, ast.Constant)}
    raise AssertionError(f"no {alias} in {STUB}")


def test_cell_names_are_the_blocks_cells():
    assert _literal("CellName") == set(_shm._POSITIONS)  # type: ignore[attr-defined]


def test_stat_flag_and_channel_names():
    assert _literal("StatName") == set(_shm.STAT_NAMES)
    assert _literal("RunningFlag") == set(_shm.RUNNING_FLAGS)
    assert _literal("Channel") == set(_shm.CHANNELS)
