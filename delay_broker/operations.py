"""The operations layer the CLI and the dashboard share: find messages by filter, act on ids or on a filter.

A :class:`MessageFilter` names a state (parked, in flight, dead), a time window on that state's index (due
time, lease deadline, time of death), and optionally a queue, an actor or task name, an id prefix and a text
to find in the decoded message. Finding is a bounded scan: ``find.lua`` examines at most a few thousand entries
of one shard per call, in index order, and applies the structural filters in Redis; the text filter runs here,
on the decoded payloads of what matched. Pages carry a cursor (per shard: where its scan stands), so the next
page goes on from there and a page costs the same at the start of a million messages as anywhere else. With a
far tier, parked messages are also looked for in its table, one more source after the shards: PostgreSQL
applies the window and the structural filters, the text filter runs here as for Redis. Packed messages (see
:mod:`delay_broker.packing`) are one more source per shard, read before the shard's index.

Bulk actions (cancel, run now, reschedule, requeue dead, purge dead) take ids or a filter; a filter is first
turned into ids (a full scan, in chunks), then acted on in server-side batches of up to 1,000 ids per script
call, and the result says how many matched, how many were done, and how many were no longer there (promoted,
cancelled or moved by someone else meanwhile). To act on what a person was shown and said yes to, not on what
the filter matches by the time they answer, :meth:`Operations.select` the ids first and hand those over.
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from .clock import Delay, delay_to_ms, ms_to_datetime, score_ceiling, score_floor
from .decoding import searchable_text
from .envelope import Envelope
from .errors import ConfigurationError, CorruptEnvelope, InvalidDelay, StoreError
from .records import FarSnapshot, IndexScan, Position
from .rescheduling import rescheduler_for
from .store import MAX_BATCH, DelayStore, ListState, MessageInfo

SCAN_PER_CALL = 5000
"""Entries one ``find.lua`` call examines at most: one call stays well under a millisecond per thousand."""
MAX_SCAN = 1_000_000
"""Entries one page may examine per shard before it returns what it has (with a cursor to go on)."""

UNREWRITABLE: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, AttributeError, RecursionError)
"""What rewriting one message's payload may raise when the payload is not what its framework writes (bytes
that are not UTF-8 or JSON, a record of another shape, JSON nested too deep): that message cannot be moved."""

Action = Literal["cancel", "run_now", "reschedule", "requeue", "purge"]
Source = Literal["packs", "index", "far"]
Ids = Sequence[str] | Mapping[str, str]
"""The messages an action names: ids, or what :meth:`Operations.select` returned (ids with their framework)."""


@dataclass(frozen=True)
class MessageFilter:
    """Which messages: all fields are optional but ``state``; they combine with AND."""

    state: ListState = "due"
    start_ms: int | None = None
    """Earliest time on the state's index (due time, lease deadline, time dead-lettered), inclusive."""
    end_ms: int | None = None
    """Latest time on the state's index, inclusive."""
    queue: str | None = None
    """The envelope's route: the queue name (Dramatiq's canonical queue, Celery's routing key or queue)."""
    task: str | None = None
    """The actor or task name."""
    id_prefix: str | None = None
    text: str | None = None
    """Found in the decoded message (payload as stored, and a Celery message's decoded arguments)."""

    def __post_init__(self) -> None:
        if self.state not in ("due", "inflight", "dead"):
            raise ValueError(f"state must be 'due', 'inflight' or 'dead', got {self.state!r}")
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise ValueError("the window ends before it starts")

    @property
    def is_everything(self) -> bool:
        """True when nothing but the state is filtered on."""
        return not any((self.start_ms, self.end_ms, self.queue, self.task, self.id_prefix, self.text))

    def matches_text(self, info: MessageInfo) -> bool:
        if not self.text:
            return True
        if info.raw is None:
            return False
        needle = self.text.casefold()
        # Most matches are in the stored bytes as they are (Dramatiq's JSON): found without decoding anything.
        if needle.isascii() and needle.encode() in info.raw.lower():
            return True
        envelope = _envelope(info)
        if envelope is None or (envelope.framework != "celery" and _reads_as_stored(needle)):
            return False
        # A Celery body is base64, and JSON escapes non-ASCII text, quotes, backslashes and control characters:
        # look in the decoded message.
        return needle in searchable_text(envelope.framework, envelope.payload).casefold()


@dataclass(frozen=True)
class Page:
    messages: list[MessageInfo]
    cursor: str | None
    """Where the next page starts (None: this was the last)."""
    examined: int
    """Index entries examined for this page (the cost of the filter)."""


