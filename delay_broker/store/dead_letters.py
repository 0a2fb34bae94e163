"""Dead letters: requeued, trimmed to the store's retention, or purged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Requeued
from .replies import MAX_BATCH, check_id, chunks, stored_id
from .runner import Runner
from .shards import Shards


class DeadLetters:
    """The dead letters of every shard.

    Parameters:
      max_count: keep at most this many per shard (None: no bound).
      max_age_ms: drop those dead for longer (None: no bound).
    """

    def __init__(self, shards: Shards, runner: Runner, max_count: int | None, max_age_ms: int | None) -> None:
        self.shards = shards
        self.runner = runner
        self.max_count = max_count
        self.max_age_ms = max_age_ms

    def requeue(self, ids: Sequence[str] | None, dead_by_ms: int | None) -> Requeued:
        count, left = 0, list[str]()
        if ids is not None:
            for shard, group in self.shards.by_shard(check_id(id) for id in ids).items():
                for chunk in chunks(group):
                    done, missed = self._requeue(shard, [MAX_BATCH, 0, 0, *chunk])
                    if shard != 0 and missed:
                        again, missed = self._requeue(0, [MAX_BATCH, 0, 0, *missed])
                        done += again
                    count += done
                    left.extend(missed)
            return Requeued(count, left)
        until = self.shards.now_ms() if dead_by_ms is None else dead_by_ms
        for shard in range(len(self.shards.spaces)):
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
        for one in range(len(self.shards.spaces)) if shard is None else (shard,):
            while True:
                dropped, more = self.runner.run("trim_dead", one, [count, age, MAX_BATCH])
                total += int(dropped)
                if not int(more):
                    break
        return total

    def purge(self, ids: Sequence[str] | None, dead_by_ms: int | None) -> int:
        total = 0
        if ids is None:
            until = self.shards.now_ms() if dead_by_ms is None else dead_by_ms
            for shard in range(len(self.shards.spaces)):
                while deleted := int(self.runner.run("purge", shard, [MAX_BATCH, until])):
                    total += deleted
            return total
        for shard, group in self.shards.by_shard(ids).items():
            for chunk in chunks(group):
                total += int(self.runner.run("purge", shard, [MAX_BATCH, 0, *chunk]))
            if shard != 0:
                total += sum(int(self.runner.run("purge", 0, [MAX_BATCH, 0, *chunk])) for chunk in chunks(group))
        return total
