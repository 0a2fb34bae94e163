"""``delay-broker check``: what is wrong with a store's packs, found without writing, and ``--repair``: what is
safe to mend, mended while producers park and promoters open packs.

The check reads each shard (:mod:`.check_read`: SCAN for its partitions and packs, the packed index, every pack
in bounded ``LRANGE`` pieces) and judges what it read (:mod:`.check_findings`). What it read is not one
snapshot, so every finding is then asked about again, atomically, by the repair script that would mend it,
called to check only: a finding the store no longer shows (a pack opened, a message parked or cancelled while
the check read) is left out of the report and counted as unconfirmed.

The repair calls the same scripts to mend (``repair_shape``, ``repair_pack``, ``repair_entry``,
``repair_record``), in the order one mend needs another: the shape, counts, bases, index entries, records,
listings. Each item is mended only if what it was derived from is still as the check read it, else it is
left alone ("changed meanwhile"); then the store is checked again, and what is left mended in another round.
No repair removes a message that is anywhere else, nor makes a second copy: a record is indexed only when its
id is held nowhere else, cleared only when another copy of it is its id's or the store holds the id outside the
packs, and an index entry deleted only when it points at no record of its id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .check_findings import KINDS, Finding, Fix, plan
from .check_read import CHUNK_BYTES, read_shard

if TYPE_CHECKING:
    from .facade import DelayStore
    from .runner import Runner

__all__ = ["KINDS", "CheckReport", "Finding", "RepairReport", "ShardCheck", "check_store", "mend", "repair_store"]

PHASES = (
    ("repair_shape", ""),
    ("repair_pack", "count"),
    ("repair_pack", "base"),
    ("repair_entry", "move"),
    ("repair_entry", "drop"),
    ("repair_entry", "point"),
    ("repair_record", "clear"),
    ("repair_pack", "list"),
    ("repair_pack", "earliest"),
    ("repair_pack", "forget"),
)
"""The repairs of a round in the order they are made: a count is set (raised, so that it never falls below the
messages the index shows) before its pack is touched, a base before any position in its pack is used, an entry
moved or pointed before the stale copies of its record are cleared."""

MAX_ITEMS = 100
"""Items one repair call takes at most (and at most :data:`~.check_read.CHUNK_BYTES` of records to read)."""

MAX_ROUNDS = 5
"""Rounds of checking and mending ``--repair`` makes at most: one mend can show the next (a shape mended shows
the entries it misplaced)."""


@dataclass
class ShardCheck:
    """What the check found in one shard, and how much it read."""

    shard: int
    pattern: str
    findings: list[Finding]
    unconfirmed: int = 0
    """Findings the store no longer showed when asked again (it changed while the check read)."""
    packs: int = 0
    records: int = 0
    entries: int = 0
    damaged_counter: int = 0
    """The shard's ``pack_damaged`` counter: damage the scripts met (and said so) since the store began."""
    shape: str = ""
    """The packed index's shape the findings were judged by (every repair is refused if it changed since)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "keys": self.pattern,
            "packs": self.packs,
            "records": self.records,
            "index_entries": self.entries,
            "pack_damaged": self.damaged_counter,
            "unconfirmed": self.unconfirmed,
            "findings": [finding.as_dict() for finding in self.findings],
        }


@dataclass
class CheckReport:
    """What the check found in every shard."""

    shards: list[ShardCheck]

    @property
    def findings(self) -> list[Finding]:
        return [finding for shard in self.shards for finding in shard.findings]

    @property
    def damaged(self) -> bool:
        return any(shard.findings for shard in self.shards)

    @property
    def unconfirmed(self) -> int:
        return sum(shard.unconfirmed for shard in self.shards)

    def as_dict(self) -> dict[str, Any]:
        return {"damaged": self.damaged, "shards": [shard.as_dict() for shard in self.shards]}


@dataclass
class RepairReport:
    """What ``--repair`` found, mended (by kind), left alone because it changed meanwhile, and what is left."""

    found: CheckReport
    left: CheckReport
    repaired: Counter[str] = field(default_factory=Counter)
    changed: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    """Messages the repairs wrote off: index entries and counts of messages whose records were nowhere."""
    rounds: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "found": self.found.as_dict(),
            "repaired": dict(self.repaired),
            "changed_meanwhile": dict(self.changed),
            "lost": self.lost,
            "rounds": self.rounds,
            "left": self.left.as_dict(),
        }


class FixRunner:
    """Runs the fixes of a shard's findings, to check (nothing written) or to mend."""

    def __init__(self, store: DelayStore) -> None:
        self.runner: Runner = store._runner  # the store's own script runner: same loading, errors, replicas

    def run(self, shard: int, shape: str, findings: Sequence[Finding], *, repair: bool) -> list[bool]:
        """Per finding, whether its fix found things as read (and, mending, mended them); True for a finding
        without a fix, and, when only checking, for one that holds only once earlier fixes are made."""
        done = [True] * len(findings)
        refused: set[str] = set()  # packs whose count or base was not set: nothing relies on them this round
        for script, mode in PHASES:
            chosen = [
                (n, finding.fix)
                for n, finding in enumerate(findings)
                if finding.fix is not None
                and (finding.fix.script, finding.fix.mode) == (script, mode)
                and (repair or not finding.fix.after)
            ]
            for n, fix in chosen:
                done[n] = fix.needs not in refused
            for batch in _batches([(n, fix) for n, fix in chosen if done[n]]):
                codes = self._call(shard, shape, script, mode, [fix for _, fix in batch], repair)
                for (n, fix), ok in zip(batch, codes, strict=True):
                    done[n] = ok
                    if not ok and mode in ("count", "base"):
                        refused.add(fix.keys[0])
        return done

    def _call(self, shard: int, shape: str, script: str, mode: str, fixes: list[Fix], repair: bool) -> list[bool]:
        flag = "repair" if repair else "check"
        if script == "repair_shape":
            reply = self.runner.run(script, shard, [flag, *fixes[0].args], write=repair)
        else:
            keys = [key for fix in fixes for key in fix.keys]
            args = [flag, mode, shape, *(arg for fix in fixes for arg in fix.args)]
            reply = self.runner.run(script, shard, args, extra=keys, write=repair)
        return [int(code) == 1 for code in reply]


