"""Changing a namespace's shard count while it is used: the steps of a reshard (announce, switch, re-home, finish),
each recorded in the layout key before it is taken, so that a run killed at any point and run again goes on where
it stopped (see docs/scaling.md, "Changing the shard count online").
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..clock import due_of_score
from ..errors import DelayBrokerError
from ..keys import MAX_SHARDS, Keyspace, shard_tags
from ..packing import Location
from ..schedule_defs import occurrence_id
from .layouts import LAYOUT_TTL, Layout, View
from .migration import MIGRATION_WAIT
from .reading import Reading
from .rehoming import REHOME_BATCH, Rehoming
from .replies import text
from .runner import Runner
from .shards import Shards

logger = logging.getLogger("delay_broker.store")

SETTLE_SECONDS = 2 * LAYOUT_TTL + MIGRATION_WAIT + 1.0
"""Seconds between announcing a reshard and parking by the new layout: every live process reads the layout again
within :data:`~.layouts.LAYOUT_TTL` as it is used, and a call already under way may wait up to
:data:`~.migration.MIGRATION_WAIT` for a Cluster slot."""
LOCK_SECONDS = 5.0
"""How long the lock of a reshard lasts unless renewed (a killed run's lock is waited for that long at most)."""
LEASE_PAUSE = 1.0
"""Seconds between two passes that found nothing to move but messages in flight in their old shards."""
SCAN_PAGE = 1000


class ReshardRefused(DelayBrokerError):
    """A reshard that cannot be started or continued as asked (another is under way, to another count)."""


@dataclass(frozen=True)
class ShardCounts:
    """One shard as a reshard sees it."""

    shard: int
    tag: str
    role: str
    """``old`` (left by the reshard), ``new`` (added), ``both`` (in both layouts) or ``in use`` (no reshard)."""
    parked: int
    packed: int
    inflight: int
    dead: int
    in_transit: int


@dataclass
class ReshardReport:
    """What a reshard found and did (a dry run: what it would do)."""

    namespace: str
    to: int
    before: Layout
    after: Layout
    dry_run: bool
    moved: int = 0
    """Messages parked into their new homes."""
    passes: int = 0
    seconds: float = 0.0
    """Time spent re-homing (from the switch to the finish)."""
    settle_seconds: float = 0.0
    shards: list[ShardCounts] = field(default_factory=list)
    estimate: int = 0
    """Messages the reshard moves (a dry run's estimate from each shard's count)."""

    @property
    def rate(self) -> float:
        """Messages re-homed per second."""
        return self.moved / self.seconds if self.seconds > 0 else 0.0

    @property
    def done(self) -> bool:
        return self.after.state == "stable" and self.after.shards == self.to

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "to": self.to,
            "dry_run": self.dry_run,
            "before": self.before.describe(),
            "after": self.after.describe(),
            "done": self.done,
            "moved": self.moved,
            "passes": self.passes,
            "seconds": round(self.seconds, 3),
            "rate": round(self.rate, 1),
            "settle_seconds": round(self.settle_seconds, 3),
            "estimate": self.estimate,
            "shards": [vars(counts) for counts in self.shards],
        }


Entry = tuple[str, "int | None", "Location | None"]
"""A message of an old shard as a pass reads it: its id, its due time when known, where it is packed."""
Progress = Callable[[str, int], None]
"""Told what a reshard is doing (a step or a pass) and how many messages it has moved so far."""


