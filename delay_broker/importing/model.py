"""What an import finds in a broker's queue, what it reports, and what a queue must offer to be imported from."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..envelope import Envelope

GONE = "gone from the broker"
"""Why a taken entry has no message any more (its queue was flushed meanwhile): nothing to park or give back."""
DUE_SOON = "due within the threshold"
TAKEN_MEANWHILE = "taken by a consumer meanwhile"
DANGLING = "no message for this id (the queue's hash lacks it)"


@dataclass(frozen=True)
class Found:
    """A delayed message read from a broker's queue, in the form it is parked in: its id, its due time (ms since
    the epoch) and its envelope (the message as it is to be delivered when due)."""

    id: str
    due_ms: int
    envelope: Envelope


@dataclass
class Item:
    """One entry of a broker's queue as an import read it.

    Parameters:
      handle: what the queue needs to move or acknowledge it (a Redis list entry, an AMQP delivery tag).
      found: the message, or why it stays where it is (``"not delayed"``, ``"unreadable: ..."`` ...).
    """

    handle: Any
    found: Found | str


class Source(Protocol):
    """A broker queue an import reads and moves delayed messages out of, each step safe to interrupt.

    ``scan`` reads the queue in batches without changing it. ``take`` takes the given items out of the consumers'
    reach (a Redis list's entries into a staging list, in one step; AMQP deliveries are held unacknowledged from the
    moment they are read) and returns those it took. Once they are parked, ``release`` removes them for good; an
    item the store refused is given back by ``give_back``. ``recover`` yields what an interrupted import had taken
    and not released; ``finish`` returns to the queue whatever was read and neither released nor given back.
    """

    name: str

    def recover(self) -> Iterator[list[Item]]: ...

    def scan(self) -> Iterator[list[Item]]: ...

    def take(self, items: list[Item]) -> list[Item]: ...

    def release(self, items: list[Item]) -> None: ...

    def give_back(self, items: list[Item]) -> None: ...

    def finish(self) -> None: ...

    def notes(self) -> list[str]:
        """What the report should say about the queue beyond its counts (messages held by consumers ...)."""
        ...


@dataclass
class QueueReport:
    """What an import did, or in a dry run would do, in one queue.

    ``moved``: parked by this run (a dry run: would be); ``already``: found parked already (by an interrupted run,
    or a worker that received it) and removed from the queue; ``recovered``: of those two, taken by an interrupted
    run; ``left``: stayed in the queue, by reason; ``refused``: the store refused them (id -> why): given back.
    """

    queue: str
    dry_run: bool
    examined: int = 0
    moved: int = 0
    already: int = 0
    recovered: int = 0
    left: Counter[str] = field(default_factory=Counter)
    refused: dict[str, str] = field(default_factory=dict)
    first_due_ms: int | None = None
    last_due_ms: int | None = None
    notes: list[str] = field(default_factory=list)

    def saw_due(self, due_ms: int) -> None:
        self.first_due_ms = due_ms if self.first_due_ms is None else min(self.first_due_ms, due_ms)
        self.last_due_ms = due_ms if self.last_due_ms is None else max(self.last_due_ms, due_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "dry_run": self.dry_run,
            "examined": self.examined,
            "moved": self.moved,
            "already_parked": self.already,
            "recovered": self.recovered,
            "left": dict(self.left),
            "refused": dict(self.refused),
            "first_due_ms": self.first_due_ms,
            "last_due_ms": self.last_due_ms,
            "notes": list(self.notes),
        }
