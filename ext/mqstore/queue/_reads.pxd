# The C seam of mqstore.queue._reads: LogMap, the CommitLog's mappings by file index, which every C
# reader (getMessage, the time search and the CRC check of mqstore.queue._search) reads through.
from libc.stdint cimport int64_t


cdef class LogMap:
    cdef readonly int64_t file_size
    cdef readonly int64_t first_from
    cdef readonly list files
    cdef list views      # one memoryview per mapped file: keeps the mapping alive
    cdef int64_t n
    cdef char **bases    # bases[k]: the mapping of file k, NULL when not mapped

    cdef inline const char *at(self, int64_t phy, int64_t size) noexcept nogil:
        """Address of [phy, phy + size) if it lies inside one mapped file, else NULL."""
        if phy < self.first_from:
            return NULL
        cdef int64_t k = (phy - self.first_from) // self.file_size
        cdef int64_t pos = (phy - self.first_from) % self.file_size
        if k >= self.n or self.bases[k] == NULL or pos + size > self.file_size:
            return NULL
        return self.bases[k] + pos

    cdef inline const char *rest_at(self, int64_t phy, int64_t *avail) noexcept nogil:
        """Address of phy and, in avail, the bytes from it to its file's end; NULL when phy is
        not in a mapped file."""
        if phy < self.first_from:
            return NULL
        cdef int64_t k = (phy - self.first_from) // self.file_size
        cdef int64_t pos = (phy - self.first_from) % self.file_size
        if k >= self.n or self.bases[k] == NULL:
            return NULL
        avail[0] = self.file_size - pos
        return self.bases[k] + pos

    cdef object slice_of(self, int64_t phy, int64_t size)
