"""Packs: how messages due far ahead are kept in Redis at a fraction of the memory of the ordinary layout.

A message in the ordinary layout costs a sorted-set entry (``due``) and a hash entry (``msg``) of its own, about
300 bytes beyond its payload on Redis 7: every entry is an allocation with pointers around it. A message due at
least ``pack_after`` from now (5 minutes by default) is instead appended, as one record, to a *pack*: a Redis
LIST of the records due in one slot of time, which Redis stores as a run of compact listpacks (a few bytes per
record). Its id goes into the *packed index*, hashes of at most a few hundred ids each, also listpack-encoded,
that map the id's 16 bytes to where its record is. Together about 130 bytes beyond the payload (see
docs/architecture.md for the figures).

Packs are named by their slot: ``<width ms>:<slot>`` holds the records due in ``[slot * width, (slot + 1) *
width)``. The width grows with the distance, so that a store holds a bounded number of packs however far ahead
its messages are: a message due ``d`` ahead, with ``2**k * pack_after <= d < 2**(k+1) * pack_after``, goes to a
pack ``2**k * pack_after / 16`` wide. The ``packs`` sorted set holds each pack's earliest due time.

A pack is *opened* (its records moved into the ordinary layout, in order) by promoters once its earliest due
time is within ``pack_after / 2`` (see :meth:`delay_broker.store.DelayStore.open_packs`): every message is back
in the ordinary layout well before it is due, and its promotion is what it always was. Operations on one id
(get, cancel, reschedule, a park of the same id) find it through the index and act on its record where it is.

Only ids that are canonical UUIDs (what Dramatiq and Celery generate) are packed: the index holds their 16
bytes. Other ids always take the ordinary layout.
"""

from __future__ import annotations

import hashlib
import re
import struct
import uuid
from dataclasses import dataclass

from .clock import Delay, delay_to_ms
from .errors import ConfigurationError, InvalidDelay

SLICES = 16
"""Packs per doubling of distance: a pack is at most a sixteenth of its messages' distance wide, so a message
spends at most that share of its wait back in the ordinary layout."""

NOT_PACKABLE = bytes(16)
"""The 16-byte form scripts receive for an id that is never packed (the nil UUID is not packed either)."""

NOWHERE = "-"
"""The location of an id that is not packed, as scripts take and give it."""

SPLIT_AT = 128
"""Entries past which a partition of the packed index asks for a split: well under the 512 entries of Redis's
default ``hash-max-listpack-entries`` (and at the 128 of older redis.conf files), so partitions stay compact."""

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_LOCATION = re.compile(r"(\d+):(\d+):(\d+)\Z")


def binary_id(id: str) -> bytes:
    """The 16 bytes of ``id`` when it is a canonical UUID text (lower-case, hyphenated) other than the nil UUID,
    which the scripts turn back into the same text; else :data:`NOT_PACKABLE`."""
    if len(id) != 36 or not _CANONICAL_UUID.match(id):
        return NOT_PACKABLE
    return bytes.fromhex(id.replace("-", ""))


MIN_WIDTH = 2**11
"""The narrowest pack (ms): with it, the slot of any due time up to ``MAX_DUE_MS`` (year 2248) fits the index's
u32, even for the 625-ms packs a ``pack_after`` of 10 seconds would otherwise make."""

MAX_WIDTH = 2**31
"""The widest pack (ms, about 25 days): the index stores the width as a u32, so a message parked years ahead
(whose pack would be wider than 2**32 ms past about 2.5 years with the default ``pack_after``) goes to packs
of this width instead."""


