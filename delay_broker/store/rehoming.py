"""Messages re-homed by a reshard, across two Cluster slots without a script that touches both: a batch is taken
out of its old shard into that shard's ``moving`` hash (``rehome_take.lua``), parked into each of its new homes
once (``rehome.lua``, which records the batch's token there in the same script), then dropped from ``moving``.
Killed after any step, the batch is finished by whoever meets it next: the reshard run again, a read by id of one
of its messages, or a promoter (see docs/scaling.md, "Changing the shard count online").

Also the look every read by id makes during a reshard: an id's old home, then its batch in transit if it has one,
then its new home (messages move only that way, so in that order none is missed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import DelayBrokerError, LayoutChanged
from ..packing import Location, PackPolicy, binary_id
from .encoding import Due, Parcel
from .layouts import View
from .replies import text
from .runner import Runner
from .shards import Shards

logger = logging.getLogger("delay_broker.store")

REHOME_BATCH = 500
"""Messages taken out of an old shard in one call at most."""
REHOME_BYTES = 512 * 1024
"""Bytes of records taken in one call at most (beyond the first message): a call blocks its Redis as long as it
copies, as a pack opening does."""
STRANDED_AFTER_MS = 10_000
"""A batch left in transit this long is taken for one a killed reshard left: promoters finish it."""
LAYOUT_TRIES = 5
"""Parks by the layout in force made at most, when each finds it changed (see :meth:`Shards.follow`)."""


@dataclass(frozen=True)
class Moving:
    """One message in transit, as ``rehome_take.lua`` keeps it in its old shard's ``moving`` hash."""

    id: str
    token: str
    dead: bool
    at_ms: int
    """Its due time, or when it died (a dead letter)."""
    attempts: int
    taken_ms: int
    error: str
    envelope: bytes

    @classmethod
    def parse(cls, id: str, value: bytes) -> Moving:
        token, kind, at, attempts, taken, length, rest = value.split(b" ", 6)
        size = int(length)
        return cls(
            id,
            token.decode(),
            kind == b"x",
            int(at),
            int(attempts),
            int(taken),
            rest[:size].decode(errors="replace"),
            rest[size:],
        )

    def parcel(self) -> Parcel:
        return Parcel(self.id, Due(self.at_ms, absolute=True), self.envelope)


@dataclass(frozen=True)
class Taken:
    """What ``rehome_take.lua`` did with the ids it was given."""

    moving: list[Moving]
    in_flight: list[str]
    """Left where they are: a promoter holds them."""
    left: list[str]
    """Not taken: the batch's bytes were spent (for another batch)."""


