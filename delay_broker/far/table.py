"""The far tier's PostgreSQL table: rows of messages due beyond the horizon (see :mod:`delay_broker.far`).

Every method is one statement, or one short transaction, on a connection of the calling thread's own. The
table knows ids, due times, tokens and opaque records; which tier a message belongs in is the tier's call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, TypeVar

import psycopg

from ..errors import ConfigurationError, FarTierUnavailable
from . import FarRow

T = TypeVar("T")
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
SCHEMA_LOCK = 0x64656C6179  # pg_advisory_xact_lock key: concurrent first starts create the table once


class FarTable:
    """The rows of one namespace in table ``table`` of the database at ``url`` (a libpq URL or DSN)."""

    def __init__(self, url: str, namespace: str, table: str = "delay_broker_far", connect_timeout: float = 5.0) -> None:
        if not IDENTIFIER.match(table):
            raise ConfigurationError(f"far tier table name must be a lower-case SQL identifier, got {table!r}")
        self.url = url
        self.namespace = namespace
        self.table = table
        self.connect_timeout = connect_timeout
        self._local = threading.local()
        self._schema_ready = False

    # -- plumbing ----------------------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        connection: psycopg.Connection[Any] | None = getattr(self._local, "connection", None)
        if connection is None or connection.closed:
            connection = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout)))
            self._local.connection = connection
            if not self._schema_ready:
                self._create_schema(connection)
        return connection

    def _create_schema(self, connection: psycopg.Connection[Any]) -> None:
        text = resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            connection.execute(text.replace("{table}", self.table).encode())
        self._schema_ready = True

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    @contextmanager
    def _failures(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as error:
            self._drop_connection()
            raise FarTierUnavailable(f"far tier: {doing} failed on PostgreSQL: {error}".strip()) from error

    def _run(self, doing: str, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work`` on this thread's connection; once more on a new connection if the old one had broken (a
        restarted server). Only idempotent statements come through here."""
        with self._failures(doing):
            try:
                return work(self._connection())
            except psycopg.OperationalError:
                self._drop_connection()
            return work(self._connection())

    def close(self) -> None:
        """Close this thread's connection (others close with their threads)."""
        self._drop_connection()

    # -- writes ------------------------------------------------------------------------------------------

    def insert(self, rows: Sequence[tuple[str, int, str, str, bytes]], *, replace: bool) -> dict[str, int]:
        """Write rows of (id, due_ms, route, name, record) in one statement. Returns the ids that had a row
        already, with its due time before: with ``replace`` it was overwritten (and got a new token), else
        left alone."""
        if not rows:
            return {}
        ids, dues, routes, names, records = (list(column) for column in zip(*rows, strict=True))
        conflict = (
            "DO UPDATE SET due_ms = EXCLUDED.due_ms, token = nextval('{t}_token'), route = EXCLUDED.route, "
            "name = EXCLUDED.name, record = EXCLUDED.record"
            if replace
            else "DO NOTHING"
        )
        # ``old`` reads the statement's snapshot, from before the insert: the rows as they were.
        sql = (
            "WITH old AS (SELECT id, due_ms FROM {t} WHERE namespace = %s AND id = ANY(%s) FOR UPDATE), "
            "written AS (INSERT INTO {t} (namespace, id, due_ms, route, name, record) "
            "SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::bytea[]) "
            f"ON CONFLICT (namespace, id) {conflict}) "
            "SELECT id, due_ms FROM old"
        ).replace("{t}", self.table)
        args = (self.namespace, ids, self.namespace, ids, dues, routes, names, records)
        return self._run(
            "parking far messages", lambda connection: dict(connection.execute(sql.encode(), args).fetchall())
        )

    def _delete(self, connection: psycopg.Connection[Any], ids: Sequence[str]) -> set[str]:
        sql = f"DELETE FROM {self.table} WHERE namespace = %s AND id = ANY(%s) RETURNING id"
        return {row[0] for row in connection.execute(sql, (self.namespace, list(ids))).fetchall()}

    def delete(self, ids: Sequence[str]) -> set[str]:
        """Remove these ids' rows (waiting for a sweeper moving one of them); the ids that had one."""
        return self._run("cancelling far messages", lambda connection: self._delete(connection, ids))

    def deleted_around(self, ids: Sequence[str], work: Callable[[], T]) -> tuple[set[str], T]:
        """Delete these ids' rows, run ``work`` (a park of the same ids in Redis), then commit: if ``work``
        raises, the rows stay. Returns the ids that had a row, and what ``work`` returned."""
        with self._failures("replacing far messages"):
            connection = self._connection()
            with connection.transaction():
                return self._delete(connection, ids), work()

    def reschedule(self, id: str, due_ms: int, record: bytes | None, route: str, name: str) -> bool:
        """Give a row a new due time (and record). Its token stays: see :meth:`FarTier.reschedule`."""
        sql = (
            f"UPDATE {self.table} SET due_ms = %s, record = coalesce(%s, record), route = coalesce(%s, route), "
            "name = coalesce(%s, name) WHERE namespace = %s AND id = %s RETURNING id"
        )
        args = (due_ms, record, route if record is not None else None, name if record is not None else None)
        return self._run(
            "rescheduling a far message",
            lambda connection: connection.execute(sql, (*args, self.namespace, id)).fetchone() is not None,
        )

    def move(
        self, edge_ms: int, limit: int, lease_ms: int, adopt: Callable[[list[FarRow]], None], ids: Sequence[str] = ()
    ) -> list[FarRow]:
        """Move up to ``limit`` rows due by ``edge_ms`` (or those of ``ids``) out of the table: lock them (rows
        another mover holds are skipped), ``adopt`` them into Redis, delete them, commit. ``adopt`` raising
        rolls everything back. The session gives up its locks after ``lease_ms`` idle in the transaction, so a
        mover that hangs holds nothing for longer: ``adopt`` must refuse to write once that long has passed."""
        where = "id = ANY(%s)" if ids else "due_ms <= %s"
        select = (
            f"SELECT id, due_ms, token, record FROM {self.table} WHERE namespace = %s AND {where} "
            "ORDER BY due_ms, token LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        with self._failures("moving far messages into Redis"):
            connection = self._connection()
            with connection.transaction():
                connection.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, true)", (str(lease_ms),)
                )
                found = connection.execute(select, (self.namespace, list(ids) if ids else edge_ms, limit)).fetchall()
                rows = [FarRow(id, due, token, bytes(record)) for id, due, token, record in found]
                if rows:
                    adopt(rows)
                    # By primary key: the token has no index of its own, and a DELETE by token alone read every
                    # row of the namespace, each batch (50,000 rows swept at 1,300-2,600/s instead of 25,000/s).
                    # The rows are locked, so their tokens are the ones read; checking them costs nothing.
                    connection.execute(
                        f"DELETE FROM {self.table} WHERE namespace = %s AND id = ANY(%s) AND token = ANY(%s)",
                        (self.namespace, [row.id for row in rows], [row.token for row in rows]),
                    )
        return rows

    # -- reads -------------------------------------------------------------------------------------------

    def due_times(self, ids: Sequence[str]) -> dict[str, int]:
        sql = f"SELECT id, due_ms FROM {self.table} WHERE namespace = %s AND id = ANY(%s)"
        return self._run(
            "looking up far messages",
            lambda connection: dict(connection.execute(sql, (self.namespace, list(ids))).fetchall()),
        )

    def get(self, id: str) -> FarRow | None:
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
        route: str | None = None,
        name: str | None = None,
        id_prefix: str | None = None,
    ) -> list[FarRow]:
        """Rows by due time (then parking order) within ``start_ms``..``end_ms``, optionally filtered."""
        conditions, args = ["namespace = %s"], [self.namespace]
        for column, operator, value in (
            ("due_ms", ">=", start_ms),
            ("due_ms", "<=", end_ms),
            ("route", "=", route),
            ("name", "=", name),
        ):
            if value is not None:
                conditions.append(f"{column} {operator} %s")
                args.append(value)  # type: ignore[arg-type]
        if id_prefix:
            conditions.append("left(id, %s) = %s")
            args.extend([len(id_prefix), id_prefix])  # type: ignore[list-item]
        sql = (
            f"SELECT id, due_ms, token, record FROM {self.table} WHERE {' AND '.join(conditions)} "
            "ORDER BY due_ms, token OFFSET %s LIMIT %s"
        )
        found = self._run(
            "listing far messages", lambda connection: connection.execute(sql, (*args, offset, count)).fetchall()
        )
        return [FarRow(id, due, token, bytes(record)) for id, due, token, record in found]

    def counts(self, now_ms: int, edges: Sequence[int]) -> tuple[int, int, int | None, list[int]]:
        """Rows in all, rows already due, the earliest due time, and rows per bucket of ``edges`` (ms from now)."""
        buckets = ", ".join(f"count(*) FILTER (WHERE due_ms <= {int(now_ms) + int(edge)})" for edge in edges)
        sql = (
            f"SELECT count(*), count(*) FILTER (WHERE due_ms <= %s), min(due_ms), {buckets} "
            f"FROM {self.table} WHERE namespace = %s"
        )
        row = self._run(
            "counting far messages", lambda connection: connection.execute(sql, (now_ms, self.namespace)).fetchone()
        )
        assert row is not None
        total, overdue, earliest = int(row[0]), int(row[1]), row[2]
        cumulative = [int(value) for value in row[3:]]
        histogram = [b - a for a, b in zip([0, *cumulative], [*cumulative, total], strict=True)]
        return total, overdue, earliest, histogram

    def existing_tokens(self, tokens: Sequence[int]) -> set[int]:
        sql = f"SELECT token FROM {self.table} WHERE namespace = %s AND token = ANY(%s)"
        return self._run(
            "checking moved markers",
            lambda connection: {row[0] for row in connection.execute(sql, (self.namespace, list(tokens))).fetchall()},
        )
