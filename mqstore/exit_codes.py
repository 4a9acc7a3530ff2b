"""Exit statuses of the mqstore commands (docs/cli.md "Exit codes"), defined once: the entry
point (mqstore.launch) needs them before it loads any command."""

from __future__ import annotations

__all__ = ["EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_PROBLEMS = 1  # the command ran and found problems (verify), or a node did not stop cleanly
EXIT_USAGE = 2  # bad arguments, or a directory that is not a store
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
