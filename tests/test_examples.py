"""The README's demo runs end to end and reports what it did (put, consume, look-ups, verify)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
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
    assert "recovery after clean shutdown: valid end from the clean-close record (no scan)" in out
    assert re.search(r"get_message :\s+4,000 messages", out)
    assert out.count("query_message('order-3000')") == 2
    assert "verified: 16,000 records" in out


def _run_example(name: str, *args: str) -> str:
    path = DEMO.parent / name
    env = {**os.environ, "PYTHONPATH": str(DEMO.parent.parent)}
    done = subprocess.run([sys.executable, str(path), "--master", "local[1]", *args], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.spark
def test_the_spark_read_example_reports_what_it_read(tmp_path):
    out = _run_example("spark_read.py", "--store", str(tmp_path / "r"), "--messages", "2000")
    assert "batch read, per topic:" in out and "'Orders': 2000" in out and "'Payments': 2000" in out
    assert "Orders/1 offsets [10, 15): [(10, " in out
    assert "whole-log scan: 4,000 records" in out
    assert "stream (availableNow, 50,000 per micro-batch): 4,000 rows" in out


@pytest.mark.spark
def test_the_spark_write_example_reports_what_it_wrote(tmp_path):
    out = _run_example("spark_write.py", "--store", str(tmp_path / "w"), "--rows", "2000")
    assert "batch write: 2,000 Clicks messages" in out
    assert "stream run 1: read 2,000 new Clicks messages; ClicksUpper now holds 2,000 messages (2,000 distinct" in out
    assert "stream run 2: read 0 new Clicks messages; ClicksUpper now holds 2,000 messages" in out


@pytest.mark.spark
def test_the_spark_jobs_example_exports_and_rebuilds(tmp_path):
    out = _run_example("spark_jobs.py", "--store", str(tmp_path / "j"), "--messages", "2000")
    assert "export: 2,000 messages" in out
    assert re.search(r"rebuild: 2,000 ConsumeQueue units in 4 queue\(s\) .* byte-identical to the store's: True", out)
