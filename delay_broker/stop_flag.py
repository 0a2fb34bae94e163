"""A stop request that a signal handler may make.

``threading.Event`` will not do: its ``set()`` takes the lock that its ``wait()`` holds for a few bytecodes,
and Python runs a signal handler in the main thread between bytecodes. A SIGTERM that lands while the main
thread is inside ``wait()`` (a promoter backing off, or sleeping until a message is due) therefore deadlocks
the process in its own handler, and only SIGKILL ends it. Here ``set()`` takes no lock: it writes one byte to
a pipe, which every waiter polls.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import weakref

_LONGEST_POLL_MS = 2**31 - 1  # poll() takes a C int of milliseconds: about 24.8 days


class StopFlag:
    """Set once, never cleared; :meth:`set` is safe from a signal handler and from any thread."""

    def __init__(self) -> None:
        self._set = False
        self._pipe: list[int] = []
        self._open_pipe()
        # Closed when the flag goes, not at exit: an atexit handler registered earlier (one that stops a
        # promoter) runs after the finalizers registered later, and must still find the pipe open.
        weakref.finalize(self, _close, self._pipe).atexit = False
        _live.add(self)

    def _open_pipe(self) -> None:
        read, write = os.pipe()
        os.set_blocking(write, False)
        if self._set:
            os.write(write, b"!")
        self._pipe[:] = [read, write]

    def _after_fork(self) -> None:
        # The parent's pipe, shared: a byte the child wrote would wake the parent's waiters for good, with
        # its flag still unset (they would spin), and the parent's byte would wake the child's. The new pipe
        # goes in before the old one is closed, so that the flag always has one.
        inherited = list(self._pipe)
        self._open_pipe()
        _close(inherited)

    def set(self) -> None:
        if self._set:
            return
        # The flag before the byte: a waiter that found the flag unset is then woken by the byte.
        self._set = True
        with contextlib.suppress(OSError):  # a full pipe is readable already
            os.write(self._pipe[1], b"!")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`set`; whether it was set."""
        if not self._set and timeout > 0:
            # A poll object per call: one shared between threads would refuse concurrent polls, and select()
            # cannot take descriptors above 1023.
            poller = select.poll()
            poller.register(self._pipe[0], select.POLLIN)
            poller.poll(min(timeout * 1000, _LONGEST_POLL_MS))
        return self._set


_live: weakref.WeakSet[StopFlag] = weakref.WeakSet()


def _renew_after_fork() -> None:
    # No handler may set a flag half-way (it would write to the parent's pipe): signals wait until all are done.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        for flag in list(_live):
            with contextlib.suppress(OSError):
                flag._after_fork()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _close(pipe: list[int]) -> None:
    for fd in pipe:
        with contextlib.suppress(OSError):
            os.close(fd)
    pipe.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_after_fork)
