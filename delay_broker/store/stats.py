"""Counts over every shard (and the far tier), and promotion lateness."""

from __future__ import annotations

from ..clock import delay_to_ms
from ..records import StoreStats
from .far_view import FarReader
from .replies import text
from .runner import Runner
from .shards import Shards

HISTOGRAM_EDGES = (60_000, 3_600_000, 86_400_000)
"""Stats buckets: due within a minute, an hour, a day; the last bucket counts everything later."""

LATENESS_EDGES_MS = (10, 100, 1000, 10000, 60000)
"""Upper edges of the store's promotion-lateness buckets (must equal LATENESS_EDGES in the Lua helpers)."""


class Stats:
    def __init__(self, shards: Shards, runner: Runner, far: FarReader) -> None:
        self.shards = shards
        self.runner = runner
        self.far = far

    def stats(self, heartbeat_window: float) -> StoreStats:
        window = delay_to_ms(heartbeat_window)
        with self.far.snapshot() as view:
            snapshots = [
                self.runner.run("stats", shard, [window, *HISTOGRAM_EDGES], write=False)
                for shard in self.shards.serving
            ]
            # The moved tokens read with each shard's counts: no move lands between.
            leaving = [int(token) for reply in snapshots for token in reply[9]]
            far_counts = self.far.counts(int(snapshots[0][0]), HISTOGRAM_EDGES, leaving, view)
        counters: dict[str, int] = {}
        heads = []
        for reply in snapshots:
            pairs = iter(reply[7])
            for name, value in zip(pairs, pairs, strict=True):
                counters[name.decode()] = counters.get(name.decode(), 0) + int(value)
            if int(reply[5]) >= 0:
                heads.append(int(reply[5]))

        def total(index: int) -> int:
            return sum(int(reply[index]) for reply in snapshots)

        histogram = [sum(int(reply[8][n]) for reply in snapshots) for n in range(len(snapshots[0][8]))]
        far = far_overdue = 0
        if far_counts is not None:
            far, far_overdue, far_head, far_histogram = far_counts
            histogram = [a + b for a, b in zip(histogram, far_histogram, strict=True)]
            heads.extend([] if far_head is None else [far_head])
        return StoreStats(
            now_ms=int(snapshots[0][0]),
            parked=total(1) + far,
            inflight=total(2),
            dead=total(3),
            overdue=total(4) + far_overdue,
            next_due_ms=min(heads) if heads else None,
            live_promoters=max(int(reply[6]) for reply in snapshots),
            counters=counters,
            histogram=histogram,
            shards=self.shards.count,
            far=far,
            packed=total(10),
        )

    def promotion_lateness(self) -> list[tuple[str, int]]:
        spaces, client = [self.shards.spaces[shard] for shard in self.shards.serving], self.shards.client
        with self.shards.calling("reading lateness"):
            if self.shards.cluster:  # the shards' keys live in different slots, so on different nodes
                replies = [client.hgetall(space.lateness) for space in spaces]
            else:
                pipe = client.pipeline(transaction=False)
                for space in spaces:
                    pipe.hgetall(space.lateness)
                replies = pipe.execute()
        totals = dict.fromkeys([*map(str, LATENESS_EDGES_MS), "more"], 0)
        for reply in replies:
            for bucket, count in reply.items():
                name = text(bucket)
                if name in totals:
                    totals[name] += int(count)
        return list(totals.items())
