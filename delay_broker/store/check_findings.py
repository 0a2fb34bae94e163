"""What ``delay-broker check`` finds wrong with one shard's packs, from what it read (:mod:`.check_read`), and
how ``--repair`` would mend each finding: a :class:`Fix`, one item of a repair script's call, which carries what
the check read so that the script mends it only if it is still so.

Every finding concerns one key and says how many messages it concerns; ``lost`` counts those a repair writes
off (an index entry whose record is nowhere, a count of messages whose pack list is gone).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..clock import iso_time
from ..packing import id_text, pack_start
from .check_read import ID_BYTES, RECORD_HEADER, PackRead, ShardRead, Suspect, location, pack_prefix, parse_shape
from .check_read import shape_from as shape_from_partitions
from .replies import int_or_none

KINDS = {
    "wrong_type": "a key of a type the store does not use there",
    "shape_malformed": "the packed index's shape is malformed",
    "entry_misplaced": "an index entry in a partition other than its id's",
    "entry_broken": "an index entry pointing at no record of its id",
    "record_orphaned": "a packed record without its index entry",
    "record_duplicate": "a stale copy of a packed message",
    "record_unreadable": "a packed record too short for a message",
    "count_drift": "a pack's count of messages differs from the messages in it",
    "base_drift": "a pack's base differs from the one its index entries show",
    "pack_unlisted": "a pack the list of packs lacks: never opened",
    "pack_late": "a pack listed as due later than its earliest message: opened late",
    "pack_gone": "a pack listed whose records are gone",
    "leftover": "a base or count of a pack that no longer exists",
}
"""Every kind of finding, with what it means."""


@dataclass(frozen=True)
class Fix:
    """One item of a repair script's call: its keys after the shard's and its arguments (what the check read,
    and what to set), and the bytes of records the call reads for it."""

    script: str
    mode: str
    keys: tuple[str, ...] = ()
    args: tuple[bytes | str | int, ...] = ()
    cost: int = 0
    after: bool = False
    """Whether it holds only once fixes of earlier phases are done (a stale copy of a record indexed by the same
    repair, a record of a pack whose base the same repair sets): a read-only check does not ask about it."""
    needs: str = ""
    """The pack (key) whose count and base it relies on: it makes a record there its id's, which the pack's count
    must cover (a count below the messages the index shows lets a cancel drop the pack with messages in it).
    Left alone when a fix of that count or base was refused in the same round."""


@dataclass(frozen=True)
class Finding:
    """Something wrong in a shard's packs: its kind (one of :data:`KINDS`), the key, what is wrong, the messages it
    concerns, and what ``--repair`` does about it ('' when it cannot: mend it by hand)."""

    shard: int
    kind: str
    key: str
    problem: str
    messages: int
    repair: str
    lost: int = 0
    fix: Fix | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "kind": self.kind,
            "key": self.key,
            "problem": self.problem,
            "messages": self.messages,
            "repair": self.repair,
            "lost": self.lost,
        }


def label(id: bytes) -> str:
    """An id of the packed index as people know it (its UUID text), or its bytes when it is not 16 long."""
    return id_text(id) if len(id) == ID_BYTES else repr(id)


def where(value: bytes) -> str:
    """An index entry's location as text (``pack width:slot, position n``)."""
    if len(value) != 12:
        return f"{value!r} (no location)"
    return f"pack {_name_of(value)} position {int.from_bytes(value[8:], 'big')}"


def _name_of(value: bytes) -> str:
    """The name of the pack an index entry points into ('' for a value that is no location)."""
    if len(value) != 12:
        return ""
    return f"{int.from_bytes(value[:4], 'big')}:{int.from_bytes(value[4:8], 'big')}"


