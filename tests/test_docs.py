"""The README and docs/ as a newcomer reads them (issue 14): every Python snippet runs as written
(the snippets of one page run in order, in one namespace, as one program; only the directories
under /tmp they name are moved into the test's own tmp_path), every command line in a shell block
names a real command and real flags, every link and repository path points at something that
exists, and nothing refers to documents outside the repository."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path, *languages: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text(encoding="utf-8")) if lang in languages]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


PYTHON_PAGES = [p for p in PAGES if blocks(p, "python")]


def _needs_spark(page: Path) -> bool:
    source = "".join(blocks(page, "python"))
    return "pyspark" in source or "mqstore.spark" in source


@pytest.mark.parametrize("page", [pytest.param(p, marks=[pytest.mark.spark] if _needs_spark(p) else [])
                                  for p in PYTHON_PAGES], ids=page_id)
def test_python_snippets_run_as_written(page, tmp_path, monkeypatch, request):
    source = "".join(blocks(page, "python"))
    if "pyspark" in source or "mqstore.spark" in source:
        request.getfixturevalue("spark")  # one JVM for the run; the snippet's session() finds it
    source = source.replace("/tmp/", f"{tmp_path}/")
    monkeypatch.chdir(tmp_path)
    exec(compile(source, str(page), "exec"), {"__name__": "__snippet__"})


def command_lines(page: Path) -> list[str]:
    """Shell lines of a page's bash/console/plain blocks that run mqstore's commands."""
    out = []
    for body in blocks(page, "", "bash", "sh", "console", "shell"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if not re.search(r"(^|[\s/])mqstore(\s|$)|-m mqstore(\s|$)", line):
                continue  # output samples, other commands
            for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
                words = shlex.split(part) if part else []
                while words and ("=" in words[0] and not words[0].startswith("-")):
                    words = words[1:]  # VAR=value prefixes
                if words and words[0].endswith(("/python", "python3")) and words[1:3] == ["-m", "mqstore"]:
                    words = ["mqstore", *words[3:]]
                if words and os.path.basename(words[0]) == "mqstore":
                    out.append(shlex.join(["mqstore", *words[1:]]))
    return out


COMMANDS = [(p, line) for p in PAGES for line in command_lines(p)]


def _subparser(parser, words):
    """The parser of the subcommand words name, and the words after it."""
    import argparse

    while words:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or words[0] not in actions[0].choices:
            break
        parser, words = actions[0].choices[words[0]], words[1:]
    return parser, words


@pytest.mark.parametrize("page, line", COMMANDS, ids=[f"{page_id(p)}: {line[:60]}" for p, line in COMMANDS])
def test_documented_commands_parse(page, line):
    """A documented `mqstore ...` command line is accepted by the command's own parser; a usage
    synopsis (with [optional] parts or UPPER placeholders for the command) names only options
    its command has."""
    from mqstore.tools.cli import build_parser

    words = [w for w in shlex.split(line)[1:] if w != "..."]
    if any(ch in line for ch in "[]()|") or "COMMAND" in words:
        parser, rest = _subparser(build_parser(), [w for w in words if w != "COMMAND"])
        known = {opt for action in parser._actions for opt in action.option_strings}
        unknown = [f for f in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", " ".join(rest)) if f not in known]
        assert unknown == [], f"{page_id(page)}: `{line}` names options its command does not have"
        return
    try:
        build_parser().parse_args(words)
    except SystemExit as exc:
        assert exc.code == 0, f"{page_id(page)}: `{line}` does not parse"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(r"`((?:mqstore|ext|tests|bench|examples|docs|pyspark_mqstore)/[\w./*-]+)`")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_and_repository_paths_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if "://" in target:
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    for path in REPO_PATH.findall(text):
        if "*" in path:
            if not list(ROOT.glob(path)):
                missing.append(path)
        elif not (ROOT / path.rstrip("/")).exists():
            missing.append(path)
    assert missing == []


OUTSIDE = re.compile(r"\.\./shared|/work/|\bseed \d|\bseeds/|\bissue \d+\b", re.I)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_reference_to_documents_outside_the_repository(page):
    hits = [line.strip() for line in page.read_text(encoding="utf-8").splitlines() if OUTSIDE.search(line)]
    assert hits == []


SOURCES = sorted(p for pattern in ("mqstore/**/*.py", "mqstore/**/*.pyi", "ext/mqstore/*/*.pyx", "ext/mqstore/*/*.pxd", "ext/*.pxd",
                                         "ext/include/*.h")
                 for p in ROOT.glob(pattern))


def test_the_code_refers_to_nothing_outside_the_repository():
    """Docstrings and comments cite docs/ (the spec, the design), never a document a reader of
    the repository cannot open."""
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in SOURCES
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert len(SOURCES) > 50 and hits == []
