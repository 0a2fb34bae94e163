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
import weakref


class StopFlag:
    """Set once, never cleared; :meth:`set` is safe from a signal handler and from any thread."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._set = False
        weakref.finalize(self, _close, self._read, self._write)

    def set(self) -> None:
        if self._set:
            return
        # The flag before the byte: a waiter that found the flag unset is then woken by the byte.
        self._set = True
        with contextlib.suppress(BlockingIOError):  # a full pipe is already readable
            os.write(self._write, b"!")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`set`; whether it was set."""
        if not self._set and timeout > 0:
            # A poll object per call: one shared between threads would refuse concurrent polls, and select()
            # cannot take descriptors above 1023.
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            poller.poll(timeout * 1000)
        return self._set


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
