# The C seam of mqstore._codec: the record decoder and the properties parser, cimported by the
# kernels that hand records out (mqstore._reads' MessageView) instead of importing them lazily.
from libc.stdint cimport int64_t


# Properties string -> dict with RocketMQ's parsing rules (spec §1.4)
cpdef dict string_to_properties(str s)
# Offset message id: hex of store address + port + physical offset (spec §1.2)
cpdef str msg_id(store_host, int64_t physical_offset)
# decode_record's body: the DecodedRecord at offset, or CorruptRecordError naming what is wrong
cdef object decode_at(buf, Py_ssize_t offset, bint check_crc, bint read_body)
