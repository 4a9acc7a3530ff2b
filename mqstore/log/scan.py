"""Byte scans shared by loading, recovery, the checker and the read-only tools.

A leaf module (it imports only the compiled kernels and the standard library), so that every
layer can use it:

- ``is_zero(src, start, end)``: whether [start, end) holds only zeros;
- ``nonzero_extent(src, start, end, clean_pages)``: how far non-zero bytes reach after start,
  to the end or, like ``MappedFile.zero_dirty_tail``, up to a run of all-zero pages;
- ``why_invalid(mf, pos, check_crc)``: why the bytes where a CommitLog scan stopped are not a
  record.

``src`` is a path (read with pread, never mapped: a file another process shortens gives a
short read, not a SIGBUS) or anything with the buffer protocol: a ``MappedFile``, an mmap,
bytes. Bytes past the end of the file or buffer count as zeros.

The holes of a sparse file (a path, or a ``MappedFile``'s file; lseek SEEK_DATA / SEEK_HOLE)
are zeros that are not read: a ConsumeQueue file is 5.86 MB long and a page or so of data, and a
dispatcher taking over thousands of queues scans each one's tail (tmpfs also gives a page to a
hole read through a shared mapping, and a SIGBUS when it is full).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Generator
from contextlib import closing
from typing import TYPE_CHECKING, Union

from mqstore.log._codec import decode_record
from mqstore.log._mapped import OS_PAGE_SIZE, MappedFile

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    Source = Union[str, "os.PathLike[str]", ReadableBuffer]

__all__ = ["CLEAN_PAGES", "is_zero", "nonzero_extent", "why_invalid"]

#: the all-zero pages after which ``MappedFile.zero_dirty_tail`` stops (its default)
CLEAN_PAGES = 16
_BLOCK = 1 << 20  # bytes read at once where page boundaries do not matter


def _data_regions(fd: int | None, start: int, stop: int) -> Generator[tuple[int, int], None, None]:
    """[lo, hi) ranges of [start, stop) that may hold data: all of it without a descriptor or
    where the file system tells nothing; the holes between them read as zeros."""
    at = start
    while at < stop:
        if fd is None:
            yield at, stop
            return
        try:
            lo = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # a hole to the end of the file
            yield at, stop
            return
        if lo >= stop:
            return
        try:
            hi = min(stop, max(os.lseek(fd, lo, os.SEEK_HOLE), lo + 1))
        except OSError:
            hi = stop
        yield lo, hi
        at = hi


def _blocks(src: Source, start: int, end: int | None, step: int) -> Generator[tuple[int, bytes | int], None, None]:
    """(offset, bytes) of [start, end) of src (None: to its end), in blocks that end at
    multiples of step (the first one may be shorter); stops early at a short read. A hole of
    the file (see the module's docstring) comes as (offset, its length) instead, unread."""
    at = max(0, start)
    if isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as fh:
            fd = fh.fileno()
            size = os.fstat(fd).st_size
            stop = size if end is None else min(end, size)
            for lo, hi in _data_regions(fd, at, stop):
                if lo > at:
                    yield at, lo - at
                at = lo
                while at < hi:
                    data = os.pread(fd, min((at // step + 1) * step, hi) - at, at)
                    if not data:
                        return
                    yield at, data
                    at += len(data)
            if at < stop:
                yield at, stop - at
        return
    holes: int | None = None
    if isinstance(src, MappedFile):
        try:
            holes = os.open(src.path, os.O_RDONLY)
        except OSError:
            pass  # gone or unreadable: every byte is read from the mapping
    try:
        with memoryview(src) as whole:
            view = whole.cast("B") if whole.format != "B" or whole.ndim != 1 else whole
            try:
                stop = len(view) if end is None else min(end, len(view))
                for lo, hi in _data_regions(holes, at, stop):
                    if lo > at:
                        yield at, lo - at
                    at = lo
                    while at < hi:
                        nxt = min((at // step + 1) * step, hi)
                        yield at, bytes(view[at:nxt])
                        at = nxt
                if at < stop:
                    yield at, stop - at
            finally:
                if view is not whole:
                    view.release()
    finally:
        if holes is not None:
            os.close(holes)


def is_zero(src: Source, start: int = 0, end: int | None = None) -> bool:
    """True if no byte of [start, end) of src (None: to its end) is non-zero."""
    with closing(_blocks(src, start, end, _BLOCK)) as blocks:
        return all(isinstance(data, int) or data.count(0) == len(data) for _, data in blocks)


def nonzero_extent(src: Source, start: int = 0, end: int | None = None, clean_pages: int | None = None) -> int:
    """Bytes from start to the last non-zero byte of [start, end) of src (None: to its end);
    0 if there is none. With clean_pages the scan goes page by page (OS pages, the first from
    start to the next page boundary) and stops after that many all-zero pages in a row: what
    ``MappedFile.zero_dirty_tail(start, clean_pages)`` zeroes (its return minus start)."""
    last, run = start, 0
    with closing(_blocks(src, start, end, _BLOCK if clean_pages is None else OS_PAGE_SIZE)) as blocks:
        for at, data in blocks:
            if isinstance(data, int):  # a hole: its pages are zero pages
                if clean_pages is not None:
                    run += -(-(at + data) // OS_PAGE_SIZE) - at // OS_PAGE_SIZE
                    if run >= clean_pages:
                        break
                continue
            kept = len(data.rstrip(b"\x00"))
            if kept:
                last, run = at + kept, 0
            elif clean_pages is not None:
                run += 1
                if run >= clean_pages:
                    break
    return last - start


def why_invalid(mf: MappedFile, pos: int, check_crc: bool, here: str = "this offset") -> str:
    """Why the bytes at pos of mf (where a CommitLog scan stopped, not zeros) are not a record:
    the decoder's own words, its "offset 0" named ``here``."""
    view = mf.view(pos, mf.file_size - pos)
    try:
        decode_record(view, 0, check_crc=check_crc)
    except (ValueError, IndexError) as exc:  # CorruptRecordError is a ValueError
        return (str(exc.args[0]) if exc.args else type(exc).__name__).replace("offset 0", here)
    finally:
        view.release()
    return "the record runs past the end of the file or is malformed"
