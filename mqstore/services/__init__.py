"""Store services: each a run loop over the control block (wait with timeout, wake-up, stop).

They run as threads of the store's owner, or one kind per process in a node; which loops run
over which parts is decided in one place, ``mqstore.services.registry``."""

#: the kinds of services, in start order (shutdown goes in reverse); a node runs one process each
SERVICE_KINDS = ("allocator", "flusher", "dispatcher", "cleaner")


def service_kinds(config: object) -> tuple[str, ...]:
    """The kinds a store with this config runs: SERVICE_KINDS, and "ha" when it replicates
    (mqstore.ha.ha_role: a master serving slaves, or a slave with a master to follow)."""
    from mqstore.ha import ha_role

    return SERVICE_KINDS + ("ha",) if ha_role(config) is not None else SERVICE_KINDS  # type: ignore[arg-type]
