"""Bodies as the producer sent them (issue 26, point 6): the store's readers inflate a body stored
compressed per its sysFlag (zlib; RocketMQ 5's LZ4 and ZSTD types) as RocketMQ's clients do, keep
the stored bytes readable as they are, and name a body that does not inflate.

The kernel side (mqstore.queue._reads: GetMessageResult.bodies, MessageView.body / body_bytes) against
its twin (mqstore.twin.reads.body_as_sent, hypothesis); raw access; the errors; the inflated-size
bound; a missing package; ``mqstore dump``. The Arrow kernel's parity is in tests/test_arrow.py,
the client's in tests/test_client_decode.py, bodies the real C++ client compressed in
tests/test_bodies_cpp.py."""

from __future__ import annotations

import json
import sys
import tempfile
import zlib

import pytest
from helpers_bodies import FLAGS, compress, stored_bodies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageStore, compression
from mqstore.queue._arrow import BatchColumns
from mqstore.errors import BodyDecompressError, CompressionLibraryMissingError, CorruptRecordError
from mqstore.exit_codes import EXIT_OK
from mqstore.queue.snapshot import StoreSnapshot
from mqstore.status import GetMessageStatus
from mqstore.tools.cli import main
from mqstore.tools.checker import check_store
from mqstore.twin import arrow as twin_arrow
from mqstore.twin.codec import decode_record
from mqstore.twin.reads import body_as_sent

CFG = {"mapped_file_size_commit_log": 1 << 20, "mapped_file_size_consume_queue": 20 * 1000}
TEXT = b"".join(b"line %d of a body the producer sent compressed\n" % i for i in range(150))  # 7 KB


def _outcome(fn):
    """fn()'s value, or (type, message) of what it raised."""
    try:
        return fn()
    except Exception as exc:
        return type(exc), str(exc)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(stored_bodies(), min_size=1, max_size=6), st.sampled_from([0, 0x2, 0x8]))  # a PREPARED one is not dispatched
def test_the_read_kernel_hands_out_bodies_as_the_twin_does(bodies, other_bits):
    """bodies(), body_bytes() and body give what the twin gives (the same error when a body does
    not inflate); decompress=False and raw_body give the stored bytes; sys_flag stays stored."""
    with tempfile.TemporaryDirectory() as root, MessageStore(root, **CFG) as store:
        for bits, stored in bodies:
            store.put_message(Message("Tb", stored, queue_id=1, sys_flag=bits | other_bits)).check()
        store.wait_dispatched()
        got = store.read_messages("Tb", 1, 0, 100)
        assert got.status is GetMessageStatus.FOUND and len(got) == len(bodies)  # CRCs are over stored bytes
        expected = []
        for view in got:
            rec = decode_record(bytes(view.buffer), 0)
            want = _outcome(lambda: body_as_sent(rec, view.physical_offset))
            expected.append(want)
            assert _outcome(view.body_bytes) == want
            assert _outcome(lambda: bytes(view.body)) == want
            assert view.body_bytes(decompress=False) == bytes(view.raw_body) == rec.body
            assert view.sys_flag == rec.sys_flag
        assert [b for _, b in bodies] == got.bodies(decompress=False)
        first_bad = next((e for e in expected if isinstance(e, tuple)), None)
        assert _outcome(got.bodies) == (first_bad or expected)


def _store_with_every_kind(root: str) -> tuple[MessageStore, list[str]]:
    store = MessageStore(root, **CFG)
    kinds = ["none", "zlib", "zlib-typed", "lz4", "zstd", "zstd-sized"]
    for kind in kinds:
        store.put_message(Message("Tk", compress(TEXT, kind), queue_id=0, sys_flag=FLAGS[kind], keys=kind)).check()
    store.wait_dispatched()
    return store, kinds


