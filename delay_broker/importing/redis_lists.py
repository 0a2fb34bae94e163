"""Importing from a broker queue kept in a Redis list (Dramatiq's RedisBroker, kombu's Redis transport).

The queue is read in windows from the end producers push to, so that consumers popping the other end never make
the import skip an entry (a push makes it read a few entries twice, which is harmless). Entries to be parked are
taken into a staging list of the import's own in one script (``take.lua``), each only if it is still in the queue,
so that no consumer can take it while it is parked; once parked they leave the staging list for good
(``release.lua``), and what the store refused goes back to the queue (``give_back.lua``). Every other entry is
never touched: the queue keeps its order. A run that was interrupted leaves entries in the staging list, which the
next run parks first (:meth:`RedisListSource.recover`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any, Literal

from .model import DANGLING, GONE, Found, Item

STAGING_PREFIX = "delay_broker:import:"
"""Staging lists are named after their queue's key: ``delay_broker:import:<queue key>``. The store's own keys
carry their namespace in braces (``delay_broker:{ns}:...``), so the two never meet."""

Classify = Callable[[bytes, "bytes | None"], "Found | str"]
"""Reads one queue entry (and the message it names, when the queue keeps messages in a hash): the message, or
why it stays in the queue."""

_SCRIPTS = {
    name: resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    for name in ("take", "release", "give_back")
}


class RedisListSource:
    """One Redis list of a broker (a :class:`~.model.Source`).

    Parameters:
      client: a redis-py client of the broker's Redis, returning bytes; keys are used as given (no prefixing).
      key: the queue list.
      name: the queue in reports.
      classify: reads an entry (see :data:`Classify`).
      producers_push: where producers add entries: ``"tail"`` (RPUSH, Dramatiq; consumers pop the head) or
        ``"head"`` (LPUSH, kombu; consumers pop the tail).
      payloads: the hash that holds each entry's message when the list holds ids (Dramatiq's ``<queue>.msgs``).
      batch: entries read, and moved, at once.
      notes: what to say about the queue beyond the counts (the adapter knows where else its messages wait).
    """

    def __init__(
        self,
        client: Any,
        key: str,
        name: str,
        classify: Classify,
        *,
        producers_push: Literal["head", "tail"],
        payloads: str | None = None,
        batch: int = 500,
        notes: Callable[[RedisListSource], list[str]] | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self.name = name
        self.classify = classify
        self.producers_push = producers_push
        self.payloads = payloads
        self.batch = batch
        self.staging = STAGING_PREFIX + key
        self._scripts = {name: client.register_script(source) for name, source in _SCRIPTS.items()}
        self._taken_from_window = 0
        self._notes = notes

    def recover(self) -> Iterator[list[Item]]:
        """What an interrupted import left in the staging list, a batch at a time (each batch leaves it, released
        or given back, before the next is read)."""
        seen: set[bytes] = set()
        while True:
            values = self.client.lrange(self.staging, 0, self.batch - 1)
            if not values or seen.issuperset(values):
                return
            seen.update(values)
            yield self._items(values, missing=GONE)

    def scan(self) -> Iterator[list[Item]]:
        offset = 0
        while True:
            if self.producers_push == "tail":
                values = self.client.lrange(self.key, -(offset + self.batch), -(offset + 1))
            else:
                values = self.client.lrange(self.key, offset, offset + self.batch - 1)
            if not values:
                return
            self._taken_from_window = 0
            yield self._items(values, missing=DANGLING)
            # What was taken left the window: the entries beyond it moved up by as many.
            offset += len(values) - self._taken_from_window
            if len(values) < self.batch:
                return

    def take(self, items: list[Item]) -> list[Item]:
        if not items:
            return []
        direction = -1 if self.producers_push == "head" else 1  # look where consumers take from: fewer to skip
        taken = self._scripts["take"](keys=[self.key, self.staging], args=[direction, *_values(items)])
        self._taken_from_window += len(taken)
        remaining = Counter(taken)
        chosen = []
        for item in items:
            if remaining[item.handle] > 0:
                remaining[item.handle] -= 1
                chosen.append(item)
        return chosen

    def release(self, items: list[Item]) -> None:
        if items:
            keys = [self.staging] if self.payloads is None else [self.staging, self.payloads]
            self._scripts["release"](keys=keys, args=_values(items))

    def give_back(self, items: list[Item]) -> None:
        if items:
            push = "RPUSH" if self.producers_push == "head" else "LPUSH"
            self._scripts["give_back"](keys=[self.staging, self.key], args=[push, *_values(items)])

    def finish(self) -> None:
        return None

    def notes(self) -> list[str]:
        return [] if self._notes is None else self._notes(self)

    def count(self) -> tuple[int, int]:
        """Entries in the queue, and in the staging list of an interrupted import."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.llen(self.key)
            pipe.llen(self.staging)
            queued, staged = pipe.execute()
        return int(queued), int(staged)

    def _items(self, values: list[bytes], missing: str) -> list[Item]:
        if self.payloads is None:
            return [Item(value, self.classify(value, None)) for value in values]
        payloads = self.client.hmget(self.payloads, values)
        return [
            Item(value, self.classify(value, payload) if payload is not None else missing)
            for value, payload in zip(values, payloads, strict=True)
        ]


def _values(items: list[Item]) -> list[bytes]:
    return [item.handle for item in items]
