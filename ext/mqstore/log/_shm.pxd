# The C seam of mqstore.log._shm: the put path, the dispatch and the read kernels cimport ControlBlock
# and TransientStorePool and reach their mappings through these checked methods, never through an
# address int.
from libc.stdint cimport int64_t


cdef class ControlBlock:
    cdef char *base
    cdef readonly Py_ssize_t size
    cdef readonly str path
    cdef readonly bint readonly
    cdef readonly bint reused
    cdef int fd

    cdef _map(self, Py_ssize_t size)
    # the base of the mapping; ValueError when the block is closed
    cdef char *_b(self) except NULL
    # the same for a caller that writes; ValueError on a read-only attach
    cdef char *_w(self) except NULL
    # the base of a log's cells (mq_log); ValueError for a log the store does not have
    cdef char *_lg(self, int log, bint write) except NULL
    cdef int64_t *_named(self, str name, int log, bint write) except NULL
    cdef char *_channel_base(self, str channel, int log, bint write) except NULL


cdef class TransientStorePool:
    cdef char *base
    cdef readonly int64_t size
    cdef readonly str path
    cdef int fd
    cdef readonly int64_t buffers
    cdef readonly int64_t file_size
    cdef readonly bint locked
    cdef readonly int lock_errno

    cdef _map(self, int64_t size)
    # the write buffer of the CommitLog file starting at file_from; ValueError when the pool is
    # closed or file_from is not a file start
    cdef char *_buffer(self, int64_t file_from) except NULL