class Resharder:
    """Moves a namespace to ``to`` shards while producers and promoters go on (see the module).

    Parameters:
      shards, runner, rehoming, reading: the store's parts.
      to: the new shard count.
      batch: messages taken out of an old shard at once (and at most 512 KiB of them).
      settle: seconds between announcing and switching (see :data:`SETTLE_SECONDS`).
      progress: told of each step and pass.
    """

    def __init__(
        self,
        shards: Shards,
        runner: Runner,
        rehoming: Rehoming,
        reading: Reading,
        to: int,
        *,
        batch: int = REHOME_BATCH,
        settle: float = SETTLE_SECONDS,
        progress: Progress | None = None,
    ) -> None:
        if not 1 <= to <= MAX_SHARDS:
            raise ValueError(f"the shard count must be 1..{MAX_SHARDS}, got {to}")
        if not 1 <= batch <= REHOME_BATCH:
            raise ValueError(f"batch must be 1..{REHOME_BATCH}, got {batch}")
        self.shards, self.runner, self.rehoming, self.reading = shards, runner, rehoming, reading
        self.to, self.batch, self.settle = to, batch, settle
        self.progress = progress or (lambda step, moved: None)
        self.moved = 0
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renewed = 0.0
        self._records: list[str] | None = None

    # -- reading the layout ----------------------------------------------------------------------------

    def _read(self) -> tuple[Layout, str]:
        """The layout key's value, parsed, and as it is (for the compare-and-set of the next step)."""
        key = self.shards.keys.layout
        with self.shards.calling("reading the shard layout"):
            raw = self.shards.client.get(key)
        value = "" if raw is None else text(raw)
        return Layout.parse(value if raw is not None else None, key), value

    def _write(self, read: str, layout: Layout, counters: tuple[dict[str, int], dict[str, int]] = ({}, {})) -> View:
        """The next step written, if the key still holds ``read``; then the view of it."""
        stats, lateness = counters
        args: list[Any] = [read, layout.encode(), len(stats)]
        for pairs in (stats, lateness):
            for name, amount in pairs.items():
                args.extend((name, amount))
        reply = self.runner.run("layout", 0, args, extra=[self.shards.keys.layout])
        if not int(reply[0]):
            held = text(reply[1]) if len(reply) > 1 and reply[1] else "nothing"
            raise ReshardRefused(
                f"the layout of namespace {self.shards.keys.namespace!r} changed meanwhile ({held!r}): another "
                "reshard? Nothing was changed by this one; run it again"
            )
        return self.shards.reload()

    # -- the run ---------------------------------------------------------------------------------------

    def run(self) -> ReshardReport:
        """Take every step left, in order; a report of what was done."""
        self._finish_transit()
        with self._locked():
            before, read = self._read()
            report = ReshardReport(self.shards.keys.namespace, self.to, before, before, dry_run=False)
            layout = before
            if layout.state == "stable":
                self._clean_up(layout)
                if layout.shards == self.to:
                    return report
                self.progress(f"announcing {layout.shards} -> {self.to}", 0)
                layout = self._write(read, layout.announced(self.to, self.shards.now_ms())).layout
                read = layout.encode()
            if layout.state == "announced":
                self._check_target(layout.target, layout)
                report.settle_seconds = self._wait_settled(layout)
                self.progress("switching: new parks go to the new layout", 0)
                layout = self._write(read, layout.moving(self.shards.now_ms())).layout
                read = layout.encode()
            self._check_target(layout.shards, layout)
            started = time.monotonic()
            view = self._mark(self.shards.reload())
            report.passes = self._rehome_all(view)
            report.after = self._finish(view, read)
            report.seconds, report.moved = time.monotonic() - started, self.moved
            self._clean_up(report.after)
            return report

    def _finish_transit(self) -> None:
        """Before waiting for a killed run's lock: the batches it left in transit finished at once (each step is
        idempotent, so a run still alive finishing them too is harmless), rather than held until the lock runs out."""
        view = self.shards.reload()
        if view.moving and view.old is not None:
            for shard in view.old:
                self.moved += self.rehoming.finish(shard)

    def status(self) -> ReshardReport:
        """Where the namespace stands, and about how many messages a reshard to ``to`` moves: changes nothing."""
        layout, _ = self._read()
        view = self.shards.reload()
        report = ReshardReport(self.shards.keys.namespace, self.to, layout, layout, dry_run=True)
        report.shards = [self._counts(view, shard) for shard in view.serving]
        if layout.state != "stable" or layout.shards != self.to:
            target = self.to if layout.state == "stable" else layout.target
            report.estimate = estimate(self.shards.keys.namespace, layout.source, target, report.shards)
        return report

    def _check_target(self, target: int, layout: Layout) -> None:
        if target != self.to:
            raise ReshardRefused(
                f"namespace {self.shards.keys.namespace!r} is being resharded already ({layout.describe()}): finish "
                f"that one first (`delay-broker reshard --to {target}`), then reshard to {self.to}"
            )

    def _wait_settled(self, layout: Layout) -> float:
        """Wait until :attr:`settle` seconds have passed since the announcement (by the Redis clock)."""
        assert layout.since_ms is not None
        waited = 0.0
        while (left := (layout.since_ms + self.settle * 1000 - self.shards.now_ms()) / 1000) > 0:
            self.progress(f"waiting {left:.1f} s for every process to see the announcement", 0)
            pause = min(left, LOCK_SECONDS / 4)
            time.sleep(pause)
            waited += pause
            self._renew()
        return waited

    def _mark(self, view: View) -> View:
        """Every shard of both layouts given the generation parks must now be made by (never lowered)."""
        generation = view.generation
        for shard in view.serving:
            key = self.shards.spaces[shard].generation
            with self.shards.calling("marking the shards' layout generation"):
                held = self.shards.client.get(key)
                if held is None or not held.isdigit() or int(held) < generation:
                    self.shards.client.set(key, generation)
        return view

    # -- re-homing -------------------------------------------------------------------------------------

    def _rehome_all(self, view: View) -> int:
        """Passes over the old layout's shards until two in a row find nothing to move, nothing in flight out of its
        home and nothing in transit (and the shards the new layout leaves empty): a message a promoter claims while
        a pass reads its index and gives back before the pass ends is missed by that pass only. How many passes
        were made."""
        assert view.old is not None and view.new is not None
        passes = clean = 0
        while clean < 2:
            passes += 1
            self._records = None
            for shard in view.old:
                self.moved += self.rehoming.finish(shard)
            found = waiting = 0
            for shard in view.old:
                moved, left = self._pass(view, shard)
                found, waiting = found + moved, waiting + left
            self.progress(f"pass {passes}: {found:,} moved, {waiting:,} in flight or left", self.moved)
            clean = clean + 1 if found == 0 and waiting == 0 else 0
            if found == 0 and waiting:
                time.sleep(LEASE_PAUSE)  # in-flight messages: acknowledged, or given back when their lease ends
            self._renew()
        return passes

    def _pass(self, view: View, shard: int) -> tuple[int, int]:
        """One look at an old shard: its misplaced messages moved; how many, and how many are left (in flight; for
        a shard the new layout leaves, anything at all). In flight first: a message given back after that look is
        in its index when the index is read after."""
        in_flight = self._misplaced(view, shard, [(id, None, None) for id, _ in self._entries(shard, "inflight")])
        moved = self._move(
            view, shard, ([(id, due_of_score(score), None)] for id, score in self._entries(shard, "due"))
        )
        moved += self._move(view, shard, ([(id, None, None)] for id, _ in self._entries(shard, "dead")))
        moved += self._move(view, shard, self._packed(shard))
        left = len(in_flight)
        if shard not in (view.new or ()):  # left by the new layout: empty, checked at once, before it is finished
            space = self.shards.spaces[shard]
            with self.shards.calling("looking at an old shard"):
                left += int(self.shards.client.exists(space.due, space.dead, space.inflight, space.packs, space.moving))
        return moved, left

    def _packed(self, shard: int) -> Iterator[list[Entry]]:
        """The shard's packed messages, page after page: id, due time, where it is packed."""
        after = None
        while True:
            scan = self.reading.scan_packs(shard, None, None, after, SCAN_PAGE * 5, SCAN_PAGE, headers_only=True)
            yield [
                (info.id, info.due_ms, Location.parse(position[1].replace("/", ":"))) for position, info in scan.matches
            ]
            if scan.exhausted:
                return
            after = scan.last

    def _entries(self, shard: int, state: str) -> Iterator[tuple[str, float]]:
        """The ids of a shard's index (``due``, ``dead``, ``inflight``) with their scores, page after page by score
        (a page ends with every entry of its last score: entries taken meanwhile shift no page)."""
        key = getattr(self.shards.spaces[shard], state)
        low = "-inf"
        client = self.shards.client
        while True:
            with self.shards.calling("reading a shard's index"):
                page: list[tuple[bytes, float]] = client.zrangebyscore(  # type: ignore[assignment]
                    key, low, "+inf", start=0, num=SCAN_PAGE, withscores=True
                )
                if len(page) == SCAN_PAGE:
                    last = page[-1][1]
                    ties: list[tuple[bytes, float]] = client.zrangebyscore(key, last, last, withscores=True)  # type: ignore[assignment]
                    page = [entry for entry in page if entry[1] != last] + ties
            for id, score in page:
                yield text(id), score
            if len(page) < SCAN_PAGE:
                return
            low = f"({page[-1][1]!r}"

    def _misplaced(self, view: View, shard: int, entries: list[Entry]) -> list[Entry]:
        """The ``entries`` (id, due ms when known, pack location) whose home in the new layout is another shard:
        not a recurring schedule's occurrence in shard 0, which stays there."""
        found = []
        for entry in entries:
            id, due_ms, _ = entry
            if view.new_home(id) == shard or (shard == 0 and due_ms is not None and self._occurrence(id, due_ms)):
                continue
            found.append(entry)
        return found

    def _occurrence(self, id: str, due_ms: int) -> bool:
        try:
            if uuid.UUID(id).version != 5:
                return False
        except ValueError:
            return False
        if self._records is None:
            with self.shards.calling("reading recurring schedules"):
                self._records = [text(name) for name in self.shards.client.hkeys(self.shards.keys.cron)]
        namespace = self.shards.keys.namespace
        return any(occurrence_id(namespace, record, due_ms) == id for record in self._records)

    def _move(self, view: View, shard: int, pages: Iterable[list[Entry]]) -> int:
        """The misplaced ones among the entries of ``pages`` moved, in batches of one new home each (one call to
        park them), gathered over pages; how many were taken."""
        by_home: dict[int, list[Entry]] = {}
        gathered = moved = 0
        for page in pages:
            for entry in self._misplaced(view, shard, page):
                by_home.setdefault(view.new_home(entry[0]), []).append(entry)
                gathered += 1
            if gathered >= self.batch * len(view.new or ()):
                moved += sum(self._move_batches(view, shard, entries) for entries in by_home.values())
                by_home, gathered = {}, 0
        return moved + sum(self._move_batches(view, shard, entries) for entries in by_home.values())

    def _move_batches(self, view: View, shard: int, entries: list[Entry]) -> int:
        moved = 0
        while entries:
            batch, entries = entries[: self.batch], entries[self.batch :]
            token = f"{view.generation}-{uuid.uuid4().hex[:16]}"
            packed = [location for _, _, location in batch]
            taken = self.rehoming.take(shard, [id for id, _, _ in batch], token, packed=packed)
            self.moved += self.rehoming.carry(shard, taken.moving) if taken.moving else 0
            moved += len(taken.moving)
            left = set(taken.left)
            entries = [entry for entry in batch if entry[0] in left] + entries
            self.progress(f"shard {shard}", self.moved)
            self._renew()
        return moved

    # -- the end ---------------------------------------------------------------------------------------

    def _finish(self, view: View, read: str) -> Layout:
        """The layout written stable, shard 0's counters given those of the shards it leaves in the same step,
        their far-tier tokens copied to every new shard before."""
        assert view.old is not None and view.new is not None
        leaving = [shard for shard in view.old if shard not in view.new]
        stats: dict[str, int] = {}
        lateness: dict[str, int] = {}
        client = self.shards.client
        for shard in leaving:
            space = self.shards.spaces[shard]
            with self.shards.calling("finishing the reshard"):
                tokens: list[tuple[bytes, float]] = client.zrange(space.moved, 0, -1, withscores=True)  # type: ignore[assignment]
                for new in view.new if tokens else ():
                    client.zadd(self.shards.spaces[new].moved, dict(tokens), nx=True)
                for pairs, key in ((stats, space.stats), (lateness, space.lateness)):
                    for name, value in client.hgetall(key).items():
                        with contextlib.suppress(ValueError):
                            pairs[text(name)] = pairs.get(text(name), 0) + int(value)
        self.progress("finishing", self.moved)
        return self._write(read, view.layout.finished(), (stats, lateness)).layout

    def _clean_up(self, layout: Layout) -> None:
        """After a finished reshard: the keys of the shards it left deleted but their marker (which goes on refusing
        parks of a process that never read the layout again), once every process has read it; the batches' tokens
        in the new shards dropped."""
        if layout.state != "stable" or layout.other is None:
            return
        namespace, prefix = self.shards.keys.namespace, self.shards.keys.prefix
        kept = set(shard_tags(namespace, layout.shards))
        leaving = [Keyspace(namespace, prefix, tag) for tag in shard_tags(namespace, layout.other) if tag not in kept]
        client = self.shards.client
        with self.shards.calling("cleaning up after the reshard"):
            if leaving and any(client.exists(*space.script_keys) for space in leaving):
                time.sleep(LAYOUT_TTL + 0.5)  # processes still serving the old shards see the end first
            for space in leaving:
                keys = [key for key in space.script_keys if key != space.generation]
                keys.extend(space.packed(n) for n in range(_partitions(client.get(space.packed_shape))))
                for key in keys:  # one by one: on a Cluster, a DEL of several keys needs them in one slot
                    client.delete(key)
            for tag in kept:
                client.delete(Keyspace(namespace, prefix, tag).rehomed)

    # -- the lock --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        key, client = self.shards.keys.reshard_lock, self.shards.client
        deadline = time.monotonic() + LOCK_SECONDS * 1.2  # a killed run's lock runs out by then
        while True:
            with self.shards.calling("taking the reshard lock"):
                if client.set(key, self._owner, nx=True, px=int(LOCK_SECONDS * 1000)):
                    break
                holder = client.get(key)
            if time.monotonic() > deadline:
                raise ReshardRefused(
                    f"another `delay-broker reshard` is at work on namespace {self.shards.keys.namespace!r} "
                    f"({key} held by {text(holder or b'?')})"
                )
            self.progress("waiting for the lock of another (or a killed) run", 0)
            time.sleep(0.5)
        self._renewed = time.monotonic()
        try:
            yield
        finally:
            with contextlib.suppress(DelayBrokerError), self.shards.calling("releasing the reshard lock"):
                if client.get(key) == self._owner.encode():
                    client.delete(key)

    def _renew(self) -> None:
        if time.monotonic() - self._renewed < LOCK_SECONDS / 4:
            return
        key, client = self.shards.keys.reshard_lock, self.shards.client
        with self.shards.calling("renewing the reshard lock"):
            if client.get(key) != self._owner.encode():
                raise ReshardRefused(f"the reshard lock {key} was lost (this run stalled for {LOCK_SECONDS:.0f} s)")
            client.pexpire(key, int(LOCK_SECONDS * 1000))
        self._renewed = time.monotonic()

    # -- counts ----------------------------------------------------------------------------------------

    def _counts(self, view: View, shard: int) -> ShardCounts:
        reply = self.runner.run("stats", shard, [1000], write=False)
        role = "in use"
        if view.old is not None and view.new is not None:
            role = {(True, True): "both", (True, False): "old", (False, True): "new"}[
                (shard in view.old, shard in view.new)
            ]
        with self.shards.calling("reading messages in transit"):
            transit = int(self.shards.client.hlen(self.shards.spaces[shard].moving))
        parked, packed = int(reply[1]), int(reply[10])
        return ShardCounts(
            shard, self.shards.spaces[shard].tag, role, parked, packed, int(reply[2]), int(reply[3]), transit
        )


