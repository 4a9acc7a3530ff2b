"""``mqstore dump``: records at a physical offset or a queue offset range, every field decoded.

Bodies are shown as the producer sent them (a body stored compressed is inflated per its
sysFlag, mqstore.compression), or as stored with ``--raw-body``. A body that does not inflate
(or needs a package that is not installed) is shown as stored, with a note saying why: a dump
shows what is there and does not stop at it."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from typing import Any

from mqstore.compression import compression_of, inflate_body, record_where
from mqstore.errors import BodyDecompressError, CompressionLibraryMissingError
from mqstore.tools.inspection import DumpEntry, LogReader, queue_records
from mqstore.log.record import DecodedRecord
from mqstore.tools.stats import ms_to_iso
from mqstore.exit_codes import EXIT_OK
from mqstore.log.directory import require_store
from mqstore.tools.commands.common import positive_int, print_json, print_lines, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--phy", type=int, metavar="OFFSET", help="the record at this physical (CommitLog) offset")
    where.add_argument("--topic", metavar="T", help="records of this topic's queue --queue, through its ConsumeQueue")
    p.add_argument("--queue", type=int, metavar="Q", help="queue id (with --topic)")
    p.add_argument("--from", dest="from_offset", type=int, metavar="QOFF",
                   help="first queue offset (with --topic; default: the queue's min offset)")
    p.add_argument("--count", type=positive_int, default=1, metavar="N", help="records to show (default 1)")
    p.add_argument("--body", choices=("none", "hex", "text"), default="none",
                   help="show the body as a hex dump or as UTF-8 text (default: its length only)")
    p.add_argument("--raw-body", action="store_true",
                   help="the body as stored: a compressed one is not inflated (default: as the producer sent it)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")


def run(args: argparse.Namespace) -> int:
    if args.topic is not None and args.queue is None:
        raise UsageError("--topic needs --queue Q")
    if args.phy is not None and (args.queue is not None or args.from_offset is not None):
        raise UsageError("--queue and --from go with --topic, not with --phy")
    root = require_store(args.store_dir)
    with LogReader(root) as log:
        if args.phy is not None:
            entries = log.records_at(args.phy, args.count)
            where: dict[str, Any] = {"phy": args.phy}
        else:
            info, entries = queue_records(root, log, args.topic, args.queue, args.from_offset, args.count)
            where = {"topic": info.topic, "queue_id": info.queue_id, "min_offset": info.min_offset,
                     "max_offset": info.max_offset}
        if args.json:
            print_json({"root": root, **where, "count": len(entries),
                         "records": [_entry_json(e, args.body, args.raw_body) for e in entries]})
        else:
            for i, entry in enumerate(entries):
                if i:
                    print()
                _print_entry(entry, args.body, args.raw_body)
            if len(entries) < args.count:
                print(f"\n({len(entries)} of {args.count} shown: "
                      f"{'the queue ends' if args.phy is None else 'the log ends'} there)")
    return EXIT_OK


SYS_FLAG_BITS = ((0x1, "COMPRESSED"), (0x2, "MULTI_TAGS"), (0x10, "BORNHOST_V6"), (0x20, "STOREHOST_V6"),
                 (0x40, "NEED_UNWRAP"), (0x80, "INNER_BATCH"))
TRANSACTION_TYPES = {0x0: "NOT", 0x4: "PREPARED", 0x8: "COMMIT", 0xC: "ROLLBACK"}
COMPRESSION_TYPES = {0x100: "LZ4", 0x200: "ZSTD", 0x300: "ZLIB"}


def _sys_flag_names(sys_flag: int) -> list[str]:
    """spec §1.3: the bits of SYSFLAG by name; the transaction type is always named."""
    names = [name for bit, name in SYS_FLAG_BITS if sys_flag & bit]
    names.append(f"TRANSACTION_{TRANSACTION_TYPES[sys_flag & 0xC]}")
    if sys_flag & 0x700:
        names.append(f"COMPRESSION_{COMPRESSION_TYPES.get(sys_flag & 0x700, hex(sys_flag & 0x700))}")
    return names


def _host(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _body(body: bytes, mode: str) -> str | None:
    if mode == "hex":
        return body.hex()
    if mode == "text":
        return body.decode("utf-8", errors="replace")
    return None


def _shown_body(rec: DecodedRecord, raw: bool) -> tuple[bytes, bool, str]:
    """(the body to show, whether it was inflated, why it could not be): as the producer sent
    it unless raw; as stored when it does not inflate."""
    stored = rec.body or b""
    if raw or not stored or compression_of(rec.sys_flag) is None:
        return stored, False, ""
    try:
        where = record_where(rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset)
        return inflate_body(stored, rec.sys_flag, where), True, ""
    except (BodyDecompressError, CompressionLibraryMissingError) as exc:
        return stored, False, f"{exc.args[0]}; shown as stored"


def _record_json(rec: DecodedRecord, entry: DumpEntry, body_mode: str, raw: bool) -> dict[str, Any]:
    body, inflated, problem = _shown_body(rec, raw)
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name != "body"}
    return {**fields, "born_host": _host(rec.born_host), "store_host": _host(rec.store_host),
            "version": "V2" if rec.is_v2 else "V1", "sys_flag_names": _sys_flag_names(rec.sys_flag),
            "tags": rec.tags, "tags_code": rec.tags_code, "keys": rec.keys, "uniq_key": rec.uniq_key,
            "msg_id": rec.msg_id, "compression": compression_of(rec.sys_flag), "body_inflated": inflated,
            "body_problem": problem or None, "stored_body_length": len(rec.body or b""), "body_length": len(body),
            "computed_body_crc": entry.computed_crc, "body_crc_ok": entry.crc_ok, "body": _body(body, body_mode)}


def _entry_json(entry: DumpEntry, body_mode: str, raw: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"physical_offset": entry.phy, "file": entry.file_name or None}
    if entry.unit is not None:
        phy, size, tags = entry.unit
        out.update(queue_offset=entry.queue_offset, unit={"phy_offset": phy, "size": size, "tags_code": tags})
    out["note"] = entry.note or None
    out["record"] = None if entry.record is None else _record_json(entry.record, entry, body_mode, raw)
    return out


def _print_entry(entry: DumpEntry, body_mode: str, raw: bool) -> None:
    if entry.unit is not None:
        phy, size, tags = entry.unit
        print(f"queue offset {entry.queue_offset}: unit phy {phy:,}, size {size:,}, tags code {tags}")
    rec = entry.record
    if rec is None:
        print(f"  NOTE {entry.note}")
        return
    stored = rec.body or b""
    body, inflated, problem = _shown_body(rec, raw)
    kind = compression_of(rec.sys_flag)
    if inflated:
        body_row = f"{len(body):,} bytes (stored {len(stored):,} bytes, {kind}-compressed)"
    elif kind is not None and stored:
        body_row = f"{len(body):,} bytes as stored ({kind}-compressed)"
    else:
        body_row = f"{len(body):,} bytes"
    pos = entry.phy - int(entry.file_name)  # a CommitLog file is named by its start offset
    print(f"record at {entry.phy:,} (file {entry.file_name}, position {pos:,})")
    crc = "ok" if entry.crc_ok else f"MISMATCH: the body's CRC is {entry.computed_crc}"
    rows = [
        ("topic", rec.topic),
        ("queue id", rec.queue_id),
        ("queue offset", rec.queue_offset),
        ("physical offset", f"{rec.physical_offset:,}"),
        ("total size", f"{rec.total_size:,} (body {len(stored):,}, topic {len(rec.topic.encode()):,}, properties "
                       f"{len(rec.properties_string.encode()):,})"),
        ("magic", f"0x{rec.magic & 0xFFFFFFFF:08X} ({'V2' if rec.is_v2 else 'V1'})"),
        ("body CRC", f"{rec.body_crc} ({crc})"),
        ("flag", rec.flag),
        ("sys flag", f"0x{rec.sys_flag:X} ({', '.join(_sys_flag_names(rec.sys_flag))})"),
        ("born", f"{rec.born_timestamp} ({ms_to_iso(rec.born_timestamp)}) from {_host(rec.born_host)}"),
        ("stored", f"{rec.store_timestamp} ({ms_to_iso(rec.store_timestamp)}) at {_host(rec.store_host)}"),
        ("reconsume times", rec.reconsume_times),
        ("prepared tx offset", rec.prepared_transaction_offset),
        ("properties", ", ".join(f"{k}={_printable(v)}" for k, v in rec.properties.items()) or "(none)"),
        ("tags", f"{_printable(rec.tags)} (tags code {rec.tags_code})" if rec.tags else "(none)"),
        ("keys", " ".join(_printable(k) for k in rec.keys) or "(none)"),
        ("unique key", rec.uniq_key or "(none)"),
        ("msg id", rec.msg_id),
        ("body", body_row),
    ]
    for name, value in rows:
        print(f"  {name:<19} {value}")
    if entry.note:
        print(f"  NOTE {entry.note}")
    if problem:
        print(f"  NOTE {problem}")
    if body_mode == "hex":
        print_lines(_hexdump(body))
    elif body_mode == "text":
        print(textwrap.indent(_printable(body.decode("utf-8", errors="replace"), keep="\n\t"), "    "))


def _printable(text: str | None, keep: str = "") -> str:
    """text with control characters escaped, so a record cannot drive the terminal."""
    if text is None:
        return ""
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text)


def _hexdump(data: bytes, width: int = 16) -> list[str]:
    lines = []
    for at in range(0, len(data), width):
        chunk = data[at:at + width]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"    {at:08x}  {chunk.hex(' '):<{width * 3 - 1}}  {text}")
    return lines