@dataclass(frozen=True)
class Count:
    matched: int
    examined: int
    complete: bool
    """False when the scan stopped at its limit before the end: ``matched`` is then a lower bound."""


@dataclass(frozen=True)
class BulkResult:
    action: Action
    matched: int
    """Messages the ids or the filter named."""
    done: int
    """Messages the action was applied to."""
    skipped: list[str] = field(default_factory=list)
    """Ids known not to have been acted on: no longer in that state (promoted, cancelled, moved meanwhile).
    A purge counts them but cannot name them."""
    failed: dict[str, str] = field(default_factory=dict)
    """Ids still there but not acted on, each with why: a Celery message whose payload cannot be read to move
    its eta with it. The action went on with the others."""


class Operations:
    """Queries and actions on one store (any layout: one server, Sentinel, a sharded Cluster namespace)."""

    def __init__(self, store: DelayStore) -> None:
        self.store = store

    # -- finding -------------------------------------------------------------------------------------------------

    def find(
        self,
        filter: MessageFilter,
        *,
        cursor: str | None = None,
        limit: int = 50,
        max_scan: int = MAX_SCAN,
        headers_only: bool = False,
    ) -> Page:
        """One page of matching messages, oldest first (by the state's index), merged over shards. Each shard
        examines at most ``max_scan`` entries; a page that stops there has fewer messages and a cursor to go on.
        The cursor holds each shard's position (the last entry it gave or examined), not an offset: messages
        promoted, cancelled or parked meanwhile neither hide others from the next page nor bring them back. One
        exception: a packed message (shown at the start of its pack's slot) whose pack a promoter opens before
        the next page may be shown again there, at its exact due time.
        ``headers_only``: messages in Redis come without their payload, as for :meth:`DelayStore.list_messages`."""
        if not 0 < limit <= MAX_BATCH:
            raise ValueError(f"limit must be 1..{MAX_BATCH}")
        kinds = [kind for kind, _ in self._sources(filter)]
        positions = _cursor(cursor, len(kinds))
        scans = self._scan_sources(filter, positions, limit, max_scan=max_scan, headers_only=headers_only)
        page = self._merge(kinds, scans, positions, limit)
        more = any(position is not _DONE for position in positions)
        return Page(page, _cursor_text(positions) if more else None, sum(scan.examined for scan in scans))

    def _scan_sources(
        self, filter: MessageFilter, positions: list[CursorPosition], limit: int, *, max_scan: int, headers_only: bool
    ) -> list[IndexScan]:
        """Each source's next ``limit`` matches after its position (none for a source already done); a source
        that has none left is marked done, or moved past what it examined, in ``positions``."""
        scans: list[IndexScan] = []
        with self._snapshot(filter) as snapshot:
            for source, position in enumerate(positions):
                if isinstance(position, _Done):
                    scans.append(IndexScan(0, True, [], None))
                    continue
                scan = self._scan(
                    filter, source, position, limit, max_scan=max_scan, snapshot=snapshot, headers_only=headers_only
                )
                scans.append(scan)
                if not scan.matches:
                    positions[source] = _DONE if scan.exhausted else scan.last
        return scans

    def _merge(
        self, kinds: list[Source], scans: list[IndexScan], positions: list[CursorPosition], limit: int
    ) -> list[MessageInfo]:
        """The first ``limit`` messages of the sources' matches merged in order; each source's position moves
        to the last of its matches taken (or to done, when it gave all it had to the end of the window)."""
        merged = heapq.merge(
            *[
                [
                    (self._sort_key(kinds[source], position, info), source, n, position, info)
                    for n, (position, info) in enumerate(scan.matches)
                ]
                for source, scan in enumerate(scans)
            ]
        )
        page: list[MessageInfo] = []
        shown: set[str] = set()
        consumed: dict[int, tuple[int, Position]] = {}
        for _, source, n, position, info in merged:
            if len(page) == limit:
                break
            if info.id not in shown:  # a message whose move into Redis landed within this read: shown once
                page.append(info)
                shown.add(info.id)
            consumed[source] = (n, position)
        for source, scan in enumerate(scans):
            if source in consumed:
                n, position = consumed[source]
                ended = scan.exhausted and len(scan.matches) <= limit
                # Matches not given yet are found again from there; the same goes for a shard none was taken
                # from, whose position stays where it was.
                positions[source] = position if n + 1 < len(scan.matches) or not ended else _DONE
        return page

    def count(self, filter: MessageFilter, *, max_scan: int = MAX_SCAN) -> Count:
        """How many messages match (a full scan in bounded calls, up to ``max_scan`` entries per shard)."""
        matched = examined = 0
        complete = True
        # A pack opened during the scan puts its messages in the index, read after the packs: count them once.
        packed: set[str] = set()
        sources = self._sources(filter)
        with self._snapshot(filter) as snapshot:
            for source, (kind, _) in enumerate(sources):
                source_examined = 0
                for scan in self._scans(filter, source, snapshot):
                    if kind == "packs":
                        packed.update(info.id for _, info in scan.matches)
                        matched += len(scan.matches)
                    else:
                        matched += sum(1 for _, info in scan.matches if info.id not in packed)
                    source_examined += scan.examined
                    if not scan.exhausted and source_examined >= max_scan:
                        complete = False
                        break
                examined += source_examined
        return Count(matched, examined, complete)

    def matches(self, filter: MessageFilter) -> Iterator[MessageInfo]:
        """Every matching message, shard by shard (a full scan in bounded calls). With a far tier the table is
        read as of the start, in a transaction held until the iteration ends: consume it, then act."""
        with self._snapshot(filter) as snapshot:
            for source in range(len(self._sources(filter))):
                for scan in self._scans(filter, source, snapshot):
                    for _, info in scan.matches:
                        yield info

    def select(self, filter: MessageFilter) -> dict[str, str]:
        """The ids ``filter`` matches now, each with its message's framework (``""``: unreadable envelope), for a
        bulk action to act on exactly these: messages parked meanwhile are left alone, and a relative window is
        not read against a later now. As :meth:`matches`, a full scan; only ids and frameworks are kept."""
        return {info.id: _framework(info) for info in self.matches(filter)}

    def _snapshot(self, filter: MessageFilter) -> contextlib.AbstractContextManager[FarSnapshot | None]:
        """For parked messages with a far tier, a read of the table as of before Redis is read: a message that
        moves into Redis meanwhile is neither missed (it was in the table) nor, mostly, seen twice (its row is
        left out once its token is recorded in Redis)."""
        if filter.state != "due" or self.store.far_tier is None:
            return contextlib.nullcontext()
        return self.store.far_snapshot()

    def _scans(self, filter: MessageFilter, source: int, snapshot: FarSnapshot | None) -> Iterator[IndexScan]:
        """One source's scans, each going on from where the last stopped, to the end of the window."""
        position: Position | None = None
        while True:
            # Counts and bulk actions need ids and headers only.
            scan = self._scan(
                filter, source, position, MAX_BATCH, max_scan=SCAN_PER_CALL, snapshot=snapshot, headers_only=True
            )
            yield scan
            if scan.exhausted or scan.last is None:
                return
            position = scan.last

    def _sources(self, filter: MessageFilter) -> list[tuple[Source, int]]:
        """Where messages of ``filter.state`` are, in the order they are read: for parked messages every shard's
        packs, then every shard's index, then the far tier's table; else every shard's index. Sweepers move
        messages only from the table into Redis and promoters only from a pack into the index, so a full scan
        in this order is not made to miss one by them (the table is read as of before Redis is, see
        :meth:`_snapshot`)."""
        shards = range(len(self.store.shards))
        if filter.state != "due":
            return [("index", shard) for shard in shards]
        far: list[tuple[Source, int]] = [("far", 0)] if self.store.far_tier is not None else []
        return [*(("packs", shard) for shard in shards), *(("index", shard) for shard in shards), *far]

    def _scan(
        self,
        filter: MessageFilter,
        source: int,
        after: Position | None,
        limit: int,
        *,
        max_scan: int = MAX_SCAN,
        snapshot: FarSnapshot | None = None,
        headers_only: bool = False,
    ) -> IndexScan:
        """Matches of one shard (or the far tier, after the shards) after the position ``after``: at least
        ``limit`` of them unless the window or ``max_scan`` ends first (a text filter may bring a few more)."""
        found: list[tuple[Position, MessageInfo]] = []
        examined = 0
        kind, shard = self._sources(filter)[source]
        headers_only = headers_only and not filter.text  # the text is searched in the payload
        while len(found) < limit and examined < max_scan:
            # With a text filter most structural matches fail it: take whole chunks, not a page at a time.
            wanted = MAX_BATCH if filter.text else limit - len(found)
            scan = min(SCAN_PER_CALL, max_scan - examined)
            reply = self._scan_once(kind, shard, filter, after, scan, wanted, snapshot, headers_only)
            examined += reply.examined
            after = reply.last
            found.extend((position, info) for position, info in reply.matches if filter.matches_text(info))
            if reply.exhausted:
                return IndexScan(examined, True, found, after)
            if reply.examined == 0:
                break
        return IndexScan(examined, False, found, after)

    def _scan_once(
        self,
        kind: Source,
        shard: int,
        filter: MessageFilter,
        after: Position | None,
        scan: int,
        wanted: int,
        snapshot: FarSnapshot | None,
        headers_only: bool,
    ) -> IndexScan:
        """One bounded call on one source: up to ``scan`` entries examined, up to ``wanted`` structural matches."""
        structural = {"queue": filter.queue, "task": filter.task, "id_prefix": filter.id_prefix}
        if kind == "far":
            return self.store.scan_far(
                start_ms=filter.start_ms,
                end_ms=filter.end_ms,
                after=after,
                scan=min(scan, wanted),  # every row the table returns matches the structural filters
                snapshot=snapshot,
                **structural,
            )
        if kind == "packs":
            return self.store.scan_packs(
                shard,
                start_ms=filter.start_ms,
                end_ms=filter.end_ms,
                after=after,
                scan=scan,
                limit=wanted,
                headers_only=headers_only,
                **structural,
            )
        return self.store.scan_index(
            filter.state,
            shard,
            min_score=_score_bound(filter, "start"),
            max_score=_score_bound(filter, "end"),
            after=after,
            scan=scan,
            limit=wanted,
            headers_only=headers_only,
            **structural,
        )

    def _sort_key(self, kind: Source, position: Position, info: MessageInfo) -> tuple[int, str]:
        """Messages by their time on the state's index; packed ones at the start of their pack's slot, in the
        pack's order (which is each source's own: the merge needs every source in order)."""
        if kind == "packs":
            return int(position[0]), position[1].rpartition("/")[0] + f"/{int(position[1].rpartition('/')[2]):020d}"
        return (info.due_ms if info.state == "due" else info.at_ms) or 0, info.id

    # -- acting --------------------------------------------------------------------------------------------------

    def cancel(self, ids: Ids | None = None, filter: MessageFilter | None = None) -> BulkResult:
        """Delete parked (or dead) messages for good."""
        targets = list(self._targets(ids, filter, ("due", "dead")))
        done = 0
        skipped: list[str] = []
        for chunk in _chunks(targets):
            removed = self.store.cancel_each(chunk)
            done += sum(removed)
            skipped.extend(id for id, flag in zip(chunk, removed, strict=True) if not flag)
        return BulkResult("cancel", len(targets), done, skipped)

    def run_now(self, ids: Ids | None = None, filter: MessageFilter | None = None) -> BulkResult:
        """Make parked messages due now (they are promoted at once)."""
        return self.reschedule(ids, filter, delay=0, action="run_now")

    def reschedule(
        self,
        ids: Ids | None = None,
        filter: MessageFilter | None = None,
        *,
        delay: Delay | None = None,
        due: datetime | None = None,
        action: Action = "reschedule",
    ) -> BulkResult:
        """Give parked messages a new due time (``delay`` from now, or ``due``), all the same instant. A Celery
        message's own eta header moves with it (see :func:`reschedule_one`): one script call per message, told
        by the filter's scan whose message it is."""
        if (delay is None) == (due is None):
            raise ValueError("give delay or due")
        targets = self._targets(ids, filter, ("due",))
        when = due if due is not None else ms_to_datetime(self.store.now_ms() + delay_to_ms(delay))
        skipped: list[str] = []
        failed: dict[str, str] = {}
        for id, framework in targets.items():
            try:
                moved = reschedule_one(self.store, id, when, framework)
            except (StoreError, InvalidDelay, ConfigurationError):
                raise  # the store, the due time or the setup: every other message would fail the same way
            except UNREWRITABLE as error:
                # One message that cannot be rewritten must not leave the rest of a bulk action undone.
                failed[id] = f"{type(error).__name__}: {error}"
                continue
            if moved is None:
                skipped.append(id)
        return BulkResult(action, len(targets), len(targets) - len(skipped) - len(failed), skipped, failed)

    def requeue(self, ids: Ids | None = None, filter: MessageFilter | None = None) -> BulkResult:
        """Park dead-lettered messages again, due now, attempts reset."""
        targets = list(self._targets(ids, filter, ("dead",)))
        done = 0
        skipped: list[str] = []
        for chunk in _chunks(targets):
            result = self.store.requeue_dead(chunk)
            done += result.count
            skipped.extend(result.not_requeued)
        return BulkResult("requeue", len(targets), done, skipped)

    def purge(self, ids: Ids | None = None, filter: MessageFilter | None = None) -> BulkResult:
        """Delete dead-lettered messages for good."""
        targets = list(self._targets(ids, filter, ("dead",)))
        done = sum(self.store.purge_dead(chunk) for chunk in _chunks(targets))
        return BulkResult("purge", len(targets), done)

    def _targets(
        self, ids: Ids | None, filter: MessageFilter | None, states: tuple[ListState, ...]
    ) -> dict[str, str | None]:
        """The ids to act on, each with its message's framework as a scan read it (None for ids given as such).
        Only that is kept: a filter may match millions of messages of up to a megabyte each."""
        if (ids is None) == (filter is None):
            raise ValueError("give ids or a filter, not both")
        if isinstance(ids, Mapping):
            return dict[str, str | None](ids)
        if ids is not None:
            return dict.fromkeys(ids)
        assert filter is not None
        if filter.state not in states:
            raise ValueError(f"this action applies to {' or '.join(states)} messages, not {filter.state}")
        return dict[str, str | None](self.select(filter))


