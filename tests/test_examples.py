"""The README's demo runs end to end and reports what it did (put, consume, look-ups, verify)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def run_demo(store: str, messages: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(DEMO.parent.parent)}
    done = subprocess.run([sys.executable, str(DEMO), "--store", store, "--messages", str(messages), "--queues", "2",
                           "--file-size", str(1 << 20)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_puts_consumes_and_looks_up(tmp_path):
    store = str(tmp_path / "demo")
    out = run_demo(store, 4000)
    assert re.search(r"get_message :\s+4,000 messages \(400,000 body bytes\) with tags '\*'", out)
    assert re.search(r"get_message :\s+1,000 messages .* with tags 'TagB'", out)  # every 4th message is TagB
    assert "query_message('order-3000'): queue 0 offset 1500" in out
    assert re.search(r"time lookup : store time \d+ -> DemoTopic/0 offset \d+", out)
    assert re.search(r"node: owner pid \d+, allocator pid \d+, flusher pid \d+, dispatcher pid \d+, cleaner pid \d+",
                     out)
    assert "another process (AttachedStore) read 4,000 DemoTopic messages" in out
    assert "verified: 8,000 records" in out
    # a second run reopens the store, consumes only what it put, and finds the key twice
    out = run_demo(store, 4000)
    assert "recovery after clean shutdown: 8000 records" in out
    assert re.search(r"get_message :\s+4,000 messages", out)
    assert out.count("query_message('order-3000')") == 2
    assert "verified: 16,000 records" in out
