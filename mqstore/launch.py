"""The ``mqstore`` command's entry point (the console script and ``python -m mqstore``).

It loads the command inside a KeyboardInterrupt guard: Ctrl-C while Python loads mqstore, or in
a command that only reads, ends the command with exit status 130 and one line, not a traceback.
``mqstore node`` handles SIGINT and SIGTERM itself once it runs (it stops the store cleanly).
"""

from __future__ import annotations

import sys

from mqstore.exit_codes import EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """Run the mqstore command line; returns its exit status."""
    try:
        from mqstore.tools.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        print("mqstore: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
