"""The promoters' side of packs: opening the packs coming due into the ordinary layout (see
:mod:`delay_broker.packing`), and saying so when one is found damaged."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..packing import NOT_PACKABLE, IndexReshaped, PackPolicy
from .migration import BRIEF_WAIT
from .replies import text
from .runner import PACK_CALLS, Runner
from .shards import Shards

logger = logging.getLogger("delay_broker.store")

PACK_OPEN_CHUNK = 100
"""Records one ``open_pack.lua`` call moves at most: about 3.5 ms of Redis time (500 took 18 ms, which every
promotion of the server waited for), some 25,000 records a second per promoter."""

PACK_OPEN_BYTES = 512 * 1024
"""Bytes of records one ``open_pack.lua`` call copies at most (but for its first record): a call blocks Redis
for as long as it copies, and 100 records of 1 MiB held it for two seconds."""

AUDIT_INTERVAL = 60.0
"""Seconds between two looks (by each promoter, per shard) for packs that PACKS no longer lists (pack_audit.lua)."""

DAMAGED_PACK_PAUSE = 60.0
"""Seconds a promoter passes over a pack whose bookkeeping it found damaged (it is said once a pause): the packs
after it are opened meanwhile, and the damaged one again once `delay-broker check --repair` mended it."""


class PackOpener:
    """Opens a shard's packs once their earliest message is due within the policy's lead."""

    def __init__(self, shards: Shards, runner: Runner, pack: PackPolicy) -> None:
        self.shards = shards
        self.runner = runner
        self.pack = pack
        self._damaged: dict[tuple[int, str], float] = {}
        """Packs found damaged, by shard and name, with the end of their pause (monotonic)."""
        self._audited: dict[int, float] = {}

    def open(self, shard: int, calls: int) -> int | None:
        """Open at most ``calls`` chunks of the shard's packs coming due; when the next is to be opened (ms, Redis
        clock; now or earlier when there is more to open already), or None when nothing is packed."""
        lead = self.pack.lead_ms
        self._audit(shard)
        for _ in range(calls):
            now = self.shards.estimated_now_ms()
            head = self._next(shard)
            if head is None:
                return None
            name, earliest = head
            if earliest - lead > now:
                return earliest - lead
            self.open_chunk(shard, name)
        return now

    def _audit(self, shard: int) -> None:
        """Now and then, list again the packs PACKS lost (damage), so that they are opened; say so."""
        now = time.monotonic()
        if now - self._audited.get(shard, float("-inf")) < AUDIT_INTERVAL:
            return
        self._audited[shard] = now
        listed = self.runner.run("pack_audit", shard, [], migration_wait=BRIEF_WAIT)
        if listed:
            logger.error(
                "Store %r: %d pack(s) held messages but %s did not list them (damage): listed again, to be opened: %s",
                self.shards.keys.namespace,
                len(listed),
                self.shards.spaces[shard].packs,
                ", ".join(text(name) for name in listed),
            )

    def _next(self, shard: int) -> tuple[str, int] | None:
        """The shard's first pack to open, passing over those paused as damaged."""
        now = time.monotonic()
        self._damaged = {at: until for at, until in self._damaged.items() if until > now}
        paused = {name for (number, name) in self._damaged if number == shard}
        packs = self.listed(shard, first=len(paused) + 1)
        return next(((name, earliest) for name, earliest in packs if name not in paused), None)

    def listed(self, shard: int, *, first: int | None = None) -> list[tuple[str, int]]:
        """The shard's packs with their earliest due times, earliest first (``first``: those only)."""
        with self.shards.calling("looking at packs"):
            packs: list[tuple[bytes, float]] = self.shards.client.zrange(  # type: ignore[assignment]
                self.shards.spaces[shard].packs, 0, -1 if first is None else first - 1, withscores=True
            )
        return [(text(name), int(earliest)) for name, earliest in packs]

    def open_chunk(self, shard: int, name: str) -> None:
        """One chunk of pack ``name`` into the ordinary layout: its head's ids read first, then moved by a call
        given their index partitions (refused if another promoter took that head meanwhile)."""
        space = self.shards.spaces[shard]
        pack = space.pack(name)
        # A promoter's call, as are the opening's: a slot migrating is waited for by its backoff, not here.
        head = ["peek", name, PACK_OPEN_CHUNK, PACK_OPEN_BYTES]
        peeked = self.runner.run("open_pack", shard, head, extra=[pack], write=False, migration_wait=BRIEF_WAIT)
        if int(peeked[0]) == -2:
            self._pause(shard, name, text(peeked[1]))
            return
        base, ids = peeked
        binaries = [ids[n : n + 16] for n in range(0, len(ids), 16)]
        for _ in range(PACK_CALLS):
            shape = self.runner.shape(shard)
            partitions = [
                space.packed(shape.partition(binary)) if binary != NOT_PACKABLE else space.packs for binary in binaries
            ]
            try:
                args = ["open", name, len(binaries), base, ids, str(shape)]
                extra = [pack, *partitions]
                reply = self.runner.run("open_pack", shard, args, extra=extra, migration_wait=BRIEF_WAIT)
            except IndexReshaped as reshaped:
                self.runner.reshaped(shard, reshaped.shape)
                continue
            self._opened(shard, name, reply)
            return

    def _opened(self, shard: int, name: str, reply: Any) -> None:
        code = int(reply[0])
        if code == -2:
            self._pause(shard, name, text(reply[1]))
        elif code >= 0:
            self.shards.relay_wake(shard, reply[3])
            damaged, lost = int(reply[4]), int(reply[5])
            if damaged or lost:
                logger.error(
                    "Store %r: pack %s was damaged: %d record(s) without their index entry (dead-lettered when "
                    "readable: see `delay-broker dead ls`), %d message(s) counted in it were not found (lost). Run "
                    "`delay-broker check` for the rest of the store.",
                    self.shards.keys.namespace,
                    self.shards.spaces[shard].pack(name),
                    damaged,
                    lost,
                )

    def _pause(self, shard: int, name: str, problem: str) -> None:
        if (shard, name) not in self._damaged:
            logger.error(
                "Store %r: pack %s is not opened: %s. Its messages wait until it is mended: run `delay-broker check "
                "--repair`.",
                self.shards.keys.namespace,
                self.shards.spaces[shard].pack(name),
                problem,
            )
        self._damaged[(shard, name)] = time.monotonic() + DAMAGED_PACK_PAUSE
