"""A broker's JSON config files as RocketMQ 4.9.7 writes and reads them (ConfigManager,
MixAll.string2File; docs/rocketmq-remoting-spec.md §3.5): fastjson's pretty output, a reader that
also takes fastjson's bare integer map keys, a file written whole then renamed over the old one
whose previous content is kept as ``<file>.bak``, and a load that falls back to that ``.bak``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from typing import Any, TypeVar

from mqstore.errors import ConfigError

__all__ = ["fastjson_pretty", "loads_lenient", "read_with_bak", "write_with_bak"]

T = TypeVar("T")

# a JSON string (skipped whole, so nothing inside one is touched) or a bare integer key after { or ,
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|(?<=[{,])([ \t\n\r]*)(-?[0-9]+)([ \t\n\r]*:)')


def _quote_bare_key(m: re.Match[str]) -> str:
    if m.group(2) is None:
        return m.group(0)
    return f'{m.group(1)}"{m.group(2)}"{m.group(3)}'


def loads_lenient(text: str) -> Any:
    """JSON that may hold fastjson's bare integer keys (``{0:12,1:5}``): they are quoted, then the
    text is parsed as standard JSON (so the keys come back as strings). ValueError when it is not
    JSON either way."""
    try:
        return json.loads(_STRING_OR_BARE_KEY.sub(_quote_bare_key, text))
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def fastjson_pretty(value: Any) -> str:
    """``value`` as fastjson 1.2 writes it with PrettyFormat (RocketMQ's config files): tab
    indentation, no space after a colon, a newline before every string key but none before an
    integer key, which is written bare (a Map<Integer, Long> comes out as ``{0:12,1:5`` and its
    ``}`` on a line of its own), ``{}`` for an empty map. Keys are sorted (fastjson sorts a bean's
    fields; RocketMQ's maps have no order, sorting makes the files comparable). A list is laid out
    one item a line; RocketMQ 4.9.7's own files hold none (only properties of other versions kept
    from a loaded file do), and any JSON reader takes it."""
    out: list[str] = []
    _pretty(value, 0, out)
    return "".join(out)


def _pretty(value: Any, depth: int, out: list[str]) -> None:
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        out.append("{")
        inner = "\n" + "\t" * (depth + 1)
        for i, (key, item) in enumerate(sorted(value.items(), key=lambda kv: kv[0])):
            if i:
                out.append(",")
            if type(key) is int:
                out.append(f"{key}:")
            elif type(key) is str:
                out.append(f"{inner}{json.dumps(key, ensure_ascii=False)}:")
            else:
                raise TypeError(f"a map key must be a str or an int, not {type(key).__name__}")
            _pretty(item, depth + 1, out)
        out.append("\n" + "\t" * depth + "}")
    elif isinstance(value, list):
        if not value:
            out.append("[]")
            return
        out.append("[")
        inner = "\n" + "\t" * (depth + 1)
        for i, item in enumerate(value):
            out.append("," + inner if i else inner)
            _pretty(item, depth + 1, out)
        out.append("\n" + "\t" * depth + "]")
    elif value is None or isinstance(value, (str, bool, int, float)):
        out.append(json.dumps(value, ensure_ascii=False))
    else:
        raise TypeError(f"fastjson_pretty writes JSON values, not {type(value).__name__}")


def read_with_bak(path: str, decode: Callable[[str], T]) -> tuple[T | None, str | None]:
    """Load ``path`` with ``decode`` (which raises ValueError on bad content) as RocketMQ's
    ConfigManager.load does: a missing or blank file, or one ``decode`` rejects, gives way to
    ``<path>.bak``. Returns (what decode made, the file it came from), or (None, None) when neither
    file exists or has content. ConfigError naming the file and the parse error when what there is
    cannot be read (RocketMQ 4.9.7 starts empty when the file is damaged and there is no .bak;
    we refuse, so a damaged file is never silently taken for no data)."""
    bak = path + ".bak"
    main_error: str | None = None
    data = _read(path)
    if data is not None and data.strip():
        try:
            return decode(data.decode("utf-8")), path
        except ValueError as exc:  # UnicodeDecodeError is one
            main_error = f"{path} cannot be read: {exc}"
    bak_data = _read(bak)
    if bak_data is None or not bak_data.strip():
        if main_error is not None:
            raise ConfigError(f"{main_error} (and there is no {os.path.basename(bak)} to fall back to)")
        return None, None
    try:
        return decode(bak_data.decode("utf-8")), bak
    except ValueError as exc:
        first = main_error + "; and " if main_error else f"{path} is missing or empty; and "
        raise ConfigError(f"{first}its .bak {bak} cannot be read: {exc}") from None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def write_with_bak(path: str, text: str, *, backup: bool = True) -> None:
    """Write ``text`` to ``path`` as MixAll.string2File does, made crash-safe: ``<path>.tmp``
    written and fsynced, the current file copied to ``<path>.bak`` (unless ``backup`` is False:
    pass False when the current file is known to be damaged, so it does not replace a good .bak),
    then the .tmp renamed over the file and the directory fsynced. At every moment the file or its
    .bak holds a whole version."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(text.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    if backup and os.path.exists(path):
        shutil.copyfile(path, path + ".bak")
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