def pack_name(due_ms: int, now_ms: int, pack_after_ms: int) -> str:
    """The pack a message due at ``due_ms`` goes to when parked at ``now_ms`` (at least ``pack_after_ms`` ahead)."""
    distance = max(due_ms - now_ms, pack_after_ms)
    level = (distance // pack_after_ms).bit_length() - 1
    width = min(max(MIN_WIDTH, (pack_after_ms << level) // SLICES), MAX_WIDTH)
    return f"{width}:{due_ms // width}"


DEFAULT_PACK_AFTER_MS = 300_000
MIN_PACK_AFTER_MS = 10_000
"""Packs are for messages due minutes ahead: a pack is opened half a ``pack_after`` before it is due, and a
shorter one would have promoters open packs all the time."""


def check_pack_after(value: Delay | None) -> int | None:
    """``pack_after`` (seconds or a timedelta; None packs nothing) in milliseconds, or :class:`ConfigurationError`
    saying what is wrong. The one check every door (the store, the Celery options, the CLI) applies."""
    if value is None:
        return None
    try:
        millis = delay_to_ms(value)
    except InvalidDelay as error:
        raise ConfigurationError(f"pack_after: {error} (give seconds or a timedelta)") from None
    if millis < MIN_PACK_AFTER_MS:
        raise ConfigurationError(f"pack_after must be at least 10 seconds (or None), got {value!r}")
    return millis


@dataclass(frozen=True)
class PackPolicy:
    """When a message is packed, and when packs are opened, for one ``pack_after`` (ms; None packs nothing)."""

    after_ms: int | None = DEFAULT_PACK_AFTER_MS

    @classmethod
    def of(cls, value: Delay | None) -> PackPolicy:
        return cls(check_pack_after(value))

    def target(self, binary: bytes, due_ms: int, now_ms: int) -> str | None:
        """The pack a message (its 16-byte id) due at ``due_ms`` goes to when parked at ``now_ms``, or None."""
        after = self.after_ms
        if after is None or due_ms - now_ms < after or binary == NOT_PACKABLE:
            return None
        return pack_name(due_ms, now_ms, after)

    @property
    def min_ahead_ms(self) -> int:
        """How far ahead a script, by the Redis clock, still packs a message given a pack (-1: never). The store
        chose the pack by its estimate of that clock: half of ``pack_after`` leaves room for the estimate's error
        and still keeps a packed message minutes from its due time."""
        return -1 if self.after_ms is None else (self.after_ms + 1) // 2

    @property
    def lead_ms(self) -> int:
        """How long before a pack's earliest due time promoters open it: half of ``pack_after`` (of the default
        when this store packs nothing: others may)."""
        return (self.after_ms or DEFAULT_PACK_AFTER_MS) // 2


def pack_start(name: str) -> int:
    """When the slot of pack ``name`` starts (ms): packs are listed in that order."""
    width, slot = name.split(":")
    return int(width) * int(slot)


@dataclass(frozen=True)
class Location:
    """Where a packed message's record is: its pack, and its position counted from the pack's first record."""

    pack: str
    position: int

    @classmethod
    def parse(cls, text: str) -> Location | None:
        """A location as the index holds it (``width:slot:position``); None for :data:`NOWHERE`."""
        match = _LOCATION.match(text)
        if match is None:
            return None
        return cls(f"{match[1]}:{match[2]}", int(match[3]))

    @classmethod
    def from_index(cls, value: bytes) -> Location:
        """A location as the packed index stores it: the pack's width and slot and the position, each a u32."""
        width, slot, position = struct.unpack(">III", value)
        return cls(f"{width}:{slot}", position)

    def __str__(self) -> str:
        return f"{self.pack}:{self.position}"


def index_hash(binary: bytes) -> int:
    """The 32-bit hash the packed index places a 16-byte id by (``index_partition`` in _lib.lua computes it from
    ``redis.sha1hex``)."""
    return int.from_bytes(hashlib.sha1(binary).digest()[:4], "big")


@dataclass(frozen=True)
class IndexShape:
    """How many partitions the packed index of a shard has: ``2**level + split``."""

    level: int = 0
    split: int = 0

    @classmethod
    def parse(cls, text: str) -> IndexShape:
        level, split = text.split(":")
        return cls(int(level), int(split))

    def __str__(self) -> str:
        return f"{self.level}:{self.split}"

    @property
    def partitions(self) -> int:
        return (1 << self.level) + self.split

    def partition(self, binary: bytes) -> int:
        if self.level == 0 and self.split == 0:
            return 0  # one partition: no hash needed
        hashed = index_hash(binary)
        partition = hashed % (1 << self.level)
        return hashed % (2 << self.level) if partition < self.split else partition

    def splits_to(self, partition: int) -> int:
        """How many splits, the next ones in line, split ``partition`` (one of this shape)."""
        if partition >= self.split:
            return partition - self.split + 1
        return (1 << self.level) - self.split + partition + 1

    def splits(self, count: int) -> tuple[list[tuple[int, int]], IndexShape]:
        """The next ``count`` splits: (partition split, partition made) each, and the shape after them."""
        pairs = []
        level, split = self.level, self.split
        for _ in range(count):
            pairs.append((split, split + (1 << level)))
            split += 1
            if split == 1 << level:
                level, split = level + 1, 0
        return pairs, IndexShape(level, split)


def id_text(binary: bytes) -> str:
    """The id a packed record's 16 bytes stand for."""
    return str(uuid.UUID(bytes=binary))


class PackedElsewhere(Exception):
    """A by-id script found ids packed elsewhere than the caller said (or no longer packed), and wrote nothing.

    ``locations``: by the id's position in the call (from 1), where it is now (None: not packed).
    """

    def __init__(self, locations: dict[int, Location | None]) -> None:
        super().__init__(f"packed elsewhere: {locations}")
        self.locations = locations


class IndexReshaped(Exception):
    """A by-id script was given an index partition the current shape no longer puts an id in, and wrote nothing."""

    def __init__(self, shape: IndexShape) -> None:
        super().__init__(f"packed index reshaped to {shape}")
        self.shape = shape


_PACKED_REPLY = re.compile(r"(?:^|: )PACKED ((?:\d+ [-\d:]+)(?: \d+ [-\d:]+)*)")
_RESHAPED_REPLY = re.compile(r"(?:^|: )RESHAPED (\d+:\d+)")


def packed_elsewhere(error: Exception) -> PackedElsewhere | IndexReshaped | None:
    """What a script's ``PACKED`` or ``RESHAPED`` refusal stands for (also as a pipeline reports it)."""
    text = str(error)
    reshaped = _RESHAPED_REPLY.search(text)
    if reshaped is not None:
        return IndexReshaped(IndexShape.parse(reshaped[1]))
    match = _PACKED_REPLY.search(text)
    if match is None:
        return None
    words = match[1].split()
    return PackedElsewhere({int(words[n]): Location.parse(words[n + 1]) for n in range(0, len(words), 2)})
