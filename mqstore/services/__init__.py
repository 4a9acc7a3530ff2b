"""Store services: each a run loop over the control block (wait with timeout, wake-up, stop).

They run as threads inside the store's process; the same loops are meant to run as separate
processes of a node (see design.md)."""
