"""The promoter's stop flag, set from a signal handler (a pure unit: no server)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from delay_broker.stop_flag import StopFlag

# A timer signal lands at random points of a tight wait loop in the main thread, over and over. With a
# threading.Event in StopFlag's place the handler soon interrupts wait() while it holds the Event's lock, and the
# process hangs in its own handler for good.
SIGNALLED_WAITS = textwrap.dedent(
    """
    import signal
    from delay_broker.stop_flag import StopFlag

    for _ in range(2000):
        flag = StopFlag()
        signal.signal(signal.SIGALRM, lambda *_: flag.set())
        signal.setitimer(signal.ITIMER_REAL, 0.0003)
        while not flag.wait(0):
            pass
    print("stopped 2000 times")
    """
)


def test_a_signal_handler_sets_the_flag_while_the_main_thread_waits_on_it():
    done = subprocess.run([sys.executable, "-c", SIGNALLED_WAITS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped 2000 times"


def test_wait_times_out_unset_and_returns_at_once_once_set():
    flag = StopFlag()
    assert not flag.wait(0.01)
    assert not flag.is_set()
    flag.set()
    flag.set()  # a second request is harmless
    assert flag.is_set()
    assert flag.wait(3600)