class Planner:
    """The findings of one shard, each with its fix (see :func:`plan`)."""

    def __init__(self, shard: int, read: ShardRead) -> None:
        self.shard = shard
        self.read = read
        self.space = read.space
        self.index = read.index
        self.findings: list[Finding] = []
        self.keepers: dict[str, list[Suspect]] = {}
        """Per pack, the orphaned records to be indexed (one per id)."""
        self.broken_into: Counter[str] = Counter()
        """Per pack, the index entries pointing into it at no record, which the repair deletes as lost."""
        self.rebased = {
            pack.name
            for pack in read.packs.values()
            if pack.stored_base != pack.base or (pack.live_raw is not None and int_or_none(pack.live_raw) is None)
        }
        """Packs whose base the repair sets, or whose count is malformed (every script refuses to read their
        records until it is set): what the repair does by their records holds only after that."""

    def add(
        self, kind: str, key: str, problem: str, messages: int, repair: str, fix: Fix | None = None, lost: int = 0
    ) -> None:
        self.findings.append(Finding(self.shard, kind, key, problem, messages, repair, lost, fix))

    def plan(self) -> list[Finding]:
        read = self.read
        for key, kind, expected in read.wrong_types:
            self.add("wrong_type", key, f"holds a {kind}, not a {expected}: every script touching it refuses", 0, "")
        if read.wrong_types:
            return self.findings
        if parse_shape(read.shape_raw) is None:
            self._shape()
            return self.findings
        resolved = self._suspects()
        self._misplaced()
        self._broken(resolved)
        for pack in read.packs.values():
            self._count(pack)
            self._base(pack)
            self._listing(pack)
        self._gone()
        return self.findings

    # -- keys and costs --------------------------------------------------------------------------------

    def own(self, id: bytes) -> str:
        """The partition key ``id`` belongs in."""
        return self.space.packed(self.index.shape.partition(id))

    def pack_key(self, value: bytes) -> str:
        """The key of the pack an entry points into (the shard's ``packs`` key, never touched, for none)."""
        return self.space.pack(_name_of(value)) if len(value) == 12 else self.space.packs

    def average(self, value: bytes) -> int:
        """The average record size of the pack an entry points into: what checking the entry reads."""
        pack = self.read.packs.get(_name_of(value)) if len(value) == 12 else None
        return pack.average if pack is not None else 0

    def held_elsewhere(self, id: bytes) -> bool:
        return id in self.read.held

    # -- the shape -------------------------------------------------------------------------------------

    def _shape(self) -> None:
        read = self.read
        raw = read.shape_raw or b""
        shape = shape_from_partitions(read.partitions)
        fix = Fix("repair_shape", "", (), (raw, str(shape)))
        problem = (
            f"{raw[:40]!r} is no shape ('level:split'): no packed message can be found. The {len(read.partitions)} "
            f"partition(s) present make {shape}; the rest of the shard is checked once it is mended"
        )
        self.add("shape_malformed", self.space.packed_shape, problem, self.index.entries, f"set to {shape}", fix)

    # -- records ---------------------------------------------------------------------------------------

    def _suspects(self) -> set[bytes]:
        """Findings for the records that are not their pack's messages; returns the ids whose broken entry is
        re-pointed at an orphaned record of theirs."""
        live_elsewhere = {id for id, _ in self.index.misplaced_live}
        orphans: dict[bytes, list[Suspect]] = {}
        for pack in self.read.packs.values():
            for suspect in pack.suspects:
                why = self._why_extra(suspect, live_elsewhere)
                if why is None:
                    orphans.setdefault(suspect.head, []).append(suspect)
                else:
                    self._clear(suspect, why)
        resolved: set[bytes] = set()
        for id, group in orphans.items():
            keeper = group[-1]  # the last appended; any other copy is then a stale one
            self.keepers.setdefault(keeper.pack, []).append(keeper)
            if self._point(keeper):
                resolved.add(id)
            for other in group[:-1]:
                self._clear(other, "duplicate", after=True)
        return resolved

    def _why_extra(self, suspect: Suspect, live_elsewhere: set[bytes]) -> str | None:
        """Why a suspect record is to be cleared, or None for an orphaned message (to be indexed)."""
        head = suspect.head
        if len(head) < ID_BYTES:
            return "unreadable"
        if head in self.index.verified or head in live_elsewhere:
            return "duplicate"
        if self.held_elsewhere(head):
            return "held"
        return "unreadable" if suspect.length <= RECORD_HEADER else None

    def _clear(self, suspect: Suspect, why: str, after: bool = False) -> None:
        head, pack = suspect.head, self.read.packs[suspect.pack]
        entry = self._entry_of(head) if len(head) == ID_BYTES else b""
        keys = (pack.key, self.own(head) if len(head) == ID_BYTES else self.space.packs, self.pack_key(entry))
        after = after or suspect.pack in self.rebased or (why == "duplicate" and head not in self.index.verified)
        args = (suspect.position, suspect.length, head, why)
        fix = Fix("repair_record", "clear", keys, args, suspect.length + self.average(entry), after)
        at = f"record {suspect.position} of pack {suspect.pack}"
        if why == "unreadable":
            what = "too short for an id" if len(head) < ID_BYTES else f"of {label(head)} with no envelope"
            self.add("record_unreadable", pack.key, f"{at} ({suspect.length} bytes) is {what}", 0, "cleared", fix)
        elif why == "held":
            problem = f"{at} is a stale copy of {label(head)}, which the store holds outside the packs"
            self.add("record_duplicate", pack.key, problem, 1, "cleared (the message stays where it is)", fix)
        else:
            problem = f"{at} is a stale copy of {label(head)}, whose entry points at {where(entry)}"
            self.add("record_duplicate", pack.key, problem, 1, "cleared (the message stays where it is)", fix)

    def _entry_of(self, id: bytes) -> bytes:
        """The entry of ``id`` that points at a record of it (in its own partition, or misplaced), or b''."""
        value = self.index.verified.get(id)
        if value is not None:
            return value
        return next((value for other, value in self.index.misplaced_live if other == id), b"")

    def _point(self, keeper: Suspect) -> bool:
        """Index an orphaned record, or re-point its id's broken entry at it; returns whether it re-points."""
        id, pack = keeper.head, self.read.packs[keeper.pack]
        current = self.index.unverified.get(id, b"")
        target = location(pack_prefix(keeper.pack), keeper.position)
        own = self.own(id)
        cost = keeper.length + self.average(current)
        after = keeper.pack in self.rebased or _name_of(current) in self.rebased
        keys = (own, own, self.pack_key(current), pack.key)
        fix = Fix("repair_entry", "point", keys, (id, current, target), cost, after, pack.key)
        at = f"record {keeper.position} of pack {keeper.pack}"
        if current:
            problem = f"the entry of {label(id)} points at {where(current)}, no record of it; {at} is one"
            self.add("entry_broken", own, problem, 1, f"pointed at {at}", fix)
            return True
        problem = f"{at} ({label(id)}) has no index entry: opening the pack would dead-letter it"
        self.add("record_orphaned", pack.key, problem, 1, "indexed: a complete message", fix)
        return False

    # -- index entries ---------------------------------------------------------------------------------

    def _misplaced(self) -> None:
        index = self.index
        kept = {id for pack in self.keepers.values() for id in (keeper.head for keeper in pack)}
        for id, places in index.misplaced.items():
            own = self.own(id)
            for partition, value in places:
                here = self.space.packed(partition)
                text = f"the entry of {label(id)} is in partition {partition}, not its id's ({own})"
                if (id, value) in index.misplaced_live:
                    other = index.value(id) or b""
                    keys = (here, own, self.pack_key(value), self.pack_key(other))
                    cost = self.average(value) + self.average(other)
                    after = bool({_name_of(value), _name_of(other)} & self.rebased)
                    fix = Fix("repair_entry", "move", keys, (id, value, other), cost, after, self.pack_key(value))
                    self.add("entry_misplaced", here, text, 1, "moved to its id's partition", fix)
                    continue
                lost = int(index.value(id) is None and id not in kept and not self.held_elsewhere(id))
                keys = (here, own, self.pack_key(value), self.space.packs)
                after = _name_of(value) in self.rebased
                fix = Fix("repair_entry", "drop", keys, (id, value, b""), self.average(value), after)
                problem = f"{text}, and points at {where(value)}, no record of it"
                self.add("entry_misplaced", here, problem, 1, "deleted" + (" (lost)" if lost else ""), fix, lost)

    def _broken(self, resolved: set[bytes]) -> None:
        for id, value in self.index.unverified.items():
            if id in resolved:
                continue
            own = self.own(id)
            held = self.held_elsewhere(id)
            if len(value) == 12:
                self.broken_into[_name_of(value)] += 0 if held else 1
            keys = (own, own, self.pack_key(value), self.space.packs)
            after = _name_of(value) in self.rebased
            fix = Fix("repair_entry", "drop", keys, (id, value, b""), self.average(value), after)
            problem = f"the entry of {label(id)} {self._reason(value)}"
            if held:
                repair = "deleted (the store holds the message outside the packs)"
            else:
                repair = "deleted: the message is lost (no record of it anywhere)"
            self.add("entry_broken", own, problem, 1, repair, fix, 0 if held else 1)

    def _reason(self, value: bytes) -> str:
        if len(value) != 12:
            return f"is {value[:40]!r}, no location"
        name, position = _name_of(value), int.from_bytes(value[8:], "big")
        pack = self.read.packs.get(name)
        if pack is None:
            return f"points into pack {name}, which is gone"
        if not pack.base <= position < pack.base + pack.length:
            return f"points at position {position}, outside pack {name} ({pack.base} to {pack.base + pack.length - 1})"
        return f"points at position {position} of pack {name}, where another record is"

    # -- a pack's bookkeeping --------------------------------------------------------------------------

    def found(self, pack: PackRead) -> tuple[int, int | None]:
        """The messages of a pack once its orphans are indexed, and the earliest of their due times."""
        keepers = self.keepers.get(pack.name, [])
        dues = [keeper.due for keeper in keepers if keeper.due is not None]
        if pack.earliest is not None:
            dues.append(pack.earliest)
        return pack.live + len(keepers), min(dues, default=None)

    def _count(self, pack: PackRead) -> None:
        messages, _ = self.found(pack)
        stored = int_or_none(pack.live_raw) if pack.live_raw is not None else 0
        if stored == messages:
            return
        args = (pack.live_raw or b"", pack.base_raw or b"", pack.length, pack.tail_sha, messages)
        fix = Fix("repair_pack", "count", (pack.key, self.space.packs), args, pack.average)
        counted = f"{stored}" if stored is not None else f"the malformed {pack.live_raw[:40]!r}"  # type: ignore[index]
        problem = f"pack {pack.name} counts {counted} message(s), {messages} found in it"
        self.add("count_drift", self.space.pack_live, problem, abs(messages - (stored or 0)), f"set to {messages}", fix)

    def _base(self, pack: PackRead) -> None:
        if pack.stored_base == pack.base:
            return
        messages, _ = self.found(pack)
        if pack.witness is not None:
            index, id = pack.witness
            keys = (pack.key, self.own(id))
        else:
            index, id, keys = -1, b"", (pack.key, self.space.packs)
        args = (pack.base_raw or b"", pack.base, index, id, b"")
        # A base set makes every entry that shows it point at its record: the count must cover them first.
        fix = Fix("repair_pack", "base", keys, args, pack.average, needs=pack.key)
        problem = f"pack {pack.name} has base {(pack.base_raw or b'0')[:40]!r}; its index entries show {pack.base}"
        self.add("base_drift", self.space.pack_base, problem, messages, f"set to {pack.base}", fix)

    def _listing(self, pack: PackRead) -> None:
        messages, earliest = self.found(pack)
        if pack.listed is None:
            due = earliest if earliest is not None else pack_start(pack.name)
            fix = Fix("repair_pack", "list", (pack.key, self.space.packs), (due, b"", b"", b"", b""))
            problem = f"pack {pack.name} ({messages} message(s)) is not listed: promoters would never open it"
            self.add("pack_unlisted", self.space.packs, problem, messages, f"listed, due {iso_time(due)}", fix)
        elif earliest is not None and pack.listed > earliest:
            fix = Fix("repair_pack", "earliest", (pack.key, self.space.packs), (pack.listed, earliest, b"", b"", b""))
            problem = (
                f"pack {pack.name} is listed as due {iso_time(pack.listed)}, its earliest message is due "
                f"{iso_time(earliest)}: it would be opened late"
            )
            self.add("pack_late", self.space.packs, problem, messages, f"listed due {iso_time(earliest)}", fix)

    def _gone(self) -> None:
        """Listings, bases and counts of packs whose list is gone."""
        read = self.read
        names = {name.encode() for name in read.listed} | set(read.bases) | set(read.lives)
        for raw in sorted(names - {name.encode() for name in read.packs}):
            try:
                name = raw.decode()
            except UnicodeDecodeError:
                self.add("leftover", self.space.pack_live, f"pack {raw!r} (a name that is no text) has no list", 0, "")
                continue
            listed = read.listed.get(name)
            base, live = read.bases.get(raw), read.lives.get(raw)
            counted = (int_or_none(live) or 0) if live is not None else 0
            lost = max(0, counted - self.broken_into[name])
            args = ("" if listed is None else listed, base or b"", live or b"", b"", b"")
            fix = Fix("repair_pack", "forget", (self.space.pack(name), self.space.packs), args)
            what = f"counts {live[:40]!r} message(s)" if live is not None else "has no count"
            if listed is not None:
                problem = f"pack {name} is listed but its list {self.space.pack(name)} is gone (it {what})"
                self.add("pack_gone", self.space.packs, problem, counted, "forgotten", fix, lost)
            else:
                key = self.space.pack_live if live is not None else self.space.pack_base
                problem = f"pack {name} has no list but its bookkeeping is left (it {what})"
                self.add("leftover", key, problem, counted, "removed", fix, lost)


def plan(shard: int, read: ShardRead) -> list[Finding]:
    """The findings of a shard from what the check read of it, each with its fix."""
    return Planner(shard, read).plan()
