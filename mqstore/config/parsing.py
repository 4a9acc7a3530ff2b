"""Java .properties parsing: a RocketMQ broker.conf as text, into (key, value) pairs."""

from __future__ import annotations


import os
import re
from collections.abc import Iterator
from pathlib import Path

from mqstore.errors import ConfigError


# ------------------------------------------------------------------------------------------------
# Java .properties parsing


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _read_broker_conf(path_or_text: str | os.PathLike[str]) -> tuple[str, str]:
    """-> (name for error messages, text)."""
    if isinstance(path_or_text, str) and ("\n" in path_or_text or "\r" in path_or_text):
        return "<broker.conf text>", path_or_text
    path = Path(os.fspath(path_or_text))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"can not read broker.conf {str(path)!r}: {exc.strerror}",
                          hint="pass an existing file, or the file's text (with its line breaks)") from None
    try:  # Java reads .properties as ISO-8859-1; UTF-8 is what people write today
        return str(path), data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return str(path), data.decode("latin-1")


def _ends_in_continuation(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(text: str, source: str, lineno: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        i += 1
        if char != "\\" or i == len(text):
            out.append(char)
            continue
        char = text[i]
        i += 1
        if char == "u":
            digits = text[i:i + 4]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"{source}:{lineno}: malformed \\uXXXX escape {text[i - 2:i + 4]!r}",
                                  hint="a \\u escape takes exactly four hex digits")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(char, char))
    return "".join(out)


def _split_key_value(line: str) -> tuple[str, str]:
    """java.util.Properties: the key ends at the first unescaped '=', ':' or whitespace."""
    escaped = False
    end = len(line)
    for index, char in enumerate(line):
        if not escaped and (char in "=:" or char in _WHITESPACE):
            end = index
            break
        escaped = char == "\\" and not escaped
    rest = line[end:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:]
    return line[:end], rest


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield (first line number, logical line) with comments and blank lines dropped and
    backslash continuations joined (leading whitespace of continuation lines skipped)."""
    lines = _LINE_BREAK.split(text)
    index = 0
    while index < len(lines):
        lineno = index + 1
        line = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not line or line[0] in "#!":
            continue
        while _ends_in_continuation(line):
            line = line[:-1]
            if index == len(lines):
                break
            line += lines[index].lstrip(_WHITESPACE)
            index += 1
        yield lineno, line


def parse_properties(text: str, *, source: str = "<properties>") -> list[tuple[int, str, str]]:
    """Parse Java .properties text -> [(line number, key, value)] in file order.

    ``key=value``, ``key: value`` and ``key value``; ``#`` and ``!`` comment lines; backslash line
    continuation; ``\\uXXXX``, ``\\t``, ``\\n``, ``\\r``, ``\\f`` and ``\\<char>`` escapes. Values
    have surrounding whitespace trimmed. Later duplicates win when applied in order (as in Java).
    """
    result: list[tuple[int, str, str]] = []
    for lineno, line in _logical_lines(text):
        raw_key, raw_value = _split_key_value(line)
        key = _unescape(raw_key, source, lineno)
        if not key:
            raise ConfigError(f"{source}:{lineno}: a line with a value but no key",
                              hint="write key=value")
        result.append((lineno, key, _unescape(raw_value, source, lineno).strip(_WHITESPACE)))
    return result


