"""The promoters' side of packs: opening the packs coming due into the ordinary layout (see
:mod:`delay_broker.packing`)."""

from __future__ import annotations

from ..packing import NOT_PACKABLE, IndexReshaped, PackPolicy
from .replies import text
from .runner import PACK_CALLS, Runner
from .shards import Shards

PACK_OPEN_CHUNK = 100
"""Records one ``open_pack.lua`` call moves at most: about 3.5 ms of Redis time (500 took 18 ms, which every
promotion of the server waited for), some 25,000 records a second per promoter."""


class PackOpener:
    """Opens a shard's packs once their earliest message is due within the policy's lead."""

    def __init__(self, shards: Shards, runner: Runner, pack: PackPolicy) -> None:
        self.shards = shards
        self.runner = runner
        self.pack = pack

    def open(self, shard: int, calls: int) -> int | None:
        """Open at most ``calls`` chunks of the shard's packs coming due; when the next is to be opened (ms, Redis
        clock; now or earlier when there is more to open already), or None when nothing is packed."""
        lead = self.pack.lead_ms
        for _ in range(calls):
            now = self.shards.estimated_now_ms()
            head = self.listed(shard, first_only=True)
            if not head:
                return None
            name, earliest = head[0]
            if earliest - lead > now:
                return earliest - lead
            self.open_chunk(shard, name)
        return now

    def listed(self, shard: int, *, first_only: bool = False) -> list[tuple[str, int]]:
        """The shard's packs with their earliest due times, earliest first (``first_only``: that one only)."""
        with self.shards.calling("looking at packs"):
            packs: list[tuple[bytes, float]] = self.shards.client.zrange(  # type: ignore[assignment]
                self.shards.spaces[shard].packs, 0, 0 if first_only else -1, withscores=True
            )
        return [(text(name), int(earliest)) for name, earliest in packs]

    def open_chunk(self, shard: int, name: str) -> None:
        """One chunk of pack ``name`` into the ordinary layout: its head's ids read first, then moved by a call
        given their index partitions (refused if another promoter took that head meanwhile)."""
        space = self.shards.spaces[shard]
        pack = space.pack(name)
        base, ids = self.runner.run("open_pack", shard, ["peek", name, PACK_OPEN_CHUNK], extra=[pack], write=False)
        binaries = [ids[n : n + 16] for n in range(0, len(ids), 16)]
        for _ in range(PACK_CALLS):
            shape = self.runner.shape(shard)
            partitions = [
                space.packed(shape.partition(binary)) if binary != NOT_PACKABLE else space.packs for binary in binaries
            ]
            try:
                reply = self.runner.run(
                    "open_pack", shard, ["open", name, len(binaries), base, ids, str(shape)], extra=[pack, *partitions]
                )
            except IndexReshaped as reshaped:
                self.runner.reshaped(shard, reshaped.shape)
                continue
            if int(reply[0]) >= 0:
                self.shards.relay_wake(shard, reply[3])
            return