def _batches(items: list[tuple[int, Fix]]) -> Iterator[list[tuple[int, Fix]]]:
    """Items in calls of at most :data:`MAX_ITEMS` and :data:`CHUNK_BYTES` of records to read (but one item);
    a shape is mended alone."""
    batch: list[tuple[int, Fix]] = []
    cost = 0
    for item in items:
        limit = 1 if item[1].script == "repair_shape" else MAX_ITEMS
        if batch and (len(batch) >= limit or cost + item[1].cost > CHUNK_BYTES):
            yield batch
            batch, cost = [], 0
        batch.append(item)
        cost += item[1].cost
    if batch:
        yield batch


def check_shard(store: DelayStore, shard: int, fixes: FixRunner) -> ShardCheck:
    """What is wrong with one shard's packs, each finding confirmed by the script that would mend it."""
    space = store.shards[shard]
    read = read_shard(store.client, space, store.cluster)
    findings = plan(shard, read)
    still = fixes.run(shard, str(read.index.shape), findings, repair=False)
    confirmed = [finding for finding, ok in zip(findings, still, strict=True) if ok]
    return ShardCheck(
        shard,
        space.pattern,
        confirmed,
        len(findings) - len(confirmed),
        len(read.packs),
        read.records,
        read.index.entries,
        read.damaged_counter,
        str(read.index.shape),
    )


def check_store(store: DelayStore) -> CheckReport:
    """What is wrong with the packs of every shard of ``store``, found without writing anything."""
    fixes = FixRunner(store)
    return CheckReport([check_shard(store, shard, fixes) for shard in range(len(store.shards))])


def mend(store: DelayStore, report: CheckReport, fixes: FixRunner | None = None) -> RepairReport:
    """Mend what ``report`` found, once: each item only if it is still as the check read it. Returns what was
    mended and what had changed meanwhile (``left`` is ``report``: check again to see what is left)."""
    fixes = fixes or FixRunner(store)
    result = RepairReport(report, report, rounds=1)
    for shard in report.shards:
        done = fixes.run(shard.shard, shard.shape, shard.findings, repair=True)
        for finding, ok in zip(shard.findings, done, strict=True):
            if finding.fix is not None:
                (result.repaired if ok else result.changed)[finding.kind] += 1
                result.lost += finding.lost if ok else 0
    return result


def repair_store(store: DelayStore, *, rounds: int = MAX_ROUNDS) -> RepairReport:
    """Check ``store``, mend what is safe to mend, and check again, up to ``rounds`` times while something was
    mended and something is left."""
    fixes = FixRunner(store)
    found = report = check_store(store)
    result = RepairReport(found, found)
    while result.rounds < rounds and any(finding.fix is not None for finding in report.findings):
        once = mend(store, report, fixes)
        result.rounds += 1
        result.repaired.update(once.repaired)
        result.changed.update(once.changed)
        result.lost += once.lost
        report = result.left = check_store(store)
        if not once.repaired:
            break
    return result
