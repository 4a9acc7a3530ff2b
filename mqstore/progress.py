"""Progress of long work (recovery on open, the start-up dispatch, verify, inspect, recover).

Long operations take a ``progress(what, done, total)`` callback and call it as they go, every
few thousand records or once per file: the cost on the hot path is a counter. Two consumers:

* ``LogProgress``: log lines for work inside the library (a store opening): nothing when the
  step ends within ``threshold_s``, then a line about every ``interval_s`` with the amount
  done, a percentage and an ETA, and a closing line with the total time. A program sees them
  if it configures logging; ``mqstore node`` logs to stderr.
* the command line's progress bar (``mqstore.tools.cli.ProgressBar``), redrawn in place on a
  terminal, which formats with ``describe``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: a step that ends sooner logs nothing; then a line about every DEFAULT_INTERVAL_S
DEFAULT_THRESHOLD_S = 1.0
DEFAULT_INTERVAL_S = 1.0
#: steps whose amounts are bytes (the others count files, queues or records)
BYTE_STEPS = frozenset({"CommitLog", "recovery scan", "dispatch"})


def amount(what: str, value: float) -> str:
    """value in the unit of step what: MiB for byte steps, a plain count otherwise."""
    return f"{value / (1 << 20):,.1f} MiB" if what in BYTE_STEPS else f"{value:,.0f}"


def describe(what: str, done: int, total: int, elapsed_s: float) -> str:
    """'CommitLog 12.0 of 48.0 MiB (25 %), ETA 9 s' for a step that has run elapsed_s."""
    if total <= 0:
        return f"{what} {amount(what, done)}"
    pct = min(100.0, 100.0 * done / total)
    text = f"{what} {amount(what, done)} of {amount(what, total)} ({pct:.0f} %)"
    if 0 < done < total and elapsed_s > 0.2:
        text += f", ETA {elapsed_s * (total - done) / done:.0f} s"
    return text


class LogProgress:
    """A progress(what, done, total) callback that logs to logger (see the module docstring).

    One instance follows one operation (several steps, each named by ``what``); ``finish()``
    ends it."""

    def __init__(self, logger: logging.Logger, operation: str, *, threshold_s: float | None = None,
                 interval_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.operation = operation
        self.threshold_s = DEFAULT_THRESHOLD_S if threshold_s is None else threshold_s
        self.interval_s = DEFAULT_INTERVAL_S if interval_s is None else interval_s
        self._clock = clock
        self.started = self._clock()
        self._step = ""
        self._step_started = self.started
        self._last_line = 0.0
        self.lines = 0

    def __call__(self, what: str, done: int, total: int) -> None:
        now = self._clock()
        if what != self._step:
            self._step, self._step_started = what, now
        if now - self.started < self.threshold_s:
            return
        if self.lines and now - self._last_line < self.interval_s and done < total:
            return
        self._last_line = now
        self.lines += 1
        self.logger.info("%s: %s", self.operation, describe(what, done, total, now - self._step_started))

    def finish(self, summary: str = "") -> None:
        """Close the operation: a line with the total time when it took longer than the threshold."""
        elapsed = self._clock() - self.started
        if elapsed >= self.threshold_s:
            self.logger.info("%s: done in %.1f s%s", self.operation, elapsed, f" ({summary})" if summary else "")
