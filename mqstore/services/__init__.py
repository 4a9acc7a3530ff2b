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


def parallel_dispatch(config: object) -> bool:
    """Whether each CommitLog has a dispatcher of its own (dispatch_logs_in_parallel with
    several CommitLogs; docs/parallel-commitlogs.md)."""
    return bool(getattr(config, "dispatch_logs_in_parallel")) and getattr(config, "commit_log_count") > 1


def service_processes(config: object) -> tuple[str, ...]:
    """The service processes a node with this config runs, in start order: service_kinds, the
    dispatcher as one process per CommitLog when parallel_dispatch (``dispatcher`` for log 0,
    ``dispatcher-k`` for log k, so a store with one log keeps its names)."""
    kinds = service_kinds(config)
    if not parallel_dispatch(config):
        return kinds
    count = getattr(config, "commit_log_count")
    out: list[str] = []
    for kind in kinds:
        out += [kind] if kind != "dispatcher" else ["dispatcher"] + [f"dispatcher-{k}" for k in range(1, count)]
    return tuple(out)


def process_kind(name: str, config: object) -> tuple[str, int | None]:
    """(kind, log) of a service process's name (service_processes): log is the CommitLog a
    dispatcher process of one log serves, None for a process that serves every log. ValueError
    for a name this config runs no process of."""
    names = service_processes(config)
    if name not in names + ("ha",):
        raise ValueError(f"unknown service {name!r}; one of {', '.join(names)}, ha")
    kind, _, log = name.partition("-")
    if kind == "dispatcher" and parallel_dispatch(config):
        return kind, int(log or 0)
    return kind, None