def _reads_as_stored(text: str) -> bool:
    """Whether JSON stores ``text`` as it is (printable ASCII, no quote or backslash)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _framework(info: MessageInfo) -> str:
    envelope = _envelope(info)
    return "" if envelope is None else envelope.framework


def _envelope(info: MessageInfo) -> Envelope | None:
    if info.raw is None:
        return None
    try:
        return Envelope.decode(info.raw)
    except CorruptEnvelope:
        return None


def _score_bound(filter: MessageFilter, side: Literal["start", "end"]) -> str:
    """The ZRANGEBYSCORE bound of the filter's window: due times are encoded scores; the others are plain ms."""
    value = filter.start_ms if side == "start" else filter.end_ms
    if value is None:
        return "-inf" if side == "start" else "+inf"
    if filter.state == "due":
        return str(score_floor(value) if side == "start" else score_ceiling(value))
    return str(value)


class _Done:
    """A source whose scan reached the end of the window."""


_DONE = _Done()
CursorPosition = Position | None | _Done


def _cursor(text: str | None, sources: int) -> list[CursorPosition]:
    """Each source's position from a cursor: URL-safe base64 of a JSON list with, per source, null (not
    started), 0 (done) or the [key, id] of its last entry."""
    if not text:
        return [None] * sources
    try:
        items = json.loads(base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4)))
    except (ValueError, UnicodeError):
        raise ValueError(f"not a cursor of this store: {text!r}") from None
    if not isinstance(items, list) or len(items) != sources:
        raise ValueError(f"not a cursor of this store: {text!r}")
    positions: list[CursorPosition] = []
    for item in items:
        if item is None or item == 0:
            positions.append(None if item is None else _DONE)
        elif (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(part, str) for part in item)
            and _is_number(item[0])
        ):
            positions.append((item[0], item[1]))
        else:
            raise ValueError(f"not a cursor of this store: {text!r}")
    return positions


