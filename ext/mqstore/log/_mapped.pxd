# The C seam of mqstore.log._mapped: other kernels cimport MappedFile and read its mapping through
# _b() / _w() (typed, checked: an unmapped or read-only file raises) instead of an address int.
from libc.stdint cimport int64_t


cdef class MappedFile:
    cdef char *base
    cdef int fd
    cdef readonly str path
    cdef readonly int64_t file_from
    cdef readonly int64_t file_size
    cdef public int64_t wrote_position
    cdef public int64_t committed_position
    cdef public int64_t flushed_position
    cdef public int64_t store_timestamp
    cdef int exports
    cdef int ref_count
    cdef bint available
    cdef bint cleanup_over
    cdef int64_t first_shutdown_ms
    cdef readonly bint locked_in_memory
    cdef readonly bint readonly
    cdef public int64_t allocated

    # the base of the mapping; ValueError when the file is unmapped
    cdef char *_b(self) except NULL
    # the same for a caller that writes; PermissionError when the file is mapped read-only
    cdef char *_w(self) except NULL
    cdef _check_range(self, int64_t pos, int64_t size)
    cdef _cleanup(self)