class Rehoming:
    """The steps of a batch, and batches in transit finished by anyone.

    Parameters:
      shards, runner: the namespace's shards and the script runner.
      pack: the packing policy (re-homed messages due far ahead are packed again).
    """

    def __init__(self, shards: Shards, runner: Runner, pack: PackPolicy) -> None:
        self.shards = shards
        self.runner = runner
        self.pack = pack

    def targets(self, shard: int, dues: Sequence[Due], binaries: Sequence[bytes]) -> list[str]:
        """Per message (its due time and 16-byte id), the pack it is appended to when it is due at least
        ``pack_after`` ahead (by the Redis clock as estimated here: the script decides by its own), else the
        shard's ``packs`` key (none)."""
        space = self.shards.space(shard, "park")
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

    # -- a batch's three steps -------------------------------------------------------------------------

    def take(
        self,
        shard: int,
        ids: Sequence[str],
        token: str,
        budget: int = REHOME_BYTES,
        packed: Sequence[Location | None] | None = None,
    ) -> Taken:
        """Take ``ids`` (of one old shard, at most :data:`REHOME_BATCH`) into its ``moving`` hash under ``token``
        (``packed``: where each was seen packed, saving a call)."""
        reply = self.runner.by_id("rehome_take", shard, list(ids), [token, budget, *ids], packed=packed)
        codes = [int(code) for code in reply[: len(ids)]]
        values = iter(reply[len(ids) :])
        moving = [Moving.parse(id, next(values)) for id, code in zip(ids, codes, strict=True) if code in (2, 3)]
        in_flight = [id for id, code in zip(ids, codes, strict=True) if code == 1]
        left = [id for id, code in zip(ids, codes, strict=True) if code == 4]
        return Taken(moving, in_flight, left)

    def put(self, shard: int, token: str, batch: Sequence[Moving]) -> int:
        """Park ``batch`` (the part of a batch whose new home is ``shard``) there, unless its token is there already;
        how many messages were written (0 when the token was there)."""
        for attempt in range(LAYOUT_TRIES):
            view = self.shards.view("re-homing messages")
            try:
                return self._put(view, shard, token, batch)
            except LayoutChanged as changed:
                if attempt == LAYOUT_TRIES - 1:
                    raise
                self.shards.follow(changed)
        raise AssertionError("unreachable")

    def _put(self, view: View, shard: int, token: str, batch: Sequence[Moving]) -> int:
        ids = [message.id for message in batch]
        binaries = [binary_id(id) for id in ids]
        dues = [Due(message.at_ms, absolute=True) for message in batch]
        targets = [
            target if not message.dead else self.shards.space(shard, "park").packs
            for target, message in zip(self.targets(shard, dues, binaries), batch, strict=True)
        ]
        args: list[object] = [view.generation, token, self.pack.min_ahead_ms, len(batch)]
        args.extend(f"{'x' if message.dead else 'd'} {message.attempts}" for message in batch)
        args.extend(message.error for message in batch)
        for message in batch:
            args.extend((message.id, f"@{message.at_ms}", message.envelope))
        # Confirmed by a replica whenever the new home's master has one (as far-tier moves are): the batch is dropped
        # from its old shard next, and a failover losing this write would lose the messages.
        replication = self.runner.replication
        replicas = replication.replicas or replication.present(shard)
        reply = self.runner.by_id("rehome", shard, ids, args, targets=targets, binaries=binaries, replicas=replicas)
        if len(reply) == 1:
            return 0
        woke, over, fullest, _ = reply[-4:]
        self.shards.relay_wake(shard, woke)
        if int(over) >= 0:
            self.runner.split_index(shard, int(over), int(fullest))
        codes = reply[1 : 2 * len(batch) : 2]
        return sum(1 for code, message in zip(codes, batch, strict=True) if int(code) == 1 or message.dead)

    def drop(self, shard: int, ids: Sequence[str]) -> None:
        """The batch's entries out of the old shard's ``moving`` hash: every message of it is in its new home."""
        if ids:
            with self.shards.calling("re-homing messages"):
                self.shards.client.hdel(self.shards.space(shard, "re-homing messages").moving, *ids)

    def carry(self, shard: int, batch: Sequence[Moving]) -> int:
        """A batch taken out of ``shard`` parked into its new homes (each part once), then dropped; how many
        messages were written (those kept, as their new home held their id, and those of parts parked before, are
        not counted)."""
        view = self.shards.view("re-homing messages")
        if view.new is None:  # a view older than the reshard: the layout as it is now
            self.shards.refresh()
            view = self.shards.view("re-homing messages")
        by_home: dict[int, list[Moving]] = {}
        for message in batch:
            by_home.setdefault(view.new_home(message.id), []).append(message)
        if view.new is None or shard in by_home:
            # Never dropped unless parked elsewhere: left in transit for a look by the layout of the reshard.
            raise DelayBrokerError(
                f"namespace {self.shards.keys.namespace!r}: messages in transit out of shard {shard} "
                f"({self.shards.space(shard, 'reading').moving}) but the layout ({view.layout.describe()}) gives them "
                "no other home: left there; run `delay-broker reshard` to finish the reshard"
            )
        written = 0
        for home, part in by_home.items():
            written += self.put(home, part[0].token, part)
        self.drop(shard, [message.id for message in batch])
        return written

    # -- batches in transit ----------------------------------------------------------------------------

    def in_transit(self, shard: int) -> dict[str, list[Moving]]:
        """The batches in transit out of ``shard``, by token."""
        space = self.shards.space(shard, "reading messages in transit")
        with self.shards.calling("reading messages in transit"):
            found: dict[bytes, bytes] = self.shards.client.hgetall(space.moving)  # type: ignore[assignment]
        batches: dict[str, list[Moving]] = {}
        for id, value in found.items():
            message = Moving.parse(text(id), value)
            batches.setdefault(message.token, []).append(message)
        return batches

    def finish(self, shard: int, tokens: set[str] | None = None, *, taken_before_ms: int | None = None) -> int:
        """Finish the batches in transit out of ``shard`` (those of ``tokens``; those taken before ``taken_before_ms``):
        parked into their new homes where they are not yet, and dropped. How many messages were written."""
        written = 0
        for token, batch in self.in_transit(shard).items():
            if tokens is not None and token not in tokens:
                continue
            if taken_before_ms is not None and max(message.taken_ms for message in batch) >= taken_before_ms:
                continue
            written += self.carry(shard, batch)
        return written

    def settle(self, shard: int, ids: Sequence[str]) -> None:
        """After ``ids`` were not found in ``shard``, their old home: the batches in transit holding any of them
        finished, so that they are in their new home when it is looked at."""
        space = self.shards.space(shard, "reading messages in transit")
        with self.shards.calling("reading messages in transit"):
            values: list[bytes | None] = self.shards.client.hmget(space.moving, list(ids))  # type: ignore[assignment]
        tokens = {value.split(b" ", 1)[0].decode() for value in values if value}
        if tokens:
            self.finish(shard, tokens)

    def rescue(self) -> int:
        """Finish the batches a killed reshard left in transit (promoters call it every ``max_idle``): only while
        messages move, one ``HLEN`` per old shard. How many messages were written."""
        view = self.shards.view()
        if not view.moving or view.old is None:
            return 0
        written = 0
        edge = self.shards.estimated_now_ms() - STRANDED_AFTER_MS
        for shard in view.old:
            try:
                with self.shards.calling("reading messages in transit"):
                    left = int(self.shards.client.hlen(self.shards.space(shard, "rescue").moving))
                if left:
                    written += self.finish(shard, taken_before_ms=edge)
            except DelayBrokerError as error:
                logger.debug("Store %r: finishing batches in transit failed: %s", self.shards.keys.namespace, error)
        return written

    # -- reads by id -----------------------------------------------------------------------------------

    def search(self, ids: Sequence[str], look: Callable[[int, list[str]], list[str]]) -> None:
        """Look for ``ids`` in the shards that may hold them, each in its order (see
        :meth:`~.layouts.View.to_search`): ``look(shard, ids)`` does there what the caller does and returns the ids
        it did not find, looked for in the next shard. After an id's old home during a reshard, its batch in
        transit is finished first."""
        view = self.shards.view()
        orders = {id: view.to_search(id) for id in dict.fromkeys(ids)}
        pending = list(orders)
        step = 0
        while pending:
            groups: dict[int, list[str]] = {}
            for id in pending:
                if step < len(orders[id]):
                    groups.setdefault(orders[id][step], []).append(id)
            pending = []
            for shard, group in groups.items():
                missed = look(shard, group)
                if missed and step == 0 and view.in_transit_after(shard):
                    self.settle(shard, missed)
                pending.extend(missed)
            step += 1
