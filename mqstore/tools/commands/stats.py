"""``mqstore stats``: live figures of a store from its control block."""

from __future__ import annotations

import argparse

from mqstore.tools import stats
from mqstore.tools.commands.common import positive_int


# -- stats --------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", metavar="STORE_DIR", help="root directory of the store")
    p.add_argument("--interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                   help="seconds between samples: the rates are over this interval (default 1)")
    once = p.add_mutually_exclusive_group()
    once.add_argument("--once", action="store_true", help="print one sample (rates over --interval) and stop")
    once.add_argument("--count", type=positive_int, metavar="N", help="stop after N samples (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="print one JSON object per sample, one per line")


def run(args: argparse.Namespace) -> int:
    return stats.render(args.store_dir, once=args.once, interval=args.interval, json=args.json, count=args.count)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value