def estimate(namespace: str, source: int, target: int, counts: list[ShardCounts], samples: int = 20_000) -> int:
    """About how many of the messages counted in the source layout's shards move to another shard in the target
    layout: each shard's share of messages that move, from ``samples`` random ids."""
    source_tags, target_tags = shard_tags(namespace, source), shard_tags(namespace, target)
    moving = [0] * source
    seen = [0] * source
    for _ in range(samples):
        crc = zlib.crc32(str(uuid.uuid4()).encode())
        old = crc % source
        seen[old] += 1
        moving[old] += source_tags[old] != target_tags[crc % target]
    by_tag = {counts_.tag: counts_ for counts_ in counts}
    total = 0.0
    for old, tag in enumerate(source_tags):
        found = by_tag.get(tag)
        if found is not None and seen[old]:
            total += (found.parked + found.dead) * moving[old] / seen[old]
    return round(total)


def _partitions(shape: Any) -> int:
    """How many partitions a packed index of this shape (``level:split``) has."""
    try:
        level, split = (int(part) for part in text(shape or b"0:0").split(":"))
    except ValueError:
        return 1
    return int(2**level + split)


__all__ = ["SETTLE_SECONDS", "ReshardRefused", "ReshardReport", "Resharder", "ShardCounts", "estimate"]
