"""The far tier's PostgreSQL table: rows of messages due beyond the horizon (see :mod:`delay_broker.far`).

Every method is one statement, or one short transaction, on a connection of the calling thread's own. The
table knows ids, due times, tokens and opaque records; which tier a message belongs in is the tier's call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from importlib import resources
from typing import Any, TypeVar

import psycopg

from ..errors import ConfigurationError, FarTierUnavailable, InvalidMessage
from .rows import FarRow
from .watchdog import WATCHDOG

T = TypeVar("T")
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
SCHEMA_LOCK = 0x64656C6179  # pg_advisory_xact_lock key: concurrent first starts create the table once


def storable(ids: Sequence[str]) -> list[str]:
    """The ids that can have a row: PostgreSQL text holds no NUL, so an id with one is in Redis or nowhere."""
    return [id for id in ids if "\x00" not in id]


class FarTable:
    """The rows of one namespace in table ``table`` of the database at ``url`` (a libpq URL or DSN)."""

    def __init__(
        self,
        url: str,
        namespace: str,
        table: str = "delay_broker_far",
        connect_timeout: float = 5.0,
        call_timeout: float = 30.0,
    ) -> None:
        if not IDENTIFIER.match(table):
            raise ConfigurationError(f"far tier table name must be a lower-case SQL identifier, got {table!r}")
        self.url = url
        self.namespace = namespace
        self.table = table
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._local = threading.local()
        self._schema_ready = False

    # -- plumbing ----------------------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        connection: psycopg.Connection[Any] | None = getattr(self._local, "connection", None)
        if connection is None or connection.closed:
            connection = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout)))
            self._local.connection = connection
            if not self._schema_ready:
                with self.guarded(connection):
                    self._create_schema(connection)
        return connection

    def _create_schema(self, connection: psycopg.Connection[Any]) -> None:
        # Mostly found made, by an earlier start or by a DBA. Only then is the DDL skipped: even with IF NOT EXISTS,
        # CREATE INDEX waits behind every open write on the table (and parks queue behind it), and it needs CREATE
        # on the schema, which a role granted only the rows does not have.
        names = (f"{self.table}_token", self.table, f"{self.table}_due")
        found = connection.execute("SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)", names).fetchone()
        if found is not None and None not in found:
            self._schema_ready = True
            return
        text = resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            connection.execute(text.replace("{table}", self.table).encode())
        self._schema_ready = True

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            with suppress(psycopg.Error):  # a connection psycopg closed already has no socket to forget
                WATCHDOG.forget(connection.pgconn.socket)
            connection.close()

    @contextmanager
    def _failures(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.DataError as error:
            # The values, not the server: a retry would fail alike, and PostgreSQL is not down.
            raise InvalidMessage(f"far tier: {doing}: PostgreSQL refused the values: {error}".strip()) from error
        except psycopg.Error as error:
            self._drop_connection()
            raise FarTierUnavailable(f"far tier: {doing} failed on PostgreSQL: {error}".strip()) from error

    def guarded(self, connection: psycopg.Connection[Any], extra: float = 0.0) -> AbstractContextManager[None]:
        """Within the block, ``connection`` is broken if it takes longer than ``call_timeout`` (plus ``extra``; see
        watchdog). The block must end before the connection is dropped: its descriptor may be another's then."""
        return WATCHDOG.guard(connection.pgconn.socket, self.call_timeout + extra)

    @contextmanager
    def _transaction(self, doing: str, *, extra: float | None = 0.0) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on this thread's connection, committed when the block ends without error. A connection
        that broke while idle (a restarted server) fails at BEGIN, before anything was done: a new one is opened
        then, once, so the first transaction after a restart does not fail while PostgreSQL is up. It is given
        ``call_timeout`` plus ``extra`` seconds in all (None: no deadline)."""

        def begin(connection: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
            with ExitStack() as attempt:  # handed to the block's stack only once BEGIN succeeded on this connection
                if extra is not None:
                    attempt.enter_context(self.guarded(connection, extra))
                attempt.enter_context(connection.transaction())
                stack.enter_context(attempt.pop_all())
            return connection

        with self._failures(doing), ExitStack() as stack:
            yield self._run(doing, begin, guard=False)

    def _run(self, doing: str, work: Callable[[psycopg.Connection[Any]], T], *, guard: bool = True) -> T:
        """``work`` on this thread's connection; once more on a new connection if the old one had broken (a
        restarted server). Only idempotent statements come through here."""

        def attempt() -> T:
            connection = self._connection()
            if not guard:
                return work(connection)
            with self.guarded(connection):
                return work(connection)

        with self._failures(doing):
            try:
                return attempt()
            except psycopg.OperationalError:
                self._drop_connection()
            return attempt()

    def _read(self, doing: str, on: psycopg.Connection[Any] | None, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work`` on the connection of a :meth:`snapshot` (``on``), else as :meth:`_run`."""
        if on is None:
            return self._run(doing, work)
        with self._failures(doing):
            return work(on)

    def close(self) -> None:
        """Close this thread's connection (others close with their threads)."""
        self._drop_connection()

    # -- writes ------------------------------------------------------------------------------------------

    @contextmanager
    def parking(self, ids: Sequence[str]) -> Iterator[Parking]:
        """Hold this namespace's locks on ``ids`` for a park that spans the tiers: parks of the same id, by any
        process, run one after the other, and each sees what the one before wrote in either tier. The locks are
        the session's (advisory), not a transaction's: what the block writes through the :class:`Parking`
        commits as it goes, unless written within :meth:`Parking.atomic` or :meth:`Parking.deleted`. A
        process that dies releases its locks with its connection."""
        parking = Parking(self, ids)
        try:
            yield parking
        finally:
            parking.release()

    @property
    def delete_sql(self) -> str:
        return f"DELETE FROM {self.table} WHERE namespace = %s AND id = ANY(%s) RETURNING id, token"

    def reschedule(
        self, id: str, due_ms: int, record: bytes | None, route: str, name: str, expected: bytes | None = None
    ) -> bool:
        """Give a row a new due time (and record), if its record is still ``expected`` (when given). Its token
        stays: see :meth:`FarTier.reschedule`."""
        if not storable([id]):
            return False
        sql = (
            f"UPDATE {self.table} SET due_ms = %s, record = coalesce(%s, record), route = coalesce(%s, route), "
            "name = coalesce(%s, name) WHERE namespace = %s AND id = %s AND (%s::bytea IS NULL OR record = %s) "
            "RETURNING id"
        )
        args = (due_ms, record, route if record is not None else None, name if record is not None else None)
        return self._run(
            "rescheduling a far message",
            lambda connection: (
                connection.execute(sql, (*args, self.namespace, id, expected, expected)).fetchone() is not None
            ),
        )

    def move(
        self,
        edge_ms: int,
        limit: int,
        lease_ms: int,
        adopt: Callable[[list[FarRow]], list[FarRow] | None],
        ids: Sequence[str] = (),
        *,
        skip: Sequence[str] = (),
    ) -> list[FarRow]:
        """Move up to ``limit`` rows due by ``edge_ms`` (or those of ``ids``), but not those of ``skip``, out of
        the table: lock them (rows another mover holds are skipped), ``adopt`` them into Redis, delete those it
        adopted (it returns them; None: all), commit. ``adopt`` raising rolls everything back. The session gives
        up its locks after ``lease_ms`` idle in the transaction, so a mover that hangs holds nothing for longer:
        ``adopt`` must refuse to write once that long has passed."""
        where = "id = ANY(%s)" if ids else "due_ms <= %s"
        select = (
            f"SELECT id, due_ms, token, record FROM {self.table} WHERE namespace = %s AND {where} "
            "AND NOT id = ANY(%s) ORDER BY due_ms, token LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        # Its time runs while it is in Redis too: the lease bounds that, then the statements have theirs.
        with self._transaction("moving far messages into Redis", extra=lease_ms / 1000) as connection:
            connection.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)", (str(lease_ms),))
            bound = storable(ids) if ids else edge_ms
            found = connection.execute(select, (self.namespace, bound, storable(skip), limit)).fetchall()
            rows = [FarRow(id, due, token, bytes(record)) for id, due, token, record in found]
            if rows:
                adopted = adopt(rows)
                rows = rows if adopted is None else adopted
            if rows:
                # By primary key: the token has no index of its own, and a DELETE by token alone read every
                # row of the namespace, each batch (50,000 rows swept at 1,300-2,600/s instead of 25,000/s).
                # The rows are locked, so their tokens are the ones read; checking them costs nothing.
                connection.execute(
                    f"DELETE FROM {self.table} WHERE namespace = %s AND id = ANY(%s) AND token = ANY(%s)",
                    (self.namespace, [row.id for row in rows], [row.token for row in rows]),
                )
        return rows

    # -- reads -------------------------------------------------------------------------------------------

    @contextmanager
    def snapshot(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection whose reads (``on=`` of :meth:`page` and :meth:`counts`) all see the table as it was
        when the block began, whatever is committed meanwhile: a read-only repeatable-read transaction."""
        # No deadline: a listing or a bulk selection holds it while it scans Redis, for as long as that takes.
        with self._transaction("reading far messages", extra=None) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            connection.execute("SELECT 1")  # the snapshot is taken by the first statement that is not SET
            yield connection

    def get(self, id: str) -> FarRow | None:
        if not storable([id]):
            return None
        sql = f"SELECT id, due_ms, token, record FROM {self.table} WHERE namespace = %s AND id = %s"
        row = self._run(
            "reading a far message", lambda connection: connection.execute(sql, (self.namespace, id)).fetchone()
        )
        return None if row is None else FarRow(row[0], row[1], row[2], bytes(row[3]))

    def page(
        self,
        start_ms: int | None,
        end_ms: int | None,
        offset: int,
        count: int,
        *,
        after: tuple[int, int] | None = None,
        route: str | None = None,
        name: str | None = None,
        id_prefix: str | None = None,
        leaving: Sequence[int] = (),
        on: psycopg.Connection[Any] | None = None,
    ) -> list[FarRow]:
        """Rows by due time (then parking order) within ``start_ms``..``end_ms``, after the row whose due time
        and token are ``after`` (if given), optionally filtered, but for those whose token is in ``leaving``
        (see :meth:`counts`)."""
        conditions = ["namespace = %s", "token NOT IN (SELECT unnest(%s::bigint[]))"]
        args: list[Any] = [self.namespace, list(leaving)]
        if after is not None:
            conditions.append("(due_ms, token) > (%s, %s)")
            args.extend(after)
        for column, operator, value in (
            ("due_ms", ">=", start_ms),
            ("due_ms", "<=", end_ms),
            ("route", "=", route),
            ("name", "=", name),
        ):
            if value is not None:
                conditions.append(f"{column} {operator} %s")
                args.append(value)
        if id_prefix:
            conditions.append("left(id, %s) = %s")
            args.extend([len(id_prefix), id_prefix])
        sql = (
            f"SELECT id, due_ms, token, record FROM {self.table} WHERE {' AND '.join(conditions)} "
            "ORDER BY due_ms, token OFFSET %s LIMIT %s"
        )
        found = self._read(
            "listing far messages", on, lambda connection: connection.execute(sql, (*args, offset, count)).fetchall()
        )
        return [FarRow(id, due, token, bytes(record)) for id, due, token, record in found]

    def counts(
        self,
        now_ms: int,
        edges: Sequence[int],
        leaving: Sequence[int] = (),
        on: psycopg.Connection[Any] | None = None,
    ) -> tuple[int, int, int | None, list[int]]:
        """Rows in all, rows already due, the earliest due time, and the rows not yet due per bucket of ``edges``
        (ms from now: due in (now, now + e1], (now + e1, now + e2] ... and past the last edge, as in Redis).
        Rows whose token is in ``leaving`` (moved into Redis already, their delete not yet committed) are left
        out: Redis counts them."""
        buckets = ", ".join(
            f"count(*) FILTER (WHERE due_ms > {int(now_ms)} AND due_ms <= {int(now_ms) + int(edge)})" for edge in edges
        )
        sql = (
            f"SELECT count(*), count(*) FILTER (WHERE due_ms <= %s), min(due_ms), {buckets} "
            f"FROM {self.table} WHERE namespace = %s AND token NOT IN (SELECT unnest(%s::bigint[]))"
        )
        row = self._read(
            "counting far messages",
            on,
            lambda connection: connection.execute(sql, (now_ms, self.namespace, list(leaving))).fetchone(),
        )
        assert row is not None
        total, overdue, earliest = int(row[0]), int(row[1]), row[2]
        within = [int(value) for value in row[3:]]  # due after now and by now + edge, for each edge
        histogram = [b - a for a, b in zip([0, *within], [*within, total - overdue], strict=True)]
        return total, overdue, earliest, histogram

    def delete_tokens(self, tokens: Sequence[int]) -> bool:
        """Delete the rows carrying these tokens; False when one stayed locked (a mover or a park holding it)
        for 2 s: the sweeper asking must not stall behind it, and the next check tries again."""
        sql = f"DELETE FROM {self.table} WHERE namespace = %s AND token = ANY(%s)"
        try:
            with self._transaction("deleting rows moved in") as connection:
                connection.execute("SET LOCAL lock_timeout = '2s'")
                connection.execute(sql, (self.namespace, list(tokens)))
        except FarTierUnavailable as error:
            if isinstance(error.__cause__, psycopg.errors.LockNotAvailable):
                return False
            raise
        return True


class Parking:
    """Statements on rows of locked ids (see :meth:`FarTable.parking`). The locks are taken in the round trip of
    the first statement, and given back in that of the commit, if any: a park costs PostgreSQL two round trips."""

    # One statement, in one order of keys for every caller, or two parks of overlapping batches would deadlock.
    LOCK = (
        "SELECT count(pg_advisory_lock(key)) FROM (SELECT DISTINCT hashtextextended(%s || id, 0) AS key "
        "FROM unnest(%s::text[]) AS id ORDER BY key) AS keys"
    )

    def __init__(self, table: FarTable, ids: Sequence[str]) -> None:
        self._table = table
        self._lock_args = (table.namespace + "\x1f", storable(ids))
        self._connection: psycopg.Connection[Any] | None = None
        self._begin = False  # the next statement opens a transaction (see atomic)

    def _fetch(self, doing: str, sql: str | bytes, args: Sequence[Any], *, begin: bool = False) -> list[Any]:
        """The rows of ``sql``; the first statement goes with the locks (and ``BEGIN``) in one round trip, and
        once more on a new connection if the old one had broken (a restarted server): nothing was done yet."""
        begin, self._begin = begin or self._begin, False
        if self._connection is not None:
            connection = self._connection
            with self._table._failures(doing), self._table.guarded(connection):
                if begin:
                    connection.execute("BEGIN")
                return connection.execute(sql, args).fetchall()

        def first(connection: psycopg.Connection[Any]) -> list[Any]:
            self._connection = connection  # before the locks: whatever fails next, release() gives them back
            with connection.pipeline():
                connection.execute(self.LOCK, self._lock_args)
                if begin:
                    connection.execute("BEGIN")
                cursor = connection.execute(sql, args)
            return cursor.fetchall()

        return self._table._run(doing, first)

    def release(self, *, commit: bool = False) -> None:
        """Commit (if asked) and give the locks back, in one round trip. A failed commit raises."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if not commit:
            with suppress(psycopg.Error), self._table.guarded(connection):  # a broken one took its locks with it
                if connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    connection.execute("ROLLBACK")  # a failed statement's transaction refuses the unlock
                connection.execute("SELECT pg_advisory_unlock_all()")
            return
        with self._table._failures("committing far messages"), self._table.guarded(connection), connection.pipeline():
            connection.execute("COMMIT")
            connection.execute("SELECT pg_advisory_unlock_all()")

    def due_times(self, ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """The due time and token of each id of ``ids`` that has a row."""
        sql = f"SELECT id, due_ms, token FROM {self._table.table} WHERE namespace = %s AND id = ANY(%s)"
        found = self._fetch("looking up far messages", sql, (self._table.namespace, storable(ids)))
        return {id: (due, token) for id, due, token in found}

    def delete(self, ids: Sequence[str]) -> dict[str, int]:
        """Delete these ids' rows; the ids that had one, with its token."""
        found = self._fetch("replacing far messages", self._table.delete_sql, self._delete_args(ids))
        return {id: token for id, token in found}

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """The block's statements in one transaction, committed with the locks given back when the block ends
        without error, rolled back if it raises: a park whose Redis half failed leaves no row behind either."""
        self._begin = True
        try:
            yield
        except BaseException:
            self._begin = False
            if self._connection is not None:
                with suppress(psycopg.Error), self._table.guarded(self._connection):
                    self._connection.execute("ROLLBACK")
            raise
        self.release(commit=True)

    @contextmanager
    def deleted(self, ids: Sequence[str]) -> Iterator[dict[str, int]]:
        """Delete these ids' rows in a transaction committed when the block ends without error (the block's
        park in Redis done), with the locks given back: if the block raises, the rows stay. Gives the ids
        that had a row, with its token."""
        sql = self._table.delete_sql
        found = self._fetch("replacing far messages", sql, self._delete_args(ids), begin=True)
        try:
            yield {id: token for id, token in found}
        except BaseException:
            if self._connection is not None:
                with suppress(psycopg.Error), self._table.guarded(self._connection):
                    self._connection.execute("ROLLBACK")
            raise
        self.release(commit=True)

    def _delete_args(self, ids: Sequence[str]) -> tuple[str, list[str]]:
        return self._table.namespace, storable(ids)

    def insert(self, rows: Sequence[tuple[str, int, str, str, bytes]], *, replace: bool) -> dict[str, int]:
        """Write rows of (id, due_ms, route, name, record). Returns the ids that had a row already, with its due
        time before: with ``replace`` it was overwritten (and got a new token), else left alone."""
        if not rows:
            return {}
        ids, dues, routes, names, records = (list(column) for column in zip(*rows, strict=True))
        conflict = (
            "DO UPDATE SET due_ms = EXCLUDED.due_ms, token = nextval('{t}_token'), route = EXCLUDED.route, "
            "name = EXCLUDED.name, record = EXCLUDED.record"
            if replace
            else "DO NOTHING"
        )
        # ``old`` reads the statement's snapshot, from before the insert: the rows as they were. The ids' locks
        # make it exact: no other park of them can be writing meanwhile.
        sql = (
            "WITH old AS (SELECT id, due_ms FROM {t} WHERE namespace = %s AND id = ANY(%s) FOR UPDATE), "
            "written AS (INSERT INTO {t} (namespace, id, due_ms, route, name, record) "
            "SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::bytea[]) "
            f"ON CONFLICT (namespace, id) {conflict}) "
            "SELECT id, due_ms FROM old"
        ).replace("{t}", self._table.table)
        namespace = self._table.namespace
        args = (namespace, ids, namespace, ids, dues, routes, names, records)
        return dict(self._fetch("parking far messages", sql.encode(), args))
