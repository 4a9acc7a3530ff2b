"""The ACL in force, re-read when its file changes (RocketMQ's AclFileWatchService, which checks
the file's MD5 every 5 s; here the file's identity is checked at most every ``check_interval_s``
on use, so a process that checks requests needs no thread of its own).

    holder = AclHolder(config.acl_path(root))    # AclConfigError when the file is missing or wrong
    remark = check(holder.current(), code, ext_fields, body, remote_ip)

``current()`` stats the file when check_interval_s has passed since the last look; when its
modification time, size, inode or change time differ, the file is loaded again. A version that
does not load (a typo, a half-written file, a removed file) leaves the last good ACL in force and
is logged once, as an error naming the file and the problem; the next change is tried again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from mqstore.acl.plain import AclConfigError, PlainAcl, load_acl

__all__ = ["AclHolder", "admin_accounts", "broker_accounts"]

log = logging.getLogger("mqstore.acl")

Stamp = tuple[int, int, int, int, int] | None
#: stands for "no version failed" and "the version read is not known": equal to no stamp
_NONE: object = object()


def _stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev, st.st_ctime_ns)


class AclHolder:
    """The plain ACL of ``path``, loaded now (AclConfigError when it cannot be) and reloaded by
    ``current()`` when the file changed. ``reloads`` counts the versions loaded after the first;
    ``last_error`` is the latest version's problem (None once one loads)."""

    def __init__(self, path: str | os.PathLike[str], *, check_interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.fspath(path)
        self.check_interval_s = float(check_interval_s)
        self.reloads = 0
        self.last_error: str | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp: object = _stamp(self.path)
        self._acl = load_acl(self.path)
        self._failed: object = _NONE
        self._next_check = clock() + self.check_interval_s

    def current(self) -> PlainAcl:
        """The ACL in force (the file's latest version that loaded)."""
        if self._clock() < self._next_check:
            return self._acl
        return self._look()

    def reload(self) -> PlainAcl:
        """Look at the file now, whatever the interval."""
        return self._look(force=True)

    def _look(self, force: bool = False) -> PlainAcl:
        if not self._lock.acquire(blocking=force):
            return self._acl  # another thread is looking
        try:
            self._next_check = self._clock() + self.check_interval_s
            stamp = _stamp(self.path)
            if stamp == self._stamp or (stamp == self._failed and not force):
                return self._acl
            try:
                acl = load_acl(self.path)
            except AclConfigError as exc:
                if stamp != self._failed or force:
                    log.error("the ACL file changed and cannot be used; the last good version stays in force: %s",
                              exc)
                self._failed = stamp
                self.last_error = str(exc)
                return self._acl
            # a change while it was read is a new version: the next look reads it again
            self._stamp = stamp if _stamp(self.path) == stamp else _NONE
            self._acl = acl
            self._failed = _NONE
            self.last_error = None
            self.reloads += 1
            log.info("ACL reloaded from %s: %d account(s), %d global white address pattern(s)", self.path,
                     len(acl.accounts), len(acl.global_white))
            return acl
        finally:
            self._lock.release()


def admin_accounts(acl: PlainAcl) -> dict[str, str]:
    """The accounts with ``admin: true`` of an ACL: accessKey -> secretKey."""
    return {key: account.secret_key for key, account in acl.accounts.items() if account.admin}


def broker_accounts(holder: AclHolder) -> Callable[[], dict[str, str]]:
    """The accounts with ``admin: true`` of the ACL in force (accessKey -> secretKey), read again
    when the file changes: the brokers a NameServer trusts with registrations
    (docs/security.md). AclConfigError when there is no such account."""

    def current() -> dict[str, str]:
        return admin_accounts(holder.current())
    if not current():
        raise AclConfigError(holder.path, "no account with admin: true (the brokers' accounts a NameServer trusts)")
    return current