def _cursor_text(positions: list[CursorPosition]) -> str:
    items = [0 if position is _DONE else position for position in positions]
    return base64.urlsafe_b64encode(json.dumps(items, separators=(",", ":")).encode()).decode().rstrip("=")


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), MAX_BATCH):
        yield ids[start : start + MAX_BATCH]


def reschedule_one(store: DelayStore, id: str, due: datetime, framework: str | None = None) -> int | None:
    """Move one parked message to ``due``; returns its new due time (ms), or None if it is not parked.
    ``framework``: the message's (``""`` when its envelope is unreadable), when the caller just read it (a
    filter's scan); it decides how the message is moved, never what is written back. None: read it here.

    A message whose framework's adapter registered a rescheduler (:mod:`delay_broker.rescheduling`) is moved by
    it: a Celery message carries its own eta, which moves with it in the same atomic step (otherwise a task moved
    earlier would wait in a worker for its old eta); that needs celery installed.
    """
    if framework is None:
        info = store.get(id)
        if info is None or info.state != "due":
            return None
        framework = _framework(info)
    rescheduler = rescheduler_for(framework)
    if rescheduler is not None:
        return rescheduler(store, id, due)  # reads it afresh: the rewrite goes into the payload stored now
    return store.reschedule(id, due=due)
