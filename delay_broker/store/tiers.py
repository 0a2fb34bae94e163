"""Where a message lives: :class:`RedisOnly` for a store without a far tier, :class:`WithFarTier` for one with
(messages due beyond its horizon are rows of PostgreSQL, the rest in Redis, one copy per id across both)."""

from __future__ import annotations

import dataclasses
import logging

from ..clock import MAX_DUE_MS
from ..envelope import Envelope
from ..errors import DelayBrokerError, FarTierUnavailable, InvalidDelay, NotReplicated, StoreUnavailable
from ..far import FarTier, check_storable
from ..records import OnConflict, ParkResult
from .encoding import Due, Parcel
from .far_view import FarView
from .parking import RedisParking
from .reading import Reading
from .replies import chunks, seconds_text
from .sweeping import FarSweeper

logger = logging.getLogger("delay_broker.store")


class RedisOnly:
    """Every message in Redis: parks, cancels and reschedules go to the shards alone."""

    fast_path = True
    """Whether a park of one new id may take the one-message scripts."""

    def __init__(self, parking: RedisParking, reading: Reading) -> None:
        self.parking = parking
        self.reading = reading

    def park(self, parcels: list[Parcel], on_conflict: OnConflict) -> list[ParkResult]:
        return self.parking.park(parcels, on_conflict)

    def cancel(self, ids: list[str]) -> dict[str, bool]:
        """Cancel each of ``ids`` (no id twice): whether it was removed."""
        return {id: bool(flag) for id, flag in zip(ids, self.parking.cancel(ids), strict=True)}

    def reschedule(self, id: str, due: Due, record: bytes, envelope: Envelope | None, expected: bytes) -> int | None:
        """Move ``id`` to ``due`` (``record``, made from ``envelope``, replaces its envelope unless empty), if it is
        still ``expected`` (its envelope as read, or empty): the new due time, or None when it is not parked."""
        return self.parking.reschedule(id, due, record, self.parking.max_delay_arg, expected)

    def withdraw(self, id: str, payload: bytes) -> bool:
        """After a park of ``payload`` under ``id`` raised :class:`StoreUnavailable` (:class:`NotReplicated`,
        or a call sent that got no answer), before the message is sent some other way: take back a copy the
        store may hold (a failover may lose it, or it may run: either way not beside the other copy). False when
        that copy is already being promoted, and so runs from the store. True otherwise, also when the copy
        being promoted is another message of the same id (a retry reuses its message's id, and the run it
        retries may still be in flight), and when Redis cannot be asked: nothing more can be done."""
        try:
            try:
                if self.cancel([id])[id]:
                    return True
                info = self.reading.get(id)
            except FarTierUnavailable:
                # A row cannot be taken back while PostgreSQL is away (nothing more can be done there), but the
                # copy in Redis can, and must be: a park whose rows were not deleted wrote one.
                if self.parking.cancel([id])[0]:
                    return True
                info = self.reading.get_in_redis(id)
            return info is None or info.envelope is None or info.envelope.payload != payload
        except NotReplicated:
            return True  # removed on the master, unconfirmed like the park it takes back
        except DelayBrokerError:
            return True  # the master is gone, and the copy it did not replicate with it

    def sweep(self, ids: tuple[str, ...] | list[str] = ()) -> int:
        return 0

    def forget_orphans(self, older_than: float) -> int:
        return 0


