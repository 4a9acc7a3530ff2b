"""Store services: each a run loop over the control block (wait with timeout, wake-up, stop).

They run as threads of the store's owner, or one kind per process in a node; which loops run
over which parts is decided in one place, ``mqstore.services.registry``."""

#: the kinds of services, in start order (shutdown goes in reverse); a node runs one process each
SERVICE_KINDS = ("allocator", "flusher", "dispatcher", "cleaner")
