"""The multi-process node (design.md "Processes and shared memory"): the owner of a store
directory runs the allocate, flush and dispatch services as supervised OS processes.

The owner (a ``MessageStore`` opened with ``service_mode="processes"``, which is what
``mqstore node`` runs) takes the ``lock`` file, recovers, rebuilds the control block, writes
its configuration next to it (``mqstore.config.json``) and starts one process per service::

    python -c "...mqstore.node.service.main..." --service allocator|flusher|dispatcher|cleaner STORE_DIR

(with several CommitLogs and dispatch_logs_in_parallel a dispatcher per log: ``dispatcher`` for
log 0, ``dispatcher-k`` for log k; mqstore.services.service_processes names them)

Each service process attaches to the control block, maps the files it needs, runs the same
service loops the threaded mode runs (``mqstore.services``), prints ``READY`` once it is
serving, and stops on SIGTERM; it exits at once when its parent dies (the parent pid is
checked every 0.2 s). The supervisor (a thread of the owner) restarts a service process that died;
shutdown stops them in order (dispatch catches up, then the CommitLog is flushed, then the
allocator goes), after which the owner writes the checkpoint and removes ``abort``.

The package: ``settings`` (the owner's configuration file, read by every process of the node),
``supervisor`` (the owner's side: start, restart and stop the service processes) and ``service``
(a service process: attach, build its services through mqstore.services.registry, run them).
"""

from mqstore.node.service import main, service_main
from mqstore.node.settings import read_config, write_config
from mqstore.node.supervisor import (BACKGROUND_KINDS, BACKGROUND_NICE, READY_TIMEOUT_S, RESTART_BACKOFF_S, STOP_TIMEOUT_S,
                                     ServiceProcess, ServiceStartError, Supervisor)

__all__ = ["BACKGROUND_KINDS", "BACKGROUND_NICE", "READY_TIMEOUT_S", "RESTART_BACKOFF_S", "STOP_TIMEOUT_S",
           "ServiceProcess", "ServiceStartError", "Supervisor", "main", "read_config", "service_main", "write_config"]
