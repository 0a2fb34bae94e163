"""The promoter's stop flag, set from a signal handler (a pure unit: no server)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

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
        while not flag.wait(0) and not flag.wait(0.0005):
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


def test_a_forked_child_has_a_flag_of_its_own():
    """A child's set() (a SIGTERM to a multiprocessing child that inherited the handler) must not wake the parent's
    waiters for good, its flag unset: they would spin."""
    flag, already = StopFlag(), StopFlag()
    already.set()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the check
        flag.set()
        os._exit(0 if flag.wait(0) and already.wait(10) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    started = time.monotonic()
    assert not flag.wait(0.05) and not flag.is_set()
    assert time.monotonic() - started >= 0.04, "the wait was woken by the child's byte"


def test_the_flag_works_in_an_atexit_handler_registered_before_it():
    """An application's exit hook that stops a promoter runs after the hooks registered later."""
    code = textwrap.dedent(
        """
        import atexit
        from delay_broker.stop_flag import StopFlag

        flags = []
        atexit.register(lambda: print("set and seen:", flags[0].set() or flags[0].wait(1)))
        flags.append(StopFlag())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == "set and seen: True"
