"""mqstore.signals.StopRequest: what the node, its service processes and the broker command wait
on until a stop signal. Set from signal handlers at any moment of a wait, it never hangs the
process (threading.Event did: a handler that runs while the main thread holds the Event's lock
inside wait() blocks on that lock for good; a service process was killed after 30 s for it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from mqstore.signals import StopRequest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

# a timer signal every 500 µs sets the request a short wait loop waits on, 3,000 times over
SIGNALLED_WAITS = textwrap.dedent("""
    import signal
    from mqstore.signals import StopRequest
    current = [StopRequest()]
    signal.signal(signal.SIGALRM, lambda *_: current[0].set())
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    done = 0
    for _ in range(3000):
        stop = StopRequest()
        current[0] = stop
        while not stop.wait(0.0001):
            pass
        stop.close()
        done += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    print("done", done)
""")


def test_requests_set_by_a_signal_at_every_moment_of_a_wait_loop_never_hang_it():
    proc = subprocess.run([sys.executable, "-c", SIGNALLED_WAITS], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["done", "3000"], proc.stderr[-2000:]


def test_a_signal_ends_a_long_wait_and_says_so():
    stop = StopRequest()
    seen = []
    old = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        stop.on_signals([signal.SIGALRM], seen.append)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        assert stop.wait(600) is True  # False only after 10 minutes
        assert stop.is_set() and seen == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        stop.close()


def test_a_request_not_set_waits_out_its_timeout_and_a_closed_one_still_answers():
    stop = StopRequest()
    assert stop.wait(0.01) is False and not stop.is_set()
    stop.set()
    stop.set()  # twice: one pending wake-up is enough
    assert stop.wait(0) is True
    stop.close()
    assert stop.wait(0.01) is True
    fresh = StopRequest()
    fresh.close()
    fresh.set()  # after close: no error, the flag still counts
    assert fresh.wait(0.01) is True