def test_every_kind_reads_back_as_sent_and_raw_as_stored(tmp_path):
    store, kinds = _store_with_every_kind(str(tmp_path / "s"))
    with store:
        for result in (store.read_messages("Tk", 0, 0), store.get_message("g", "Tk", 0, 0, 32)):
            assert result.bodies() == [TEXT] * len(kinds)
            assert result.bodies(decompress=False) == [compress(TEXT, k) for k in kinds]
            assert [bytes(m.body) for m in result] == [m.body_bytes() for m in result] == [TEXT] * len(kinds)
            assert [m.sys_flag & 0x701 for m in result] == [FLAGS[k] for k in kinds]
        view = store.look_message_by_queue_offset("Tk", 0, 1)
        assert bytes(view.body) == TEXT and zlib.decompress(bytes(view.raw_body)) == TEXT
        assert view.decode().body == compress(TEXT, "zlib")  # the record as stored
        assert store.query_message("Tk", "lz4").messages[0].body_bytes() == TEXT
    assert check_store(store.root).ok


def test_type_bits_without_the_compressed_flag_mean_nothing(tmp_path):
    """MessageDecoder inflates only with COMPRESSED_FLAG; an empty body is never inflated."""
    with MessageStore(str(tmp_path / "s"), **CFG) as store:
        store.put_message(Message("T", b"plain", sys_flag=0x300)).check()
        store.put_message(Message("T", b"", sys_flag=0x101)).check()
        store.wait_dispatched()
        assert store.read_messages("T", 0, 0).bodies() == [b"plain", b""]


def test_a_body_that_does_not_inflate_names_the_message_and_stays_stored(tmp_path):
    bad = zlib.compress(TEXT)[:-20]
    with MessageStore(str(tmp_path / "s"), **CFG) as store:
        store.put_message(Message("Tc", b"fine", queue_id=2)).check()
        r = store.put_message(Message("Tc", bad, queue_id=2, sys_flag=1)).check()
        store.wait_dispatched()
        got = store.get_message("g", "Tc", 2, 0, 32)
        assert got.status is GetMessageStatus.FOUND and len(got) == 2  # the record itself is sound
        where = f"the message at queue offset 1 of Tc/2 (physical offset {r.wrote_offset})"
        for read in (got.bodies, got[1].body_bytes, lambda: got[1].body):
            with pytest.raises(BodyDecompressError) as exc:
                read()
            assert str(exc.value).startswith(f"the body of {where} is flagged compressed but does not inflate "
                                             "(zlib): the stream is cut short (hint: ")
            assert isinstance(exc.value, CorruptRecordError)
        assert got[0].body_bytes() == b"fine"
        assert got.bodies(decompress=False) == [b"fine", bad] and bytes(got[1].raw_body) == bad
        unknown = store.put_message(Message("Tc", zlib.compress(TEXT), queue_id=3, sys_flag=0x501)).check()
        store.wait_dispatched()
        with pytest.raises(BodyDecompressError, match=r"names compression type 5, which RocketMQ does not define"):
            store.read_messages("Tc", 3, 0).bodies()
        assert unknown.wrote_offset > r.wrote_offset


def test_an_inflated_body_is_bounded(tmp_path, monkeypatch):
    with MessageStore(str(tmp_path / "s"), **CFG) as store:
        for kind in ("zlib", "lz4", "zstd"):
            store.put_message(Message("Tz", compress(TEXT, kind), sys_flag=FLAGS[kind])).check()
        store.wait_dispatched()
        result = store.read_messages("Tz", 0, 0)
        monkeypatch.setattr(compression, "MAX_INFLATED_BYTES", len(TEXT))
        assert result.bodies() == [TEXT] * 3
        monkeypatch.setattr(compression, "MAX_INFLATED_BYTES", len(TEXT) - 1)
        for view, kind in zip(result, ("zlib", "lz4", "zstd")):
            with pytest.raises(BodyDecompressError, match=rf"\({kind}\): it inflates past {len(TEXT) - 1} bytes"):
                view.body_bytes()


