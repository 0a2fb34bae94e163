"""What ``delay-broker check`` reads of one shard's packs (see :mod:`.checking`): the packed index, the packs'
bookkeeping and every record, read-only and in bounded pieces: Redis is blocked for one ``LRANGE`` of at most
:data:`CHUNK_BYTES` at a time, and no reply holds a whole pack.

It holds the packed index of the shard in memory (about 200 bytes per packed message) and, of each pack, only
its counts and the records that are not its messages (damage is rare): a pack of millions of records costs no
more than its share of the index.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..connect import AnyRedis
from ..keys import Keyspace
from ..packing import IndexShape, id_text
from .packs import PACK_OPEN_BYTES
from .replies import int_or_none

CHUNK_BYTES = PACK_OPEN_BYTES
"""Bytes of records one ``LRANGE`` of the check reads at most (but for its first record), as one call opening a
pack copies: Redis is blocked while it copies."""

MAX_CHUNK = 1000
"""Records one ``LRANGE`` reads at most."""

BATCH = 200
"""Commands sent in one pipeline."""

SHAPE_TEXT = re.compile(rb"(\d+):(\d+)\Z")
ID_BYTES = 16
RECORD_HEADER = 22
"""A packed record's id (16 bytes) and due time (6): its envelope follows (``PACK_HEADER`` in the Lua helpers)."""

