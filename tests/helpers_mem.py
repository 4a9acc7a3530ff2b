"""What this process has of a file mapped in memory (/proc/self/smaps), and a ConsumeQueue kernel
over throwaway files."""

from __future__ import annotations


def mapping_kb(path: str) -> dict[str, int]:
    """Rss, Shared_Dirty and Private_Dirty in kB, summed over this process's mappings of path."""
    out = {"Rss": 0, "Shared_Dirty": 0, "Private_Dirty": 0}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
                inside = line.rstrip("\n").endswith(path)
            elif inside and head and head[0][:-1] in out:
                out[head[0][:-1]] += int(head[1])
    return out


def mem_queue_class(file_size: int) -> type:
    """A ConsumeQueueKernel over real MappedFiles of file_size bytes in a temporary directory
    (rolls to a new one when full), without the Python ConsumeQueue's recovery and flush."""
    import itertools
    import os
    import tempfile

    from mqstore.queue._consumequeue import ConsumeQueueKernel
    from mqstore.log._mapped import MappedFile

    root = tempfile.TemporaryDirectory(prefix="mqstore-memq-")
    numbers = itertools.count()

    class MemQueue(ConsumeQueueKernel):  # type: ignore[misc, valid-type]
        def __init__(self, topic: str, queue_id: int) -> None:
            super().__init__(topic, queue_id, file_size)
            self.files: list[MappedFile] = []
            self.dir = os.path.join(root.name, str(next(numbers)))
            os.mkdir(self.dir)

        def next_file(self, expect: int) -> MappedFile:
            if self.files and self.files[-1].wrote_position < file_size:
                return self.files[-1]
            start = self.files[-1].file_from + file_size if self.files else expect - expect % file_size
            self.files.append(MappedFile.create(os.path.join(self.dir, f"{start:020d}"), file_size))
            return self.files[-1]

        def contents(self) -> tuple[int, int, bytes]:
            """(max queue offset, max physical offset, the bytes of every unit written)."""
            self.sync_position()
            return self.max_offset_in_queue, self.max_physic_offset, b"".join(f.read(0, f.wrote_position)
                                                                              for f in self.files)

    MemQueue.root = root  # type: ignore[attr-defined]  # the directory lives as long as the class
    return MemQueue
