"""What this process has of a file mapped in memory, from /proc/self/smaps."""

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
