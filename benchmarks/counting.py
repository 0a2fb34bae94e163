"""What a process sends to Redis, counted in redis-py's connections: commands, round trips (socket writes) and
bytes.

``INFO commandstats`` counts every command a script runs under its own name as well as the EVALSHA around it, so
it cannot say how many commands clients sent; counting in the client can. :func:`install` wraps three methods of
redis-py's ``AbstractConnection`` for the whole process (every client: the app's, kombu's, the store's);
connections of :class:`UncountedConnection` (the benchmark's own measuring clients) are left out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.connection import AbstractConnection


@dataclass
class Counts:
    commands: int = 0
    round_trips: int = 0
    bytes_out: int = 0

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.commands - other.commands, self.round_trips - other.round_trips, self.bytes_out - other.bytes_out
        )

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.commands + other.commands, self.round_trips + other.round_trips, self.bytes_out + other.bytes_out
        )


class UncountedConnection(redis.Connection):
    """A connection :func:`install`'s counters skip: the benchmark's measuring clients."""

    bench_uncounted = True


def uncounted_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, connection_class=UncountedConnection)


_lock = threading.Lock()
_counts = Counts()
_originals: dict[str, Callable[..., Any]] = {}


def _counted(connection: Any) -> bool:
    return not getattr(connection, "bench_uncounted", False)


def _size(command: Any) -> int:
    if isinstance(command, bytes | str | memoryview):
        return len(command)
    return sum(len(item) for item in command)


def _send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
    if _counted(self):
        size = _size(command)
        with _lock:
            _counts.round_trips += 1
            _counts.bytes_out += size
    return _originals["send_packed_command"](self, command, check_health)


def _send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
    if _counted(self):
        with _lock:
            _counts.commands += 1
    return _originals["send_command"](self, *args, **kwargs)


def _pack_commands(self: Any, commands: Any) -> Any:
    commands = list(commands)
    if _counted(self):
        with _lock:
            _counts.commands += len(commands)
    return _originals["pack_commands"](self, commands)


def install() -> None:
    """Count from now on, in every redis-py connection of this process (idempotent)."""
    if _originals:
        return
    for name, wrapper in (
        ("send_packed_command", _send_packed_command),
        ("send_command", _send_command),
        ("pack_commands", _pack_commands),
    ):
        _originals[name] = getattr(AbstractConnection, name)
        setattr(AbstractConnection, name, wrapper)


def uninstall() -> None:
    for name, original in _originals.items():
        setattr(AbstractConnection, name, original)
    _originals.clear()


def counts() -> Counts:
    with _lock:
        return Counts(_counts.commands, _counts.round_trips, _counts.bytes_out)