class WithFarTier(RedisOnly):
    """Messages due beyond the tier's horizon as rows of its table, the others in Redis.

    Each park, cancel or reschedule holds its ids' locks in PostgreSQL around its Redis script: one of the same
    id by another process waits for it and then sees it, so an id has one copy across both tiers.
    """

    fast_path = False

    def __init__(
        self,
        parking: RedisParking,
        reading: Reading,
        tier: FarTier,
        view: FarView,
        sweeper: FarSweeper,
        max_delay_ms: int | None,
    ) -> None:
        super().__init__(parking, reading)
        self.tier = tier
        self.view = view
        self.table = view.table
        self.sweeper = sweeper
        self.shards = parking.shards
        self.max_delay_ms = max_delay_ms

    def far_due(self, id: str, due: Due, now: int) -> int | None:
        """The due time (ms) of a message that belongs in the far tier, or None if it belongs in Redis."""
        at = due.at(now)
        if at - now <= self.tier.horizon_ms:
            return None
        if at > MAX_DUE_MS:
            raise InvalidDelay(f"due time of {id} is past the latest supported")
        if self.max_delay_ms is not None and at - now > self.max_delay_ms:
            raise InvalidDelay(
                f"due time of {id} is {seconds_text(at - now)} from now, beyond max_delay "
                f"({seconds_text(self.max_delay_ms)})"
            )
        return at

    # -- parks -----------------------------------------------------------------------------------------

    def park(self, parcels: list[Parcel], on_conflict: OnConflict) -> list[ParkResult]:
        """Park the far messages as rows and the others in Redis, one copy per id across both tiers.

        Each chunk (up to 1,000 ids of one shard and one tier) holds its ids' locks in PostgreSQL around its
        one Redis script: parks of the same id by other processes wait for it and then see it. An id given twice
        is parked twice, in the order given, as in Redis."""
        now = self.shards.estimated_now_ms()
        dues = [self.far_due(parcel.id, parcel.due, now) for parcel in parcels]  # validated before writing
        for parcel, due in zip(parcels, dues, strict=True):
            if due is not None and parcel.envelope is not None:
                check_storable(parcel.id, parcel.envelope.route, parcel.envelope.name or "")
        results: list[ParkResult | None] = [None] * len(parcels)
        for positions in _rounds([parcel.id for parcel in parcels]):
            for chunk in self._shard_chunks([n for n in positions if dues[n] is None], parcels):
                self._park_near(chunk, parcels, on_conflict, results)
            for chunk in self._shard_chunks([n for n in positions if dues[n] is not None], parcels):
                self._park_far(chunk, parcels, dues, on_conflict, results)
        return results  # type: ignore[return-value]

    def _shard_chunks(self, positions: list[int], parcels: list[Parcel]) -> list[list[int]]:
        groups: dict[int, list[int]] = {}
        for n in positions:
            groups.setdefault(self.shards.shard_for(parcels[n].id), []).append(n)
        return [chunk for group in groups.values() for chunk in chunks(group)]

    def _park_near(
        self, chunk: list[int], parcels: list[Parcel], on_conflict: OnConflict, results: list[ParkResult | None]
    ) -> None:
        """Park in Redis (``chunk``: up to 1,000 ids of one shard), replacing (or keeping) a row of the same id."""
        shard = self.shards.shard_for(parcels[chunk[0]].id)
        parked: list[ParkResult] | None = None
        replaced: dict[str, int] = {}
        with self.table.parking([parcels[n].id for n in chunk]) as rows:
            if on_conflict == "keep":
                found = rows.due_times([parcels[n].id for n in chunk])
                retired = self.view.retired(shard, {id: token for id, (_, token) in found.items()})
                held = {id: due for id, (due, _) in found.items() if id not in retired}
                for n in chunk:
                    if parcels[n].id in held:
                        results[n] = ParkResult(parcels[n].id, held[parcels[n].id], "kept")
                chunk = [n for n in chunk if results[n] is None]
                parked = self.parking.park_chunk(shard, [parcels[n] for n in chunk], on_conflict) if chunk else []
            else:
                # Deleted in a transaction committed only once the park in Redis is done: a park that fails
                # leaves the rows as they were. The park records the rows' tokens as moved in: if the commit
                # then fails, the rows it leaves are never moved into Redis beside the new copy.
                try:
                    with rows.deleted([parcels[n].id for n in chunk]) as replaced:
                        parked = self.parking.park_chunk(
                            shard, [parcels[n] for n in chunk], on_conflict, retire=list(replaced.values())
                        )
                except FarTierUnavailable as error:
                    if parked is None:
                        raise
                    # Parked all the same, and so reported: the rows left are retired (their tokens recorded),
                    # and raising would have the caller send the message some other way, to run twice.
                    logger.warning("Parked in Redis; the far rows it replaces are left, retired: %s", error)
                else:
                    if replaced:
                        self.sweeper.forget_tokens(shard, list(replaced.values()))
        assert parked is not None
        # park.lua counted as parked what was new to Redis; the ones that replace a row were parked already.
        renewed = [result.id for result in parked if result.id in replaced and result.outcome == "new"]
        self._count("parked", renewed, sign=-1)
        self._count("replaced", renewed)
        for n, result in zip(chunk, parked, strict=True):
            results[n] = dataclasses.replace(result, outcome="replaced") if result.id in replaced else result

    def _park_far(
        self,
        chunk: list[int],
        parcels: list[Parcel],
        dues: list[int | None],
        on_conflict: OnConflict,
        results: list[ParkResult | None],
    ) -> None:
        """Park as rows, replacing (or keeping) a copy of the same id in Redis."""
        ids = [parcels[n].id for n in chunk]
        rows_to_write = [_row(parcels[n], dues[n]) for n in chunk]
        # A park that raises has written nothing, in either tier: its caller may hand the message elsewhere (a
        # Dramatiq retry goes to the broker), and a row left behind would run it a second time.
        unsure: StoreUnavailable | None = None
        with self.table.parking(ids) as rows, rows.atomic():
            if on_conflict == "keep":
                # A retired row is no message to keep: its id is free (see FarView.retired).
                found = rows.due_times(ids)
                retired = self.view.retired(
                    self.shards.shard_for(ids[0]), {id: token for id, (_, token) in found.items()}
                )
                if retired:
                    rows.delete(list(retired))
            previous = rows.insert(rows_to_write, replace=on_conflict == "replace")
            if on_conflict == "keep":
                # Looked up after the insert, which waited for any sweeper moving a row of these ids: a copy it
                # moved into Redis is seen here, and the row just written for its id is taken back. A read:
                # if it fails, nothing changed in Redis, and the rows are rolled back.
                in_redis = self.parking.held([id for id in ids if id not in previous])
                if in_redis:
                    rows.delete(list(in_redis))
                cancelled: dict[str, int] = {}
            else:  # a copy of the same id in Redis, even one a promoter holds, is replaced by the row
                in_redis = {}
                self.parking.held(ids)  # Redis answers, before anything is written there
                try:
                    gone = self.parking.cancel(ids, replacing=True)
                except StoreUnavailable as error:
                    # Sent, but no answer: a copy in Redis may be gone already, so the rows stay (never none).
                    unsure, gone = error, []
                cancelled = {id: was for id, was in zip(ids, gone, strict=False) if was}
        if unsure is not None:
            raise unsure
        parked: list[str] = []
        renewed: list[str] = []
        for n in chunk:
            id = parcels[n].id
            if id in in_redis or (on_conflict == "keep" and id in previous):
                results[n] = ParkResult(id, in_redis[id] if id in in_redis else previous[id], "kept")
                continue
            replaced = id in previous or id in cancelled
            results[n] = ParkResult(id, dues[n] or -1, "replaced" if replaced else "new")
            # A message still parked (a row, or a copy parked in Redis) is counted as replaced, as park.lua
            # counts it; one that was in flight or dead came back, and is counted as parked.
            (renewed if id in previous or cancelled.get(id) == 2 else parked).append(id)
        self._count("parked", parked)
        self._count("replaced", renewed)

    def _count(self, field: str, ids: list[str], *, sign: int = 1) -> None:
        """Add what the far tier did to the store's counters (each id in its shard's), as the scripts count what
        they do in Redis; ``sign=-1`` takes back what a script counted. Best effort: the rows are written, a
        counter that misses one is only a figure."""
        for shard, group in self.shards.by_shard(ids).items():
            try:
                with self.shards.calling(f"counting {field}"):
                    self.shards.client.hincrby(self.shards.spaces[shard].stats, field, sign * len(group))
            except DelayBrokerError as error:
                logger.warning(
                    "Store %r: counting %d %s message(s) failed: %s",
                    self.shards.keys.namespace,
                    len(group),
                    field,
                    error,
                )

    # -- cancels and reschedules -----------------------------------------------------------------------

    def cancel(self, ids: list[str]) -> dict[str, bool]:
        removed: dict[str, bool] = {}
        for chunk in chunks(ids):
            removed.update(self._cancel_chunk(chunk))
        return removed

    def _cancel_chunk(self, ids: list[str]) -> dict[str, bool]:
        """Cancel in both tiers, under the ids' locks: a park of the same id moving it between the tiers (in
        neither until it commits) is waited for, not met half-way and missed."""
        with self.table.parking(ids) as rows:
            # The far tier first: deleting a row waits for a mover that holds it, after which the message is in
            # Redis. Redis is asked for every id, because a mover that died may have left a copy there too.
            deleted = rows.delete(ids)
            in_redis = self.parking.cancel(ids)
        # A retired row (see FarView.retired) is no message: its copy in Redis is it, and may have run already.
        far = deleted.keys() - self.view.retired_rows(deleted)
        self._count("cancelled", [id for id, gone in zip(ids, in_redis, strict=True) if id in far and not gone])
        return {id: id in far or bool(gone) for id, gone in zip(ids, in_redis, strict=True)}

    def reschedule(self, id: str, due: Due, record: bytes, envelope: Envelope | None, expected: bytes) -> int | None:
        far_due = self._reschedule_row(id, due, record, envelope, expected)
        if far_due is None:
            return super().reschedule(id, due, record, envelope, expected)
        # A row was rescheduled; a copy a dead mover left in Redis is rescheduled with it (see _reschedule_row).
        self.parking.reschedule(id, Due(far_due, absolute=True), record, -1, expected)
        if far_due - self.shards.estimated_now_ms() <= self.tier.horizon_ms:
            self.sweeper.sweep(ids=[id])  # now within the horizon: into Redis at once
        return far_due

    def _reschedule_row(
        self, id: str, due: Due, record: bytes, envelope: Envelope | None, expected: bytes
    ) -> int | None:
        """Give ``id``'s far row its new due time (ms, returned); None if it has no row, or a retired one (the
        copy in Redis, if any, is the message), or one whose record is not ``expected`` (when given). The row keeps
        its token, so a copy a mover that dies meanwhile leaves in Redis (rescheduled too, by the caller) still
        stops a second move."""
        if self.view.live_row(id) is None:
            return None
        now = self.shards.estimated_now_ms()
        at = due.at(now)
        self.far_due(id, Due(at, absolute=True), now)  # the same limits as a park
        route, name = (envelope.route, envelope.name or "") if envelope is not None else ("", "")
        return at if self.table.reschedule(id, at, record or None, route, name, expected or None) else None

    def sweep(self, ids: tuple[str, ...] | list[str] = ()) -> int:
        return self.sweeper.sweep(ids)

    def forget_orphans(self, older_than: float) -> int:
        return self.sweeper.forget_orphans(older_than)


def _row(parcel: Parcel, due: int | None) -> tuple[str, int, str, str, bytes]:
    """A far row of ``parcel``: its id, due time, route, name and record."""
    envelope = parcel.envelope
    assert envelope is not None and due is not None
    return parcel.id, due, envelope.route, envelope.name or "", parcel.record


def _rounds(ids: list[str]) -> list[list[int]]:
    """Positions of ``ids`` in rounds without a repeated id: the first of each id, then the second ..."""
    seen: dict[str, int] = {}
    rounds: list[list[int]] = []
    for position, id in enumerate(ids):
        occurrence = seen[id] = seen.get(id, -1) + 1
        if occurrence == len(rounds):
            rounds.append([])
        rounds[occurrence].append(position)
    return rounds
