"""The far tier's sweep: rows coming within the horizon moved into Redis, a shard that cannot take them held
back, and tokens of rows moved in forgotten once the rows are gone."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..clock import delay_to_ms
from ..errors import SlotMigrating, StoreError, StoreUnavailable
from ..far import FarRow, FarTier
from .encoding import Due, Parcel
from .far_view import FarView
from .parking import RedisParking
from .replication import Replication
from .replies import MAX_BATCH
from .shards import Shards

logger = logging.getLogger("delay_broker.store")

FAR_HOLD_BACK_SECONDS = 5.0
"""How long far rows a shard could not take are passed over by the sweeps of this store (at least a sweep
interval): long enough for the other shards' rows to get through, short enough to find a master back soon."""


class FarSweeper:
    """Moves a store's far rows into Redis as they come within the horizon (promoters call :meth:`sweep`)."""

    def __init__(
        self, tier: FarTier, view: FarView, shards: Shards, parking: RedisParking, replication: Replication
    ) -> None:
        self.tier = tier
        self.view = view
        self.shards = shards
        self.parking = parking
        self.replication = replication
        self._held_back: dict[str, float] = {}
        self._shards_down: dict[int, float] = {}
        """Shards whose master lately failed to take far rows, with the end of their pause (monotonic)."""

    def sweep(self, ids: Sequence[str] = ()) -> int:
        """Move the far rows now due within the horizon (or those of ``ids``) into Redis: one transaction of at
        most the tier's ``batch`` rows. Returns how many rows left the table."""
        tier = self.tier
        now = self.shards.now_ms()
        deadline = now + tier.lease_ms
        rows = self.view.table.move(
            now + tier.horizon_ms,
            tier.batch,
            tier.lease_ms,
            lambda found: self.adopt(found, deadline, partial=True),
            ids,
            skip=self._held_back_rows(),
        )
        if rows:
            for shard, group in self._rows_by_shard(rows).items():
                self.forget_tokens(shard, [row.token for row in group])
        return len(rows)

    def _held_back_rows(self) -> list[str]:
        """The ids of rows whose shard could not take them lately: passed over until their pause ends, or they
        would fill every batch, and a master that is down would hold up the other shards' messages too."""
        now = time.monotonic()
        self._held_back = {id: until for id, until in self._held_back.items() if until > now}
        return list(self._held_back)

    def _rows_by_shard(self, rows: list[FarRow]) -> dict[int, list[FarRow]]:
        by_id = {row.id: row for row in rows}  # ids are unique in a namespace's table
        return {shard: [by_id[id] for id in ids] for shard, ids in self.shards.by_shard(by_id).items()}

    def adopt(self, rows: list[FarRow], deadline_ms: int, *, partial: bool = False) -> list[FarRow]:
        """Park far rows into their shards; returns the rows adopted. With ``partial``, a shard whose master
        cannot take them now (down, hung, or no replica confirming) is left out, its rows left in the table and
        held back for a while, so that the other shards' rows move; it raises only when no shard took its rows.
        A shard that failed lately is not tried again until its pause ends, and shards are not begun past half
        the lease: a hung master costs socket timeouts, which must not run the whole batch out of its lease."""
        adopted: list[FarRow] = []
        failed: list[tuple[int, list[FarRow], StoreUnavailable | SlotMigrating | None]] = []
        started, budget = time.monotonic(), self.tier.lease_ms / 2000
        groups = sorted(self._rows_by_shard(rows).items(), key=lambda item: item[0] in self._shards_down)
        for shard, group in groups:
            if partial and (self._shards_down.get(shard, 0.0) > time.monotonic()):
                failed.append((shard, group, None))  # paused: held back again, untried
                continue
            if partial and time.monotonic() - started > budget:
                break  # not tried: taken first by the next sweep
            try:
                self._adopt_group(shard, group, deadline_ms)
            except (StoreUnavailable, SlotMigrating) as error:  # a slot migrating: nothing was written, as Redis down
                if not partial:
                    raise
                failed.append((shard, group, error))
                continue
            adopted.extend(group)
            if self._shards_down.pop(shard, None) is not None:
                logger.info("Store %r: far rows move into shard %d again.", self.shards.keys.namespace, shard)
        self._hold_back(failed)
        refusals = [refusal for _, _, refusal in failed if refusal is not None]
        if refusals and not adopted:
            raise refusals[0]  # nothing moved: the sweeper backs off, and passes over these rows next time
        return adopted

    def _adopt_group(self, shard: int, group: list[FarRow], deadline_ms: int) -> None:
        parcels = [Parcel(row.id, Due(row.due_ms, absolute=True), row.record) for row in group]
        self.parking.adopt(shard, parcels, deadline_ms, [row.token for row in group], self._replicas(shard))

    def _hold_back(self, failed: list[tuple[int, list[FarRow], StoreUnavailable | SlotMigrating | None]]) -> None:
        pause = time.monotonic() + max(FAR_HOLD_BACK_SECONDS, self.tier.sweep_interval)
        for shard, group, refusal in failed:
            self._held_back.update((row.id, pause) for row in group)
            if refusal is None:
                continue
            if shard not in self._shards_down:
                logger.warning(
                    "Store %r: far rows for shard %d stay in PostgreSQL until it takes them (%s); the other shards' "
                    "move on.",
                    self.shards.keys.namespace,
                    shard,
                    refusal,
                )
            self._shards_down[shard] = pause

    def _replicas(self, shard: int) -> int:
        """Replicas that must confirm far rows moved into ``shard`` before the rows are deleted: the store's, or
        with none asked for, one if the shard's master has any. Those messages were safe in PostgreSQL, often for
        weeks: a failover right after the move must not lose them, as it may lose a fresh park (which its
        producer saw only just acknowledged). Unconfirmed, the move is rolled back and made again later."""
        return self.replication.replicas or self.replication.present(shard)

    def forget_tokens(self, shard: int, tokens: list[int]) -> None:
        """Drop the tokens of rows now deleted. A failure here only leaves tokens for :meth:`forget_orphans`."""
        try:
            with self.shards.calling("forgetting moved tokens"):
                self.shards.client.zrem(self.shards.spaces[shard].moved, *tokens)
        except StoreError as error:
            logger.debug("Tokens of moved rows left for later: %s", error)

    def forget_orphans(self, older_than: float) -> int:
        """Delete the rows of tokens recorded more than ``older_than`` seconds ago, then drop the tokens.

        Such a row is dead weight: its message was moved in by a mover that died before deleting it, or replaced
        by a park in Redis whose delete did not commit (PostgreSQL gone in between). The token kept it from
        running a second time; left until its due time, weeks away maybe, it would also be found by a ``keep``
        park of its id, which would keep it and write nothing. A row parked again since has a new token."""
        dropped = 0
        edge = self.shards.now_ms() - delay_to_ms(older_than)
        client = self.shards.client
        for space in self.shards.spaces:
            with self.shards.calling("reading moved tokens"):
                found: list[bytes] = client.zrangebyscore(space.moved, "-inf", edge, 0, MAX_BATCH)  # type: ignore[assignment]
                tokens = [int(token) for token in found]
            if not tokens:
                continue
            if not self.view.table.delete_tokens(
                tokens
            ):  # rows first: a token dropped while its row lives lets it move
                continue
            with self.shards.calling("forgetting moved tokens"):
                dropped += int(client.zrem(space.moved, *tokens))
        return dropped
