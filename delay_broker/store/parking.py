"""Parking in Redis: the one-message fast path, batches, a schedule's occurrences, far rows adopted; and the other
writes by id in Redis (cancel, reschedule) and the look at which ids Redis holds. Each by the layout in force, and
during a reshard in both (see :mod:`~delay_broker.store.rehoming`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

from ..errors import DelayBrokerError, LayoutChanged, StoreUnavailable
from ..packing import NOT_PACKABLE, PackPolicy, binary_id
from ..records import OnConflict, ParkResult
from .encoding import Due, Parcel
from .layouts import View
from .rehoming import LAYOUT_TRIES, Rehoming
from .replies import chunks, text
from .runner import ByIdCall, Runner
from .shards import Shards

logger = logging.getLogger("delay_broker.store")

OUTCOMES: tuple[Literal["kept", "new", "replaced", "stale", "moved"], ...] = (
    "kept",
    "new",
    "replaced",
    "stale",
    "moved",
)
"""park.lua's outcome codes, in order."""


class OneCall(NamedTuple):
    """A one-message park script's call: the script, its shard, arguments and keys after the shard's, and (a pack)
    the index partition the id goes to (-1 for the ordinary layout)."""

    script: str
    shard: int
    args: list[Any]
    extra: list[str]
    partition: int


