"""The .pyi stubs of the compiled modules match the runtime and type-check real use.

stubtest imports each extension module and compares every public name, signature
(parameter names, kinds, defaults), property and Final constant value with the stub, so a
def/cpdef/property added to or changed in ext/mqstore/<layer>/*.pyx without its stub fails here. The mypy
run checks that code using the public API through the stubs gets precise types.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# every kernel setup.py builds (ext/mqstore/<layer>/<name>.pyx -> mqstore.<layer>.<name>)
MODULES = sorted(f"mqstore.{p.parent.name}.{p.stem}" for p in (ROOT / "ext" / "mqstore").glob("*/*.pyx"))
ALLOWLIST = ROOT / "tests" / "stubtest_allowlist.txt"


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


def test_stubs_exist_for_every_compiled_module() -> None:
    for name in MODULES:
        stub = ROOT / (name.replace(".", "/") + ".pyi")
        assert stub.is_file(), f"{stub} is missing"
    assert (ROOT / "mqstore" / "py.typed").is_file()


def test_stubtest() -> None:
    """The stubs agree with the compiled modules (names, signatures, defaults, constants)."""
    # stubtest imports the modules built in place under ROOT (cwd), and runs mypy without a cache.
    proc = _run(["-m", "mypy.stubtest", "--mypy-config-file", str(ROOT / "pyproject.toml"),
                 "--allowlist", str(ALLOWLIST), *MODULES], cwd=ROOT)
    assert proc.returncode == 0, _report(proc)


SNIPPET = '''
from typing import Literal, assert_type

from mqstore import Message, MessageBatch, MessageStore, PutMessageResult, PutMessageStatus
from mqstore.log._codec import check_record, decode_batch_body, decode_record, encode_batch_body, encode_record
from mqstore.log._scan import scan_records
from mqstore.log._mapped import MappedFile
from mqstore.log._shm import ControlBlock
from mqstore.log.record import DecodedRecord


def put(store: MessageStore) -> int:
    msg = Message("TopicTest", b"hello", tags="TagA", keys=["k1", "k2"], properties={"UNIQ_KEY": "u1"},
                  born_host=("::1", 1234))
    assert_type(msg.tags, str | None)
    assert_type(msg.keys, list[str])
    assert_type(msg.properties, dict[str, str])
    msg.properties = None
    msg.queue_id = 3
    result = store.put_message(msg)
    assert_type(result, PutMessageResult)
    assert_type(result.status, PutMessageStatus)
    assert_type(result.msg_id, str | None)
    assert_type(result.detail, str | None)
    assert_type(result.check(), PutMessageResult)
    batch = MessageBatch.from_messages([msg, Message("TopicTest", bytearray(b"x"))], queue_id=1)
    assert_type(store.put_messages(batch).ok, bool)
    return result.wrote_offset + result.queue_offset


def codec() -> str:
    data = encode_record(topic="T", body=b"x", properties={"TAGS": "a"}, store_host=("10.0.0.1", 10911))
    rec = decode_record(memoryview(data), 0, check_crc=False)
    assert_type(rec, DecodedRecord)
    assert_type(check_record(data), tuple[int, bool])
    assert_type(decode_batch_body(encode_batch_body([(b"b", None, 0), (b"c", "K\\x01V", 1)])), list[tuple[int, bytes, str]])
    return rec.topic


def files(path: str, ctl_path: str) -> None:
    mf = MappedFile.open(path, 1 << 20)
    mf.wrote_position = 0
    view = memoryview(mf)  # MappedFile is a buffer
    stop, reason, count, last_ts = scan_records(mf, mf.file_from, 0, mf.file_size, True, ControlBlock.attach(ctl_path))
    assert_type(stop + count + last_ts, int)
    assert_type(reason, Literal["blank", "end", "invalid", "header"])
    ctl = ControlBlock.attach(ctl_path)
    assert_type(ctl.table_items(), list[tuple[str, int, int]])
    assert_type(ctl.lock_holder, tuple[int, int] | None)
    view.release()


def misuse(store: MessageStore, result: PutMessageResult) -> None:
    # each of these must be an error (--warn-unused-ignores turns a missed one into an error)
    Message(b"topic")  # type: ignore[arg-type]
    Message("t", b"x", 3)  # type: ignore[call-arg]
    result.wrote_offset = 1  # type: ignore[misc]
    decode_record(b"", offset="0")  # type: ignore[arg-type]
    MappedFile.open("/x/00000000000000000000")  # type: ignore[call-arg]
'''


def test_public_api_type_checks_with_mypy(tmp_path: Path) -> None:
    """A snippet using the public API type-checks (strict) against the stubs, and misuse is caught."""
    snippet = tmp_path / "use_mqstore.py"
    snippet.write_text(textwrap.dedent(SNIPPET))
    # cwd is tmp_path so the project's mypy config (ignore_missing_imports) does not apply: a stub
    # that is not found is an error, not a silent Any. Errors inside mqstore itself are not this
    # test's business (--follow-imports=silent), but its types are used.
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    proc = _run(["-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary", "--show-error-codes",
                 "--cache-dir", str(tmp_path / "cache"), str(snippet)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, _report(proc)
