"""Reading the far tier beside Redis, so that a read of both sees each message once: :class:`FarView` over a
store's table, and :class:`NoFarTier`, the view of a store without one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..far import FarRow
from ..records import FarSnapshot, IndexScan, MessageInfo, Position
from .replies import MAX_BATCH
from .shards import Shards

if TYPE_CHECKING:
    from ..far.table import FarTable


def row_info(row: FarRow) -> MessageInfo:
    return MessageInfo(id=row.id, state="due", due_ms=row.due_ms, at_ms=None, raw=row.record, attempts=0, error=None)


class FarReader(Protocol):
    """What reads of the store ask of its far tier (see :class:`FarView`)."""

    def snapshot(self) -> contextlib.AbstractContextManager[Any]: ...

    def far_snapshot(self) -> contextlib.AbstractContextManager[FarSnapshot | None]: ...

    def moved_tokens(self) -> list[int]: ...

    def live_row(self, id: str) -> FarRow | None: ...

    def first_rows(
        self, start_ms: int | None, end_ms: int | None, count: int, leaving: Sequence[int], on: Any
    ) -> list[FarRow]: ...

    def every_row(self, page: int) -> Iterator[MessageInfo]: ...

    def scan(
        self,
        start_ms: int | None,
        end_ms: int | None,
        after: Position | None,
        scan: int,
        queue: str | None,
        task: str | None,
        id_prefix: str | None,
        snapshot: FarSnapshot | None,
    ) -> IndexScan: ...

    def counts(
        self, now_ms: int, edges: Sequence[int], leaving: Sequence[int], on: Any
    ) -> tuple[int, int, int | None, list[int]] | None: ...


class NoFarTier:
    """The far tier of a store without one: nothing in it, and nothing to read."""

    def snapshot(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def far_snapshot(self) -> Iterator[FarSnapshot | None]:
        yield None

    def moved_tokens(self) -> list[int]:
        return []

    def live_row(self, id: str) -> FarRow | None:
        return None

    def first_rows(
        self, start_ms: int | None, end_ms: int | None, count: int, leaving: Sequence[int], on: Any
    ) -> list[FarRow]:
        return []

    def every_row(self, page: int) -> Iterator[MessageInfo]:
        return iter(())

    def scan(
        self,
        start_ms: int | None,
        end_ms: int | None,
        after: Position | None,
        scan: int,
        queue: str | None,
        task: str | None,
        id_prefix: str | None,
        snapshot: FarSnapshot | None,
    ) -> IndexScan:
        return IndexScan(0, True, [], after)

    def counts(
        self, now_ms: int, edges: Sequence[int], leaving: Sequence[int], on: Any
    ) -> tuple[int, int, int | None, list[int]] | None:
        return None


class FarView:
    """The far tier's table as the store reads it beside Redis.

    A message being moved is in the table until the move commits, and in Redis, its token in ``moved``, from
    before then until after. So when the table is read as of a snapshot taken first, then Redis with the
    tokens in ``moved``, and the rows of those tokens are left out, no message is missed, and none is seen twice
    unless a sweeper's commit and its dropping of the tokens both land between the snapshot and the read of
    Redis (stats, which read the tokens with the counts), or a move lands between reading the tokens and the
    pages (a listing, which keeps one copy).
    """

    def __init__(self, table: FarTable, shards: Shards) -> None:
        self.table = table
        self.shards = shards

    def snapshot(self) -> contextlib.AbstractContextManager[Any]:
        """The table as it was before Redis is read (see the class)."""
        return self.table.snapshot()

    @contextlib.contextmanager
    def far_snapshot(self) -> Iterator[FarSnapshot | None]:
        with self.snapshot() as view:
            yield FarSnapshot(view, tuple(self.moved_tokens()))

    def moved_tokens(self) -> list[int]:
        """The tokens of far rows moved into Redis whose delete may not be committed yet (see :mod:`.far`)."""
        tokens: list[int] = []
        for shard in self.shards.serving:
            space = self.shards.spaces[shard]
            with self.shards.calling("reading moved tokens"):
                tokens.extend(int(token) for token in self.shards.client.zrange(space.moved, 0, -1))  # type: ignore[arg-type]
        return tokens

    def live_row(self, id: str) -> FarRow | None:
        """``id``'s far row, unless it has none or a retired one (see :meth:`retired`)."""
        row = self.table.get(id)
        return None if row is None or self.retired(self.shards.shard_for(id), {id: row.token}) else row

    def retired_rows(self, tokens: Mapping[str, int]) -> set[str]:
        """:meth:`retired` for ids of any shards."""
        groups = self.shards.by_shard(tokens).items()
        return set().union(*(self.retired(shard, {id: tokens[id] for id in group}) for shard, group in groups))

    def retired(self, shard: int, tokens: Mapping[str, int]) -> set[str]:
        """The ids among ``tokens`` (id: its row's token) whose rows are retired: their tokens are recorded in
        ``moved``, so the rows never run. A mover adopted them and died before deleting them, or a park in Redis
        replaced them and its delete did not commit. Their messages are in Redis, or ran already: the ids are
        free. During a reshard, the ids' other homes are looked at too (a token recorded before the switch is in
        the old one)."""
        if not tokens:
            return set()
        found = self._recorded(shard, tokens)
        view = self.shards.view()
        if view.resharding:
            others: dict[int, dict[str, int]] = {}
            for id in tokens.keys() - found:
                for other in {view.old_home(id), view.new_home(id)} - {shard}:
                    others.setdefault(other, {})[id] = tokens[id]
            for other, group in others.items():
                found |= self._recorded(other, group)
        return found

    def _recorded(self, shard: int, tokens: Mapping[str, int]) -> set[str]:
        ids = list(tokens)
        with self.shards.calling("reading moved tokens"):
            scores = self.shards.client.zmscore(self.shards.spaces[shard].moved, [str(tokens[id]) for id in ids])
        return {id for id, score in zip(ids, scores, strict=True) if score is not None}

    def first_rows(
        self, start_ms: int | None, end_ms: int | None, count: int, leaving: Sequence[int], on: Any
    ) -> list[FarRow]:
        return self.table.page(start_ms, end_ms, 0, count, leaving=leaving, on=on)

    def every_row(self, page: int) -> Iterator[MessageInfo]:
        offset = 0
        while rows := self.table.page(None, None, offset, page):
            yield from map(row_info, rows)
            offset += len(rows)

    def scan(
        self,
        start_ms: int | None,
        end_ms: int | None,
        after: Position | None,
        scan: int,
        queue: str | None,
        task: str | None,
        id_prefix: str | None,
        snapshot: FarSnapshot | None,
    ) -> IndexScan:
        count = min(scan, MAX_BATCH)
        after_row = None if after is None else (int(after[0]), int(after[1]))
        rows = self.table.page(
            start_ms,
            end_ms,
            0,
            count,
            after=after_row,
            route=queue,
            name=task,
            id_prefix=id_prefix,
            leaving=() if snapshot is None else snapshot.leaving,
            on=None if snapshot is None else snapshot.view,
        )
        matches = [((str(row.due_ms), str(row.token)), row_info(row)) for row in rows]
        return IndexScan(len(rows), len(rows) < count, matches, matches[-1][0] if matches else after)

    def counts(
        self, now_ms: int, edges: Sequence[int], leaving: Sequence[int], on: Any
    ) -> tuple[int, int, int | None, list[int]] | None:
        return self.table.counts(now_ms, edges, leaving, on=on)
