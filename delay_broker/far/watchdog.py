"""A deadline for PostgreSQL calls that libpq cannot give: a statement whose server stops answering waits for ever.

``connect_timeout`` bounds connecting only, and ``statement_timeout`` is enforced by the server, which may be the
one that hangs; TCP keepalives and ``tcp_user_timeout`` see a dead peer, not a live kernel in front of a stuck
server. A thread of its own shuts the socket of a connection whose call outlives its deadline: libpq then sees
the connection closed, the call fails (and the far tier reports ``FarTierUnavailable``) instead of hanging a
producer's ``send`` or a worker's retry. The server ends the session when it sees it gone, and with it any
transaction and advisory locks the call held.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class Watchdog:
    """Breaks the connection of a call guarded by :meth:`guard` once its time is up."""

    def __init__(self) -> None:
        self._reset()
        # A forked child (a Celery prefork worker) starts afresh: the parent's lock may be held at the fork, its
        # thread is not there, and the parent's deadlines name the parent's calls, not the child's.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._condition = threading.Condition()
        self._deadlines: dict[int, tuple[float, int]] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._waking_at = float("inf")  # when the watching thread wakes next, as it last decided

    @contextmanager
    def guard(self, socket_fd: int, seconds: float) -> Iterator[None]:
        """Within the block, the connection on ``socket_fd`` is broken once ``seconds`` have passed."""
        token = next(self._tokens)
        deadline = time.monotonic() + seconds
        try:
            with self._condition:
                self._deadlines[token] = (deadline, socket_fd)
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._watch, name="delay_broker far-tier watchdog", daemon=True
                    )
                    self._thread.start()
                if deadline < self._waking_at:  # only then: a wake-up per call would cost every park a thread switch
                    self._condition.notify()
            yield
        finally:
            # Before the caller may close the socket: a descriptor is only ever shut while its block is open.
            with self._condition:
                self._deadlines.pop(token, None)

    def forget(self, socket_fd: int) -> None:
        """Drop every deadline on ``socket_fd``, about to be closed: once closed, its number may be another's."""
        with self._condition:
            for token, (_, fd) in list(self._deadlines.items()):
                if fd == socket_fd:
                    self._deadlines.pop(token, None)

    def _watch(self) -> None:
        with self._condition:
            while True:
                now = time.monotonic()
                for token, (deadline, fd) in list(self._deadlines.items()):
                    if deadline <= now and self._deadlines.pop(token, None) is not None:
                        _shut(fd)
                self._waking_at = min((deadline for deadline, _ in self._deadlines.values()), default=float("inf"))
                self._condition.wait(None if self._waking_at == float("inf") else max(0.0, self._waking_at - now))


def _shut(fd: int) -> None:
    """Shut the socket on ``fd`` down both ways, through a duplicate: the owner's descriptor stays valid (it closes
    it), and its pending read returns at once."""
    try:
        copy = os.dup(fd)
    except OSError:
        return
    try:
        duplicate = socket.socket(fileno=copy)  # owns the copy from here
    except OSError:
        os.close(copy)
        return
    with suppress(OSError), duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()
"""The one watchdog of the process (a thread, started at the first guarded call)."""
