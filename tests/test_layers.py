"""The package's import graph has no cycle, counting imports inside functions too (a lazy import
that closes a cycle is still a cycle: the layers must only import downward), and counting the
compiled kernels' imports and cimports (ext/mqstore/<layer>/*.pyx, *.pxd): a kernel that imports a
Python module which imports the kernel back is a cycle too. A kernel lives in its layer's package
(``mqstore.log._commitlog``), so importing it loads that package's ``__init__``: the cycle test counts
that import; the layer test ranks the kernel itself under everything."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mqstore

ROOT = Path(mqstore.__file__).parent
EXT = ROOT.parent / "ext" / "mqstore"
#: Cython's import statements (what ast cannot parse): ``from mqstore.x import a, b``,
#: ``from mqstore._k cimport T``, ``from mqstore import _k``, ``import mqstore.x``, at any indent
_PYX_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(mqstore(?:\.\w+)*)[ \t]+c?import[ \t]+\(?([\w, \t]+)"
                         r"|c?import[ \t]+(mqstore(?:\.\w+)*))", re.M)


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """The mqstore modules path imports anywhere (``from mqstore import _kernel`` names the
    extension, not the package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mqstore":
            subs = [f"{node.module}.{a.name}" for a in node.names]
            if node.module == "mqstore" and all(s in mods or a.name.startswith("_") for s, a in zip(subs, node.names)):
                out.update(s for s in subs if s in mods)
            else:
                out.add(node.module)
                out.update(s for s in subs if s in mods)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "mqstore")
    return {m for m in out if m in mods}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _kernels() -> dict[str, list[Path]]:
    """mqstore.<layer>._name -> its .pyx and .pxd sources (ext/mqstore/<layer>/_name.*)."""
    found: dict[str, list[Path]] = {}
    for p in sorted(EXT.glob("*/*.pyx")) + sorted(EXT.glob("*/_*.pxd")):
        found.setdefault(f"mqstore.{p.parent.name}.{p.stem}", []).append(p)
    return found


KERNELS = frozenset(_kernels())


def _kernel_imports(sources: list[Path], mods: dict[str, Path]) -> set[str]:
    """The mqstore modules (Python or compiled) a kernel's sources import or cimport anywhere."""
    out = set()
    for path in sources:
        for m in _PYX_IMPORT.finditer(path.read_text(encoding="utf-8")):
            if m.group(3):
                out.add(m.group(3))
                continue
            names = [f"{m.group(1)}.{a.split()[0]}" for a in m.group(2).split(",") if a.strip()]
            if m.group(1) != "mqstore":
                out.add(m.group(1))  # the module itself, or the package whose __init__ loads first
            out.update(names)
    return {m for m in out if m in mods}


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _graph() -> dict[str, set[str]]:
    """Every module's mqstore imports: the Python modules' (with the kernels as targets) and
    the kernels' own."""
    mods = _modules()
    kernels = _kernels()
    everything = {**mods, **{name: sources[0] for name, sources in kernels.items()}}
    # a module's own packages are loading already when it imports from them (``from mqstore.acl
    # import _acl`` in mqstore.acl.signature): not an edge
    graph = {m: _imports(p, everything) - {m} - _ancestors(m) for m, p in mods.items()}
    graph.update({k: _kernel_imports(sources, everything) - {k} for k, sources in kernels.items()})
    return graph


def test_no_import_cycles_even_through_lazy_imports():
    graph = _graph()
    assert len(graph) > 50
    assert _cycles(graph) == []


def test_the_kernels_imports_are_seen():
    graph = _graph()
    assert {"mqstore.log._mapped", "mqstore.log._shm", "mqstore.log._message", "mqstore.log._scan", "mqstore.errors"} <= graph[
        "mqstore.log._commitlog"]
    assert "mqstore.queue._consumequeue" in graph["mqstore.log._scan"]  # a cimport
    assert "mqstore.log._codec" in graph["mqstore.queue._reads"]
    assert "mqstore.compression" in graph["mqstore.queue._arrow"]  # from mqstore import compression as _compression
    # a kernel importing a module that imports it back is found
    graph["mqstore.errors"] = graph["mqstore.errors"] | {"mqstore.log._commitlog"}
    assert any({"mqstore.log._commitlog", "mqstore.errors"} <= set(c) for c in _cycles(graph))


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: the layers, lowest first; a module imports only from its own layer or below (imports under
#: ``if TYPE_CHECKING:`` are for annotations only and do not count). The compiled kernels
#: (``mqstore.<layer>._*``) sit under everything.
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("errors", "layout", "roles", "exit_codes", "progress", "status", "config", "_config_keys", "geometry",
        "procs", "twin", "segformat", "protocol", "remoting", "acl", "tls", "compression", "signals"),  # remoting: the
    #  frame codec's package; acl: the plain ACL; tls: contexts, accept loop; compression: stored bodies
    #  inflated for readers; signals: a stop request
    1: ("log",),                  # records, mapped files, the CommitLog, checkpoint, pool, the directory
    2: ("queue",),                # ConsumeQueues, index, dispatch, reads, recovery, following, snapshots
    3: ("parts",),                # open_parts: a store's parts as each process role maps them
    4: ("services", "node", "ha", "tier"),  # the service loops, their registry, the node's supervisor,
    #                                          replication, tiered storage
    5: ("store",),                # MessageStore / AttachedStore: the composition
    6: ("tools", "launch", "__main__", "broker", "client"),  # the commands, checker, inspection, stats, soak;
    #                                                         the broker front; the RocketMQ client
    7: ("spark",),
}
_RANK = {name: rank for rank, names in LAYERS.items() for name in names}


def _rank(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return 99  # the package's lazy facade may name anything
    if module in KERNELS or (parts[1].startswith("_") and parts[1] not in _RANK):
        return -1  # a compiled kernel, or a dunder of the package (__version__)
    return _RANK[parts[1]]


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and ast.unparse(block.test) == "TYPE_CHECKING" for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mqstore":
            if node.module == "mqstore":  # a submodule, or a public name of the facade: where it lives
                names = [mqstore._EXPORTS.get(a.name, f"mqstore.{a.name}") for a in node.names]
            elif all(f"{node.module}.{a.name}" in KERNELS for a in node.names):
                names = [f"{node.module}.{a.name}" for a in node.names]  # kernels from their layer's package
            else:
                names = [node.module]
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "mqstore"]
    return found


def test_every_module_sits_in_a_layer_and_imports_only_downward():
    upward = []
    for name, path in sorted(_modules().items()):
        rank = _rank(name)
        for line, target in _runtime_imports(path):
            if target != "mqstore" and _rank(target) > rank:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} (layer {rank}) imports {target} "
                              f"(layer {_rank(target)})")
    assert upward == []