class RedisParking:
    """Writes messages into Redis by id, in their shards (a message's shard comes from its id).

    Parameters:
      shards, runner: the namespace's shards and the script runner.
      rehoming: the reshard's batches in transit, and the look by id in both layouts while one is under way.
      pack: the packing policy (which messages go to packs).
      max_delay_arg: ``max_delay`` as the scripts take it (ms, or -1 for none).
    """

    def __init__(
        self, shards: Shards, runner: Runner, rehoming: Rehoming, pack: PackPolicy, max_delay_arg: int
    ) -> None:
        self.shards = shards
        self.runner = runner
        self.rehoming = rehoming
        self.pack = pack
        self.max_delay_arg = max_delay_arg

    # -- parks -----------------------------------------------------------------------------------------

    def park_one(self, parcel: Parcel) -> ParkResult | None:
        """A park of one id the store does not hold, untraced (every adapter's delayed send: Dramatiq's delay,
        Celery's eta), in one call of ``pack_one.lua`` or ``park_one.lua``: a third of park.lua's server time.
        None when the script leaves the message to park.lua (the id is held, or anything unusual; nothing was
        written)."""
        call = self.one_call(parcel)
        if call is None:
            return None
        try:
            reply = self.runner.run(call.script, call.shard, call.args, extra=call.extra)
        except StoreUnavailable:
            raise
        except LayoutChanged as changed:  # parked by park.lua, by the layout as it is now
            self.shards.follow(changed)
            return None
        except DelayBrokerError:  # a refusal: park.lua, which wrote nothing either, says what it is
            return None
        return self.one_result(call, parcel, reply)

    def one_call(self, parcel: Parcel) -> OneCall | None:
        """The one-message script call that parks ``parcel`` (see :meth:`park_one`), made by it or in a batch; None
        during a reshard for an id whose home moves (park.lua's path looks at its old home too)."""
        self.shards.settle_for_parking()
        view = self.shards.view("park")
        if view.crossing(parcel.id):
            return None
        shard = view.home(parcel.id)
        space = self.shards.space(shard, "park")
        binary = binary_id(parcel.id)
        shape = self.runner.shape(shard)
        if binary == NOT_PACKABLE:
            partition, name = space.packs, None
        else:
            number = shape.partition(binary)
            partition, name = space.packed(number), None
            if self.pack.after_ms is not None:
                # The pack is chosen by the estimated Redis clock; the script reads the clock itself for the due time.
                now = self.shards.estimated_now_ms()
                name = self.pack.target(binary, parcel.due.at(now), now)
        head = [parcel.id, parcel.due.wire, parcel.record, binary, str(shape)]
        if name is None:
            return OneCall("park_one", shard, [*head, self.max_delay_arg, view.generation], [partition], -1)
        args = [*head, name, self.pack.min_ahead_ms, self.max_delay_arg, view.generation]
        return OneCall("pack_one", shard, args, [partition, space.pack(name)], number)

    def one_result(self, call: OneCall, parcel: Parcel, reply: Any) -> ParkResult | None:
        """What a one-message call's ``reply`` says (None: left to park.lua), its wake relayed and a full index
        partition split."""
        if not reply:
            return None
        self.shards.relay_wake(call.shard, reply[-1])
        if call.partition >= 0 and int(reply[1]):
            self.runner.split_index(call.shard, call.partition)
        return ParkResult(parcel.id, int(reply[0]), "new")

    def park(self, parcels: list[Parcel], on_conflict: OnConflict, *, retire: Sequence[int] = ()) -> list[ParkResult]:
        """Park each message with park.lua into its home by the layout in force: one call per 1,000 per shard, each
        chunk all or nothing. A chunk refused because the layout changed is parked again by the new one (the chunks
        parked before stay where they are: a reshard moves them). ``retire``: the tokens of far rows the park
        replaces (see park.lua), recorded in each shard it parks into."""
        results: list[ParkResult | None] = [None] * len(parcels)
        for attempt in range(LAYOUT_TRIES):
            view = self.shards.view("park")
            groups: dict[int, list[int]] = {}
            for position, result in enumerate(results):
                if result is None:
                    groups.setdefault(view.home(parcels[position].id), []).append(position)
            calls = [(shard, chunk) for shard, positions in groups.items() for chunk in chunks(positions)]
            try:
                if len(calls) > 1 and self._overlapping(view):
                    self._park_overlapped(view, calls, parcels, results, on_conflict, retire)
                for shard, chunk in calls:
                    if results[chunk[0]] is None:
                        parked = self._park_home(view, shard, [parcels[p] for p in chunk], on_conflict, retire)
                        _record(results, chunk, parked)
            except LayoutChanged as changed:
                if attempt == LAYOUT_TRIES - 1:
                    raise
                self.shards.follow(changed)
                continue
            break
        return results  # type: ignore[return-value]

    def _overlapping(self, view: View) -> bool:
        """Whether a batch's calls may overlap (see :meth:`_park_overlapped`): on one server, no replicas to wait
        for, no reshard under way (whose parks look at two homes)."""
        return not (view.resharding or self.shards.cluster or self.runner.replication.replicas)

    def _park_overlapped(
        self,
        view: View,
        calls: list[tuple[int, list[int]]],
        parcels: list[Parcel],
        results: list[ParkResult | None],
        on_conflict: OnConflict,
        retire: Sequence[int],
    ) -> None:
        """The chunks' park.lua calls one after another, as :meth:`park` makes them, each built while the server
        runs the one before: a park's client work overlaps the server's, as a pipeline's does. A chunk is sent only
        once the one before has been answered, so a refusal stops the batch where it did."""
        head = [on_conflict, self.max_delay_arg, self.pack.min_ahead_ms, " ".join(map(str, retire)), view.generation]
        sent: tuple[int, list[int], ByIdCall] | None = None  # a call holds a connection from its send to its reply
        try:
            for shard, chunk in calls:
                call = self._by_id_call("park", shard, [parcels[p] for p in chunk], head)
                answered = (sent[0], sent[1], sent[2].reply()) if sent is not None else None
                sent = None
                call.send()
                sent = (shard, chunk, call)
                if answered is not None:  # read while the server runs the next call
                    self._answered(results, parcels, *answered)
            if sent is not None:
                answered, sent = (sent[0], sent[1], sent[2].reply()), None
                self._answered(results, parcels, *answered)
        finally:
            if sent is not None:
                sent[2].close()

    def _answered(
        self, results: list[ParkResult | None], parcels: list[Parcel], shard: int, chunk: list[int], reply: Any
    ) -> None:
        _record(results, chunk, self._parked(shard, [parcels[p] for p in chunk], reply))

    def park_occurrence(self, schedule: str, parcel: Parcel, revision: int | None) -> ParkResult:
        """Park a schedule's occurrence in shard 0 (see :meth:`DelayStore.park_occurrence`)."""
        head = [schedule, "" if revision is None else str(revision), self.pack.min_ahead_ms]
        return self._park_call("park_occurrence", 0, [parcel], head)[0]

    def park_chunk(
        self, shard: int, chunk: list[Parcel], on_conflict: OnConflict, *, retire: Sequence[int] = ()
    ) -> list[ParkResult]:
        """Park messages of one shard (``shard``, by the layout the caller read); as :meth:`park`."""
        return self.park(chunk, on_conflict, retire=retire)

    def adopt(self, shard: int, chunk: list[Parcel], deadline_ms: int, tokens: list[int], replicas: int) -> None:
        """Move far rows into Redis (``adopt.lua``): the mover's deadline and the rows' tokens. By the layout in
        force: rows refused because it changed are adopted again by the new one (the tokens recorded in every shard
        they go to, so a row adopted twice is parked once)."""
        for attempt in range(LAYOUT_TRIES):
            view = self.shards.view("park")
            groups: dict[int, list[Parcel]] = {}
            for parcel in chunk:
                groups.setdefault(view.home(parcel.id), []).append(parcel)
            head = [deadline_ms, self.pack.min_ahead_ms, " ".join(map(str, tokens)), view.generation]
            try:
                for home, group in groups.items():
                    self._park_call("adopt", home, group, head, replicas=replicas)
                return
            except LayoutChanged as changed:
                if attempt == LAYOUT_TRIES - 1:
                    raise
                self.shards.follow(changed)

    def _park_home(
        self, view: View, shard: int, chunk: list[Parcel], on_conflict: OnConflict, retire: Sequence[int]
    ) -> list[ParkResult]:
        """One park.lua call into ``shard``; during a reshard, the old homes of ids that move looked at too: a
        ``keep`` park looks there first and parks only what is not held; a ``replace`` parks here, then removes a
        copy there (as park.lua would remove it, in flight too)."""
        head = [on_conflict, self.max_delay_arg, self.pack.min_ahead_ms, " ".join(map(str, retire)), view.generation]
        crossing = [parcel.id for parcel in chunk if view.crossing(parcel.id)]
        if not crossing:
            return self._park_call("park", shard, chunk, head)
        if on_conflict == "keep":
            held = self._held_before(view, crossing)
            rest = [parcel for parcel in chunk if parcel.id not in held]
            parked = {result.id: result for result in self._park_call("park", shard, rest, head)} if rest else {}
            return [parked.get(p.id) or ParkResult(p.id, held[p.id], "kept") for p in chunk]
        results = self._park_call("park", shard, chunk, head)
        removed = self.cancel_in(view.old_home, crossing, "replace")
        renewed = [id for id, flag in removed.items() if flag == 2]
        if renewed:  # counted by park.lua as new to Redis: it replaced a copy parked in its old home
            self._recount(shard, len(renewed))
        return [
            ParkResult(result.id, result.due_ms, "replaced") if removed.get(result.id) else result for result in results
        ]

    def _held_before(self, view: View, ids: list[str]) -> dict[str, int]:
        """The ids of ``ids`` held in their old homes (their due time, -1 in flight or dead); those not held there
        looked for in transit, so that a park of them in the new home meets a copy moved meanwhile."""
        held: dict[str, int] = {}
        groups: dict[int, list[str]] = {}
        for id in ids:
            groups.setdefault(view.old_home(id), []).append(id)
        for shard, group in groups.items():
            found = self._held_in(shard, group)
            held.update(found)
            self.rehoming.settle(shard, [id for id in group if id not in found])
        return held

    def _recount(self, shard: int, count: int) -> None:
        try:
            with self.shards.calling("counting replaced messages"):
                pipe = self.shards.client.pipeline(transaction=False)
                pipe.hincrby(self.shards.space(shard, "park").stats, "parked", -count)
                pipe.hincrby(self.shards.space(shard, "park").stats, "replaced", count)
                pipe.execute()
        except DelayBrokerError as error:  # a figure, not a message
            logger.debug("Store %r: counting replaced messages failed: %s", self.shards.keys.namespace, error)

    def _park_call(
        self, script: str, shard: int, chunk: list[Parcel], head: list[Any], *, replicas: int | None = None
    ) -> list[ParkResult]:
        """A call of one of the park scripts, which all take the messages after ``head`` and answer alike."""
        ids, args, targets, binaries = self._park_arguments(shard, chunk, head)
        reply = self.runner.by_id(script, shard, ids, args, targets=targets, replicas=replicas, binaries=binaries)
        return self._parked(shard, chunk, reply)

    def _by_id_call(self, script: str, shard: int, chunk: list[Parcel], head: list[Any]) -> ByIdCall:
        """:meth:`_park_call` to be sent and answered later (see :meth:`Runner.by_id_call`)."""
        ids, args, targets, binaries = self._park_arguments(shard, chunk, head)
        return self.runner.by_id_call(script, shard, ids, args, targets=targets, binaries=binaries)

    def _park_arguments(
        self, shard: int, chunk: list[Parcel], head: list[Any]
    ) -> tuple[list[str], list[Any], list[str], list[bytes]]:
        """A park script call's ids, arguments (``head``, then each message's), target packs and 16-byte ids."""
        args = list(head)
        for parcel in chunk:
            args.extend((parcel.id, parcel.due.wire, parcel.record))
        ids = [parcel.id for parcel in chunk]
        binaries = [binary_id(id) for id in ids]
        return ids, args, self.pack_targets(shard, [parcel.due for parcel in chunk], binaries), binaries

    def _parked(self, shard: int, chunk: list[Parcel], reply: Any) -> list[ParkResult]:
        """What a park script's ``reply`` says of each message of ``chunk``, its wake relayed, an index partition
        filled past its size split and damaged packs reported."""
        woke, over, fullest, damaged = reply[-4:]
        self.shards.relay_wake(shard, woke)
        if int(over) >= 0:
            self.runner.split_index(shard, int(over), int(fullest))
        if damaged:
            self._report_damage(shard, text(damaged))
        dues, codes = reply[0 : 2 * len(chunk) : 2], reply[1 : 2 * len(chunk) : 2]
        return [
            ParkResult(parcel.id, int(due), OUTCOMES[int(code)])
            for parcel, due, code in zip(chunk, dues, codes, strict=True)
        ]

    def _report_damage(self, shard: int, names: str) -> None:
        space = self.shards.spaces[shard]
        logger.warning(
            "Store %r: the bookkeeping of pack(s) %s is damaged (%s, %s); their messages were parked in the "
            "ordinary layout. Run `delay-broker check` to see the damage, `delay-broker check --repair` to mend it.",
            self.shards.keys.namespace,
            ", ".join(space.pack(name) for name in names.split()),
            space.pack_base,
            space.pack_live,
        )

    def pack_targets(self, shard: int, dues: Sequence[Due], binaries: Sequence[bytes]) -> list[str]:
        """Per message (its due time and 16-byte id), the pack it is appended to (see :meth:`Rehoming.targets`)."""
        return self.rehoming.targets(shard, dues, binaries)

    # -- other writes by id ----------------------------------------------------------------------------

    def cancel(self, ids: list[str], *, replacing: bool = False) -> list[int]:
        """Remove the parked or dead copies of ``ids`` from Redis; ``replacing`` (by a far row) also those a
        promoter holds, as a park in Redis would replace them. Per id: 2 = removed while parked, 1 = removed
        while dead or in flight, 0 = not held. Each id is looked for where it may be (its home, shard 0 where a
        schedule's occurrences live, and during a reshard its old home first)."""
        mode = "replace" if replacing else "cancel"
        removed = dict.fromkeys(ids, 0)

        def look(shard: int, group: list[str]) -> list[str]:
            found = self._cancel_at(shard, group, mode)
            removed.update(found)
            return [id for id in group if not found[id]]

        self.rehoming.search(ids, look)
        return [removed[id] for id in ids]

    def cancel_in(self, shard_of: Callable[[str], int], ids: list[str], mode: str) -> dict[str, int]:
        """cancel.lua on ``ids``, each in the shard ``shard_of`` it: its flag."""
        groups: dict[int, list[str]] = {}
        for id in ids:
            groups.setdefault(shard_of(id), []).append(id)
        found: dict[str, int] = {}
        for shard, group in groups.items():
            found.update(self._cancel_at(shard, group, mode))
        return found

    def _cancel_at(self, shard: int, ids: list[str], mode: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for chunk in chunks(ids):
            reply = self.runner.by_id("cancel", shard, chunk, [mode, *chunk])
            found.update((id, int(flag)) for id, flag in zip(chunk, reply, strict=True))
        return found

    def reschedule(self, id: str, due: Due, record: bytes, limit: int, expected: bytes) -> int | None:
        """Move ``id``'s parked copy in Redis to ``due`` (``record``, when not empty, replaces its envelope; see
        reschedule.lua): the new due time (ms), or None when Redis holds no parked copy of it."""
        moved_to: list[int] = []

        def look(shard: int, group: list[str]) -> list[str]:
            moved, woke, over = self.runner.by_id(
                "reschedule",
                shard,
                [id],
                [id, due.wire, record, limit, expected, self.pack.min_ahead_ms],
                targets=self.pack_targets(shard, [due], [binary_id(id)]),
            )
            if int(over) >= 0:
                self.runner.split_index(shard, int(over))
            if int(moved) < 0:
                return group
            self.shards.relay_wake(shard, woke)
            moved_to.append(int(moved))
            return []

        self.rehoming.search([id], look)
        return moved_to[0] if moved_to else None

    def held(self, ids: list[str]) -> dict[str, int]:
        """The ids of ``ids`` that Redis holds, with their due time (-1 in flight or dead), as park.lua tells
        held ids apart: one ``held.lua`` call per 1,000 per shard (and shard 0, where occurrences live)."""
        held: dict[str, int] = {}

        def look(shard: int, group: list[str]) -> list[str]:
            found = self._held_in(shard, group)
            held.update(found)
            return [id for id in group if id not in found]

        self.rehoming.search(ids, look)
        return held

    def _held_in(self, shard: int, ids: list[str]) -> dict[str, int]:
        held: dict[str, int] = {}
        for chunk in chunks(ids):
            reply = self.runner.by_id("held", shard, chunk, chunk, write=False)
            held.update((id, int(due)) for id, due in zip(chunk, reply, strict=True) if int(due) != -2)
        return held


def _record(results: list[ParkResult | None], positions: list[int], parked: list[ParkResult]) -> None:
    for position, one in zip(positions, parked, strict=True):
        results[position] = one
