"""mqstore.layout defines each name and constant once for the Python code; the kernels compile
their own copies. These must agree, and the leaf must stay a leaf."""

from __future__ import annotations

import ast
from pathlib import Path

from mqstore import _codec, _consumequeue, _mapped, _search, layout
from mqstore.twin import codec as twin_codec


def test_the_kernels_compile_the_same_constants():
    assert (layout.MESSAGE_MAGIC_CODE, layout.MESSAGE_MAGIC_CODE_V2, layout.BLANK_MAGIC_CODE) == (
        _codec.MESSAGE_MAGIC_CODE, _codec.MESSAGE_MAGIC_CODE_V2, _codec.BLANK_MAGIC_CODE)
    assert layout.CQ_STORE_UNIT_SIZE == _consumequeue.CQ_STORE_UNIT_SIZE == _search.CQ_STORE_UNIT_SIZE
    assert layout.OS_PAGE_SIZE == _mapped.OS_PAGE_SIZE == _search.OS_PAGE_SIZE


def test_the_twins_written_from_the_spec_agree():
    assert (twin_codec.MESSAGE_MAGIC_CODE, twin_codec.BLANK_MAGIC_CODE) == (
        layout.MESSAGE_MAGIC_CODE, layout.BLANK_MAGIC_CODE)


def test_layout_is_a_leaf():
    tree = ast.parse(Path(layout.__file__).read_text(encoding="utf-8"))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported == ["__future__"]


def test_no_module_spells_the_names_again():
    root = Path(layout.__file__).parent
    spelled = [f"{p.relative_to(root)}: {line.strip()}" for p in root.rglob("*.py") if p.name != "layout.py"
               and "twin" not in p.parts for line in p.read_text(encoding="utf-8").splitlines()
               if any(f'"{name}"' in line for name in (layout.CONTROL_BLOCK_NAME, layout.CONFIG_NAME,
                                                        layout.NODE_INFO_NAME))]
    assert spelled == []