FIXED_TYPES = {"packs": "zset", "pack_base": "hash", "pack_live": "hash", "packed_shape": "string", "msg": "hash"}
FIXED_TYPES |= {"dead": "zset", "stats": "hash"}


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN ``MATCH`` pattern: a namespace or prefix may hold ``*``, ``?``, ``[``.
    Braces are literal in Redis's patterns, and left so: a Cluster node (Redis 7.4 and later) then scans only
    the slot of the pattern's hash tag, which an escape before or in the tag would keep it from seeing."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def parse_shape(raw: bytes | None) -> IndexShape | None:
    """The packed index's shape as stored (``0:0`` when absent), or None when malformed (as ``index_shape`` in
    the Lua helpers judges it)."""
    match = SHAPE_TEXT.match(raw if raw is not None else b"0:0")
    if match is None:
        return None
    level, split = int(match[1]), int(match[2])
    return IndexShape(level, split) if level <= 30 and split < 1 << level else None


def shape_from(partitions: Sequence[int]) -> IndexShape:
    """The shape whose partitions are those present: as many as the highest number present says (an absent
    partition above it is an empty one, which Redis deletes; an entry it would hold is placed alike in the
    partition it split from)."""
    count = max(partitions, default=0) + 1
    level = count.bit_length() - 1
    return IndexShape(level, count - (1 << level))


def pack_prefix(name: str) -> bytes:
    """The first 8 bytes of every index entry pointing into pack ``name`` (its width and slot)."""
    width, slot = name.split(":")
    return struct.pack(">II", int(width), int(slot))


def location(prefix: bytes, position: int) -> bytes:
    return prefix + position.to_bytes(4, "big")


@dataclass(frozen=True)
class Suspect:
    """A record that is not its pack's message by the index: orphaned, a stale copy, or unreadable."""

    pack: str
    position: int
    head: bytes
    """Its first 16 bytes (its id), fewer for a shorter record."""
    length: int
    due: int | None


@dataclass
class PackRead:
    """One pack as read: its bookkeeping (raw fields; None where absent) and what its records showed."""

    name: str
    key: str
    length: int
    base_raw: bytes | None
    live_raw: bytes | None
    listed: int | None
    tail_sha: str
    base: int = 0
    """The base the records were read by: the stored one, or the one the index entries show."""
    live: int = 0
    earliest: int | None = None
    witness: tuple[int, bytes] | None = None
    """A live record's list index and id, whose entry shows :attr:`base`."""
    suspects: list[Suspect] = field(default_factory=list)
    record_bytes: int = 0

    @property
    def average(self) -> int:
        """The average size of its records (bytes), for bounding the work of a repair call."""
        return self.record_bytes // max(1, self.length)

    @property
    def stored_base(self) -> int | None:
        return int_or_none(self.base_raw) if self.base_raw is not None else 0


@dataclass
class IndexRead:
    """The packed index as read: entries in their id's partition (those found pointing at a record of their id
    move from ``unverified`` to ``verified``), and entries in another partition (``misplaced``)."""

    shape: IndexShape
    unverified: dict[bytes, bytes] = field(default_factory=dict)
    verified: dict[bytes, bytes] = field(default_factory=dict)
    misplaced: dict[bytes, list[tuple[int, bytes]]] = field(default_factory=dict)
    misplaced_live: set[tuple[bytes, bytes]] = field(default_factory=set)
    """Misplaced entries (id, value) found pointing at a record of their id."""

    def value(self, id: bytes) -> bytes | None:
        """The entry of ``id`` in its own partition (what every script reads), or None."""
        return self.unverified.get(id) or self.verified.get(id)

    @property
    def entries(self) -> int:
        return len(self.unverified) + len(self.verified) + sum(map(len, self.misplaced.values()))


@dataclass
class ShardRead:
    """What the check read of one shard."""

    space: Keyspace
    shape_raw: bytes | None
    wrong_types: list[tuple[str, str, str]] = field(default_factory=list)
    """Keys of a type other than the store's: (key, its type, the type expected)."""
    partitions: list[int] = field(default_factory=list)
    index: IndexRead = field(default_factory=lambda: IndexRead(IndexShape()))
    packs: dict[str, PackRead] = field(default_factory=dict)
    listed: dict[str, int] = field(default_factory=dict)
    bases: dict[bytes, bytes] = field(default_factory=dict)
    lives: dict[bytes, bytes] = field(default_factory=dict)
    held: set[bytes] = field(default_factory=set)
    """Ids (16 bytes) of suspects and broken entries that the store holds outside the packs."""
    records: int = 0
    damaged_counter: int = 0


@dataclass
class _Pass:
    """One reading of a pack's records by a base."""

    base: int
    votes: Counter[int] = field(default_factory=Counter)
    live: list[bytes] = field(default_factory=list)
    misplaced_live: list[tuple[bytes, bytes]] = field(default_factory=list)
    earliest: int | None = None
    witness: tuple[int, bytes] | None = None
    suspects: list[Suspect] = field(default_factory=list)
    record_bytes: int = 0


class ShardReader:
    """Reads one shard of a store for the check (see :func:`read_shard`)."""

    def __init__(self, client: AnyRedis, space: Keyspace, cluster: bool) -> None:
        self.client = client
        self.space = space
        self.cluster = cluster

    def read(self) -> ShardRead:
        space, client = self.space, self.client
        partition_keys = self._scan("packed:", r"packed:(\d+)")
        pack_keys = self._scan("pack:", r"pack:(\d+:\d+)")
        wrong = self._wrong_fixed_types() + self._wrong_types(partition_keys, "hash")
        wrong += self._wrong_types(pack_keys, "list")
        if wrong:  # every script touching them refuses: mended by hand first (the refusal says how)
            return ShardRead(space, None, wrong)
        read = ShardRead(space, client.get(space.packed_shape))  # type: ignore[arg-type]
        read.damaged_counter = int_or_none(client.hget(space.stats, "pack_damaged") or b"0") or 0
        read.partitions = sorted(int(number) for number in partition_keys)
        shape = parse_shape(read.shape_raw)
        read.index = self._read_index(shape or shape_from(read.partitions), partition_keys)
        if shape is None:
            return read  # every id is looked for in the wrong partition: mend the shape, then look again
        read.listed = {name.decode(errors="replace"): int(score) for name, score in self._listed()}
        read.bases = client.hgetall(space.pack_base)  # type: ignore[assignment]
        read.lives = client.hgetall(space.pack_live)  # type: ignore[assignment]
        for name, key in sorted(pack_keys.items(), key=lambda item: tuple(map(int, item[0].split(":")))):
            pack = self._read_pack(name, key, read)
            if pack is not None:
                read.packs[name] = pack
                read.records += pack.length
        read.held = self._held(read)
        return read

    # -- keys ------------------------------------------------------------------------------------------

    def _scan(self, kind: str, pattern: str) -> dict[str, str]:
        """The shard's keys ``<kind>*`` whose rest is ``pattern``, by that rest (found with SCAN on the node of
        the shard's slot)."""
        space = self.space
        options: dict[str, Any] = {"match": glob_escape(space.key(kind)) + "*", "count": 1000}
        if self.cluster:
            options["target_nodes"] = self.client.get_node_from_key(space.packs)  # type: ignore[union-attr]
        found: dict[str, str] = {}
        prefix = space.key("")
        whole = re.compile(re.escape(prefix) + pattern + r"\Z")
        for raw in self.client.scan_iter(**options):
            key = raw.decode(errors="replace")
            match = whole.match(key)
            if match is not None and _u32s(match[1]):
                found[match[1]] = key
        return found

    def _types(self, keys: Sequence[str]) -> list[str]:
        kinds: list[str] = []
        for start in range(0, len(keys), BATCH):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[start : start + BATCH]:
                pipe.type(key)
            kinds += [kind.decode() if isinstance(kind, bytes) else str(kind) for kind in pipe.execute()]
        return kinds

    def _wrong_types(self, keys: dict[str, str], expected: str) -> list[tuple[str, str, str]]:
        found = self._types(list(keys.values()))
        return [
            (key, kind, expected)
            for key, kind in zip(keys.values(), found, strict=True)
            if kind not in (expected, "none")
        ]

    def _wrong_fixed_types(self) -> list[tuple[str, str, str]]:
        keys = {name: self.space.key(name) for name in FIXED_TYPES}
        kinds = self._types(list(keys.values()))
        return [
            (key, kind, FIXED_TYPES[name])
            for (name, key), kind in zip(keys.items(), kinds, strict=True)
            if kind not in (FIXED_TYPES[name], "none")
        ]

    def _listed(self) -> list[tuple[bytes, float]]:
        listed: list[tuple[bytes, float]] = self.client.zrange(self.space.packs, 0, -1, withscores=True)  # type: ignore[assignment]
        return listed

    # -- the index -------------------------------------------------------------------------------------

    def _read_index(self, shape: IndexShape, keys: dict[str, str]) -> IndexRead:
        index = IndexRead(shape)
        numbers = sorted(keys, key=int)
        for start in range(0, len(numbers), BATCH // 4):
            chosen = numbers[start : start + BATCH // 4]
            pipe = self.client.pipeline(transaction=False)
            for number in chosen:
                pipe.hgetall(keys[number])
            for number, entries in zip(chosen, pipe.execute(), strict=True):
                self._place(index, int(number), entries)
        return index

    @staticmethod
    def _place(index: IndexRead, partition: int, entries: dict[bytes, bytes]) -> None:
        shape = index.shape
        for id, value in entries.items():
            if len(id) == ID_BYTES and shape.partition(id) == partition:
                index.unverified[id] = value
            else:
                index.misplaced.setdefault(id, []).append((partition, value))

    # -- packs -----------------------------------------------------------------------------------------

    def _read_pack(self, name: str, key: str, read: ShardRead) -> PackRead | None:
        """A pack's bookkeeping, then its records by its stored base; read again by the base its entries show
        when that is another (a base drifted or malformed)."""
        space = self.space
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(space.pack_base, name)
        pipe.hget(space.pack_live, name)
        pipe.llen(key)
        pipe.lindex(key, -1)
        pipe.zscore(space.packs, name)
        base_raw, live_raw, length, tail, listed = pipe.execute()
        if not length:
            return None  # gone since the scan: the listings say so, if it matters
        pack = PackRead(name, key, int(length), base_raw, live_raw, None if listed is None else int(listed), "")
        pack.tail_sha = hashlib.sha1(tail or b"").hexdigest()
        stored = pack.stored_base
        guess = stored if stored is not None else 0
        found = self._pass(pack, guess, read.index)
        best = _derived_base(found.votes, stored)
        if best != guess:
            found = self._pass(pack, best, read.index)
        self._keep(pack, found, read.index)
        return pack

    def _pass(self, pack: PackRead, base: int, index: IndexRead) -> _Pass:
        found = _Pass(base)
        prefix = pack_prefix(pack.name)
        for position, record in self._records(pack.key, pack.length):
            if not record:
                continue  # cleared: taken out by id
            found.record_bytes += len(record)
            head = record[:ID_BYTES]
            due = int.from_bytes(record[ID_BYTES:RECORD_HEADER], "big") if len(record) >= RECORD_HEADER else None
            live = len(record) >= ID_BYTES and self._is_live(found, index, prefix, position, head)
            if live:
                if found.witness is None and live == "own":
                    found.witness = (position, head)
                if due is not None and (found.earliest is None or due < found.earliest):
                    found.earliest = due
                continue
            found.suspects.append(Suspect(pack.name, base + position, head, len(record), due))
        return found

    @staticmethod
    def _is_live(found: _Pass, index: IndexRead, prefix: bytes, at: int, head: bytes) -> str:
        """Whether the record of id ``head`` at list index ``at`` is its id's: 'own' when the entry of its own
        partition points at it, 'misplaced' when one in another partition does, else ''. The base the entry
        shows (its position less ``at``) counts as a vote."""
        value = index.value(head)
        here = location(prefix, found.base + at)
        if value is not None and value[:8] == prefix and len(value) == 12:
            found.votes[int.from_bytes(value[8:], "big") - at] += 1
            if value == here:
                found.live.append(head)
                return "own"
        for _, other in index.misplaced.get(head, ()):
            if other == here:
                found.misplaced_live.append((head, other))
                return "misplaced"
        return ""

    @staticmethod
    def _keep(pack: PackRead, found: _Pass, index: IndexRead) -> None:
        pack.base, pack.live = found.base, len(found.live) + len(found.misplaced_live)
        pack.earliest, pack.witness, pack.suspects = found.earliest, found.witness, found.suspects
        pack.record_bytes = found.record_bytes
        for id in found.live:
            value = index.unverified.pop(id, None)
            if value is not None:
                index.verified[id] = value
        index.misplaced_live.update(found.misplaced_live)

    def _records(self, key: str, length: int) -> Iterator[tuple[int, bytes]]:
        """The records of list ``key`` up to ``length``, by list index, in LRANGEs of at most
        :data:`CHUNK_BYTES` (but one record), doubling from one record: a pack of large payloads is never read
        in one piece."""
        at, size = 0, 1
        while at < length:
            records: list[bytes] = self.client.lrange(key, at, min(at + size, length) - 1)  # type: ignore[assignment]
            if not records:
                return
            yield from enumerate(records, start=at)
            at += len(records)
            average = max(1, sum(map(len, records)) // len(records))
            size = max(1, min(2 * size, MAX_CHUNK, CHUNK_BYTES // average))

    def _held(self, read: ShardRead) -> set[bytes]:
        """Of the ids of suspects and of entries pointing at no record of theirs, those the store holds outside
        the packs (an envelope in ``msg``, or a dead letter)."""
        ids = {s.head for pack in read.packs.values() for s in pack.suspects if len(s.head) == ID_BYTES}
        ids |= set(read.index.unverified)
        ids = {id for id in ids if len(id) == ID_BYTES}
        ordered = sorted(ids)
        held: set[bytes] = set()
        for start in range(0, len(ordered), BATCH // 2):
            chosen = ordered[start : start + BATCH // 2]
            pipe = self.client.pipeline(transaction=False)
            for id in chosen:
                pipe.hexists(self.space.msg, id_text(id))
                pipe.zscore(self.space.dead, id_text(id))
            replies = pipe.execute()
            held |= {id for n, id in enumerate(chosen) if replies[2 * n] or replies[2 * n + 1] is not None}
        return held


def _u32s(name: str) -> bool:
    """Whether every number of ``name`` (a partition's or a pack's) fits the index's u32s."""
    return all(int(part) < 1 << 32 for part in name.split(":"))


def _derived_base(votes: Counter[int], stored: int | None) -> int:
    """The base most entries pointing into a pack show (their position less the list index of the record they
    point at); the stored one when it is among the most shown or none shows any; 0 for none at all."""
    shown = {base: count for base, count in votes.items() if base >= 0}
    if not shown:
        return stored if stored is not None else 0
    most = max(shown.values())
    candidates = sorted(base for base, count in shown.items() if count == most)
    return stored if stored in candidates else candidates[0]


def read_shard(client: AnyRedis, space: Keyspace, cluster: bool) -> ShardRead:
    """Everything the check needs of one shard, read without writing."""
    return ShardReader(client, space, cluster).read()