@pytest.mark.parametrize("kind,package", [("lz4", "lz4"), ("zstd", "zstandard")])
def test_a_missing_package_is_named(tmp_path, monkeypatch, kind, package):
    """Without lz4 / zstandard (an import that fails: sys.modules holds None for it) the read says
    which package to install; zlib bodies and the raw bytes still read."""
    with MessageStore(str(tmp_path / "s"), **CFG) as store:
        store.put_message(Message("Tm", compress(TEXT, kind), sys_flag=FLAGS[kind])).check()
        store.put_message(Message("Tm", compress(TEXT, "zlib"), sys_flag=1)).check()
        store.wait_dispatched()
        result = store.read_messages("Tm", 0, 0)
        monkeypatch.setitem(sys.modules, package, None)
        monkeypatch.setitem(sys.modules, "lz4.frame", None)
        with pytest.raises(CompressionLibraryMissingError) as exc:
            result.bodies()
        assert f"needs the PyPI package {package}, which is not installed: pip install {package}" in str(exc.value)
        assert "mqstore[compression]" in str(exc.value) and isinstance(exc.value, ImportError)
        assert result[1].body_bytes() == TEXT
        assert result.bodies(decompress=False)[0] == compress(TEXT, kind)


def test_the_arrow_kernel_reads_a_store_as_sent_or_as_stored(tmp_path):
    store, kinds = _store_with_every_kind(str(tmp_path / "s"))
    store.shutdown()
    with StoreSnapshot(store.root) as snap:
        for decompress, want in ((True, [TEXT] * len(kinds)), (False, [compress(TEXT, k) for k in kinds])):
            cols = BatchColumns(["body", "sys_flag"], decompress=decompress)
            cols.add_units(snap.record_source(), snap.units("Tk", 0, 0, len(kinds)), snap.min_phy)
            rows = twin_arrow.buffers_to_rows(cols.buffers(), cols.rows)
            assert [r["body"] for r in rows] == want
            assert [r["sys_flag"] & 0x701 for r in rows] == [FLAGS[k] for k in kinds]


def _dump(capsys, *argv: str) -> tuple[int, str]:
    code = main(["dump", *argv])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def test_dump_shows_bodies_as_sent_or_as_stored(tmp_path, capsys):
    store, kinds = _store_with_every_kind(str(tmp_path / "s"))
    with store:
        bad = store.put_message(Message("Tk", b"\x78\x9cnot really", sys_flag=1)).check()
    code, out = _dump(capsys, store.root, "--topic", "Tk", "--queue", "0", "--count", "7", "--json", "--body", "hex")
    assert code == EXIT_OK
    recs = [r["record"] for r in json.loads(out)["records"]]
    assert [bytes.fromhex(r["body"]) for r in recs[:6]] == [TEXT] * 6
    assert [r["compression"] for r in recs] == [None, "zlib", "zlib", "lz4", "zstd", "zstd", "zlib"]
    assert [r["body_inflated"] for r in recs] == [False] + [True] * 5 + [False]
    assert [r["stored_body_length"] for r in recs[:6]] == [len(compress(TEXT, k)) for k in kinds]
    assert all(r["body_crc_ok"] for r in recs)  # the CRC is over the stored bytes
    assert bytes.fromhex(recs[6]["body"]) == b"\x78\x9cnot really"
    assert recs[6]["body_problem"].startswith(f"the body of the message at queue offset 6 of Tk/0 (physical offset "
                                              f"{bad.wrote_offset}) is flagged compressed but does not inflate (zlib)")

    code, out = _dump(capsys, store.root, "--topic", "Tk", "--queue", "0", "--count", "7", "--json", "--body", "hex",
                      "--raw-body")
    recs = [r["record"] for r in json.loads(out)["records"]]
    assert [bytes.fromhex(r["body"]) for r in recs[:6]] == [compress(TEXT, k) for k in kinds]
    assert not any(r["body_inflated"] for r in recs)

    code, out = _dump(capsys, store.root, "--topic", "Tk", "--queue", "0", "--from", "1", "--count", "1",
                      "--body", "text")
    assert code == EXIT_OK
    assert f"  body                {len(TEXT):,} bytes (stored {len(compress(TEXT, 'zlib')):,} bytes, " \
           "zlib-compressed)" in out
    assert "line 149 of a body the producer sent compressed" in out
    code, out = _dump(capsys, store.root, "--phy", str(bad.wrote_offset))
    assert "  body                12 bytes as stored (zlib-compressed)" in out
    assert "  NOTE the body of the message at queue offset 6 of Tk/0" in out and out.rstrip().endswith(
        "shown as stored")
