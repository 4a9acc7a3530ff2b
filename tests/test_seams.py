"""The kernels' seams are typed: a kernel reaches another's mapping through a cdef class it
cimports (declared in ext/mqstore/<layer>/<module>.pxd), never through an address passed as an int.

A refactor that drops a keep-alive or passes the wrong object then fails to compile, or raises
TypeError at the call, instead of reading freed memory."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "ext" / "mqstore"
SOURCES = sorted(KERNELS.glob("*/*.pyx")) + sorted(KERNELS.glob("*/*.pxd"))
# a pointer made from an integer: <char *><size_t>x, <const T *>some_int, ...
INT_TO_POINTER = re.compile(r"<(?:const\s+)?\w+\s*\*+\s*>\s*<(?:size_t|uintptr_t|int64_t|Py_ssize_t|long)>")
ADDRESS_PARAMETER = re.compile(r"\b(?:size_t|uintptr_t)\s+\w*address\b")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_pointer_is_made_from_an_int(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    hits = [f"{source.name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if INT_TO_POINTER.search(line) or ADDRESS_PARAMETER.search(line)]
    assert hits == []


def _compiled_modules() -> list[str]:
    return sorted(f"mqstore.{p.parent.name}.{p.stem}" for p in KERNELS.glob("*/*.pyx"))


@pytest.mark.parametrize("name", _compiled_modules())
def test_no_compiled_class_hands_out_an_address(name: str) -> None:
    module = importlib.import_module(name)
    hits = [f"{name}.{cls}.{attr}" for cls, obj in vars(module).items() if isinstance(obj, type)
            for attr in dir(obj) if attr == "address" or attr.endswith("_address") or attr.endswith("_addresses")]
    assert hits == []


def test_every_cimported_kernel_declares_its_classes() -> None:
    """``from mqstore.<layer>._x cimport C``: _x.pxd exists next to _x.pyx and declares C."""
    cimports = re.compile(r"^from mqstore\.(\w+)\.(_\w+) cimport (.+)$", re.M)
    seen = 0
    for source in SOURCES:
        for layer, module, names in cimports.findall(source.read_text(encoding="utf-8")):
            pxd = KERNELS / layer / f"{module}.pxd"
            assert (KERNELS / layer / f"{module}.pyx").is_file() and pxd.is_file(), (source.name, module)
            declared = pxd.read_text(encoding="utf-8")
            for cname in (n.strip() for n in names.split(",")):
                assert re.search(rf"\b{cname}\b", declared), (source.name, module, cname)
                seen += 1
    assert seen >= 10  # the put path, dispatch, reads, search, index and pool all cimport their peers


def test_a_wrong_object_is_a_type_error_not_a_crash(tmp_path: Path) -> None:
    from mqstore.queue._consumequeue import ConsumeQueueKernel
    from mqstore.queue._reads import LogMap
    from mqstore.queue._search import first_corrupt

    kernel = ConsumeQueueKernel("T", 0, 20 * 10)
    with pytest.raises(TypeError):
        kernel.set_current_file(bytearray(200))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kernel.publish_to(object())
    with pytest.raises(TypeError):
        LogMap([bytearray(64)], 64)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        first_corrupt([0], 140737488355328)  # type: ignore[arg-type]
