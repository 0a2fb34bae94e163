"""Dead letters: requeued, trimmed to the store's retention, or purged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Requeued
from .rehoming import Rehoming
from .replies import MAX_BATCH, check_id, chunks, stored_id
from .runner import Runner
from .shards import Shards


class DeadLetters:
    """The dead letters of every shard.

    Parameters:
      max_count: keep at most this many per shard (None: no bound).
      max_age_ms: drop those dead for longer (None: no bound).
    """

    def __init__(
        self, shards: Shards, runner: Runner, rehoming: Rehoming, max_count: int | None, max_age_ms: int | None
    ) -> None:
        self.shards = shards
        self.runner = runner
        self.rehoming = rehoming
        self.max_count = max_count
        self.max_age_ms = max_age_ms

    def requeue(self, ids: Sequence[str] | None, dead_by_ms: int | None) -> Requeued:
        if ids is not None:
            wanted = [check_id(id) for id in ids]
            requeued = [0]
            missed_last: dict[str, bool] = {}  # per id: whether the last shard it was looked for in missed it

            def look(shard: int, group: list[str]) -> list[str]:
                missed: list[str] = []
                for chunk in chunks(group):
                    done, not_here = self._requeue(shard, [MAX_BATCH, 0, 0, *chunk])
                    requeued[0] += done
                    missed.extend(not_here)
                gone = set(missed)
                missed_last.update((id, id in gone) for id in group)
                return missed

            self.rehoming.search(wanted, look)
            return Requeued(requeued[0], [id for id, missed in missed_last.items() if missed])
        count, left = 0, list[str]()
        until = self.shards.now_ms() if dead_by_ms is None else dead_by_ms
        for shard in self.shards.serving:
            skipped = 0
            while True:
                # Requeued ids leave the dead set; those it cannot requeue stay at its head: page past them.
                reply = self.runner.run("requeue", shard, [MAX_BATCH, skipped, until])
                self.shards.relay_wake(shard, int(reply[0]) > 0)
                if reply == [0]:  # an empty page: nothing dead past the ones left
                    break
                count += int(reply[0])
                skipped += len(reply) - 1
                left.extend(stored_id(id) for id in reply[1:])
        return Requeued(count, left)

    def _requeue(self, shard: int, args: list[Any]) -> tuple[int, list[str]]:
        reply = self.runner.run("requeue", shard, args)
        self.shards.relay_wake(shard, int(reply[0]) > 0)
        return int(reply[0]), [stored_id(id) for id in reply[1:]]

    @property
    def trims(self) -> bool:
        return self.max_count is not None or self.max_age_ms is not None

    def trim(self, shard: int | None) -> int:
        """Drop what is past the bounds, on one shard or (None) every shard; how many were dropped.

        Enforced by promoters rather than where dead letters are made: letters are made by three scripts
        (claim, nack, direct promotion) and only by promoters, and an age bound needs a periodic look anyway
        (a letter ages without anything happening to it). So each promoter trims a shard right after it
        dead-lettered something there (the count bound holds within one batch) and every shard every
        :data:`delay_broker.promoter.DEAD_TRIM_INTERVAL` seconds (the age bound holds within that).
        """
        if not self.trims:
            return 0
        count = -1 if self.max_count is None else self.max_count
        age = -1 if self.max_age_ms is None else self.max_age_ms
        total = 0
        for one in self.shards.serving if shard is None else (shard,):
            while True:
                dropped, more = self.runner.run("trim_dead", one, [count, age, MAX_BATCH])
                total += int(dropped)
                if not int(more):
                    break
        return total

    def purge(self, ids: Sequence[str] | None, dead_by_ms: int | None) -> int:
        if ids is None:
            total = 0
            until = self.shards.now_ms() if dead_by_ms is None else dead_by_ms
            for shard in self.shards.serving:
                while purged := int(self.runner.run("purge", shard, [MAX_BATCH, until])):
                    total += purged
            return total
        deleted = [0]

        def look(shard: int, group: list[str]) -> list[str]:
            for chunk in chunks(group):
                deleted[0] += int(self.runner.run("purge", shard, [MAX_BATCH, 0, *chunk]))
            return group  # purge.lua says how many it deleted, not which: every shard an id may be in is asked

        self.rehoming.search(list(ids), look)
        return deleted[0]
