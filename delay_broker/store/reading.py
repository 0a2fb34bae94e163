"""Reading the store: one message by id, pages of one state, and bounded scans of each source (the ordinary
index, packs, the far tier) that the operations layer merges."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from .. import packing
from ..clock import score_ceiling, score_floor
from ..records import IndexScan, MessageInfo, Position
from .far_view import FarReader, NoFarTier, row_info
from .packs import PackOpener
from .rehoming import Rehoming
from .replies import MAX_BATCH, ListState, check_id, check_state, listed, listed_page, text
from .runner import Runner
from .shards import Shards

Entry = tuple[float, str, "tuple[int, int] | MessageInfo"]
"""A listing's entry before its page is read: its score, its id, and where it is (a shard and a position in its
index) or the message itself (read whole already: packed, or a far row)."""


class Reading:
    """Reads across every shard of the namespace, and the far tier through ``far`` (a view of it)."""

    def __init__(self, shards: Shards, runner: Runner, rehoming: Rehoming, packs: PackOpener, far: FarReader) -> None:
        self.shards = shards
        self.runner = runner
        self.rehoming = rehoming
        self.packs = packs
        self.far = far

    def get(self, id: str) -> MessageInfo | None:
        check_id(id)
        # The row first: a message moved in meanwhile is in Redis before its row is deleted. A row whose token is
        # recorded as moved in is such a one, or one a park in Redis replaced: the copy in Redis is it.
        row = self.far.live_row(id)
        if row is not None:
            return row_info(row)
        return self.get_in_redis(id)

    def get_in_redis(self, id: str) -> MessageInfo | None:
        found: list[MessageInfo] = []

        def look(shard: int, group: list[str]) -> list[str]:
            state, due, at, raw, attempts, error = self.runner.by_id("get", shard, [id], [id], write=False)
            state = state.decode()
            if state == "gone" and not raw:
                return group
            found.append(
                MessageInfo(
                    id=id,
                    state=state,
                    due_ms=None if int(due) < 0 else int(due),
                    at_ms=None if int(at) < 0 else int(at),
                    raw=raw or None,
                    attempts=int(attempts),
                    error=text(error) if error else None,
                )
            )
            return []

        self.rehoming.search([id], look)
        return found[0] if found else None

    def list_messages(
        self,
        state: ListState,
        start_ms: int | None,
        end_ms: int | None,
        offset: int,
        count: int,
        headers_only: bool,
    ) -> list[MessageInfo]:
        """See :meth:`DelayStore.list_messages`. On a sharded namespace the page is merged from every shard: the
        scores and ids of each one's first ``offset + count`` entries, then the page's own messages."""
        if not 0 < count <= MAX_BATCH or offset < 0:
            raise ValueError(f"count must be 1..{MAX_BATCH} and offset >= 0")
        check_state(state)
        if state == "due":
            low: Any = "-inf" if start_ms is None else score_floor(start_ms)
            high: Any = "+inf" if end_ms is None else score_ceiling(end_ms)
        else:
            low = "-inf" if start_ms is None else start_ms
            high = "+inf" if end_ms is None else end_ms
        shards = self.shards.serving
        if len(shards) == 1 and state != "due":
            return [info for _, info in self.list_page(shards[0], state, low, high, offset, count, headers_only)]
        wanted = offset + count
        far: FarReader = self.far if state == "due" else NoFarTier()
        with far.snapshot() as view:
            leaving = far.moved_tokens()
            # Packs first: promoters move messages from packs into the index only, so a pack opened meanwhile
            # shows its messages twice (the index's copy wins below) rather than not at all. At the start of
            # their pack's slot (see scan_packs), in the pack's order.
            packed_pages = [
                self._packed_entries(shard, start_ms, end_ms, wanted, headers_only)
                for shard in (shards if state == "due" else ())
            ]
            # Each shard's first `wanted` entries as (score, id) only: the page is chosen from them, and only its
            # own messages are then read whole (an offset of 100,000 read 100,000 payloads per shard).
            pages: list[list[Entry]] = [
                [
                    (score, id, (shard, n))
                    for n, (score, id) in enumerate(self.index_entries(shard, state, low, high, wanted))
                ]
                for shard in shards
            ]
            rows = far.first_rows(start_ms, end_ms, wanted, leaving, view)
            pages.append([(float(score_floor(row.due_ms)), row.id, row_info(row)) for row in rows])
            pages.extend(packed_pages)
        merged = heapq.merge(*pages, key=lambda entry: entry[0])
        unique = {id: (score, id, source) for score, id, source in merged}  # a later (Redis) copy wins
        chosen = sorted(unique.values(), key=lambda entry: entry[0])[offset:wanted]
        return self._read_whole(chosen, state, low, high, headers_only)

    def _packed_entries(
        self, shard: int, start_ms: int | None, end_ms: int | None, wanted: int, headers_only: bool
    ) -> list[Entry]:
        scan = self.scan_packs(shard, start_ms, end_ms, None, 2**62, wanted, headers_only=headers_only)
        return [(float(score_floor(int(at[0]))), info.id, info) for at, info in scan.matches]

    def index_entries(self, shard: int, state: ListState, low: Any, high: Any, wanted: int) -> list[tuple[float, str]]:
        """The first ``wanted`` entries of a shard's index within the window, as (score, id)."""
        space = self.shards.spaces[shard]
        key = {"due": space.due, "inflight": space.inflight, "dead": space.dead}[state]
        found: list[tuple[float, str]] = []
        with self.shards.calling("listing messages"):
            while len(found) < wanted:
                size = min(10 * MAX_BATCH, wanted - len(found))
                page: list[tuple[bytes, float]] = self.shards.client.zrangebyscore(  # type: ignore[assignment]
                    key, low, high, start=len(found), num=size, withscores=True
                )
                found.extend((float(score), text(id)) for id, score in page)
                if len(page) < size:
                    break
        return found

    def _read_whole(
        self, chosen: list[Entry], state: ListState, low: Any, high: Any, headers_only: bool
    ) -> list[MessageInfo]:
        """The chosen messages read whole. A shard's share of a page is a run of its index: one list.lua call
        reads it, and its messages are found in it by id; one that moved meanwhile is read by id, and one that
        is gone is left out."""
        runs: dict[int, list[int]] = {}
        for _, _, source in chosen:
            if isinstance(source, tuple):
                runs.setdefault(source[0], []).append(source[1])
        read: dict[str, MessageInfo] = {}
        for shard, positions in runs.items():
            first = min(positions)
            for _, info in self.list_page(shard, state, low, high, first, max(positions) - first + 1, headers_only):
                read[info.id] = info
        page: list[MessageInfo] = []
        for _, id, source in chosen:
            found = source if isinstance(source, MessageInfo) else read.get(id) or self.get(id)
            if found is not None and found.state == state:
                page.append(found)
        return page

    def list_page(
        self, shard: int, state: ListState, low: Any, high: Any, offset: int, count: int, headers_only: bool = False
    ) -> list[tuple[float, MessageInfo]]:
        args = [low, high, offset, count, state, "1" if headers_only else ""]
        return listed_page(state, self.runner.run("list", shard, args, write=False), omitted=headers_only)

    def scan_index(
        self,
        state: ListState,
        shard: int,
        min_score: str,
        max_score: str,
        after: Position | None,
        scan: int,
        limit: int,
        queue: str | None,
        task: str | None,
        id_prefix: str | None,
        headers_only: bool,
    ) -> IndexScan:
        """See :meth:`DelayStore.scan_index`."""
        check_state(state)
        args = [
            state,
            min_score,
            max_score,
            *(after or ("", "")),
            min(scan, 5000),
            min(limit, MAX_BATCH),
            queue or "",
            task or "",
            id_prefix or "",
            "1" if headers_only else "",
        ]
        reply = self.runner.run("find", shard, args, write=False)
        matches = [
            ((text(reply[n + 1]), text(reply[n])), listed(state, *reply[n : n + 5], omitted=headers_only)[1])
            for n in range(4, len(reply), 5)
        ]
        last = (text(reply[2]), text(reply[3])) if reply[2] else None
        return IndexScan(int(reply[0]), bool(int(reply[1])), matches, last)

    def scan_packs(
        self,
        shard: int,
        start_ms: int | None,
        end_ms: int | None,
        after: Position | None,
        scan: int,
        limit: int,
        queue: str | None = None,
        task: str | None = None,
        id_prefix: str | None = None,
        headers_only: bool = False,
    ) -> IndexScan:
        """See :meth:`DelayStore.scan_packs`."""
        space = self.shards.spaces[shard]
        ordered = sorted(
            (packing.pack_start(name), name)
            for name, earliest in self.packs.listed(shard)
            if end_ms is None or earliest <= end_ms
        )
        resume: tuple[int, str, int] | None = None
        if after is not None:
            pack, _, record = after[1].rpartition("/")
            resume = (int(after[0]), pack, int(record))
        matches: list[tuple[Position, MessageInfo]] = []
        examined = 0
        last = after
        filters = [queue or "", task or "", id_prefix or "", "1" if headers_only else ""]
        window = ["" if start_ms is None else start_ms, "" if end_ms is None else end_ms]
        for start, name in ordered:
            if resume is not None and (start, name) < resume[:2]:
                continue
            position = resume[2] if resume is not None and (start, name) == resume[:2] else -1
            while True:
                if examined >= scan or len(matches) >= limit:
                    return IndexScan(examined, False, matches, last)
                args = [name, position, min(scan - examined, 5000), min(limit - len(matches), MAX_BATCH)]
                reply = self.runner.run(
                    "find_packed", shard, [*args, *filters, *window], extra=[space.pack(name)], write=False
                )
                examined += int(reply[0])
                position = int(reply[2])
                last = (str(start), f"{name}/{position}")
                for n in range(3, len(reply), 6):
                    _, info = listed("due", *reply[n : n + 5], omitted=headers_only)
                    matches.append(((str(start), f"{name}/{int(reply[n + 5])}"), info))
                if int(reply[1]):
                    break
        return IndexScan(examined, True, matches, last)

    def iter_all(self, state: ListState, page: int) -> Iterator[MessageInfo]:
        """See :meth:`DelayStore.iter_all`."""
        shards = self.shards.serving
        if state == "due":  # packs first: a message moves from a pack into the index, not back
            for shard in shards:
                after: Position | None = None
                while True:
                    scan = self.scan_packs(shard, None, None, after, 5000, page)
                    yield from (info for _, info in scan.matches)
                    if scan.exhausted:
                        break
                    after = scan.last
        for shard in shards:
            offset = 0
            while True:
                infos = self.list_page(shard, state, "-inf", "+inf", offset, page)
                yield from (info for _, info in infos)
                if len(infos) < page:
                    break
                offset += page
        if state == "due":
            yield from self.far.every_row(page)
