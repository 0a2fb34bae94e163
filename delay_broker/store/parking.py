"""Parking in Redis: the one-message fast path, batches, a schedule's occurrences, far rows adopted; and the other
writes by id in Redis (cancel, reschedule) and the look at which ids Redis holds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from ..errors import DelayBrokerError, StoreUnavailable
from ..keys import shard_of
from ..packing import NOT_PACKABLE, PackPolicy, binary_id
from ..records import OnConflict, ParkResult
from .encoding import Due, Parcel
from .replies import MAX_BATCH, chunks, text
from .runner import Runner
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
      pack: the packing policy (which messages go to packs).
      max_delay_arg: ``max_delay`` as the scripts take it (ms, or -1 for none).
    """

    def __init__(self, shards: Shards, runner: Runner, pack: PackPolicy, max_delay_arg: int) -> None:
        self.shards = shards
        self.runner = runner
        self.pack = pack
        self.max_delay_arg = max_delay_arg

    # -- parks -----------------------------------------------------------------------------------------

    def park_one(self, parcel: Parcel) -> ParkResult | None:
        """A park of one id the store does not hold, untraced (every adapter's delayed send: Dramatiq's delay,
        Celery's eta), in one call of ``pack_one.lua`` or ``park_one.lua``: a third of park.lua's server time.
        None when the script leaves the message to park.lua (the id is held, or anything unusual; nothing was
        written)."""
        call = self.one_call(parcel)
        try:
            reply = self.runner.run(call.script, call.shard, call.args, extra=call.extra)
        except StoreUnavailable:
            raise
        except DelayBrokerError:  # a refusal: park.lua, which wrote nothing either, says what it is
            return None
        return self.one_result(call, parcel, reply)

    def one_call(self, parcel: Parcel) -> OneCall:
        """The one-message script call that parks ``parcel`` (see :meth:`park_one`), made by it or in a batch."""
        self.shards.settle_for_parking()
        spaces = self.shards.layout("park")
        shard = 0 if len(spaces) == 1 else shard_of(parcel.id, len(spaces))
        space = spaces[shard]
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
            return OneCall("park_one", shard, [*head, self.max_delay_arg], [partition], -1)
        args = [*head, name, self.pack.min_ahead_ms, self.max_delay_arg]
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

    def park(self, parcels: list[Parcel], on_conflict: OnConflict) -> list[ParkResult]:
        """Park each message with park.lua: one call per 1,000 per shard, each chunk all or nothing."""
        if len(self.shards.layout("park")) == 1:
            results: list[ParkResult] = []
            for start in range(0, len(parcels), MAX_BATCH):
                results.extend(self.park_chunk(0, parcels[start : start + MAX_BATCH], on_conflict))
            return results
        by_position: dict[int, ParkResult] = {}
        groups: dict[int, list[int]] = {}
        for position, parcel in enumerate(parcels):
            groups.setdefault(self.shards.shard_for(parcel.id), []).append(position)
        for shard, positions in groups.items():
            for chunk in chunks(positions):
                parked = self.park_chunk(shard, [parcels[p] for p in chunk], on_conflict)
                by_position.update(zip(chunk, parked, strict=True))
        return [by_position[position] for position in range(len(parcels))]

    def park_occurrence(self, schedule: str, parcel: Parcel, revision: int | None) -> ParkResult:
        """Park a schedule's occurrence in shard 0 (see :meth:`DelayStore.park_occurrence`)."""
        head = [schedule, "" if revision is None else str(revision), self.pack.min_ahead_ms]
        return self._park_call("park_occurrence", 0, [parcel], head)[0]

    def park_chunk(
        self, shard: int, chunk: list[Parcel], on_conflict: OnConflict, *, retire: Sequence[int] = ()
    ) -> list[ParkResult]:
        """One park.lua call; ``retire`` are the tokens of far rows the park replaces (see park.lua)."""
        head = [on_conflict, self.max_delay_arg, self.pack.min_ahead_ms, " ".join(map(str, retire))]
        return self._park_call("park", shard, chunk, head)

    def adopt(self, shard: int, chunk: list[Parcel], deadline_ms: int, tokens: list[int], replicas: int) -> None:
        """Move far rows into Redis (``adopt.lua``): the mover's deadline and the rows' tokens."""
        head = [deadline_ms, self.pack.min_ahead_ms, " ".join(map(str, tokens))]
        self._park_call("adopt", shard, chunk, head, replicas=replicas)

    def _park_call(
        self, script: str, shard: int, chunk: list[Parcel], head: list[Any], *, replicas: int | None = None
    ) -> list[ParkResult]:
        """A call of one of the park scripts, which all take the messages after ``head`` and answer alike."""
        args = list(head)
        for parcel in chunk:
            args.extend((parcel.id, parcel.due.wire, parcel.record))
        ids = [parcel.id for parcel in chunk]
        binaries = [binary_id(id) for id in ids]
        targets = self.pack_targets(shard, [parcel.due for parcel in chunk], binaries)
        reply = self.runner.by_id(script, shard, ids, args, targets=targets, replicas=replicas, binaries=binaries)
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
        """Per message (its due time and 16-byte id), the pack it is appended to when it is due at least
        ``pack_after`` ahead (by the Redis clock as estimated here: the script decides by its own), else the
        shard's ``packs`` key (none)."""
        space = self.shards.spaces[shard]
        after = self.pack.after_ms
        if after is None:
            return [space.packs] * len(dues)
        now = self.shards.estimated_now_ms()
        targets = []
        for due, binary in zip(dues, binaries, strict=True):
            at = due.at(now)
            name = self.pack.target(binary, at, now) if at - now >= after else None  # the cheap test first
            targets.append(space.packs if name is None else space.pack(name))
        return targets

    # -- other writes by id ----------------------------------------------------------------------------

    def cancel(self, ids: list[str], *, replacing: bool = False) -> list[int]:
        """Remove the parked or dead copies of ``ids`` from Redis; ``replacing`` (by a far row) also those a
        promoter holds, as a park in Redis would replace them. Per id: 2 = removed while parked, 1 = removed
        while dead or in flight, 0 = not held."""
        mode = "replace" if replacing else "cancel"
        removed: dict[str, int] = {}
        for shard, group in self.shards.by_shard(ids).items():
            missed: list[str] = []
            for chunk in chunks(group):
                reply = self.runner.by_id("cancel", shard, chunk, [mode, *chunk])
                for id, flag in zip(chunk, reply, strict=True):
                    removed[id] = int(flag)
                    if not int(flag):
                        missed.append(id)
            if shard != 0 and missed:  # a schedule's occurrence lives in shard 0
                for chunk in chunks(missed):
                    for id, flag in zip(chunk, self.runner.by_id("cancel", 0, chunk, [mode, *chunk]), strict=True):
                        removed[id] = int(flag)
        return [removed[id] for id in ids]

    def reschedule(self, id: str, due: Due, record: bytes, limit: int, expected: bytes) -> int | None:
        """Move ``id``'s parked copy in Redis to ``due`` (``record``, when not empty, replaces its envelope; see
        reschedule.lua): the new due time (ms), or None when Redis holds no parked copy of it."""
        for shard in self.shards.to_search(id):
            moved, woke, over = self.runner.by_id(
                "reschedule",
                shard,
                [id],
                [id, due.wire, record, limit, expected, self.pack.min_ahead_ms],
                targets=self.pack_targets(shard, [due], [binary_id(id)]),
            )
            if int(over) >= 0:
                self.runner.split_index(shard, int(over))
            if int(moved) >= 0:
                self.shards.relay_wake(shard, woke)
                return int(moved)
        return None

    def held(self, ids: list[str]) -> dict[str, int]:
        """The ids of ``ids`` that Redis holds, with their due time (-1 in flight or dead), as park.lua tells
        held ids apart: one ``held.lua`` call per 1,000 per shard (and shard 0, where occurrences live)."""
        held: dict[str, int] = {}
        for group in self.shards.by_shard(ids).values():
            for number in self.shards.to_search(group[0]):
                for chunk in chunks([id for id in group if id not in held]):
                    reply = self.runner.by_id("held", number, chunk, chunk, write=False)
                    for id, due in zip(chunk, reply, strict=True):
                        if int(due) != -2:
                            held[id] = int(due)
        return held
